"""The demo page's routes: the page and its static files, ``GET /v1/demo`` and ``POST /v1/attack``
(off by default, bad parameters, its own concurrency limit, results checked against an FGS step
computed here by autograd, and each answer against ``/v1/predict`` on the returned image)."""

from __future__ import annotations

import asyncio
import json
import threading
from collections.abc import Callable
from pathlib import Path
from typing import Any

import numpy as np
import pytest
import torch
from PIL import Image

from bayesgate.models.data.mnist import ensure_mnist_files, read_idx_images, read_idx_labels
from bayesgate.models.mc.engine import mc_log_predictive
from bayesgate.models.store.directory import load_model
from bayesgate.service.cli import page_message
from bayesgate.service.routes import demo
from bayesgate.service.settings import Settings

pytestmark = pytest.mark.anyio

STATIC = Path(demo.__file__).resolve().parents[1] / "static"
ETAS = [0.0, 0.05, 0.1, 0.3]


def body(x: torch.Tensor, **params: Any) -> dict[str, Any]:
    return {"instance": x.squeeze(0).tolist(), "mc_samples": 5, "seed": 3, **params}


async def test_page_and_static_files_are_served_with_a_strict_policy(
    serving: Callable[[Settings], Any], make_settings: Callable[..., Settings]
) -> None:
    async with serving(make_settings()) as (_, client):
        page = await client.get("/")
        assert page.status_code == 200
        assert page.headers["content-type"].startswith("text/html")
        assert "default-src 'self'" in page.headers["content-security-policy"]
        assert '<script type="module" src="/static/app.js">' in page.text
        for name, media in demo.STATIC_FILES.items():
            got = await client.get(f"/static/{name}")
            assert got.status_code == 200, name
            assert got.headers["content-type"].split(";")[0] == media.split(";")[0]
            assert got.content == (STATIC / name).read_bytes()
        for name in ("index.html", "../settings.py", "..%2Fsettings.py", "nope.js"):
            assert (await client.get(f"/static/{name}")).status_code == 404, name


def test_page_loads_nothing_from_elsewhere() -> None:
    """No CDN: every URL the page and its script name is same-origin."""
    text = (STATIC / "index.html").read_text() + (STATIC / "app.js").read_text()
    text += (STATIC / "style.css").read_text()
    urls = [u for u in ("http://", "https://", "//cdn") if u in text]
    # the SVG namespace is a name, not a fetch
    assert text.count("http://") == text.count("http://www.w3.org/2000/svg")
    assert "https://" not in text, urls


