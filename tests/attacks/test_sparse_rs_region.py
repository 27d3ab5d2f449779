"""Sparse-RS restricted to the digit's strokes (``adaptive-eval --optimizer sparse-rs --region
strokes``): the region is the 3×3 dilation of the strokes (against a direct neighbourhood scan);
every changed pixel lies in it; a region of every pixel is the unrestricted search bit for bit;
a move never takes more pixels than the smallest region has free; the settings and the command
name the region."""

from __future__ import annotations

from pathlib import Path

import pytest
import torch
from attacks_testnets import LinearNet

from bayesgate.attacks import evaluate_cli
from bayesgate.attacks.adaptive_settings import AdaptiveSettings, AdaptiveSparseRSParameters
from bayesgate.attacks.adaptive_sparse_rs import AdaptiveSparseRS
from bayesgate.attacks.methods.sparse_rs import free_positions, near_strokes
from bayesgate.cli import main
from bayesgate.errors import InvalidArgument
from tests.cli_checks import never as _never
from tests.cli_checks import one_error_line as _error

pytestmark = pytest.mark.usefixtures("one_thread")  # tests/attacks/conftest.py: tiny tensors


def _scan(x: torch.Tensor, level: float = 0.5) -> torch.Tensor:
    """The region by a direct scan: pixel (i, j) is in it when some channel of some pixel within
    one row and one column of it (inside the image) exceeds ``level``."""
    b, _, h, w = x.shape
    out = torch.zeros(b, h, w, dtype=torch.bool)
    for n in range(b):
        for i in range(h):
            for j in range(w):
                window = x[n, :, max(i - 1, 0) : i + 2, max(j - 1, 0) : j + 2]
                out[n, i, j] = bool((window > level).any())
    return out.flatten(1)


def _digits(count: int, size: int = 10, seed: int = 0) -> torch.Tensor:
    """Images of one random horizontal and one random vertical bar of ink (0.9) on black."""
    g = torch.Generator().manual_seed(seed)
    x = torch.zeros(count, 1, size, size)
    for n in range(count):
        row, col = torch.randint(1, size - 1, (2,), generator=g).tolist()
        x[n, 0, row, 2 : size - 2] = 0.9
        x[n, 0, 2 : size - 2, col] = 0.9
    return x


def test_the_region_is_the_strokes_and_their_one_pixel_border() -> None:
    g = torch.Generator().manual_seed(1)
    x = (torch.rand(4, 2, 7, 9, generator=g) > 0.9).float() * torch.rand(4, 2, 7, 9, generator=g)
    x[3] = 0.3  # below the level everywhere: no strokes
    region = near_strokes(x, k=5)
    assert torch.equal(region[:3], _scan(x[:3]))
    assert bool(region[3].all())  # nothing to stay near: every position
    assert 0 < int(region[:3].sum(dim=1).min()) < 63  # a real restriction was tested
    one = torch.zeros(1, 1, 6, 6)
    one[0, 0, 0, 0] = 1.0  # a corner pixel: a region of 4 positions
    assert int(near_strokes(one, k=3).sum()) == 4
    assert bool(near_strokes(one, k=4).all())  # 4 positions cannot hold 4 pixels and a move
    assert free_positions(36, 3, near_strokes(one, k=3)) == 1
    assert free_positions(36, 3, None) == 33


def _attack(region: str, x: torch.Tensor, steps: int = 80, alpha: float = 0.3) -> torch.Tensor:
    net = LinearNet(in_shape=tuple(x.shape[1:]), classes=3, seed=2).requires_grad_(False)
    y = net(x).argmax(dim=1)

    def score_fn(z: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        return torch.log_softmax(net(z), dim=1), (z - 0.5).flatten(1).pow(2).sum(1)

    attack = AdaptiveSparseRS(eps=4, steps=steps, alpha_init=alpha, weight=1.0, region=region)
    return attack(score_fn, x, y, 20.0, generator=torch.Generator().manual_seed(3)).x_adv


def test_every_changed_pixel_lies_near_a_stroke() -> None:
    x = _digits(12)
    region = near_strokes(x, k=4)
    assert int(region.sum(dim=1).max()) < 100  # the region leaves most of the image out
    for where in ("strokes", "anywhere"):
        changed = (_attack(where, x) != x).flatten(1)
        assert int(changed.sum(dim=1).max()) <= 4 and int(changed.sum()) > 12
        outside = int((changed & ~region).sum())
        assert outside == 0 if where == "strokes" else outside > 0  # the restriction matters


def test_a_region_of_every_pixel_is_the_unrestricted_search_bit_for_bit() -> None:
    x = 0.6 + 0.3 * torch.rand(6, 1, 5, 5, generator=torch.Generator().manual_seed(4))
    assert bool(near_strokes(x, k=4).all())
    assert torch.equal(_attack("strokes", x), _attack("anywhere", x))


def test_a_move_takes_no_more_pixels_than_the_smallest_region_has_free() -> None:
    """Image 0's region is a corner's 4 positions (k = 4 + 1 free); α = 1 asks for 4 moved pixels
    a query, which only fit outside the set if the count is capped at the one free position."""
    x = _digits(3, size=8)
    x[0] = 0.0
    x[0, 0, 0, 0] = 1.0
    x[0, 0, 0, 1] = 1.0  # a corner pair: its region is 2 × 3 = 6 positions
    region = near_strokes(x, k=4)
    assert int(region[0].sum()) == 6
    changed = (_attack("strokes", x, steps=30, alpha=1.0) != x).flatten(1)
    assert int((changed & ~region).sum()) == 0
    assert int(changed.sum(dim=1).max()) <= 4


def test_settings_name_the_region_and_cache_it_apart() -> None:
    settings = AdaptiveSettings(eps=(10.0,), weights=(1.0,), optimizer="sparse-rs",
                                region="strokes")  # fmt: skip
    configs = settings.configs(10.0)
    assert [n for n, _ in configs] == [
        "plain Sparse-RS (strokes)", "adaptive Sparse-RS (strokes) λ=1",
    ]  # fmt: skip
    assert {a.region for _, a in configs} == {"strokes"}
    assert configs[0][1].cache_tag == "-sparse-rs-strokes"
    plain = AdaptiveSettings(eps=(10.0,), optimizer="sparse-rs").configs(10.0)[0][1]
    assert plain.cache_tag == "-sparse-rs" and plain.region == "anywhere"
    with pytest.raises(InvalidArgument, match="region must be one of anywhere, strokes"):
        AdaptiveSparseRSParameters(region="edges")
    with pytest.raises(InvalidArgument, match="region 'strokes' needs the sparse-rs optimizer"):
        AdaptiveSettings(eps=(0.3,), region="strokes")


def test_the_command_refuses_a_region_without_sparse_rs(
    tmp_path: Path,
    tiny_model_dir: Path,
    monkeypatch: pytest.MonkeyPatch,
    capsys: pytest.CaptureFixture[str],
) -> None:
    monkeypatch.setattr(evaluate_cli, "_load", _never)
    out = str(tmp_path / "ae")
    assert main(["adaptive-eval", str(tiny_model_dir), "--out", out, "--region", "strokes"]) == 2
    assert _error(capsys) == (
        "--optimizer pgd --restarts 1 --region strokes: region 'strokes' needs the sparse-rs "
        "optimizer"
    )
    with pytest.raises(AssertionError, match="the work started"):  # accepted: the work begins
        main(["adaptive-eval", str(tiny_model_dir), "--out", out, "--optimizer", "sparse-rs",
              "--eps", "10", "--region", "strokes"])  # fmt: skip
