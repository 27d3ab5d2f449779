"""``bayesgate``'s command table: a broken import of our own code fails loudly; only a missing
optional dependency turns a subcommand into an 'unavailable' note. Every command's ``--help``,
and the flags and settings its command refuses before the work, answer without importing torch
(~3 s): the parsers' choices, defaults and the settings' checks come from torch-free modules."""

from __future__ import annotations

import argparse
import importlib
import json
import subprocess
import sys

import pytest

from bayesgate import cli
from bayesgate.tables import keyed_by


def test_broken_own_import_is_not_hidden(monkeypatch: pytest.MonkeyPatch) -> None:
    real = importlib.import_module

    def fake(name: str, *args: object) -> object:
        if name == "bayesgate.models.cli":
            raise ModuleNotFoundError(
                "No module named 'bayesgate.models.trian'", name="bayesgate.models.trian"
            )
        return real(name, *args)

    monkeypatch.setattr(cli.importlib, "import_module", fake)
    with pytest.raises(ModuleNotFoundError, match="trian"):
        cli.build_parser()


def test_missing_optional_dependency_leaves_a_note(
    monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    real = importlib.import_module

    def fake(name: str, *args: object) -> object:
        if name == "bayesgate.service.cli":
            raise ModuleNotFoundError("No module named 'fastapi'", name="fastapi")
        return real(name, *args)

    monkeypatch.setattr(cli.importlib, "import_module", fake)
    for parser in (cli.build_parser(), cli.build_parser("serve")):
        (commands,) = [a for a in parser._actions if a.dest == "command"]
        notes = {c.dest: c.help for c in commands._choices_actions}
        assert "train" in notes and "calibrate" in notes  # the other packages still register
        assert (
            notes["serve"] == notes["build-native"] == "unavailable: missing dependency 'fastapi'"
        )
        assert notes["predict"] == cli.COMMANDS["predict"][1]  # its own module imports
    assert cli.main(["serve", "--port", "1"]) == 2
    assert capsys.readouterr().err == (
        "bayesgate: error: serve: unavailable: missing dependency 'fastapi'\n"
    )


def test_the_command_table_is_what_the_modules_register() -> None:
    """:data:`cli.COMMANDS` (what ``bayesgate --help`` lists without importing the modules) names
    each command, in order, with its module and help line exactly as the modules register them."""
    registered = []
    for name in cli.COMMAND_MODULES:
        parser = argparse.ArgumentParser()
        sub = parser.add_subparsers()
        importlib.import_module(name).register(sub)
        registered += [(c.dest, name, c.help) for c in sub._choices_actions]
    assert registered == [(c, m, h) for c, (m, h) in cli.COMMANDS.items()]
    full, lazy = cli.build_parser(), cli.build_parser("")
    assert full.format_help() == lazy.format_help()


def test_a_command_imports_only_its_own_module() -> None:
    """``bayesgate --help``, an unknown command and ``serve``'s setting checks run without torch
    (a fresh interpreter: torch takes ~3 s to import here), and import no other command module."""
    code = (
        "import sys, contextlib, io\n"
        "from bayesgate.cli import main\n"
        "out = io.StringIO()\n"
        "argvs = (['--help'], ['nosuch'], ['serve', '--port', '1', '--native-port', '1'])\n"
        "with contextlib.redirect_stdout(out), contextlib.redirect_stderr(out):\n"
        "    for argv in argvs:\n"
        "        try:\n"
        "            code = main(argv)\n"
        "        except SystemExit as exc:\n"
        "            code = exc.code\n"
        "        print(argv[0], code, file=sys.__stdout__)\n"
        "clis = sorted(m for m in sys.modules if m.startswith('bayesgate') and m.endswith('cli'))\n"
        "print('torch' in sys.modules, clis)\n"
    )
    done = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=120)
    assert done.returncode == 0, done.stderr
    assert done.stdout.splitlines() == [
        "--help 0",
        "nosuch 2",
        "serve 2",
        "False ['bayesgate.cli', 'bayesgate.service.cli']",
    ]


@pytest.mark.parametrize(
    "package",
    [
        "bayesgate.models.store",
        "bayesgate.models.data",
        "bayesgate.models.mc",
        "bayesgate.models.networks",
        "bayesgate.attacks.methods",
    ],
)
def test_a_lazy_packages_names_all_resolve(package: str) -> None:
    lazy = importlib.import_module(package)
    for name in lazy.__all__:
        value = getattr(lazy, name)
        source = importlib.import_module(f"{package}.{lazy._SOURCES[name]}")
        assert value is getattr(source, name)
        assert name in dir(lazy)
    with pytest.raises(AttributeError, match="has no attribute 'Nope'"):
        lazy.Nope  # noqa: B018
    assert sorted(lazy.__all__) == sorted(lazy._SOURCES)


def _run_without_torch(argv: list[str]) -> tuple[int, str, bool]:
    """``bayesgate ARGV`` in a fresh interpreter: its exit code, its stderr and whether torch
    was imported."""
    code = (
        "import sys, contextlib, io, json\n"
        "from bayesgate.cli import main\n"
        "err = io.StringIO()\n"
        "with contextlib.redirect_stdout(io.StringIO()), contextlib.redirect_stderr(err):\n"
        "    try:\n"
        f"        code = main({argv!r})\n"
        "    except SystemExit as exc:\n"
        "        code = exc.code\n"
        "print(json.dumps([code, err.getvalue(), 'torch' in sys.modules]))\n"
    )
    done = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=120)
    assert done.returncode == 0, done.stderr
    exit_code, err, torch_imported = json.loads(done.stdout)
    return exit_code, err, torch_imported


