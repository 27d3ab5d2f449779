"""The lean end of the ``/v1`` request path: answers encoded with orjson, without FastAPI's
``response_model`` pass re-validating what the worker already typed.

``/v1/predict`` and ``/v1/predict/file`` answer :func:`~bayesgate.service.schemas.predict_response`
through :func:`json_response`; :class:`~bayesgate.service.schemas.PredictResponse` stays the
OpenAPI documentation of that body, and the tests check that the orjson body equals the pydantic
encoding key for key.
"""

from __future__ import annotations

from typing import Any

import orjson
from fastapi.responses import Response


def json_response(body: Any, status_code: int = 200) -> Response:
    """``body`` (plain dicts, lists, str, int, float, bool, None) as an orjson-encoded answer."""
    return Response(orjson.dumps(body), status_code=status_code, media_type="application/json")
