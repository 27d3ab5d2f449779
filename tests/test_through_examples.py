"""bench/through_examples.py on a few digits of the bundled CNN: its count of digits through the
flag is detect-eval's (misclassified, not flagged), each shown digit is one of them, and the
picture is written."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
from adaptive_images import slide_on_the_cnn
from bench_scripts import load_bench

from bayesgate.attacks.detect_eval import evaluate_detector
from bayesgate.attacks.detect_settings import EvalSettings
from bayesgate.models.detection.store import load_detector
from bayesgate.models.store.bundled import resolve_model_dir
from bayesgate.models.store.directory import load_model

SPEC = "slide:eps=10,steps=15"
LIMIT = 40


def test_the_digits_through_are_detect_evals(tmp_path: Path, mnist_root: Path, monkeypatch) -> None:
    monkeypatch.setenv("BAYESGATE_DATA_DIR", str(mnist_root))
    model = resolve_model_dir(Path("bayesgate-cnn"))
    cache = tmp_path / "cache"
    bench = load_bench("through_examples")
    png, out = tmp_path / "through.png", tmp_path / "through.json"
    argv = [str(model), "--attack", SPEC, "--limit", str(LIMIT), "--show", "3",
            "--cache-dir", str(cache), "--out", str(png), "--json", str(out)]  # fmt: skip
    assert bench.main(argv) == 0
    result = json.loads(out.read_text())

    # the reference: detect-eval's own row, on the same (cached) images
    loaded = load_model(model)
    detector = load_detector(model, loaded.card.weights_sha256)
    settings = EvalSettings(attacks=(SPEC,), ood=(), limit=LIMIT, cache_dir=cache)
    row = evaluate_detector(loaded, detector, settings).rows()[0]
    fused = row["scores"][detector.score]
    expected = round(row["successful"] * (1 - fused["tpr_at_threshold"]))
    assert result["successful"] == row["successful"] > 0
    assert result["through"] == expected > 0  # the CNN lets most sparse examples through
    assert 1 <= len(result["shown"]) <= 3
    for r in result["shown"]:
        assert r["score"] <= result["threshold"] and r["predicted"] != r["label"]
        assert 0 < r["l1"] <= 10 + 1e-3 and r["pixels_changed"] >= 1
    assert png.read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"


def test_limit_and_show_must_be_positive(tmp_path: Path) -> None:
    bench = load_bench("through_examples")
    with pytest.raises(SystemExit):
        bench.main(["m", "--attack", "slide", "--show", "0", "--out", str(tmp_path / "x.png")])


def test_adaptive_images_are_judged_as_adaptive_eval_judges(
    tmp_path: Path, mnist_root: Path, monkeypatch
) -> None:
    """``--adaptive-images``: the digits through are ``adaptive-eval``'s ``evaded`` of that row."""
    monkeypatch.setenv("BAYESGATE_DATA_DIR", str(mnist_root))
    run = slide_on_the_cnn(tmp_path / "cache", LIMIT)
    bench = load_bench("through_examples")
    png, out = tmp_path / "through.png", tmp_path / "through.json"
    argv = [str(run.model), "--adaptive-images", str(run.adaptive), "--limit", str(LIMIT),
            "--show", "2", "--out", str(png), "--json", str(out)]  # fmt: skip
    assert bench.main(argv) == 0
    result = json.loads(out.read_text())
    adaptive = run.adaptive_row
    assert adaptive["attack"] == "adaptive SLIDE λ=1"
    assert result["through"] == adaptive["evaded"] > 0
    assert result["successful"] == adaptive["misclassified"]
    assert result["eligible"] == adaptive["eligible"]
    for r in result["shown"]:
        assert r["score"] <= result["threshold"] and r["predicted"] != r["label"]
    assert png.read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"


def test_a_missing_adaptive_images_file_is_one_usage_error(tmp_path: Path, capsys) -> None:
    bench = load_bench("through_examples")
    missing = tmp_path / "none.npz"
    with pytest.raises(SystemExit) as exit_:
        bench.main(
            ["bayesgate-cnn", "--adaptive-images", str(missing), "--out", str(tmp_path / "x.png")]
        )
    assert exit_.value.code == 2
    assert f"--adaptive-images: no file {missing}" in capsys.readouterr().err
