"""Structured logs: one JSON object per line, tagged with the id of the request being served.

Every record of the ``bayesgate`` and ``uvicorn`` loggers becomes (``format = "json"``)::

    {"ts": "2026-11-22T10:04:05.123Z", "level": "info", "logger": "bayesgate.access",
     "message": "POST /v1/predict 200", "request_id": "3f1c…", "pid": 4242, ...extra fields}

``request_id`` comes from :data:`REQUEST_ID`, a context variable the request middleware sets for
the duration of each request (the client's ``X-Request-ID`` when it is acceptable, else a fresh
one); a record logged outside a request has none. Extra fields given with
``log.info(..., extra={"fields": {...}})`` are merged into the object. An exception is one string
field ``exception`` (so a traceback never breaks the one-line-per-record rule).
"""

from __future__ import annotations

import contextvars
import datetime as dt
import itertools
import json
import logging
import os
import re
from typing import Any

REQUEST_ID: contextvars.ContextVar[str | None] = contextvars.ContextVar(
    "bayesgate_request_id", default=None
)

# Accepted client request ids: short, printable, no spaces or quotes (they are echoed in a header
# and written to the logs).
_REQUEST_ID_RE = re.compile(r"^[A-Za-z0-9._:/+=@-]{1,128}$")
# A new id is 32 hex digits: 16 random per process, then a counter (uuid4 per request cost ~4 %
# of the event loop's CPU under load; ids need to be unique, not unpredictable).
_ID_PREFIX = os.urandom(8).hex()
_ID_COUNTER = itertools.count(int.from_bytes(os.urandom(4), "big"))
_ID_MASK = (1 << 64) - 1

LOGGERS = ("bayesgate", "uvicorn", "uvicorn.error")
_HANDLER_FLAG = "bayesgate_handler"


def accept_request_id(value: str | None) -> str:
    """The client's ``X-Request-ID`` if it is 1–128 safe characters, else a new id (random per
    process, then counted)."""
    if value and _REQUEST_ID_RE.fullmatch(value):
        return value
    return f"{_ID_PREFIX}{next(_ID_COUNTER) & _ID_MASK:016x}"


class JsonFormatter(logging.Formatter):
    """``LogRecord`` → one JSON line (see the module docstring for the fields)."""

    def format(self, record: logging.LogRecord) -> str:
        out: dict[str, Any] = {
            "ts": dt.datetime.fromtimestamp(record.created, dt.UTC).isoformat(
                timespec="milliseconds"
            ),
            "level": record.levelname.lower(),
            "logger": record.name,
            "message": record.getMessage(),
            "pid": record.process if record.process is not None else os.getpid(),
        }
        request_id = getattr(record, "request_id", None) or REQUEST_ID.get()
        if request_id:
            out["request_id"] = request_id
        fields = getattr(record, "fields", None)
        if isinstance(fields, dict):
            out.update(fields)
        if record.exc_info:
            out["exception"] = self.formatException(record.exc_info)
        return json.dumps(out, default=str, ensure_ascii=False)


def _text_formatter() -> logging.Formatter:
    try:
        from uvicorn.logging import DefaultFormatter

        return DefaultFormatter("%(levelprefix)s %(message)s")
    except ImportError:  # pragma: no cover - uvicorn is a dependency
        return logging.Formatter("%(levelname)s: %(message)s")


def python_level(level: str) -> str:
    """uvicorn's level names → :mod:`logging`'s (``trace`` is below ``debug``)."""
    return "DEBUG" if level == "trace" else level.upper()


def configure_logging(level: str, fmt: str) -> None:
    """Route the ``bayesgate`` loggers to stderr, as JSON or uvicorn-style text (once per process).

    In JSON mode the ``uvicorn`` loggers get the same handler, and the root logger one for every
    other library's records, so that a server's whole stderr is JSON lines (``bayesgate serve``
    also hands uvicorn :func:`uvicorn_log_config`).
    """
    names = LOGGERS if fmt == "json" else ("bayesgate",)
    for name in names:
        logger = logging.getLogger(name)
        logger.setLevel(python_level(level))
        existing = [h for h in logger.handlers if getattr(h, _HANDLER_FLAG, False)]
        if existing:
            for handler in existing:
                handler.setFormatter(JsonFormatter() if fmt == "json" else _text_formatter())
            continue
        if name.startswith("uvicorn"):
            # uvicorn's own handlers (text) are replaced, not doubled.
            for handler in list(logger.handlers):
                logger.removeHandler(handler)
        handler = logging.StreamHandler()
        handler.setFormatter(JsonFormatter() if fmt == "json" else _text_formatter())
        setattr(handler, _HANDLER_FLAG, True)
        logger.addHandler(handler)
        if name == "uvicorn.error":
            logger.propagate = False
    _route_other_loggers(names if fmt == "json" else None)


class _NotOurs(logging.Filter):
    """Passes the records of loggers outside ``names`` (those have their own handler)."""

    def __init__(self, names: tuple[str, ...]) -> None:
        super().__init__()
        self.prefixes = tuple(f"{n}." for n in names)
        self.names = frozenset(names)

    def filter(self, record: logging.LogRecord) -> bool:
        return record.name not in self.names and not record.name.startswith(self.prefixes)


def _route_other_loggers(names: tuple[str, ...] | None) -> None:
    """A JSON handler on the root logger for the libraries' own loggers (python-multipart's
    "Expected boundary character …", grpc's, asyncio's): without one, Python prints their
    warnings as bare text lines (``logging.lastResort``) among the JSON. Records of ``names``
    still propagate to the root (pytest's ``caplog`` listens there) but are not printed twice.
    ``names=None`` (text logs) removes that handler again."""
    root = logging.getLogger()
    ours = [h for h in root.handlers if getattr(h, _HANDLER_FLAG, False)]
    for handler in ours if names is None else ():
        root.removeHandler(handler)
    if names is None or ours:
        return
    handler = logging.StreamHandler()
    handler.setFormatter(JsonFormatter())
    handler.addFilter(_NotOurs(names))
    setattr(handler, _HANDLER_FLAG, True)
    root.addHandler(handler)


def uvicorn_log_config(level: str, fmt: str) -> dict[str, Any] | None:
    """``logging.dictConfig`` for uvicorn: JSON lines on stderr, or None = uvicorn's default."""
    if fmt != "json":
        return None
    return {
        "version": 1,
        "disable_existing_loggers": False,
        "formatters": {"json": {"()": "bayesgate.service.logs.JsonFormatter"}},
        "handlers": {
            "stderr": {
                "class": "logging.StreamHandler",
                "formatter": "json",
                "stream": "ext://sys.stderr",
            }
        },
        "loggers": {
            "uvicorn": {"handlers": ["stderr"], "level": python_level(level), "propagate": False},
            "uvicorn.error": {"level": python_level(level)},
            "uvicorn.access": {"handlers": [], "level": "WARNING", "propagate": False},
        },
    }
