"""Admin changes to the served model, applied in every worker process.

Two kinds of change (routes in :mod:`bayesgate.service.routes.admin`):

- **reload**: read the model and ``calibration.json`` again from the configured
  ``BAYESGATE_MODEL_DIR`` — through the model store, so the weights' sha256 is checked against the
  card and the calibration must belong to those weights. The new network runs one warm-up pass
  (with the K a request without ``mc_samples`` gets) before it replaces the old one; on any
  problem the old model keeps serving and the route answers 409 naming the file. The input spec
  (shape, range, number of classes) must not change: queued requests were validated against it.
  A reload drops any score/threshold override.
- **decision override**: replace the active score and/or its threshold of ``calibration.json``
  (``score > threshold`` flags an input), or clear the override.

Every change is an :class:`AdminState` with a growing ``generation``. With several worker
processes (``BAYESGATE_RUNTIME_DIR``, set by ``bayesgate serve --workers N``), the process that
receives the admin request applies the change, then writes the state to ``admin.json`` in that
directory (under an ``flock``, atomically); every other process polls the file every
:data:`POLL_S` seconds and applies what it has not applied yet. A process never writes a state it
failed to apply, so a broken store never propagates.
"""

from __future__ import annotations

import asyncio
import contextlib
import dataclasses
import datetime as dt
import json
import logging
import math
import os
from collections.abc import AsyncIterator, Callable
from pathlib import Path

from bayesgate.outputs import write_atomically
from bayesgate.service.deps import default_mc_samples
from bayesgate.service.errors import InvalidInput, ReloadFailed, StartupError
from bayesgate.service.metrics import Metrics
from bayesgate.service.served_model import (
    DecisionOverride,
    ServedModel,
    answer_blank,
    load_served_model,
)
from bayesgate.service.settings import Settings
from bayesgate.service.worker import BatchWorker

log = logging.getLogger("bayesgate.service")

POLL_S = 0.5
STATE_FILE = "admin.json"
LOCK_FILE = "admin.lock"


def forget_admin_changes(runtime_dir: Path) -> None:
    """Delete a previous run's ``admin.json``, so a new server starts from its model directory."""
    (runtime_dir / STATE_FILE).unlink(missing_ok=True)


@dataclasses.dataclass(frozen=True)
class AdminState:
    """What the admin has changed since start: ``reloads`` count, the decision override."""

    generation: int = 0
    reloads: int = 0
    override: DecisionOverride | None = None

    @classmethod
    def from_json(cls, text: str) -> AdminState:
        data = json.loads(text)
        override = data["override"]
        return cls(
            generation=int(data["generation"]),
            reloads=int(data["reloads"]),
            override=None
            if override is None
            else DecisionOverride(
                score=str(override["score"]),
                threshold=float(override["threshold"]),
                set_at=str(override["set_at"]),
            ),
        )

    def to_json(self) -> str:
        return json.dumps(dataclasses.asdict(self))


def with_decision(base: ServedModel, override: DecisionOverride) -> ServedModel:
    """``base`` with ``override.score > override.threshold`` as its decision."""
    if override.score not in base.score_names:
        raise InvalidInput(
            f"score: this model has no score {override.score!r}; "
            f"choose one of {', '.join(base.score_names)}"
        )
    return dataclasses.replace(base, override=override)


def resolve_decision(
    score: str | None, threshold: float | None, active: ServedModel, base: ServedModel
) -> tuple[str, float]:
    """An admin request (either may be missing) → the full (score, threshold) to apply.

    No score: keep the active one. No threshold: the stored threshold of that score
    (``calibration.json``'s, or the fused detector's for its scores).
    """
    if score is None and threshold is None:
        raise InvalidInput("body: give 'score', 'threshold' or both")
    score = active.decision.score if score is None else score
    if score not in base.score_names:
        raise InvalidInput(
            f"score: unknown score {score!r}; choose one of {', '.join(base.score_names)}"
        )
    if threshold is None:
        if score not in base.thresholds:
            raise InvalidInput(f"threshold: no stored threshold for {score!r}; give one")
        threshold = base.thresholds[score]
    if not math.isfinite(threshold):
        raise InvalidInput(f"threshold: must be a finite number, got {threshold}")
    return score, float(threshold)


def _now() -> str:
    return dt.datetime.now(dt.UTC).isoformat(timespec="seconds")


