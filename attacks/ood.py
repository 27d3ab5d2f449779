"""Out-of-distribution inputs for detection tests, all ``N×1×28×28`` in [0, 1].

- ``uniform`` — i.i.d. pixels ``U(0, 1)``;
- ``gaussian`` — i.i.d. pixels ``clip(N(0.5, 0.5²), 0, 1)``;
- ``rotated`` — the given MNIST images rotated by 90° (counter-clockwise, ``torch.rot90``);
- ``inverted`` — the given MNIST images inverted, ``1 − x``.

The noise sets have as many images as the MNIST images given and are drawn from a generator
seeded ``seed`` (the same images on every machine).
"""

from __future__ import annotations

from collections.abc import Callable

import torch

GAUSSIAN_MEAN, GAUSSIAN_STD = 0.5, 0.5

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


OOD_SETS: dict[str, OODMaker] = {
    "uniform": _uniform,
    "gaussian": _gaussian,
    "rotated": _rotated,
    "inverted": _inverted,
}
OOD_LABELS = {
    "uniform": "uniform noise",
    "gaussian": f"Gaussian noise N({GAUSSIAN_MEAN:g}, {GAUSSIAN_STD:g}²), clipped",
    "rotated": "MNIST rotated 90°",
    "inverted": "inverted MNIST 1 − x",
}


def ood_images(name: str, x: torch.Tensor, seed: int = 0) -> torch.Tensor:
    """The OOD set ``name`` made from (or shaped like) the MNIST images ``x`` (N×1×28×28, CPU)."""
    if name not in OOD_SETS:
        raise ValueError(f"unknown OOD set {name!r}; choose one of {', '.join(OOD_SETS)}")
    rng = torch.Generator(device="cpu").manual_seed(seed)
    return OOD_SETS[name](x.detach().cpu().float(), rng)
