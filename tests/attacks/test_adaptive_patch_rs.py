"""The adaptive attack searched by Sparse-RS's patches (``adaptive-eval --optimizer patch-rs``): it
changes one ⌊√k⌋×⌊√k⌋ window of 0/1 values and never asks for a gradient; :func:`paste` and
:func:`patch_schedule` against a direct loop and the authors' table; its location moves find a
hot block the content moves alone cannot reach; it ends on the unwatched one of two hot blocks
where the detector-blind search also walks into the watched one; its query budget and stop; the
settings and the command's pixel-count checks."""

from __future__ import annotations

import math

import pytest
import torch
from attacks_testnets import LinearNet, Queries

from bayesgate.attacks.adaptive_patch_rs import AdaptivePatchRS, paste, patch_schedule
from bayesgate.attacks.adaptive_settings import AdaptivePatchRSParameters, AdaptiveSettings
from bayesgate.attacks.methods.square import margin
from bayesgate.errors import InvalidArgument

pytestmark = pytest.mark.usefixtures("one_thread")  # tests/attacks/conftest.py: tiny tensors

SIZE = 8  # the toys' images are SIZE×SIZE, one channel


def _block(row: int, col: int, side: int = 2) -> list[int]:
    """Flat positions of the ``side``×``side`` block with top-left corner ``(row, col)``."""
    return [(row + i) * SIZE + col + j for i in range(side) for j in range(side)]


def _toy(hot: list[int], bias: float) -> LinearNet:
    """Two classes on SIZE×SIZE images: ``logit₁ − logit₀ = Σ_{p ∈ hot} x_p + ε·x − bias``, with
    small random weights ``ε ∈ [0, 0.02)`` on every pixel, so no two candidates tie exactly (as
    on the MC predictive: the strict accept rule cannot cross an exactly flat loss)."""
    net = LinearNet(in_shape=(1, SIZE, SIZE), classes=2).requires_grad_(False)
    with torch.no_grad():
        net.head.weight.zero_()
        net.head.weight[1, hot] = 1.0
        net.head.weight[1] += 0.02 * torch.rand(
            SIZE * SIZE, generator=torch.Generator().manual_seed(5)
        )
        net.head.bias.copy_(torch.tensor([bias, 0.0]))
    return net


def _no_detector(x: torch.Tensor) -> torch.Tensor:
    return torch.zeros(x.shape[0])


def _margins(net: LinearNet, x: torch.Tensor, y: torch.Tensor) -> torch.Tensor:
    return margin(torch.log_softmax(net(x), dim=1), y)


def test_changes_one_window_of_0_or_1_values_and_never_asks_for_a_gradient() -> None:
    """k = 10 pixels: a 3×3 patch (⌊√10⌋ = 3, 9 ≤ 10 pixels), on 2-channel 7×9 images whose
    every value lies strictly between 0 and 1, so every pasted pixel shows."""
    net = LinearNet(in_shape=(2, 7, 9), classes=3, seed=1).requires_grad_(False)
    x = 0.1 + 0.8 * torch.rand(8, 2, 7, 9, generator=torch.Generator().manual_seed(0))
    y = net(x).argmax(dim=1)
    box = Queries(net, lambda z: (z - 0.5).flatten(1).pow(2).sum(1))
    with torch.enable_grad():
        result = AdaptivePatchRS(eps=10, steps=60, weight=1.0)(
            box, x, y, 30.0, generator=torch.Generator().manual_seed(2)
        )
    assert not result.x_adv.requires_grad and len(box.rows) <= 60
    changed = result.x_adv != x  # B×C×H×W
    assert torch.equal(changed[:, 0], changed[:, 1])  # the window covers every channel
    assert set(result.x_adv[changed].unique().tolist()) <= {0.0, 1.0}
    for where in changed[:, 0]:
        rows, cols = torch.nonzero(where, as_tuple=True)
        assert rows.numel() == 9 <= 10  # s² = ⌊√k⌋² ≤ k pixels, all of the window
        assert int(rows.max() - rows.min()) == 2 and int(cols.max() - cols.min()) == 2
    corners = {tuple(torch.nonzero(where)[0].tolist()) for where in changed[:, 0]}
    assert len(corners) > 1  # the windows lie at different places


