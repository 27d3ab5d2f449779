"""``bayesgate serve``: run the prediction service under uvicorn.

Flags override the ``BAYESGATE_*`` settings; with no flag and no environment it serves the
bundled default model on 127.0.0.1:8000. The model directory is checked before uvicorn starts,
so a missing or broken model/calibration ends with one line ``bayesgate: error: <file>: <problem>``
and exit code 2 (a failure that only shows inside the server, e.g. the warm-up, exits with 3).

Operations: logs are JSON lines on stderr (``BAYESGATE_LOG_FORMAT=text`` for uvicorn's format);
SIGTERM drains (readiness off, ``BAYESGATE_DRAIN_DELAY_S`` more serving, in-flight requests
finish within ``BAYESGATE_DRAIN_TIMEOUT_S``) and exits 0. With ``--workers N > 1`` the processes
share a runtime directory (``BAYESGATE_RUNTIME_DIR``, a fresh temporary one unless set) holding the
admin state and the Prometheus multiprocess files (``PROMETHEUS_MULTIPROC_DIR``, default
``<runtime dir>/metrics``); stale files there are deleted at start.
"""

from __future__ import annotations

import argparse
import os
import shutil
import signal
import sys
import tempfile
from pathlib import Path
from types import FrameType
from typing import TYPE_CHECKING, Any

from bayesgate.errors import InvalidArgument
from bayesgate.extras import Need
from bayesgate.models.device import DEFAULT_DEVICE
from bayesgate.models.store.bundled import DEFAULT_MODEL_DIR
from bayesgate.service.defaults import DEFAULT_HOST, DEFAULT_PORT, DEFAULT_WORKERS, ENV_PREFIX

if TYPE_CHECKING:
    import uvicorn
    from pydantic import ValidationError

    from bayesgate.service.settings import Settings

FLAGS = {
    "host": "--host",
    "port": "--port",
    "grpc_port": "--grpc-port",
    "native_port": "--native-port",
    "workers": "--workers",
    "model_dir": "--model-dir",
    "device": "--device",
    "demo": "--demo",
}
"""Settings field → the ``serve`` flag that overrides it (the overrides are named by it)."""
GRPC_MODULES = ("grpc", "tritonclient.grpc")  # what bayesgate.service.grpc_server imports
MULTIPROC_ENV = "PROMETHEUS_MULTIPROC_DIR"  # = bayesgate.service.metrics.MULTIPROC_ENV (must not be
# imported before the variable is set: prometheus_client picks its mode at import)


def register(sub: argparse._SubParsersAction) -> None:
    p = sub.add_parser(
        "serve",
        help="serve predictions with uncertainty and the adversarial flag over HTTP",
        description="Start the HTTP service (FastAPI + uvicorn). Other settings come from "
        f"{ENV_PREFIX}* environment variables (see docs/service.md).",
    )
    p.add_argument(
        "--host", default=None, help=f"bind address (default {ENV_PREFIX}HOST or {DEFAULT_HOST})"
    )
    p.add_argument(
        "--port", type=int, default=None, help=f"port (default {ENV_PREFIX}PORT or {DEFAULT_PORT})"
    )
    p.add_argument(
        "--grpc-port",
        type=int,
        default=None,
        help=f"also serve KServe v2 gRPC on this port (default {ENV_PREFIX}GRPC_PORT or off; "
        "needs bayesgate[grpc])",
    )
    p.add_argument(
        "--native-port",
        type=int,
        default=None,
        help=f"also serve HTTP on this port through the native front end: /v2 binary infer "
        f"without Python per request, the rest relayed (default {ENV_PREFIX}NATIVE_PORT or off; "
        "builds its library with cargo on first use, see `bayesgate build-native`)",
    )
    p.add_argument(
        "--workers",
        type=int,
        default=None,
        help=f"processes (default {ENV_PREFIX}WORKERS or {DEFAULT_WORKERS})",
    )
    p.add_argument(
        "--model-dir",
        type=Path,
        default=None,
        help=f"model directory, or a bundled model's name: {DEFAULT_MODEL_DIR.name} (the default) "
        f"or bayesgate-cnn; default {ENV_PREFIX}MODEL_DIR or {DEFAULT_MODEL_DIR.name}",
    )
    p.add_argument("--device", default=None, help=f"auto, cpu or cuda (default {DEFAULT_DEVICE})")
    p.add_argument(
        "--demo",
        action="store_true",
        default=None,
        help="turn on the demo page's attack panel and POST /v1/attack (default "
        f"{ENV_PREFIX}DEMO or off; needs the attacks extra)",
    )
    ray = p.add_argument_group(
        "Ray Serve",
        f"replicas, GPUs and autoscaling come from {ENV_PREFIX}RAY_* variables (docs/ray.md); "
        "needs the `ray` extra",
    )
    ray.add_argument(
        "--ray",
        action="store_true",
        help="run as a Ray Serve application (a local Ray instance unless --address is given)",
    )
    ray.add_argument(
        "--address",
        default=None,
        help="with --ray: a running cluster (auto, HOST:6379 or ray://HOST:10001)",
    )
    ray.add_argument(
        "--detach",
        action="store_true",
        help="with --ray --address: deploy, leave the application running and return",
    )
    p.set_defaults(func=cmd_serve)
    b = sub.add_parser(
        "build-native",
        help="build the native front end's library (Rust, cargo) for serve --native-port",
        description="Build service/native_front (a Rust crate without dependencies: offline) "
        "with cargo into the user cache, $XDG_CACHE_HOME/bayesgate/native/<digest>/, and print "
        "the library's path. `serve --native-port` builds it too when it is missing.",
    )
    b.add_argument(
        "--force", action="store_true", help="build again even when this digest is built"
    )
    b.set_defaults(func=cmd_build_native)


