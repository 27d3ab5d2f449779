"""Which model names can be served — torch-free, so that ``bayesgate train --name`` is checked
before torch loads (:func:`served_name_problem`; the store's checks and ``serve`` use the same)."""

from __future__ import annotations

MAX_NAME_LENGTH = 256  # the name is in every response, log line and metric label


def served_name_problem(name: str) -> str | None:
    """Why a card's ``name`` cannot be served, ``None`` when it can: clients reach the model at
    ``/v1/models/{name}`` and ``/v2/models/{name}/…``, one path segment, so the name must be
    non-empty, without ``/``, not ``.`` or ``..`` (clients resolve those away), without
    surrounding whitespace and without control characters (it is also in log lines and metric
    labels), at most :data:`MAX_NAME_LENGTH` characters."""
    shown = repr(name) if len(name) <= 60 else repr(name[:59]) + "…"  # repr escapes controls
    if not name.strip():
        return "empty; /v2/models/{name} needs a name"
    if len(name) > MAX_NAME_LENGTH:
        return f"{shown} has {len(name)} characters, more than {MAX_NAME_LENGTH}"
    if "/" in name:
        return f"{shown} contains '/', so /v2/models/{{name}} cannot reach it"
    if name in (".", ".."):
        return f"{shown} is a relative path segment, so /v2/models/{{name}} cannot reach it"
    if name != name.strip():
        return f"{shown} has leading or trailing whitespace"
    if not name.isprintable():
        return f"{shown} contains control or other non-printable characters"
    return None