def test_paste_matches_a_direct_loop() -> None:
    g = torch.Generator().manual_seed(3)
    x = torch.rand(6, 3, 6, 9, generator=g)
    side = 4
    loc = torch.stack(
        [torch.randint(0, 6 - side + 1, (6,), generator=g), torch.randint(0, 9 - side + 1, (6,),
                                                                          generator=g)], dim=1
    )  # fmt: skip
    loc[0] = torch.tensor([0, 0])
    loc[1] = torch.tensor([6 - side, 9 - side])  # both far corners
    patch = torch.rand(6, 3, side, side, generator=g)
    expected = x.clone()
    for b in range(6):
        r, c = loc[b].tolist()
        for i in range(side):
            for j in range(side):
                expected[b, :, r + i, c + j] = patch[b, :, i, j]
    before = x.clone()
    assert torch.equal(paste(x, loc, patch), expected)
    assert torch.equal(x, before)  # a new tensor: x untouched


def test_the_start_is_a_uniform_place_and_vertical_stripes() -> None:
    x = torch.full((200, 2, 7, 9), 0.5)
    loc, patch = AdaptivePatchRS(eps=9).start(x, torch.Generator().manual_seed(0))
    assert loc.shape == (200, 2) and patch.shape == (200, 2, 3, 3)
    assert set(loc[:, 0].tolist()) == set(range(5)) and set(loc[:, 1].tolist()) == set(range(7))
    assert set(patch.unique().tolist()) == {0.0, 1.0}
    assert torch.equal(patch, patch[:, :, :1].expand_as(patch))  # each column one value
    assert bool((patch[:, :, :, 0] != patch[:, :, :, 1]).any())  # ... drawn per column
    assert bool((patch[:, 0] != patch[:, 1]).any())  # ... and per channel


def test_a_move_shifts_the_place_every_t_queries_else_redraws_one_sub_square() -> None:
    """Query i of 1000 on 20×20 images, a 5×5 patch (k = 25): a location move when 5 divides i
    (shift ≤ ⌊0.75·(1000 − i)/1000·20⌋), else a content move on one 3×3 square (⌊√0.4·5⌋ = 3,
    α = 0.4 until the rescaled iteration passes 10) at the same place in every image."""
    attack, rng = AdaptivePatchRS(eps=25, steps=1000), torch.Generator().manual_seed(1)
    loc = torch.full((64, 2), 7, dtype=torch.int64)
    patch = torch.full((64, 1, 5, 5), 0.5)
    assert attack.shift(5, 20) == 14 and attack.shift(999, 20) == 0
    moved, same = attack.move(5, loc, patch, (20, 20), rng)
    assert torch.equal(same, patch) and not torch.equal(moved, loc)
    assert int(moved.min()) == 0 and int(moved.max()) == 15  # clamped into [0, 20 − 5]
    assert bool((moved[:, 0] != moved[:, 1]).any())  # rows and columns move independently
    assert int((moved - loc).abs().max()) <= 14
    kept, new = attack.move(1, loc, patch, (20, 20), rng)
    assert torch.equal(kept, loc)
    changed = (new != patch)[:, 0]  # every changed value is a 0 or 1 over 0.5
    rows, cols = torch.nonzero(changed.any(dim=0), as_tuple=True)
    assert int(rows.max() - rows.min()) == 2 and int(cols.max() - cols.min()) == 2
    assert bool(changed.flatten(1).sum(dim=1).eq(9).all())  # the same 3×3 square in each
    assert set(new[changed[:, None]].unique().tolist()) == {0.0, 1.0}  # drawn per image
    _, late = attack.move(999, loc, patch, (20, 20), rng)  # α = 0.4/128: one pixel
    assert bool((late != patch).flatten(1).sum(dim=1).eq(1).all())


