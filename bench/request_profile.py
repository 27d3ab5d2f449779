"""Where the event loop's CPU goes per request (cProfile), for ``/v1`` JSON, ``/v2`` JSON and —
when the server has it — ``/v2`` binary tensors: the bundled model behind the app in-process
(httpx ASGI transport, no sockets), one MNIST-like image per request at K = ``--k``.

cProfile sees the calling thread only: the model runs in the worker thread and is *not* counted,
so the figures are the request path outside the model (parsing, validation, the hand-off,
encoding, middleware) plus the in-process client's share. Run it from any checkout to compare
versions (only ``create_app`` and ``Settings`` are used):

    python bench/request_profile.py --requests 300
"""

from __future__ import annotations

import argparse
import asyncio
import cProfile
import io
import json
import pstats
import sys
import time
from pathlib import Path

import httpx
import torch

from bayesgate.service.app import create_app
from bayesgate.service.settings import DEFAULT_MODEL_DIR, Settings

BUNDLED = DEFAULT_MODEL_DIR  # the model `bayesgate serve` serves by default
GROUPS = {  # label → substrings of "file:function" summed as cumulative time (may overlap)
    "JSON parse": ("parse_json",),
    "v1 validate + decode": ("_decode_predict", "decode_instances", "PredictRequest", "validated"),
    "v2 parse + validate": ("parse_infer_request", "_decode_infer", "InferRequest", "decode_infer"),
    "response encode": (
        "predict_body",
        "predict_response",
        "infer_response",
        "join_body",
        "serialize_response",
        "JSONResponse.render",
        "orjson",
    ),
}


def bodies(k: int, model: str) -> dict[str, tuple[dict[str, str], bytes]]:
    x = torch.rand(1, 1, 28, 28, generator=torch.Generator().manual_seed(0))
    v1 = json.dumps({"instances": x.tolist(), "mc_samples": k}).encode()
    tensor = {"name": "input", "datatype": "FP32", "shape": [1, 1, 28, 28]}
    v2 = json.dumps(
        {"inputs": [{**tensor, "data": x.flatten().tolist()}], "parameters": {"mc_samples": k}}
    ).encode()
    raw = x.numpy().astype("<f4").tobytes()
    head = json.dumps(
        {
            "inputs": [{**tensor, "parameters": {"binary_data_size": len(raw)}}],
            "parameters": {"mc_samples": k, "binary_data_output": True},
        }
    ).encode()
    ct = {"content-type": "application/json"}
    return {
        "/v1/predict JSON": (ct, v1),
        f"/v2/models/{model}/infer JSON": (ct, v2),
        f"/v2/models/{model}/infer binary": (
            {
                "content-type": "application/octet-stream",
                "inference-header-content-length": str(len(head)),
            },
            head + raw,
        ),
    }


async def profile(args: argparse.Namespace) -> None:
    settings = Settings(
        model_dir=args.model_dir,
        device="cpu",
        access_log=False,
        num_threads=1,
        max_queue_delay_ms=0.0,
        log_level="warning",
    )
    app = create_app(settings)
    async with app.router.lifespan_context(app):
        model = app.state.worker.model.name
        transport = httpx.ASGITransport(app=app)
        async with httpx.AsyncClient(transport=transport, base_url="http://bench") as client:
            for name, (headers, body) in bodies(args.k, model).items():
                path = name.rsplit(" ", 1)[0]
                r = await client.post(path, content=body, headers=headers)
                if r.status_code != 200:
                    print(f"{name}: {r.status_code} {r.text[:100]} (not supported here)")
                    continue
                for _ in range(20):  # warm-up
                    await client.post(path, content=body, headers=headers)
                prof = cProfile.Profile(time.thread_time)  # CPU, not wall (shared machine)
                t0, c0 = time.perf_counter(), time.thread_time()
                prof.enable()
                for _ in range(args.requests):
                    await client.post(path, content=body, headers=headers)
                prof.disable()
                wall, cpu = time.perf_counter() - t0, time.thread_time() - c0
                report(name, prof, args.requests, wall, cpu, args.top)


def report(name: str, prof: cProfile.Profile, n: int, wall: float, cpu: float, top: int) -> None:
    stats = pstats.Stats(prof)
    print(
        f"\n== {name}: {n} requests, loop-thread CPU {1000 * cpu / n:.3f} ms/request "
        f"(wall {1000 * wall / n:.3f} ms, incl. waiting for the worker)"
    )
    for label, keys in GROUPS.items():
        total = max(
            (
                v[3]
                for (f, _, fn), v in stats.stats.items()  # type: ignore[attr-defined]
                if any(k in f"{f}:{fn}" for k in keys)
            ),
            default=0.0,
        )
        print(f"   {label:<22} {1000 * total / n:7.3f} ms/request (largest cumulative entry)")
    out = io.StringIO()
    pstats.Stats(prof, stream=out).sort_stats("tottime").print_stats(top)
    lines = [ln for ln in out.getvalue().splitlines() if ln.strip()][-top - 1 :]
    print("\n".join("   " + ln for ln in lines))


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    p.add_argument("--model-dir", type=Path, default=BUNDLED)
    p.add_argument("--requests", type=int, default=300)
    p.add_argument("--k", type=int, default=10)
    p.add_argument("--top", type=int, default=12, help="functions listed by own time")
    args = p.parse_args(argv)
    torch.set_num_threads(1)
    asyncio.run(profile(args))
    return 0


if __name__ == "__main__":
    sys.exit(main())
