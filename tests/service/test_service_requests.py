"""Typed request bodies: strict validation (``true`` is not an integer, ``"5"`` not a number,
``"yes"`` not a boolean) on ``/v1`` as on ``/v2``, and an OpenAPI document that resolves and is
as strict as the server — checked by running the same bodies through both."""

from __future__ import annotations

import base64
import io
from collections.abc import AsyncIterator, Callable, Iterator
from typing import Any

import jsonschema
import pytest
from PIL import Image

from bayesgate.service.app import create_app
from bayesgate.service.routes import api_routers
from bayesgate.service.routes.demo import AttackRequest
from bayesgate.service.settings import Settings

pytestmark = pytest.mark.anyio

GOOD = [0.5] * 784
MAX_K, MAX_INSTANCES = 30, 4
INFER = "/v2/models/tiny-mlp/infer"


def png_b64() -> str:
    buffer = io.BytesIO()
    Image.new("L", (28, 28)).save(buffer, format="PNG")
    return base64.b64encode(buffer.getvalue()).decode()


def tensor(**parameters: Any) -> dict[str, Any]:
    body: dict[str, Any] = {
        "inputs": [{"name": "input", "datatype": "FP32", "shape": [1, 1, 28, 28], "data": GOOD}]
    }
    if parameters:
        body["parameters"] = parameters
    return body


# (id, /v1/predict body, fragments of the 422 message); each was accepted before (issue 18).
LOOSE_V1: list[tuple[str, dict[str, Any], list[str]]] = [
    ("K true", {"instances": [GOOD], "mc_samples": True}, ["mc_samples", "integer", "got True"]),
    ("K string", {"instances": [GOOD], "mc_samples": "5"}, ["mc_samples", "integer", "got '5'"]),
    ("samples yes", {"instances": [GOOD], "return_samples": "yes"}, ["return_samples", "boolean"]),
    ("samples 1", {"instances": [GOOD], "return_samples": 1}, ["return_samples", "boolean"]),
    ("seed string", {"instances": [GOOD], "seed": "7"}, ["seed", "integer"]),
    ("instances null", {"instances": None, "images": [png_b64()]}, ["instances", "list"]),
    ("images null", {"instances": [GOOD], "images": None}, ["images", "list"]),
    ("K above max", {"instances": [GOOD], "mc_samples": MAX_K + 1}, ["mc_samples", f"{MAX_K}"]),
]
LOOSE_V2: list[tuple[str, dict[str, Any], list[str]]] = [
    ("K true", tensor(mc_samples=True), ["parameters.mc_samples", "integer"]),
    ("K string", tensor(mc_samples="5"), ["parameters.mc_samples", "integer"]),
    ("K above max", tensor(mc_samples=MAX_K + 1), ["parameters.mc_samples", f"{MAX_K}"]),
    ("binary yes", tensor(binary_data_output="yes"), ["binary_data_output", "boolean"]),
]
VALID_V1 = [
    {"instances": [GOOD], "mc_samples": MAX_K, "return_samples": True, "seed": 0},
    {"images": [png_b64()], "mc_samples": None, "seed": None},
]


@pytest.fixture
def settings(make_settings: Callable[..., Settings]) -> Settings:
    return make_settings(max_mc_samples=MAX_K, max_instances=MAX_INSTANCES)


@pytest.fixture
async def client(serving: Callable[[Settings], Any], settings: Settings) -> AsyncIterator[Any]:
    async with serving(settings) as (_, client):
        yield client


@pytest.mark.parametrize(
    ("body", "fragments"), [c[1:] for c in LOOSE_V1], ids=[c[0] for c in LOOSE_V1]
)
async def test_v1_types_are_strict(client: Any, body: dict[str, Any], fragments: list[str]) -> None:
    r = await client.post("/v1/predict", json=body)
    assert r.status_code == 422, r.text
    for fragment in fragments:
        assert fragment in r.json()["error"], (fragment, r.json()["error"])


async def test_a_float_is_not_an_integer(client: Any) -> None:
    """``5.0`` for K: JSON Schema calls it an integer, the server (on /v1 as on /v2) does not —
    the one place where the server is stricter than its schema can say."""
    r = await client.post("/v1/predict", json={"instances": [GOOD], "mc_samples": 5.0})
    assert r.status_code == 422 and "mc_samples: Input should be a valid integer" in r.text
    r = await client.post(INFER, json=tensor(mc_samples=5.0))
    assert r.status_code == 400 and "parameters.mc_samples" in r.text


