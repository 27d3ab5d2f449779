"""The Python half of the native front-end prototype (issue 19; see ``sitecustomize.py`` beside it).

``rust/`` is a front end in Rust (std only, a ``cdylib`` loaded with :mod:`ctypes`): it accepts
the connections, parses HTTP, validates ``POST /v2/models/{name}/infer`` bodies with the binary
tensor extension, queues them, forms batches, and encodes and writes the answers. Python is called
once per **batch**, not per request: :class:`Bridge` is a thread that waits in
``bgf_next_batch`` (ctypes releases the GIL), runs the served model on the whole batch, and hands
every output of the batch back as one buffer with ``bgf_complete``. Every request the front end
does not take (another route, another content type, JSON data, an ``id``, a value out of range, …)
is relayed byte for byte to the unchanged Python service on an internal port, so errors and every
other route stay the service's own.

What the batch computes is what the worker computes: the engine call of
:meth:`~bayesgate.service.worker.BatchWorker.engine_call` (the same engine object, the detector's
features, a generator seeded with the request's seed when it sent one) and every column of
:func:`~bayesgate.service.prediction.answer_columns`; the decision is ``score > threshold`` in
float64, as :func:`~bayesgate.service.prediction.predictions` decides it. The answers are
byte-identical to the service's (``tests/service/test_native_front_proto.py``).
"""

from __future__ import annotations

import ctypes
import json
import logging
import math
import os
import shutil
import subprocess
import threading
import time
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import numpy as np
import orjson
import torch

from bayesgate.service.errors import ServiceError, error_body, status_of
from bayesgate.service.inference_protocol import INPUT_NAME, encode_outputs, output_table
from bayesgate.service.oip_binary import DTYPES
from bayesgate.service.prediction import Prediction, answer_columns
from bayesgate.service.served_model import ModelRef, ServedModel

log = logging.getLogger("bayesgate.native_front")

CRATE = Path(__file__).resolve().parent / "rust"
TARGET_DIR = Path.home() / ".cache" / "bayesgate" / "native-front-target"
STATS = (
    "fast_requests",
    "fast_images",
    "relayed_requests",
    "rejected_503",
    "timed_out_504",
    "batches",
    "connections_accepted",
    "bad_requests_400_native",
)


def cargo() -> str:
    """The ``cargo`` on PATH, or rustup's default place; :class:`FileNotFoundError` otherwise."""
    found = shutil.which("cargo") or str(Path.home() / ".cargo" / "bin" / "cargo")
    if not Path(found).is_file():
        raise FileNotFoundError("cargo (Rust) is needed to build the native front end")
    return found


def build_library() -> Path:
    """``cargo build --release --offline`` of ``rust/`` (std only: no registry needed), target
    directory outside the work tree; the path of ``libbgfront.so``."""
    env = {**os.environ, "CARGO_TARGET_DIR": str(TARGET_DIR)}
    subprocess.run(
        [cargo(), "build", "--release", "--offline", "--quiet"],
        cwd=CRATE,
        env=env,
        check=True,
    )
    return TARGET_DIR / "release" / "libbgfront.so"


