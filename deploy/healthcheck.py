"""Container health check: exit 0 when the local BayesGate server answers ``GET /readyz`` with 200.

The Dockerfile's ``HEALTHCHECK`` and docker-compose.yml's ``healthcheck`` both run this file as
``/opt/venv/bin/python /opt/bayesgate/healthcheck.py``. It uses the standard library only (the
image has no curl) and reads the same settings as ``bayesgate serve``:

- port: ``BAYESGATE_PORT`` (default 8000);
- host: ``BAYESGATE_HOST`` unless that is a wildcard address (``0.0.0.0``, ``::``, empty), which
  is reached through the loopback (``127.0.0.1`` / ``::1``).

An optional argument replaces the path, e.g. ``healthcheck.py /healthz`` checks liveness only.
Proxy variables are ignored: the request never leaves the container. Exit status follows
Docker's contract: 0 healthy, 1 unhealthy (with one line on stdout saying why).
"""

from __future__ import annotations

import os
import sys
import urllib.error
import urllib.request
from collections.abc import Mapping, Sequence

DEFAULT_PORT = 8000
DEFAULT_PATH = "/readyz"
TIMEOUT_S = 4.0  # below the 5 s timeout the Dockerfile and compose file give the check

_WILDCARDS = {"": "127.0.0.1", "0.0.0.0": "127.0.0.1", "::": "::1", "[::]": "::1"}


def readiness_url(env: Mapping[str, str], path: str = DEFAULT_PATH) -> str:
    """``http://<host>:<port><path>`` for the server that ``env``'s settings describe."""
    raw_port = env.get("BAYESGATE_PORT", "").strip() or str(DEFAULT_PORT)
    try:
        port = int(raw_port)
    except ValueError:
        raise ValueError(f"BAYESGATE_PORT must be an integer, got {raw_port!r}") from None
    if not 0 < port < 65536:
        raise ValueError(f"BAYESGATE_PORT must be in 1..65535, got {port}")
    host = env.get("BAYESGATE_HOST", "").strip()
    host = _WILDCARDS.get(host, host).strip("[]")
    if ":" in host:  # IPv6 literal
        host = f"[{host}]"
    if not path.startswith("/"):
        raise ValueError(f"path must start with '/', got {path!r}")
    return f"http://{host}:{port}{path}"


def check(url: str, timeout_s: float = TIMEOUT_S) -> tuple[bool, str]:
    """``(healthy, reason)``: healthy iff ``GET url`` answers 200 within ``timeout_s``."""
    opener = urllib.request.build_opener(urllib.request.ProxyHandler({}))
    try:
        with opener.open(url, timeout=timeout_s) as response:
            status = response.status
    except urllib.error.HTTPError as exc:
        return False, f"{url}: HTTP {exc.code}"
    except (urllib.error.URLError, OSError) as exc:
        reason = getattr(exc, "reason", exc)
        return False, f"{url}: {reason}"
    if status != 200:
        return False, f"{url}: HTTP {status}"
    return True, f"{url}: HTTP 200"


def main(argv: Sequence[str] | None = None) -> int:
    args = list(sys.argv[1:] if argv is None else argv)
    if len(args) > 1:
        print("usage: healthcheck.py [PATH]", file=sys.stderr)
        return 1
    try:
        url = readiness_url(os.environ, *args)
    except ValueError as exc:
        print(f"unhealthy: {exc}")
        return 1
    healthy, reason = check(url)
    print(("healthy: " if healthy else "unhealthy: ") + reason)
    return 0 if healthy else 1


if __name__ == "__main__":
    sys.exit(main())
