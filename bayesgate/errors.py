"""The errors a user can fix: the ``bayesgate`` command prints them as one line (exit code 2).

Everything else — a bug in our code, in torch or in numpy — keeps its traceback. Raise a
:class:`UserError` (or a subclass) only where the message names the input to change: a flag, a
value, a path, a file. ``bayesgate --debug`` shows the traceback of user errors too.
"""

from __future__ import annotations

import tempfile
from pathlib import Path


class UserError(Exception):
    """A problem with the user's input, explained by the message alone."""


class InvalidArgument(UserError, ValueError):
    """A flag, parameter or value outside what is accepted (also a ``ValueError``, so callers
    that check arguments with ``except ValueError`` keep working)."""


class DataError(UserError):
    """A data file is missing, malformed or could not be downloaded (one-line message)."""


class ModelStoreError(UserError):
    """A model directory is missing, incomplete, tampered with or inconsistent."""


class DeviceUnavailable(UserError, RuntimeError):
    """The device asked for (e.g. ``cuda``) is not present on this host."""


def check_at_least(flag: str, value: int | None, minimum: int = 1) -> None:
    """:class:`InvalidArgument` naming ``flag`` when ``value`` (``None``: not given) is below
    ``minimum`` — counts, sizes and limits (``minimum=1``), seeds (``minimum=0``)."""
    if value is not None and value < minimum:
        raise InvalidArgument(f"{flag} must be ≥ {minimum}, got {value}")


def writable_file(path: Path, flag: str, suffix: str | None = None) -> None:
    """:class:`InvalidArgument` naming ``flag`` unless ``path`` can be written as a file — call it
    before the work, so that a typo does not lose a long run at its end. Creates the missing
    folders (as the commands' outputs do); refuses a path that is a folder, and a ``suffix``
    (e.g. ``.npz``) other than the one asked for."""
    if suffix is not None and path.suffix != suffix:
        raise InvalidArgument(f"{flag} {path}: must end in {suffix}")
    if path.is_dir():
        raise InvalidArgument(f"{flag} {path}: is a folder, not a file")
    try:
        path.parent.mkdir(parents=True, exist_ok=True)
    except OSError as exc:
        raise InvalidArgument(
            f"{flag} {path}: cannot create {path.parent} ({exc.strerror or exc})"
        ) from None
    _check_can_create_in(path.parent, path, flag)


def writable_dir(path: Path, flag: str) -> None:
    """:class:`InvalidArgument` naming ``flag`` unless ``path`` is, or can be created as, a
    writable folder. Creates nothing (a command may refuse an existing ``--out``): the nearest
    existing ancestor must be a writable folder, and ``path`` itself, when it exists, a folder."""
    if path.exists() and not path.is_dir():
        raise InvalidArgument(f"{flag} {path}: is a file, not a folder")
    ancestor = path
    while not ancestor.exists():
        ancestor = ancestor.parent
    if not ancestor.is_dir():
        raise InvalidArgument(f"{flag} {path}: {ancestor} is a file, not a folder")
    _check_can_create_in(ancestor, path, flag)


def _check_can_create_in(folder: Path, path: Path, flag: str) -> None:
    """Create (and remove) a file in ``folder``: ``os.access`` says yes to root even where
    nothing can be created (``/proc``, a read-only mount)."""
    try:
        with tempfile.NamedTemporaryFile(dir=folder, prefix=".bayesgate-write-check-"):
            pass
    except OSError as exc:
        raise InvalidArgument(
            f"{flag} {path}: cannot write in {folder} ({exc.strerror or exc})"
        ) from None
