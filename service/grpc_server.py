"""The Open Inference Protocol over gRPC (KServe v2 ``inference.GRPCInferenceService``).

Off unless ``BAYESGATE_GRPC_PORT`` is set (Triton's convention is 8001); needs the extra
``bayesgate[grpc]`` (``tritonclient[grpc]``: grpcio and the generated KServe v2 messages and
service, ``tritonclient.grpc.service_pb2``/``service_pb2_grpc``, reused here server-side so no
protoc runs at install time). The server runs on the app's event loop (``grpc.aio``), starts
after the warm-up and stops, with the drain timeout as grace, before the worker does.

RPCs: ServerLive, ServerReady, ModelReady, ServerMetadata, ModelMetadata, ModelConfig,
RepositoryIndex and ModelInfer. ModelInfer is the ``/v2`` infer of
:mod:`bayesgate.service.inference_protocol` with the tensors in protobuf (the request becomes the
``/v2`` JSON payload, validated by the same
:class:`~bayesgate.service.inference_protocol.InferRequest`): the input from
``raw_input_contents[0]`` (little-endian float32, what ``tritonclient.grpc`` sends) or
``contents.fp32_contents``; each output in ``raw_output_contents`` (same order as ``outputs``).
The same worker answers, so the same input, seed and K give the numbers of ``/v1`` and ``/v2``.
Errors: bad request → INVALID_ARGUMENT, unknown model → NOT_FOUND, not ready / draining / queue
full → UNAVAILABLE, deadline → DEADLINE_EXCEEDED, inference failure → INTERNAL.
"""

from __future__ import annotations

import logging
import time
from typing import Any

import grpc
import numpy as np
from tritonclient.grpc import model_config_pb2 as config_pb
from tritonclient.grpc import service_pb2 as pb
from tritonclient.grpc import service_pb2_grpc as pb_grpc

from bayesgate.service.deps import default_mc_samples
from bayesgate.service.errors import (
    DeadlineExceeded,
    InferenceFailed,
    InvalidInput,
    ModelNotFound,
    NotReady,
    QueueFull,
    ServiceError,
)
from bayesgate.service.inference_protocol import (
    check_version,
    infer_request_model,
    infer_response,
    model_config,
    model_metadata,
    parse_infer_request,
    validated,
)
from bayesgate.service.oip_binary import DTYPES
from bayesgate.service.served_model import ServedModel

log = logging.getLogger("bayesgate.service")

STATUS: tuple[tuple[type[ServiceError], grpc.StatusCode], ...] = (
    (InvalidInput, grpc.StatusCode.INVALID_ARGUMENT),
    (ModelNotFound, grpc.StatusCode.NOT_FOUND),
    (DeadlineExceeded, grpc.StatusCode.DEADLINE_EXCEEDED),
    (NotReady, grpc.StatusCode.UNAVAILABLE),
    (QueueFull, grpc.StatusCode.UNAVAILABLE),
    (InferenceFailed, grpc.StatusCode.INTERNAL),
)


def status_code(exc: ServiceError) -> grpc.StatusCode:
    """The gRPC status of a domain error (first matching class; INTERNAL otherwise)."""
    for cls, code in STATUS:
        if isinstance(exc, cls):
            return code
    return grpc.StatusCode.INTERNAL


def _parameter(p: Any) -> Any:
    """An ``InferParameter`` (oneof bool/int64/string/double/uint64) as a Python value."""
    kind = p.WhichOneof("parameter_choice")
    return None if kind is None else getattr(p, kind)


def _set_parameter(p: Any, value: Any) -> None:
    if isinstance(value, bool):
        p.bool_param = value
    elif isinstance(value, int):
        p.int64_param = value
    elif isinstance(value, float):
        p.double_param = value
    else:
        p.string_param = str(value)


def _parameters(parameters: Any) -> dict[str, Any]:
    """``{"parameters": {...}}`` of a protobuf parameter map, or ``{}`` when it is empty."""
    if not parameters:
        return {}
    return {"parameters": {k: _parameter(v) for k, v in parameters.items()}}


