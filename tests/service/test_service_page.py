"""The demo page in a real browser: Playwright driving Debian's Chromium against a real
``bayesgate serve`` (the tiny model). What the page shows is compared with ``/v1/predict``'s answer
for the PNG the page sent, and that PNG with MNIST's preprocessing and the IDX test files.

Chromium comes from ``apt-get install chromium`` (``.ci/run`` installs it when it is missing;
``BAYESGATE_CHROMIUM`` points elsewhere); Playwright's own browser download is never used.
"""

from __future__ import annotations

import base64
import importlib.util
import io
import os
import re
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import httpx
import numpy as np
import pytest
from PIL import Image
from serve_process import Server, start_server

from bayesgate.models.data.mnist import ensure_mnist_files, read_idx_images, read_idx_labels

CHROMIUM = Path(os.environ.get("BAYESGATE_CHROMIUM", "/usr/bin/chromium"))
# A "7" on the 280×280 pad, in pad pixels: the top bar, then the diagonal.
SEVEN = [[(70, 60), (200, 60), (120, 240)]]

if not CHROMIUM.exists():
    pytest.skip(
        f"no Chromium at {CHROMIUM}: apt-get install -y chromium (or set BAYESGATE_CHROMIUM)",
        allow_module_level=True,
    )
sync_api = pytest.importorskip("playwright.sync_api")
# The screenshot script's browser launch and mouse strokes (bench/ is not a package).
_spec = importlib.util.spec_from_file_location(
    "demo_screenshot", Path(__file__).resolve().parents[2] / "bench" / "demo_screenshot.py"
)
screenshot = importlib.util.module_from_spec(_spec)
_spec.loader.exec_module(screenshot)


@pytest.fixture(scope="module")
def browser() -> Iterator[Any]:
    with sync_api.sync_playwright() as p:
        chromium = screenshot.launch(p)
        yield chromium
        chromium.close()


def _server(tiny_model_dir: Path, tmp: Path, args: tuple[str, ...]) -> Iterator[Server]:
    server = start_server(tiny_model_dir, tmp, args=args, drain_delay_s=0)
    try:
        yield server
    finally:
        server.stop()


@pytest.fixture(scope="module")
def demo_server(tiny_model_dir: Path, tmp_path_factory: pytest.TempPathFactory) -> Iterator[Server]:
    yield from _server(tiny_model_dir, tmp_path_factory.mktemp("demo-on"), ("--demo",))


@pytest.fixture(scope="module")
def plain_server(
    tiny_model_dir: Path, tmp_path_factory: pytest.TempPathFactory
) -> Iterator[Server]:
    yield from _server(tiny_model_dir, tmp_path_factory.mktemp("demo-off"), ())


@pytest.fixture
def page(browser: Any) -> Iterator[Any]:
    context = browser.new_context(viewport={"width": 1280, "height": 900})
    page = context.new_page()
    errors: list[str] = []
    page.on("pageerror", lambda exc: errors.append(str(exc)))
    yield page
    context.close()
    assert errors == [], f"JavaScript errors on the page: {errors}"


def open_page(page: Any, server: Server) -> None:
    page.goto(server.base + "/")
    page.wait_for_selector("body[data-state=ready]", timeout=30_000)


def wait_for_answer(page: Any) -> None:
    page.wait_for_selector("#answer:not([hidden])", timeout=30_000)
    page.wait_for_selector("body:not([data-busy])", timeout=30_000)


def sent_png(page: Any) -> bytes:
    """The PNG the page sent last (its "Save as PNG" link holds the same bytes)."""
    href = page.get_attribute("#download-png", "href")
    prefix = "data:image/png;base64,"
    assert href.startswith(prefix), href[:40]
    return base64.b64decode(href[len(prefix) :])


def shown(page: Any) -> dict[str, Any]:
    """What the answer panel shows, as text and as the exact values behind it."""
    bars = page.locator("#bars li")
    return {
        "label_text": page.inner_text("#label"),
        "label": int(page.get_attribute("#label", "data-value")),
        "probabilities": [float(bars.nth(i).get_attribute("data-value")) for i in range(10)],
        "percent_text": [bars.nth(i).locator(".pct").inner_text() for i in range(10)],
        "entropy_text": page.inner_text("#entropy"),
        "entropy": float(page.get_attribute("#entropy", "data-value")),
        "mutual_information": float(page.get_attribute("#mutual-information", "data-value")),
        "flag_text": page.inner_text("#flag"),
        "flag": page.get_attribute("#flag", "data-adversarial"),
    }


def predict_png(server: Server, png: bytes, page: Any) -> dict[str, Any]:
    k, seed = int(page.input_value("#opt-k")), int(page.input_value("#opt-seed"))
    got = httpx.post(
        server.base + "/v1/predict",
        json={"images": [base64.b64encode(png).decode()], "mc_samples": k, "seed": seed},
        timeout=30,
        trust_env=False,
    )
    assert got.status_code == 200, got.text
    return got.json()["predictions"][0]


def assert_page_shows(page: Any, answer: dict[str, Any]) -> None:
    seen = shown(page)
    assert seen["label"] == answer["label"]
    assert seen["label_text"] == answer["class_name"]
    assert seen["probabilities"] == answer["probabilities"]
    assert seen["percent_text"] == [f"{100 * p:.1f} %" for p in answer["probabilities"]]
    assert seen["entropy"] == answer["predictive_entropy"]
    assert seen["entropy_text"] == f"{answer['predictive_entropy']:.4f}"
    assert seen["mutual_information"] == answer["mutual_information"]
    assert seen["flag"] == str(answer["adversarial"]).lower()
    words = "Flagged" if answer["adversarial"] else "Not flagged"
    assert words in seen["flag_text"]


