"""Prototype (issue 19): the batching worker's engine call in a child process.

Not part of the service. Put this directory first on ``PYTHONPATH`` and set
``BAYESGATE_ENGINE_PROCESS=1``; a ``bayesgate serve`` process then runs each engine call of its
worker in one child process (``multiprocessing`` spawn context) that loaded the same model files
(``load_served_model``: safetensors + JSON). The worker thread sends the batch (raw float32 bytes,
shape, K, seed, whether features are wanted) through a pipe and blocks on the answer — a blocking
read that releases the GIL — so the forward never competes with the event loop for the GIL.

    PYTHONPATH=bench/engine_process_proto BAYESGATE_ENGINE_PROCESS=1 \\
        python bench/load.py --protocols "/v2 binary" --duration 10

``BAYESGATE_ENGINE_PROCESS=pipelined``: as ``1``, and the worker thread builds the answers of
one batch while the child computes the next: it sends batch N+1 to the child, then answers batch N
(whose results it has), then waits for N+1's; a batch's answers wait for the next batch only while
more work is queued (with an empty queue they are answered at once).

(``BAYESGATE_ENGINE_OVERLAP=1``, the engine in the worker thread and the answers in a second one,
was measured against main at ``b96881f`` and then built into ``service/worker.py`` as its answer
thread; the prototype was removed after that: run it from ``55c6af6``'s parent to repeat the
measurement.)

``BAYESGATE_ENGINE_PROCESS=answers``: the child also builds the answers
(:func:`~bayesgate.service.prediction.predictions`: uncertainty summary, detector scores, one
``Prediction`` per image) and sends them back pickled; the worker's own ``predictions`` call
returns them. (With an admin decision override the answers would be wrong: the child knows only
the model files.)

Left out on purpose (a prototype to test the hypothesis, not an engine mode): issue 18's stops
between layers (the parent's checkpoint hooks never run: a call always finishes), a crashed
child (the worker's call fails with 500), model reload (the child keeps the start-up model),
joining the child at shutdown (it is a daemon, killed with the server).

``BAYESGATE_ENGINE_TRACE=<prefix>`` (with or without the child process): one line per engine call
(written every 200 calls): ``perf_counter`` at its end, batch size, wall and CPU seconds of the
thread — in ``<prefix>.<server pid>.worker`` the worker thread's engine call (with the child:
sending the batch, waiting, reading the answer), in ``<prefix>.<server pid>.child`` the child's
(from receiving the batch to sending the answer). ``trace_summary.py`` sums them up.
"""

from __future__ import annotations

import collections
import os
import sys
import time


def _child(conn, model_dir: str, threads: int) -> None:  # pragma: no cover - other process
    import numpy as np
    import torch

    from bayesgate.service.engine import mc_engine
    from bayesgate.service.prediction import predictions
    from bayesgate.service.served_model import load_served_model

    if threads:
        torch.set_num_threads(threads)
    served = load_served_model(model_dir, "cpu")
    network = served.network
    answers = os.environ.get("BAYESGATE_ENGINE_PROCESS") == "answers"
    trace_path = os.environ.get("BAYESGATE_ENGINE_TRACE")
    trace_path = trace_path and f"{trace_path}.{os.getppid()}.child"
    trace: list[str] = []
    conn.send("ready")
    while True:
        message = conn.recv()
        if message is None:
            return
        start, cpu0 = time.perf_counter(), time.thread_time()
        (shape, k, seed, features), raw = message
        x = torch.from_numpy(np.frombuffer(raw, dtype=np.float32).reshape(shape))
        generator = None if seed is None else torch.Generator().manual_seed(seed)
        try:
            out = mc_engine(network, x, k, generator, features=features)
        except Exception as exc:  # reported to the parent
            conn.send(("error", f"{type(exc).__name__}: {exc}"))
            continue
        probs = out.probs if features else out
        if answers:  # the answers too, built here: the parent's worker only unpickles them
            built = predictions(probs, served, out.features if features else None)
            conn.send(("ok", probs.numpy(), None, built))
        elif features:
            feats = {name: t.numpy() for name, t in out.features.items()}
            conn.send(("ok", probs.numpy(), feats, None))
        else:
            conn.send(("ok", probs.numpy(), None, None))
        if trace_path:  # one line per call: end time, batch, wall s, CPU s (from recv to send)
            end = time.perf_counter()
            trace.append(f"{end:.6f} {shape[0]} {end - start:.6f} {time.thread_time() - cpu0:.6f}")
            if len(trace) >= 200:
                with open(trace_path, "a") as f:
                    f.write("\n".join(trace) + "\n")
                trace.clear()


