"""API-key protection of the admin routes.

- No key configured (neither ``BAYESGATE_API_KEY`` nor ``BAYESGATE_API_KEY_FILE``): every admin
  route answers 403 ``admin_disabled`` — admin is off, never open.
- A key configured: the request must carry it as ``Authorization: Bearer <key>`` or
  ``X-API-Key: <key>`` (the bearer token is used when both are sent); otherwise 401
  ``unauthorized`` with ``WWW-Authenticate: Bearer``.

The comparison is constant-time: SHA-256 of the offered and of the configured key compared with
:func:`hmac.compare_digest`, so neither the content nor the length of the key leaks through the
response time. Keys are never logged.
"""

from __future__ import annotations

import hashlib
import hmac
from typing import Annotated

from fastapi import Depends, Request
from fastapi.security import APIKeyHeader, HTTPAuthorizationCredentials, HTTPBearer

from bayesgate.service.errors import AdminDisabled, Unauthorized

bearer_scheme = HTTPBearer(
    auto_error=False,
    scheme_name="AdminBearer",
    description="the admin API key as a bearer token",
)
api_key_scheme = APIKeyHeader(
    name="X-API-Key",
    auto_error=False,
    scheme_name="AdminApiKey",
    description="the admin API key",
)


def key_digest(key: bytes) -> bytes:
    return hashlib.sha256(key).digest()


def key_matches(offered: str, expected_digest: bytes) -> bool:
    """Constant-time check of ``offered`` against the SHA-256 digest of the configured key."""
    offered_digest = key_digest(offered.encode("utf-8", "surrogateescape"))
    return hmac.compare_digest(offered_digest, expected_digest)


async def require_admin(
    request: Request,
    bearer: Annotated[HTTPAuthorizationCredentials | None, Depends(bearer_scheme)],
    api_key: Annotated[str | None, Depends(api_key_scheme)],
) -> None:
    """Dependency of every admin route: 403 when admin is disabled, 401 without the right key."""
    expected: bytes | None = getattr(request.app.state, "admin_key_digest", None)
    if expected is None:
        raise AdminDisabled(
            "admin routes are disabled: this server has no API key "
            "(set BAYESGATE_API_KEY or BAYESGATE_API_KEY_FILE)"
        )
    offered = bearer.credentials if bearer is not None else api_key
    if not offered:
        raise Unauthorized(
            "missing API key: send 'Authorization: Bearer <key>' or 'X-API-Key: <key>'"
        )
    if not key_matches(offered, expected):
        raise Unauthorized("invalid API key")


async def refuse_unless_admin(request: Request) -> None:
    """:func:`require_admin` on the request's headers alone, for a route to call before it reads
    the body: an anonymous caller gets its 401/403 without its body being read or parsed."""
    await require_admin(request, await bearer_scheme(request), await api_key_scheme(request))