@pytest.mark.parametrize("command", list(cli.COMMANDS))
def test_every_commands_help_leaves_torch_unimported(command: str) -> None:
    """``bayesgate COMMAND --help`` builds the command's parsers without torch: fails when a CLI
    module (or a package ``__init__`` on its way) imports torch at module level again."""
    exit_code, err, torch_imported = _run_without_torch([command, "--help"])
    assert exit_code == 0, err
    assert not torch_imported


@pytest.mark.parametrize(
    ("argv", "error"),
    [
        (["train", "--epochs", "ten"], "argument --epochs: invalid int value: 'ten'"),
        (["train", "--preset", "nope"], "argument --preset: invalid choice: 'nope'"),
        (["evaluate", "m", "--k", "0"], "--k must be ≥ 1, got 0"),
        (["fetch-data", "--timeout", "0"], "--timeout must be > 0 seconds, got 0"),
        (["attack", "m", "--out", "a.npz", "--eps", "2", "--attack", "pgd"], "pgd eps must be"),
        (["attack", "m", "--out", "a.npz", "--spec", "nope"], "unknown attack 'nope'"),
        (["attack", "m", "--out", "a.npz", "--steps", "3"], "attack 'fgs' has no parameter"),
        (["calibrate", "m", "--val-limit", "0"], "--val-limit must be ≥ 1, got 0"),
        (["fit-detector", "m", "--k", "0"], "--k must be ≥ 1, got 0"),
        (["sweep", "m", "--figure", "6", "--k", "0"], "--k must be ≥ 1, got 0"),
        (["detect-eval", "m", "--out", "o", "--limit", "0"], "--limit must be ≥ 1, got 0"),
        (["adaptive-eval", "m", "--out", "o", "--k", "0"], "--k must be ≥ 1, got 0"),
        (["predict", "m", "x.png", "--seed", "-1"], "--seed must be ≥ 0, got -1"),
        # the settings' own checks, made before anything is loaded (torch-free settings modules)
        (["train", "--epochs", "-1"], "epochs must be ≥ 1, got -1"),
        (["train", "--preset", "bbb-lenet5", "--p", "0.3"], "has no dropout"),
        (["train", "--sampling", "local"], "--sampling applies to the bbb-* presets only"),
        (["train", "--beta-schedule", "x", "--preset", "bbb-lenet5"], "beta schedule must be"),
        (["train", "--adversarial", "pgd", "--eps", "2"], "eps must be in (0, 1], got 2.0"),
        (["uci", "--dataset", "x", "--alpha", "0.5", "0.5"], "--alpha values must be distinct"),
        (["fit-detector", "m", "--outliers", "nope"], "unknown outlier kind(s) nope"),
        (["fit-detector", "m", "--attack-images", "6000"], "attack-images must be ≤ fit-images"),
        (["detect-eval", "m", "--out", "o", "--attack-limit", "x=3"], "no attack 'x' in this run"),
        (["detect-eval", "m", "--out", "o", "--attacks", "fgs", "fgs"], "listed twice"),
        (["adaptive-eval", "m", "--out", "o", "--eps", "2"], "--eps must be in (0, 1], got 2.0"),
        (["adaptive-eval", "m", "--out", "o", "--restarts", "2"], "needs the apgd optimizer"),
        (["evaluate-robust", "m", "--out", "o", "--attacks", "x"], "unknown attacks ['x']"),
        (["predict", "m", "x.png", "--seed", str(2**63)], f"--seed must be ≤ {2**63 - 1}, got"),
        (["sweep", "m", "--figure", "detection", "--k", "0"], "--k must be ≥ 1, got 0"),
        # attack specs, parsed without torch before the model loads
        (["calibrate", "m", "--attacks", "pgd:eps=5"], "pgd eps must be in (0, 1], got 5.0"),
        (["fit-detector", "m", "--attacks", "fgs", "fgs"], "attack(s) listed twice: fgs"),
        (["sweep", "m", "--figure", "detection", "--attacks", "nope"], "unknown attack 'nope'"),
        # where a command writes, checked before torch loads too (/proc: nothing can be created)
        (["calibrate", "/proc/m"], "MODEL /proc/m: cannot write in /proc"),
        (["fit-detector", "/proc/m"], "MODEL /proc/m: cannot write in /proc"),
        (["train", "--name", "a/b"], "--name: 'a/b' contains '/'"),
        (["train", "--out", "/proc/bayesgate-x"], "--out /proc/bayesgate-x: cannot write in"),
        (["train", "--checkpoint-dir", "/proc/x"], "--checkpoint-dir /proc/x: cannot write in"),
        (["train", "--epoch-log", "/proc/x.csv"], "--epoch-log /proc/x.csv: cannot"),
        (["attack", "m", "--out", "/proc/x.npz", "--threads", "1"], "--out /proc/x.npz: cannot"),
        (["sweep", "m", "--figure", "6", "--out", "/proc/x"], "--out /proc/x: cannot write in"),
    ],
)
def test_refused_flags_answer_without_torch(argv: list[str], error: str) -> None:
    """A flag or setting the command line refuses before any work (argparse's own checks, the
    commands' checks and their settings' that precede loading anything) costs no torch import."""
    exit_code, err, torch_imported = _run_without_torch(argv)
    assert exit_code == 2 and error in err, err
    assert not torch_imported


def test_a_table_of_implementations_names_exactly_its_declared_names() -> None:
    """The torch tables keyed by torch-free names (scores, OOD sets, outliers, APGD's losses) are
    checked on import: one missing, extra or out of order is an error."""
    table = {"a": 1, "b": 2}
    assert keyed_by(("a", "b"), table, "things") is table
    for names in (("a",), ("a", "b", "c"), ("b", "a")):
        with pytest.raises(TypeError, match=r"the things implemented \(a, b\) are not those"):
            keyed_by(names, table, "things")
