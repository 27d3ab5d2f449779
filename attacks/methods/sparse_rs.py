"""Sparse-RS (Croce, Singh, Andriushchenko, Flammarion & Hein, "Sparse-RS: a versatile framework
for query-efficient sparse black-box adversarial attacks", AAAI 2022), L0 pixel threat model,
untargeted: a random search over *which* ``k`` pixels to perturb that only queries the MC
predictive — no gradient is ever computed, so gradient masking cannot hide from it.

The attacked model is only ever called as ``query(x) = log p̄(·|x)`` (B×C) under
``torch.no_grad``. The loss is Square's margin (:func:`~bayesgate.attacks.methods.square.margin`)
of the current label ``y`` (the model's clean prediction)::

    m(x) = log p̄(y|x) − max_{c≠y} log p̄(c|x)          (m < 0 ⇔ misclassified)

An adversarial image equals ``x`` outside a set ``S`` of ``k`` of the ``n = H·W`` pixel positions
and takes an extreme value on ``S``, ``x'_p ∈ {0, 1}^C`` drawn at random per channel (the paper's
L0 pixel model), so ``‖x' − x‖₀ ≤ k`` pixels (a drawn value equal to the clean one changes
nothing) and ``‖x' − x‖₁ ≤ k·C``. The paper's ``k`` is the parameter ``pixels``: ``bayesgate
attack`` makes a flag of every parameter, and its ``--k`` is the number of MC passes.

1. Start: ``S₀`` = ``k`` positions drawn uniformly per image, random extreme values.
2. Iteration ``i`` (``i = 0 … queries − 2``): ``r_i = max(1, round(α_i·k))`` positions (at most
   ``n − k``) drawn uniformly from ``S`` leave it (back to the clean value) and ``r_i`` positions
   drawn uniformly from outside ``S`` enter it with fresh random extreme values. The candidate
   replaces the best so far if its margin is strictly lower.
3. ``α_i = p_schedule(α_init, i, queries)``: α_init halved at iterations 10, 50, 200, 500, 1000,
   2000, 4000, 6000, 8000 out of 10 000, rescaled to the budget — Square's reference schedule
   (:func:`~bayesgate.attacks.methods.square.p_schedule`), the piecewise-constant schedule that
   Sparse-RS takes from Square Attack.

Choices, where the sources leave room:

- Accept rule *strictly lower* (``m' < m*``), as in Square here and in the authors' code
  (``fra31/sparse-rs``, ``rs_attacks.py``: ``loss < loss_min``; the paper's Algorithm 1, a
  figure, was not at hand to compare). Accepting ties (``≤``) would let the set drift across a
  flat loss, which only matters for a deterministic model with exact ties; on the MC predictive
  (fresh masks at every query) ties do not happen. Either way the best margin never rises.
- ``α_init = 0.3``: the authors' value for untargeted L0 attacks (their README's ImageNet
  command); no MNIST value was found.
- Schedule: the halving schedule above. The authors' code divides α_init for L0 by 2, 4, 5, 6,
  8, 10, 12, 15, 20 at the same points instead (and takes ``int``, not ``round``); at k = 10
  both give ``r_i = 1`` after the first 0.5 % of the budget (here 3 then 2 before that, there 3
  at the first query only).

Positions and values come from the batch's ``generator`` (drawn on the CPU, as Square's). An
image stops being attacked once its best margin is below ``−confidence`` (the MC predictive is
noisy; see :mod:`~bayesgate.attacks.methods.square`). The query budget counts one query per image
per call of the predictive, the initialisation included. ``on_step(t, x_t)`` sees the best images
after the start (``t = 0``) and after each iteration.
"""

from __future__ import annotations

from dataclasses import dataclass

import torch
import torch.nn.functional as F

from bayesgate.attacks.methods.base import Attack, AttackInput
from bayesgate.attacks.methods.parameters import SparseRSParameters
from bayesgate.attacks.methods.square import cpu_generator, margin, p_schedule


@dataclass(frozen=True)
class SparseRS(SparseRSParameters, Attack):
    """Untargeted L0 Sparse-RS: at most ``pixels`` pixels set to 0 or 1, at most ``queries`` queries
    per image, initial resampled fraction ``alpha_init``, stop margin ``confidence`` (nats).

    ``model_fn`` is only ever called without autograd. Its parameters are declared in
    :class:`~bayesgate.attacks.methods.parameters.SparseRSParameters`; see the module docstring.
    """

    def perturb(self, batch: AttackInput) -> torch.Tensor:
        if batch.x.dim() != 4:
            raise ValueError("sparse-rs needs B×C×H×W images")
        n = batch.x.shape[2] * batch.x.shape[3]
        if self.pixels >= n:
            raise ValueError(f"sparse-rs pixels must be < the {n} of an image, got {self.pixels}")
        rng = cpu_generator(batch.generator)
        with torch.no_grad():
            return self._run(batch, batch.x.detach().flatten(2), rng).view_as(batch.x)

    def resampled(self, iteration: int) -> int:
        """How many of the ``k`` pixels iteration ``i`` moves: :func:`resampled_count`."""
        return resampled_count(self.alpha_init, iteration, self.queries, self.pixels)

    def _run(self, batch: AttackInput, x: torch.Tensor, rng: torch.Generator) -> torch.Tensor:
        """The search on flattened images ``x`` (B×C×n); returns the best images, B×C×n."""

        def query(images: torch.Tensor, labels: torch.Tensor) -> torch.Tensor:
            return margin(batch.model_fn(images.view(-1, *batch.x.shape[1:])), labels)

        best, chosen = random_start(x, self.pixels, rng)
        best_margin = query(best, batch.y)
        _report(batch, 0, best)
        for i in range(self.queries - 1):
            active = torch.nonzero(best_margin > -self.confidence).squeeze(1)
            if active.numel() == 0:
                break
            count = min(self.resampled(i), x.shape[2] - self.pixels)
            candidate, in_set = swap(x[active], best[active], chosen[active], count, rng)
            m = query(candidate, batch.y[active])
            better = m < best_margin[active]
            kept = active[better]
            best[kept], chosen[kept] = candidate[better], in_set[better]
            best_margin[kept] = m[better]
            _report(batch, i + 1, best)
        return best


