"""The prototype computes what the in-thread engine computes: one seeded ``/v1/predict`` request
(three MNIST test images, K = 10, seed 7) to a server per mode — in-thread engine,
``BAYESGATE_ENGINE_PROCESS=1``, ``=answers`` and ``=pipelined`` — and the answers compared whole
(request id aside).

    PYTHONPATH=bench/engine_process_proto python bench/engine_process_proto/same_answers.py
"""

from __future__ import annotations

import json
import sys
import urllib.request
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))
import load

MODES = ("thread", "1", "answers", "pipelined")


def answer(mode: str, body: bytes) -> dict:
    env = {"BAYESGATE_LOG_LEVEL": "warning", "BAYESGATE_NUM_THREADS": "1"}
    if mode != "thread":
        env["BAYESGATE_ENGINE_PROCESS"] = mode
    with load.Server(load.BUNDLED, load.free_port(), env) as server:
        server.wait_ready()
        request = urllib.request.Request(
            f"{server.base}/v1/predict", body, {"Content-Type": "application/json"}
        )
        with load._DIRECT.open(request, timeout=30) as r:
            out = json.load(r)
    out.pop("request_id", None)
    return out


def main() -> int:
    images = load.mnist_images(3).tolist()
    body = json.dumps({"instances": images, "mc_samples": 10, "seed": 7}).encode()
    answers = {mode: answer(mode, body) for mode in MODES}
    same = True
    for mode in MODES[1:]:
        equal = answers[mode] == answers["thread"]
        same &= equal
        print(f"{mode}: {'equal' if equal else 'DIFFERENT'}")
    return 0 if same else 1


if __name__ == "__main__":
    sys.exit(main())
