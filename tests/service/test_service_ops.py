"""Operators' features in-process: Prometheus metrics against the requests actually sent, request
ids and JSON logs, API-key auth of the admin routes, threshold/score overrides and reloads."""

from __future__ import annotations

import asyncio
import io
import json
import logging
import shutil
import sys
import threading
from collections.abc import Callable
from pathlib import Path
from typing import Any

import pytest
from prometheus_text import family_names, samples, value

from bayesgate.cli import main
from bayesgate.models.store.calibration import read_calibration, write_calibration
from bayesgate.service.auth import key_digest, key_matches
from bayesgate.service.engine import mc_engine
from bayesgate.service.logs import JsonFormatter
from bayesgate.service.metrics import METRIC_NAMES
from bayesgate.service.served_model import attack_aurocs
from bayesgate.service.settings import Settings

pytestmark = pytest.mark.anyio

KEY = "0123456789abcdef-admin"
BLANK = [0.0] * 784
NOISE = [(i * 7919 % 1000) / 1000 for i in range(784)]


async def test_metrics_count_what_was_served(
    serving: Callable[[Settings], Any], make_settings: Callable[..., Settings], tiny_model_dir: Path
) -> None:
    sha = json.loads((tiny_model_dir / "card.json").read_text())["weights_sha256"]
    async with serving(make_settings(max_instances=4)) as (app, client):
        before = samples((await client.get("/metrics")).text)
        flagged = answered = 0
        for i in range(5):
            r = await client.post(
                "/v1/predict", json={"instances": [BLANK, NOISE][: 1 + i % 2], "mc_samples": 5}
            )
            rows = r.json()["predictions"]
            answered += len(rows)
            flagged += sum(row["adversarial"] for row in rows)
        v2 = await client.post(
            "/v2/models/tiny-mlp/infer",
            json={
                "inputs": [{"name": "input", "datatype": "FP32", "shape": [1, 784], "data": BLANK}]
            },
        )
        assert v2.status_code == 400
        await client.post("/v1/predict", json={"instances": []})  # 422
        await client.get("/v1/models/nope")  # 404
        stats = (await client.get("/v1/stats")).json()
        response = await client.get("/metrics")
    assert response.headers["content-type"].startswith("text/plain")
    after = samples(response.text)
    names = family_names(response.text)
    assert {n.removesuffix("_total") for n in METRIC_NAMES} <= names

    def delta(name: str, **labels: str) -> float:
        return value(after, name, **labels) - value(before, name, **labels)

    http = "bayesgate_http_requests_total"
    assert delta(http, method="POST", route="/v1/predict", status="200") == 5
    assert delta(http, method="POST", route="/v1/predict", status="422") == 1
    assert delta(http, method="GET", route="/v1/models/{name}", status="404") == 1
    assert delta(http, method="POST", route="/v2/models/{name}/infer", status="400") == 1
    assert delta(http, method="GET", route="/metrics", status="200") == 1  # the first scrape
    assert (
        delta("bayesgate_http_request_duration_seconds_count", method="POST", route="/v1/predict")
        == 6
    )
    assert delta("bayesgate_inference_requests_total", outcome="succeeded") == 5
    assert delta("bayesgate_inference_requests_total", outcome="failed") == 0
    assert delta("bayesgate_instances_total") == answered == 7  # 1 + 2 + 1 + 2 + 1
    assert delta("bayesgate_adversarial_instances_total") == flagged
    # One engine call per request here (sequential requests): batch-size sum = instances.
    assert delta("bayesgate_inference_batch_size_count") == stats["engine_calls"] == 5
    assert delta("bayesgate_inference_batch_size_sum") == 7
    assert delta("bayesgate_inference_compute_seconds_count") == 5
    assert delta("bayesgate_inference_queue_seconds_count") == 5
    assert value(after, "bayesgate_inference_queue_depth") == 0
    assert value(after, "bayesgate_ready") == 1
    cal = read_calibration(tiny_model_dir)
    assert (
        value(after, "bayesgate_model_info", model="tiny-mlp", weights_sha256=sha, score=cal.score)
        == 1
    )
    assert value(after, "bayesgate_adversarial_threshold") == cal.threshold
    assert app.state.ready is False  # lifespan ended