@pytest.mark.parametrize(
    ("iteration", "divisor"),
    [(0, 1), (5, 1), (10, 1), (30, 2), (100, 4), (300, 8), (800, 16), (1500, 32), (3000, 32),
     (5000, 64), (7000, 64), (9000, 128), (9999, 128)],
)  # fmt: skip
def test_patch_schedule_is_the_authors_table(iteration: int, divisor: int) -> None:
    assert patch_schedule(0.4, iteration, 10_000) == pytest.approx(0.4 / divisor)
    # on another budget the iteration is rescaled to 10 000: the same point of the budget
    assert patch_schedule(0.4, iteration // 10, 1000) == pytest.approx(0.4 / divisor)


def _far_block_search(steps: int = 600) -> tuple[torch.Tensor, Queries]:
    """The class flips only once the 2×2 block at (5, 5) is all white (margin 3.5 − 4 = −0.5):
    a side-2 patch (k = 4) must sit exactly on it with white content."""
    net = _toy(_block(5, 5), bias=3.5)
    x, y = torch.zeros(32, 1, SIZE, SIZE), torch.zeros(32, dtype=torch.int64)
    attack = AdaptivePatchRS(eps=4, steps=steps, weight=0.0, kappa=0.25)
    box = Queries(net, _no_detector)
    result = attack(box, x, y, 0.5, generator=torch.Generator().manual_seed(0))
    assert bool(result.found.eq(_margins(net, result.x_adv, y) < 0).all())
    return result.found, box


def test_the_location_moves_find_a_block_the_start_misses(monkeypatch: pytest.MonkeyPatch) -> None:
    """The start puts each patch at one of 7×7 places, one of them on the block. The search finds
    it for most of the 32 images within 600 queries; without location moves (shift 0: content
    moves only) only the images that start on the block could."""
    found, box = _far_block_search()
    assert int(found.sum()) >= 28
    assert len(box.rows) <= 600
    monkeypatch.setattr(AdaptivePatchRS, "shift", lambda self, iteration, height: 0)
    found, _ = _far_block_search()
    assert int(found.sum()) <= 3


HOT_A, HOT_B = _block(1, 1), _block(5, 5)  # each flips the toy when white; HOT_A is watched


def _watched(x: torch.Tensor) -> torch.Tensor:
    """The toy detector: the ink on the watched block (flagged above 0.5: if any of it is set)."""
    return x.flatten(1)[:, HOT_A].sum(dim=1)


def test_ends_on_the_unwatched_block_the_blind_search_also_walks_into() -> None:
    """Either 2×2 block all white flips the toy (margin 3.5 − 4 = −0.5); the detector watches
    block A. A 3×3 patch (k = 9) covers a block from 4 places. The detector-blind search flips
    every image, on A for about half of them; the adaptive one (λ = 1) ends on block B, with
    nothing on A, for every image."""
    net, x = _toy(HOT_A + HOT_B, bias=3.5), torch.zeros(16, 1, SIZE, SIZE)
    y = torch.zeros(16, dtype=torch.int64)

    def detector(z: torch.Tensor) -> torch.Tensor:
        return _watched(z) + 0.01 * z.flatten(1).sum(dim=1)

    def run(weight: float):
        attack = AdaptivePatchRS(eps=9, steps=1000, weight=weight, kappa=0.25, delta=0.25)
        return attack(Queries(net, detector), x, y, 0.5, generator=torch.Generator().manual_seed(0))

    blind, adaptive = run(0.0), run(1.0)
    assert bool(blind.found.all()) and bool((_margins(net, blind.x_adv, y) < 0).all())
    assert int((detector(blind.x_adv) > 0.5).sum()) >= 4  # the blind search lands on A too
    assert bool(adaptive.found.all()) and bool((_margins(net, adaptive.x_adv, y) < 0).all())
    assert torch.equal(adaptive.x_adv.flatten(1)[:, HOT_B], torch.ones(16, 4))
    assert float(_watched(adaptive.x_adv).max()) == 0.0
    assert bool((adaptive.first_step >= 0).all())


def test_the_query_budget_and_the_stop_once_both_margins_are_met() -> None:
    """One white pixel of the 4×4 centre flips the toy (margin 0.5 − 1 = −0.5); the detector
    watches the four corners. Image 1 starts with all four set: a 2×2 patch clears at most one,
    so it stays flagged whatever the search does."""
    centre = _block(2, 2, side=4)
    corners = [0, SIZE - 1, SIZE * (SIZE - 1), SIZE * SIZE - 1]
    net, y = _toy(centre, bias=0.5), torch.zeros(2, dtype=torch.int64)
    x = torch.zeros(2, 1, SIZE, SIZE)
    x[1].view(-1)[corners] = 1.0

    def detector(z: torch.Tensor) -> torch.Tensor:
        return z.flatten(1)[:, corners].sum(dim=1)

    box = Queries(net, detector)
    attack = AdaptivePatchRS(eps=4, steps=50, weight=1.0, kappa=0.25, delta=0.25)
    result = attack(box, x, y, 0.5, generator=torch.Generator().manual_seed(0))
    assert sum(box.rows) <= 2 * 50 and len(box.rows) == 50  # image 1 spent the whole budget
    # image 0 stopped at L = 0: misclassified by κ, under the threshold by δ
    assert result.found[0] and float(_margins(net, result.x_adv[:1], y[:1])) <= -0.25
    assert float(detector(result.x_adv[:1])) <= 0.25
    stopped = box.rows.count(2)  # queries of both images: the start and image 0's moves
    assert 1 < stopped < 50 and int(result.first_step[0]) == stopped - 1
    assert box.rows[stopped:] == [1] * (50 - stopped)
    assert not result.found[1] and int(result.first_step[1]) == -1
    assert int((result.x_adv[1] != x[1]).sum()) <= 4


def test_settings_take_a_pixel_budget_and_a_query_budget() -> None:
    settings = AdaptiveSettings(eps=(10.0,), weights=(1.0,), optimizer="patch-rs")
    assert settings.steps == 1000
    names = [(n, type(a).__name__, a.pixels, a.side, a.steps) for n, a in settings.configs(10.0)]
    assert names == [
        ("plain Patch-RS", "AdaptivePatchRS", 10, 3, 1000),
        ("adaptive Patch-RS λ=1", "AdaptivePatchRS", 10, 3, 1000),
    ]
    attack = settings.configs(10.0)[1][1]
    assert (attack.cache_tag, attack.optimizer, attack.alpha, attack.weight) == (
        "-patch-rs", "patch-rs", 0.4, 1.0,
    )  # fmt: skip
    default = AdaptivePatchRSParameters()
    assert (default.eps, default.side, default.steps, default.alpha_init) == (9.0, 3, 1000, 0.4)
    assert [AdaptivePatchRSParameters(eps=k).side for k in (1, 3, 4, 15, 16)] == [1, 1, 2, 3, 4]
    assert all(math.isqrt(k) ** 2 <= k for k in range(1, 784))
    for eps in (0.0, 2.5, float("inf")):
        with pytest.raises(InvalidArgument, match="whole number of pixels ≥ 1"):
            AdaptiveSettings(eps=(eps,), optimizer="patch-rs")
    with pytest.raises(InvalidArgument, match="no step size"):
        AdaptivePatchRSParameters(step_size=0.1)
    with pytest.raises(InvalidArgument, match="alpha_init"):
        AdaptivePatchRSParameters(alpha_init=0.0)
    with pytest.raises(InvalidArgument, match="region 'strokes' needs the sparse-rs optimizer"):
        AdaptiveSettings(eps=(9.0,), optimizer="patch-rs", region="strokes")


def test_refuses_a_patch_larger_than_the_image_and_images_that_are_not_4d() -> None:
    box, y = Queries(_toy([0], bias=1.0), _no_detector), torch.zeros(1, dtype=torch.int64)
    AdaptivePatchRS(eps=80, steps=2)(box, torch.zeros(1, 1, SIZE, SIZE), y, 0.5)  # 8×8: fits
    with pytest.raises(ValueError, match=r"side 9 \(⌊√81⌋\) does not fit in a 8×8 image"):
        AdaptivePatchRS(eps=81, steps=2)(box, torch.zeros(1, 1, SIZE, SIZE), y, 0.5)
    with pytest.raises(ValueError, match="needs B×C×H×W images"):
        AdaptivePatchRS(eps=4, steps=2)(box, torch.zeros(1, SIZE, SIZE), y, 0.5)
