"""What the tests of the commands' argument checks share: the one error line a refused command
prints, and a stand-in for the work that must not start before the checks."""

from __future__ import annotations

from typing import Any

import pytest


def never(*args: Any, **kwargs: Any) -> Any:
    """Patched over the first step of a command's work: reaching it fails the test."""
    raise AssertionError("the work started before the arguments were checked")


def one_error_line(capsys: pytest.CaptureFixture[str]) -> str:
    """The one line printed on stderr (and nothing else), without its ``bayesgate: error:``."""
    err = capsys.readouterr().err
    assert err.count("\n") == 1 and err.startswith("bayesgate: error: "), err
    return err.strip().removeprefix("bayesgate: error: ")
