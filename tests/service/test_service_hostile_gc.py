"""The server keeps its start-up heap out of the garbage collector's reach while it serves.

A full (generation-2) collection walks every tracked object; with the modules, the model and
FastAPI's routes in the heap, one stalled the event loop (and every thread) for 60–145 ms under
the hostile-load benchmark, and late 504s followed (issue 18). After the warm-up the app freezes
what is alive (``gc.freeze``), and unfreezes it at shutdown so it can be collected again.
"""

from __future__ import annotations

import gc
from collections.abc import Callable
from typing import Any

import pytest

from bayesgate.service.settings import Settings

pytestmark = pytest.mark.anyio


async def test_startup_objects_are_frozen_while_serving_and_released_at_shutdown(
    serving: Callable[[Settings], Any], make_settings: Callable[..., Settings]
) -> None:
    gc.unfreeze()
    async with serving(make_settings()) as (_, client):
        frozen = gc.get_freeze_count()
        walked = len(gc.get_objects())  # what a full collection walks now
        assert (await client.get("/healthz")).status_code == 200
    assert frozen > 50_000  # the start-up heap: torch, FastAPI, the model, the app
    assert walked < frozen / 10
    assert gc.get_freeze_count() == 0  # shutdown hands it back to the collector
