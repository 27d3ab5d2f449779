"""bench/quiet.sh pauses the long runs (their outputs in the user cache) while a command runs and
resumes them after; a training elsewhere (a test suite's) keeps running."""

from __future__ import annotations

import os
import subprocess
import sys
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
SLEEP = "import time; time.sleep(60)"


def state(pid: int) -> str:
    """The one-letter state of ``/proc/<pid>/stat`` (``T`` = stopped)."""
    return Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()[0]


def test_quiet_pauses_only_the_long_runs_and_resumes_them(private_user_cache: Path) -> None:
    cache = private_user_cache / "bayesgate"
    # stand-ins whose command lines look like a long run and like a test's training
    long_run = subprocess.Popen([sys.executable, "-c", SLEEP, "bayesgate", "train",
                                 "--checkpoint-dir", f"{cache}/checkpoints/x"])  # fmt: skip
    other = subprocess.Popen([sys.executable, "-c", SLEEP, "bayesgate", "train",
                              "--checkpoint-dir", "/tmp/pytest-of-x/ckpt"])  # fmt: skip
    try:
        for proc in (long_run, other):  # both started and asleep in time.sleep
            deadline = time.monotonic() + 30
            while state(proc.pid) != "S":
                assert time.monotonic() < deadline, "the stand-in never went to sleep"
                time.sleep(0.01)
        # SIGSTOP takes effect asynchronously: wait (≤ 2 s) for the stop before reading the states
        stat = f"/proc/{long_run.pid}/stat"
        probe = (
            f"for i in $(seq 200); do grep -q ') T ' {stat} && break; sleep 0.01; done; "
            f"cat {stat} /proc/{other.pid}/stat"
        )
        env = {**os.environ, "XDG_CACHE_HOME": str(private_user_cache)}
        during = subprocess.run(
            [str(ROOT / "bench" / "quiet.sh"), "sh", "-c", probe],
            env=env, capture_output=True, text=True, check=True,
        ).stdout.splitlines()  # fmt: skip
        states = [line.rsplit(")", 1)[1].split()[0] for line in during]
        assert states[0] == "T" and states[1] != "T", states
        assert state(long_run.pid) != "T" and state(other.pid) != "T"  # resumed after
        failing = subprocess.run([str(ROOT / "bench" / "quiet.sh"), "false"], env=env, check=False)
        assert failing.returncode == 1 and state(long_run.pid) != "T"  # resumed on failure too
    finally:
        for proc in (long_run, other):
            proc.kill()
            proc.wait()
