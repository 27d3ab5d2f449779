"""Prototype (issue 19): ``/v2`` binary infer answered inside the HTTP protocol class.

Not part of the service, and not a candidate as it stands: it measures how much of the event
loop's CPU per request a path without ASGI could save. Put this directory first on
``PYTHONPATH`` and set ``BAYESGATE_FAST_V2_PROTO=1``; a ``bayesgate serve`` process then answers
``POST /v2/models/{name}/infer`` requests without a ``Content-Type`` or with
``application/octet-stream`` (what ``tritonclient.http`` and ``bench/load.py``'s ``/v2 binary``
send) in httptools' own callbacks:

- the head and body are collected by the parser callbacks (no ASGI scope, cycle, task or
  ``asyncio.Event``; every other request goes to the app as before);
- the body is decoded by the service's own
  :func:`~bayesgate.service.inference_protocol.decode_infer` (the same JSON header model and
  tensor checks), the job submitted with
  :meth:`~bayesgate.service.worker.BatchWorker.submit` and its future's completion handed back to
  the loop with ``call_soon_threadsafe`` (no coroutine, no ``asyncio.wait``);
- the answer is built by the service's own ``infer_response`` and ``join_body`` and written as
  one HTTP/1.1 response.

Left out on purpose, so the loop figure it gives is a **lower bound** for a real implementation:
the middleware's request id, access log, HTTP metrics and body limit; the admission hold before
the body is read (``submit`` still refuses work that does not fit); the client watch (a job of a
client that hung up is still computed); the deadline's 504 (the job carries the deadline, the
worker drops it, the answer is an error body); HTTP pipelining and ``Expect: 100-continue``; the
shutdown drain of a connection in the middle of such a request; the keep-alive timeout of a
connection left idle after a fast-path answer (uvicorn arms it when an ASGI cycle completes).

    PYTHONPATH=bench/v2_fast_proto BAYESGATE_FAST_V2_PROTO=1 \\
        python bench/load.py --protocols "/v2 binary" --duration 10
"""

from __future__ import annotations

import os

if os.environ.get("BAYESGATE_FAST_V2_PROTO") == "1":
    import fast_protocol

    fast_protocol.install()
