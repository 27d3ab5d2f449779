"""Jobs already computing when their client is answered: stopped between two layers, answered
only once stopped (issue 18: "0 jobs computed for clients already answered").

The real MC engine runs the tiny network; a forward pre-hook on one of its layers holds the call
(an ``Event``) so the deadline or the hang-up happens, deterministically, while the job computes:

- the request is not answered while its job is held in the engine (it waits for the worker);
- once released, the worker's check before the next layer stops the call: the job is answered
  504 / 499, counted in ``bayesgate_jobs_dropped_total{stage="computing"}``, and the layers after
  the check never run;
- the other jobs of the same engine call run again without the dropped one and are answered;
- the checks change no number: the engine's outputs for a seed are bit-identical with them.
"""

from __future__ import annotations

import asyncio
import threading
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from typing import Any

import pytest
import torch
from prometheus_text import metric_value
from test_service_admission import WAIT_S, until
from torch import nn

from bayesgate.service.engine import CallStopped, checkpoints, mc_engine
from bayesgate.service.errors import ClientGone, DeadlineExceeded
from bayesgate.service.served_model import load_served_model
from bayesgate.service.settings import Settings

pytestmark = pytest.mark.anyio


def leaves(network: nn.Module) -> list[nn.Module]:
    return [m for m in network.modules() if next(m.children(), None) is None]


class LayerGate:
    """Holds the worker thread before ``layer`` runs on a batch of ``rows`` rows until
    ``release()``; counts the forwards of the network's last layer."""

    def __init__(self, network: nn.Module, rows: int) -> None:
        self.rows = rows
        self.entered = threading.Event()
        self._gate = threading.Event()
        self.first_layer_rows: list[int] = []
        self.last_layer_runs = 0
        self._network = network

    @contextmanager
    def installed(self) -> Iterator[LayerGate]:
        layers = leaves(self._network)
        handles = [
            layers[0].register_forward_pre_hook(self._hold),
            layers[-1].register_forward_hook(self._count_last),
        ]
        try:
            yield self
        finally:
            for handle in handles:
                handle.remove()

    def _hold(self, _: nn.Module, inputs: tuple[torch.Tensor, ...]) -> None:
        self.first_layer_rows.append(int(inputs[0].shape[0]))
        if inputs[0].shape[0] == self.rows:
            self.entered.set()
            assert self._gate.wait(WAIT_S), "layer never released"

    def _count_last(self, *_: Any) -> None:
        self.last_layer_runs += 1

    def release(self) -> None:
        self._gate.set()


def dropped(app: Any, reason: str, stage: str) -> float:
    text = app.state.metrics.exposition()[0].decode()
    return metric_value(text, "bayesgate_jobs_dropped_total", reason=reason, stage=stage)


async def test_a_job_past_its_deadline_in_the_engine_is_answered_only_once_stopped(
    serving: Callable[[Settings], Any], make_settings: Callable[..., Settings]
) -> None:
    async with serving(make_settings(max_batch_size=64)) as (app, _):
        worker = app.state.worker
        succeeded = worker.stats.snapshot()["requests_succeeded"]
        with LayerGate(worker.model.network, rows=4).installed() as gate:
            late = asyncio.create_task(worker.predict(torch.rand(4, 1, 28, 28), 3, timeout_s=0.3))
            await until(gate.entered.is_set)
            await asyncio.sleep(0.6)  # the deadline has passed while the job is in the engine
            answered_while_computing = late.done()
            gate.release()
            with pytest.raises(DeadlineExceeded, match=r"request timeout of 0\.3 s"):
                await late
        assert not answered_while_computing  # the old worker answered 504 at the deadline
        assert gate.last_layer_runs == 0  # stopped before its next layer: never finished
        assert worker.stats.snapshot()["requests_succeeded"] == succeeded
        assert dropped(app, "deadline", "computing") == 1
        assert dropped(app, "deadline", "queued") == 0


async def test_a_gone_client_is_dropped_from_its_engine_call_and_the_others_run_again(
    serving: Callable[[Settings], Any], make_settings: Callable[..., Settings]
) -> None:
    """Two unseeded jobs (2 and 3 images) share one engine call; the 3-image job's client hangs
    up while the call is held: the call stops, the 2-image job runs again alone."""
    settings = make_settings(max_batch_size=64, max_queue_delay_ms=200.0)
    async with serving(settings) as (app, _):
        worker = app.state.worker
        hang_up = asyncio.Event()
        with LayerGate(worker.model.network, rows=5).installed() as gate:
            kept = asyncio.create_task(
                worker.predict(torch.rand(2, 1, 28, 28), 3, timeout_s=WAIT_S)
            )
            gone = asyncio.create_task(
                worker.predict(
                    torch.rand(3, 1, 28, 28), 3, timeout_s=WAIT_S, client_gone=hang_up.wait
                )
            )
            await until(gate.entered.is_set)
            hang_up.set()
            await asyncio.sleep(0.3)
            answered_while_computing = gone.done()
            gate.release()
            with pytest.raises(ClientGone):
                await gone
            assert len(await kept) == 2
        assert not answered_while_computing
        assert gate.first_layer_rows == [5, 2]  # the shared call, then the kept job alone
        assert gate.last_layer_runs == 1  # only the kept job's call finished
        assert dropped(app, "client_gone", "computing") == 1


@pytest.mark.parametrize("features", [False, True])
def test_checkpoints_change_no_number_and_check_before_every_layer(
    tiny_model_dir: Any, features: bool
) -> None:
    network = load_served_model(tiny_model_dir, "cpu").network
    x = torch.rand(6, 1, 28, 28)

    reference = mc_engine(network, x, 7, torch.Generator().manual_seed(11), features=features)
    checks = 0

    def count() -> None:
        nonlocal checks
        checks += 1

    with checkpoints(network, count) as hooked:
        checked = mc_engine(network, x, 7, torch.Generator().manual_seed(11), features=features)
    if features:
        assert torch.equal(checked.probs, reference.probs)
        assert checked.features.keys() == reference.features.keys()
        for name in reference.features:
            assert torch.equal(checked.features[name], reference.features[name])
    else:
        assert torch.equal(checked, reference)
    assert hooked == len(leaves(network)) and checks >= hooked  # every layer ran checked
    after = checks
    mc_engine(network, x, 7, None, features=features)  # outside the block: not checked
    assert checks == after


def test_a_check_that_raises_stops_the_call_and_other_threads_are_not_checked(
    tiny_model_dir: Any,
) -> None:
    network = load_served_model(tiny_model_dir, "cpu").network
    x = torch.rand(2, 1, 28, 28)

    def stop() -> None:
        raise CallStopped

    with checkpoints(network, stop):
        with pytest.raises(CallStopped):
            mc_engine(network, x, 3, None)
        other: list[torch.Tensor] = []
        thread = threading.Thread(target=lambda: other.append(mc_engine(network, x, 3, None)))
        thread.start()
        thread.join(WAIT_S)
    assert other and other[0].shape == (2, 3, 10)
