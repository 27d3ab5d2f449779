"""User input of ``train``, ``evaluate``, ``uci`` and ``uci-table`` checked before the work, as
one line naming the flag (exit 2): ``--limit 0``, output paths that cannot be written,
adversarial-only flags without ``--adversarial``, UCI settings out of range, ``evaluate
--write-card`` with ``--limit`` or into a bundled model, and an unknown model name."""

from __future__ import annotations

import contextlib
import io
import shutil
from collections.abc import Callable
from pathlib import Path

import pytest

from bayesgate.cli import build_parser, main
from bayesgate.models import adversarial_cli
from bayesgate.models.store import bundled
from bayesgate.models.store.bundled import BUNDLED_MODELS_DIR
from bayesgate.models.uci.experiment import UCIConfig

TINY = ["train", "--preset", "mlp-2x32", "--epochs", "1", "--limit", "100", "--val-size", "50",
        "--k-train", "1", "--k-val", "1", "--no-progress", "--device", "cpu"]  # fmt: skip


def _run(argv: list[str]) -> tuple[int, str, str]:
    out, err = io.StringIO(), io.StringIO()
    with contextlib.redirect_stdout(out), contextlib.redirect_stderr(err):
        code = main(argv)
    return code, out.getvalue(), err.getvalue()


def _refused(argv: list[str]) -> str:
    """The one line of a refused command (exit 2, nothing on stdout), without its prefix."""
    code, stdout, stderr = _run(argv)
    assert code == 2, stderr
    assert stdout == "" and stderr.count("\n") == 1, stderr
    assert stderr.startswith("bayesgate: error: "), stderr
    return stderr.removeprefix("bayesgate: error: ").rstrip("\n")


def _never(what: str) -> Callable[..., None]:
    def fail(*args: object, **kwargs: object) -> None:
        raise AssertionError(f"{what} reached although the input was refused")

    return fail


@pytest.fixture
def no_training(monkeypatch: pytest.MonkeyPatch, tmp_path: Path) -> None:
    """``train``'s data and training fail the test if reached; checkpoints go under tmp."""
    monkeypatch.setenv("XDG_CACHE_HOME", str(tmp_path / "cache"))
    monkeypatch.setattr("bayesgate.models.data.mnist.load_mnist", _never("load_mnist"))
    monkeypatch.setattr("bayesgate.models.cli.train", _never("train"))


