"""Synthetic outliers (``bayesgate.attacks.outliers``), checked against their definitions."""

from __future__ import annotations

import pytest
import torch

from bayesgate.attacks.outliers import OUTLIERS, outlier_images, partners, tile_permutations


def digits(n: int = 60, seed: int = 0) -> tuple[torch.Tensor, torch.Tensor]:
    rng = torch.Generator().manual_seed(seed)
    x = torch.rand(n, 1, 28, 28, generator=rng)
    y = torch.randint(0, 10, (n,), generator=rng)
    return x, y


def tiles(img: torch.Tensor) -> list[bytes]:
    """The 16 7×7 tiles of a 1×28×28 image, row-major, as bytes (for multiset comparison)."""
    return [
        img[:, r : r + 7, c : c + 7].contiguous().numpy().tobytes()
        for r in range(0, 28, 7)
        for c in range(0, 28, 7)
    ]


def test_partners_are_of_another_class_and_follow_the_seed() -> None:
    _, y = digits(200)
    j = partners(y, torch.Generator().manual_seed(1))
    assert bool((y[j] != y).all())
    again = partners(y, torch.Generator().manual_seed(1))
    assert torch.equal(j, again)
    assert not torch.equal(j, partners(y, torch.Generator().manual_seed(2)))
    with pytest.raises(ValueError, match="same label"):
        partners(torch.full((5,), 3), torch.Generator())


def test_chimera_is_the_top_of_one_digit_above_the_bottom_of_another_class() -> None:
    x, y = digits()
    out = outlier_images("chimera", x, y, seed=4)
    j = partners(y, torch.Generator().manual_seed(4))  # the same draw as the maker's
    for i in range(len(x)):
        assert torch.equal(out[i, :, :14], x[i, :, :14])
        assert torch.equal(out[i, :, 14:], x[j[i], :, 14:])
        assert y[j[i]] != y[i]


def test_overlay_is_the_pixelwise_max_of_two_classes() -> None:
    x, y = digits()
    out = outlier_images("overlay", x, y, seed=5)
    j = partners(y, torch.Generator().manual_seed(5))
    expected = torch.stack([torch.maximum(x[i], x[j[i]]) for i in range(len(x))])
    assert torch.equal(out, expected)


def test_patches_keep_every_tile_and_move_at_least_one() -> None:
    x, y = digits(40)
    out = outlier_images("patches", x, y, seed=6)
    for i in range(len(x)):
        before, after = tiles(x[i]), tiles(out[i])
        assert sorted(before) == sorted(after)  # the same 16 tiles…
        assert before != after  # …not in the same places
    perms = tile_permutations(5000, 2, torch.Generator().manual_seed(0))
    assert bool((perms == torch.tensor([1, 0])).all())  # two tiles: only the swap is allowed


@pytest.mark.parametrize("kind", sorted(OUTLIERS))
def test_every_kind_is_deterministic_in_range_and_leaves_its_input_alone(kind: str) -> None:
    x, y = digits()
    x_before = x.clone()
    a, b = outlier_images(kind, x, y, seed=3), outlier_images(kind, x, y, seed=3)
    assert torch.equal(a, b) and a.shape == x.shape and a.dtype == torch.float32
    assert float(a.min()) >= 0.0 and float(a.max()) <= 1.0
    assert torch.equal(x, x_before)
    assert not torch.equal(a, x)


def test_bad_arguments_are_named() -> None:
    x, y = digits(10)
    with pytest.raises(ValueError, match="unknown outlier kind 'rotated'"):
        outlier_images("rotated", x, y)
    with pytest.raises(ValueError, match="10 images but 9 labels"):
        outlier_images("chimera", x, y[:9])
    with pytest.raises(ValueError, match="multiples of 7"):
        outlier_images("patches", torch.rand(2, 1, 30, 30), y[:2])
