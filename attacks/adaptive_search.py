"""What the query-only adaptive attacks keep of their queries (:mod:`.adaptive_sparse_rs`,
:mod:`.adaptive_patch_rs`): per image, the first query that saw its candidate misclassified and
unflagged, and the best such candidate.

A candidate is a *success* when its margin is negative (misclassified) and its score is at most
the threshold (unflagged; always, with λ = 0). Every query's successes count, whether or not the
search moves there; the one kept per image is the success of lowest full loss ``L`` (gate 1:
:meth:`~bayesgate.attacks.adaptive.AdaptivePGD.loss`) — the most margin on both goals, so the
likeliest to hold on a fresh MC draw. The result is that success, else the search's current
point.
"""

from __future__ import annotations

from math import inf

import torch

from bayesgate.attacks.adaptive import AdaptivePGD, AdaptiveResult


class Successes:
    """The successes of a batch's queries (see the module docstring), started from the search's
    first points ``start`` (B×…) with margins ``m`` and scores ``score`` (B each)."""

    def __init__(
        self,
        attack: AdaptivePGD,
        threshold: float,
        start: torch.Tensor,
        m: torch.Tensor,
        score: torch.Tensor,
    ) -> None:
        self.attack, self.threshold = attack, threshold
        success = self._success(m, score)
        self.images = start.clone()
        self.loss = torch.where(success, attack.loss(m, score, threshold, 1), inf)
        self.first = torch.where(success, 0, -1).to(torch.int64)

    def _success(self, m: torch.Tensor, score: torch.Tensor) -> torch.Tensor:
        return (m < 0) & self.attack._unflagged(score, self.threshold)

    def record(
        self,
        step: int,
        rows: torch.Tensor,
        candidates: torch.Tensor,
        m: torch.Tensor,
        score: torch.Tensor,
    ) -> None:
        """Query ``step``'s ``candidates`` (of the batch's rows ``rows``), with their margins and
        scores: a row's first success sets its ``first``; a success of lower ``L`` than the kept
        one replaces it."""
        success = self._success(m, score)
        self.first[rows[success & (self.first[rows] < 0)]] = step
        full = self.attack.loss(m, score, self.threshold, 1)
        keep = success & (full < self.loss[rows])
        self.images[rows[keep]], self.loss[rows[keep]] = candidates[keep], full[keep]

    def result(self, current: torch.Tensor, shape: torch.Size) -> AdaptiveResult:
        """The kept success per image, else its ``current`` point (both B×…), as ``shape``."""
        found = self.first >= 0
        out = torch.where(found.view(-1, *[1] * (current.dim() - 1)), self.images, current)
        return AdaptiveResult(out.reshape(shape), found, self.first)