def resampled_count(alpha_init: float, iteration: int, budget: int, k: int) -> int:
    """``r_i = max(1, round(α_i·k))``, ``α_i = p_schedule(alpha_init, i, budget)``: how many of
    the ``k`` pixels Sparse-RS's iteration ``i`` (0 = the first move) moves."""
    return max(1, round(p_schedule(alpha_init, iteration, budget) * k))


def near_strokes(x: torch.Tensor, k: int, level: float = 0.5) -> torch.Tensor:
    """The positions within one pixel (8-neighbourhood) of a stroke of ``x`` (B×C×H×W): the 3×3
    dilation of ``{p : max_c x_{c,p} > level}``, flattened to B×n bool — the stroke and its
    border. An image whose region has ``k`` positions or fewer (a blank image) gets every
    position instead, so ``k`` pixels and a move always fit."""
    if x.dim() != 4:
        raise ValueError("the stroke region needs B×C×H×W images")
    stroke = (x > level).any(dim=1, keepdim=True).to(x.dtype)
    region = (F.max_pool2d(stroke, 3, stride=1, padding=1) > 0).flatten(1)
    return region | (region.sum(dim=1, keepdim=True) <= k)


def free_positions(n: int, k: int, allowed: torch.Tensor | None) -> int:
    """How many positions lie outside a set of ``k`` in every image: ``n − k``, or the fewest
    allowed positions of any image (``allowed``: B×n bool) minus ``k`` — the most a move may
    take in."""
    return n - k if allowed is None else int(allowed.sum(dim=1).min()) - k


def random_start(
    x: torch.Tensor, k: int, rng: torch.Generator, allowed: torch.Tensor | None = None
) -> tuple[torch.Tensor, torch.Tensor]:
    """Sparse-RS's start: ``k`` positions per image drawn uniformly (among ``allowed``, B×n bool,
    if given), each set to a random value in {0, 1} per channel. ``x``: B×C×n; returns the images
    (B×C×n) and their sets (B×n bool)."""
    chosen = torch.zeros(x.shape[0], x.shape[2], dtype=torch.bool, device=x.device)
    where = _pick(~chosen if allowed is None else allowed, k, rng)
    start = _place(x.clone(), where, _extremes(x, k, rng))
    return start, chosen.scatter_(1, where, True)


def swap(
    x: torch.Tensor,
    current: torch.Tensor,
    chosen: torch.Tensor,
    count: int,
    rng: torch.Generator,
    allowed: torch.Tensor | None = None,
) -> tuple[torch.Tensor, torch.Tensor]:
    """One Sparse-RS move per image: ``count`` positions drawn uniformly from the set ``chosen``
    (B×n bool) go back to the clean ``x``, ``count`` positions drawn uniformly from outside it
    (and inside ``allowed``, B×n bool, if given) enter it with random values in {0, 1} per
    channel. ``x``, ``current``: B×C×n; returns the candidate (B×C×n) and its set (B×n bool),
    ``current`` and ``chosen`` left alone."""
    outside = ~chosen if allowed is None else allowed & ~chosen
    back, out = _pick(chosen, count, rng), _pick(outside, count, rng)
    candidate = _place(current.clone(), back, x.gather(2, _channels(back, x)))
    _place(candidate, out, _extremes(x, count, rng))
    in_set = chosen.clone().scatter_(1, back, False).scatter_(1, out, True)
    return candidate, in_set


def _pick(allowed: torch.Tensor, count: int, rng: torch.Generator) -> torch.Tensor:
    """``count`` distinct positions per row drawn uniformly among the ``True`` ones of ``allowed``
    (B×n bool): the ``count`` smallest of i.i.d. uniform scores, the disallowed ones set to 2."""
    scores = torch.rand(allowed.shape, generator=rng).to(allowed.device)
    return scores.masked_fill(~allowed, 2.0).topk(count, dim=1, largest=False).indices


def _extremes(x: torch.Tensor, count: int, rng: torch.Generator) -> torch.Tensor:
    """B×C×count values drawn uniformly from {0, 1}."""
    values = torch.randint(0, 2, (x.shape[0], x.shape[1], count), generator=rng)
    return values.to(x.device, x.dtype)


def _place(images: torch.Tensor, positions: torch.Tensor, values: torch.Tensor) -> torch.Tensor:
    """``images`` (B×C×n) with ``values`` (B×C×m) written at ``positions`` (B×m), in place."""
    return images.scatter_(2, _channels(positions, images), values)


def _channels(positions: torch.Tensor, x: torch.Tensor) -> torch.Tensor:
    """Positions (B×m) as indices into B×C×n, the same for every channel."""
    return positions[:, None, :].expand(-1, x.shape[1], -1)


def _report(batch: AttackInput, step: int, best: torch.Tensor) -> None:
    if batch.on_step is not None:
        batch.on_step(step, best.view_as(batch.x))