async def test_request_id_is_echoed_and_tags_the_json_access_log(
    serving: Callable[[Settings], Any], make_settings: Callable[..., Settings]
) -> None:
    stream = io.StringIO()
    handler = logging.StreamHandler(stream)
    handler.setFormatter(JsonFormatter())
    access = logging.getLogger("bayesgate.access")
    access.addHandler(handler)
    try:
        async with serving(make_settings()) as (_, client):
            given = await client.post(
                "/v1/predict",
                json={"instances": [BLANK], "mc_samples": 3},
                headers={"X-Request-ID": "client-id-42"},
            )
            bad_id = await client.get("/v1/models", headers={"X-Request-ID": "no spaces allowed"})
            fresh = await client.post("/v1/predict", json={"instances": []})
    finally:
        access.removeHandler(handler)
    assert given.headers["x-request-id"] == "client-id-42"
    assert bad_id.headers["x-request-id"] != "no spaces allowed"
    assert len(bad_id.headers["x-request-id"]) == 32 and len(fresh.headers["x-request-id"]) == 32
    records = [json.loads(line) for line in stream.getvalue().splitlines()]
    by_id = {r["request_id"]: r for r in records}
    assert set(by_id) == {
        "client-id-42",
        bad_id.headers["x-request-id"],
        fresh.headers["x-request-id"],
    }
    first = by_id["client-id-42"]
    assert (first["method"], first["path"], first["route"], first["status"]) == (
        "POST",
        "/v1/predict",
        "/v1/predict",
        200,
    )
    assert first["level"] == "info" and first["logger"] == "bayesgate.access"
    assert first["duration_ms"] > 0 and first["bytes_sent"] == len(given.content)
    assert by_id[fresh.headers["x-request-id"]]["status"] == 422


def test_json_formatter_keeps_one_line_per_record_with_exceptions() -> None:
    try:
        raise RuntimeError("boom\nsecond line")
    except RuntimeError:
        record = logging.LogRecord(
            "bayesgate.x", logging.ERROR, __file__, 1, "failed %s", ("here",), sys.exc_info()
        )
    line = JsonFormatter().format(record)
    assert "\n" not in line
    data = json.loads(line)
    assert data["message"] == "failed here" and data["level"] == "error"
    assert "RuntimeError: boom" in data["exception"] and "request_id" not in data


ADMIN_CALLS = [
    ("POST", "/admin/reload", None),
    ("PUT", "/admin/threshold", {"threshold": 0.5}),
    ("DELETE", "/admin/threshold", None),
]


async def test_admin_routes_are_disabled_without_a_key(
    serving: Callable[[Settings], Any], make_settings: Callable[..., Settings]
) -> None:
    async with serving(make_settings()) as (app, client):
        for method, path, body in ADMIN_CALLS:
            r = await client.request(
                method, path, json=body, headers={"Authorization": f"Bearer {KEY}"}
            )
            assert r.status_code == 403, (path, r.text)
            assert r.json()["code"] == "admin_disabled"
        assert app.state.worker.model.override is None
        r = await client.put(
            "/admin/threshold", content=b"{bad", headers={"content-type": "application/json"}
        )
        assert r.status_code == 403 and r.json()["code"] == "admin_disabled", r.text
        # Health and metrics need no key.
        assert (await client.get("/healthz")).status_code == 200
        assert (await client.get("/metrics")).status_code == 200


