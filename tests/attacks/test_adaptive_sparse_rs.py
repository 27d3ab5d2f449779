"""The adaptive attack searched by Sparse-RS (``adaptive-eval --optimizer sparse-rs``): with λ = 0
it is the detector-blind Sparse-RS bit for bit; it changes at most ``k`` pixels, each to 0 or 1;
it never asks for a gradient; it finds the unwatched pixels of a hand-made detector that the
detector-blind search walks into; its query budget and stop; the settings and the command's
pixel-count checks."""

from __future__ import annotations

from pathlib import Path

import pytest
import torch
from attacks_testnets import LinearNet, Queries

from bayesgate.attacks import evaluate_cli
from bayesgate.attacks.adaptive_settings import AdaptiveSettings, AdaptiveSparseRSParameters
from bayesgate.attacks.adaptive_sparse_rs import AdaptiveSparseRS
from bayesgate.attacks.methods.sparse_rs import SparseRS
from bayesgate.attacks.methods.square import margin
from bayesgate.cli import main
from bayesgate.errors import InvalidArgument
from tests.cli_checks import never as _never
from tests.cli_checks import one_error_line as _error

HOT = (1, 3, 6, 9, 12, 14)  # pixels that move the toy's logit
WATCHED = (1, 6, 12)  # half of them, watched by the toy detector


pytestmark = pytest.mark.usefixtures("one_thread")  # tests/attacks/conftest.py: tiny tensors


def _toy(bias: float = 2.5) -> LinearNet:
    """Two classes on 4×4 images: ``logit₁ − logit₀ = Σ_{p ∈ HOT} x_p − bias``: on a black image
    class 0 wins by ``bias``; each hot pixel set to 1 lowers the margin by 1, other pixels do
    nothing."""
    net = LinearNet(in_shape=(1, 4, 4), classes=2).requires_grad_(False)
    with torch.no_grad():
        net.head.weight.zero_()
        net.head.weight[1, list(HOT)] = 1.0
        net.head.bias.copy_(torch.tensor([bias, 0.0]))
    return net


def _watched(x: torch.Tensor) -> torch.Tensor:
    """The toy detector: the ink on the watched pixels (flagged above 0.5, i.e. if any is set)."""
    return x.flatten(1)[:, list(WATCHED)].sum(dim=1)


def test_without_the_detector_it_is_the_detector_blind_sparse_rs_bit_for_bit() -> None:
    net = LinearNet(in_shape=(1, 6, 6), classes=3, seed=4).requires_grad_(False)
    x = torch.rand(12, 1, 6, 6, generator=torch.Generator().manual_seed(0))
    y = net(x).argmax(dim=1)
    blind = SparseRS(pixels=2, queries=60, alpha_init=0.5, confidence=1.0)(
        lambda z: torch.log_softmax(net(z), dim=1), x, y, generator=torch.Generator().manual_seed(3)
    )
    adaptive = AdaptiveSparseRS(eps=2, steps=60, alpha_init=0.5, weight=0.0, kappa=1.0)
    result = adaptive(Queries(net, _watched), x, y, 0.5, generator=torch.Generator().manual_seed(3))
    assert torch.equal(result.x_adv, blind)
    fooled = margin(torch.log_softmax(net(blind), dim=1), y) < 0
    assert 0 < int(fooled.sum()) < 12  # some images fooled, some not: both branches compared
    assert torch.equal(result.found, fooled)


def test_changes_at_most_k_pixels_each_to_0_or_1_and_never_asks_for_a_gradient() -> None:
    net = LinearNet(in_shape=(1, 6, 6), classes=3, seed=1).requires_grad_(False)
    x = 0.1 + 0.8 * torch.rand(8, 1, 6, 6, generator=torch.Generator().manual_seed(0))
    y = net(x).argmax(dim=1)
    box = Queries(net, lambda z: (z - 0.5).flatten(1).pow(2).sum(1))
    with torch.enable_grad():
        result = AdaptiveSparseRS(eps=5, steps=60, weight=1.0)(box, x, y, 3.0)
    changed = (result.x_adv != x).flatten(1)
    assert int(changed.sum(dim=1).max()) <= 5 and int(changed.sum(dim=1).min()) >= 1
    assert set(result.x_adv.flatten(1)[changed].unique().tolist()) <= {0.0, 1.0}
    assert not result.x_adv.requires_grad


