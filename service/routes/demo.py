"""The demo page (``GET /`` and its static files), its settings (``GET /v1/demo``) and the
demo-only attack route (``POST /v1/attack``).

The page is plain HTML/CSS and one JavaScript module shipped in ``bayesgate/service/static``; it
calls only public routes (``/v1/models``, ``/v1/demo``, ``/v1/predict/file``, ``/v1/attack``).

``POST /v1/attack`` answers 404 unless the server runs with ``BAYESGATE_DEMO=true``
(``bayesgate serve --demo``). It attacks one image (:mod:`bayesgate.service.demo_attack`, in a
thread, never on the event loop), at most ``demo_attack_concurrency`` at a time — one more gets
503 with ``Retry-After`` at once, so attacks never queue up in front of prediction traffic — and
answers the original and each adversarial image through the inference worker with the request's
seed, exactly as ``/v1/predict`` would.
"""

from __future__ import annotations

import asyncio
from collections.abc import Callable
from functools import cache
from importlib import resources
from typing import Annotated, Any, Literal, TypeVar

import torch
from fastapi import APIRouter, Depends, Request
from fastapi.responses import HTMLResponse, Response
from pydantic import BaseModel, ConfigDict, Field, ValidationError
from starlette.exceptions import HTTPException as StarletteHTTPException

from bayesgate.attacks.methods import Attack
from bayesgate.service.demo_attack import (
    AttackNetwork,
    attacks_available,
    make_attack,
    run_attacks,
)
from bayesgate.service.deps import ServedDep, SettingsDep, WorkerDep, default_mc_samples
from bayesgate.service.errors import (
    AttackBusy,
    DemoDisabled,
    InvalidInput,
    ServiceError,
    UnsupportedMediaType,
    describe_validation_errors,
    out_of_range,
)
from bayesgate.service.inputs import decode_images, decode_instances
from bayesgate.service.prediction import Prediction
from bayesgate.service.request_body import parse_json
from bayesgate.service.schemas import MAX_SEED, InstancePrediction, ModelRef, error_responses
from bayesgate.service.served_model import ServedModel
from bayesgate.service.settings import Settings

T = TypeVar("T")

page_router = APIRouter(include_in_schema=False)
router = APIRouter(tags=["demo"])

MAX_ETAS = 21  # FGS step sizes in one request: 0, 0.05, …, 1 is 21
DEFAULT_ATTACK_MC_SAMPLES = 10  # K of the gradient passes, as in the paper's attacks
# The page and what it loads; nothing else under /static is served.
STATIC_FILES = {
    "app.js": "text/javascript; charset=utf-8",
    "style.css": "text/css; charset=utf-8",
    "digits.png": "image/png",
    "digits.json": "application/json",
}
# Same-origin scripts, styles and fetches only; images may be data:/blob: URLs (canvas exports).
PAGE_HEADERS = {
    "Content-Security-Policy": "default-src 'self'; img-src 'self' data: blob:; "
    "object-src 'none'; base-uri 'none'; frame-ancestors 'none'",
    "X-Content-Type-Options": "nosniff",
    "Cache-Control": "no-cache",
}


@cache
def _static(name: str) -> bytes:
    return resources.files("bayesgate.service").joinpath("static", name).read_bytes()


@page_router.api_route("/", methods=["GET", "HEAD"], response_class=HTMLResponse)
async def page() -> Response:
    """The demo page: draw or pick a digit, see the answer; attack it when the demo is on."""
    return Response(_static("index.html"), media_type="text/html", headers=PAGE_HEADERS)


@page_router.get("/static/{name}")
async def static_file(name: str) -> Response:
    """One of the page's files; any other name is the service's JSON 404 (``http_error``)."""
    if name not in STATIC_FILES:
        raise StarletteHTTPException(
            404, f"no static file {name[:80]!r}; the page's files are {', '.join(STATIC_FILES)}"
        )
    return Response(_static(name), media_type=STATIC_FILES[name], headers=PAGE_HEADERS)


