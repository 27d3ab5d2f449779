"""Sparse-RS (Croce et al. 2022), the black-box L0 attack: at most ``pixels`` pixels changed, each
to 0 or 1; it finds the pixels that flip a linear toy model and cannot with too few; the best
margin never rises; the resampled count follows ``max(1, round(α_i·k))`` with Square's
``p_schedule``; seeded runs repeat; the query budget holds per image; parameters and specs."""

from __future__ import annotations

import pytest
import torch
from attacks_testnets import LinearNet

from bayesgate.attacks.methods.parameters import SparseRSParameters
from bayesgate.attacks.methods.sparse_rs import SparseRS
from bayesgate.attacks.methods.square import margin, p_schedule
from bayesgate.attacks.specs import parse_attack, parse_parameters
from bayesgate.cli import main

pytestmark = pytest.mark.usefixtures("one_thread")  # tests/attacks/conftest.py: tiny tensors


class Recorder:
    """A black-box model: ``log_softmax(net(x))``; records every query and fails if autograd is
    on or the images carry a graph."""

    def __init__(self, net: torch.nn.Module) -> None:
        self.net = net
        self.queries: list[torch.Tensor] = []

    def __call__(self, x: torch.Tensor) -> torch.Tensor:
        assert not torch.is_grad_enabled(), "queried with autograd on"
        assert not x.requires_grad
        self.queries.append(x.clone())
        return torch.log_softmax(self.net(x), dim=1)


def _linear(in_shape: tuple[int, ...], classes: int = 3, seed: int = 0) -> LinearNet:
    return LinearNet(in_shape=in_shape, classes=classes, seed=seed).requires_grad_(False)


def _toy(hot: tuple[int, ...] = (1, 6, 12), bias: float = 2.5) -> LinearNet:
    """Two classes on 4×4 images: ``logit₁ − logit₀ = Σ_{p ∈ hot} x_p − bias``. A black image has
    margin ``bias`` for class 0; each hot pixel set to 1 lowers it by 1, any other pixel does
    nothing, so flipping it takes every hot pixel at 1 (margin 2.5 − 3 = −0.5)."""
    net = _linear((1, 4, 4), classes=2)
    with torch.no_grad():
        net.head.weight.zero_()
        net.head.weight[1, list(hot)] = 1.0
        net.head.bias.copy_(torch.tensor([bias, 0.0]))
    return net


def _margins(net: torch.nn.Module, x: torch.Tensor, y: torch.Tensor) -> torch.Tensor:
    with torch.no_grad():
        return margin(torch.log_softmax(net(x), dim=1), y)


@pytest.mark.parametrize("shape", [(1, 6, 6), (3, 5, 5)])
def test_changes_at_most_k_pixels_each_to_an_extreme(shape: tuple[int, ...]) -> None:
    x = 0.1 + 0.8 * torch.rand(6, *shape, generator=torch.Generator().manual_seed(0))
    x[:, :, 0, 0] = 0.0  # a pixel on the box edge: drawing 0 there changes nothing
    attack = SparseRS(pixels=4, queries=40)
    adv = attack(Recorder(_linear(shape)), x, generator=torch.Generator().manual_seed(1))
    assert adv.shape == x.shape and adv.min() >= 0 and adv.max() <= 1 and not adv.requires_grad
    changed = (adv != x).any(dim=1)  # B×H×W: pixels with any channel changed
    counts = changed.flatten(1).sum(dim=1)
    assert int(counts.max()) <= 4
    assert int(counts.min()) >= 3  # every pixel but the one at 0 moves when perturbed
    moved = changed[:, None].expand_as(x)
    assert set(adv[moved].unique().tolist()) <= {0.0, 1.0}


def test_finds_the_hot_pixels_of_a_linear_toy() -> None:
    net, x = _toy(), torch.zeros(8, 1, 4, 4)
    y = torch.zeros(8, dtype=torch.int64)
    attack = SparseRS(pixels=3, queries=1000, confidence=0.25)
    adv = attack(Recorder(net), x, y, generator=torch.Generator().manual_seed(0))
    torch.testing.assert_close(_margins(net, adv, y), torch.full((8,), -0.5))
    assert torch.equal(adv.flatten(1)[:, [1, 6, 12]], torch.ones(8, 3))


def test_too_few_pixels_cannot_flip_the_toy() -> None:
    net, x = _toy(), torch.zeros(8, 1, 4, 4)
    y = torch.zeros(8, dtype=torch.int64)
    box = Recorder(net)
    adv = SparseRS(pixels=2, queries=300)(box, x, y, generator=torch.Generator().manual_seed(0))
    # the best two pixels lower the margin from 2.5 to 0.5, never below 0: found, and not flipped
    torch.testing.assert_close(_margins(net, adv, y), torch.full((8,), 0.5))
    assert len(box.queries) == 300  # never fooled: the whole budget


def test_best_margin_never_rises_and_only_queries_without_autograd() -> None:
    net = _linear((1, 6, 6))
    x = torch.rand(6, 1, 6, 6, generator=torch.Generator().manual_seed(2))
    y = torch.log_softmax(net(x), dim=1).argmax(dim=1)
    best: list[torch.Tensor] = []
    attack = SparseRS(pixels=3, queries=150, confidence=50.0)  # never stops: every step counts
    with torch.enable_grad():
        attack(
            Recorder(net),
            x,
            y,
            generator=torch.Generator().manual_seed(3),
            on_step=lambda t, x_t: best.append(_margins(net, x_t, y)),
        )
    trace = torch.stack(best)  # (queries)×B
    assert trace.shape == (150, 6)
    assert float((trace[1:] - trace[:-1]).max()) <= 1e-5  # non-increasing for every image
    assert bool((trace[-1] < trace[0] - 0.1).all())  # and it does move


