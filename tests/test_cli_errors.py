"""``bayesgate``'s error handling: only our typed user errors become a one-line message with exit
code 2; any other exception (a bug, in our code or deep in torch/numpy) keeps its traceback;
``--debug`` shows the traceback of user errors too."""

from __future__ import annotations

import argparse
import subprocess
import sys
from pathlib import Path

import pytest

from bayesgate import cli
from bayesgate.errors import DataError, InvalidArgument, ModelStoreError, UserError
from bayesgate.models import cli as models_cli


def _fail_with(exc: BaseException):
    def command(args: argparse.Namespace) -> int:
        raise exc

    return command


@pytest.mark.parametrize(
    "exc",
    [
        ValueError("operands could not be broadcast together"),
        FileNotFoundError(2, "No such file or directory", "/usr/lib/libcuda.so"),
        RuntimeError("mat1 and mat2 shapes cannot be multiplied"),
    ],
)
def test_other_errors_keep_their_traceback(
    monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture, exc: BaseException
) -> None:
    monkeypatch.setattr(models_cli, "cmd_evaluate", _fail_with(exc))
    with pytest.raises(type(exc)) as info:
        cli.main(["evaluate", "some-model"])
    assert info.value is exc  # not swallowed into "bayesgate: error: …" and exit code 2
    assert "bayesgate: error" not in capsys.readouterr().err


@pytest.mark.parametrize(
    "exc",
    [
        UserError("a problem with the input"),
        InvalidArgument("--k must be ≥ 1, got 0"),
        DataError("/data/mnist: missing t10k-images-idx3-ubyte.gz"),
        ModelStoreError("/m/card.json: model card not found"),
    ],
)
def test_user_errors_are_one_line_with_exit_code_2(
    monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture, exc: UserError
) -> None:
    monkeypatch.setattr(models_cli, "cmd_evaluate", _fail_with(exc))
    assert cli.main(["evaluate", "some-model"]) == 2
    err = capsys.readouterr().err
    assert err == f"bayesgate: error: {exc}\n"


def test_debug_raises_user_errors(monkeypatch: pytest.MonkeyPatch) -> None:
    exc = InvalidArgument("--k must be ≥ 1, got 0")
    monkeypatch.setattr(models_cli, "cmd_evaluate", _fail_with(exc))
    with pytest.raises(InvalidArgument) as info:
        cli.main(["--debug", "evaluate", "some-model"])
    assert info.value is exc


def test_invalid_argument_is_still_a_value_error() -> None:
    # library callers that check arguments with ``except ValueError`` keep working
    assert issubclass(InvalidArgument, ValueError) and issubclass(InvalidArgument, UserError)
    assert not issubclass(UserError, ValueError)


def test_debug_prints_the_traceback_of_a_real_user_error(tmp_path: Path) -> None:
    missing = tmp_path / "no-model"
    command = [sys.executable, "-m", "bayesgate.cli"]
    plain = subprocess.run(
        [*command, "evaluate", str(missing)], capture_output=True, text=True, timeout=300
    )
    assert plain.returncode == 2
    assert plain.stderr.strip().splitlines() == [
        f"bayesgate: error: {missing / 'card.json'}: model card not found "
        f"(is {missing} a model directory?)"
    ]
    debug = subprocess.run(
        [*command, "--debug", "evaluate", str(missing)], capture_output=True, text=True, timeout=300
    )
    assert debug.returncode == 1
    assert "Traceback (most recent call last)" in debug.stderr
    assert "bayesgate.errors.ModelStoreError" in debug.stderr


@pytest.mark.parametrize(
    ("argv", "prog", "says"),
    [
        (
            ["train", "--epochs", "x"],
            "bayesgate train",
            "argument --epochs: invalid int value: 'x'",
        ),
        (["adaptive-eval"], "bayesgate adaptive-eval", "required: model, --out"),
        (["serve", "--port"], "bayesgate serve", "argument --port: expected one argument"),
        (
            ["evaluate", "m", "--no-such-flag"],
            "bayesgate evaluate",
            "unrecognized arguments: --no-such-flag",
        ),
        (["train", "--bogus", "x"], "bayesgate train", "unrecognized arguments: --bogus x"),
        (["--bogus"], "bayesgate", "unrecognized arguments: --bogus"),
        (["nosuch"], "bayesgate", "invalid choice: 'nosuch'"),
    ],
)
def test_argparse_errors_are_one_line_with_exit_code_2(
    capsys: pytest.CaptureFixture, argv: list[str], prog: str, says: str
) -> None:
    """argparse's own errors too: no usage block before the line, which names the --help."""
    with pytest.raises(SystemExit) as info:
        cli.main(argv)
    assert info.value.code == 2
    captured = capsys.readouterr()
    assert captured.out == ""
    lines = captured.err.splitlines()
    assert len(lines) == 1, captured.err
    assert lines[0].startswith(f"{prog}: error: ") and says in lines[0], lines[0]
    assert lines[0].endswith(f"(see: {prog} --help)")


def test_help_is_still_the_whole_usage(capsys: pytest.CaptureFixture) -> None:
    with pytest.raises(SystemExit) as info:
        cli.main(["train", "--help"])
    assert info.value.code == 0
    assert capsys.readouterr().out.startswith("usage: bayesgate train [-h]")


@pytest.mark.parametrize(
    ("command", "hint"),
    [
        (["evaluate", "m"], None),
        (["train"], "run the same command with --resume to continue from the last one"),
        (["uci", "--dataset", "yacht"], "run the same command with --resume to go on"),
        (["detect-eval", "m", "--out", "o"], "cached: run the same command again to go on"),
        (["adaptive-eval", "m", "--out", "o"], "cached: run the same command again to go on"),
    ],
)
def test_an_interrupt_says_how_to_go_on_where_a_command_can(
    monkeypatch: pytest.MonkeyPatch,
    capsys: pytest.CaptureFixture,
    command: list[str],
    hint: str | None,
) -> None:
    """Ctrl-C exits 130 with one line; the commands that keep their finished work (train's
    checkpoint, uci's finished splits) say how to continue from it."""
    from bayesgate.attacks import evaluate_cli
    from bayesgate.models.uci import cli as uci_cli

    interrupted = _fail_with(KeyboardInterrupt())
    for module, name in ((models_cli, "cmd_evaluate"), (models_cli, "cmd_train"),
                         (uci_cli, "cmd_uci"), (evaluate_cli, "cmd_detect_eval"),
                         (evaluate_cli, "cmd_adaptive_eval")):  # fmt: skip
        monkeypatch.setattr(module, name, interrupted)
    monkeypatch.setattr(evaluate_cli, "_detect_eval_needs", lambda args: [])
    assert cli.main(command) == 130
    err = capsys.readouterr().err.strip().splitlines()
    assert len(err) == 1 and err[0].startswith("bayesgate: interrupted")
    assert (hint is None) == (err[0] == "bayesgate: interrupted")
    assert hint is None or hint in err[0]


def test_version_names_the_installed_distribution(capsys: pytest.CaptureFixture) -> None:
    from importlib.metadata import version

    with pytest.raises(SystemExit) as exit_:
        cli.main(["--version"])
    assert exit_.value.code == 0
    assert capsys.readouterr().out.strip() == f"bayesgate {version('bayesgate')}"