def cmd_serve(args: argparse.Namespace) -> int:
    import uvicorn
    from pydantic import ValidationError

    from bayesgate.models.store.bundled import model_dir_not_found
    from bayesgate.service.errors import StartupError
    from bayesgate.service.event_loop import LOOP_FACTORIES, uvloop_missing
    from bayesgate.service.http_server import http_protocol
    from bayesgate.service.logs import uvicorn_log_config
    from bayesgate.service.settings import settings_from_env

    overrides = {
        "host": args.host,
        "port": args.port,
        "grpc_port": args.grpc_port,
        "native_port": args.native_port,
        "workers": args.workers,
        "model_dir": args.model_dir,
        "device": args.device,
        "demo": args.demo,
    }
    try:
        settings = settings_from_env(**overrides)
    except ValidationError as exc:
        given = [name for name, value in overrides.items() if value is not None]
        raise setting_error(exc, ENV_PREFIX, {name: FLAGS[name] for name in given}) from None
    if (args.address or args.detach) and not args.ray:
        raise InvalidArgument("--address and --detach only apply with --ray")
    if args.ray and settings.workers > 1:
        raise InvalidArgument(
            "--workers does not apply with --ray: set BAYESGATE_RAY_NUM_REPLICAS instead"
        )
    if args.ray and settings.native_port is not None:
        raise InvalidArgument("--native-port does not apply with --ray")
    if settings.grpc_port is not None:
        check_grpc_installed(ENV_PREFIX + "GRPC_PORT" if args.grpc_port is None else "--grpc-port")
    if settings.event_loop == "uvloop" and (problem := uvloop_missing()) is not None:
        raise InvalidArgument(f"{ENV_PREFIX}EVENT_LOOP=uvloop: {problem}")
    if args.model_dir is not None and not settings.model_dir.is_dir():
        raise InvalidArgument(model_dir_not_found(args.model_dir, "--model-dir"))
    try:
        settings.admin_key()  # an unreadable or short key file: one line, before anything starts
        if not args.ray:
            check_listen(settings.host, settings.port, "--host/--port")
            if settings.grpc_port is not None:
                check_listen(settings.host, settings.grpc_port, "--grpc-port")
            if settings.native_port is not None:
                check_listen(settings.host, settings.native_port, "--native-port")
                ensure_native_library(
                    settings.native_library,
                    "--native-port" if args.native_port is not None else ENV_PREFIX + "NATIVE_PORT",
                )
        # torch is imported only now: every check above answers without it (~4 s here)
        from bayesgate.models.device import pick_device
        from bayesgate.service.served_model import load_served_model

        pick_device(settings.device)
        load_served_model(settings.model_dir, "cpu")  # fail fast, before uvicorn starts
    except (StartupError, RuntimeError) as exc:
        raise InvalidArgument(str(exc)) from None
    if settings.demo:
        from bayesgate.service.demo_attack import attacks_available

        if (problem := attacks_available()) is not None:
            raise InvalidArgument(f"--demo: {problem}")
    # Worker processes (and the app factory) read the settings from the environment.
    for name, value in overrides.items():
        if value is not None:
            os.environ[ENV_PREFIX + name.upper()] = str(value)
    if args.ray:
        return _serve_on_ray(settings, args.address, args.detach)
    own_runtime_dir = _prepare_shared_dirs(settings.workers, settings.runtime_dir)
    # uvicorn re-raises the SIGTERM it handled once it has shut down gracefully: exit 0 then
    # (the default action would kill the process with status -15).
    signal.signal(signal.SIGTERM, _exit_cleanly)
    print(page_message(settings), flush=True)
    try:
        run_uvicorn(
            uvicorn.Config(
                "bayesgate.service.app:create_app",
                factory=True,
                host=settings.host,
                port=settings.port,
                workers=settings.workers,
                log_level=settings.log_level,
                log_config=uvicorn_log_config(settings.log_level, settings.log_format),
                access_log=False,  # the app writes its own access log (with request ids)
                timeout_graceful_shutdown=settings.drain_timeout_s,  # type: ignore[arg-type]
                # Both parsers bound the request line + headers, and their shutdown keeps
                # connections whose request is on its way (http_server.py, httptools_protocol.py).
                http=http_protocol(settings.http_parser),
                loop=LOOP_FACTORIES[settings.event_loop],
                h11_max_incomplete_event_size=settings.max_header_bytes,
                timeout_keep_alive=settings.keep_alive_timeout_s,
                timeout_worker_healthcheck=settings.worker_healthcheck_timeout_s,
            ),
            drain_delay_s=settings.drain_delay_s,
        )
    finally:
        if own_runtime_dir is not None:
            shutil.rmtree(own_runtime_dir, ignore_errors=True)
    return 0


