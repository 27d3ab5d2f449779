"""bench/requery_attack.py: pass-through of an attacker who resubmits the same images with new
MC draws — the accumulation over draws, against hand-made verdicts."""

from __future__ import annotations

import numpy as np
import pytest
import torch
from bench_scripts import load_bench


def _module():
    return load_bench("requery_attack")


class _Detector:
    k = 3
    score = "fused"
    threshold = 0.0


def test_pass_through_counts_an_image_once_it_evades_in_any_draw(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    rq = _module()
    x = torch.zeros(4, 1, 2, 2)
    x_adv = torch.ones(4, 1, 2, 2)
    y = torch.zeros(4, dtype=torch.int64)

    # clean: images 0–2 right (eligible), 3 wrong. Adversarial draws (correct, flagged):
    # image 0 evades in draw 0 only; image 1 is misclassified but flagged until draw 4, where it
    # evades; image 2 is never misclassified; image 3 evades always but is not eligible.
    def verdicts(_loaded, _det, images, _y, seed, k):
        assert k == 3
        if images is x:
            return np.array([True, True, True, False]), np.zeros(4, dtype=bool)
        d = seed - rq.BASE_SEED
        correct = np.array([d != 0, False, True, False])
        flagged = np.array([d != 0, d != 4, False, False])
        return correct, flagged

    monkeypatch.setattr(rq, "verdicts", verdicts)
    result = rq.requery(None, _Detector(), x_adv, x, y, draws=6)
    assert result["eligible"] == 3 and set(result["curve"]) == {1, 2, 5, 6}
    assert [result["curve"][n]["through"] for n in (1, 2, 5, 6)] == [1, 1, 2, 2]
    assert result["curve"][5]["through_rate"] == pytest.approx(2 / 3)
    assert result["curve"][1]["misclassified_in_some_draw_rate"] == pytest.approx(2 / 3)
