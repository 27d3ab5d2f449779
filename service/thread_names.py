"""Threads the kernel can tell apart.

Python (before 3.14) names a thread only for itself: ``top -H``, ``/proc/<pid>/task/*/comm`` and
``bench/load.py``'s CPU by thread name all see every Python thread under the process's name.
:class:`NamedThread` starts its target under an OS name too (Linux ``prctl`` ``PR_SET_NAME``;
at most 15 bytes, longer names are cut), so the service's worker, answer and native-bridge
threads each show their own CPU.
"""

from __future__ import annotations

import ctypes
import ctypes.util
import sys
import threading
from collections.abc import Callable
from functools import cache

PR_SET_NAME = 15
OS_NAME_BYTES = 15


@cache
def _prctl() -> Callable[..., int] | None:
    if sys.platform != "linux":
        return None
    try:
        libc = ctypes.CDLL(ctypes.util.find_library("c") or None, use_errno=True)
    except OSError:
        return None
    return getattr(libc, "prctl", None)


def set_os_name(name: str) -> bool:
    """Name the calling thread for the OS (its first 15 bytes). False where that is not possible
    (not Linux, no libc ``prctl``): the thread keeps running under the process's name."""
    prctl = _prctl()
    if prctl is None:
        return False
    raw = name.encode("utf-8", "replace")[:OS_NAME_BYTES]
    return prctl(PR_SET_NAME, ctypes.c_char_p(raw), 0, 0, 0) == 0


class NamedThread(threading.Thread):
    """A daemon thread called ``name`` in Python and ``os_name`` for the OS, named before
    :meth:`start` returns (so the name is there from the first look)."""

    def __init__(self, target: Callable[[], object], name: str, os_name: str) -> None:
        super().__init__(name=name, daemon=True)
        self._body, self._os_name, self._named = target, os_name, threading.Event()

    def run(self) -> None:
        try:
            set_os_name(self._os_name)
        finally:
            self._named.set()
        self._body()

    def start(self) -> None:
        super().start()
        self._named.wait()
