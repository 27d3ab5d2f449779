"""Test-only start-up hook (on PYTHONPATH for one test's server): the second ``bayesgate serve``
worker process to start waits, before uvicorn's start-up, until the file
``BAYESGATE_TEST_SLOW_WORKER_RELEASE`` exists (at most 120 s) — as a worker still loading a large
model would — so that the test decides when it may start, e.g. only after SIGTERM reached it.

The first process to create ``BAYESGATE_TEST_SLOW_WORKER_FLAG`` starts at once; the supervisor
never runs ``uvicorn.Server.startup``, so only the workers take part."""

import asyncio
import os
import time

from uvicorn.server import Server

_startup = Server.startup


async def _slow_second_startup(self, sockets=None):  # type: ignore[no-untyped-def]
    try:
        os.close(os.open(os.environ["BAYESGATE_TEST_SLOW_WORKER_FLAG"], os.O_CREAT | os.O_EXCL))
    except FileExistsError:
        deadline = time.monotonic() + 120
        release = os.environ["BAYESGATE_TEST_SLOW_WORKER_RELEASE"]
        while not os.path.exists(release) and time.monotonic() < deadline:
            await asyncio.sleep(0.05)
    return await _startup(self, sockets)


Server.startup = _slow_second_startup  # type: ignore[method-assign]
