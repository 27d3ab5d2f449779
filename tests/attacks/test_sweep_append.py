"""``bayesgate sweep --append``: a model of a later run that is not one of the earlier run's
models is never merged under an earlier model's label or name (its rows, its line, its ROC file),
it is told apart; the same model appended again replaces its rows, as before; files written
before the models' directories were recorded still merge (the weights' sha256 tells the same
model)."""

from __future__ import annotations

import json
import shutil
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

from bayesgate.attacks.sweep_append import fit_to_earlier
from bayesgate.cli import main
from bayesgate.models.networks.registry import build_network, preset_architecture
from bayesgate.models.store.directory import ModelCard, save_model

FAST = ["--figure", "6", "--limit", "4", "--k", "1", "--k-eval", "1", "--threads", "1"]


@pytest.fixture
def restore_threads() -> Iterator[None]:
    import torch

    threads = torch.get_num_threads()
    yield
    torch.set_num_threads(threads)


def _model(directory: Path, name: str, seed: int = 0) -> Path:
    """An untrained ``mlp-2x32`` (α = 0.5, label ``MLP α=0.5``); ``seed``: its weights."""
    import torch

    torch.manual_seed(seed)
    arch = preset_architecture("mlp-2x32")
    card = ModelCard(name=name, architecture=arch, training={"alpha": 0.5})
    save_model(build_network(arch), card, directory)
    return directory


def _sweep(out: Path, *models: Path, append: bool = True) -> dict[str, Any]:
    """Figure 6 of ``models`` into ``out`` (``--append``): the JSON written."""
    flags = ["--append"] if append else []
    argv = ["sweep", *map(str, models), *FAST, "--out", str(out), "--no-progress", *flags]
    assert main(argv) == 0
    return json.loads((out / "figure6.json").read_text())


def _models(meta: dict[str, Any]) -> list[tuple[str, str]]:
    return sorted((d["model"], d["name"]) for d in meta["models"])


def _lines(meta: dict[str, Any]) -> dict[str, int]:
    """Rows per label (a line of the plot and of the table each)."""
    counts: dict[str, int] = {}
    for row in meta["rows"]:
        counts[row["model"]] = counts.get(row["model"], 0) + 1
    return counts


def test_an_appended_model_with_an_earlier_label_gets_its_own(
    tmp_path: Path, restore_threads: None, capsys: pytest.CaptureFixture[str]
) -> None:
    """Two MLPs trained with one α in two runs: both were labelled ``MLP α=0.5``, one line of
    22 points in the plot and one line of the table for two models."""
    out = tmp_path / "out"
    _sweep(out, _model(tmp_path / "a", "mlp-a", seed=1), append=False)
    capsys.readouterr()
    meta = _sweep(out, _model(tmp_path / "b", "mlp-b", seed=2))
    assert _models(meta) == [("MLP α=0.5", "mlp-a"), ("MLP α=0.5 (mlp-b)", "mlp-b")]
    assert _lines(meta) == {"MLP α=0.5": 11, "MLP α=0.5 (mlp-b)": 11}
    table = (out / "figure6.md").read_text()
    assert "| accuracy MLP α=0.5 |" in table and "| accuracy MLP α=0.5 (mlp-b) |" in table
    note = capsys.readouterr().err
    assert "added beside it as MLP α=0.5 (mlp-b) (mlp-b)" in note


def test_an_appended_model_with_an_earlier_name_does_not_replace_it(
    tmp_path: Path, restore_threads: None
) -> None:
    """Another directory, other weights, the same card name: its rows replaced the earlier
    model's."""
    out = tmp_path / "out"
    first = _sweep(out, _model(tmp_path / "x" / "m", "n", seed=1), append=False)
    meta = _sweep(out, _model(tmp_path / "y" / "m", "n", seed=2))
    assert _models(meta) == [("MLP α=0.5", "n"), ("MLP α=0.5 (m)", "n-m")]
    assert _lines(meta) == {"MLP α=0.5": 11, "MLP α=0.5 (m)": 11}
    assert meta["seconds"].keys() == {"n", "n-m"}
    earlier = [r for r in meta["rows"] if r["name"] == "n"]
    assert earlier == first["rows"]  # the earlier model's rows as they were
    directories = {d["name"]: d["directory"] for d in meta["models"]}
    assert directories == {"n": str(tmp_path / "x" / "m"), "n-m": str(tmp_path / "y" / "m")}


def test_the_same_model_appended_again_replaces_its_rows(
    tmp_path: Path, restore_threads: None
) -> None:
    out = tmp_path / "out"
    x, y = _model(tmp_path / "x" / "m", "n", seed=1), _model(tmp_path / "y" / "m", "n", seed=2)
    meta = _sweep(out, x, y, append=False)
    both = [("MLP α=0.5 (x/m)", "n-x-m"), ("MLP α=0.5 (y/m)", "n-y-m")]
    assert _models(meta) == both
    assert _models(_sweep(out, y)) == both  # alone its label would be MLP α=0.5, name n
    copy = shutil.copytree(x, tmp_path / "copy")  # the same weights elsewhere: the same model
    assert _models(_sweep(out, copy)) == both
    _model(y, "n", seed=3)  # retrained in place: the same model, its new rows
    meta = _sweep(out, y)
    assert _models(meta) == both and _lines(meta) == {label: 11 for label, _ in both}
    shas = {d["name"]: d["sha256"] for d in meta["models"]}
    card = json.loads((y / "card.json").read_text())
    assert shas["n-y-m"] == card["weights_sha256"]


def test_a_file_written_before_directories_were_recorded_still_merges(
    tmp_path: Path, restore_threads: None
) -> None:
    """Without ``directory`` the weights tell the same model; a model retrained in place since
    cannot be told from another one, and is added beside the earlier one."""
    out = tmp_path / "out"
    a = _model(tmp_path / "a", "mlp-a", seed=1)
    _sweep(out, a, append=False)
    path = out / "figure6.json"
    old = json.loads(path.read_text())
    for d in old["models"]:
        del d["directory"]
    path.write_text(json.dumps(old))
    assert _models(_sweep(out, a)) == [("MLP α=0.5", "mlp-a")]  # replaced
    path.write_text(json.dumps(old))
    _model(a, "mlp-a", seed=2)
    assert _models(_sweep(out, a)) == [("MLP α=0.5", "mlp-a"), ("MLP α=0.5 (a)", "mlp-a-a")]


def _info(label: str, name: str, directory: str, sha: str) -> dict[str, Any]:
    return {"model": label, "name": name, "directory": directory, "sha256": sha}


def test_fit_to_earlier_claims_each_earlier_model_once() -> None:
    """Two copies of an earlier model in one run: one replaces it, the other is told apart."""
    earlier = [_info("MLP det", "d", "/r/d", "s")]
    infos = [_info("MLP det (d)", "d-d", "/r/d", "s"), _info("MLP det (c)", "d-c", "/r/c", "s")]
    fitted, notes = fit_to_earlier(infos, earlier)
    assert [(d["model"], d["name"]) for d in fitted] == [("MLP det", "d"), ("MLP det (c)", "d-c")]
    assert notes == []  # nothing clashed: as described


def test_fit_to_earlier_numbers_what_nothing_else_tells_apart() -> None:
    earlier = [
        _info("CNN det", "c", "/r/a/c", "1"),
        _info("CNN det (c)", "c-c", "/r/b/c", "2"),
    ]
    fitted, notes = fit_to_earlier([_info("CNN det", "c", "/r/z/c", "3")], earlier)
    assert [(d["model"], d["name"]) for d in fitted] == [("CNN det #2", "c-2")]
    assert len(notes) == 1