@pytest.mark.parametrize("schedule", ["misclassify-first", "joint"])
def test_finds_the_unwatched_pixels_the_blind_search_walks_into(schedule: str) -> None:
    """Flipping the toy takes three hot pixels set to 1 (margin 2.5 − 3 = −0.5); three of the six
    are watched. The detector-blind search flips every image, nearly always through watched
    pixels; the adaptive one must end on exactly the three unwatched ones, and it does for every
    image. Every pixel gets a small weight in the logit and the score, so no two candidates tie
    (as on the MC predictive: the strict accept rule cannot cross an exactly flat loss)."""
    net, x = _toy(), torch.zeros(16, 1, 4, 4)
    y = torch.zeros(16, dtype=torch.int64)
    with torch.no_grad():
        net.head.weight[1] += 0.02 * torch.rand(16, generator=torch.Generator().manual_seed(5))

    def detector(z: torch.Tensor) -> torch.Tensor:
        return _watched(z) + 0.01 * z.flatten(1).sum(dim=1)

    def run(weight: float):
        attack = AdaptiveSparseRS(
            eps=3, steps=400, weight=weight, kappa=0.25, delta=0.25, schedule=schedule
        )
        return attack(Queries(net, detector), x, y, 0.5, generator=torch.Generator().manual_seed(0))

    blind, adaptive = run(0.0), run(1.0)
    blind_mis = margin(torch.log_softmax(net(blind.x_adv), dim=1), y) < 0
    assert bool(blind_mis.all()) and bool(blind.found.all())
    assert int((detector(blind.x_adv) <= 0.5).sum()) <= 2  # the blind search lands on watched ones
    assert bool(adaptive.found.all())
    unwatched = [p for p in HOT if p not in WATCHED]
    assert torch.equal(adaptive.x_adv.flatten(1)[:, unwatched], torch.ones(16, 3))
    assert float(_watched(adaptive.x_adv).max()) == 0.0
    assert bool((adaptive.first_step > 0).all())


def test_the_gate_is_read_at_the_current_point_so_it_flips_then_evades() -> None:
    """Any two hot pixels flip the toy (margin 1.5 − 2 = −0.5) and are flagged (two hot pixels
    score 2 > 1.5) unless pixel 0 — the camouflage — is set too (score 0), which costs margin
    (+0.3: −0.2, still wrong). Reaching flipped-and-camouflaged from an unflipped point takes two
    pixels at once. With λ = 2 a flipped but flagged candidate scores ``L = 2·(2 − 1.5 + δ) = 1.5``
    — higher than the unflipped point's ``relu(0.5 + κ) = 0.75`` if the gate were read at the
    candidate; read at the (unflipped) current point, the flip is a step down (``L = 0``), after
    which the gate is on and the camouflage lowers ``L`` again. (Once on, the gate lets the
    search step back to unflipped points too, so it cycles; each time it is flipped it may find
    the camouflage.)"""
    net, x = _toy(bias=1.5), torch.zeros(16, 1, 4, 4)
    y = torch.zeros(16, dtype=torch.int64)
    with torch.no_grad():
        net.head.weight[1, 0] = -0.3
        net.head.weight[1] += 0.01 * torch.rand(16, generator=torch.Generator().manual_seed(5))

    def detector(z: torch.Tensor) -> torch.Tensor:
        flat = z.flatten(1)
        return flat[:, list(HOT)].sum(dim=1) - 2.0 * flat[:, 0] + 0.01 * flat.sum(dim=1)

    def run(schedule: str):
        attack = AdaptiveSparseRS(
            eps=4, steps=1000, weight=2.0, kappa=0.1, delta=0.25, schedule=schedule
        )
        return attack(Queries(net, detector), x, y, 1.5, generator=torch.Generator().manual_seed(0))

    # the joint loss has a local minimum at the unflipped point (one hot pixel: L = 0.6 + 0)
    assert int(run("joint").found.sum()) <= 4
    result = run("misclassify-first")
    assert bool(result.found.all())
    assert bool((margin(torch.log_softmax(net(result.x_adv), dim=1), y) < 0).all())
    assert bool((detector(result.x_adv) <= 1.5).all())
    assert torch.equal(result.x_adv.flatten(1)[:, 0], torch.ones(16))