class AttackLimits(BaseModel):
    enabled: bool = Field(description="POST /v1/attack is on (BAYESGATE_DEMO)")
    methods: list[str]
    max_etas: int = Field(description="most FGS step sizes in one request")
    max_steps: int = Field(description="most PGD steps")
    max_attack_mc_samples: int = Field(description="most MC passes in the attack's gradient")
    default_attack_mc_samples: int


class DemoConfig(BaseModel):
    """What the page needs to know about this server before the model is ready."""

    attack: AttackLimits
    docs_url: str | None = Field(description="the interactive API docs, if served")
    max_mc_samples: int


@router.get("/demo", response_model=DemoConfig)
async def demo_config(settings: SettingsDep) -> dict[str, Any]:
    """The page's settings: whether the attack panel is on, and its limits."""
    return {
        "attack": {
            "enabled": settings.demo,
            "methods": ["fgs", "pgd"],
            "max_etas": MAX_ETAS,
            "max_steps": settings.demo_max_attack_steps,
            "max_attack_mc_samples": settings.demo_max_attack_mc_samples,
            "default_attack_mc_samples": min(
                DEFAULT_ATTACK_MC_SAMPLES, settings.demo_max_attack_mc_samples
            ),
        },
        "docs_url": "/docs" if settings.docs else None,
        "max_mc_samples": settings.max_mc_samples,
    }


Unit = Annotated[float, Field(ge=0, le=1)]


class AttackRequest(BaseModel):
    """``POST /v1/attack``: one image (``image`` or ``instance``) and the attack's parameters."""

    model_config = ConfigDict(extra="forbid")

    image: str | None = Field(
        None, description="base64 PNG, grayscale (bit depth 1–8) 28×28 (a data: URL is accepted)"
    )
    instance: list[Any] | None = Field(
        None, description="the image as nested lists (28×28 or 1×28×28) or flat 784, in [0,1]"
    )
    method: Literal["fgs", "pgd"] = Field("fgs", description="fgs or pgd (untargeted, L∞)")
    etas: list[Unit] | None = Field(
        None, description=f"FGS: step sizes η (1 … {MAX_ETAS}); one adversarial image per η"
    )
    eps: float | None = Field(None, gt=0, le=1, description="PGD: radius ε of the L∞ ball")
    steps: int | None = Field(
        None, ge=1, description="PGD: steps (≤ BAYESGATE_DEMO_MAX_ATTACK_STEPS)"
    )
    eps_iter: float | None = Field(
        None, gt=0, le=1, description="PGD: step size (default min(ε, 2.5·ε/steps))"
    )
    mc_samples: int | None = Field(
        None, description="K of the answers, as in /v1/predict (default: the server's)"
    )
    attack_mc_samples: int = Field(
        DEFAULT_ATTACK_MC_SAMPLES, ge=1, description="K of the attack's gradient passes"
    )
    seed: int = Field(
        0, ge=0, le=MAX_SEED, description="seed of the masks (attack and answers) and PGD's start"
    )


class AttackResult(BaseModel):
    model_config = ConfigDict(from_attributes=True)

    attack: str = Field(description="the attack as a spec, e.g. fgs:eta=0.2 (bayesgate attack)")
    eta: float | None = Field(None, description="FGS step size")
    eps: float | None = Field(None, description="PGD radius")
    steps: int | None = Field(None, description="PGD steps")
    linf: float = Field(description="‖x' − x‖∞")
    instance: list[Any] = Field(description="the adversarial image in [0,1] (e.g. 28×28)")
    prediction: InstancePrediction


class AttackResponse(BaseModel):
    model_config = ConfigDict(from_attributes=True)

    model: ModelRef
    method: str
    mc_samples: int
    attack_mc_samples: int
    seed: int
    original: InstancePrediction
    results: list[AttackResult]


class AttackSlots:
    """At most ``n`` attacks at once; the next one is refused (never queued)."""

    def __init__(self, n: int) -> None:
        self.semaphore = asyncio.Semaphore(n)
        self.network = AttackNetwork()


