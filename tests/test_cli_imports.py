"""``bayesgate``'s command table: a broken import of our own code fails loudly; only a missing
optional dependency turns a subcommand into an 'unavailable' note."""

from __future__ import annotations

import importlib

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


def test_missing_optional_dependency_leaves_a_note(monkeypatch: pytest.MonkeyPatch) -> None:
    real = importlib.import_module

    def fake(name: str, *args: object) -> object:
        if name == "bayesgate.service.cli":
            raise ModuleNotFoundError("No module named 'fastapi'", name="fastapi")
        return real(name, *args)

    monkeypatch.setattr(cli.importlib, "import_module", fake)
    parser = cli.build_parser()
    (commands,) = [a for a in parser._actions if a.dest == "command"]
    notes = {c.dest: c.help for c in commands._choices_actions}
    assert "train" in notes and "calibrate" in notes  # the other packages still register
    assert notes["service"] == "unavailable: missing dependency 'fastapi'"
