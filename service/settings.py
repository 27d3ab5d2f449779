"""Service settings, read from the environment (prefix ``BAYESGATE_``) by pydantic-settings.

Example: ``BAYESGATE_MODEL_DIR=runs/cnn BAYESGATE_MAX_BATCH_SIZE=32 bayesgate serve``.
"""

from __future__ import annotations

from pathlib import Path
from typing import Literal

from pydantic import Field, SecretStr, field_validator, model_validator
from pydantic_settings import BaseSettings, SettingsConfigDict

from bayesgate.errors import InvalidArgument
from bayesgate.models.device import DEFAULT_DEVICE
from bayesgate.models.store.bundled import (  # noqa: F401  (re-exported: the service's names)
    BUNDLED_MODELS_DIR,
    DEFAULT_ALIAS,
    DEFAULT_MODEL_DIR,
    bundled_model_names,
    resolve_model_dir,
)
from bayesgate.service.defaults import (
    DEFAULT_HOST,
    DEFAULT_MAX_INSTANCES,
    DEFAULT_PORT,
    DEFAULT_WORKERS,
    ENV_PREFIX,
)
from bayesgate.service.event_loop import EventLoopName

LogLevel = Literal["critical", "error", "warning", "info", "debug", "trace"]
LogFormat = Literal["json", "text"]
MetricsPlacement = Literal["public", "protected", "off"]
HttpParser = Literal["auto", "httptools", "h11"]
MIN_API_KEY_LENGTH = 16


