"""The Open Inference Protocol over gRPC, in-process (the app's lifespan starts the server on a
free port): stock ``tritonclient.grpc`` (its asyncio client, default arguments: raw input and
output contents) answers equal to ``/v1/predict`` for the same seed; metadata and config; errors
mapped to gRPC status codes; the server stops with the app."""

from __future__ import annotations

import asyncio
from collections.abc import Callable
from typing import Any

import numpy as np
import pytest
import torch

from bayesgate.service.settings import Settings

pytestmark = pytest.mark.anyio
grpcclient = pytest.importorskip("tritonclient.grpc.aio")
K, SEED = 5, 31


def _input(x: np.ndarray, name: str = "input", datatype: str = "FP32") -> Any:
    tensor = grpcclient.InferInput(name, list(x.shape), datatype)
    tensor.set_data_from_numpy(x)  # default: raw_input_contents
    return tensor


async def test_stock_grpc_client_equals_v1_and_metadata(
    serving: Callable[[Settings], Any], make_settings: Callable[..., Settings]
) -> None:
    x = torch.rand(3, 1, 28, 28, generator=torch.Generator().manual_seed(6)).numpy()
    params = {"mc_samples": K, "seed": SEED}
    async with serving(make_settings(grpc_port=0, max_instances=8)) as (app, client):
        grpc = grpcclient.InferenceServerClient(f"127.0.0.1:{app.state.grpc_port}")
        try:
            live, ready = await grpc.is_server_live(), await grpc.is_server_ready()
            model_ready = await grpc.is_model_ready("tiny-mlp")
            index = await grpc.get_model_repository_index(as_json=True)
            server = await grpc.get_server_metadata(as_json=True)
            meta = await grpc.get_model_metadata("tiny-mlp", as_json=True)
            config = (await grpc.get_model_config("tiny-mlp", as_json=True))["config"]
            everything = await grpc.infer("tiny-mlp", [_input(x)], parameters=params)
            # Triton's per-request timeout (µs) is a parameter the server takes
            timed = await grpc.infer("tiny-mlp", [_input(x)], parameters=params, timeout=10**7)
            chosen = await grpc.infer(
                "tiny-mlp",
                [_input(x)],
                outputs=[grpcclient.InferRequestedOutput(n) for n in ("label", "probabilities")],
                request_id="g-1",
                parameters=params,
            )
        finally:
            await grpc.close()
        v1 = await client.post("/v1/predict", json={"instances": x.tolist(), **params})
        http_meta = (await client.get("/v2/models/tiny-mlp")).json()
    assert live and ready and model_ready
    assert index == {"models": [{"name": "tiny-mlp", "state": "READY"}]}  # version "" omitted
    assert server["name"] == "bayesgate" and "binary_tensor_data" in server["extensions"]
    assert meta["inputs"] == [
        {"name": "input", "datatype": "FP32", "shape": ["-1", "1", "28", "28"]}
    ]
    assert [o["name"] for o in meta["outputs"]] == [o["name"] for o in http_meta["outputs"]]
    assert config["max_batch_size"] == 8
    assert config["input"] == [
        {"name": "input", "data_type": "TYPE_FP32", "dims": ["1", "28", "28"]}
    ]
    rows = v1.json()["predictions"]
    response = everything.get_response(as_json=True)
    assert [o["name"] for o in response["outputs"]] == [o["name"] for o in http_meta["outputs"]]
    assert response["parameters"]["seed"]["int64_param"] == str(SEED)
    assert chosen.get_response().id == "g-1"
    assert [o.name for o in chosen.get_response().outputs] == ["label", "probabilities"]
    for result in (everything, chosen, timed):
        probs = result.as_numpy("probabilities")
        assert probs.dtype == np.float32 and probs.shape == (3, 10)
        assert probs.tolist() == np.asarray([r["probabilities"] for r in rows], np.float32).tolist()
        assert result.as_numpy("label").tolist() == [r["label"] for r in rows]
    for name in ("adversarial", "score", "mutual_information", "epistemic_variance"):
        expected = np.asarray([r[name] for r in rows])
        np.testing.assert_array_equal(
            everything.as_numpy(name), expected.astype(everything.as_numpy(name).dtype)
        )