class ProcessEngine:
    """``engine(network, x, k, generator, features=…)`` computed in a child process."""

    def __init__(self, model_dir: str, threads: int) -> None:
        import multiprocessing as mp
        import threading

        ctx = mp.get_context("spawn")
        self._conn, child = ctx.Pipe()
        self._proc = ctx.Process(
            target=_child, args=(child, model_dir, threads), daemon=True, name="bayesgate-engine"
        )
        self._proc.start()
        child.close()
        if self._conn.recv() != "ready":
            raise RuntimeError("engine process did not start")
        self._lock = threading.Lock()

    def send(self, x, k, seed, features) -> None:
        import torch

        x = x.detach().to("cpu", torch.float32).contiguous()
        features = tuple(features) if features and features is not True else features
        self._conn.send(((tuple(x.shape), k, seed, features), x.numpy().tobytes()))

    def receive(self, features):
        import torch

        from bayesgate.models.mc.engine import MCFeaturePrediction

        reply = self._conn.recv()
        if reply[0] != "ok":
            raise RuntimeError(f"engine process: {reply[1]}")
        probs = torch.from_numpy(reply[1])
        if not features:
            return probs
        feats = {name: torch.from_numpy(a) for name, a in (reply[2] or {}).items()}
        return MCFeaturePrediction(probs, probs, feats)

    def __call__(self, network, x, k, generator, *, features=False):
        import torch

        from bayesgate.models.mc.engine import MCFeaturePrediction

        seed = None if generator is None else generator.initial_seed()
        x = x.detach().to("cpu", torch.float32).contiguous()
        features = tuple(features) if features and features is not True else features
        with self._lock:
            self._conn.send(((tuple(x.shape), k, seed, features), x.numpy().tobytes()))
            reply = self._conn.recv()
        if reply[0] != "ok":
            raise RuntimeError(f"engine process: {reply[1]}")
        probs = torch.from_numpy(reply[1])
        if reply[3] is not None:
            _ANSWERS.append(reply[3])  # taken by the next predictions() call, in call order
        if not features:
            return probs
        feats = {name: torch.from_numpy(a) for name, a in (reply[2] or {}).items()}
        return MCFeaturePrediction(probs, probs, feats)


class Traced:
    """``engine`` with each call's wall and thread CPU time appended to ``path``."""

    def __init__(self, engine, path: str) -> None:
        self.engine, self.path, self.lines = engine, path, []

    def __call__(self, network, x, k, generator, **kwargs):
        start, cpu0 = time.perf_counter(), time.thread_time()
        out = self.engine(network, x, k, generator, **kwargs)
        end, cpu = time.perf_counter(), time.thread_time() - cpu0
        self.lines.append(f"{end:.6f} {x.shape[0]} {end - start:.6f} {cpu:.6f}")
        if len(self.lines) >= 200:
            with open(self.path, "a") as f:
                f.write("\n".join(self.lines) + "\n")
            self.lines.clear()
        return out


# Answers the child built, one entry per engine call in call order. A FIFO, not a thread-local: the
# worker's answer thread (service/worker.py), not the thread that made the call, builds answers.
_ANSWERS: collections.deque = collections.deque()


def _install_pipelined() -> None:
    """The worker sends batch N+1 before answering batch N (prototype: no stops, no errors
    beyond failing the batch)."""
    import queue as queue_module
    import time as time_module

    import torch

    from bayesgate.service import worker as worker_module

    cls = worker_module.BatchWorker

    def _compute_and_answer(self, jobs):
        model = self.model
        k, seed = jobs[0].k, jobs[0].seed
        size = sum(job.size for job in jobs)
        start = time_module.perf_counter()
        x = torch.cat([job.x for job in jobs])
        features = model.detector.layers if model.detector is not None else False
        self.engine.send(x, k, seed, features)
        pending, self._pending = getattr(self, "_pending", None), None
        if pending is not None:
            self._answer(pending)  # the worker's own answer step, in this thread
        out = self.engine.receive(features)
        probs, feats = (out.probs, out.features) if features else (out, None)
        seconds = time_module.perf_counter() - start
        self._pass_seconds.append(seconds / (size * k))
        self._pending = worker_module.Computed(list(jobs), model, probs, feats, size, seconds)

    def _flush(self):
        pending, self._pending = getattr(self, "_pending", None), None
        if pending is not None:
            self._answer(pending)

    def _run(self):
        while not self._stop.is_set():
            try:
                batch = self._gather()
            except queue_module.Empty:
                _flush(self)
                continue
            try:
                self._process(batch)
            except Exception:
                worker_module.log.exception("worker: unexpected error while processing a batch")
            if self._carry is None and self._queue.empty():
                _flush(self)
        _flush(self)

    cls._compute_and_answer = _compute_and_answer
    cls._run = _run


def _install(process: bool, trace: str | None) -> None:
    from bayesgate.service import app as app_module
    from bayesgate.service import worker as worker_module

    build = worker_module.predictions

    def predictions(probs, model, features=None):
        if not _ANSWERS:
            return build(probs, model, features)
        return _ANSWERS.popleft()

    worker_module.predictions = predictions

    original = app_module.start_worker

    def start_worker(served, settings):
        worker = original(served, settings)
        engine = worker.engine
        if process:
            engine = ProcessEngine(str(served.directory), settings.num_threads)
        if trace:
            engine = Traced(engine, f"{trace}.{os.getpid()}.worker")
        worker.engine = engine
        return worker

    app_module.start_worker = start_worker


_PROCESS = os.environ.get("BAYESGATE_ENGINE_PROCESS") in ("1", "answers", "pipelined")
_TRACE = os.environ.get("BAYESGATE_ENGINE_TRACE")
if (_PROCESS or _TRACE) and "serve" in sys.argv[1:]:
    _install(_PROCESS, _TRACE)
    if os.environ.get("BAYESGATE_ENGINE_PROCESS") == "pipelined":
        _install_pipelined()
