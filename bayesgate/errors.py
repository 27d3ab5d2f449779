"""The errors a user can fix: the ``bayesgate`` command prints them as one line (exit code 2).

Everything else — a bug in our code, in torch or in numpy — keeps its traceback. Raise a
:class:`UserError` (or a subclass) only where the message names the input to change: a flag, a
value, a path, a file. ``bayesgate --debug`` shows the traceback of user errors too.
"""

from __future__ import annotations


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