def ensure_native_library(given: Path | None, source: str) -> None:
    """The native front end's library (``given``, else built now when missing, with one line on
    stdout); a missing ``cargo`` or a failed build is one line naming ``source``."""
    from bayesgate.service.native_build import NativeUnavailable, cached_library, library_path

    try:
        if given is None and not cached_library().is_file():
            print("bayesgate: building the native front end (once; a few seconds)…", flush=True)
        library_path(given, build=True)
    except NativeUnavailable as exc:
        raise InvalidArgument(f"{source}: {exc}") from None


def cmd_build_native(args: argparse.Namespace) -> int:
    from bayesgate.service.native import load_library
    from bayesgate.service.native_build import build_library, cached_library

    path = cached_library()
    if args.force or not path.is_file():
        print("building the native front end with cargo…", file=sys.stderr, flush=True)
        path = build_library(quiet=False)
    try:
        load_library(path)  # the ABI this package needs
    except OSError as exc:
        raise InvalidArgument(f"{path}: {exc}") from None
    print(path)
    return 0


def check_grpc_installed(source: str) -> None:
    """One line naming ``source`` (``--grpc-port`` or the variable) when the grpc extra is
    missing: the app would report it only after the start-up, with a traceback and exit code 3."""
    from bayesgate.extras import missing_message, missing_need

    need = missing_need(Need(module, f"{source}: gRPC") for module in GRPC_MODULES)
    if need is not None:
        raise InvalidArgument(missing_message(need.what, need.module))


def check_listen(host: str, port: int, flags: str) -> None:
    """Bind ``(host, port)`` once and let go, before the model loads: a name that does not
    resolve or an address in use is one line naming ``flags`` (uvicorn would report it after the
    start-up, as a log line, with exit code 3)."""
    import socket

    try:
        infos = socket.getaddrinfo(host, port, type=socket.SOCK_STREAM, flags=socket.AI_PASSIVE)
    except socket.gaierror as exc:
        raise InvalidArgument(f"{flags}: cannot resolve host {host!r} ({exc.strerror})") from None
    family, kind, proto, _, address = infos[0]
    with socket.socket(family, kind, proto) as probe:
        probe.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)  # as uvicorn binds
        try:
            probe.bind(address)
        except OSError as exc:
            raise InvalidArgument(
                f"{flags}: cannot listen on {host}:{port} ({exc.strerror or exc})"
            ) from None


def run_uvicorn(config: uvicorn.Config, drain_delay_s: float = 0.0) -> None:
    """``uvicorn.run`` for a ready ``uvicorn.Config``: one process, or with ``workers > 1`` the
    supervisor of :mod:`bayesgate.service.http_server` (it refuses new connections and closes its
    copy of the listening socket just before the workers' ``drain_delay_s`` ends)."""
    import uvicorn

    from bayesgate.service.http_server import Supervisor

    try:
        if config.workers > 1:
            Supervisor(config, sockets=[config.bind_socket()], drain_delay_s=drain_delay_s).run()
            return
        server = uvicorn.Server(config)
        server.run()
    except KeyboardInterrupt:  # as uvicorn.run
        return
    if not server.started:
        raise SystemExit(3)  # uvicorn's STARTUP_FAILURE: the app did not start


