"""``bayesgate serve``: run the prediction service under uvicorn.

Flags override the ``BAYESGATE_*`` settings; with no flag and no environment it serves the
bundled default model on 127.0.0.1:8000. The model directory is checked before uvicorn starts,
so a missing or broken model/calibration ends with one line ``bayesgate: error: <file>: <problem>``
and exit code 2 (a failure that only shows inside the server, e.g. the warm-up, exits with 3).
"""

from __future__ import annotations

import argparse
import os
from pathlib import Path

ENV_PREFIX = "BAYESGATE_"  # = service.settings.ENV_PREFIX (not imported: keeps --help fast)


def register(sub: argparse._SubParsersAction) -> None:
    p = sub.add_parser(
        "serve",
        help="serve predictions with uncertainty and the adversarial flag over HTTP",
        description="Start the HTTP service (FastAPI + uvicorn). Other settings come from "
        f"{ENV_PREFIX}* environment variables (see docs/service.md).",
    )
    p.add_argument(
        "--host", default=None, help=f"bind address (default {ENV_PREFIX}HOST or 127.0.0.1)"
    )
    p.add_argument(
        "--port", type=int, default=None, help=f"port (default {ENV_PREFIX}PORT or 8000)"
    )
    p.add_argument(
        "--workers", type=int, default=None, help=f"processes (default {ENV_PREFIX}WORKERS or 1)"
    )
    p.add_argument(
        "--model-dir",
        type=Path,
        default=None,
        help=f"model directory (default {ENV_PREFIX}MODEL_DIR or the bundled default model)",
    )
    p.add_argument("--device", default=None, help="auto, cpu or cuda (default auto)")
    p.set_defaults(func=cmd_serve)


def cmd_serve(args: argparse.Namespace) -> int:
    import uvicorn
    from pydantic import ValidationError

    from models.device import pick_device
    from service.errors import StartupError
    from service.loading import load_serving_model
    from service.settings import settings_from_env

    overrides = {
        "host": args.host,
        "port": args.port,
        "workers": args.workers,
        "model_dir": args.model_dir,
        "device": args.device,
    }
    try:
        settings = settings_from_env(**overrides)
    except ValidationError as exc:
        first = exc.errors()[0]
        field = ENV_PREFIX + "_".join(str(p) for p in first["loc"]).upper()
        raise ValueError(f"setting {field}: {first['msg']} (got {first.get('input')!r})") from None
    try:
        pick_device(settings.device)
        load_serving_model(settings.model_dir, "cpu")  # fail fast, before uvicorn starts
    except (StartupError, RuntimeError) as exc:
        raise ValueError(str(exc)) from None
    # Worker processes (and the app factory) read the settings from the environment.
    for name, value in overrides.items():
        if value is not None:
            os.environ[ENV_PREFIX + name.upper()] = str(value)
    uvicorn.run(
        "service.app:create_app",
        factory=True,
        host=settings.host,
        port=settings.port,
        workers=settings.workers,
        log_level=settings.log_level,
        timeout_graceful_shutdown=5,
    )
    return 0