async def test_admin_routes_need_the_key(
    serving: Callable[[Settings], Any], make_settings: Callable[..., Settings]
) -> None:
    async with serving(make_settings(api_key=KEY)) as (app, client):
        for method, path, body in ADMIN_CALLS:
            for headers in (
                {},
                {"Authorization": "Bearer wrong-key-wrong-key"},
                {"Authorization": f"Bearer {KEY}x"},
                {"Authorization": f"Basic {KEY}"},
                {"X-API-Key": KEY[:-1]},
                {"X-API-Key": ""},
            ):
                r = await client.request(method, path, json=body, headers=headers)
                assert r.status_code == 401, (path, headers, r.text)
                assert r.headers["www-authenticate"].startswith("Bearer")
                assert KEY not in r.text
        # the key is checked before the body is read: an anonymous malformed body is a 401, not
        # the parser's 422 about it
        for headers in ({}, {"X-API-Key": "wrong-key-wrong-key"}):
            r = await client.put(
                "/admin/threshold",
                content=b'{"threshold": 0.5',
                headers={"content-type": "application/json", **headers},
            )
            assert r.status_code == 401 and r.json()["code"] == "unauthorized", r.text
        assert app.state.control.applied.generation == 0  # nothing was applied
        bad = await client.put(
            "/admin/threshold",
            content=b'{"threshold": 0.5',
            headers={"content-type": "application/json", "X-API-Key": KEY},
        )
        assert bad.status_code == 422, bad.text  # with the key, the body's problem is named
        ok_bearer = await client.put(
            "/admin/threshold", json={"threshold": 0.5}, headers={"Authorization": f"Bearer {KEY}"}
        )
        ok_header = await client.delete("/admin/threshold", headers={"X-API-Key": KEY})
        assert ok_bearer.status_code == ok_header.status_code == 200
        assert (await client.get("/readyz")).status_code == 200


def test_key_check_is_by_digest() -> None:
    digest = key_digest(KEY.encode())
    assert key_matches(KEY, digest)
    assert not key_matches(KEY + "x", digest)
    assert not key_matches("", digest)
    assert not key_matches("é" * 20, digest)


def test_key_settings(tmp_path: Path, tiny_model_dir: Path) -> None:
    with pytest.raises(ValueError, match="at least 16 characters"):
        Settings(model_dir=tiny_model_dir, api_key="short")
    with pytest.raises(ValueError, match="printable ASCII"):
        Settings(model_dir=tiny_model_dir, api_key="with space 0123456789")
    assert Settings(model_dir=tiny_model_dir, api_key="").admin_key() is None
    assert Settings(model_dir=tiny_model_dir).admin_key() is None
    key_file = tmp_path / "key"
    key_file.write_text(KEY + "\n")
    assert Settings(api_key_file=key_file, api_key="ignored-ignored-1").admin_key() == KEY.encode()
    key_file.write_text("tiny")
    with pytest.raises(ValueError, match=f"{key_file}.*at least 16"):
        Settings(api_key_file=key_file).admin_key()
    with pytest.raises(ValueError, match="cannot read"):
        Settings(api_key_file=tmp_path / "missing").admin_key()


