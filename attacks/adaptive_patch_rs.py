"""The adaptive attack of :mod:`bayesgate.attacks.adaptive` searched by Sparse-RS's patch attack:
an attacker who knows the detector, needs no gradient, and changes one small square of the image.

Same attacker, same loss as :class:`~bayesgate.attacks.adaptive_sparse_rs.AdaptiveSparseRS` —
misclassify, then stay under the detector's threshold (``y`` the clean label, ``m`` the margin,
``s`` the score)::

    L(x) = relu(m(x) + κ) + λ · g(x) · relu(s(x) − threshold + δ)

but the threat model is Sparse-RS's image-specific patches (Croce et al., AAAI 2022, untargeted;
written from the paper's description and the schedules of the authors' code, ``fra31/sparse-rs``,
``rs_attacks.py``, ``norm == 'patches'``): ``x'`` equals ``x`` outside one ``s×s`` window (all
channels) and takes a value in {0, 1} per channel on every pixel of it. ``eps`` is the L0 budget
``k`` in pixels, as for ``sparse-rs``, and the side is ``s = ⌊√k⌋``, so the patch never changes
more than ``s² ≤ k`` pixels (k = 9 or 10: a 3×3 patch; k = 16: 4×4). The authors round up
(``⌈√k⌉``); we keep the bound.

State per image: the window's top-left corner ``(r, c) ∈ [0, H − s] × [0, W − s]`` and its content
``P ∈ {0, 1}^{C×s×s}``; the point is ``paste(x, (r, c), P)`` (:func:`paste`). ``L`` is minimised by
a random search that only ever reads ``L``'s value (``score_fn`` under ``torch.no_grad``):

1. start: ``(r, c)`` uniform; ``P`` vertical stripes — each column of the patch one random value
   in {0, 1} per channel, shared by its rows;
2. query ``i = 1 … steps − 1``, with the period ``T_i = 5·(1 + ⌊i/1000⌋)`` and the shift
   ``h_i = ⌊0.75 · max((steps − i)/steps, 0) · H⌋``:

   - if ``i ≡ 0 (mod T_i)`` and ``h_i > 0``, a **location move**: each image's ``r`` and ``c``
     move by independent uniform integers in ``[−h_i, h_i]``, clamped into the image; ``P``
     stays;
   - otherwise a **content move**: a square of side ``s_i = max(⌊√α_i · s⌋, 1)`` at one random
     position inside the patch (the same for the batch) is set, in each image, to one random
     value in {0, 1} per channel; ``α_i`` = :func:`patch_schedule` of ``alpha_init`` (0.4, the
     authors' untargeted patch value) at ``i``. A drawn value equal to the current one changes
     nothing (the query is still spent: no redraw).

   The candidate becomes the current point if its ``L`` is strictly lower, both with the current
   point's gate.

The gate ``g`` of ``misclassify-first`` is read at the *current* point, as in
:mod:`~bayesgate.attacks.adaptive_sparse_rs` (whose docstring says why): a candidate is compared
with the current point under the same loss, and the detector term switches on once the current
point is misclassified. With λ = 0 this is the detector-blind patch search on the margin with
``confidence = κ``. The search only moves to a strictly lower ``L``, so it cannot cross a loss
that is exactly flat (a deterministic toy with integer logits stalls there); the MC predictive
and the detector's scores have no exact ties.

Bookkeeping, as :class:`~bayesgate.attacks.adaptive_sparse_rs.AdaptiveSparseRS`'s: every query
that sees its candidate misclassified and unflagged counts (``first_step`` = the first such query,
0 for the start), whether or not the search moves there; the result is the one of lowest ``L``
(gate 1) among them, else the current point. An image stops being queried once its current ``L``
is 0 (both margins met: nothing can be strictly lower). The verdict that counts is the caller's,
on a fresh MC draw.
"""

from __future__ import annotations

import math
from dataclasses import dataclass

import torch

from bayesgate.attacks.adaptive import AdaptivePGD, AdaptiveResult, ScoreFn, checked_images
from bayesgate.attacks.adaptive_search import Successes
from bayesgate.attacks.adaptive_settings import AdaptivePatchRSParameters
from bayesgate.attacks.methods.square import cpu_generator, margin

# iterations (out of 10 000) after which α_init is divided by the next divisor: the authors'
# patch schedule (their p_selection for patches)
_ALPHA_POINTS = (10, 50, 200, 500, 1000, 2000, 4000, 6000, 8000)
_ALPHA_DIVISORS = (1, 2, 4, 8, 16, 32, 32, 64, 64, 128)


def patch_schedule(alpha_init: float, iteration: int, budget: int) -> float:
    """Fraction ``α_i`` of the patch's area a content move redraws at ``iteration`` of a budget of
    ``budget`` queries: ``alpha_init / d``, ``d`` = 1, 2, 4, 8, 16, 32, 32, 64, 64, 128 once the
    rescaled iteration ``⌊iteration·10000/budget⌋`` has passed 0, 10, 50, 200, 500, 1000, 2000,
    4000, 6000, 8000 (the authors' schedule for patches)."""
    scaled = int(iteration / budget * 10_000)
    return alpha_init / _ALPHA_DIVISORS[sum(scaled > point for point in _ALPHA_POINTS)]