async def finish_thread(fn: Callable[..., T], *args: Any, **kwargs: Any) -> T:
    """``fn(*args, **kwargs)`` in a worker thread, awaited so that cancelling the request (the
    client hung up) still waits for the thread to end before the cancellation propagates.

    A thread cannot be stopped, so releasing the attack slot at cancellation would let a new
    attack start beside one still running: the slot stays taken until the CPU work is over.
    """
    task = asyncio.ensure_future(asyncio.to_thread(fn, *args, **kwargs))
    try:
        return await asyncio.shield(task)
    except asyncio.CancelledError:
        while not task.done():
            try:
                await asyncio.wait([task])
            except asyncio.CancelledError:
                continue
        raise


async def demo_enabled(request: Request, settings: SettingsDep) -> AttackSlots:
    """404 unless the demo is on; the attack slots (made on first use)."""
    if not settings.demo:
        raise DemoDisabled(
            "POST /v1/attack is off on this server (start it with `bayesgate serve --demo` "
            "or BAYESGATE_DEMO=true)"
        )
    slots = getattr(request.app.state, "attack_slots", None)
    if slots is None:
        slots = request.app.state.attack_slots = AttackSlots(settings.demo_attack_concurrency)
    return slots


async def attack_request(request: Request) -> AttackRequest:
    """The JSON body, validated; 415/422 as for ``/v1/predict`` (never FastAPI's 400)."""
    media_type = request.headers.get("content-type", "")
    if media_type.split(";")[0].strip().lower() != "application/json":
        raise UnsupportedMediaType(
            f"Content-Type must be application/json, got {media_type or 'none'}"
        )
    payload = parse_json(await request.body())
    if not isinstance(payload, dict):
        raise InvalidInput("body: expected a JSON object")
    try:
        return AttackRequest.model_validate(payload)
    except ValidationError as exc:
        errors = [out_of_range(AttackRequest, e) for e in exc.errors()]
        raise InvalidInput(describe_validation_errors(errors)) from None


@router.post(
    "/attack",
    response_model=AttackResponse,
    responses=error_responses(404, 413, 415, 422, 500, 503, 504),
    openapi_extra={
        "requestBody": {
            "required": True,
            "content": {"application/json": {"schema": AttackRequest.model_json_schema()}},
        }
    },
)
async def attack(
    slots: Annotated[AttackSlots, Depends(demo_enabled)],
    req: Annotated[AttackRequest, Depends(attack_request)],
    settings: SettingsDep,
    served: ServedDep,
    worker: WorkerDep,
) -> AttackResponse:
    """Attack one image (demo only): FGS at each η of ``etas``, or PGD; both answers."""
    attacks = requested_attacks(req, settings)
    x = decode_one(req, served, settings)
    k = default_mc_samples(settings, served) if req.mc_samples is None else req.mc_samples
    if not 1 <= k <= settings.max_mc_samples:
        raise InvalidInput(
            f"mc_samples: expected an integer in 1 … {settings.max_mc_samples}, got {k}"
        )
    if (problem := attacks_available()) is not None:
        raise ServiceError(problem)
    if slots.semaphore.locked():
        raise AttackBusy(
            f"{settings.demo_attack_concurrency} attack(s) already running; retry shortly"
        )
    async with slots.semaphore:
        original = await _answer(worker, x, k, req.seed, settings)
        network = await finish_thread(slots.network.for_model, served)
        advs = await finish_thread(
            run_attacks,
            network,
            x,
            original.label,
            attacks,
            k=req.attack_mc_samples,
            seed=req.seed,
        )
        answers = await asyncio.gather(*(_answer(worker, a, k, req.seed, settings) for a in advs))
    return AttackResponse.model_validate(
        {
            "model": original.model,  # the weights that answered the original
            "method": req.method,
            "mc_samples": k,
            "attack_mc_samples": req.attack_mc_samples,
            "seed": req.seed,
            "original": original,
            "results": [
                _result(attack, x, adv, answer)
                for attack, adv, answer in zip(attacks, advs, answers, strict=True)
            ],
        },
        from_attributes=True,
    )