def _serve_on_ray(settings: Settings, address: str | None, detach: bool) -> int:
    from pydantic import ValidationError

    try:
        import ray.serve  # noqa: F401  (the extra; bayesgate.service.ray_run imports it only when it runs)

        from bayesgate.service.ray_run import DeployFailed, run_on_ray
    except ImportError as exc:
        raise InvalidArgument(
            f"--ray needs Ray Serve ({exc.name} is not installed): pip install 'bayesgate[ray]'"
        ) from None
    try:
        return run_on_ray(settings, address, detach)
    except ValidationError as exc:
        raise setting_error(exc, ENV_PREFIX + "RAY_") from None
    except DeployFailed as exc:
        print(f"bayesgate: error: {exc}", file=sys.stderr)
        return 3


def page_message(settings: Settings) -> str:
    """The line ``bayesgate serve`` prints on start: where to open the page and the API docs
    (with port 0 the port is not known until uvicorn binds it, after this line)."""
    if settings.port == 0:
        return (
            "bayesgate: port 0: the system picks a free port; uvicorn's 'Uvicorn running on …' "
            "line below names it (the page is at its /)"
        )
    host = settings.host
    if host in ("0.0.0.0", "::", ""):  # every interface: this machine reaches it as localhost
        host = "localhost"
    if ":" in host:
        host = f"[{host}]"
    base = f"http://{host}:{settings.port}"
    docs = f", API docs at {base}/docs" if settings.docs else ""
    demo = " (attack panel on: --demo)" if settings.demo else ""
    return f"bayesgate: page at {base}/{demo}{docs}"


def setting_error(
    exc: ValidationError, prefix: str, flags: dict[str, str] | None = None
) -> ValueError:
    """The first problem of a settings validation error, named by the flag that gave the value
    (``flags``: field → flag, for the values the command line passed) or else by its
    environment variable. A problem of several settings together (a model validator: no field)
    is its own message, which names the variables; the settings are not dumped."""
    first = exc.errors()[0]
    message = first["msg"].removeprefix("Value error, ")
    if not first["loc"]:
        return InvalidArgument(message)
    field = "_".join(str(p) for p in first["loc"])
    name = (flags or {}).get(field) or prefix + field.upper()
    got = "" if "KEY" in name.upper() else f" (got {first.get('input')!r})"  # never echo a secret
    if name.startswith("--"):
        return InvalidArgument(f"{name}: {message}{got}")
    return InvalidArgument(f"setting {name}: {message}{got}{service_link_hint(first)}")


def service_link_hint(error: Any) -> str:
    """Why an environment value looks like ``tcp://10.0.0.1:80``: Kubernetes' service links (a
    Service named ``bayesgate`` gives every pod of its namespace ``BAYESGATE_PORT=tcp://…``)."""
    value = error.get("input")
    if not (isinstance(value, str) and value.startswith(("tcp://", "udp://"))):
        return ""
    return (
        "; that is a Kubernetes service link (a Service named bayesgate sets BAYESGATE_PORT and "
        "BAYESGATE_SERVICE_* in every pod of its namespace): set enableServiceLinks: false in "
        "the pod spec, or the variable explicitly (deploy/kubernetes does both)"
    )


def _exit_cleanly(signum: int, frame: FrameType | None) -> None:
    raise SystemExit(0)


def _prepare_shared_dirs(workers: int, runtime_dir: Path | None) -> Path | None:
    """Runtime and metrics directories for several worker processes; returns the runtime
    directory if this command created it (to delete it at exit)."""
    created = None
    if workers > 1 and runtime_dir is None:
        runtime_dir = created = Path(tempfile.mkdtemp(prefix="bayesgate-"))
        os.environ[ENV_PREFIX + "RUNTIME_DIR"] = str(runtime_dir)
    if runtime_dir is not None:
        runtime_dir.mkdir(parents=True, exist_ok=True)
        from bayesgate.service.control import forget_admin_changes

        forget_admin_changes(runtime_dir)
        if workers > 1 and MULTIPROC_ENV not in os.environ:
            os.environ[MULTIPROC_ENV] = str(runtime_dir / "metrics")
    metrics_dir = os.environ.get(MULTIPROC_ENV)
    if metrics_dir:
        Path(metrics_dir).mkdir(parents=True, exist_ok=True)
        from bayesgate.service.metrics import clear_directory  # after the variable is set

        clear_directory(metrics_dir)
    return created
