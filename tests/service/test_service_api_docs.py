"""``/docs`` and ``/redoc`` load their JavaScript and CSS from this server, not from a CDN
(service/routes/api_docs.py); the pages render offline in a browser in ``test_service_page.py``."""

from __future__ import annotations

import re
from collections.abc import Callable
from importlib import resources
from typing import Any

import pytest
from fastapi import FastAPI
from prometheus_text import metric_value

from bayesgate.service.routes.api_docs import ASSET_PREFIX, ASSETS, docs_router
from bayesgate.service.settings import Settings

# every URL a page's <script>, <link> or inline JavaScript loads
pytestmark = pytest.mark.anyio

LOADED = re.compile(r"""(?:src|href)=["']([^"']+)["']|url:\s*'([^']+)'|url:\s*"([^"]+)\"""")


def loaded_urls(html: str) -> set[str]:
    return {next(g for g in m.groups() if g) for m in LOADED.finditer(html)}


@pytest.mark.parametrize(
    ("path", "assets"),
    [
        ("/docs", {"swagger-ui-bundle.js", "swagger-ui.css", "favicon.png"}),
        ("/redoc", {"redoc.standalone.js", "favicon.png"}),
    ],
)
async def test_docs_pages_load_only_files_of_this_server(
    serving: Callable[[Settings], Any],
    make_settings: Callable[..., Settings],
    path: str,
    assets: set[str],
) -> None:
    async with serving(make_settings()) as (_, client):
        page = await client.get(path)
        assert page.status_code == 200
        assert page.headers["content-type"].startswith("text/html")
        urls = loaded_urls(page.text)
        assert {f"{ASSET_PREFIX}/{name}" for name in assets} <= urls
        assert all(u.startswith("/") and not u.startswith("//") for u in urls), urls
        assert "cdn." not in page.text and "fonts.googleapis" not in page.text
        for url in urls - {"/openapi.json"}:
            got = await client.get(url)
            assert got.status_code == 200, url
            name = url.rsplit("/", 1)[1]
            assert got.headers["content-type"] == ASSETS[name]
            # the package's file, byte for byte
            shipped = resources.files("fastapi_offline").joinpath("static", name).read_bytes()
            assert got.content == shipped and len(shipped) > 500
        assert "/openapi.json" in page.text
        head = await client.head(path)
        assert head.status_code == 200 and head.content == b""
        assert (await client.head(f"{ASSET_PREFIX}/favicon.png")).status_code == 200
        # counted under their own routes, as the API's are
        text = (await client.get("/metrics")).text
        total = "bayesgate_http_requests_total"
        assert metric_value(text, total, route=path, status="200") == 2  # GET and HEAD
        assert metric_value(text, total, route=f"{ASSET_PREFIX}/{{name}}", status="200") >= 2
        assert metric_value(text, total, route="unmatched") == 0


async def test_swagger_ui_is_version_5_which_reads_openapi_3_1(
    serving: Callable[[Settings], Any], make_settings: Callable[..., Settings]
) -> None:
    async with serving(make_settings()) as (_, client):
        assert (await client.get("/openapi.json")).json()["openapi"].startswith("3.1")
        bundle = (await client.get(f"{ASSET_PREFIX}/swagger-ui-bundle.js")).text
        # Swagger UI 4 shows "Unable to render this definition" for OpenAPI 3.1
        versions = re.findall(r'PACKAGE_VERSION:"(\d+)\.\d+\.\d+"', bundle)
        assert versions and int(versions[0]) >= 5, versions
        redirect = await client.get("/docs/oauth2-redirect")
        assert redirect.status_code == 200 and "oauth2" in redirect.text


async def test_only_the_docs_files_are_served(
    serving: Callable[[Settings], Any], make_settings: Callable[..., Settings]
) -> None:
    async with serving(make_settings()) as (_, client):
        for name in ("core.py", "swagger-ui-bundle.js.map", "x" * 300):
            got = await client.get(f"{ASSET_PREFIX}/{name}")
            assert got.status_code == 404, name
            assert "the docs' files are swagger-ui-bundle.js" in got.json()["detail"]
            assert len(got.json()["detail"]) < 250
        assert (await client.get(f"{ASSET_PREFIX}/..%2F__init__.py")).status_code == 404
    async with serving(make_settings(docs=False)) as (_, client):
        for path in ("/docs", "/redoc", "/docs/oauth2-redirect", f"{ASSET_PREFIX}/swagger-ui.css"):
            assert (await client.get(path)).status_code == 404, path


def test_docs_need_the_openapi_document_and_the_packaged_files(
    monkeypatch: pytest.MonkeyPatch, tmp_path: Any
) -> None:
    with pytest.raises(ValueError, match="openapi_url"):
        docs_router(FastAPI(openapi_url=None))
    import bayesgate.service.routes.api_docs as api_docs

    monkeypatch.setattr(api_docs, "_static", lambda: tmp_path)  # a package without the files
    with pytest.raises(RuntimeError, match=r"fastapi-offline.*BAYESGATE_DOCS=false"):
        docs_router(FastAPI())