async def test_threshold_and_score_overrides_change_the_flag(
    serving: Callable[[Settings], Any], make_settings: Callable[..., Settings], tiny_model_dir: Path
) -> None:
    cal = read_calibration(tiny_model_dir)
    headers = {"X-API-Key": KEY}
    body = {"instances": [BLANK, NOISE], "mc_samples": 10, "seed": 3}

    async with serving(make_settings(api_key=KEY)) as (_, client):

        async def predict() -> list[dict[str, Any]]:
            return (await client.post("/v1/predict", json=body)).json()["predictions"]

        original = await predict()
        low = await client.put("/admin/threshold", json={"threshold": -1.0}, headers=headers)
        assert low.status_code == 200, low.text
        assert low.json()["score"] == cal.score and low.json()["threshold"] == -1.0
        assert low.json()["override"]["threshold"] == -1.0 and low.json()["generation"] == 1
        assert all(row["adversarial"] and row["threshold"] == -1.0 for row in await predict())
        high = await client.put("/admin/threshold", json={"threshold": 1e9}, headers=headers)
        assert high.json()["score"] == cal.score
        assert not any(row["adversarial"] for row in await predict())
        # A score alone takes calibration.json's threshold for that score.
        vr = await client.put(
            "/admin/threshold", json={"score": "variation_ratio"}, headers=headers
        )
        assert vr.json()["threshold"] == cal.thresholds["variation_ratio"]
        rows = await predict()
        assert [r["score_name"] for r in rows] == ["variation_ratio"] * 2
        assert [r["score"] for r in rows] == [r["variation_ratio"] for r in rows]
        assert [r["adversarial"] for r in rows] == [
            r["variation_ratio"] > cal.thresholds["variation_ratio"] for r in rows
        ]
        summary = (await client.get("/v1/models/tiny-mlp")).json()["calibration"]
        assert (
            summary["score"] == "variation_ratio"
            and summary["override"]["score"] == "variation_ratio"
        )
        v2 = await client.post(
            "/v2/models/tiny-mlp/infer",
            json={
                "inputs": [
                    {"name": "input", "datatype": "FP32", "shape": [1, 1, 28, 28], "data": BLANK}
                ]
            },
        )
        assert v2.json()["parameters"]["score_name"] == "variation_ratio"
        metrics = samples((await client.get("/metrics")).text)
        assert (
            value(metrics, "bayesgate_adversarial_threshold") == cal.thresholds["variation_ratio"]
        )
        # Bad requests change nothing.
        for bad in ({}, {"score": "entropy"}, {"threshold": "high"}, {"threshold": 1, "k": 2}):
            r = await client.put("/admin/threshold", json=bad, headers=headers)
            assert r.status_code == 422, (bad, r.text)
        nan = await client.put(
            "/admin/threshold",
            content=b'{"threshold": NaN}',
            headers={**headers, "content-type": "application/json"},
        )
        assert nan.status_code == 422 and "finite" in nan.json()["error"]
        cleared = await client.delete("/admin/threshold", headers=headers)
        assert cleared.json()["override"] is None and cleared.json()["score"] == cal.score
        assert await predict() == original


async def test_reload_reads_the_store_and_keeps_serving_on_failure(
    serving: Callable[[Settings], Any],
    make_settings: Callable[..., Settings],
    tiny_model_dir: Path,
    tmp_path: Path,
) -> None:
    store = tmp_path / "tiny-mlp"
    shutil.copytree(tiny_model_dir, store)
    headers = {"Authorization": f"Bearer {KEY}"}
    async with serving(make_settings(model_dir=store, api_key=KEY)) as (app, client):
        sha = app.state.worker.model.sha256
        await client.put("/admin/threshold", json={"threshold": 0.123}, headers=headers)
        # A new calibration.json in the store (same weights): the reload serves it.
        cal = read_calibration(store)
        cal.thresholds[cal.score] = 0.777
        write_calibration(cal, store)
        with_body = await client.post("/admin/reload", json={"model_dir": "/tmp"}, headers=headers)
        assert with_body.status_code == 422 and "takes no body" in with_body.json()["error"]
        reloaded = await client.post("/admin/reload", headers=headers)
        assert reloaded.status_code == 200, reloaded.text
        assert reloaded.json()["threshold"] == 0.777 and reloaded.json()["override"] is None
        row = (await client.post("/v1/predict", json={"instances": [BLANK]})).json()["predictions"][
            0
        ]
        assert row["threshold"] == 0.777
        # Tampered weights: 409 naming the file; the old model keeps serving.
        blob = bytearray((store / "model.safetensors").read_bytes())
        blob[-1] ^= 0xFF
        (store / "model.safetensors").write_bytes(bytes(blob))
        broken = await client.post("/admin/reload", headers=headers)
        assert broken.status_code == 409
        assert (
            "model.safetensors" in broken.json()["error"]
            and "still serving" in broken.json()["error"]
        )
        assert app.state.worker.model.sha256 == sha
        after = await client.post("/v1/predict", json={"instances": [BLANK]})
        assert after.status_code == 200 and after.json()["model"]["weights_sha256"] == sha
        # Restored weights but a card with another input range: refused, queued requests were
        # validated against the old one.
        blob[-1] ^= 0xFF
        (store / "model.safetensors").write_bytes(bytes(blob))
        card = json.loads((store / "card.json").read_text())
        card["input"]["range"] = [0.0, 255.0]
        (store / "card.json").write_text(json.dumps(card))
        changed = await client.post("/admin/reload", headers=headers)
        assert changed.status_code == 409 and "input spec changed" in changed.json()["error"]
        assert app.state.worker.model.input_range == (0.0, 1.0)