def test_resampled_pixels_follow_the_alpha_schedule() -> None:
    """A model whose margin never changes accepts no candidate: every query is the start with
    ``r_i = max(1, round(α_i·k))`` of its ``k`` pixels moved elsewhere."""
    k, queries, alpha = 40, 60, 0.8
    x = torch.full((3, 1, 10, 10), 0.5)  # every perturbed pixel differs from the clean image

    def constant(z: torch.Tensor) -> torch.Tensor:
        seen.append(z.clone())
        return torch.log_softmax(torch.tensor([10.0, 0.0]).expand(len(z), 2), dim=1)

    seen: list[torch.Tensor] = []
    y = torch.zeros(3, dtype=torch.int64)
    attack = SparseRS(pixels=k, queries=queries, alpha_init=alpha)
    attack(constant, x, y, generator=torch.Generator().manual_seed(0))
    assert len(seen) == queries
    start = (seen[0] != 0.5).flatten(1)
    counts = []
    for i, candidate in enumerate(seen[1:]):
        inside = (candidate != 0.5).flatten(1)
        assert bool((inside.sum(dim=1) == k).all())
        moved = (start & ~inside).sum(dim=1)
        expected = max(1, round(p_schedule(alpha, i, queries) * k))
        assert moved.tolist() == [expected] * 3, (i, moved, expected)
        assert attack.resampled(i) == expected
        counts.append(expected)
    assert counts[:8] == [32, 8, 4, 4, 2, 2, 2, 1]  # α halves as in Square's reference schedule
    assert len(set(counts)) >= 5


def test_seeded_runs_repeat_and_the_budget_holds_per_image() -> None:
    net = _linear((1, 6, 6))
    # image j is (j + 1)/10 everywhere but on ≤ 3 pixels: its median names it in every query
    x = (torch.arange(8, dtype=torch.float32) + 1).div(10).view(8, 1, 1, 1).expand(8, 1, 6, 6)
    y = torch.log_softmax(net(x), dim=1).argmax(dim=1)
    attack = SparseRS(pixels=3, queries=80, confidence=0.5)

    def run(seed: int) -> tuple[torch.Tensor, Recorder]:
        box = Recorder(net)
        return attack(box, x, y, generator=torch.Generator().manual_seed(seed)), box

    (first, box), (again, _), (other, _) = run(4), run(4), run(5)
    assert torch.equal(first, again) and not torch.equal(first, other)
    rows = torch.cat(box.queries).flatten(1).median(dim=1).values
    per_image = torch.bincount((rows * 10).round().long() - 1, minlength=8)
    assert len(box.queries) <= 80 and int(per_image.max()) <= 80
    fooled = _margins(net, first, y) < -0.5
    assert bool(fooled.any()) and bool((~fooled).any())  # both kinds in the batch
    assert bool((per_image[fooled] < 80).all())  # stopped early
    assert bool((per_image[~fooled] == 80).all())  # the whole budget, not one query more


@pytest.mark.parametrize(
    ("spec", "named"),
    [
        ("sparse-rs:pixels=0", "pixels"),
        ("sparse-rs:pixels=2.5", "pixels"),
        ("sparse-rs:queries=0", "queries"),
        ("sparse-rs:alpha_init=0", "alpha_init"),
        ("sparse-rs:alpha_init=1.5", "alpha_init"),
        ("sparse-rs:confidence=-1", "confidence"),
    ],
)
def test_bad_parameters_are_refused_by_name(spec: str, named: str) -> None:
    with pytest.raises(ValueError, match=named):
        parse_parameters(spec)  # without torch
    with pytest.raises(ValueError, match=named):
        parse_attack(spec)


def test_more_pixels_than_the_image_has_are_refused() -> None:
    with pytest.raises(ValueError, match="pixels must be < the 16"):
        SparseRS(pixels=16)(Recorder(_toy()), torch.zeros(1, 1, 4, 4))


def test_spec_label_and_command_line() -> None:
    attack = parse_attack("sparse-rs:pixels=5,queries=200")
    assert attack == SparseRS(pixels=5, queries=200) and type(attack) is SparseRS
    assert type(parse_parameters("sparse-rs:pixels=5,queries=200")) is SparseRSParameters
    assert parse_attack(attack.key) == attack
    assert SparseRS().label == "Sparse-RS L0 k=10, 1000 queries"
    assert attack.linf_radius is None and attack.slow and not attack.targeted
    assert SparseRS().params == {
        "pixels": 10,
        "queries": 1000,
        "alpha_init": 0.3,
        "confidence": 1.0,
    }


def test_detect_eval_and_attack_accept_it(capsys: pytest.CaptureFixture) -> None:
    """detect-eval checks its specs before it looks for the model: a good spec (and its
    ``--attack-limit``) gets as far as the missing model, a bad one is refused by name."""
    argv = ["detect-eval", "no-such-model", "--out", "x", "--attacks"]
    assert main([*argv, "sparse-rs:pixels=5,queries=200", "--attack-limit", "sparse-rs=5"]) == 2
    assert "model card not found" in capsys.readouterr().err
    assert main([*argv, "sparse-rs:pixels=0"]) == 2
    assert "sparse-rs pixels must be ≥ 1" in capsys.readouterr().err
    with pytest.raises(SystemExit):
        main(["attack", "--help"])
    assert "--pixels" in capsys.readouterr().out
