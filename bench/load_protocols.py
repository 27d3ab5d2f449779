"""Request bodies of each protocol for ``bench/load.py``, and the gRPC load driver.

One image per request at K = ``k`` (``/v1 JSON`` and both ``/v2`` bodies also with ``per_request``
images each: consecutive images, ``len(images) // per_request`` bodies):

- ``/v1 JSON``: ``{"instances": [[784 numbers]], "mc_samples": k}`` to ``/v1/predict``;
- ``/v1 PNG``: multipart upload of the 8-bit PNG to ``/v1/predict/file``;
- ``/v2 JSON``: OIP JSON tensors, all outputs as JSON;
- ``/v2 binary``: OIP binary tensor extension both ways (what ``tritonclient.http`` sends by
  default): 3,136 raw float32 bytes after the JSON header, every output binary;
- ``gRPC``: KServe v2 ``ModelInfer`` with ``raw_input_contents`` over one HTTP/2 channel.
"""

from __future__ import annotations

import asyncio
import io
import json
import time
from typing import Any

import numpy as np
import torch
from load import Protocol
from PIL import Image

BOUNDARY = "bayesgate-bench-boundary"


def groups(images: torch.Tensor, per_request: int) -> list[torch.Tensor]:
    """``images`` (N×1×28×28) cut into ``N // per_request`` consecutive ``per_request×1×28×28``
    groups (the remainder is left out)."""
    if per_request < 1 or per_request > len(images):
        raise ValueError(f"per_request must be in 1 … {len(images)}, got {per_request}")
    usable = len(images) // per_request * per_request
    return list(images[:usable].split(per_request))


def v1_json(images: torch.Tensor, k: int, per_request: int = 1) -> tuple[Protocol, list[bytes]]:
    bodies = [
        json.dumps({"instances": g.flatten(1).tolist(), "mc_samples": k}).encode()
        for g in groups(images, per_request)
    ]
    return Protocol("/v1 JSON", "/v1/predict", "application/json"), bodies


def _png(img: torch.Tensor) -> bytes:
    pixels = (img.reshape(28, 28).numpy() * 255).round().astype(np.uint8)
    out = io.BytesIO()
    Image.fromarray(pixels, mode="L").save(out, format="PNG")
    return out.getvalue()


def v1_png(images: torch.Tensor, k: int) -> tuple[Protocol, list[bytes]]:
    def form(png: bytes) -> bytes:
        return (
            (
                f'--{BOUNDARY}\r\nContent-Disposition: form-data; name="mc_samples"\r\n\r\n{k}\r\n'
                f'--{BOUNDARY}\r\nContent-Disposition: form-data; name="file"; filename="x.png"\r\n'
                f"Content-Type: image/png\r\n\r\n"
            ).encode()
            + png
            + f"\r\n--{BOUNDARY}--\r\n".encode()
        )

    bodies = [form(_png(img)) for img in images]
    content_type = f"multipart/form-data; boundary={BOUNDARY}"
    return Protocol("/v1 PNG", "/v1/predict/file", content_type), bodies


def v2_json(
    images: torch.Tensor, k: int, model: str, per_request: int = 1
) -> tuple[Protocol, list[bytes]]:
    bodies = [
        json.dumps(
            {
                "inputs": [
                    {
                        "name": "input",
                        "datatype": "FP32",
                        "shape": list(g.shape),
                        "data": g.flatten().tolist(),
                    }
                ],
                "parameters": {"mc_samples": k},
            }
        ).encode()
        for g in groups(images, per_request)
    ]
    return Protocol("/v2 JSON", f"/v2/models/{model}/infer", "application/json"), bodies


def v2_binary(
    images: torch.Tensor, k: int, model: str, per_request: int = 1
) -> tuple[Protocol, list[bytes]]:
    bodies, lengths = [], []
    for g in groups(images, per_request):
        raw = g.numpy().astype("<f4").tobytes()
        header = json.dumps(
            {
                "inputs": [
                    {
                        "name": "input",
                        "datatype": "FP32",
                        "shape": list(g.shape),
                        "parameters": {"binary_data_size": len(raw)},
                    }
                ],
                "parameters": {"mc_samples": k, "binary_data_output": True},
            }
        ).encode()
        bodies.append(header + raw)
        lengths.append(len(header))
    protocol = Protocol(
        "/v2 binary", f"/v2/models/{model}/infer", "", tuple(lengths)
    )  # no Content-Type: what tritonclient.http sends
    return protocol, bodies


def grpc_requests(images: torch.Tensor, k: int, model: str) -> list[Any]:
    from tritonclient.grpc import service_pb2 as pb

    requests = []
    for img in images:
        request = pb.ModelInferRequest(model_name=model)
        request.parameters["mc_samples"].int64_param = k
        request.inputs.add(name="input", datatype="FP32", shape=[1, *img.shape])
        request.raw_input_contents.append(img.numpy().astype("<f4").tobytes())
        requests.append(request)
    return requests


async def drive_grpc(
    port: int, requests: list[Any], clients: int, duration_s: float, max_requests: int
) -> tuple[list[float], int, float]:
    """``clients`` concurrent ``ModelInfer`` calls in flight on one channel, like
    :func:`load.drive`: (latencies of OK answers, failures, wall seconds)."""
    import grpc
    from tritonclient.grpc import service_pb2_grpc as pb_grpc

    latencies: list[float] = []
    failures = sent = 0
    stop_at = time.perf_counter() + duration_s
    async with grpc.aio.insecure_channel(f"127.0.0.1:{port}") as channel:
        stub = pb_grpc.GRPCInferenceServiceStub(channel)

        async def client(i: int) -> None:
            nonlocal failures, sent
            j = i
            while time.perf_counter() < stop_at and sent < max_requests:
                sent += 1
                t0 = time.perf_counter()
                try:
                    await stub.ModelInfer(requests[j % len(requests)], timeout=60)
                    latencies.append(time.perf_counter() - t0)
                except grpc.aio.AioRpcError:
                    failures += 1
                j += clients

        start = time.perf_counter()
        await asyncio.gather(*(client(i) for i in range(clients)))
        return latencies, failures, time.perf_counter() - start