async def test_grpc_errors_map_to_status_codes(
    serving: Callable[[Settings], Any], make_settings: Callable[..., Settings]
) -> None:
    from tritonclient.utils import InferenceServerException

    x = np.full((1, 1, 28, 28), 0.5, np.float32)
    cases = [
        ("other", [_input(x)], {}, "StatusCode.NOT_FOUND", "'other'"),
        ("tiny-mlp", [_input(x[:, :, :14])], {}, "StatusCode.INVALID_ARGUMENT", "shape"),
        ("tiny-mlp", [_input(x * 3)], {}, "StatusCode.INVALID_ARGUMENT", "[0, 1]"),
        ("tiny-mlp", [_input(x, "pixels")], {}, "StatusCode.INVALID_ARGUMENT", "'pixels'"),
        (
            "tiny-mlp",
            [_input(x.astype(np.float64), datatype="FP64")],
            {},
            "StatusCode.INVALID_ARGUMENT",
            "FP64",
        ),
        (
            "tiny-mlp",
            [_input(x)],
            {"mc_samples": 10**6},
            "StatusCode.INVALID_ARGUMENT",
            "mc_samples",
        ),
        ("tiny-mlp", [_input(x)], {"k": 3}, "StatusCode.INVALID_ARGUMENT", "'k'"),
    ]
    async with serving(make_settings(grpc_port=0)) as (app, _):
        grpc = grpcclient.InferenceServerClient(f"127.0.0.1:{app.state.grpc_port}")
        try:
            for model, inputs, params, code, fragment in cases:
                with pytest.raises(InferenceServerException) as err:
                    await grpc.infer(model, inputs, parameters=params or None)
                assert err.value.status() == code, (fragment, err.value)
                assert fragment in err.value.message(), err.value.message()
            with pytest.raises(InferenceServerException) as missing:
                await grpc.get_model_metadata("other")
            assert app.state.worker.stats.snapshot()["engine_calls"] == 0
            app.state.ready = False  # as before the warm-up or after shutdown began
            with pytest.raises(InferenceServerException) as unavailable:
                await grpc.infer("tiny-mlp", [_input(x)])
            assert not await grpc.is_server_ready()
            app.state.ready = True
        finally:
            await grpc.close()
    assert missing.value.status() == "StatusCode.NOT_FOUND"
    assert unavailable.value.status() == "StatusCode.UNAVAILABLE"


async def test_grpc_is_off_by_default_and_stops_with_the_app(
    serving: Callable[[Settings], Any], make_settings: Callable[..., Settings]
) -> None:
    from tritonclient.utils import InferenceServerException

    async with serving(make_settings()) as (app, _):
        assert getattr(app.state, "grpc_port", None) is None
    async with serving(make_settings(grpc_port=0)) as (app, _):
        port = app.state.grpc_port
    grpc = grpcclient.InferenceServerClient(f"127.0.0.1:{port}")
    try:
        with pytest.raises(InferenceServerException) as gone:
            # asyncio's deadline: ``client_timeout`` is newer than tritonclient 2.40 (the floor)
            await asyncio.wait_for(grpc.is_server_live(), timeout=30)
    finally:
        await grpc.close()
    assert gone.value.status() in ("StatusCode.UNAVAILABLE", "StatusCode.DEADLINE_EXCEEDED")


async def test_a_grpc_call_given_up_by_its_client_is_not_computed(
    serving: Callable[[Settings], Any], make_settings: Callable[..., Settings]
) -> None:
    """The client's deadline bounds the job (``time_remaining``), and a call the client cancels
    drops its job: queued behind a held engine call, a 2-image call whose 0.3-s deadline passes
    is never computed; a 3-image call held in the engine past its deadline is stopped before its
    next layer. Before, both were computed for nobody and counted nowhere."""
    from test_service_admission import WAIT_S, until
    from test_service_admission_computing import LayerGate, dropped
    from tritonclient.utils import InferenceServerException

    settings = make_settings(grpc_port=0, max_batch_size=64, request_timeout_s=WAIT_S)
    async with serving(settings) as (app, _):
        worker = app.state.worker
        grpc = grpcclient.InferenceServerClient(f"127.0.0.1:{app.state.grpc_port}")
        x = np.random.default_rng(0).random((3, 1, 28, 28), dtype=np.float32)
        succeeded = worker.stats.snapshot()["requests_succeeded"]
        try:
            with LayerGate(worker.model.network, rows=4).installed() as gate:
                busy = asyncio.create_task(worker.predict(torch.rand(4, 1, 28, 28), 1))
                await until(gate.entered.is_set)
                with pytest.raises(InferenceServerException) as queued:
                    await grpc.infer("tiny-mlp", [_input(x[:2])], client_timeout=0.3)
                await asyncio.sleep(0.2)  # the server side gives up too
                gate.release()
                await busy
                await asyncio.sleep(0.3)
            assert queued.value.status() == "StatusCode.DEADLINE_EXCEEDED"
            assert gate.first_layer_rows == [4]  # the 2-image job never reached the engine
            # counted as a missed deadline (the client's), whichever side noticed first
            assert dropped(app, "deadline", "queued") == 1
            assert dropped(app, "client_gone", "queued") == 0

            with LayerGate(worker.model.network, rows=3).installed() as gate:
                call = asyncio.create_task(
                    grpc.infer(
                        "tiny-mlp", [_input(x)], parameters={"mc_samples": 1}, client_timeout=0.3
                    )
                )
                await until(gate.entered.is_set)
                with pytest.raises(InferenceServerException) as computing:
                    await call
                await asyncio.sleep(0.2)
                gate.release()
                await until(lambda: dropped(app, "deadline", "computing") == 1)
            assert computing.value.status() == "StatusCode.DEADLINE_EXCEEDED"
            assert gate.last_layer_runs == 0  # stopped before its next layer
            assert worker.stats.snapshot()["requests_succeeded"] == succeeded + 1  # `busy` only
        finally:
            await grpc.close()


