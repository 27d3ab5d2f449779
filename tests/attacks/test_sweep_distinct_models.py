"""Every model of a sweep gets its own row, line and file: labels (and card names) that two models
share are told apart, others kept as they were; the same directory given twice is refused, by
the sweep's functions and by ``evaluate-robust``; the wide CNN has a label of its own."""

from __future__ import annotations

import shutil
from pathlib import Path
from typing import Any

import pytest

from bayesgate.attacks import robust_cli, robust_eval
from bayesgate.attacks.sweep import _KINDS, describe, describe_models, detection, figure6
from bayesgate.cli import main
from bayesgate.errors import InvalidArgument
from bayesgate.models.data.mnist import load_mnist
from bayesgate.models.networks.registry import build_network, network_types, preset_architecture
from bayesgate.models.store.directory import LoadedModel, ModelCard, load_model, save_model
from bayesgate.models.store.own_files import check_distinct_models


def _model(directory: Path, name: str, preset: str = "mlp-2x32", alpha: float = 0.5) -> Path:
    """An untrained model saved under ``directory`` (labels need no training)."""
    arch = preset_architecture(preset)
    card = ModelCard(name=name, architecture=arch, training={"alpha": alpha})
    save_model(build_network(arch), card, directory)
    return directory


def _labels(infos: list[dict[str, Any]]) -> list[tuple[str, str]]:
    return [(d["model"], d["name"]) for d in infos]


# --- the wide CNN (bundled bayesgate-robust) ---------------------------------------------------


def test_the_wide_cnn_is_labelled_as_one(tmp_path: Path) -> None:
    """It was labelled by its raw type: ``dropout_cnn_wide α=0.5``."""
    assert describe(load_model(_model(tmp_path, "w", "cnn-wide")))["model"] == "wide CNN α=0.5"


def test_every_network_type_has_a_label() -> None:
    assert set(network_types()) <= set(_KINDS)


# --- labels and names told apart ---------------------------------------------------------------


def test_clashing_labels_get_the_card_name_and_the_others_stay(tmp_path: Path) -> None:
    models = [
        load_model(_model(tmp_path / "m1", "mlp-2x32-alpha0.5")),
        load_model(_model(tmp_path / "det", "d", "mlp-2x32-det")),
        load_model(_model(tmp_path / "m100", "mlp-2x100-alpha0.5", "mlp-2x100")),
        load_model(_model(tmp_path / "a1", "a1", alpha=1.0)),
    ]
    assert _labels(describe_models(models)) == [
        ("MLP α=0.5 (mlp-2x32-alpha0.5)", "mlp-2x32-alpha0.5"),
        ("MLP det", "d"),  # no clash: as describe() has it (the committed docs' labels)
        ("MLP α=0.5 (mlp-2x100-alpha0.5)", "mlp-2x100-alpha0.5"),
        ("MLP α=1", "a1"),
    ]
    assert describe_models(models) == describe_models(models)  # deterministic


def test_equal_card_names_get_the_directory(tmp_path: Path) -> None:
    """Copies of one model (same card name): the labels name the directories, the names (the
    rows' key, the ``seconds`` key, the ROC file's name) get the directory appended."""
    first = _model(tmp_path / "x" / "m", "n")
    shutil.copytree(first, tmp_path / "y" / "m")
    shutil.copytree(first, tmp_path / "m2")
    models = [load_model(p) for p in (first, tmp_path / "y" / "m", tmp_path / "m2")]
    assert _labels(describe_models(models)) == [
        ("MLP α=0.5 (x/m)", "n-x-m"),
        ("MLP α=0.5 (y/m)", "n-y-m"),
        (f"MLP α=0.5 ({tmp_path.name}/m2)", f"n-{tmp_path.name}-m2"),
    ]
    # as few parts of the paths as tell them apart
    shorter = [("MLP α=0.5 (m)", "n-m"), ("MLP α=0.5 (m2)", "n-m2")]
    assert _labels(describe_models(models[1:])) == shorter


def test_the_same_directory_twice_is_refused(tmp_path: Path) -> None:
    path = _model(tmp_path / "m", "m")
    loaded = load_model(path)
    again = LoadedModel(network=loaded.network, card=loaded.card, directory=tmp_path / "." / "m")
    with pytest.raises(InvalidArgument, match=f"model directory {tmp_path / 'm'} given twice"):
        describe_models([loaded, again])
    link = tmp_path / "link"
    link.symlink_to(path)
    with pytest.raises(InvalidArgument, match=f"as {path} and {link}"):
        check_distinct_models([path, tmp_path / "other", link])
    check_distinct_models([path, tmp_path / "other"])  # distinct: no error


# --- the sweep's functions: one row set, one line, one ROC file per model ----------------------


@pytest.fixture
def copies(tiny_model_dir: Path, tmp_path: Path) -> list[LoadedModel]:
    """Two directories of the tiny model: same card name, same label."""
    return [load_model(shutil.copytree(tiny_model_dir, tmp_path / d)) for d in ("a", "b")]


def test_figure6_gives_each_model_its_rows(copies: list[LoadedModel]) -> None:
    x, y = load_mnist("test", limit=6)
    rows = figure6(copies, x, y, etas=(0.0, 0.2), k=1, k_eval=2)
    by_model = {(r["model"], r["name"]) for r in rows}
    assert by_model == {("MLP α=0.5 (a)", "tiny-mlp-2x32-a"), ("MLP α=0.5 (b)", "tiny-mlp-2x32-b")}
    # the labels a sweep run one model at a time passes in are used as they are
    infos = describe_models(copies)
    rows = figure6(copies[1:], x, y, etas=(0.0,), k=1, k_eval=2, infos=infos[1:])
    assert {r["model"] for r in rows} == {"MLP α=0.5 (b)"}


def test_detection_writes_one_roc_plot_per_model(copies: list[LoadedModel], tmp_path: Path) -> None:
    x, y = load_mnist("test", limit=10)
    rows = detection(copies, x, y, attacks=["fgs:eta=0.3"], k=1, k_eval=2, roc_dir=tmp_path / "roc")
    assert len({r["model"] for r in rows}) == 2
    names = sorted(p.name for p in (tmp_path / "roc").iterdir())
    assert names == ["detection_roc_tiny-mlp-2x32-a.png", "detection_roc_tiny-mlp-2x32-b.png"]


# --- evaluate-robust ---------------------------------------------------------------------------


def _never(*args: Any, **kwargs: Any) -> Any:
    raise AssertionError("a model was loaded or evaluated")


def test_evaluate_robust_refuses_a_repeated_model(
    tiny_model_dir: Path,
    tmp_path: Path,
    monkeypatch: pytest.MonkeyPatch,
    capsys: pytest.CaptureFixture[str],
) -> None:
    """``evaluate-robust m m`` evaluated it twice (two identical rows)."""
    monkeypatch.setattr(robust_cli, "load_for_evaluation", _never)
    monkeypatch.setattr(robust_eval, "evaluate_robust", _never)
    again = tmp_path / "link"
    again.symlink_to(tiny_model_dir)
    for models in ([tiny_model_dir, tiny_model_dir], [tiny_model_dir, again]):
        argv = ["evaluate-robust", *map(str, models), "--out", str(tmp_path / "out")]
        assert main(argv) == 2
        err = capsys.readouterr().err
        assert err.count("\n") == 1
        assert err.startswith(f"bayesgate: error: model directory {models[1]} given twice")
    assert not (tmp_path / "out").exists()
