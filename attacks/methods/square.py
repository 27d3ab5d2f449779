"""Square Attack (Andriushchenko et al., ECCV 2020), L∞, untargeted: a black-box attack that only
queries the MC predictive — no gradient is ever computed.

Written from the paper (Algorithms 1 and 2) and its reference implementation's schedule; the
attacked model is only ever called as ``query(x) = log p̄(·|x)`` (B×C) under ``torch.no_grad``.

Margin loss of the current label ``y`` (the model's clean prediction)::

    m(x) = log p̄(y|x) − max_{c≠y} log p̄(c|x)          (m < 0 ⇔ misclassified)

1. Start from vertical stripes: ``x₀ = clip(x + ε·s)``, one random sign ``s ∈ {−1, 1}`` per
   image column (shared by the rows), the paper's initialisation.
2. Iteration i: a square window of side ``h_i = round(sqrt(p_i·n/c))`` (``n`` = pixels·channels,
   ``1 ≤ h_i ≤ H−1``) at a uniformly random position; inside it the perturbation becomes
   ``±ε`` with one random sign per channel (redrawn until the candidate differs from the current
   best in the window). The candidate ``clip(x + δ)`` is kept if its margin is lower than the
   best so far.
3. ``p_i`` halves on the reference schedule (at 10, 50, 200, 500, 1000, 2000, 4000, 6000, 8000
   iterations out of 10 000, rescaled to the query budget), starting at ``p_init``.

Every candidate stays in the ε-ball and in [0, 1] by construction (``|δ| ≤ ε``, then clipping).
An image stops being attacked once its best margin is below ``−confidence``. The MC predictive is
noisy (fresh dropout masks at every query), so ``confidence`` > 0 plays the role CW's κ does:
without it the attack stops on the first lucky draw across the boundary. The query budget counts
one query per image per call of the predictive, the initialisation included.
"""

from __future__ import annotations

import math
from dataclasses import dataclass

import torch

from bayesgate.attacks.methods.base import CLIP_MAX, CLIP_MIN, Attack, AttackInput
from bayesgate.attacks.methods.parameters import SquareParameters
from bayesgate.attacks.model_fn import ModelFn

# iteration (out of 10 000) after which p_init is halved once more; the reference schedule
_P_HALVINGS = (10, 50, 200, 500, 1000, 2000, 4000, 6000, 8000)


def p_schedule(p_init: float, iteration: int, budget: int) -> float:
    """Fraction of pixels changed at ``iteration``: ``p_init / 2^j``, ``j`` = number of the
    reference halving points (out of 10 000) that ``iteration·10000/budget`` has passed."""
    scaled = int(iteration / budget * 10_000)
    return p_init / 2 ** sum(scaled > point for point in _P_HALVINGS)


def margin(log_probs: torch.Tensor, y: torch.Tensor) -> torch.Tensor:
    """``log p̄(y|x) − max_{c≠y} log p̄(c|x)`` per row of ``log_probs`` (B×C)."""
    own = log_probs.gather(1, y[:, None]).squeeze(1)
    others = log_probs.scatter(1, y[:, None], float("-inf"))
    return own - others.max(dim=1).values


@dataclass(frozen=True)
class Square(SquareParameters, Attack):
    """Untargeted L∞ Square Attack: radius ``eps``, at most ``queries`` queries per image, initial
    fraction ``p_init`` of pixels per square, stop margin ``confidence`` (nats).

    ``model_fn`` is only ever called without autograd; the windows and signs come from the
    batch's ``generator`` (drawn on the CPU). Its parameters are declared in
    :class:`~bayesgate.attacks.methods.parameters.SquareParameters`.
    """

    def perturb(self, batch: AttackInput) -> torch.Tensor:
        if batch.x.dim() != 4:
            raise ValueError("square attack needs B×C×H×W images")
        rng = cpu_generator(batch.generator)
        with torch.no_grad():
            return self._run(batch.model_fn, batch.x.detach(), batch.y, rng)

    def _run(
        self, query: ModelFn, x: torch.Tensor, y: torch.Tensor, rng: torch.Generator
    ) -> torch.Tensor:
        best = self.stripes(x, rng)
        best_margin = margin(query(best), y)
        for i in range(self.queries - 1):
            active = torch.nonzero(best_margin > -self.confidence).squeeze(1)
            if active.numel() == 0:
                break
            side = self.side(x, p_schedule(self.p_init, i, self.queries))
            candidate = self.square_step(x[active], best[active], side, rng)
            m = margin(query(candidate), y[active])
            better = m < best_margin[active]
            best[active[better]] = candidate[better]
            best_margin[active[better]] = m[better]
        return best

    def stripes(self, x: torch.Tensor, rng: torch.Generator) -> torch.Tensor:
        """Square's start (Andriushchenko et al. 2020, Alg. 1): vertical stripes, each column of
        each channel shifted by ``±eps`` (random signs), clipped to the pixel range."""
        b, c, _, w = x.shape
        signs = _random_signs((b, c, 1, w), rng).to(x.device, x.dtype)
        return (x + self.eps * signs).clamp(CLIP_MIN, CLIP_MAX)

    @staticmethod
    def side(x: torch.Tensor, p: float) -> int:
        """Side of a square covering a fraction ``p`` of the pixels (1 … min(H, W) − 1)."""
        c, h, w = x.shape[1:]
        side = round(math.sqrt(p * c * h * w / c))
        return min(max(side, 1), min(h, w) - 1)

    def square_step(
        self, x: torch.Tensor, best: torch.Tensor, side: int, rng: torch.Generator
    ) -> torch.Tensor:
        """One candidate per image: ``best`` with one ``side``×``side`` window set to ``clip(x ±
        ε)``, one sign per channel, redrawn where it would not change ``best`` (as in the
        reference code; with one sign per channel two draws cover both choices)."""
        b, c, h, w = x.shape
        window = _windows(b, h, w, side, rng).to(x.device)
        candidate = best.clone()
        todo = torch.ones(b, dtype=torch.bool, device=x.device)
        for _ in range(16):
            signs = _random_signs((b, c, 1, 1), rng).to(x.device, x.dtype)
            new = torch.where(window, (x + self.eps * signs).clamp(CLIP_MIN, CLIP_MAX), best)
            candidate[todo] = new[todo]
            todo = (candidate - best).flatten(1).abs().amax(dim=1) <= 1e-7
            if not todo.any():
                break
        return candidate


def _windows(b: int, h: int, w: int, side: int, rng: torch.Generator) -> torch.Tensor:
    """``b×1×h×w`` boolean masks, each one ``side``×``side`` square at a uniform position."""
    rows = torch.randint(0, h - side, (b, 1, 1, 1), generator=rng)
    cols = torch.randint(0, w - side, (b, 1, 1, 1), generator=rng)
    i = torch.arange(h).view(1, 1, h, 1)
    j = torch.arange(w).view(1, 1, 1, w)
    return (i >= rows) & (i < rows + side) & (j >= cols) & (j < cols + side)


def _random_signs(shape: tuple[int, ...], rng: torch.Generator) -> torch.Tensor:
    return torch.randint(0, 2, shape, generator=rng).float() * 2.0 - 1.0


def cpu_generator(generator: torch.Generator | None) -> torch.Generator:
    """``generator`` itself when it lives on the CPU, else a CPU generator seeded from it."""
    if generator is not None and generator.device.type == "cpu":
        return generator
    seed = int(torch.randint(2**62, (1,), generator=generator, device=_device(generator)))
    return torch.Generator().manual_seed(seed)


def _device(generator: torch.Generator | None) -> torch.device:
    return torch.device("cpu") if generator is None else generator.device