class Settings(BaseSettings):
    """Everything an operator can tune; each field is the env var ``BAYESGATE_<FIELD>``."""

    model_config = SettingsConfigDict(
        env_prefix=ENV_PREFIX, case_sensitive=False, extra="ignore", frozen=True
    )

    model_dir: Path = Field(
        DEFAULT_MODEL_DIR,
        description="model directory (model.safetensors, card.json, calibration), or the name of "
        "a bundled model: bayesgate-robust (the default, also called bayesgate-default) or "
        "bayesgate-cnn",
    )
    device: str = Field(
        DEFAULT_DEVICE, pattern=r"^(auto|cpu|cuda(:\d+)?)$", description="auto/cpu/cuda"
    )
    default_mc_samples: int | None = Field(
        None,
        ge=1,
        description="K when a request gives none; unset = the flag's K (the detector's when it "
        "decides, else calibration.json's)",
    )
    max_mc_samples: int = Field(100, ge=1, description="largest K a request may ask for")
    max_instances: int = Field(
        DEFAULT_MAX_INSTANCES, ge=1, description="most images in one request"
    )
    max_batch_size: int = Field(
        64, ge=1, description="most instances merged into one engine call (1 = no batching)"
    )
    max_queue_delay_ms: float = Field(
        5.0, ge=0, description="longest wait for more requests before a batch runs"
    )
    queue_capacity: int = Field(256, ge=1, description="requests waiting before 503 Retry-After")
    max_queued_work: int = Field(
        65536,
        ge=1,
        description="image-passes (Σ images × K) waiting before 503 Retry-After; a request that "
        "would exceed it is refused at once (one request always fits an empty queue)",
    )
    request_timeout_s: float = Field(30.0, gt=0, description="deadline per request before 504")
    max_body_bytes: int = Field(8 * 1024 * 1024, ge=1024, description="largest request body")
    max_header_bytes: int = Field(
        32 * 1024,
        ge=1024,
        description="largest request head: a head still incomplete beyond it gets JSON 431 and is "
        "closed (httptools: counted by the server's protocol; h11: its "
        "h11_max_incomplete_event_size); for a head that arrived at once, the app's limit on "
        "header bytes (431)",
    )
    max_header_count: int = Field(100, ge=1, description="most request headers (431 beyond)")
    http_parser: HttpParser = Field(
        "auto",
        description="uvicorn's HTTP/1.1 parser: httptools (about 0.1 ms less per request) or h11; "
        "auto = httptools when installed. Both bound the request head (431, closed); a head "
        "either rejects is a JSON 400 naming the parser's reason",
    )
    event_loop: EventLoopName = Field(
        "auto",
        description="uvicorn's event loop: uvloop, or asyncio (the standard library's, with "
        "bayesgate's repair of a shutdown race that resets a just-accepted connection); "
        "auto = uvloop when installed",
    )
    body_read_timeout_s: float = Field(
        30.0, gt=0, description="longest wait for the next piece of a request body (408 after)"
    )
    keep_alive_timeout_s: int = Field(
        5, ge=1, description="an idle keep-alive connection is closed after this many seconds"
    )
    linger_s: float = Field(
        10.0,
        ge=0,
        description="a connection closed while its client is still sending (413, 431, 400, 408 "
        "answered early) is half-closed and what still arrives is read and dropped, so the "
        "client can read the answer instead of a reset: for at most this long in all "
        "(0 = close at once)",
    )
    linger_idle_s: float = Field(
        2.0, gt=0, description="… and at most this long between two reads of such a connection"
    )
    worker_healthcheck_timeout_s: int = Field(
        60,
        ge=1,
        le=3600,
        description="with --workers N: how long a new worker of a SIGHUP rolling restart may take "
        "to become ready, and a running worker to answer the supervisor's health check, before "
        "it is killed (uvicorn's timeout_worker_healthcheck, whose default 5 s is shorter than "
        "a worker's start on a busy machine)",
    )
    num_threads: int = Field(0, ge=0, description="torch CPU threads; 0 = torch's default")
    switch_interval_us: float = Field(
        100.0,
        gt=0,
        le=1_000_000,
        description="CPython's thread switch interval while serving (sys.setswitchinterval), in "
        "µs: how long the model thread may wait for the GIL after a torch op while the event loop "
        "runs Python; 5000 is Python's default",
    )
    log_level: LogLevel = "info"
    log_format: LogFormat = Field(
        "json", description="json: one JSON object per log line; text: uvicorn's plain format"
    )
    access_log: bool = Field(True, description="one log line per HTTP request")
    docs: bool = Field(True, description="serve /docs, /redoc and /openapi.json")
    metrics: MetricsPlacement = Field(
        "public",
        description="GET /metrics: public (no key), protected (the admin API key) or off",
    )
    api_key: SecretStr | None = Field(
        None, description="key of the admin routes; unset (and no key file) = admin disabled"
    )
    api_key_file: Path | None = Field(
        None, description="file holding the admin key (e.g. a mounted secret); wins over api_key"
    )
    drain_delay_s: float = Field(
        2.0,
        ge=0,
        le=600,
        description="after SIGTERM: keep serving this long with readiness 503, then stop accepting",
    )
    drain_timeout_s: float = Field(
        20.0, gt=0, le=3600, description="then: longest wait for in-flight requests to finish"
    )
    runtime_dir: Path | None = Field(
        None,
        description="directory shared by the worker processes (admin changes); set by "
        "`bayesgate serve --workers N`",
    )
    host: str = Field(DEFAULT_HOST, description="`bayesgate serve` bind address")
    port: int = Field(DEFAULT_PORT, ge=0, le=65535, description="`bayesgate serve` port")
    workers: int = Field(DEFAULT_WORKERS, ge=1, description="`bayesgate serve` worker processes")
    demo: bool = Field(
        False,
        description="turn on POST /v1/attack and the page's attack panel (`bayesgate serve "
        "--demo`); keep it off in production: attacks cost far more than predictions",
    )
    demo_attack_concurrency: int = Field(
        1, ge=1, le=8, description="attacks running at once; one more gets 503 Retry-After"
    )
    demo_max_attack_steps: int = Field(100, ge=1, le=1000, description="most PGD steps per attack")
    demo_max_attack_mc_samples: int = Field(
        20, ge=1, le=100, description="most MC passes K in an attack's gradient"
    )
    grpc_port: int | None = Field(
        None,
        ge=0,
        le=65535,
        description="serve the Open Inference Protocol over gRPC on this port too (e.g. 8001; "
        "needs bayesgate[grpc]); unset: HTTP only",
    )
    native_port: int | None = Field(
        None,
        ge=0,
        le=65535,
        description="also serve HTTP on this port through the native front end (e.g. 8002): "
        "/v2 binary infer requests are answered without Python per request, everything else is "
        "relayed to the main port; needs its library (`bayesgate build-native`, Rust's cargo). "
        "One worker process only; unset: off",
    )
    native_library: Path | None = Field(
        None,
        description="the native front end's library built elsewhere (the Docker image sets it); "
        "unset: the user cache's build of the installed sources (`bayesgate build-native`)",
    )
    native_max_connections: int = Field(
        1024, ge=1, description="most open connections on the native port (503 beyond)"
    )

    @field_validator("model_dir")
    @classmethod
    def _bundled_name(cls, path: Path) -> Path:
        return resolve_model_dir(path)

    @field_validator("api_key")
    @classmethod
    def _check_key(cls, key: SecretStr | None) -> SecretStr | None:
        if key is None or key.get_secret_value() == "":
            return None
        _check_key_text(key.get_secret_value(), "api_key")
        return key

    @model_validator(mode="after")
    def _check_k(self) -> Settings:
        if self.default_mc_samples is not None and self.default_mc_samples > self.max_mc_samples:
            raise ValueError(
                f"{ENV_PREFIX}DEFAULT_MC_SAMPLES ({self.default_mc_samples}) exceeds "
                f"{ENV_PREFIX}MAX_MC_SAMPLES ({self.max_mc_samples})"
            )
        return self

    @model_validator(mode="after")
    def _check_grpc_port(self) -> Settings:
        if self.grpc_port is not None and self.grpc_port != 0 and self.grpc_port == self.port:
            raise ValueError(
                f"{ENV_PREFIX}GRPC_PORT ({self.grpc_port}) must differ from {ENV_PREFIX}PORT "
                "(gRPC is served on a port of its own)"
            )
        return self

    @model_validator(mode="after")
    def _check_native(self) -> Settings:
        if self.native_port is None:
            return self
        if self.workers > 1:
            raise ValueError(
                f"{ENV_PREFIX}NATIVE_PORT serves one process: it cannot be combined with "
                f"{ENV_PREFIX}WORKERS={self.workers} (run one process per port instead)"
            )
        if self.native_port != 0 and self.native_port in (self.port, self.grpc_port):
            raise ValueError(
                f"{ENV_PREFIX}NATIVE_PORT ({self.native_port}) must differ from "
                f"{ENV_PREFIX}PORT and {ENV_PREFIX}GRPC_PORT"
            )
        if self.port == 0:
            raise ValueError(
                f"{ENV_PREFIX}NATIVE_PORT needs a fixed {ENV_PREFIX}PORT (the native front end "
                "relays to it), not 0"
            )
        return self

    @model_validator(mode="after")
    def _check_metrics_key(self) -> Settings:
        if self.metrics == "protected" and self.api_key is None and self.api_key_file is None:
            raise ValueError(
                f"{ENV_PREFIX}METRICS=protected serves /metrics behind the admin API key: set "
                f"{ENV_PREFIX}API_KEY_FILE (or {ENV_PREFIX}API_KEY)"
            )
        return self

    @property
    def max_queue_delay_s(self) -> float:
        return self.max_queue_delay_ms / 1000.0

    def admin_key(self) -> bytes | None:
        """The admin API key as UTF-8 bytes (from ``api_key_file`` if set), or None = disabled.

        Raises ``ValueError`` naming the file when it cannot be read or holds a short key.
        """
        if self.api_key_file is not None:
            try:
                text = self.api_key_file.read_text(encoding="utf-8").strip()
            except (OSError, UnicodeDecodeError) as exc:
                raise InvalidArgument(
                    f"api_key_file {self.api_key_file}: cannot read ({exc})"
                ) from None
            _check_key_text(text, f"api_key_file {self.api_key_file}")
            return text.encode()
        if self.api_key is None:
            return None
        return self.api_key.get_secret_value().encode()


def _check_key_text(text: str, where: str) -> None:
    if len(text) < MIN_API_KEY_LENGTH:
        raise InvalidArgument(
            f"{where}: the admin key must have at least {MIN_API_KEY_LENGTH} characters"
        )
    if not (text.isascii() and text.isprintable()) or " " in text:
        raise InvalidArgument(f"{where}: the admin key must be printable ASCII without spaces")


def settings_from_env(**overrides: object) -> Settings:
    """Settings from the environment, with ``overrides`` taking precedence (CLI flags)."""
    return Settings(**{k: v for k, v in overrides.items() if v is not None})


_protocol_settings: list[Settings] = []


def protocol_settings() -> Settings:
    """The serving process's settings, read from its environment once, for uvicorn's HTTP
    protocol classes (uvicorn's worker processes import them by name and build one per
    connection, with no app at hand; ``bayesgate serve`` put every setting into the
    environment): the head limits, the lingering close's times."""
    if not _protocol_settings:
        _protocol_settings.append(settings_from_env())
    return _protocol_settings[0]
