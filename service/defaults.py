"""Defaults of the service that its commands' ``--help`` states, without pydantic or torch.

:class:`~bayesgate.service.settings.Settings` (pydantic-settings, ~0.3 s to import) and
:class:`~bayesgate.service.gate.Gate` (torch, ~3 s) take these values from here, and so do the
parsers of ``bayesgate serve`` and ``bayesgate predict``: their ``--help`` answers without either
import and states the defaults that run (``tests/test_cli_flag_defaults.py``).
"""

from __future__ import annotations

ENV_PREFIX = "BAYESGATE_"
"""Prefix of the settings' environment variables (``BAYESGATE_PORT`` → ``Settings.port``)."""
DEFAULT_HOST = "127.0.0.1"
"""``BAYESGATE_HOST``: the address ``bayesgate serve`` binds."""
DEFAULT_PORT = 8000
"""``BAYESGATE_PORT``: the port ``bayesgate serve`` listens on."""
DEFAULT_WORKERS = 1
"""``BAYESGATE_WORKERS``: ``bayesgate serve``'s worker processes."""
DEFAULT_MAX_INSTANCES = 256
"""``BAYESGATE_MAX_INSTANCES``: most images in one request."""
DEFAULT_BATCH_SIZE = DEFAULT_MAX_INSTANCES
"""Images per engine call of :class:`~bayesgate.service.gate.Gate` and ``bayesgate predict``:
the service's default ``max_instances``, so that a chunk is a request."""
