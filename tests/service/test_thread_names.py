"""OS thread names: what the kernel reports for the service's threads."""

from __future__ import annotations

import sys
import threading
from pathlib import Path

import pytest

from bayesgate.service import thread_names
from bayesgate.service.served_model import load_served_model
from bayesgate.service.worker import BatchWorker

linux_only = pytest.mark.skipif(sys.platform != "linux", reason="prctl PR_SET_NAME is Linux's")


def comm(native_id: int) -> str:
    return Path(f"/proc/self/task/{native_id}/comm").read_text().strip()


@linux_only
def test_a_thread_runs_under_its_os_name_and_keeps_its_python_name() -> None:
    seen: dict[str, object] = {}
    ready, done = threading.Event(), threading.Event()

    def body() -> None:
        seen["python"] = threading.current_thread().name
        seen["id"] = threading.get_native_id()
        ready.set()
        done.wait(5)

    t = thread_names.NamedThread(body, "a-long-python-name", os_name="bg-test-thread-name")
    assert t.daemon
    t.start()
    assert comm(t.native_id) == "bg-test-thread-"  # named by the time start() returns
    assert ready.wait(5)
    try:
        assert seen["python"] == "a-long-python-name"
        assert comm(seen["id"]) == "bg-test-thread-"  # the kernel keeps 15 bytes
        assert comm(threading.get_native_id()) != "bg-test-thread-"  # only that thread
    finally:
        done.set()
        t.join(5)


@linux_only
def test_the_worker_s_threads_are_named_for_the_os(tiny_model_dir: Path) -> None:
    worker = BatchWorker(load_served_model(tiny_model_dir, "cpu"))
    worker.start()
    try:
        names = {
            comm(t.native_id)
            for t in threading.enumerate()
            if t.name in ("bayesgate-worker", "bayesgate-answers") and t.native_id
        }
        assert names == {"bg-worker", "bg-answers"}
    finally:
        worker.stop()


def test_set_os_name_says_false_off_linux(monkeypatch: pytest.MonkeyPatch) -> None:
    thread_names._prctl.cache_clear()
    monkeypatch.setattr(thread_names.sys, "platform", "darwin")
    try:
        assert thread_names.set_os_name("x") is False
    finally:
        thread_names._prctl.cache_clear()
