"""bench/squeeze_probe.py: the 3×3 median against a direct per-pixel median, the squeeze distance,
and a small run whose union flag is at least each flag and lets no more through than the fused
flag alone."""

from __future__ import annotations

import json
from pathlib import Path

import numpy as np
import pytest
import torch
from bench_scripts import load_bench


def test_median3_is_the_median_of_each_zero_padded_neighbourhood() -> None:
    bench = load_bench("squeeze_probe")
    x = torch.rand(2, 1, 6, 5, generator=torch.Generator().manual_seed(0))
    padded = np.pad(x.numpy(), ((0, 0), (0, 0), (1, 1), (1, 1)))
    expected = np.empty_like(x.numpy())
    for b in range(2):
        for i in range(6):
            for j in range(5):
                expected[b, 0, i, j] = np.median(padded[b, 0, i : i + 3, j : j + 3])
    np.testing.assert_allclose(bench.median3(x).numpy(), expected)
    dot = torch.zeros(1, 1, 5, 5)
    dot[0, 0, 2, 2] = 1.0  # an isolated pixel goes; a 2×2 clump's pixels stay
    assert float(bench.median3(dot).abs().sum()) == 0.0
    clump = torch.zeros(1, 1, 6, 6)
    clump[0, 0, 2:4, 2:4] = 1.0
    assert torch.equal(bench.median3(clump)[0, 0, 2:4, 2:4], torch.zeros(2, 2))  # 4 of 9: below
    block = torch.zeros(1, 1, 7, 7)
    block[0, 0, 2:5, 2:5] = 1.0
    assert float(bench.median3(block)[0, 0, 3, 3]) == 1.0


def test_squeeze_distance_is_the_l1_distance_of_the_means() -> None:
    bench = load_bench("squeeze_probe")
    a = torch.tensor([[0.7, 0.2, 0.1], [1.0, 0.0, 0.0]])
    b = torch.tensor([[0.1, 0.2, 0.7], [1.0, 0.0, 0.0]])
    torch.testing.assert_close(bench.squeeze_distance(a, b), torch.tensor([1.2, 0.0]))


def test_a_small_run(tmp_path: Path, mnist_root: Path, monkeypatch) -> None:
    monkeypatch.setenv("BAYESGATE_DATA_DIR", str(mnist_root))
    bench = load_bench("squeeze_probe")
    out = tmp_path / "probe.json"
    argv = ["bayesgate-cnn", "--limit", "30", "--val", "60", "--fpr", "0.1", "--attack-limit",
            "6", "--steps", "8", "--weights", "0", "1", "--json", str(out)]  # fmt: skip
    assert bench.main(argv) == 0
    result = json.loads(out.read_text())
    assert result["t_s"] == result["t_s_served"] and result["shared_level"] is None
    union = result["clean_flagged_union"]
    assert max(result["clean_flagged_fused"], result["clean_flagged_squeeze"]) <= union
    assert union <= result["clean_flagged_fused"] + result["clean_flagged_squeeze"]
    assert [a["weight"] for a in result["attacks"]] == [0.0, 1.0]
    for row in result["attacks"]:
        assert row["through_union"] <= row["through_fused"] <= row["misclassified"]
        assert row["eligible"] <= row["digits"] == 6


def test_a_missing_images_file_is_one_usage_error(tmp_path: Path, capsys) -> None:
    bench = load_bench("squeeze_probe")
    missing = tmp_path / "none.npz"
    with pytest.raises(SystemExit) as exit_:
        bench.main(["bayesgate-cnn", "--images", str(missing)])
    assert exit_.value.code == 2
    assert f"--images: no file {missing}" in capsys.readouterr().err


