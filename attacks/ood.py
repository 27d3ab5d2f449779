"""Out-of-distribution inputs for detection tests, all ``N×1×28×28`` in [0, 1].

- ``uniform`` — i.i.d. pixels ``U(0, 1)``;
- ``gaussian`` — i.i.d. pixels ``clip(N(0.5, 0.5²), 0, 1)``;
- ``rotated`` — the given MNIST images rotated by 90° (counter-clockwise, ``torch.rot90``);
- ``inverted`` — the given MNIST images inverted, ``1 − x``.

These four are :data:`~bayesgate.attacks.ood_names.DEFAULT_OOD`, what ``detect-eval`` runs unless
told otherwise. The **fresh** sets (:data:`~bayesgate.attacks.ood_names.FRESH_OOD`, added after
the detector's rule was fixed, for an unseen evaluation nobody had looked at):

- ``rotated45`` — rotated by 45° counter-clockwise about the centre (bilinear, zero outside);
- ``rotated180`` — rotated by 180°;
- ``shifted`` — moved :data:`SHIFT` px right and down, zero-filled (no wrap-around);
- ``blurred`` — Gaussian blur with σ = :data:`BLUR_SIGMA` px (kernel ``±3σ``, normalised,
  zero padding);
- ``letters`` — Latin letters rendered offline in matplotlib's fonts
  (:mod:`bayesgate.attacks.ood_letters`), as many as the images given.

The noise and letter sets have as many images as the MNIST images given and are drawn from a
generator seeded ``seed`` (the same images on every machine).
"""

from __future__ import annotations

import math
from collections.abc import Callable

import torch
import torch.nn.functional as F

from bayesgate.attacks.ood_letters import letter_images
from bayesgate.attacks.ood_names import OOD_NAMES
from bayesgate.tables import keyed_by

GAUSSIAN_MEAN, GAUSSIAN_STD = 0.5, 0.5
SHIFT = 6
BLUR_SIGMA = 2.0

OODMaker = Callable[[torch.Tensor, torch.Generator], torch.Tensor]


def _uniform(x: torch.Tensor, rng: torch.Generator) -> torch.Tensor:
    return torch.rand(x.shape, generator=rng)


def _gaussian(x: torch.Tensor, rng: torch.Generator) -> torch.Tensor:
    noise = torch.randn(x.shape, generator=rng)
    return (GAUSSIAN_MEAN + GAUSSIAN_STD * noise).clamp(0.0, 1.0)


def _rotated(x: torch.Tensor, rng: torch.Generator) -> torch.Tensor:
    return torch.rot90(x, 1, dims=(-2, -1)).contiguous()


def _inverted(x: torch.Tensor, rng: torch.Generator) -> torch.Tensor:
    return 1.0 - x


def rotate(x: torch.Tensor, degrees: float) -> torch.Tensor:
    """``x`` (N×1×H×W) rotated counter-clockwise about the image centre, bilinear, zero outside."""
    a = math.radians(degrees)
    # on screen (x right, y down) counter-clockwise sends (x, y) to (c·x + s·y, −s·x + c·y);
    # affine_grid maps output to input coordinates, i.e. the inverse rotation
    theta = torch.tensor([[math.cos(a), -math.sin(a), 0.0], [math.sin(a), math.cos(a), 0.0]])
    grid = F.affine_grid(theta.expand(x.shape[0], 2, 3), list(x.shape), align_corners=False)
    return F.grid_sample(x, grid, mode="bilinear", padding_mode="zeros", align_corners=False)


def shift(x: torch.Tensor, down: int, right: int) -> torch.Tensor:
    """``x`` moved ``down``/``right`` pixels (≥ 0), zero-filled, without wrapping around."""
    out = torch.zeros_like(x)
    h, w = x.shape[-2:]
    out[..., down:, right:] = x[..., : h - down, : w - right]
    return out


def gaussian_blur(x: torch.Tensor, sigma: float) -> torch.Tensor:
    """Separable Gaussian blur, kernel ``exp(−t²/2σ²)`` on ``t ∈ [−⌈3σ⌉, ⌈3σ⌉]`` normalised to
    sum 1, zero padding (ink near the border fades, as a real blur off the page would)."""
    r = math.ceil(3 * sigma)
    t = torch.arange(-r, r + 1, dtype=torch.float64)
    k = torch.exp(-(t**2) / (2 * sigma**2))
    k = (k / k.sum()).to(x.dtype)
    out = F.conv2d(x, k.view(1, 1, 1, -1), padding=(0, r))
    return F.conv2d(out, k.view(1, 1, -1, 1), padding=(r, 0)).clamp(0.0, 1.0)


def _rotated45(x: torch.Tensor, rng: torch.Generator) -> torch.Tensor:
    return rotate(x, 45.0).clamp(0.0, 1.0)


def _rotated180(x: torch.Tensor, rng: torch.Generator) -> torch.Tensor:
    return torch.rot90(x, 2, dims=(-2, -1)).contiguous()


def _shifted(x: torch.Tensor, rng: torch.Generator) -> torch.Tensor:
    return shift(x, SHIFT, SHIFT)


def _blurred(x: torch.Tensor, rng: torch.Generator) -> torch.Tensor:
    return gaussian_blur(x, BLUR_SIGMA)


def _letters(x: torch.Tensor, rng: torch.Generator) -> torch.Tensor:
    return letter_images(x.shape[0], rng)


OOD_SETS: dict[str, OODMaker] = keyed_by(
    OOD_NAMES,
    {
        "uniform": _uniform,
        "gaussian": _gaussian,
        "rotated": _rotated,
        "inverted": _inverted,
        "rotated45": _rotated45,
        "rotated180": _rotated180,
        "shifted": _shifted,
        "blurred": _blurred,
        "letters": _letters,
    },
    "OOD sets",
)
OOD_LABELS = {
    "uniform": "uniform noise",
    "gaussian": f"Gaussian noise N({GAUSSIAN_MEAN:g}, {GAUSSIAN_STD:g}²), clipped",
    "rotated": "MNIST rotated 90°",
    "inverted": "inverted MNIST 1 − x",
    "rotated45": "MNIST rotated 45°",
    "rotated180": "MNIST rotated 180°",
    "shifted": f"MNIST shifted {SHIFT} px right and down",
    "blurred": f"MNIST blurred, Gaussian σ = {BLUR_SIGMA:g} px",
    "letters": "letters A–Z a–z, 8 fonts",
}


def ood_images(name: str, x: torch.Tensor, seed: int = 0) -> torch.Tensor:
    """The OOD set ``name`` made from (or shaped like) the MNIST images ``x`` (N×1×28×28, CPU)."""
    if name not in OOD_SETS:
        raise ValueError(f"unknown OOD set {name!r}; choose one of {', '.join(OOD_SETS)}")
    rng = torch.Generator(device="cpu").manual_seed(seed)
    return OOD_SETS[name](x.detach().cpu().float(), rng)
