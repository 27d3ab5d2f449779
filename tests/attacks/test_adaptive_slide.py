"""The adaptive attack with sparse L1 steps (``adaptive-eval --optimizer slide``): one step by
hand, the L1 ball and the box, the detector evaded more often than by the detector-blind
attack, and the command's checks of its L1 radii."""

from __future__ import annotations

from pathlib import Path

import pytest
import torch
from attacks_testnets import LinearNet
from test_attacks_detector_eval import _linear_score_fn

from bayesgate.attacks import evaluate_cli
from bayesgate.attacks.adaptive_settings import AdaptiveSettings
from bayesgate.attacks.adaptive_slide import AdaptiveSLIDE
from bayesgate.attacks.methods.square import margin
from bayesgate.cli import main
from bayesgate.errors import InvalidArgument
from tests.cli_checks import never as _never
from tests.cli_checks import one_error_line as _error


def test_one_step_by_hand() -> None:
    """λ = 0, one step of ε/10 = 0.3 from the clean image: down ``relu(m + κ)``'s gradient on the
    top quarter of its components (sparsity 75), the L1 length split evenly over them; a pixel
    at 0 that the step would push below 0 is left out first."""
    net = LinearNet(in_shape=(1, 4, 4), classes=3, seed=2)
    x = 0.2 + 0.6 * torch.rand(4, 1, 4, 4, generator=torch.Generator().manual_seed(0))
    y = net(x).argmax(dim=1)
    x_req = x.clone().requires_grad_(True)
    m = margin(torch.log_softmax(net(x_req), dim=1), y)
    d = -torch.autograd.grad(torch.relu(m + 1.0).sum(), x_req)[0].flatten(1)
    i, j = 0, int(d[0].abs().argmax())
    x.view(4, -1)[i, j] = 0.0 if d[0, j] < 0 else 1.0  # its largest component points out of the box
    x_req = x.clone().requires_grad_(True)
    m = margin(torch.log_softmax(net(x_req), dim=1), y)
    d = -torch.autograd.grad(torch.relu(m + 1.0).sum(), x_req)[0].flatten(1)
    assert (x.view(4, -1)[i, j] == 0 and d[i, j] < 0) or (x.view(4, -1)[i, j] == 1 and d[i, j] > 0)

    attack = AdaptiveSLIDE(eps=3.0, steps=1, weight=0.0, sparsity=75.0)
    fn = _linear_score_fn(net, torch.zeros_like(x[:1]))
    # steps=1: the result is the final iterate (or the start, where the start was already found)
    result = attack(fn, x, y, threshold=1e9)
    expected = x.flatten(1).clone()
    d[i, j] = 0.0  # would leave the box: zeroed
    for r in range(4):
        q = d[r].abs().kthvalue(12).values  # the 75th percentile of 16
        top = d[r].abs() >= q
        expected[r, top] += d[r, top].sign() * 0.3 / top.sum()
    expected = expected.clamp(0, 1).view_as(x)
    stepped = ~result.found | (result.first_step == 1)
    assert torch.allclose(result.x_adv[stepped], expected[stepped], atol=1e-6)
    assert stepped.any()


def test_stays_in_the_l1_ball_and_the_box() -> None:
    net = LinearNet()
    x = torch.rand(8, 1, 4, 4, generator=torch.Generator().manual_seed(0))
    x[:, 0, 0, :2] = 0.0
    y = net(x).argmax(dim=1)
    fn = _linear_score_fn(net, torch.full_like(x[:1], 0.5))
    for schedule in ("misclassify-first", "joint"):
        result = AdaptiveSLIDE(eps=1.5, steps=20, weight=5.0, schedule=schedule)(fn, x, y, 1.0)
        assert float((result.x_adv - x).flatten(1).abs().sum(1).max()) <= 1.5 + 1e-5
        assert result.x_adv.min() >= 0 and result.x_adv.max() <= 1


def test_the_adaptive_version_evades_the_detector_more_often() -> None:
    net = LinearNet(in_shape=(1, 4, 4), classes=3, seed=1)
    x = 0.3 + 0.4 * torch.rand(32, 1, 4, 4, generator=torch.Generator().manual_seed(0))
    y = net(x).argmax(dim=1)
    fn = _linear_score_fn(net, x.mean(dim=0, keepdim=True))

    def run(weight: float, threshold: float):
        result = AdaptiveSLIDE(eps=4.0, steps=60, weight=weight, sparsity=80.0)(fn, x, y, threshold)
        with torch.no_grad():
            log_p, score = fn(result.x_adv)
        return result.found, log_p.argmax(1) != y, score

    found_plain, mis_plain, score_plain = run(0.0, 0.0)
    assert mis_plain.float().mean() > 0.5 and torch.equal(found_plain, mis_plain)
    threshold = float(score_plain[mis_plain].median())
    found, mis, score = run(1.0, threshold)
    evaded_plain = int((mis_plain & (score_plain <= threshold)).sum())
    evaded = int((mis & (score <= threshold)).sum())
    assert evaded >= evaded_plain + 5, (evaded, evaded_plain)
    assert torch.equal(found, mis & (score <= threshold))


def test_settings_take_l1_radii_for_slide_only() -> None:
    settings = AdaptiveSettings(eps=(10.0,), weights=(1.0,), optimizer="slide")
    names = [(n, type(a).__name__, a.alpha) for n, a in settings.configs(10.0)]
    assert names == [
        ("plain SLIDE", "AdaptiveSLIDE", 1.0),
        ("adaptive SLIDE λ=1", "AdaptiveSLIDE", 1.0),
    ]
    assert settings.configs(10.0)[0][1].cache_tag == "-slide-q99"
    with pytest.raises(InvalidArgument, match="L1 radius > 0"):
        AdaptiveSettings(eps=(0.0,), optimizer="slide")
    with pytest.raises(InvalidArgument, match=r"in \(0, 1\]"):
        AdaptiveSettings(eps=(10.0,))  # an L∞ radius for PGD
    with pytest.raises(InvalidArgument, match="sparsity"):
        AdaptiveSLIDE(sparsity=100.0)


@pytest.mark.parametrize(
    ("argv", "message"),
    [
        (["--optimizer", "slide", "--eps", "0"], "--eps must be a finite L1 radius > 0, got 0.0"),
        (["--optimizer", "slide", "--eps", "inf"], "--eps must be a finite L1 radius > 0, got inf"),
        (["--eps", "10"], "--eps must be in (0, 1], got 10.0"),
    ],
)
def test_the_command_checks_l1_radii_with_slide(
    argv: list[str],
    message: str,
    tmp_path: Path,
    tiny_model_dir: Path,
    monkeypatch: pytest.MonkeyPatch,
    capsys: pytest.CaptureFixture[str],
) -> None:
    monkeypatch.setattr(evaluate_cli, "_load", _never)
    assert main(["adaptive-eval", str(tiny_model_dir), "--out", str(tmp_path / "ae"), *argv]) == 2
    assert _error(capsys) == message
    with pytest.raises(AssertionError, match="the work started"):  # accepted: the work begins
        main(["adaptive-eval", str(tiny_model_dir), "--out", str(tmp_path / "ae"),
              "--optimizer", "slide", "--eps", "10"])  # fmt: skip