def test_the_re_sender_counts_at_least_the_single_shot_and_one_draw_is_it(
    tmp_path: Path, mnist_root: Path, monkeypatch
) -> None:
    monkeypatch.setenv("BAYESGATE_DATA_DIR", str(mnist_root))
    bench = load_bench("squeeze_probe")
    out = tmp_path / "probe.json"
    argv = ["bayesgate-cnn", "--limit", "12", "--val", "40", "--fpr", "0.1", "--attack-limit",
            "12", "--steps", "10", "--pixels", "12", "--weights", "0", "--region", "strokes",
            "--requery", "4", "--json", str(out)]  # fmt: skip
    assert bench.main(argv) == 0
    (row,) = json.loads(out.read_text())["attacks"]
    assert (row["pixels"], row["region"], row["requery"]["draws"]) == (12, "strokes", 4)
    assert row["attacker"] == "sparse-rs"
    for key in ("misclassified", "through_fused", "through_union"):
        assert row[key] <= row["requery"][key] <= row["eligible"]

    from bayesgate.models.data.mnist import load_mnist
    from bayesgate.models.detection.store import load_detector
    from bayesgate.models.store.bundled import model_to_read
    from bayesgate.models.store.directory import load_model

    model = model_to_read("bayesgate-cnn")
    loaded = load_model(model)
    detector = load_detector(model, loaded.card.weights_sha256)
    x, y = load_mnist("test", limit=12)
    k = int(detector.k)
    clean = bench.verdicts(loaded.network, detector, x, y, k, 5, 0.1)
    noisy = (x + 0.7 * torch.rand(x.shape, generator=torch.Generator().manual_seed(0))).clamp(0, 1)
    adv = bench.verdicts(loaded.network, detector, noisy, y, k, 5, 0.1)
    once = bench.requeried(loaded.network, detector, noisy, y, k, 5, 0.1, clean, 1)
    assert once == {"draws": 1, **bench.through(clean, adv)}
    draws = [bench.verdicts(loaded.network, detector, noisy, y, k, 5 + d, 0.1) for d in range(4)]
    wrong = [clean["correct"] & ~v["correct"] for v in draws]
    expected = {
        "draws": 4,
        "misclassified": int(np.logical_or.reduce(wrong).sum()),
        "through_fused": int(
            np.logical_or.reduce([w & ~v["fused"] for w, v in zip(wrong, draws, strict=True)]).sum()
        ),
        "through_union": int(
            np.logical_or.reduce(
                [w & ~v["fused"] & ~v["squeeze"] for w, v in zip(wrong, draws, strict=True)]
            ).sum()
        ),
    }
    assert bench.requeried(loaded.network, detector, noisy, y, k, 5, 0.1, clean, 4) == expected
    assert expected["misclassified"] > once["misclassified"]  # the new draws add digits


def test_shared_thresholds_spend_one_budget_as_the_min_p_rule_does() -> None:
    """Two independent continuous scores: the union of two level-``a`` flags flags
    ``1 − (1 − a)²``, so one budget ``T`` puts each at ``a = 1 − √(1 − T)``; two identical scores
    flag together, so each gets the whole ``T``."""
    bench = load_bench("squeeze_probe")
    rng = np.random.default_rng(0)
    s, q = rng.normal(size=200_000), rng.exponential(size=200_000)
    t_s, t_q, level = bench.shared_thresholds(s, q, 0.05)
    assert level == pytest.approx(1 - np.sqrt(0.95), abs=5e-4)
    union = ((s > t_s) | (q > t_q)).mean()
    assert union <= 0.05 and union == pytest.approx(0.05, abs=5e-4)
    assert (s > t_s).mean() == pytest.approx(level, abs=5e-4)
    _, _, same = bench.shared_thresholds(s, s.copy(), 0.05)
    assert same == pytest.approx(0.05, abs=5e-4)


def test_a_shared_budget_out_of_range_is_one_usage_error(capsys) -> None:
    bench = load_bench("squeeze_probe")
    with pytest.raises(SystemExit) as exit_:
        bench.main(["bayesgate-cnn", "--shared-fpr", "1.5"])
    assert exit_.value.code == 2
    assert "--shared-fpr must be in (0, 1), got 1.5" in capsys.readouterr().err
    with pytest.raises(SystemExit) as exit_:
        bench.main(["bayesgate-cnn", "--patch", "--region", "strokes"])
    assert exit_.value.code == 2
    assert "--patch places one square anywhere: no --region" in capsys.readouterr().err


def test_a_small_run_on_a_shared_budget(tmp_path: Path, mnist_root: Path, monkeypatch) -> None:
    monkeypatch.setenv("BAYESGATE_DATA_DIR", str(mnist_root))
    bench = load_bench("squeeze_probe")
    out = tmp_path / "probe.json"
    argv = ["bayesgate-cnn", "--limit", "30", "--val", "80", "--shared-fpr", "0.1",
            "--attack-limit", "4", "--steps", "4", "--patch", "--pixels", "9",
            "--json", str(out)]  # fmt: skip
    assert bench.main(argv) == 0
    result = json.loads(out.read_text())
    assert result["val_flagged_union"] <= 0.1 and 0 < result["shared_level"] <= 0.1
    assert result["t_s"] != result["t_s_served"]  # the served threshold is replaced
    (row,) = result["attacks"]
    assert row["through_union"] <= row["through_fused"] <= row["misclassified"] <= 4
    assert (row["attacker"], row["pixels"]) == ("patch-rs", 9)