class NativeFront:
    """The ctypes binding of ``libbgfront.so`` for one running front end."""

    def __init__(self, library: Path, config: dict[str, Any]) -> None:
        lib = ctypes.CDLL(str(library))
        vp, u64p, u32p, i64p = (
            ctypes.c_void_p,
            ctypes.POINTER(ctypes.c_uint64),
            ctypes.POINTER(ctypes.c_uint32),
            ctypes.POINTER(ctypes.c_int64),
        )
        lib.bgf_start.restype = vp
        lib.bgf_start.argtypes = [
            ctypes.c_char_p,
            ctypes.c_size_t,
            ctypes.c_char_p,
            ctypes.c_size_t,
        ]
        lib.bgf_next_batch.restype = ctypes.c_size_t
        lib.bgf_next_batch.argtypes = [
            vp,
            ctypes.POINTER(ctypes.c_float),
            ctypes.c_size_t,
            ctypes.c_uint32,
            u64p,
            u32p,
            i64p,
        ]
        lib.bgf_complete.restype = ctypes.c_int
        lib.bgf_complete.argtypes = [
            vp,
            ctypes.c_uint64,
            ctypes.c_int,
            ctypes.c_char_p,
            ctypes.c_size_t,
            ctypes.c_char_p,
            ctypes.c_size_t,
        ]
        lib.bgf_stats.restype = None
        lib.bgf_stats.argtypes = [vp, u64p, ctypes.c_size_t]
        lib.bgf_port.restype = ctypes.c_uint16
        lib.bgf_port.argtypes = [vp]
        lib.bgf_stop.restype = None
        lib.bgf_stop.argtypes = [vp]
        self.lib = lib
        text = json.dumps(config).encode()
        err = ctypes.create_string_buffer(1024)
        handle = lib.bgf_start(text, len(text), err, len(err))
        if not handle:
            raise OSError(f"native front end did not start: {err.value.decode(errors='replace')}")
        self.handle = handle
        self._batch_id = ctypes.c_uint64()
        self._k = ctypes.c_uint32()
        self._seed = ctypes.c_int64()

    @property
    def port(self) -> int:
        return int(self.lib.bgf_port(self.handle))

    def next_batch(self, images: np.ndarray, timeout_ms: int) -> tuple[int, int, int, int | None]:
        """``(n, batch id, K, seed or None)``; the batch's ``n`` images are written into
        ``images`` (float32, C-contiguous, capacity ``len(images)``); ``n = 0``: none came."""
        n = self.lib.bgf_next_batch(
            self.handle,
            images.ctypes.data_as(ctypes.POINTER(ctypes.c_float)),
            len(images),
            timeout_ms,
            ctypes.byref(self._batch_id),
            ctypes.byref(self._k),
            ctypes.byref(self._seed),
        )
        seed = self._seed.value
        return int(n), self._batch_id.value, self._k.value, None if seed < 0 else seed

    def complete(self, batch_id: int, status: int, prefix: bytes, data: bytes = b"") -> None:
        if self.lib.bgf_complete(
            self.handle, batch_id, status, prefix, len(prefix), data, len(data)
        ):
            log.error("native front end refused the answer of batch %d", batch_id)

    def stats(self) -> dict[str, int]:
        out = (ctypes.c_uint64 * len(STATS))()
        self.lib.bgf_stats(self.handle, out, len(STATS))
        return dict(zip(STATS, out, strict=True))

    def stop(self) -> None:
        self.lib.bgf_stop(self.handle)


def front_config(
    served: ServedModel, settings: Any, host: str, port: int, upstream: str, max_batch: int
) -> dict[str, Any]:
    """What the front end needs to know of the model and the settings (the JSON of
    ``bgf_start``)."""
    from bayesgate.service.deps import default_mc_samples
    from bayesgate.service.errors import DeadlineExceeded, QueueFull

    classes = len(served.card.classes)
    outputs = [
        {
            "name": name,
            "datatype": datatype,
            "elements": math.prod(classes if d == "C" else int(d) for d in dims),
        }
        for name, (datatype, dims) in output_table(served).items()
    ]
    lo, hi = served.input_range
    return {
        "host": host,
        "port": port,
        "upstream": upstream,
        "model_name": served.name,
        "input_name": INPUT_NAME,
        "input_shape": list(served.input_shape),
        "input_range": [float(lo), float(hi)],
        "max_instances": settings.max_instances,
        "max_mc_samples": settings.max_mc_samples,
        "default_mc_samples": default_mc_samples(settings, served),
        "outputs": outputs,
        "max_batch": max_batch,
        # images waiting (the service counts requests and image-passes): one full request fits
        "queue_limit": max(settings.queue_capacity, settings.max_instances),
        "request_timeout_ms": int(settings.request_timeout_s * 1000),
        "queue_full_body": orjson.dumps(
            error_body("the inference queue is full; retry later", QueueFull.code, v2=True)
        ).decode(),
        "timeout_body": orjson.dumps(
            error_body(
                "the request could not be answered before its deadline (server busy)",
                DeadlineExceeded.code,
                v2=True,
            )
        ).decode(),
    }


