"""Device selection: CUDA when present, CPU otherwise."""

from __future__ import annotations

import torch

DEVICE_CHOICES = ("auto", "cpu", "cuda")


def pick_device(preference: str = "auto") -> torch.device:
    """Return the device to run on.

    ``auto`` picks ``cuda`` when a GPU is visible and falls back to ``cpu``; ``cuda`` on a host
    without a GPU is an error rather than a silent fallback, so a misconfigured deployment is
    noticed at start-up.
    """
    if preference not in DEVICE_CHOICES and not preference.startswith("cuda:"):
        raise ValueError(
            f"device must be one of {', '.join(DEVICE_CHOICES)} or cuda:N, got {preference!r}"
        )
    if preference == "auto":
        return torch.device("cuda" if torch.cuda.is_available() else "cpu")
    if preference.startswith("cuda") and not torch.cuda.is_available():
        raise RuntimeError(
            f"device {preference!r} requested but CUDA is not available on this host"
        )
    return torch.device(preference)