@pytest.mark.parametrize(
    ("body", "fragments"), [c[1:] for c in LOOSE_V2], ids=[c[0] for c in LOOSE_V2]
)
async def test_v2_types_are_strict(client: Any, body: dict[str, Any], fragments: list[str]) -> None:
    r = await client.post(INFER, json=body)
    assert r.status_code == 400, r.text
    assert list(r.json()) == ["error"]
    for fragment in fragments:
        assert fragment in r.json()["error"], (fragment, r.json()["error"])


async def test_file_options_are_form_text_within_the_limits(client: Any) -> None:
    """Form fields are text: ``mc_samples=5`` is 5; the bound on K is the same as in JSON."""
    buffer = io.BytesIO()
    Image.new("L", (28, 28)).save(buffer, format="PNG")
    files = {"file": ("a.png", buffer.getvalue(), "image/png")}
    ok = await client.post("/v1/predict/file", files=files, data={"mc_samples": "5"})
    assert ok.status_code == 200 and ok.json()["mc_samples"] == 5
    too_many = await client.post("/v1/predict/file", files=files, data={"mc_samples": "31"})
    assert too_many.status_code == 422 and "mc_samples" in too_many.json()["error"]


def _refs(node: Any) -> Iterator[str]:
    if isinstance(node, dict):
        for key, value in node.items():
            if key == "$ref":
                yield value
            else:
                yield from _refs(value)
    elif isinstance(node, list):
        for item in node:
            yield from _refs(item)


def _resolve(document: dict[str, Any], ref: str) -> Any:
    assert ref.startswith("#/"), ref
    node: Any = document
    for part in ref[2:].split("/"):
        assert isinstance(node, dict) and part in node, f"{ref}: no {part!r}"
        node = node[part]
    return node


def test_every_openapi_reference_resolves(settings: Settings) -> None:
    document = create_app(settings).openapi()
    refs = set(_refs(document))
    assert refs, "the document uses references"
    for ref in refs:
        _resolve(document, ref)


def _body_validator(document: dict[str, Any], path: str) -> jsonschema.protocols.Validator:
    """A JSON Schema validator of the JSON request body of ``POST path``, with the document's
    components in reach of its references."""
    schema = document["paths"][path]["post"]["requestBody"]["content"]["application/json"]
    return jsonschema.Draft202012Validator(
        {**schema["schema"], "components": document["components"]}
    )


async def test_the_openapi_schema_is_as_strict_as_the_server(
    client: Any, settings: Settings
) -> None:
    """Every body the server rejects for its structure or types, the schema rejects; every
    valid body, the schema accepts; the limits are the configured ones."""
    document = create_app(settings).openapi()
    v1 = _body_validator(document, "/v1/predict")
    v2 = _body_validator(document, "/v2/models/{name}/infer")
    both = {"instances": [GOOD], "images": [png_b64()]}
    neither: dict[str, Any] = {"mc_samples": 3}
    for _, body, _ in LOOSE_V1:
        assert not v1.is_valid(body), body
    for body in (both, neither):
        assert not v1.is_valid(body)
        assert (await client.post("/v1/predict", json=body)).status_code == 422
    for body in VALID_V1:
        assert v1.is_valid(body), body
        assert (await client.post("/v1/predict", json=body)).status_code == 200
    assert not v1.is_valid({"instances": [GOOD] * (MAX_INSTANCES + 1)})
    for _, body, _ in LOOSE_V2:
        assert not v2.is_valid(body), body
    assert v2.is_valid(tensor(mc_samples=MAX_K, seed=3))
    assert (await client.post(INFER, json=tensor(mc_samples=MAX_K, seed=3))).status_code == 200