def batch_outputs(
    served: ServedModel, probs: torch.Tensor, features: dict[str, torch.Tensor] | None
) -> dict[str, np.ndarray]:
    """Every output of the served table for the batch, as the arrays the binary extension sends
    (``/v2``'s datatypes): the same values :func:`~bayesgate.service.prediction.predictions`
    gives each image."""
    columns = answer_columns(probs, served, features)
    decision = served.decision
    chosen = columns.scores[decision.score]
    values: dict[str, torch.Tensor] = {
        "probabilities": columns.mean,
        "label": columns.labels,
        **{name: columns.scores[name] for name in columns.scores},
        "aleatoric_variance": columns.aleatoric_variance,
        "epistemic_variance": columns.epistemic_variance,
        # Prediction.adversarial: the float64 of the float32 score against a float64 threshold
        "adversarial": chosen.double() > decision.threshold,
        "score": chosen,
    }
    return {
        name: values[name].numpy().astype(DTYPES[datatype], copy=False)
        for name, (datatype, _) in output_table(served).items()
    }


def answer_prefix(served: ServedModel, k: int, seed: int | None) -> bytes:
    """The response's JSON header up to ``"outputs":[`` — :func:`infer_response`'s fields in its
    order (no ``id``: requests with one are the Python service's)."""
    decision = served.decision
    return answer_prefix_of(served.ref, decision.score, decision.threshold, k, seed)


def answer_prefix_of(
    ref: ModelRef, score_name: str, threshold: float, k: int, seed: int | None
) -> bytes:
    """:func:`answer_prefix` for the model and decision that computed the answers."""
    parameters: dict[str, Any] = {
        "mc_samples": k,
        "calibration_mc_samples": ref.calibration_mc_samples,
        "score_name": score_name,
        "threshold": threshold,
        "weights_sha256": ref.weights_sha256,
    }
    if seed is not None:
        parameters["seed"] = seed
    head = orjson.dumps({"model_name": ref.name, "parameters": parameters, "outputs": []})
    assert head.endswith(b"[]}")
    return head[:-2]


def prediction_outputs(served: ServedModel, rows: list[Prediction]) -> dict[str, np.ndarray]:
    """The same arrays as :func:`batch_outputs`, from the worker's per-image answers (the
    ``worker`` mode of :class:`Bridge`): the service's own ``/v2`` encoding of them
    (:func:`~bayesgate.service.inference_protocol.encode_outputs`), as arrays."""
    encoded = encode_outputs(rows, list(output_table(served)))
    return {
        o["name"]: np.array(o["data"]).astype(DTYPES[o["datatype"]], copy=False) for o in encoded
    }


