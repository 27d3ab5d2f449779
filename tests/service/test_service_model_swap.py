"""The served model has one owner (the worker), and every answer names the model that computed
it — even when an admin reload lands between a request's arrival and its batch."""

from __future__ import annotations

import asyncio
import dataclasses
import shutil
import threading
from collections.abc import Callable
from pathlib import Path
from typing import Any

import pytest
import torch
from torch import nn

from bayesgate.models.store.calibration import read_calibration, write_calibration
from bayesgate.models.store.directory import load_model, save_model
from bayesgate.service.engine import Engine, mc_engine
from bayesgate.service.served_model import ServedModel
from bayesgate.service.settings import Settings

pytestmark = pytest.mark.anyio

KEY = "0123456789abcdef-admin"
INFER = "/v2/models/tiny-mlp/infer"


def retrained(source: Path, target: Path) -> tuple[str, nn.Module]:
    """``source``'s model with perturbed weights (a new sha256) and its calibration re-tied to
    them, written to ``target``; returns the new sha256 and the network."""
    loaded = load_model(source)
    with torch.no_grad():
        generator = torch.Generator().manual_seed(7)
        for p in loaded.network.parameters():
            p.add_(0.2 * torch.randn(p.shape, generator=generator))
    card = save_model(loaded.network, loaded.card, target)
    calibration = read_calibration(source)
    calibration = dataclasses.replace(calibration, model_sha256=card.weights_sha256, k=7)
    write_calibration(calibration, target)
    return card.weights_sha256, loaded.network


def gated(engine: Engine, gate: threading.Event, calls: list[int]) -> Engine:
    """``engine`` whose first call waits (in the worker thread) until ``gate`` is set."""

    def run(net: nn.Module, x: torch.Tensor, k: int, g: torch.Generator | None) -> torch.Tensor:
        calls.append(x.shape[0])
        if len(calls) == 1:
            assert gate.wait(10), "the test never opened the gate"
        return engine(net, x, k, g)

    return run


async def wait_for(condition: Callable[[], bool], timeout: float = 10.0) -> None:
    for _ in range(int(timeout / 0.01)):
        if condition():
            return
        await asyncio.sleep(0.01)
    raise AssertionError("condition not reached in time")


async def test_an_answer_names_the_weights_that_computed_it_across_a_reload(
    serving: Callable[[Settings], Any],
    make_settings: Callable[..., Settings],
    tiny_model_dir: Path,
    tmp_path: Path,
) -> None:
    """A request queued behind a busy batch, then a reload, then its batch: its numbers come from
    the new weights, so its model reference (v1 ``model``, v2 ``parameters``) must be the new one
    — not the model that was current when the request arrived."""
    store = tmp_path / "store"
    shutil.copytree(tiny_model_dir, store)
    new_sha, new_net = retrained(tiny_model_dir, tmp_path / "new")
    old_sha = load_model(store).card.weights_sha256
    x = torch.rand(2, 1, 28, 28, generator=torch.Generator().manual_seed(3))
    v1_body = {"instances": x.tolist(), "mc_samples": 4, "seed": 11}
    v2_body = {
        "inputs": [
            {"name": "input", "datatype": "FP32", "shape": [2, 1, 28, 28], "data": x.tolist()}
        ],
        "parameters": {"mc_samples": 4, "seed": 11},
        "outputs": [{"name": "probabilities"}],
    }
    gate, calls = threading.Event(), []
    settings = make_settings(model_dir=store, api_key=KEY, max_queue_delay_ms=0.0)
    async with serving(settings) as (app, client):
        app.state.worker.engine = gated(mc_engine, gate, calls)
        busy = asyncio.create_task(client.post("/v1/predict", json={"instances": [[0.0] * 784]}))
        await wait_for(lambda: len(calls) == 1)  # the worker is inside the busy batch
        v1 = asyncio.create_task(client.post("/v1/predict", json=v1_body))
        v2 = asyncio.create_task(client.post(INFER, json=v2_body))
        await wait_for(lambda: app.state.worker.queue_depth() == 2)  # both arrived, queued
        for name in ("model.safetensors", "card.json", "calibration.json"):
            shutil.copy(tmp_path / "new" / name, store / name)
        reload = await client.post("/admin/reload", headers={"Authorization": f"Bearer {KEY}"})
        assert reload.status_code == 200 and reload.json()["weights_sha256"] == new_sha
        gate.set()
        busy_answer, v1_answer, v2_answer = (
            (await busy).json(),
            (await v1).json(),
            (await v2).json(),
        )

    expected = mc_engine(new_net, x, 4, torch.Generator().manual_seed(11))
    assert busy_answer["model"]["weights_sha256"] == old_sha  # computed before the reload
    assert v1_answer["model"] == {"name": "tiny-mlp", "weights_sha256": new_sha}
    assert v1_answer["calibration_mc_samples"] == 7  # the new calibration's K
    got = torch.tensor([p["probabilities"] for p in v1_answer["predictions"]])
    torch.testing.assert_close(got, expected.mean(dim=1), rtol=1e-5, atol=1e-6)
    assert v2_answer["parameters"]["weights_sha256"] == new_sha
    assert v2_answer["parameters"]["calibration_mc_samples"] == 7
    torch.testing.assert_close(
        torch.tensor(v2_answer["outputs"][0]["data"]).view(2, -1), expected.mean(dim=1)
    )


async def test_the_worker_is_the_one_owner_of_the_served_model(
    serving: Callable[[Settings], Any], make_settings: Callable[..., Settings]
) -> None:
    """No copy of the served model is kept beside the worker's: replacing the worker's model is
    all an admin change does, and every route sees it at once."""
    async with serving(make_settings()) as (app, client):
        state = vars(app.state)["_state"]
        assert [k for k, v in state.items() if isinstance(v, ServedModel)] == []
        worker = app.state.worker
        calibration = dataclasses.replace(worker.model.calibration, score="variation_ratio")
        worker.model = dataclasses.replace(worker.model, calibration=calibration)
        models = (await client.get("/v1/models")).json()["models"]
        row = (await client.post("/v1/predict", json={"instances": [[0.0] * 784]})).json()
    assert models[0]["calibration"]["score"] == "variation_ratio"
    assert row["predictions"][0]["score_name"] == "variation_ratio"
