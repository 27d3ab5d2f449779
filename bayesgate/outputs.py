"""What a command says about the files it is about to replace.

``train`` refuses an ``--out`` that holds a model (its calibration would no longer match); the
other commands replace their own result files in ``--out`` — no error: running a command again is
how ``detect-eval``, ``adaptive-eval`` and ``evaluate-robust`` resume from their caches of
adversarial examples — and say so on stderr, one line before the work, so that a result the user
meant to keep can still be saved (Ctrl-C).
"""

from __future__ import annotations

import sys
from collections.abc import Iterable
from pathlib import Path


def note_replacing(command: str, paths: Iterable[Path]) -> list[Path]:
    """Print ``COMMAND: replacing the existing a.json, a.md in DIR`` on stderr when some of
    ``paths`` (the files the command writes, all in one folder) exist; returns those."""
    found = [Path(p) for p in paths if Path(p).is_file()]
    if found:
        names = ", ".join(p.name for p in found)
        print(f"{command}: replacing the existing {names} in {found[0].parent}", file=sys.stderr)
    return found
