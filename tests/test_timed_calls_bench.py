"""``bench/timed_calls``: the answer path's calls are wrapped once the service imports them, and
each process writes its totals at exit."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

BENCH = Path(__file__).resolve().parents[1] / "bench" / "timed_calls"
SCRIPT = """
import bayesgate.service.native_bridge as bridge, bayesgate.service.worker as worker
assert worker.answer_columns.__name__ == "call", "not wrapped"
try:
    bridge.output_bytes(None, [])  # fails inside: still one timed call
except AttributeError:
    pass
"""


def test_calls_are_wrapped_and_their_totals_written_at_exit(tmp_path: Path) -> None:
    env = {**os.environ, "BG_TIMED_CALLS_DIR": str(tmp_path), "PYTHONPATH": str(BENCH)}
    subprocess.run([sys.executable, "-c", SCRIPT], env=env, check=True, timeout=120)
    (out,) = tmp_path.glob("timed_calls-*.json")
    totals = json.loads(out.read_text())
    assert set(totals) == {"output_bytes"}
    calls, cpu, wall = totals["output_bytes"]
    assert calls == 1 and cpu >= 0 and 0 <= wall < 10


def test_without_the_directory_nothing_is_wrapped(tmp_path: Path) -> None:
    env = {k: v for k, v in os.environ.items() if k != "BG_TIMED_CALLS_DIR"}
    env["PYTHONPATH"] = str(BENCH)
    code = "import bayesgate.service.worker as w\n"
    code += "assert w.answer_columns.__name__ == 'answer_columns'"
    subprocess.run([sys.executable, "-c", code], env=env, check=True, timeout=120)
