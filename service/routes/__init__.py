"""HTTP routes: ``/v1`` predictions and models, the Open Inference Protocol under ``/v2``, health,
readiness and metrics, and the key-protected ``/admin`` routes."""

from fastapi import APIRouter

from bayesgate.service.routes import admin, health, models, predict, v2

# (prefix, router): the single list both the app and the route templates are built from.
INCLUDED: tuple[tuple[str, APIRouter], ...] = (
    ("", health.router),
    ("/v1", predict.router),
    ("/v1", models.router),
    ("/v2", v2.router),
    ("", admin.router),
)

api_router = APIRouter()
for _prefix, _router in INCLUDED:
    api_router.include_router(_router, prefix=_prefix)


def route_templates() -> list[str]:
    """Full path templates of the API routes, e.g. ``/v2/models/{name}/infer`` (metrics labels)."""
    return [prefix + route.path for prefix, router in INCLUDED for route in router.routes]


__all__ = ["api_router", "route_templates"]