def paste(x: torch.Tensor, loc: torch.Tensor, patch: torch.Tensor) -> torch.Tensor:
    """``x`` (B×C×H×W) with, in image ``b``, the window of ``patch[b]`` (C×s×s) whose top-left
    corner is ``loc[b] = (r, c)`` (int, ``0 ≤ r ≤ H − s``, ``0 ≤ c ≤ W − s``) replaced by it; a
    new tensor, vectorised over the batch (a B×H×W window mask from aranges, the patch's values
    gathered by advanced indexing)."""
    b, _, h, w = x.shape
    side = patch.shape[-1]
    rows = torch.arange(h, device=x.device)[None, :] - loc[:, :1]  # B×H: row within the patch
    cols = torch.arange(w, device=x.device)[None, :] - loc[:, 1:]  # B×W: column within it
    inside = ((rows >= 0) & (rows < side))[:, :, None] & ((cols >= 0) & (cols < side))[:, None, :]
    images = torch.arange(b, device=x.device)[:, None, None]
    values = patch.permute(0, 2, 3, 1)[  # B×s×s×C, gathered to B×H×W×C
        images, rows.clamp(0, side - 1)[:, :, None], cols.clamp(0, side - 1)[:, None, :]
    ]
    return torch.where(inside[:, None], values.permute(0, 3, 1, 2).to(x.dtype), x)


@dataclass(frozen=True)
class AdaptivePatchRS(AdaptivePatchRSParameters, AdaptivePGD):
    """The adaptive attack searched by Sparse-RS's patch moves; see the module docstring. ``eps``
    = the pixel budget ``k`` (the patch's side ``⌊√k⌋``), ``steps`` = queries per image,
    ``alpha_init``, and the loss's ``weight`` (λ), ``kappa``, ``delta`` and ``schedule``."""

    def __call__(
        self,
        score_fn: ScoreFn,
        x: torch.Tensor,
        y: torch.Tensor,
        threshold: float,
        *,
        generator: torch.Generator | None = None,
    ) -> AdaptiveResult:
        """Attack ``x`` (B×C×H×W, in [0, 1]) away from labels ``y``; ``generator`` draws the
        locations, moves and values (on the CPU)."""
        x = checked_images(x)
        if x.dim() != 4:
            raise ValueError("the Patch-RS adaptive attack needs B×C×H×W images")
        h, w = x.shape[2:]
        if self.side > min(h, w):
            raise ValueError(
                f"patch-rs side {self.side} (⌊√{self.pixels}⌋) does not fit in a {h}×{w} image"
            )
        rng = cpu_generator(generator)

        def query(images: torch.Tensor, rows: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
            """Margin and detector score of ``images`` (the rows ``rows`` of the batch)."""
            log_p, score = score_fn(images)
            return margin(log_p, y[rows]), score

        with torch.no_grad():
            loc, patch = self.start(x, rng)
            start = paste(x, loc, patch)
            m_now, s_now = query(start, torch.arange(x.shape[0], device=x.device))
            book = Successes(self, threshold, start, m_now, s_now)
            for i in range(1, self.steps):
                gate = self.gate(m_now)  # read at the current point, for it and its candidates
                now = self.loss(m_now, s_now, threshold, gate)
                active = torch.nonzero(now > 0).squeeze(1)
                if active.numel() == 0:
                    break
                new_loc, new_patch = self.move(i, loc[active], patch[active], (h, w), rng)
                candidate = paste(x[active], new_loc, new_patch)
                m, score = query(candidate, active)
                book.record(i, active, candidate, m, score)
                better = self.loss(m, score, threshold, gate[active]) < now[active]
                kept = active[better]
                loc[kept], patch[kept] = new_loc[better], new_patch[better]
                m_now[kept], s_now[kept] = m[better], score[better]
        return book.result(paste(x, loc, patch), x.shape)

    def start(self, x: torch.Tensor, rng: torch.Generator) -> tuple[torch.Tensor, torch.Tensor]:
        """The start (B×2 top-left corners, B×C×s×s patches): uniform corners, and vertical
        stripes — each column of each channel of the patch one random value in {0, 1}."""
        b, c, h, w = x.shape
        s = self.side
        rows = torch.randint(0, h - s + 1, (b,), generator=rng)
        cols = torch.randint(0, w - s + 1, (b,), generator=rng)
        stripes = torch.randint(0, 2, (b, c, 1, s), generator=rng).expand(b, c, s, s)
        loc = torch.stack([rows, cols], dim=1).to(x.device)
        return loc, stripes.to(x.device, x.dtype).contiguous()

    def shift(self, iteration: int, height: int) -> int:
        """``h_i = ⌊0.75 · max((steps − i)/steps, 0) · H⌋``: the largest location move (in rows and
        in columns) at query ``i``, shrinking linearly to 0 over the budget."""
        return int(0.75 * max((self.steps - iteration) / self.steps, 0.0) * height)

    def move(
        self,
        iteration: int,
        loc: torch.Tensor,
        patch: torch.Tensor,
        size: tuple[int, int],
        rng: torch.Generator,
    ) -> tuple[torch.Tensor, torch.Tensor]:
        """The candidates' corners and patches at query ``i = iteration`` ≥ 1 (new tensors): a
        location move every ``T_i = 5·(1 + ⌊i/1000⌋)`` queries while the shift ``h_i`` is > 0,
        else a content move (module docstring); ``size`` = the images' ``(H, W)``."""
        n, c, s, _ = patch.shape
        h, w = size
        shift = self.shift(iteration, h)
        if iteration % (5 * (1 + iteration // 1000)) == 0 and shift > 0:
            step = torch.randint(-shift, shift + 1, (n, 2), generator=rng).to(loc.device)
            moved = loc + step
            last = torch.tensor([h - s, w - s], device=loc.device)
            return torch.minimum(moved.clamp(min=0), last), patch.clone()
        small = max(int(math.sqrt(patch_schedule(self.alpha_init, iteration, self.steps)) * s), 1)
        top, left = torch.randint(0, s - small + 1, (2,), generator=rng).tolist()
        values = torch.randint(0, 2, (n, c, 1, 1), generator=rng).to(patch.device, patch.dtype)
        new = patch.clone()
        new[:, :, top : top + small, left : left + small] = values
        return loc.clone(), new
