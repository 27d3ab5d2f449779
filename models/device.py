"""Device selection: CUDA when present, CPU otherwise; the number of CPU threads."""

from __future__ import annotations

import torch

from bayesgate.errors import DeviceUnavailable, InvalidArgument

DEVICE_CHOICES = ("auto", "cpu", "cuda")


def pick_device(preference: str = "auto") -> torch.device:
    """Return the device to run on.

    ``auto`` picks ``cuda`` when a GPU is visible and falls back to ``cpu``; ``cuda`` on a host
    without a GPU is an error rather than a silent fallback, so a misconfigured deployment is
    noticed at start-up.
    """
    if preference not in DEVICE_CHOICES and not preference.startswith("cuda:"):
        raise InvalidArgument(
            f"device must be one of {', '.join(DEVICE_CHOICES)} or cuda:N, got {preference!r}"
        )
    if preference == "auto":
        return torch.device("cuda" if torch.cuda.is_available() else "cpu")
    if preference.startswith("cuda") and not torch.cuda.is_available():
        raise DeviceUnavailable(
            f"device {preference!r} requested but CUDA is not available on this host"
        )
    return torch.device(preference)


def set_threads(threads: int | None) -> None:
    """``torch.set_num_threads(threads)`` (``--threads``); None leaves torch's default."""
    if threads is None:
        return
    if threads < 1:
        raise InvalidArgument(f"--threads must be ≥ 1, got {threads}")
    torch.set_num_threads(threads)
