"""HTTP routes: ``/v1`` predictions and models, health and readiness."""

from fastapi import APIRouter

from service.routes import health, models, predict

api_router = APIRouter()
api_router.include_router(health.router)
api_router.include_router(predict.router, prefix="/v1")
api_router.include_router(models.router, prefix="/v1")

__all__ = ["api_router"]
