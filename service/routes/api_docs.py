"""The interactive API docs (``GET /docs``: Swagger UI, ``GET /redoc``: ReDoc; ``HEAD`` too, as
FastAPI's own pages) served with their
JavaScript and CSS from this server, so they work where the browser cannot reach a CDN (an
air-gapped cluster, a laptop offline). FastAPI's own pages load them from cdn.jsdelivr.net and stay
blank without it.

The files are those the ``fastapi-offline`` package ships (Swagger UI 5, which reads the
OpenAPI 3.1 document FastAPI writes; ReDoc's standalone bundle); only the names in
:data:`ASSETS` are served, under ``/docs/static/``. Built only when ``BAYESGATE_DOCS`` is on.
"""

from __future__ import annotations

from functools import cache
from importlib import resources
from importlib.resources.abc import Traversable

from fastapi import APIRouter, FastAPI
from fastapi.openapi.docs import (
    get_redoc_html,
    get_swagger_ui_html,
    get_swagger_ui_oauth2_redirect_html,
)
from fastapi.responses import HTMLResponse, Response
from starlette.exceptions import HTTPException as StarletteHTTPException

ASSET_PREFIX = "/docs/static"
ASSETS = {
    "swagger-ui-bundle.js": "text/javascript; charset=utf-8",
    "swagger-ui.css": "text/css; charset=utf-8",
    "redoc.standalone.js": "text/javascript; charset=utf-8",
    "favicon.png": "image/png",
}
# The pages load nothing from another host: ReDoc's "API docs by Redocly" footer would fetch its
# logo from cdn.redoc.ly. Both pages start with inline scripts (FastAPI's HTML) and style with
# inline styles; ReDoc runs its search in a blob: worker.
PAGE_HEADERS = {
    "Content-Security-Policy": "default-src 'self'; script-src 'self' 'unsafe-inline'; "
    "style-src 'self' 'unsafe-inline'; img-src 'self' data:; worker-src 'self' blob:; "
    "object-src 'none'; base-uri 'none'; frame-ancestors 'none'",
    "X-Content-Type-Options": "nosniff",
}
# The files change only with the installed package: let browsers keep them for a day.
ASSET_HEADERS = {"Cache-Control": "public, max-age=86400", "X-Content-Type-Options": "nosniff"}


@cache
def asset(name: str) -> bytes:
    """The bytes of one of :data:`ASSETS` (``OSError`` when the package lacks it)."""
    return _static().joinpath(name).read_bytes()


def _static() -> Traversable:
    return resources.files("fastapi_offline").joinpath("static")


def docs_router(app: FastAPI) -> APIRouter:
    """``/docs``, its OAuth2 redirect page, ``/redoc`` and their files, for ``app``'s OpenAPI
    document (``app.openapi_url``, which must be set)."""
    if app.openapi_url is None:
        raise ValueError("the API docs need the app's OpenAPI document (openapi_url)")
    missing = [n for n in ASSETS if not _static().joinpath(n).is_file()]
    if missing:
        raise RuntimeError(
            f"the API docs' files {missing} are not in the installed fastapi-offline package "
            "(pip install 'fastapi-offline>=1.7.7'), or turn the docs off (BAYESGATE_DOCS=false)"
        )
    openapi_url, title = app.openapi_url, app.title
    redirect_url = app.swagger_ui_oauth2_redirect_url or "/docs/oauth2-redirect"
    router = APIRouter(include_in_schema=False)

    @router.api_route("/docs", response_class=HTMLResponse, methods=["GET", "HEAD"])
    async def swagger_ui() -> HTMLResponse:
        return _same_host(
            get_swagger_ui_html(
                openapi_url=openapi_url,
                title=f"{title} - Swagger UI",
                oauth2_redirect_url=redirect_url,
                swagger_js_url=f"{ASSET_PREFIX}/swagger-ui-bundle.js",
                swagger_css_url=f"{ASSET_PREFIX}/swagger-ui.css",
                swagger_favicon_url=f"{ASSET_PREFIX}/favicon.png",
                swagger_ui_parameters=app.swagger_ui_parameters,
            )
        )

    @router.api_route(redirect_url, response_class=HTMLResponse, methods=["GET", "HEAD"])
    async def swagger_ui_redirect() -> HTMLResponse:
        return get_swagger_ui_oauth2_redirect_html()

    @router.api_route("/redoc", response_class=HTMLResponse, methods=["GET", "HEAD"])
    async def redoc() -> HTMLResponse:
        return _same_host(
            get_redoc_html(
                openapi_url=openapi_url,
                title=f"{title} - ReDoc",
                redoc_js_url=f"{ASSET_PREFIX}/redoc.standalone.js",
                redoc_favicon_url=f"{ASSET_PREFIX}/favicon.png",
                with_google_fonts=False,
            )
        )

    @router.api_route(ASSET_PREFIX + "/{name}", methods=["GET", "HEAD"])
    async def docs_asset(name: str) -> Response:
        """One of the docs' files; any other name is the service's JSON 404."""
        if name not in ASSETS:
            raise StarletteHTTPException(
                404, f"no docs file {name[:80]!r}; the docs' files are {', '.join(ASSETS)}"
            )
        return Response(asset(name), media_type=ASSETS[name], headers=ASSET_HEADERS)

    return router


def _same_host(page: HTMLResponse) -> HTMLResponse:
    page.headers.update(PAGE_HEADERS)
    return page