@pytest.fixture
def no_evaluation(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr("bayesgate.models.cli.load_model", _never("load_model"))
    monkeypatch.setattr("bayesgate.models.data.mnist.load_mnist", _never("load_mnist"))


@pytest.fixture
def a_file(tmp_path: Path) -> Path:
    path = tmp_path / "mfile"
    path.write_text("a file, not a folder")
    return path


# 1. train --limit


@pytest.mark.parametrize("limit", ["0", "-3"])
def test_train_refuses_a_limit_below_one(no_training: None, tmp_path: Path, limit: str) -> None:
    argv = [*TINY, "--out", str(tmp_path / "m"), "--checkpoint-dir", str(tmp_path / "ck")]
    argv[argv.index("--limit") + 1] = limit
    assert _refused(argv) == f"--limit must be ≥ 1, got {limit}"
    assert not (tmp_path / "m").exists() and not (tmp_path / "ck").exists()


# 2. output paths checked before the work


@pytest.mark.parametrize(
    ("flag", "where", "problem"),
    [
        ("--out", "mfile/sub", "{f} is a file, not a folder"),
        ("--out", "mfile", "is a file, not a folder"),
        ("--checkpoint-dir", "mfile", "is a file, not a folder"),
        ("--checkpoint-dir", "mfile/ck", "{f} is a file, not a folder"),
        ("--epoch-log", "mfile/x.jsonl", "cannot create {f}"),
        ("--epoch-log", ".", "is a folder, not a file"),
    ],
)
def test_train_checks_its_output_paths_before_training(
    no_training: None, tmp_path: Path, a_file: Path, flag: str, where: str, problem: str
) -> None:
    path = tmp_path / where
    argv = [*TINY, "--out", str(tmp_path / "m"), flag, str(path)]
    line = _refused(argv)
    assert line.startswith(f"{flag} {path}: "), line
    assert problem.format(f=a_file) in line


def test_train_still_refuses_an_out_holding_a_model(no_training: None, tmp_path: Path) -> None:
    out = tmp_path / "m"
    out.mkdir()
    (out / "card.json").write_text("{}")
    assert "already holds a model" in _refused([*TINY, "--out", str(out)])


def test_evaluate_checks_json_before_the_model(
    no_evaluation: None, tmp_path: Path, a_file: Path
) -> None:
    assert _refused(["evaluate", "bayesgate-cnn", "--k", "2", "--limit", "5", "--json",
                     str(tmp_path)]) == f"--json {tmp_path}: is a folder, not a file"  # fmt: skip
    line = _refused(["evaluate", "bayesgate-cnn", "--json", str(a_file / "m.json")])
    assert line.startswith(f"--json {a_file / 'm.json'}: cannot create {a_file}")


def test_uci_checks_out_before_loading_the_data(
    monkeypatch: pytest.MonkeyPatch, a_file: Path
) -> None:
    monkeypatch.setattr("bayesgate.models.uci.data.load_uci", _never("load_uci"))
    line = _refused(["uci", "--dataset", "boston", "--out", str(a_file / "u")])
    assert line == f"--out {a_file / 'u'}: {a_file} is a file, not a folder"


def test_uci_table_checks_csv_before_reading(
    monkeypatch: pytest.MonkeyPatch, tmp_path: Path, a_file: Path
) -> None:
    monkeypatch.setattr("bayesgate.models.uci.cli.format_table", _never("format_table"))
    runs = tmp_path / "runs"
    runs.mkdir()
    assert _refused(["uci-table", str(runs), "--csv", str(tmp_path)]) == (
        f"--csv {tmp_path}: is a folder, not a file"
    )
    line = _refused(["uci-table", str(runs), "--csv", str(a_file / "x.csv")])
    assert line.startswith(f"--csv {a_file / 'x.csv'}: cannot create {a_file}")


# 3. adversarial-only flags


@pytest.mark.parametrize(
    "flags",
    [
        ["--eps", "0.1"],
        ["--attack-steps", "3"],
        ["--attack-step-size", "0.01"],
        ["--eps-ramp-epochs", "3"],
        ["--clean-mix", "0.5"],
        ["--attack-k", "2"],
        ["--monitor-size", "10"],
    ],
)
def test_adversarial_flags_without_adversarial_are_refused(
    no_training: None, tmp_path: Path, flags: list[str]
) -> None:
    line = _refused([*TINY, "--out", str(tmp_path / "m"), *flags])
    assert line.startswith(f"{flags[0]} applies with --adversarial only"), line


def test_several_adversarial_flags_are_named_together(no_training: None, tmp_path: Path) -> None:
    argv = [*TINY, "--out", str(tmp_path / "m"), "--eps", "0.1", "--attack-steps", "3",
            "--eps-ramp-epochs", "3"]  # fmt: skip
    line = _refused(argv)
    assert line.startswith("--eps, --attack-steps, --eps-ramp-epochs apply with --adversarial only")


def test_a_recorded_plain_command_with_every_default_spelled_out_still_runs() -> None:
    """Plain runs before this check recorded ``--eps 0.3 --attack-steps 7 …`` (the defaults) in
    their cards' commands (e.g. docs/mnist/figure5/*.json): those values change nothing, so the
    command is accepted as it was recorded."""
    recorded = "--eps 0.3 --attack-steps 7 --eps-ramp-epochs 0.0 --clean-mix 0.0 --attack-k 1 "
    args = build_parser().parse_args(["train", *(recorded + "--monitor-size 500").split()])
    adversarial_cli.check_arguments(args)
    assert adversarial_cli.adversarial_config(args, 0.5) is None


def test_adversarial_defaults_are_filled_in_with_adversarial() -> None:
    args = build_parser().parse_args(["train", "--adversarial", "pgd", "--eps", "0.1"])
    adversarial_cli.check_arguments(args)
    assert args.eps == 0.1 and args.attack_steps == 7 and args.monitor_size == 500
    config = adversarial_cli.adversarial_config(args, 0.5)
    assert config is not None and config.eps == 0.1 and config.steps == 7
    plain = build_parser().parse_args(["train"])
    adversarial_cli.check_arguments(plain)  # nothing given: nothing to refuse
    assert adversarial_cli.adversarial_config(plain, 0.5) is None
    assert all(getattr(plain, key) is None for key in adversarial_cli.ADVERSARIAL_DEFAULTS)


# 4. UCI settings: the flag and the bad value, not the whole config


@pytest.mark.parametrize(
    ("flags", "line"),
    [
        (["--alpha", "-1"], "--alpha must be ≥ 0, got -1"),
        (["--alpha", "0.5", "0.5"], "--alpha values must be distinct, got 0.5"),
        (["--epochs", "0"], "--epochs must be ≥ 1, got 0"),
        (["--k-test", "0"], "--k-test must be ≥ 1, got 0"),
        (["--k-train", "-2"], "--k-train must be ≥ 1, got -2"),
        (["--lr", "0"], "--lr must be > 0, got 0"),
        (["--hidden", "0"], "--hidden must be ≥ 1, got 0"),
        (["--batch-size", "0"], "--batch-size must be ≥ 1, got 0"),
        (["--dropout-rates", "0.1", "1.5"], "--dropout-rates must be in [0, 1), got 1.5"),
        (["--tau-values", "0"], "--tau-values must be > 0, got 0"),
        (["--tau-lr", "-0.1"], "--tau-lr must be > 0, got -0.1"),
    ],
)
def test_uci_names_the_flag_and_the_bad_value(
    monkeypatch: pytest.MonkeyPatch, tmp_path: Path, flags: list[str], line: str
) -> None:
    monkeypatch.setattr("bayesgate.models.uci.data.load_uci", _never("load_uci"))
    out = tmp_path / "uci"
    assert _refused(["uci", "--dataset", "boston", "--out", str(out), *flags]) == line
    assert not out.exists()


def test_uci_config_names_the_field_not_the_whole_config() -> None:
    with pytest.raises(ValueError, match=r"^alphas must be ≥ 0, got -1$") as info:
        UCIConfig(alphas=(-1.0,))
    assert "UCIConfig(" not in str(info.value)
    with pytest.raises(ValueError, match=r"^k_test must be ≥ 1, got 0$"):
        UCIConfig(k_test=0)


# 5. evaluate --write-card


def _model_copy(tmp_path: Path) -> Path:
    copy = tmp_path / "bayesgate-cnn"
    shutil.copytree(BUNDLED_MODELS_DIR / "bayesgate-cnn", copy)
    return copy


def test_write_card_with_limit_is_refused(no_evaluation: None, tmp_path: Path) -> None:
    copy = _model_copy(tmp_path)
    before = (copy / "card.json").read_bytes()
    line = _refused(["evaluate", str(copy), "--write-card", "--k", "2", "--limit", "3"])
    assert line.startswith("--write-card with --limit 3: a card's metrics are those of the whole")
    assert (copy / "card.json").read_bytes() == before


def test_write_card_into_a_bundled_model_by_path_is_refused(
    no_evaluation: None, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    # the package's own folder: refused before anything is read (nothing is written)
    bundled_cnn = BUNDLED_MODELS_DIR / "bayesgate-cnn"
    before = (bundled_cnn / "card.json").read_bytes()
    line = _refused(["evaluate", str(bundled_cnn), "--write-card", "--k", "2"])
    assert line.startswith(f"--write-card: {bundled_cnn} is a bundled model")
    assert (bundled_cnn / "card.json").read_bytes() == before
    # any spelling of a path under the pretrained folder (here a stand-in for it)
    pretrained = tmp_path / "pkg" / "pretrained"
    (pretrained / "m").mkdir(parents=True)
    monkeypatch.setattr(bundled, "BUNDLED_MODELS_DIR", pretrained)
    monkeypatch.chdir(tmp_path)
    for spelling in ("pkg/pretrained/m", "pkg/../pkg/pretrained/m", str(pretrained / "m")):
        line = _refused(["evaluate", spelling, "--write-card"])
        assert line.startswith(f"--write-card: {spelling} is a bundled model"), line


def test_write_card_into_a_copy_is_allowed(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    copy = _model_copy(tmp_path)

    class Reached(Exception):
        pass

    def reached(*args: object, **kwargs: object) -> None:
        raise Reached

    monkeypatch.setattr("bayesgate.models.cli.load_model", reached)
    with pytest.raises(Reached):
        main(["evaluate", str(copy), "--write-card", "--k", "2", "--device", "cpu"])


# 6. an unknown model name lists the bundled ones


def test_evaluate_an_unknown_name_lists_the_bundled_models(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """The message comes from the model store (``read_card``), as for every command that
    reads a model; nothing is evaluated (the card is the first file read)."""
    monkeypatch.setattr("bayesgate.models.data.mnist.load_mnist", _never("load_mnist"))
    monkeypatch.chdir(tmp_path)
    line = _refused(["evaluate", "bayesgate-nope"])
    assert "bayesgate-nope is neither a model directory here nor a bundled" in line, line
    for name in bundled.bundled_model_names():
        assert name in line
    assert bundled.DEFAULT_ALIAS in line
