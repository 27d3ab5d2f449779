"""Drive an app's ASGI lifespan start-up by hand, for the tests of start-up failures."""

from __future__ import annotations

from typing import Any

import pytest

from bayesgate.service.errors import StartupError


async def startup_failure_message(app: Any) -> str:
    """Send ``lifespan.startup`` to ``app``, expect a :class:`StartupError` and exactly one
    ``lifespan.startup.failed`` message; return that message's text."""
    sent: list[dict[str, Any]] = []
    incoming = [{"type": "lifespan.startup"}]

    async def receive() -> dict[str, Any]:
        return incoming.pop(0)

    async def send(message: dict[str, Any]) -> None:
        sent.append(message)

    with pytest.raises(StartupError):
        await app({"type": "lifespan", "asgi": {"version": "3.0"}, "state": {}}, receive, send)
    [message] = sent
    assert message["type"] == "lifespan.startup.failed"
    return message["message"]
