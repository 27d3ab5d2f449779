"""``bayesgate sweep``: each model given gets its own row, line, seconds entry and ROC file;
the same model directory twice is a one-line error (needs attacks/cli.py's sweep patch)."""

from __future__ import annotations

import json
import shutil
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

from bayesgate.attacks import cli as attacks_cli
from bayesgate.cli import main


@pytest.fixture
def restore_threads() -> Iterator[None]:
    import torch

    threads = torch.get_num_threads()
    yield
    torch.set_num_threads(threads)


def _never(*args: Any, **kwargs: Any) -> Any:
    raise AssertionError("the work started before the arguments were checked")


def test_sweep_keeps_models_with_one_label_apart(
    tiny_model_dir: Path, tmp_path: Path, restore_threads: None
) -> None:
    a = shutil.copytree(tiny_model_dir, tmp_path / "a")  # same card name, same label
    b = shutil.copytree(tiny_model_dir, tmp_path / "b")
    fast = ["--limit", "6", "--k", "1", "--k-eval", "2", "--threads", "1", "--no-progress"]
    out = tmp_path / "s6"
    assert main(["sweep", str(a), str(b), "--figure", "6", "--out", str(out), *fast]) == 0
    meta = json.loads((out / "figure6.json").read_text())
    labels = ["MLP α=0.5 (a)", "MLP α=0.5 (b)"]
    assert [d["model"] for d in meta["models"]] == labels
    assert meta["seconds"].keys() == {"tiny-mlp-2x32-a", "tiny-mlp-2x32-b"}
    assert {r["model"] for r in meta["rows"]} == set(labels)
    lines = (out / "figure6.md").read_text().splitlines()
    assert [x.split(" | ")[0] for x in lines if x.startswith("| accuracy")] == [
        f"| accuracy {label}" for label in labels
    ]
    out = tmp_path / "sd"
    argv = ["sweep", str(a), str(b), "--figure", "detection", "--attacks", "fgs:eta=0.3"]
    assert main([*argv, "--out", str(out), *fast]) == 0
    assert sorted(p.name for p in out.glob("*.png")) == [
        "detection_roc_tiny-mlp-2x32-a.png",
        "detection_roc_tiny-mlp-2x32-b.png",
    ]
    assert len((out / "detection.md").read_text().splitlines()) == 2 + 2  # header + a row each


def test_sweep_refuses_a_repeated_model(
    tiny_model_dir: Path,
    tmp_path: Path,
    monkeypatch: pytest.MonkeyPatch,
    capsys: pytest.CaptureFixture[str],
) -> None:
    monkeypatch.setattr(attacks_cli, "_run_sweep", _never)
    monkeypatch.setattr(attacks_cli, "_sweep_images", _never)
    argv = ["sweep", str(tiny_model_dir), str(tiny_model_dir), "--figure", "6"]
    assert main([*argv, "--out", str(tmp_path / "s")]) == 2
    err = capsys.readouterr().err
    problem = f"model directory {tiny_model_dir} given twice: give each model once"
    assert err == f"bayesgate: error: {problem}\n"
    assert not (tmp_path / "s").exists()
