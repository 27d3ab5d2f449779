"""The adaptive attack of :mod:`bayesgate.attacks.adaptive` searched by Sparse-RS: an L0 attacker
who knows the detector and needs no gradient.

Same attacker, same loss as :class:`~bayesgate.attacks.adaptive.AdaptivePGD` — misclassify, then
stay under the detector's threshold (``y`` the clean label, ``m`` the margin, ``s`` the score)::

    L(x) = relu(m(x) + κ) + λ · g(x) · relu(s(x) − threshold + δ)

but the threat model is Sparse-RS's (:mod:`bayesgate.attacks.methods.sparse_rs`, Croce et al.
2022): ``x'`` equals ``x`` outside a set ``S`` of ``k`` = ``eps`` pixel positions and takes a
value in {0, 1} per channel on ``S``, so ``‖x' − x‖₀ ≤ k``. ``L`` is minimised by Sparse-RS's
random search, which only ever reads ``L``'s value (``score_fn`` under ``torch.no_grad``):

1. start: ``S₀`` = ``k`` positions drawn uniformly per image (anywhere, or with
   ``region="strokes"`` among the digit's strokes and their one-pixel border,
   :func:`~bayesgate.attacks.methods.sparse_rs.near_strokes`), random values in {0, 1};
2. query ``i = 1 … steps − 1``: ``r_i = max(1, round(α_i·k))`` positions leave ``S`` (back to
   the clean value) and ``r_i`` positions from outside (in the region) enter it with fresh
   random values (:func:`~bayesgate.attacks.methods.sparse_rs.swap`), ``α_i`` = Square's
   halving schedule of ``alpha_init`` over the ``steps`` queries; the candidate becomes the
   current point if its ``L`` is strictly lower (on its own K-sample draw), both with the
   current point's gate.

The gate ``g`` of ``misclassify-first`` is read at the *current* point, as PGD reads it at its
iterate: a candidate is compared with the current point under the same loss, and the detector
term switches on once the current point is misclassified. (Read at each candidate instead, ``L``
would jump where a candidate flips the class, and a search that only moves downhill would refuse
every misclassified but flagged point — on a pilot of 20 digits it misclassified 21 % of them
against the plain search's 58 %.) Once on, the gate also lets the search step back to a correctly
classified point where that lowers ``L``; the search may cycle, and each time it is misclassified
it may find a way under the threshold. ``joint`` (g = 1) can instead stall where reaching an
unflagged misclassified point takes two moves at once.

The detector-blind attack (λ = 0) is the plain Sparse-RS on the margin with ``confidence = κ``.
Like it, the search only moves to a strictly lower ``L``, so it cannot cross a loss that is
exactly flat (a deterministic toy with integer logits stalls there, under either schedule); the
MC predictive and the detector's scores have no exact ties. Why this attacker: a random search
does not need the detector's gradient, so a detector whose score is flat or masked to gradients
cannot hide from it, and the L0 threat model is the one where ``bayesgate-robust`` is weakest as
a classifier (Sparse-RS misclassifies 45.7 % of digits).

Bookkeeping: every query that sees its candidate misclassified and unflagged counts
(``first_step`` = the first such query, 0 for the start), whether or not the search moves there;
the result is the one of lowest ``L`` among them (the most margin on both goals, so the likeliest
to hold on a fresh draw), else the current point. With λ = 0 that is the current point itself
(it has the lowest ``L`` of all queries), so the result equals the plain Sparse-RS's. An image
stops being queried once its current ``L`` is 0 (both margins met: nothing can be strictly
lower). The verdict that counts is the caller's, on a fresh MC draw.
"""

from __future__ import annotations

from dataclasses import dataclass

import torch

from bayesgate.attacks.adaptive import AdaptivePGD, AdaptiveResult, ScoreFn, checked_images
from bayesgate.attacks.adaptive_search import Successes
from bayesgate.attacks.adaptive_settings import AdaptiveSparseRSParameters
from bayesgate.attacks.methods.sparse_rs import (
    free_positions,
    near_strokes,
    random_start,
    resampled_count,
    swap,
)
from bayesgate.attacks.methods.square import cpu_generator, margin


@dataclass(frozen=True)
class AdaptiveSparseRS(AdaptiveSparseRSParameters, AdaptivePGD):
    """The adaptive attack searched by Sparse-RS; see the module docstring. ``eps`` = ``k``
    pixels, ``steps`` = queries per image, ``alpha_init``, and the loss's ``weight`` (λ),
    ``kappa``, ``delta`` and ``schedule``."""

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
        positions and values (on the CPU)."""
        x = checked_images(x)
        if x.dim() != 4:
            raise ValueError("the Sparse-RS adaptive attack needs B×C×H×W images")
        n = x.shape[2] * x.shape[3]
        if self.pixels >= n:
            raise ValueError(f"sparse-rs pixels must be < the {n} of an image, got {self.pixels}")
        rng = cpu_generator(generator)
        flat = x.flatten(2)
        allowed = near_strokes(x, self.pixels) if self.region == "strokes" else None
        free = free_positions(n, self.pixels, allowed)

        def query(images: torch.Tensor, rows: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
            """Margin and detector score of ``images`` (the rows ``rows`` of the batch)."""
            log_p, score = score_fn(images.view(-1, *x.shape[1:]))
            return margin(log_p, y[rows]), score

        with torch.no_grad():
            current, chosen = random_start(flat, self.pixels, rng, allowed)
            m_now, s_now = query(current, torch.arange(x.shape[0], device=x.device))
            book = Successes(self, threshold, current, m_now, s_now)
            for i in range(1, self.steps):
                gate = self.gate(m_now)  # read at the current point, for it and its candidates
                now = self.loss(m_now, s_now, threshold, gate)
                active = torch.nonzero(now > 0).squeeze(1)
                if active.numel() == 0:
                    break
                count = self.resampled(i - 1, free)
                region = None if allowed is None else allowed[active]
                candidate, in_set = swap(
                    flat[active], current[active], chosen[active], count, rng, region
                )
                m, score = query(candidate, active)
                book.record(i, active, candidate, m, score)
                better = self.loss(m, score, threshold, gate[active]) < now[active]
                kept = active[better]
                current[kept], chosen[kept] = candidate[better], in_set[better]
                m_now[kept], s_now[kept] = m[better], score[better]
        return book.result(current, x.shape)

    def resampled(self, iteration: int, free: int) -> int:
        """How many of the ``k`` pixels move at iteration ``i`` (0 = the first move):
        :func:`~bayesgate.attacks.methods.sparse_rs.resampled_count` over ``steps`` queries, at
        most the ``free`` positions outside the set (``n − k``, or fewer in a region)."""
        return min(resampled_count(self.alpha_init, iteration, self.steps, self.pixels), free)