async def test_no_route_takes_a_model_file_or_path(
    serving: Callable[[Settings], Any], make_settings: Callable[..., Settings]
) -> None:
    """Every input of every operation in the OpenAPI schema: the only file is the PNG upload,
    and nothing is named like a path, directory, URL or weights file."""
    async with serving(make_settings(api_key=KEY)) as (_, client):
        spec = (await client.get("/openapi.json")).json()
    suspicious = ("path", "dir", "url", "file", "weights", "safetensors", "card", "store")
    inputs = []
    for path, operations in spec["paths"].items():
        for method, op in operations.items():
            names = [p["name"] for p in op.get("parameters", [])]
            for media in op.get("requestBody", {}).get("content", {}).values():
                schema = media["schema"]
                if "$ref" in schema:
                    schema = spec["components"]["schemas"][schema["$ref"].rsplit("/", 1)[1]]
                names += list(schema.get("properties", {}))
            inputs += [(method.upper(), path, name) for name in names]
    flagged = [i for i in inputs if any(word in i[2].lower() for word in suspicious)]
    assert flagged == [("POST", "/v1/predict/file", "file")]
    assert ("POST", "/admin/reload") not in {(m, p) for m, p, _ in inputs}  # takes nothing


def test_attack_summary_reads_the_calibrate_entries() -> None:
    """``attack`` (the spec with its parameters) and ``auroc``, as ``bayesgate calibrate`` writes
    them; an entry without a finite AUROC (no successful example) stays out of the summary."""
    entries = [
        {"attack": "fgs:eta=0.2", "method": "fgs", "params": {"eta": 0.2}, "auroc": 0.91},
        {"attack": "itfgs:eta=0.01,steps=10", "score": "mutual_information", "auroc": 0.8},
        {"attack": "cw", "auroc": None},
        {"name": "pgd", "roc_auc": 0.7},  # keys nothing writes: not read
        {"attack": "broken", "auroc": float("nan")},
        {"auroc": 0.6},
        "not a dict",
    ]
    assert attack_aurocs(entries) == {  # type: ignore[arg-type]
        "fgs:eta=0.2": 0.91,
        "itfgs:eta=0.01,steps=10": 0.8,
    }


def test_serve_refuses_a_short_key_without_echoing_it(
    monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str], tiny_model_dir: Path
) -> None:
    monkeypatch.setenv("BAYESGATE_MODEL_DIR", str(tiny_model_dir))
    monkeypatch.setenv("BAYESGATE_API_KEY", "tiny-secret")
    assert main(["serve"]) == 2
    err = capsys.readouterr().err
    assert err.startswith("bayesgate: error: setting BAYESGATE_API_KEY:") and "16 characters" in err
    assert "tiny-secret" not in err