@dataclass
class Bridge:
    """The thread that feeds the front end's batches to the model (see the module docstring)."""

    front: NativeFront
    worker: Any  # the service's BatchWorker: its engine, its model, its stats
    capacity: int
    timeout_ms: int = 200
    through_worker: bool = False  # each batch as one job of the worker's queue
    request_timeout_s: float = 30.0

    in_flight: int = 2  # worker path: batches handed to the worker and not yet answered

    def __post_init__(self) -> None:
        self._stopping = threading.Event()
        # one batch computing while the next one waits (the worker's answer thread answers the
        # first meanwhile); more would split the front end's batches into smaller jobs
        self._slots = threading.Semaphore(self.in_flight)
        self._thread = threading.Thread(target=self._run, name="native-bridge", daemon=True)

    def start(self) -> None:
        self._thread.start()

    def stop(self) -> None:
        self._stopping.set()
        self.front.stop()
        self._thread.join(timeout=5)

    def _run(self) -> None:
        shape = self.worker.model.input_shape
        images = np.empty((self.capacity, *shape), dtype=np.float32)
        while not self._stopping.is_set():
            if self.through_worker and not self._slots.acquire(timeout=self.timeout_ms / 1000):
                continue
            n, batch_id, k, seed = self.front.next_batch(images, self.timeout_ms)
            if self.through_worker:
                if n:
                    self._submit(images[:n], batch_id, k, seed)
                else:
                    self._slots.release()
            elif n:
                self._answer(images[:n], batch_id, k, seed)

    def _submit(self, images: np.ndarray, batch_id: int, k: int, seed: int | None) -> None:
        """The batch as one job of the service's worker: its queue, admission, deadline, stop
        checks, grouping with the Python routes' jobs and its stats. Answered from the worker's
        answer thread (:meth:`_finish`), which frees the slot."""
        try:
            job = self.worker.submit(
                torch.from_numpy(images.copy()),  # the buffer is the next batch's
                k,
                seed=seed,
                return_samples=False,
                deadline=time.monotonic() + self.request_timeout_s,
            )
        except ServiceError as exc:
            self._fail(batch_id, exc)
            self._slots.release()
            return
        job.future.add_done_callback(lambda future: self._finish(future, batch_id, k, seed))

    def _finish(self, future: Any, batch_id: int, k: int, seed: int | None) -> None:
        """The worker's per-image answers, made arrays again, to the front end."""
        try:
            exc = future.exception()
            if exc is not None:
                self._fail(batch_id, exc)
                return
            rows = future.result()
            outputs = prediction_outputs(self.worker.model, rows)
            data = b"".join(array.tobytes() for array in outputs.values())
            first = rows[0]
            prefix = answer_prefix_of(first.model, first.score_name, first.threshold, k, seed)
            self.front.complete(batch_id, 200, prefix, data)
        except Exception as exc:  # never leave the front end's requests waiting
            log.exception("native bridge: answering batch %d failed", batch_id)
            self._fail(batch_id, exc)
        finally:
            self._slots.release()

    def _fail(self, batch_id: int, exc: BaseException) -> None:
        if isinstance(exc, ServiceError):
            status, message, code = status_of(exc, v2=True), exc.message, exc.code
        else:
            status, message, code = 500, f"internal error: {type(exc).__name__}", ""
        self.front.complete(batch_id, status, orjson.dumps(error_body(message, code, v2=True)))

    def _answer(self, images: np.ndarray, batch_id: int, k: int, seed: int | None) -> None:
        worker, served = self.worker, self.worker.model
        start, cpu_start = time.perf_counter(), time.thread_time()
        try:
            x = torch.from_numpy(images).to(served.device)
            generator = None
            if seed is not None:
                generator = torch.Generator(device=served.device).manual_seed(seed)
            probs, features = worker.engine_call(served, x, k, generator)
            cpu = time.thread_time() - cpu_start
            outputs = batch_outputs(served, probs, features)
            data = b"".join(array.tobytes() for array in outputs.values())
            prefix = answer_prefix(served, k, seed)
        except Exception as exc:  # as the worker: every job of the batch fails, the thread lives
            log.exception("native bridge: batch failed")
            message = f"inference failed: {type(exc).__name__}: {exc}"
            self.front.complete(batch_id, 500, orjson.dumps(error_body(message, "", v2=True)))
            worker.stats.record_call(len(images), 0, time.perf_counter() - start, ok=False)
            return
        self.front.complete(batch_id, 200, prefix, data)
        # requests per batch is not known here: counted as images (one image per request in
        # the benchmark); the engine call's own CPU, as the worker counts it
        worker.stats.record_call(
            len(images), len(images), time.perf_counter() - start, ok=True, cpu_seconds=cpu
        )
