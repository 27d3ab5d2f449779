"""What a command says about the files it is about to replace.

``train`` refuses an ``--out`` that holds a model (its calibration would no longer match); the
other commands replace their own result files in ``--out`` — no error: running a command again is
how ``detect-eval``, ``adaptive-eval`` and ``evaluate-robust`` resume from their caches of
adversarial examples — and say so on stderr, one line before the work, so that a result the user
meant to keep can still be saved (Ctrl-C).

:func:`write_atomically` is how the project replaces a file that something else may read while
it is written — caches of adversarial examples, checkpoints, model stores, the service's shared
admin state, the native library, ``predict``'s answers, the commands' reports and tables
(:func:`write_text_atomically`): written beside the target and renamed, so a reader — or the next
``sweep --append`` — sees the old file or the new one, never half of one.
"""

from __future__ import annotations

import errno
import os
import sys
import tempfile
from collections.abc import Callable, Iterable
from pathlib import Path
from typing import IO, Any, Literal, overload


def note_replacing(command: str, paths: Iterable[Path]) -> list[Path]:
    """Print ``COMMAND: replacing the existing a.json, a.md in DIR`` on stderr when some of
    ``paths`` (the files the command writes, all in one folder) exist; returns those."""
    found = [Path(p) for p in paths if Path(p).is_file()]
    if found:
        names = ", ".join(p.name for p in found)
        print(f"{command}: replacing the existing {names} in {found[0].parent}", file=sys.stderr)
    return found


@overload
def write_atomically(
    path: Path,
    write: Callable[[IO[str]], None],
    *,
    binary: Literal[False] = False,
    fsync: bool = False,
) -> None: ...


@overload
def write_atomically(
    path: Path, write: Callable[[IO[bytes]], None], *, binary: Literal[True], fsync: bool = False
) -> None: ...


def write_atomically(
    path: Path, write: Callable[[IO[Any]], None], *, binary: bool = False, fsync: bool = False
) -> None:
    """``write(stream)`` into a temporary file beside ``path``, renamed to ``path`` once it
    returns: a reader never sees a half-written file, and a failure or Ctrl-C leaves ``path`` as
    it was and no temporary behind. The file gets the usual permissions (``0o666`` less the
    umask), not ``mkstemp``'s ``0o600`` — set before the data is written, so ``fsync`` covers it
    too; where the file system keeps no modes (``EPERM``/``ENOTSUP``: vfat, some network
    mounts), the file is written as it allows.

    ``stream`` is UTF-8 text (newlines written as given), or bytes with ``binary=True``. With
    ``fsync=True`` the data is on disk before the rename and the rename is on disk when this
    returns (the folder is fsync'ed too): after a crash ``path`` holds the old or the new
    content, whole."""
    fd, tmp = tempfile.mkstemp(prefix=f".{path.name}.", dir=path.parent)
    try:
        try:
            os.fchmod(fd, 0o666 & ~_umask())
        except OSError as exc:
            if exc.errno not in (errno.EPERM, errno.ENOTSUP, errno.EOPNOTSUPP):
                raise
        if binary:
            stream: IO[Any] = os.fdopen(fd, "wb")
        else:
            stream = os.fdopen(fd, "w", newline="", encoding="utf-8")
        with stream:
            write(stream)
            if fsync:
                stream.flush()
                os.fsync(stream.fileno())
        os.replace(tmp, path)
    except BaseException:
        Path(tmp).unlink(missing_ok=True)
        raise
    if fsync:
        folder = os.open(path.parent, os.O_RDONLY)
        try:
            os.fsync(folder)
        finally:
            os.close(folder)


def write_text_atomically(path: Path, text: str) -> None:
    """``path.write_text(text)`` (UTF-8), through :func:`write_atomically`."""
    write_atomically(path, lambda stream: stream.write(text))


def _umask() -> int:
    """The process's umask: read from ``/proc`` where Linux shows it (setting it to read it back
    would change it for every thread for a moment), else by that set-and-restore."""
    try:
        with open("/proc/self/status") as status:
            for line in status:
                if line.startswith("Umask:"):
                    return int(line.split()[1], 8)
    except (OSError, ValueError, IndexError):
        pass
    mask = os.umask(0o022)
    os.umask(mask)
    return mask