def request_payload(request: Any) -> tuple[dict[str, Any], memoryview]:
    """A ``ModelInferRequest`` as the JSON payload of ``/v2`` infer plus its binary part: every
    parameter goes through (so an unknown one is refused as on HTTP), a ``binary_data_size`` the
    client gave is kept (and checked against the raw bytes), and an input may have raw bytes or
    ``contents``, not both."""
    payload: dict[str, Any] = {"inputs": []}
    if request.id:
        payload["id"] = request.id
    payload.update(_parameters(request.parameters))
    raw = list(request.raw_input_contents)
    for i, tensor in enumerate(request.inputs):
        item: dict[str, Any] = {
            "name": tensor.name,
            "datatype": tensor.datatype,
            "shape": list(tensor.shape),
        }
        item.update(_parameters(tensor.parameters))
        if i < len(raw):
            if tensor.HasField("contents"):
                raise InvalidInput(
                    f"inputs[{i}]: give either contents or raw_input_contents, not both"
                )
            # a size the client gave is checked against the bytes, as on HTTP
            item.setdefault("parameters", {}).setdefault("binary_data_size", len(raw[i]))
        else:
            item["data"] = list(tensor.contents.fp32_contents)
        payload["inputs"].append(item)
    if len(raw) > max(1, len(request.inputs)):
        raise InvalidInput(
            f"raw_input_contents: {len(raw)} entries for {len(request.inputs)} input(s)"
        )
    if request.outputs:
        payload["outputs"] = [
            {"name": o.name, **_parameters(o.parameters)} for o in request.outputs
        ]
    return payload, memoryview(raw[0] if raw else b"")


def infer_reply(body: dict[str, Any]) -> Any:
    """The ``/v2`` response body as a ``ModelInferResponse`` with raw output contents."""
    reply = pb.ModelInferResponse(model_name=body["model_name"], id=body.get("id", ""))
    for key, value in body["parameters"].items():
        _set_parameter(reply.parameters[key], value)
    for output in body["outputs"]:
        reply.outputs.add(name=output["name"], datatype=output["datatype"], shape=output["shape"])
        raw = np.asarray(output["data"], dtype=DTYPES[output["datatype"]]).tobytes()
        reply.raw_output_contents.append(raw)
    return reply