def test_drawn_digit_is_preprocessed_like_mnist_and_shows_the_predict_answer(
    page: Any, demo_server: Server
) -> None:
    open_page(page, demo_server)
    assert page.inner_text("#model-name") == "tiny-mlp"
    screenshot.draw(page, SEVEN)
    wait_for_answer(page)
    png = sent_png(page)
    image = Image.open(io.BytesIO(png))
    assert (image.format, image.mode, image.size) == ("PNG", "L", (28, 28))
    pixels = np.asarray(image, dtype=np.float64) / 255
    rows, cols = np.nonzero(pixels > 0.05)
    assert max(rows.max() - rows.min(), cols.max() - cols.min()) + 1 in (20, 21)  # 20-px box
    mass = pixels.sum()
    centre = ((pixels.sum(1) * (np.arange(28) + 0.5)).sum() / mass,
              (pixels.sum(0) * (np.arange(28) + 0.5)).sum() / mass)  # fmt: skip
    assert np.allclose(centre, 14, atol=0.75), centre  # centre of mass in the middle
    assert_page_shows(page, predict_png(demo_server, png, page))
    # the MC spread: one dot per pass for each of the top three classes
    assert page.locator("#spread circle.pass").count() == 3 * int(page.input_value("#opt-k"))


def test_random_test_digit_is_the_mnist_image_it_names(
    page: Any, demo_server: Server, mnist_root: Path
) -> None:
    open_page(page, demo_server)
    page.focus("#random")
    page.keyboard.press("Enter")  # keyboard-usable
    wait_for_answer(page)
    note = page.inner_text("#input-note")
    index, label = map(int, re.search(r"#(\d+), true label (\d)", note).groups())
    images_path, labels_path = ensure_mnist_files(
        ("t10k-images-idx3-ubyte.gz", "t10k-labels-idx1-ubyte.gz"), mnist_root, download=False
    )
    png = sent_png(page)
    np.testing.assert_array_equal(
        np.asarray(Image.open(io.BytesIO(png))), read_idx_images(images_path)[index]
    )
    assert read_idx_labels(labels_path)[index] == label
    assert_page_shows(page, predict_png(demo_server, png, page))


def test_detector_scores_are_listed_only_when_the_answer_has_them(
    page: Any, demo_server: Server
) -> None:
    """Scores beyond entropy, MI and variation ratio (a fused detector's) are listed; the tiny
    model has none, so the list stays hidden until an answer carries them."""

    def add_scores(route: Any) -> None:
        answer = route.fetch().json()
        answer["predictions"][0]["scores"].update(mahalanobis_trunk=12.5, fused=-3.25)
        route.fulfill(json=answer)

    open_page(page, demo_server)
    screenshot.draw(page, SEVEN)
    wait_for_answer(page)
    assert page.is_hidden("#extra-scores")
    page.route("**/v1/predict/file", add_scores)
    page.click("#random")  # the page is busy from the click to the answer
    wait_for_answer(page)
    assert "MNIST test image" in page.inner_text("#input-note")
    assert page.is_visible("#extra-scores")
    rows = page.locator("#extra-scores tbody tr")
    cells = [rows.nth(i).locator("th, td").all_inner_texts() for i in range(rows.count())]
    assert cells == [["mahalanobis trunk", "12.5000", ""], ["fused", "-3.2500", ""]]


def test_fgs_attack_shows_both_images_their_answers_and_the_eta_plot(
    page: Any, demo_server: Server
) -> None:
    open_page(page, demo_server)
    assert page.is_visible("#attack-panel")
    screenshot.draw(page, SEVEN)
    wait_for_answer(page)
    page.click("#run-attack")
    page.wait_for_selector("#attack-result:not([hidden])", timeout=60_000)
    page.wait_for_selector("body:not([data-busy])")
    assert page.inner_text("#adv-title") == "adversarial, FGS η = 0.200"
    original_label = page.get_attribute("#orig-answer .big-label", "data-value")
    assert original_label == page.get_attribute("#label", "data-value")
    assert page.locator("#adv-answer .flag").inner_text().startswith(("⚠ Flagged", "✓ Not"))
    assert page.locator("#sweep .point").count() == 21
    page.locator("#eta").fill("0.45")
    assert page.inner_text("#adv-title") == "adversarial, FGS η = 0.450"
    assert page.locator("#sweep .point.selected").count() == 1


def test_attack_panel_is_absent_when_the_demo_is_off(page: Any, plain_server: Server) -> None:
    open_page(page, plain_server)
    assert page.is_hidden("#attack-panel")
    screenshot.draw(page, SEVEN)
    wait_for_answer(page)  # the rest of the page works
    assert page.is_hidden("#attack-panel")
    off = httpx.post(plain_server.base + "/v1/attack", json={}, trust_env=False)
    assert off.status_code == 404


@pytest.mark.parametrize(
    ("path", "title"),
    [("/docs", ".swagger-ui .info .title"), ("/redoc", "redoc h1")],
)
def test_api_docs_render_without_any_other_host(
    page: Any, plain_server: Server, path: str, title: str
) -> None:
    """Swagger UI and ReDoc draw the API from this server's files alone: every request to any
    other host is refused (a CDN script would leave the page blank)."""
    elsewhere: list[str] = []

    def only_this_server(route: Any) -> None:
        if route.request.url.startswith(plain_server.base + "/"):
            route.continue_()
        else:
            elsewhere.append(route.request.url)
            route.abort()

    page.route("**/*", only_this_server)
    page.goto(plain_server.base + path)
    page.wait_for_selector(title, timeout=30_000)
    assert page.locator(title).first.inner_text().startswith("BayesGate")
    page.get_by_text("/v1/predict/file").first.wait_for(timeout=30_000)
    assert elsewhere == []
