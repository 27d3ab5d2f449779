"""A command whose work needs the ``attacks`` extra (cleverhans, matplotlib) says so in one line
(exit code 2) before any work when the extra is not installed, and checks only what that run
needs (``calibrate --no-report`` and attacks of our own need no extra)."""

from __future__ import annotations

import argparse
import importlib.util

import pytest

from bayesgate import cli, extras
from bayesgate.attacks import cli as attacks_cli
from bayesgate.attacks import detector_cli, evaluate_cli, robust_cli

HINT = "pip install 'bayesgate[attacks]'"
COMMANDS = {  # module and attribute of each command's function
    "attack": (attacks_cli, "cmd_attack"),
    "calibrate": (attacks_cli, "cmd_calibrate"),
    "sweep": (attacks_cli, "cmd_sweep"),
    "fit-detector": (detector_cli, "cmd_fit_detector"),
    "detect-eval": (evaluate_cli, "cmd_detect_eval"),
    "adaptive-eval": (evaluate_cli, "cmd_adaptive_eval"),
    "evaluate-robust": (robust_cli, "cmd_evaluate_robust"),
}


@pytest.fixture
def no_extras(monkeypatch: pytest.MonkeyPatch) -> list[str]:
    """cleverhans and matplotlib look uninstalled; every command records that it ran."""
    real = importlib.util.find_spec

    def find_spec(name: str, *args: object):
        return None if name.split(".")[0] in ("cleverhans", "matplotlib") else real(name, *args)

    monkeypatch.setattr(extras, "find_spec", find_spec)
    ran: list[str] = []
    for command, (module, attr) in COMMANDS.items():

        def run(args: argparse.Namespace, command: str = command) -> int:
            ran.append(command)
            return 0

        monkeypatch.setattr(module, attr, run)
    return ran


CH, MPL = "cleverhans", "matplotlib"


@pytest.mark.parametrize(
    ("argv", "message", "module"),
    [
        (["attack", "M", "--out", "x.npz", "--limit", "5"], "attack: attack fgs", CH),
        (["attack", "M", "--spec", "cw:iterations=5", "--out", "x.npz"], "attack: attack cw", CH),
        (["calibrate", "M", "--attacks", "apgd"], "calibrate: the report (its plots;", MPL),
        (["calibrate", "M", "--no-report"], "calibrate: attack fgs", CH),
        (["fit-detector", "M"], "fit-detector: attack fgs", CH),
        (["sweep", "M", "--figure", "6"], "sweep: attack fgs", CH),
        (["sweep", "M", "--figure", "detection", "--attacks", "apgd"], "sweep: --figure det", MPL),
        (["detect-eval", "M", "--out", "d", "--attacks", "apgd"], "detect-eval: the ROC plot", MPL),
        (["evaluate-robust", "M", "--out", "d"], "evaluate-robust: the plot", MPL),
    ],
)
def test_a_missing_extra_is_one_line_before_any_work(
    no_extras: list[str],
    capsys: pytest.CaptureFixture[str],
    argv: list[str],
    message: str,
    module: str,
) -> None:
    assert cli.main(argv) == 2
    err = capsys.readouterr().err
    assert err.startswith(f"bayesgate: error: {message}") and err.count("\n") == 1
    assert err.endswith(f" needs the attacks extra ({module} is not installed): {HINT}\n")
    assert no_extras == []  # the command itself never started


@pytest.mark.parametrize(
    "argv",
    [
        ["attack", "M", "--attack", "apgd", "--out", "x.npz"],
        ["calibrate", "M", "--no-report", "--attacks", "apgd", "square"],
        ["fit-detector", "M", "--attacks", "pgd-restarts"],
        ["adaptive-eval", "M", "--out", "d"],  # its attacks are our own, its outputs text
    ],
)
def test_runs_that_need_no_extra_are_not_refused(
    no_extras: list[str], capsys: pytest.CaptureFixture[str], argv: list[str]
) -> None:
    assert cli.main(argv) == 0 and no_extras == [argv[0]]
    assert capsys.readouterr().err == ""


def test_a_dotted_module_with_a_missing_parent_is_missing() -> None:
    assert extras.module_available("json.decoder")
    assert not extras.module_available("no_such_package_bayesgate.sub")
    assert extras.missing_message("serve: --grpc-port", "tritonclient.grpc") == (
        "serve: --grpc-port needs the grpc extra (tritonclient is not installed): "
        "pip install 'bayesgate[grpc]'"
    )
