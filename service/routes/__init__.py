"""HTTP routes: ``/v1`` predictions and models, the Open Inference Protocol under ``/v2``, health,
readiness and metrics, the key-protected ``/admin`` routes, and the demo page at ``/`` (with the
demo-only ``/v1/attack``).

The routers are built per app (:func:`api_routers`): the request body types carry that app's
limits (``mc_samples`` ≤ ``BAYESGATE_MAX_MC_SAMPLES``, …) and ``/metrics`` its placement.
"""

from fastapi import APIRouter

from bayesgate.service.routes import admin, demo, health, models, predict, v2
from bayesgate.service.settings import Settings


def api_routers(settings: Settings) -> list[tuple[str, APIRouter]]:
    """(prefix, router) of every route group: the single list the app includes and the route
    templates (metrics labels) are read from."""
    return [
        ("", health.build_router(settings)),
        ("/v1", predict.build_router(settings)),
        ("/v1", models.router),
        ("/v2", v2.build_router(settings)),
        ("", admin.router),
        ("", demo.page_router),
        ("/v1", demo.router),
    ]


def route_templates(routers: list[tuple[str, APIRouter]]) -> list[str]:
    """Full path templates of the API routes, e.g. ``/v2/models/{name}/infer`` (metrics labels)."""
    return [template for template, _ in route_methods(routers)]


def route_methods(routers: list[tuple[str, APIRouter]]) -> list[tuple[str, set[str]]]:
    """(full path template, methods) of every API route."""
    return [
        (prefix + route.path, set(getattr(route, "methods", None) or ()))
        for prefix, router in routers
        for route in router.routes
    ]


__all__ = ["api_routers", "route_methods", "route_templates"]
