"""The ``ctypes`` binding of the native front end's library (ABI version 3; the C signatures and
their semantics are in ``service/native_front/README.md``).

One :class:`NativeFront` is one running front end: a listener and its connection threads in
Rust, a queue of validated ``/v2`` binary infer requests, and the batches Python takes from it
with :meth:`NativeFront.next_batch` (ctypes releases the GIL while it waits) and answers with
:meth:`NativeFront.complete`.
"""

from __future__ import annotations

import ctypes
import json
import logging
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import numpy as np

log = logging.getLogger("bayesgate.native")

ABI_VERSION = 3
STATS = (
    "fast_requests",
    "fast_images",
    "relayed_requests",
    "rejected_503",
    "timed_out_504",
    "batches",
    "connections_accepted",
    "bad_requests_400_native",
    "client_gone",
    "rejected_connections",
    "open_connections",
    "answered_200",
    "errors_500",
    "upstream_502",
    "latency_count",
    "latency_sum_us",
)
"""The counters of ``bgf_stats``, in its order."""


@dataclass(frozen=True)
class Batch:
    """One batch taken from the front end: its ``n`` images are the first rows of the buffer
    given to :meth:`NativeFront.next_batch`."""

    n: int
    batch_id: int
    k: int
    seed: int | None
    generation: int  # the configuration its requests were validated with
    requests: int  # HTTP requests in it


def _bind(lib: ctypes.CDLL) -> None:
    vp, size, u32, u64 = ctypes.c_void_p, ctypes.c_size_t, ctypes.c_uint32, ctypes.c_uint64
    text, err = ctypes.c_char_p, ctypes.c_char_p
    p = ctypes.POINTER
    signatures: dict[str, tuple[Any, list[Any]]] = {
        "bgf_abi_version": (u32, []),
        "bgf_start": (vp, [text, size, err, size]),
        "bgf_port": (ctypes.c_uint16, [vp]),
        "bgf_next_batch": (
            size,
            [vp, p(ctypes.c_float), size, u32, p(u64), p(u32), p(ctypes.c_int64), p(u64), p(u32)],
        ),
        "bgf_complete": (ctypes.c_int, [vp, u64, ctypes.c_int, text, size, text, size]),
        "bgf_configure": (ctypes.c_int, [vp, text, size, err, size]),
        "bgf_stats": (size, [vp, p(u64), size]),
        "bgf_latency_buckets": (size, [vp, p(u64), size]),
        "bgf_refuse_new": (ctypes.c_int, [vp]),
        "bgf_drain": (size, [vp]),
        "bgf_pending": (size, [vp]),
        "bgf_stop": (None, [vp]),
        "bgf_free": (None, [vp]),
    }
    for name, (restype, argtypes) in signatures.items():
        fn = getattr(lib, name)
        fn.restype, fn.argtypes = restype, argtypes


def load_library(path: Path) -> ctypes.CDLL:
    """Load and bind the library; :class:`OSError` when it is not one of this ABI version."""
    lib = ctypes.CDLL(str(path))
    try:
        _bind(lib)
    except AttributeError as exc:
        raise OSError(f"{path} is not a native front end of ABI {ABI_VERSION} ({exc})") from None
    version = lib.bgf_abi_version()
    if version != ABI_VERSION:
        raise OSError(f"{path} has ABI version {version}, this package needs {ABI_VERSION}")
    return lib


class NativeFront:
    """One running front end (``bgf_start``'s handle)."""

    def __init__(self, lib: ctypes.CDLL, config: dict[str, Any]) -> None:
        self.lib = lib
        body = json.dumps(config).encode()
        err = ctypes.create_string_buffer(1024)
        handle = lib.bgf_start(body, len(body), err, len(err))
        if not handle:
            raise OSError(err.value.decode(errors="replace"))
        self.handle = handle
        self._out = (
            ctypes.c_uint64(),
            ctypes.c_uint32(),
            ctypes.c_int64(),
            ctypes.c_uint64(),
            ctypes.c_uint32(),
        )

    @property
    def port(self) -> int:
        return int(self.lib.bgf_port(self.handle))

    def configure(self, config: dict[str, Any]) -> None:
        """The configuration of every request classified from now on (its generation + 1)."""
        body = json.dumps(config).encode()
        err = ctypes.create_string_buffer(1024)
        if self.lib.bgf_configure(self.handle, body, len(body), err, len(err)) != 0:
            raise ValueError(err.value.decode(errors="replace"))

    def next_batch(self, images: np.ndarray, timeout_ms: int) -> Batch | None:
        """Wait up to ``timeout_ms`` for a batch; its images are written into the first rows of
        ``images`` (float32, C-contiguous; its length is the capacity). None when none came."""
        batch_id, k, seed, generation, requests = self._out
        n = self.lib.bgf_next_batch(
            self.handle,
            images.ctypes.data_as(ctypes.POINTER(ctypes.c_float)),
            len(images),
            timeout_ms,
            ctypes.byref(batch_id),
            ctypes.byref(k),
            ctypes.byref(seed),
            ctypes.byref(generation),
            ctypes.byref(requests),
        )
        if n == 0:
            return None
        s = seed.value
        return Batch(
            int(n), batch_id.value, k.value, None if s < 0 else s, generation.value, requests.value
        )

    def complete(self, batch_id: int, status: int, prefix: bytes, data: bytes = b"") -> bool:
        """Answer a batch (see the README); False when the front end refused the answer (its
        requests were answered 500)."""
        code = self.lib.bgf_complete(self.handle, batch_id, status, prefix, len(prefix), data,
                                     len(data))  # fmt: skip
        if code != 0:
            log.error("native front end refused the answer of batch %d", batch_id)
        return code == 0

    def stats(self) -> dict[str, int]:
        out = (ctypes.c_uint64 * len(STATS))()
        self.lib.bgf_stats(self.handle, out, len(STATS))
        return dict(zip(STATS, out, strict=True))

    def latency_buckets(self, n: int) -> list[int]:
        """The ``n`` non-cumulative bucket counts of the latency histogram (the last: +Inf)."""
        out = (ctypes.c_uint64 * n)()
        got = self.lib.bgf_latency_buckets(self.handle, out, n)
        if got != n:
            raise ValueError(f"the front end has {got} latency buckets, expected {n}")
        return list(out)

    def refuse_new(self) -> bool:
        """Refuse new connections from now on (a socket filter drops their SYN, Linux) while the
        handshakes under way and the accept queue are still accepted; False when the filter
        could not be attached (or the listener is closed)."""
        return bool(self.lib.bgf_refuse_new(self.handle))

    def drain(self) -> int:
        """Stop accepting connections — refuse new ones, serve those in the accept queue, close
        the listener; requests on their way are still answered (``connection: close``), idle
        keep-alive connections are closed. Returns how many connections were taken from the
        accept queue (on the first call)."""
        return int(self.lib.bgf_drain(self.handle))

    def pending(self) -> int:
        """Requests accepted and not yet answered (being read, queued, computing, or being
        relayed), and while draining, connections still waiting for their first request (for
        at most ``first_request_grace_ms``)."""
        return int(self.lib.bgf_pending(self.handle))

    def stop(self) -> None:
        """Stop: queued requests are answered 503, :meth:`next_batch` returns None from now on."""
        self.lib.bgf_stop(self.handle)

    def free(self) -> None:
        if self.handle:
            self.lib.bgf_free(self.handle)
            self.handle = None
