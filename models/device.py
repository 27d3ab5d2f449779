"""Device selection: CUDA when present, CPU otherwise; the number of CPU threads.

torch is imported inside the functions that use it, not at module level: every command's parser
reads :data:`DEVICE_CHOICES` and :func:`add_threads_flag` from here, and ``bayesgate COMMAND
--help`` (or a flag refused before the work starts) should not wait ~3 s for torch to load."""

from __future__ import annotations

import argparse
from typing import TYPE_CHECKING

from bayesgate.errors import DeviceUnavailable, InvalidArgument

if TYPE_CHECKING:
    import torch

DEVICE_CHOICES = ("auto", "cpu", "cuda")
DEFAULT_DEVICE = "auto"
"""The device when none is given: :func:`pick_device`'s, the ``--device`` flags' of ``predict``
and ``fit-detector``, and the service's ``BAYESGATE_DEVICE``."""


def pick_device(preference: str = DEFAULT_DEVICE) -> torch.device:
    """Return the device to run on.

    ``auto`` picks ``cuda`` when a GPU is visible and falls back to ``cpu``; ``cuda`` on a host
    without a GPU is an error rather than a silent fallback, so a misconfigured deployment is
    noticed at start-up.
    """
    if preference not in DEVICE_CHOICES and not preference.startswith("cuda:"):
        raise InvalidArgument(
            f"device must be one of {', '.join(DEVICE_CHOICES)} or cuda:N, got {preference!r}"
        )
    import torch

    if preference == "auto":
        return torch.device("cuda" if torch.cuda.is_available() else "cpu")
    if preference.startswith("cuda") and not torch.cuda.is_available():
        raise DeviceUnavailable(
            f"device {preference!r} requested but CUDA is not available on this host"
        )
    return torch.device(preference)


THREADS_HELP = "torch CPU threads"
"""Help of ``--threads`` on the commands that compute (see :func:`add_threads_flag`)."""


def add_threads_flag(parser: argparse.ArgumentParser) -> None:
    """``--threads N`` (default None: torch's own count, every core); the command applies it with
    :func:`set_threads` before its work."""
    parser.add_argument("--threads", type=int, default=None, help=THREADS_HELP)


def set_threads(threads: int | None) -> None:
    """``torch.set_num_threads(threads)`` (``--threads``); None leaves torch's default."""
    if threads is None:
        return
    if threads < 1:
        raise InvalidArgument(f"--threads must be ≥ 1, got {threads}")
    import torch

    torch.set_num_threads(threads)


def use_process_thread_count() -> None:
    """Make the calling thread compute with torch's thread count (``torch.get_num_threads()``,
    ``--threads``, ``BAYESGATE_NUM_THREADS``), from its first operation on.

    ``torch.set_num_threads`` sets OpenMP's count in the thread that calls it only; a thread
    started later reads torch's count in ATen's own parallel loops, but MKL's matrix products
    and oneDNN's convolutions run with OpenMP's default (every core) until some ATen parallel
    loop in that thread happens to apply the count. So the worker's first engine calls used a
    different count than the later ones — and than the setting (``--threads 1`` still computed
    on two cores, and a seeded answer's last bits changed after the first calls). Calling it
    again in the thread applies it there."""
    import torch

    torch.set_num_threads(torch.get_num_threads())
