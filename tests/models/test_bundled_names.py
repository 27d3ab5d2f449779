"""A bundled model's name works wherever a command only reads a model (as ``serve`` always took
it), so the documented commands work from an installed package too; a local directory of that
name wins; commands that write into the model directory refuse the name with a line that says
why and what to do."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from bayesgate import cli
from bayesgate.errors import ModelStoreError
from bayesgate.models.store.bundled import (
    BUNDLED_MODELS_DIR,
    DEFAULT_MODEL_DIR,
    model_to_read,
    resolve_model_dir,
)


def test_names_resolve_to_the_bundled_directories_and_a_local_directory_wins(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    assert model_to_read("bayesgate-cnn") == BUNDLED_MODELS_DIR / "bayesgate-cnn"
    assert model_to_read("bayesgate-default") == DEFAULT_MODEL_DIR
    assert model_to_read("runs/bayesgate-cnn") == Path("runs/bayesgate-cnn")  # a path: as is
    assert model_to_read("no-such-model") == Path("no-such-model")
    monkeypatch.chdir(tmp_path)
    (tmp_path / "bayesgate-cnn").mkdir()
    assert resolve_model_dir(Path("bayesgate-cnn")) == Path("bayesgate-cnn")


def test_reading_commands_take_a_bundled_name(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, mnist_root: Path, capsys
) -> None:
    monkeypatch.setenv("BAYESGATE_DATA_DIR", str(mnist_root))
    monkeypatch.chdir(tmp_path)  # no directory called bayesgate-cnn here
    out = tmp_path / "eval.json"
    argv = ["evaluate", "bayesgate-cnn", "--limit", "8", "--k", "2", "--no-progress"]
    assert cli.main([*argv, "--json", str(out)]) == 0
    card = json.loads((BUNDLED_MODELS_DIR / "bayesgate-cnn" / "card.json").read_text())
    result = json.loads(out.read_text())
    assert result["model"] == card["name"] and result["weights_sha256"] == card["weights_sha256"]
    capsys.readouterr()
    adv = tmp_path / "adv.npz"
    argv = ["attack", "bayesgate-default", "--out", str(adv), "--limit", "2", "--no-progress"]
    assert cli.main(argv) == 0 and adv.is_file()
    # every command that only reads a model parses the name to the bundled directory
    parser = cli.build_parser()
    bundled = BUNDLED_MODELS_DIR / "bayesgate-cnn"
    for argv in (
        ["sweep", "bayesgate-cnn", "--figure", "6"],
        ["detect-eval", "bayesgate-cnn", "--out", "x"],
        ["adaptive-eval", "bayesgate-cnn", "--out", "x"],
        ["evaluate-robust", "bayesgate-cnn", "--out", "x"],
    ):
        args = parser.parse_args(argv)
        assert bundled in [getattr(args, "model", None), *getattr(args, "models", [])], argv


@pytest.mark.parametrize(
    "argv",
    [
        ["calibrate", "bayesgate-cnn"],
        ["fit-detector", "bayesgate-robust"],
        ["evaluate", "bayesgate-cnn", "--write-card", "--k", "2"],
    ],
)
def test_writing_commands_refuse_a_bundled_name(
    argv: list[str], tmp_path: Path, monkeypatch: pytest.MonkeyPatch, capsys
) -> None:
    monkeypatch.chdir(tmp_path)
    before = {p: p.stat().st_mtime_ns for p in (BUNDLED_MODELS_DIR).rglob("*") if p.is_file()}
    assert cli.main(argv) == 2
    err = capsys.readouterr().err
    assert "is a bundled model's name, not a model directory here" in err
    assert "need a copy of your own" in err
    assert err.count("\n") == 1
    after = {p: p.stat().st_mtime_ns for p in (BUNDLED_MODELS_DIR).rglob("*") if p.is_file()}
    assert after == before


def test_an_unknown_bare_name_lists_the_bundled_names(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """``bayesgate attack bayesgate-nope`` (every command reading a model): the one line says what
    a name may be, as ``serve --model-dir`` does; a missing path with folders keeps the old one."""
    from bayesgate.errors import ModelStoreError
    from bayesgate.models.store.directory import read_card

    monkeypatch.chdir(tmp_path)
    with pytest.raises(ModelStoreError) as caught:
        read_card("bayesgate-nope")
    assert str(caught.value) == (
        "bayesgate-nope/card.json: model card not found: bayesgate-nope is neither a model "
        "directory here nor a bundled model's name (bayesgate-cnn, bayesgate-robust, "
        "bayesgate-default)"
    )
    with pytest.raises(ModelStoreError, match=r"is runs/nope a model directory\?"):
        read_card("runs/nope")


def test_load_model_by_bundled_name_says_how_to_read_it(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """``load_model`` takes a directory, not a name; its message says how to read the bundled
    model (resolve the name), and the resolved path loads."""
    from bayesgate.models.store.bundled import resolve_model_dir
    from bayesgate.models.store.directory import load_model

    monkeypatch.chdir(tmp_path)
    with pytest.raises(ModelStoreError, match="resolve the name first") as err:
        load_model("bayesgate-cnn")
    assert "resolve_model_dir" in str(err.value)
    assert load_model(resolve_model_dir(Path("bayesgate-cnn"))).card.name == "cnn-alpha0.5"
