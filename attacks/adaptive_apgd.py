"""The adaptive attack on a detector with Auto-PGD's optimiser and random restarts.

Same attacker, same loss as :class:`bayesgate.attacks.adaptive.AdaptivePGD` (it must misclassify
*and* stay under the detector's threshold; the verdict is the caller's, on a fresh MC draw)::

    L(x) = relu(m(x) + κ) + λ · g(x) · relu(s(x) − threshold + δ)

but minimised with the step-size schedule and momentum of APGD (Croce & Hein 2020, Algorithm 1;
:mod:`bayesgate.attacks.methods.apgd`, maximising ``f = −L``): first step 2ε, halved — and the
iterate restarted from the best point — at the checkpoints where the loss stopped falling, with
momentum 0.75. Fixed-step PGD with ε/25 steps either overshoots near the boundary or crawls; APGD
takes large steps first and small ones late, which is what finds the few points where a
misclassified iterate also slips under a threshold. ``restarts`` runs the attack again from new
random starts on the examples no earlier run found (Croce & Hein's restarts; Tramèr et al. 2020
ask for both a stronger optimiser and restarts before a detector's numbers are trusted).

Per example the attack keeps the last iterate its own K-sample query saw misclassified and
unflagged (over all restarts); where there was none, the best (lowest-``L``) point of the last
run. ``first_step`` counts queries over the restarts: ``restart · steps + query``.
"""

from __future__ import annotations

from dataclasses import dataclass

import torch

from bayesgate.attacks.adaptive import (
    CLIP_MAX,
    CLIP_MIN,
    AdaptivePGD,
    AdaptiveResult,
    ScoreFn,
    checked_images,
)
from bayesgate.attacks.adaptive_settings import AdaptiveAPGDParameters
from bayesgate.attacks.methods.apgd import APGDRun
from bayesgate.attacks.methods.square import margin


@dataclass(frozen=True)
class AdaptiveAPGD(AdaptiveAPGDParameters, AdaptivePGD):
    """:class:`~bayesgate.attacks.adaptive.AdaptivePGD`'s attack (``eps``, ``steps`` gradient
    queries per run, ``weight`` λ, ``kappa``, ``delta``, ``schedule``) optimised by APGD, with
    ``restarts`` runs from independent random starts — declared, with their checks, in
    :class:`~bayesgate.attacks.adaptive_settings.AdaptiveAPGDParameters`."""

    def __call__(
        self,
        score_fn: ScoreFn,
        x: torch.Tensor,
        y: torch.Tensor,
        threshold: float,
        *,
        generator: torch.Generator | None = None,
    ) -> AdaptiveResult:
        """Attack ``x`` (B×…, in [0, 1]) away from labels ``y``; ``generator`` draws the starts."""
        x = checked_images(x)
        best = x.clone()
        first = torch.full((x.shape[0],), -1, dtype=torch.int64, device=x.device)
        for restart in range(self.restarts):
            todo = torch.nonzero(first < 0).flatten()
            if todo.numel() == 0:
                break
            final = self._run(score_fn, x, y, threshold, todo, best, first, restart, generator)
            missed = first[todo] < 0
            best[todo[missed]] = final[missed]
        return AdaptiveResult(best, first >= 0, first)

    def _run(
        self,
        score_fn: ScoreFn,
        x: torch.Tensor,
        y: torch.Tensor,
        threshold: float,
        todo: torch.Tensor,
        best: torch.Tensor,
        first: torch.Tensor,
        restart: int,
        generator: torch.Generator | None,
    ) -> torch.Tensor:
        """One APGD run on the examples ``todo``; every query's successes are written into
        ``best`` and ``first`` (full-batch tensors). Returns the run's lowest-``L`` points."""
        queries = 0

        def query(x_adv: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
            nonlocal queries
            log_p, score = score_fn(x_adv)
            m = margin(log_p, y[todo])
            success = ((m < 0) & self._unflagged(score, threshold)).detach()
            rows = todo[success]
            best[rows] = x_adv.detach()[success]
            fresh = rows[first[rows] < 0]
            first[fresh] = restart * self.steps + queries
            queries += 1
            return m, score

        def gain(out: tuple[torch.Tensor, torch.Tensor], _y: torch.Tensor) -> torch.Tensor:
            m, score = out
            return -self.loss(m, score, threshold)  # APGD maximises

        run = APGDRun(query, gain, x[todo], y[todo], self.eps, self.steps, generator)
        return run.run().clamp(CLIP_MIN, CLIP_MAX)
