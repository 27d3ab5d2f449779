"""The commands that read a model and write an output (``evaluate --json``, ``attack --out``,
``predict --out``) refuse an output that is one of the model directory's own files — by any path
— before any work: written there, it replaced the card, the weights, the calibration or the
detector, and the model no longer loaded. ``evaluate`` and ``attack --split val`` on a model
trained with ``--val-size 0`` are the one line ``calibrate`` gives, not a traceback."""

from __future__ import annotations

import os
from pathlib import Path

import pytest

from bayesgate.cli import main
from bayesgate.models.store.own_files import MODEL_FILES, model_file_named, refuse_model_file
from tests.cli_checks import never as _never
from tests.cli_checks import one_error_line as _error


@pytest.fixture
def model_dir(tmp_path: Path) -> Path:
    """A folder holding every file a model directory may hold (contents never read here)."""
    folder = tmp_path / "m"
    folder.mkdir()
    for name in MODEL_FILES:
        (folder / name).write_text(f"the model's {name}\n")
    return folder


def _unchanged(model_dir: Path) -> bool:
    return all((model_dir / n).read_text() == f"the model's {n}\n" for n in MODEL_FILES)


def test_a_model_file_is_found_by_any_path(model_dir: Path, tmp_path: Path) -> None:
    os.symlink(model_dir / "card.json", tmp_path / "link.npz")
    os.link(model_dir / "model.safetensors", tmp_path / "hard.npz")
    os.symlink(model_dir, tmp_path / "m-link")
    assert model_file_named(tmp_path / "link.npz", model_dir) == "card.json"
    assert model_file_named(tmp_path / "hard.npz", model_dir) == "model.safetensors"
    assert model_file_named(tmp_path / "m-link" / "detector.json", model_dir) == "detector.json"
    assert model_file_named(model_dir / ".." / "m" / "calibration.json", model_dir) == (
        "calibration.json"
    )
    assert model_file_named(tmp_path / "m-link" / "x.json", model_dir) is None
    assert model_file_named(tmp_path / "new.json", tmp_path / "m-link") is None
    (model_dir / "detector.safetensors").unlink()  # a file the model has not (yet) is its too
    assert model_file_named(model_dir / "detector.safetensors", tmp_path / "m-link") == (
        "detector.safetensors"
    )
    with pytest.raises(ValueError, match=r"^--out .*link\.npz: is the model's own card\.json"):
        refuse_model_file(tmp_path / "link.npz", model_dir, "--out")


@pytest.mark.parametrize("name", MODEL_FILES)
def test_evaluate_json_refuses_a_file_of_the_model(
    name: str,
    model_dir: Path,
    monkeypatch: pytest.MonkeyPatch,
    capsys: pytest.CaptureFixture[str],
) -> None:
    monkeypatch.setattr("bayesgate.models.cli.load_model", _never)
    monkeypatch.chdir(model_dir.parent)
    target = Path("m", "..", "m", name)  # relative, and not spelt as the model's folder is
    code = main(["evaluate", str(model_dir), "--k", "2", "--limit", "5", "--json", str(target)])
    assert code == 2
    assert _error(capsys).startswith(f"--json {target}: is the model's own {name} (in {model_dir})")
    assert _unchanged(model_dir)


def test_attack_out_refuses_a_link_to_a_file_of_the_model(
    model_dir: Path,
    tmp_path: Path,
    monkeypatch: pytest.MonkeyPatch,
    capsys: pytest.CaptureFixture[str],
) -> None:
    """``--out`` must end in .npz, which no model file does: a link so named is the hole."""
    monkeypatch.setattr("bayesgate.attacks.run.run_attack", _never)
    monkeypatch.setattr("bayesgate.models.store.directory.load_model", _never)
    link = tmp_path / "adv.npz"
    os.symlink(model_dir / "model.safetensors", link)
    code = main(["attack", str(model_dir), "--out", str(link), "--limit", "2", "--no-progress"])
    assert code == 2
    assert _error(capsys).startswith(f"--out {link}: is the model's own model.safetensors")
    assert _unchanged(model_dir)


@pytest.mark.parametrize("name", MODEL_FILES)
def test_predict_out_refuses_a_file_of_the_model(
    name: str,
    model_dir: Path,
    tmp_path: Path,
    monkeypatch: pytest.MonkeyPatch,
    capsys: pytest.CaptureFixture[str],
) -> None:
    monkeypatch.setattr("bayesgate.service.gate.Gate.load", _never)
    (tmp_path / "img.png").write_bytes(b"never read")
    out = model_dir / name
    code = main(["predict", str(model_dir), str(tmp_path / "img.png"), "--out", str(out)])
    assert code == 2
    assert _error(capsys).startswith(f"--out {out}: is the model's own {name} (in {model_dir})")
    assert _unchanged(model_dir)


def test_the_other_files_of_the_folder_stay_writable(model_dir: Path) -> None:
    for other in ("metrics.json", "answers.jsonl", "calibration.md", "adv.npz"):
        refuse_model_file(model_dir / other, model_dir, "--out")  # no error


# --- --split val of a model trained without one --------------------------------------------


@pytest.fixture(scope="module")
def no_val_model(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """An untrained mlp-2x32 whose card says it was trained with --val-size 0."""
    import torch

    from bayesgate.models.networks.registry import build_network, preset_architecture
    from bayesgate.models.store.directory import ModelCard, save_model

    arch = preset_architecture("mlp-2x32")
    torch.manual_seed(0)
    card = ModelCard(name="v0", architecture=arch, training={"val_size": 0})
    out = tmp_path_factory.mktemp("v0") / "v0"
    save_model(build_network(arch), card, out)
    return out


@pytest.mark.parametrize(
    ("argv", "purpose"),
    [
        (["evaluate", "{m}", "--split", "val", "--k", "2", "--device", "cpu"], "evaluate on"),
        (
            ["attack", "{m}", "--split", "val", "--limit", "5", "--out", "{t}/a.npz"],
            "attack",
        ),
    ],
)
def test_split_val_of_a_model_without_one_is_one_line(
    argv: list[str],
    purpose: str,
    no_val_model: Path,
    tmp_path: Path,
    mnist_root: Path,
    monkeypatch: pytest.MonkeyPatch,
    capsys: pytest.CaptureFixture[str],
) -> None:
    monkeypatch.setenv("BAYESGATE_DATA_DIR", str(mnist_root))
    argv = [a.format(m=no_val_model, t=tmp_path) for a in argv]
    assert main([*argv, "--no-progress"]) == 2
    assert _error(capsys) == (
        "--split val: model v0 was trained without a validation split (val_size 0): there are "
        f"no held-out images to {purpose}; use --split test"
    )
    assert not (tmp_path / "a.npz").exists()


def test_calibrate_of_a_model_without_a_validation_split_is_the_same_line(
    no_val_model: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    assert main(["calibrate", str(no_val_model), "--no-report", "--no-progress"]) == 2
    assert _error(capsys) == (
        "model v0 was trained without a validation split (val_size 0): there are no held-out "
        "images to calibrate on"
    )
    assert not (no_val_model / "calibration.json").exists()
