"""Synthetic outliers for fitting the detector's logistic fusion ("outlier exposure").

Made from labelled MNIST images ``x`` (``N×1×28×28`` in [0, 1]) and their labels ``y``; every
output is ``N×1×28×28`` in [0, 1] and a deterministic function of ``(x, y, seed)``:

- ``chimera`` — the top half (rows 0–13) of image ``i`` above the bottom half (rows 14–27) of a
  partner ``j(i)`` of **another class**: real strokes, joined into no digit;
- ``patches`` — image ``i`` cut into a 4 × 4 grid of 7 × 7 tiles, the tiles put back in a random
  order that moves at least one of them: real stroke pieces, no digit's layout;
- ``overlay`` — ``max(x_i, x_j(i))`` with ``j(i)`` of another class: two digits on one page.

The partner of image ``i`` is the first image after ``i`` in a random cyclic order (seeded) whose
label differs from ``y_i``; with a single class present there is none, and an error says so.

Deliberately **none** of them is a transformation any evaluation set of ``detect-eval`` uses
(:mod:`bayesgate.attacks.ood`: noise, rotations by 45/90/180°, inversion, shifts, blur, letters):
the sets the detector is tested on stay unseen by the fit. No geometric transformation of a
whole digit (rotation, flip, transposition, shift, scaling) is used: those would be a proxy of
the rotated-digit test set.
"""

from __future__ import annotations

from collections.abc import Callable

import torch

from bayesgate.attacks.fit_settings import OUTLIER_KINDS
from bayesgate.tables import keyed_by

TILE = 7  # 28 = 4 × 7

OutlierMaker = Callable[[torch.Tensor, torch.Tensor, torch.Generator], torch.Tensor]


def partners(y: torch.Tensor, rng: torch.Generator) -> torch.Tensor:
    """For each row ``i`` an index ``j(i)`` with ``y[j(i)] ≠ y[i]``: the first row after ``i``
    in a random cyclic order (``torch.randperm`` with ``rng``) with another label."""
    n = int(y.shape[0])
    if n == 0:
        return torch.zeros(0, dtype=torch.long)
    if bool((y == y[0]).all()):
        raise ValueError("outliers: every image has the same label; no partner of another class")
    order = torch.randperm(n, generator=rng)
    labels = y[order]
    result = torch.empty(n, dtype=torch.long)
    for pos in range(n):  # N ≤ a few thousand; the scan stops at the first other class
        step = 1
        while labels[(pos + step) % n] == labels[pos]:
            step += 1
        result[order[pos]] = order[(pos + step) % n]
    return result


def _chimera(x: torch.Tensor, y: torch.Tensor, rng: torch.Generator) -> torch.Tensor:
    j = partners(y, rng)
    half = x.shape[-2] // 2
    return torch.cat([x[..., :half, :], x[j][..., half:, :]], dim=-2)


def _overlay(x: torch.Tensor, y: torch.Tensor, rng: torch.Generator) -> torch.Tensor:
    return torch.maximum(x, x[partners(y, rng)])


def tile_permutations(n: int, tiles: int, rng: torch.Generator) -> torch.Tensor:
    """``n`` random permutations of ``range(tiles)``, none the identity (``n×tiles``)."""
    perms = torch.argsort(torch.rand(n, tiles, generator=rng), dim=1)
    identity = torch.arange(tiles)
    while True:
        same = (perms == identity).all(dim=1)
        if not bool(same.any()):
            return perms
        redraw = torch.argsort(torch.rand(int(same.sum()), tiles, generator=rng), dim=1)
        perms[same] = redraw


def _patches(x: torch.Tensor, y: torch.Tensor, rng: torch.Generator) -> torch.Tensor:
    n, c, h, w = x.shape
    gh, gw = h // TILE, w // TILE
    # N×C×gh×T×gw×T → N×(gh·gw)×C×T×T
    tiles = (
        x.reshape(n, c, gh, TILE, gw, TILE)
        .permute(0, 2, 4, 1, 3, 5)
        .reshape(n, gh * gw, c, TILE, TILE)
    )
    perms = tile_permutations(n, gh * gw, rng)
    shuffled = torch.gather(tiles, 1, perms.view(n, -1, 1, 1, 1).expand_as(tiles))
    return shuffled.reshape(n, gh, gw, c, TILE, TILE).permute(0, 3, 1, 4, 2, 5).reshape(n, c, h, w)


OUTLIERS: dict[str, OutlierMaker] = keyed_by(
    OUTLIER_KINDS,
    {"chimera": _chimera, "patches": _patches, "overlay": _overlay},
    "outlier kinds",
)
OUTLIER_LABELS = {
    "chimera": "chimera: top half of one digit, bottom half of another class",
    "patches": "7×7 tiles of a digit in a random order",
    "overlay": "two digits of different classes overlaid (pixelwise max)",
}


def outlier_images(name: str, x: torch.Tensor, y: torch.Tensor, seed: int = 0) -> torch.Tensor:
    """The synthetic outliers ``name`` made from MNIST images ``x`` with labels ``y``."""
    if name not in OUTLIERS:
        raise ValueError(f"unknown outlier kind {name!r}; choose from {', '.join(OUTLIERS)}")
    if x.dim() != 4 or x.shape[-2] % TILE or x.shape[-1] % TILE:
        raise ValueError(
            f"outliers: expected N×C×H×W with H, W multiples of {TILE}, got {tuple(x.shape)}"
        )
    if y.shape[0] != x.shape[0]:
        raise ValueError(f"outliers: {x.shape[0]} images but {y.shape[0]} labels")
    rng = torch.Generator(device="cpu").manual_seed(seed)
    return OUTLIERS[name](x.detach().cpu().float(), y.detach().cpu(), rng).contiguous()
