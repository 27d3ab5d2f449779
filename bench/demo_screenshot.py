"""Screenshot of the demo page (docs/img/demo.png) with a drawn digit and an FGS attack.

    python bench/demo_screenshot.py [--url http://127.0.0.1:8000] [--out docs/img/demo.png]

Needs a server started with the attack panel on (``bayesgate serve --demo``), the ``playwright``
Python package (the ``dev`` extra) and Debian's Chromium at ``/usr/bin/chromium``
(``apt-get install chromium``, or ``BAYESGATE_CHROMIUM``; Playwright's own browser download is
not used). The script draws
a "4" with mouse strokes, waits for the answer, runs FGS and selects η = ``--eta``, then saves a
full-page PNG.
"""

from __future__ import annotations

import argparse
import os
from pathlib import Path

from playwright.sync_api import Browser, Page, Playwright, sync_playwright

# Debian's Chromium (tests/service/test_service_page.py launches it through launch() below too)
CHROMIUM = Path(os.environ.get("BAYESGATE_CHROMIUM", "/usr/bin/chromium"))
CHROMIUM_ARGS = [
    "--headless",
    "--no-sandbox",
    "--disable-gpu",
    "--disable-background-networking",
    "--disable-component-update",
    "--disable-sync",
    "--no-first-run",
]
# A "4" on the 280×280 pad: (x, y) points of each stroke, in pad pixels.
FOUR = [
    [(95, 50), (80, 110), (70, 160), (190, 160)],
    [(175, 45), (172, 120), (170, 240)],
]


def launch(playwright: Playwright) -> Browser:
    """Headless Chromium from ``CHROMIUM`` (never Playwright's own browser download)."""
    return playwright.chromium.launch(executable_path=str(CHROMIUM), args=CHROMIUM_ARGS)


def draw(page: Page, strokes: list[list[tuple[float, float]]]) -> None:
    """Mouse strokes on the drawing pad, in its own pixel coordinates."""
    box = page.locator("#pad").bounding_box()
    assert box is not None
    sx, sy = box["width"] / 280, box["height"] / 280
    for stroke in strokes:
        x, y = stroke[0]
        page.mouse.move(box["x"] + x * sx, box["y"] + y * sy)
        page.mouse.down()
        for x, y in stroke[1:]:
            page.mouse.move(box["x"] + x * sx, box["y"] + y * sy, steps=8)
        page.mouse.up()


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--url", default="http://127.0.0.1:8000")
    parser.add_argument("--out", type=Path, default=Path("docs/img/demo.png"))
    parser.add_argument("--eta", type=float, default=0.2)
    args = parser.parse_args()
    with sync_playwright() as p:
        browser = launch(p)
        page = browser.new_page(viewport={"width": 1280, "height": 900}, device_scale_factor=1)
        page.goto(args.url)
        page.wait_for_selector("body[data-state=ready]")
        draw(page, FOUR)
        page.wait_for_selector("#answer:not([hidden])")
        page.wait_for_selector("body:not([data-busy])")
        page.click("#run-attack")
        page.wait_for_selector("#attack-result:not([hidden])", timeout=120_000)
        page.locator("#eta").fill(str(args.eta))
        page.wait_for_selector("body:not([data-busy])")
        args.out.parent.mkdir(parents=True, exist_ok=True)
        page.screenshot(path=str(args.out), full_page=True)
        browser.close()
    print(f"wrote {args.out}")


if __name__ == "__main__":
    main()