async def test_the_schemas_bounds_and_form_fields_are_what_the_server_takes(
    client: Any, settings: Settings
) -> None:
    """Integer bounds are integers (FastAPI's OpenAPI models make them floats: 2⁶³ − 1 became
    2⁶³, a seed the server refuses); form fields are never ``null`` (a form sends text); an
    image string is base64 (an empty one is refused)."""
    document = create_app(settings).openapi()
    schemas = document["components"]["schemas"]
    options = schemas["PredictRequest"]["properties"]["seed"]["anyOf"]
    (seed,) = [option for option in options if "maximum" in option]
    assert seed["maximum"] == 2**63 - 1 and isinstance(seed["maximum"], int)
    form = schemas["FileForm"]["properties"]
    assert form["seed"]["type"] == "integer" and form["seed"]["maximum"] == 2**63 - 1
    assert form["mc_samples"] == {**form["mc_samples"], "type": "integer", "maximum": MAX_K}
    assert "anyOf" not in form["seed"] and "anyOf" not in form["mc_samples"]
    images = jsonschema.Draft202012Validator(schemas["PredictRequest"]["properties"]["images"])
    for text in ("", "0", "abc!", "AAA"):
        assert not images.is_valid([text]), text
        r = await client.post("/v1/predict", json={"images": [text]})
        assert r.status_code == 422, r.text
    assert images.is_valid([png_b64()])
    r = await client.post("/v1/predict", json={"images": [png_b64()], "seed": 2**63 - 1})
    assert r.status_code == 200, r.text


def test_bodies_are_documented_by_their_models_not_pasted_schemas(settings: Settings) -> None:
    """Every API route of the app, walked through the routers (FastAPI ≥ 0.140 keeps included
    routers as one entry each in ``app.routes``): no ``openapi_extra`` but ``/v1/attack``'s, which
    reads its own body (demo admission first) and documents it with the model's own schema."""
    app = create_app(settings)
    routes = {prefix + r.path: r for prefix, router in api_routers(settings) for r in router.routes}
    expected = {"/v1/predict", "/v2/models/{name}/infer", "/admin/threshold", "/v1/attack"}
    assert expected <= set(routes)
    extras = {p: r.openapi_extra for p, r in routes.items() if getattr(r, "openapi_extra", None)}
    attack_body = {"application/json": {"schema": AttackRequest.model_json_schema()}}
    assert extras == {"/v1/attack": {"requestBody": {"required": True, "content": attack_body}}}
    paths = app.openapi()["paths"]
    attack = paths["/v1/attack"]["post"]["requestBody"]["content"]["application/json"]["schema"]
    assert attack["title"] == "AttackRequest"
    assert set(attack["properties"]) == set(AttackRequest.model_fields)
    body = paths["/v1/predict/file"]["post"]["requestBody"]["content"]["multipart/form-data"]
    assert body["schema"]["$ref"].endswith("/FileForm")
    threshold = paths["/admin/threshold"]["put"]["requestBody"]["content"]["application/json"]
    assert threshold["schema"]["$ref"].endswith("/ThresholdRequest")


async def test_405_names_every_allowed_method(client: Any) -> None:
    """Starlette names only the first route matching the path; two routes share
    ``/admin/threshold``."""
    r = await client.get("/admin/threshold")
    assert r.status_code == 405
    assert r.headers["allow"] == "DELETE, PUT"
    r = await client.get("/v1/predict")
    assert r.status_code == 405 and r.headers["allow"] == "POST"


@pytest.mark.parametrize("placement", ["public", "protected", "off"])
async def test_metrics_placement_is_a_setting(
    serving: Callable[[Settings], Any], make_settings: Callable[..., Settings], placement: str
) -> None:
    key = "0123456789abcdef-admin"
    async with serving(make_settings(metrics=placement, api_key=key)) as (app, client):
        anonymous = await client.get("/metrics")
        with_key = await client.get("/metrics", headers={"Authorization": f"Bearer {key}"})
        documented = "/metrics" in app.openapi()["paths"]
    expected = {"public": (200, 200), "protected": (401, 200), "off": (404, 404)}[placement]
    assert (anonymous.status_code, with_key.status_code) == expected
    assert documented == (placement != "off")
    if placement != "off":
        assert "bayesgate_ready 1.0" in with_key.text


def test_protected_metrics_need_a_key(make_settings: Callable[..., Settings]) -> None:
    with pytest.raises(ValueError, match=r"BAYESGATE_METRICS=protected .* BAYESGATE_API_KEY"):
        make_settings(metrics="protected")