async def test_grpc_refuses_what_http_v2_refuses(
    serving: Callable[[Settings], Any], make_settings: Callable[..., Settings]
) -> None:
    """The protobuf request goes through the ``/v2`` checks whole: a model version (the model
    has none), raw bytes and ``contents`` together, a ``binary_data_size`` that is not the raw
    bytes' size and an unknown output parameter are refused on gRPC as on HTTP — where they used
    to be ignored, overwritten or dropped."""
    import grpc as grpc_lib
    from tritonclient.grpc import service_pb2 as pb
    from tritonclient.grpc import service_pb2_grpc as pb_grpc

    x = np.full((1, 1, 28, 28), 0.5, np.float32)

    def request(**changes: Any) -> Any:
        message = pb.ModelInferRequest(model_name="tiny-mlp")
        tensor = message.inputs.add(name="input", datatype="FP32", shape=[1, 1, 28, 28])
        message.raw_input_contents.append(x.tobytes())
        for key, value in changes.items():
            if key == "version":
                message.model_version = value
            elif key == "contents":
                tensor.contents.fp32_contents.extend(x.ravel().tolist())
            elif key == "size":
                tensor.parameters["binary_data_size"].int64_param = value
            elif key == "output_parameter":
                message.outputs.add(name="label").parameters["classification"].int64_param = 3
        return message

    async with serving(make_settings(grpc_port=0)) as (app, client):
        async with grpc_lib.aio.insecure_channel(f"127.0.0.1:{app.state.grpc_port}") as channel:
            stub = pb_grpc.GRPCInferenceServiceStub(channel)
            assert (await stub.ModelInfer(request())).model_name == "tiny-mlp"
            assert (await stub.ModelInfer(request(size=784 * 4))).model_name == "tiny-mlp"
            cases = [
                (request(version="42"), "NOT_FOUND", "has no version '42'"),
                (request(contents=True), "INVALID_ARGUMENT", "not both"),
                (request(size=100), "INVALID_ARGUMENT", "binary_data_size"),
                (request(output_parameter=True), "INVALID_ARGUMENT", "classification"),
            ]
            for message, code, fragment in cases:
                with pytest.raises(grpc_lib.aio.AioRpcError) as err:
                    await stub.ModelInfer(message)
                assert err.value.code().name == code, (fragment, err.value)
                assert fragment in err.value.details(), err.value.details()
            for rpc, versioned in (
                (stub.ModelReady, pb.ModelReadyRequest(name="tiny-mlp", version="1")),
                (stub.ModelMetadata, pb.ModelMetadataRequest(name="tiny-mlp", version="1")),
            ):
                with pytest.raises(grpc_lib.aio.AioRpcError) as err:
                    await rpc(versioned)
                assert err.value.code().name == "NOT_FOUND"
            assert (await stub.ModelReady(pb.ModelReadyRequest(name="tiny-mlp"))).ready
        for path in ("", "/ready", "/infer", "/config"):
            method = client.post if path == "/infer" else client.get
            r = await method(f"/v2/models/tiny-mlp/versions/1{path}")
            assert r.status_code == 404, (path, r.text)
            assert "has no version '1'" in r.json()["error"], r.text
        assert app.state.worker.stats.snapshot()["requests_succeeded"] == 2