def test_the_query_budget_and_the_stop_once_both_margins_are_met() -> None:
    net, y = _toy(bias=0.5), torch.zeros(2, dtype=torch.int64)
    x = torch.zeros(2, 1, 4, 4)
    x[1].view(-1)[list(WATCHED)] = 1.0  # image 1 starts flagged: the search has to clear it
    box = Queries(net, _watched)
    attack = AdaptiveSparseRS(eps=2, steps=50, weight=1.0, kappa=0.25, delta=0.25)
    result = attack(box, x, y, 0.5, generator=torch.Generator().manual_seed(1))
    assert sum(box.rows) <= 2 * 50 and len(box.rows) <= 50
    # image 0 is done once two unwatched hot pixels are set (margin −1.5, nothing watched): L = 0
    assert result.found[0] and float(_watched(result.x_adv[:1])) == 0.0
    flat = result.x_adv.flatten(1)
    # image 1: two changed pixels cannot clear three watched ones: flagged whatever it does
    assert not result.found[1] and int(result.first_step[1]) == -1
    assert int((flat[1] != x[1].flatten()).sum()) <= 2
    assert box.rows[-1] == 1  # image 0 stopped early; image 1 spent the whole budget
    assert len(box.rows) == 50


def test_settings_take_pixel_counts_and_a_query_budget() -> None:
    settings = AdaptiveSettings(eps=(10.0,), weights=(1.0,), optimizer="sparse-rs")
    assert settings.steps == 1000 and AdaptiveSettings().steps == 100
    names = [(n, type(a).__name__, a.pixels, a.steps) for n, a in settings.configs(10.0)]
    assert names == [
        ("plain Sparse-RS", "AdaptiveSparseRS", 10, 1000),
        ("adaptive Sparse-RS λ=1", "AdaptiveSparseRS", 10, 1000),
    ]
    assert settings.configs(10.0)[0][1].cache_tag == "-sparse-rs"
    for eps in (0.0, 2.5, float("inf")):
        with pytest.raises(InvalidArgument, match="whole number of pixels ≥ 1"):
            AdaptiveSettings(eps=(eps,), optimizer="sparse-rs")
    with pytest.raises(InvalidArgument, match="no step size"):
        AdaptiveSparseRSParameters(step_size=0.1)
    with pytest.raises(InvalidArgument, match="alpha_init"):
        AdaptiveSparseRSParameters(alpha_init=0.0)
    with pytest.raises(ValueError, match="must be < the 16 of an image"):
        AdaptiveSparseRS(eps=16, steps=2)(Queries(_toy(), _watched), torch.zeros(1, 1, 4, 4),
                                          torch.zeros(1, dtype=torch.int64), 0.5)  # fmt: skip


@pytest.mark.parametrize("optimizer", ["sparse-rs", "patch-rs"])
@pytest.mark.parametrize(
    ("argv", "message"),
    [
        (["--eps", "2.5"], "--eps must be a whole number of pixels ≥ 1, got 2.5"),
        (["--eps", "0"], "--eps must be a whole number of pixels ≥ 1, got 0"),
        (
            ["--eps", "784"],
            "--eps 784: {label} changes fewer pixels than the 784 of an MNIST digit",
        ),
        (["--eps", "10", "--steps", "0"], "--steps must be ≥ 1, got 0"),
    ],
)
def test_the_command_checks_pixel_budgets_of_the_random_searches(
    optimizer: str,
    argv: list[str],
    message: str,
    tmp_path: Path,
    tiny_model_dir: Path,
    monkeypatch: pytest.MonkeyPatch,
    capsys: pytest.CaptureFixture[str],
) -> None:
    """sparse-rs and patch-rs take pixel budgets (not radii) and refuse a whole digit's 784."""
    monkeypatch.setattr(evaluate_cli, "_load", _never)
    out = str(tmp_path / "ae")
    label = {"sparse-rs": "Sparse-RS", "patch-rs": "Patch-RS"}[optimizer]
    code = main(["adaptive-eval", str(tiny_model_dir), "--out", out, "--optimizer", optimizer,
                 *argv])  # fmt: skip
    assert code == 2
    assert _error(capsys) == message.format(label=label)
    with pytest.raises(AssertionError, match="the work started"):  # accepted: the work begins
        main(["adaptive-eval", str(tiny_model_dir), "--out", out, "--optimizer", optimizer,
              "--eps", "783"])  # fmt: skip
