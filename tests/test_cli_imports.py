"""``bayesgate``'s command table: a broken import of our own code fails loudly; only a missing
optional dependency turns a subcommand into an 'unavailable' note."""

from __future__ import annotations

import argparse
import importlib
import subprocess
import sys

import pytest

from bayesgate import cli


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


def test_the_stores_lazy_names_all_resolve() -> None:
    import bayesgate.models.store as store

    for name in store.__all__:
        assert getattr(store, name).__name__ == name
        assert name in dir(store)
    with pytest.raises(AttributeError, match="has no attribute 'Nope'"):
        store.Nope  # noqa: B018
    assert sorted(store.__all__) == sorted(store._SOURCES)