class ModelControl:
    """Applies :class:`AdminState` s to the worker's model (its one owner) and the metrics."""

    def __init__(self, worker: BatchWorker, settings: Settings, metrics: Metrics) -> None:
        self.worker = worker
        self.settings = settings
        self.metrics = metrics
        self.applied = AdminState()
        self.base: ServedModel | None = None  # as loaded from the store, no override
        self._lock = asyncio.Lock()
        self._dir = settings.runtime_dir
        self._seen: tuple[int, int, int] | None = None

    @property
    def shared(self) -> bool:
        return self._dir is not None

    def start(self) -> None:
        """Take the worker's model as the store's (no override yet)."""
        self.base = self.worker.model
        self.publish(self.base)

    def publish(self, served: ServedModel) -> None:
        """Make ``served`` the served model (one reference swap; the next batch runs on it)."""
        self.worker.model = served
        decision = served.decision
        self.metrics.set_model(served.name, served.sha256, decision.score, decision.threshold)

    # --- changes --------------------------------------------------------------------------------

    async def reload_state(self) -> AdminState:
        return await self.change(
            lambda s: AdminState(generation=s.generation + 1, reloads=s.reloads + 1)
        )

    async def set_decision(self, score: str | None, threshold: float | None) -> AdminState:
        def make(s: AdminState) -> AdminState:
            assert self.base is not None
            resolved = resolve_decision(score, threshold, self.worker.model, self.base)
            override = DecisionOverride(*resolved, set_at=_now())
            return dataclasses.replace(s, generation=s.generation + 1, override=override)

        return await self.change(make)

    async def clear_decision(self) -> AdminState:
        return await self.change(
            lambda s: dataclasses.replace(s, generation=s.generation + 1, override=None)
        )

    async def change(self, make: Callable[[AdminState], AdminState]) -> AdminState:
        """Apply ``make(current state)`` here; then publish it to the other processes."""
        async with self._lock, self._file_lock():
            shared = self._read()
            if shared is not None and shared.generation != self.applied.generation:
                await self._follow(shared)  # catch up with another process's change first
            new = make(self.applied)
            await self._apply(new)
            self._write(new)
            return new

    async def _apply(self, state: AdminState) -> None:
        assert self.base is not None
        base = self.base
        if state.reloads != self.applied.reloads:
            base = await self._reload(base)
        served = base if state.override is None else with_decision(base, state.override)
        self.base = base
        self.publish(served)
        self.applied = state
        log.info(
            "admin generation %d applied: model %s (sha256 %s…), score %s > %.4g flags adversarial",
            state.generation,
            served.name,
            served.sha256[:12],
            served.decision.score,
            served.decision.threshold,
        )

    async def _follow(self, state: AdminState) -> None:
        """Apply another process's state; a failure is logged and not retried."""
        try:
            await self._apply(state)
        except (ReloadFailed, InvalidInput) as exc:
            log.error("admin generation %d not applied here: %s", state.generation, exc.message)
            self.applied = state

    async def _reload(self, current: ServedModel) -> ServedModel:
        try:
            fresh = await asyncio.to_thread(
                load_served_model, self.settings.model_dir, self.settings.device
            )
        except StartupError as exc:
            raise ReloadFailed(
                f"reload failed, still serving {current.name} ({current.sha256[:12]}…): {exc}"
            ) from None
        old_spec = (current.input_shape, current.input_range, len(current.card.classes))
        new_spec = (fresh.input_shape, fresh.input_range, len(fresh.card.classes))
        if new_spec != old_spec:
            raise ReloadFailed(
                f"reload refused, still serving {current.name}: the input spec changed "
                f"(shape, range, classes) {old_spec} → {new_spec}; restart the server instead"
            )
        try:
            # the K a request without mc_samples gets (load_served_model ran K = 2)
            await asyncio.to_thread(
                answer_blank, fresh, default_mc_samples(self.settings, fresh), 1
            )
        except Exception as exc:
            raise ReloadFailed(
                f"reload failed, still serving {current.name}: warm-up pass raised "
                f"{type(exc).__name__}: {exc}"
            ) from None
        return fresh

    # --- the shared file (several worker processes) ----------------------------------------------

    @contextlib.asynccontextmanager
    async def _file_lock(self) -> AsyncIterator[None]:
        if self._dir is None:
            yield
            return
        import fcntl

        fd = os.open(self._dir / LOCK_FILE, os.O_RDWR | os.O_CREAT, 0o600)
        try:
            await asyncio.to_thread(fcntl.flock, fd, fcntl.LOCK_EX)
            yield
        finally:
            os.close(fd)  # releases the lock

    def _path(self) -> Path | None:
        return None if self._dir is None else self._dir / STATE_FILE

    def _read(self) -> AdminState | None:
        path = self._path()
        if path is None:
            return None
        try:
            return AdminState.from_json(path.read_text())
        except FileNotFoundError:
            return None
        except (OSError, ValueError, KeyError, TypeError) as exc:
            log.error("%s: unreadable admin state (%s); ignored", path, exc)
            return None

    def _write(self, state: AdminState) -> None:
        path = self._path()
        if path is None:
            return
        write_atomically(path, lambda out: out.write(state.to_json()))

    async def watch(self) -> None:
        """Follow the other processes' changes (runs for the app's lifetime when shared)."""
        path = self._path()
        if path is None:
            return
        while True:
            await asyncio.sleep(POLL_S)
            try:
                st = path.stat()
            except FileNotFoundError:
                continue
            key = (st.st_mtime_ns, st.st_size, st.st_ino)
            if key == self._seen:
                continue
            self._seen = key
            try:
                async with self._lock:
                    state = self._read()
                    if state is not None and state.generation != self.applied.generation:
                        await self._follow(state)
            except Exception:  # never let the watcher die
                log.exception("admin: could not follow %s", path)