def test_shipped_digits_are_mnist_test_images(mnist_root: Path) -> None:
    """The sprite's tiles equal the test images its manifest names; both files under 200 KB."""
    manifest = json.loads((STATIC / "digits.json").read_text())
    size = (STATIC / "digits.png").stat().st_size + (STATIC / "digits.json").stat().st_size
    assert size < 200 * 1024
    sprite = np.asarray(Image.open(STATIC / "digits.png"))
    assert Image.open(STATIC / "digits.png").mode == "L"
    images_path, labels_path = ensure_mnist_files(
        ("t10k-images-idx3-ubyte.gz", "t10k-labels-idx1-ubyte.gz"), mnist_root, download=False
    )
    images, labels = read_idx_images(images_path), read_idx_labels(labels_path)
    t, columns = manifest["tile"], manifest["columns"]
    assert manifest["count"] == len(manifest["labels"]) == len(manifest["indices"]) >= 200
    assert sprite.shape == (manifest["count"] // columns * t, columns * t)
    for i, (index, label) in enumerate(zip(manifest["indices"], manifest["labels"], strict=True)):
        row, col = divmod(i, columns)
        tile = sprite[row * t : (row + 1) * t, col * t : (col + 1) * t]
        np.testing.assert_array_equal(tile, images[index])
        assert labels[index] == label
    assert sorted(set(manifest["labels"])) == list(range(10))


async def test_demo_config_and_attack_route_when_off(
    serving: Callable[[Settings], Any],
    make_settings: Callable[..., Settings],
    mnist_test: tuple[torch.Tensor, torch.Tensor],
) -> None:
    assert Settings.model_fields["demo"].default is False
    async with serving(make_settings()) as (_, client):
        config = (await client.get("/v1/demo")).json()
        assert config["attack"]["enabled"] is False
        off = await client.post("/v1/attack", json=body(mnist_test[0][0]))
        assert off.status_code == 404
        assert off.json()["code"] == "demo_disabled"
        assert "--demo" in off.json()["error"]
        # off wins over a bad body: nothing about the route is revealed but that it is off
        assert (await client.post("/v1/attack", json={"etas": "x"})).status_code == 404


@pytest.mark.parametrize(
    ("params", "field", "words"),
    [
        ({"etas": [1.5]}, "etas[0]", "less than or equal to 1"),
        ({"etas": [-0.1]}, "etas[0]", "greater than or equal to 0"),
        ({"etas": [0.1] * 22}, "etas", "1 … 21"),
        ({"etas": []}, "etas", "1 … 21"),
        ({"method": "pgd", "steps": 101}, "steps", "at most 100"),
        ({"method": "pgd", "steps": 0}, "steps", "greater than or equal to 1"),
        ({"method": "pgd", "eps": 0}, "eps", "greater than 0"),
        ({"method": "pgd", "eps": 0.1, "eps_iter": 0.2}, "eps_iter", "must not exceed eps"),
        ({"method": "pgd", "etas": [0.1]}, "etas", "only applies to method fgs"),
        ({"steps": 3}, "steps", "only applies to method pgd"),
        ({"method": "cw"}, "method", "'fgs' or 'pgd'"),
        ({"attack_mc_samples": 21}, "attack_mc_samples", "at most 20"),
        ({"mc_samples": 0}, "mc_samples", "1 …"),
        ({"seed": -1}, "seed", "greater than or equal to 0"),
        ({"target": 3}, "body", "unknown field 'target'"),
        ({"image": "aGVsbG8="}, "body", "exactly one of 'image'"),
    ],
)
async def test_bad_attack_parameters_are_422_naming_the_field(
    serving: Callable[[Settings], Any],
    make_settings: Callable[..., Settings],
    mnist_test: tuple[torch.Tensor, torch.Tensor],
    params: dict[str, Any],
    field: str,
    words: str,
) -> None:
    async with serving(make_settings(demo=True)) as (_, client):
        got = await client.post("/v1/attack", json=body(mnist_test[0][0], **params))
    assert got.status_code == 422, got.text
    message = got.json()["error"]
    assert message.startswith(f"{field}:") and words in message, message


async def test_attack_without_an_image_or_with_a_bad_one_is_422(
    serving: Callable[[Settings], Any], make_settings: Callable[..., Settings]
) -> None:
    async with serving(make_settings(demo=True)) as (_, client):
        none = await client.post("/v1/attack", json={"etas": [0.1]})
        assert none.status_code == 422 and "exactly one of" in none.json()["error"]
        big = await client.post("/v1/attack", json={"instance": [[2.0] * 28] * 28})
        assert big.status_code == 422 and "[0, 1]" in big.json()["error"]
        png = await client.post("/v1/attack", json={"image": "bm90IGEgcG5n"})
        assert png.status_code == 422 and "PNG" in png.json()["error"]
        # named by this body's fields, not /v1/predict's lists ("instances[0]", "images[0]")
        shape = await client.post("/v1/attack", json={"instance": [[0, 1]]})
        for answer, field in ((big, "instance"), (shape, "instance"), (png, "image")):
            error = answer.json()["error"]
            assert error.startswith(field) and not error.startswith(field + "s"), error
            assert "[0]" not in error.split(":")[0], error
        headers = {"content-type": "application/json"}
        broken = await client.post("/v1/attack", content=b"\xff{", headers=headers)
        assert broken.status_code == 422 and "not valid JSON" in broken.json()["error"]
        array = await client.post("/v1/attack", json=[1, 2])
        assert array.status_code == 422 and "JSON object" in array.json()["error"]
        text = await client.post(
            "/v1/attack", content=b"{}", headers={"content-type": "text/plain"}
        )
        assert text.status_code == 415


def reference_fgs(
    network: torch.nn.Module, x: torch.Tensor, label: int, eta: float, k: int, seed: int
) -> torch.Tensor:
    """``clip(x − η·sgn ∇_x log p̄(label|x))`` by autograd, masks from ``Generator(seed)``."""
    x = x.clone().requires_grad_(True)
    generator = torch.Generator().manual_seed(seed)
    log_p = mc_log_predictive(network, x, k, generator=generator)
    (grad,) = torch.autograd.grad(log_p[0, label], x)
    return (x.detach() - eta * grad.sign()).clamp(0, 1)


async def test_fgs_images_match_an_autograd_reference_and_the_predict_route(
    serving: Callable[[Settings], Any],
    make_settings: Callable[..., Settings],
    mnist_test: tuple[torch.Tensor, torch.Tensor],
    tiny_model_dir: Path,
) -> None:
    x = mnist_test[0][:1]
    network = load_model(tiny_model_dir, torch.device("cpu")).network
    async with serving(make_settings(demo=True)) as (_, client):
        got = await client.post("/v1/attack", json=body(x[0], etas=ETAS, attack_mc_samples=4))
        assert got.status_code == 200, got.text
        answer = got.json()
        predicted = await client.post(
            "/v1/predict",
            json={"instances": x.tolist(), "mc_samples": 5, "seed": 3, "return_samples": True},
        )
        assert answer["original"] == predicted.json()["predictions"][0]
        label = answer["original"]["label"]
        assert [r["eta"] for r in answer["results"]] == ETAS
        assert [r["attack"] for r in answer["results"]] == [f"fgs:eta={e}" for e in ETAS]
        for result in answer["results"]:
            adv = torch.tensor(result["instance"], dtype=torch.float32).reshape(1, 1, 28, 28)
            assert adv.min() >= 0 and adv.max() <= 1
            linf = float((adv - x).abs().max())
            assert linf <= result["eta"] + 1e-6
            assert result["linf"] == pytest.approx(linf, abs=1e-7)
            ref = reference_fgs(network, x, label, result["eta"], k=4, seed=3)
            assert (ref != adv).float().mean() < 0.01, f"η={result['eta']}"
            again = await client.post(
                "/v1/predict",
                json={
                    "instances": [result["instance"]],
                    "mc_samples": 5,
                    "seed": 3,
                    "return_samples": True,
                },
            )
            assert result["prediction"] == again.json()["predictions"][0]
        alone = await client.post("/v1/attack", json=body(x[0], etas=[0.3], attack_mc_samples=4))
        assert alone.json()["results"][0]["instance"] == answer["results"][-1]["instance"]
    assert answer["results"][0]["instance"] == x[0, 0].tolist()  # η = 0 changes nothing


async def test_pgd_stays_inside_the_eps_ball(
    serving: Callable[[Settings], Any],
    make_settings: Callable[..., Settings],
    mnist_test: tuple[torch.Tensor, torch.Tensor],
) -> None:
    x = mnist_test[0][1:2]
    async with serving(make_settings(demo=True, demo_max_attack_steps=10)) as (_, client):
        params = {"method": "pgd", "eps": 0.1, "steps": 10, "attack_mc_samples": 2}
        got = await client.post("/v1/attack", json=body(x[0], **params))
        assert got.status_code == 200, got.text
        again = await client.post("/v1/attack", json=body(x[0], **params))
    (result,) = got.json()["results"]
    assert (result["eps"], result["steps"]) == (0.1, 10)
    assert result["attack"] == "pgd:eps=0.1,eps_iter=0.025,steps=10"  # 2.5·ε/steps
    adv = torch.tensor(result["instance"]).reshape(1, 1, 28, 28)
    assert adv.min() >= 0 and adv.max() <= 1
    assert float((adv - x).abs().max()) <= 0.1 + 1e-6
    assert float((adv - x).abs().max()) > 0.05  # it moved
    assert again.json()["results"][0]["instance"] == result["instance"]  # seeded


async def test_attacks_compute_with_the_server_s_thread_count(
    serving: Callable[[Settings], Any],
    make_settings: Callable[..., Settings],
    mnist_test: tuple[torch.Tensor, torch.Tensor],
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    """The attack runs in a thread of asyncio's pool, which computes with OpenMP's default count
    until told the server's (``use_process_thread_count``, tested on the worker's answers)."""
    from bayesgate.service import demo_attack

    applied: list[str] = []
    real = demo_attack.use_process_thread_count
    monkeypatch.setattr(
        demo_attack,
        "use_process_thread_count",
        lambda: applied.append(threading.current_thread().name) or real(),
    )
    async with serving(make_settings(demo=True)) as (_, client):
        params = {"method": "fgs", "etas": [0.1], "attack_mc_samples": 2}
        got = await client.post("/v1/attack", json=body(mnist_test[0][0], **params))
    assert got.status_code == 200, got.text
    assert len(applied) == 1 and applied[0] != threading.main_thread().name


async def test_a_second_attack_is_503_at_once_and_predictions_still_flow(
    serving: Callable[[Settings], Any],
    make_settings: Callable[..., Settings],
    mnist_test: tuple[torch.Tensor, torch.Tensor],
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    started, release = threading.Event(), threading.Event()
    real = demo.run_attacks

    def held(*args: Any, **kwargs: Any) -> list[torch.Tensor]:
        started.set()
        release.wait(30)
        return real(*args, **kwargs)

    monkeypatch.setattr(demo, "run_attacks", held)
    x = mnist_test[0][0]
    async with serving(make_settings(demo=True)) as (_, client):
        first = asyncio.create_task(client.post("/v1/attack", json=body(x, etas=[0.1])))
        while not started.is_set():
            await asyncio.sleep(0.01)
        busy = await client.post("/v1/attack", json=body(x, etas=[0.1]))
        assert busy.status_code == 503
        assert busy.headers["retry-after"] == "1"
        assert busy.json()["code"] == "attack_busy"
        # the attack thread holds no event loop: predictions are answered meanwhile
        predicted = await asyncio.wait_for(
            client.post("/v1/predict", json={"instances": [x.tolist()]}), timeout=10
        )
        assert predicted.status_code == 200
        assert not first.done()
        release.set()
        assert (await first).status_code == 200
        assert (await client.post("/v1/attack", json=body(x, etas=[0.1]))).status_code == 200


async def test_a_hung_up_attack_keeps_its_slot_until_its_thread_ends(
    serving: Callable[[Settings], Any],
    make_settings: Callable[..., Settings],
    mnist_test: tuple[torch.Tensor, torch.Tensor],
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    """A client that hangs up cancels its request, but the attack thread runs on: a second
    attack must still be refused until that thread is done (one attack slot, one CPU job)."""
    started, release, ended = threading.Event(), threading.Event(), threading.Event()
    real = demo.run_attacks

    def held(*args: Any, **kwargs: Any) -> list[torch.Tensor]:
        started.set()
        release.wait(30)
        try:
            return real(*args, **kwargs)
        finally:
            ended.set()

    monkeypatch.setattr(demo, "run_attacks", held)
    x = mnist_test[0][0]
    async with serving(make_settings(demo=True, demo_attack_concurrency=1)) as (_, client):
        first = asyncio.create_task(client.post("/v1/attack", json=body(x, etas=[0.1])))
        while not started.is_set():
            await asyncio.sleep(0.01)
        first.cancel()  # the client hangs up while its attack runs
        await asyncio.sleep(0.05)
        busy = await client.post("/v1/attack", json=body(x, etas=[0.1]))
        assert busy.status_code == 503 and busy.json()["code"] == "attack_busy"
        release.set()
        while not ended.is_set():
            await asyncio.sleep(0.01)
        for _ in range(100):  # the slot is freed once the cancelled request unwinds
            if first.done():
                break
            await asyncio.sleep(0.01)
        assert first.cancelled() or first.done()
        assert (await client.post("/v1/attack", json=body(x, etas=[0.1]))).status_code == 200


def test_page_message_names_the_url() -> None:
    settings = Settings(host="0.0.0.0", port=8123)
    assert page_message(settings).startswith("bayesgate: page at http://localhost:8123/")
    assert "http://localhost:8123/docs" in page_message(settings)
    on = Settings(host="127.0.0.1", port=9000, demo=True, docs=False)
    assert page_message(on) == "bayesgate: page at http://127.0.0.1:9000/ (attack panel on: --demo)"
    assert "http://[::1]:80/" in page_message(Settings(host="::1", port=80))


def test_page_message_with_port_0_gives_no_unusable_url() -> None:
    """``--port 0`` used to print ``http://127.0.0.1:0/``; the port is chosen when uvicorn binds."""
    message = page_message(Settings(port=0))
    assert ":0/" not in message and "Uvicorn running on" in message