async def test_outcome_counters_and_queue_depth_follow_the_worker(
    serving: Callable[[Settings], Any], make_settings: Callable[..., Settings]
) -> None:
    settings = make_settings(queue_capacity=1, max_batch_size=1, max_queue_delay_ms=0.0)
    body = {"instances": [BLANK], "mc_samples": 2}
    inside, release = threading.Event(), threading.Event()

    def held(*args: Any) -> Any:  # holds the first engine call until the test releases it
        inside.set()
        release.wait(10)
        return mc_engine(*args)

    async with serving(settings) as (app, client):
        worker = app.state.worker
        worker.engine = held
        first = asyncio.create_task(client.post("/v1/predict", json=body))
        while not inside.is_set():  # the worker holds `first` in the engine: the queue is empty
            await asyncio.sleep(0.01)
        queued = asyncio.create_task(client.post("/v1/predict", json=body))
        while worker.queue_depth() != 1:
            await asyncio.sleep(0.01)
        during = samples((await client.get("/metrics")).text)
        rejected = await client.post("/v1/predict", json=body)
        release.set()
        assert [r.status_code for r in await asyncio.gather(first, queued)] == [200, 200]

        def failing(*_: Any) -> Any:
            raise RuntimeError("injected")

        worker.engine = failing
        failed = await client.post("/v1/predict", json=body)
        stats = worker.stats.snapshot()
        after = samples((await client.get("/metrics")).text)
    assert value(during, "bayesgate_inference_queue_depth") == 1
    assert value(after, "bayesgate_inference_queue_depth") == 0
    assert (rejected.status_code, failed.status_code) == (503, 500)
    outcomes = {
        o: value(after, "bayesgate_inference_requests_total", outcome=o)
        for o in ("succeeded", "failed", "rejected", "expired")
    }
    assert (
        outcomes
        == {
            "succeeded": stats["requests_succeeded"],
            "failed": stats["requests_failed"],
            "rejected": stats["requests_rejected"],
            "expired": stats["requests_expired"],
        }
        == {"succeeded": 2, "failed": 1, "rejected": 1, "expired": 0}
    )
    assert value(after, "bayesgate_inference_batch_size_count") == stats["engine_calls"] == 3


async def test_clients_cannot_grow_the_metrics_or_forge_log_lines(
    serving: Callable[[Settings], Any], make_settings: Callable[..., Settings]
) -> None:
    """A made-up HTTP method (h11 passes any token) is counted as ``other``, so a client cannot
    add series to ``/metrics`` without bound; a decoded path holding a line break (LF, NEL,
    U+2028) is logged escaped, so it cannot start a forged line of a text log."""
    stream = io.StringIO()
    handler = logging.StreamHandler(stream)
    handler.setFormatter(logging.Formatter("%(levelname)s: %(message)s"))  # the text format
    access = logging.getLogger("bayesgate.access")
    access.addHandler(handler)
    try:
        async with serving(make_settings()) as (app, client):
            for i in range(3):
                await client.request(f"X{i:07d}", "/healthz")
            for separator in ("%0a", "%c2%85", "%e2%80%a8"):  # LF, NEL, LINE SEPARATOR
                await client.get(f"/x{separator}INFO:%20forged%20admin%20reload")
            text = app.state.metrics.exposition()[0].decode()
    finally:
        access.removeHandler(handler)
    assert 'method="other"' in text and "X000000" not in text
    lines = stream.getvalue().splitlines()  # splits at NEL and U+2028 too
    assert not any(line.startswith("INFO: forged") for line in lines), lines
    for escaped in ("\\n", "\\x85", "\\u2028"):
        assert any(f"/x{escaped}INFO: forged admin reload 404" in line for line in lines), lines


async def test_the_openapi_document_says_the_admin_routes_need_the_key(
    serving: Callable[[Settings], Any], make_settings: Callable[..., Settings]
) -> None:
    """The key check that runs before the body is read (``AdminRoute.admit``) is not what
    documents it: the router's dependency is, and it stays — every admin operation lists the
    bearer and the X-API-Key schemes and its 401/403."""
    async with serving(make_settings(api_key=KEY)) as (_, client):
        document = (await client.get("/openapi.json")).json()
    schemes = document["components"]["securitySchemes"]
    assert schemes["AdminBearer"]["scheme"] == "bearer"
    assert schemes["AdminApiKey"] == {**schemes["AdminApiKey"], "in": "header", "name": "X-API-Key"}
    operations = [
        (path, method, op)
        for path, item in document["paths"].items()
        if path.startswith("/admin")
        for method, op in item.items()
    ]
    assert {(p, m) for p, m, _ in operations} == {
        ("/admin/reload", "post"),
        ("/admin/threshold", "put"),
        ("/admin/threshold", "delete"),
    }
    for path, method, op in operations:
        assert {"AdminBearer": []} in op["security"] and {"AdminApiKey": []} in op["security"]
        assert {"401", "403"} <= set(op["responses"]), (path, method)