class InferenceServicer(pb_grpc.GRPCInferenceServiceServicer):
    """The KServe v2 gRPC service over the app's state (worker, settings, readiness)."""

    def __init__(self, state: Any, version: str) -> None:
        self.state = state
        self.version = version
        self.infer_request = infer_request_model(state.settings)

    # --- state ------------------------------------------------------------------------------

    def _served(self, ready: bool = False) -> ServedModel:
        if not getattr(self.state, "ready", False):
            raise NotReady("the model is not loaded and warmed up yet; retry shortly")
        if ready and getattr(self.state, "draining", False):
            raise NotReady("the server is shutting down (draining in-flight requests)")
        return self.state.worker.model

    def _model(self, name: str, ready: bool = False) -> ServedModel:
        served = self._served(ready)
        if name != served.name:
            raise ModelNotFound(f"unknown model {name!r}; this server serves {served.name!r}")
        return served

    # --- RPCs -------------------------------------------------------------------------------

    async def ServerLive(self, request: Any, context: Any) -> Any:  # RPC names are CamelCase
        return pb.ServerLiveResponse(live=True)

    async def ServerReady(self, request: Any, context: Any) -> Any:
        try:
            self._served(ready=True)
        except NotReady:
            return pb.ServerReadyResponse(ready=False)
        return pb.ServerReadyResponse(ready=True)

    async def ModelReady(self, request: Any, context: Any) -> Any:
        try:
            self._model(request.name, ready=True)
            check_version(request.name, request.version)
        except NotReady:
            return pb.ModelReadyResponse(ready=False)
        except ServiceError as exc:
            await context.abort(status_code(exc), exc.message)
        return pb.ModelReadyResponse(ready=True)

    async def RepositoryIndex(self, request: Any, context: Any) -> Any:
        """The one model, unversioned (as ``POST /v2/repository/index``)."""
        try:
            served = self._served()
        except ServiceError as exc:
            await context.abort(status_code(exc), exc.message)
        state = "UNAVAILABLE" if getattr(self.state, "draining", False) else "READY"
        reply = pb.RepositoryIndexResponse()
        reply.models.add(name=served.name, version="", state=state)
        return reply

    async def ServerMetadata(self, request: Any, context: Any) -> Any:
        from bayesgate.service.routes.v2 import EXTENSIONS, SERVER_NAME

        return pb.ServerMetadataResponse(
            name=SERVER_NAME, version=self.version, extensions=EXTENSIONS
        )

    async def ModelMetadata(self, request: Any, context: Any) -> Any:
        try:
            meta = model_metadata(self._model(request.name))
            check_version(request.name, request.version)
        except ServiceError as exc:
            await context.abort(status_code(exc), exc.message)
        reply = pb.ModelMetadataResponse(
            name=meta["name"], versions=meta["versions"], platform=meta["platform"]
        )
        for tensor in meta["inputs"]:
            reply.inputs.add(**tensor)
        for tensor in meta["outputs"]:
            reply.outputs.add(**tensor)
        return reply

    async def ModelConfig(self, request: Any, context: Any) -> Any:
        try:
            config = model_config(self._model(request.name), self.state.settings.max_instances)
            check_version(request.name, request.version)
        except ServiceError as exc:
            await context.abort(status_code(exc), exc.message)
        message = config_pb.ModelConfig(
            name=config["name"],
            platform=config["platform"],
            backend=config["backend"],
            max_batch_size=config["max_batch_size"],
        )
        for tensor in config["input"]:
            message.input.add(
                name=tensor["name"],
                data_type=config_pb.DataType.Value(tensor["data_type"]),
                dims=tensor["dims"],
            )
        for tensor in config["output"]:
            message.output.add(
                name=tensor["name"],
                data_type=config_pb.DataType.Value(tensor["data_type"]),
                dims=tensor["dims"],
            )
        return pb.ModelConfigResponse(config=message)

    async def ModelInfer(self, request: Any, context: Any) -> Any:
        arrived = time.monotonic()  # the deadlines count from here, as HTTP's from arrival
        try:
            return await self._infer(request, context.time_remaining(), arrived)
        except ServiceError as exc:
            if status_code(exc) in (grpc.StatusCode.INTERNAL, grpc.StatusCode.UNAVAILABLE):
                log.warning("gRPC ModelInfer %s: %s", exc.code, exc.message)
            await context.abort(status_code(exc), exc.message)

    async def _infer(
        self, request: Any, time_remaining: float | None = None, arrived: float | None = None
    ) -> Any:
        """``time_remaining``: seconds to the client's deadline (None: it set none). The job's
        deadline is the sooner of it and the request timeout, so a job whose caller has given up
        is not computed; a call the client cancels cancels this coroutine, and the worker then
        drops its job (:meth:`~bayesgate.service.worker.BatchWorker.predict`)."""
        settings = self.state.settings
        served = self._model(request.model_name)  # served while draining, like HTTP
        check_version(served.name, request.model_version)
        payload, blob = request_payload(request)
        body = validated(self.infer_request, payload)
        parsed = parse_infer_request(body, served, settings.max_instances, blob)
        timeout_s = parsed.timeout_s(settings.request_timeout_s)
        if time_remaining is not None:
            timeout_s = min(timeout_s, max(0.0, time_remaining))
        k = default_mc_samples(settings, served) if parsed.mc_samples is None else parsed.mc_samples
        predictions = await self.state.worker.predict(
            parsed.x, k, seed=parsed.seed, timeout_s=timeout_s, arrived=arrived
        )
        return infer_reply(infer_response(predictions, parsed, k))


async def start_grpc_server(state: Any, version: str, host: str, port: int) -> tuple[Any, int]:
    """A started ``grpc.aio`` server on ``host:port`` and its port (0: a free one)."""
    server = grpc.aio.server(
        options=[
            ("grpc.max_receive_message_length", state.settings.max_body_bytes),
            ("grpc.so_reuseport", 1),  # every worker process of `serve --workers N` binds it
        ]
    )
    pb_grpc.add_GRPCInferenceServiceServicer_to_server(InferenceServicer(state, version), server)
    bound = server.add_insecure_port(f"{host}:{port}")
    if bound == 0:
        raise OSError(f"gRPC: cannot bind {host}:{port}")
    await server.start()
    log.info("gRPC (KServe v2 GRPCInferenceService) on %s:%d", host, bound)
    return server, bound