def requested_attacks(req: AttackRequest, settings: Settings) -> list[Attack]:
    """The registry's attacks the request asks for (one per η for FGS), checked against each
    other and the server's limits."""
    if not req.attack_mc_samples <= settings.demo_max_attack_mc_samples:
        raise InvalidInput(
            f"attack_mc_samples: at most {settings.demo_max_attack_mc_samples} "
            f"(BAYESGATE_DEMO_MAX_ATTACK_MC_SAMPLES), got {req.attack_mc_samples}"
        )
    pgd_only = [n for n in ("eps", "steps", "eps_iter") if getattr(req, n) is not None]
    if req.method == "fgs":
        if pgd_only:
            verb = "applies" if len(pgd_only) == 1 else "apply"
            raise InvalidInput(f"{', '.join(pgd_only)}: only {verb} to method pgd")
        etas = req.etas if req.etas is not None else [0.1]
        if not 1 <= len(etas) <= MAX_ETAS:
            raise InvalidInput(f"etas: expected 1 … {MAX_ETAS} step sizes, got {len(etas)}")
        return [make_attack("fgs", eta=eta) for eta in etas]
    if req.etas is not None:
        raise InvalidInput("etas: only applies to method fgs (pgd takes eps, steps, eps_iter)")
    eps = 0.3 if req.eps is None else req.eps
    steps = 40 if req.steps is None else req.steps
    if steps > settings.demo_max_attack_steps:
        raise InvalidInput(
            f"steps: at most {settings.demo_max_attack_steps} "
            f"(BAYESGATE_DEMO_MAX_ATTACK_STEPS), got {steps}"
        )
    eps_iter = min(eps, 2.5 * eps / steps) if req.eps_iter is None else req.eps_iter
    if eps_iter > eps:
        raise InvalidInput(f"eps_iter: must not exceed eps ({eps}), got {eps_iter}")
    try:
        return [make_attack("pgd", eps=eps, eps_iter=eps_iter, steps=steps)]
    except ValueError as exc:  # the attack's own range checks
        raise InvalidInput(f"pgd: {exc}") from None


def decode_one(req: AttackRequest, served: ServedModel, settings: Settings) -> torch.Tensor:
    """The one image of the request as ``1×(input shape)`` in [0, 1]."""
    if (req.image is None) == (req.instance is None):
        raise InvalidInput("body: give exactly one of 'image' (base64 PNG) or 'instance' (array)")
    try:
        if req.image is not None:
            return decode_images([req.image], served.input_shape, 1)
        return decode_instances([req.instance], served.input_shape, served.input_range, 1)
    except InvalidInput as exc:  # the decoders name /v1's lists; this body has one field
        for listed, field in (("images[0]", "image"), ("instances[0]", "instance")):
            if exc.message.startswith(listed):
                raise InvalidInput(field + exc.message.removeprefix(listed)) from None
        raise


async def _answer(
    worker: WorkerDep, x: torch.Tensor, k: int, seed: int, settings: Settings
) -> Prediction:
    (answer,) = await worker.predict(
        x, k, seed=seed, return_samples=True, timeout_s=settings.request_timeout_s
    )
    return answer


def _result(
    attack: Attack, x: torch.Tensor, adv: torch.Tensor, answer: Prediction
) -> dict[str, Any]:
    image = adv[0]
    while image.dim() > 2 and image.shape[0] == 1:  # 1×28×28 → 28×28
        image = image[0]
    params = attack.params
    return {
        "attack": attack.key,
        "eta": params.get("eta"),
        "eps": params.get("eps"),
        "steps": params.get("steps"),
        "linf": float((adv - x).abs().max()),
        "instance": image.tolist(),
        "prediction": answer,
    }
