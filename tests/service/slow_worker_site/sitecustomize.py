"""Test-only start-up hook (on PYTHONPATH for one test's server): the second ``bayesgate serve``
worker process to start waits ``BAYESGATE_TEST_SLOW_WORKER_DELAY_S`` before uvicorn's start-up, as
a worker still loading a large model would, so that SIGTERM can reach it before it listens.

The first process to create ``BAYESGATE_TEST_SLOW_WORKER_FLAG`` starts at once; the supervisor
never runs ``uvicorn.Server.startup``, so only the workers take part."""

import asyncio
import os

from uvicorn.server import Server

_startup = Server.startup


async def _slow_second_startup(self, sockets=None):  # type: ignore[no-untyped-def]
    try:
        os.close(os.open(os.environ["BAYESGATE_TEST_SLOW_WORKER_FLAG"], os.O_CREAT | os.O_EXCL))
    except FileExistsError:
        await asyncio.sleep(float(os.environ["BAYESGATE_TEST_SLOW_WORKER_DELAY_S"]))
    return await _startup(self, sockets)


Server.startup = _slow_second_startup  # type: ignore[method-assign]
