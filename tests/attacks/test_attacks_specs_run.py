"""Attack specs, batched runs with success verdicts, and the .npz output."""

from __future__ import annotations

import json
import math
from pathlib import Path

import numpy as np
import pytest
import torch
from attacks_testnets import LinearNet

from bayesgate.attacks.methods import FGS, TargetedFGS
from bayesgate.attacks.run import NO_TARGET, choose_targets, mc_predictions, run_attack, verdicts
from bayesgate.attacks.specs import DEFAULT_ATTACKS, parse_attack, parse_attacks
from bayesgate.models.mc.dropout import mc_sampling
from bayesgate.models.networks.registry import build_network, preset_architecture


def test_spec_parse_fills_defaults_and_round_trips() -> None:
    spec = parse_attack("targeted:steps=5,target=0")
    assert spec == TargetedFGS(eta=0.01, steps=5, target=0)
    assert spec.params == {"eta": 0.01, "steps": 5, "target": 0}
    assert spec.targeted and spec.label == "targeted 5×η=0.01 →0"
    assert parse_attack(spec.key) == spec
    assert parse_attack("fgs").params == {"eta": 0.2}
    assert parse_attack(" pgd : eps=0.3 ").label == "PGD ε=0.3"
    assert [s.name for s in parse_attacks(DEFAULT_ATTACKS)] == ["fgs"] * 3 + ["targeted"]


@pytest.mark.parametrize(
    ("text", "match"),
    [
        ("fgm:eta=0.1", "unknown attack 'fgm'; choose one of fgs, targeted, pgd, cw"),
        ("fgs:steps=3", "attack 'fgs' has no parameter.s. steps; known: eta"),
        ("pgd:eps=0.3,eta=1,k=3", "no parameter.s. eta, k; known: eps, eps_iter, steps"),
        ("targeted:steps=2.5", "steps must be int"),
        ("fgs:eta=abc", "eta must be float"),
        ("fgs:eta", "key=value"),
        ("fgs:eta=1.5", r"\[0, 1\]"),
        ("pgd:eps=0.1,eps_iter=0.2", "eps_iter"),
        ("targeted:target=first", "class index or 'random'"),
    ],
)
def test_bad_specs(text: str, match: str) -> None:
    with pytest.raises(ValueError, match=match):
        parse_attack(text)


def test_duplicate_specs_rejected() -> None:
    with pytest.raises(ValueError, match="twice"):
        parse_attacks(["fgs:eta=0.2", "fgs"])


def test_random_targets_differ_from_labels_and_are_seeded() -> None:
    labels = torch.arange(10).repeat(50)
    t = choose_targets(labels, "random", 10, seed=3)
    assert bool((t != labels).all()) and set(t.tolist()) == set(range(10))
    assert torch.equal(t, choose_targets(labels, "random", 10, seed=3))
    assert torch.equal(choose_targets(labels, 4, 10, seed=0), torch.full_like(labels, 4))
    with pytest.raises(ValueError, match="out of range"):
        choose_targets(labels, 12, 10, seed=0)


def _data(net: LinearNet, n: int = 40) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    x = torch.rand(n, 1, 4, 4, generator=torch.Generator().manual_seed(5))
    pred = net(x).argmax(1)
    y = pred.clone()
    y[::3] = (pred[::3] + 1) % 3  # every third image is misclassified when clean
    return x, y, pred


def test_untargeted_verdicts_follow_the_definition(linear_net: LinearNet) -> None:
    x, y, pred = _data(linear_net)
    out = run_attack(linear_net, x, y, FGS(eta=0.15), k=1, k_eval=1, batch_size=7)
    adv_pred = linear_net(out.x_adv).argmax(1)
    assert torch.equal(out.clean_pred, pred) and torch.equal(out.adv_pred, adv_pred)
    assert torch.equal(out.eligible, pred == y)
    assert torch.equal(out.success, (pred == y) & (adv_pred != y))
    assert bool((out.target == NO_TARGET).all())
    assert out.success_rate == float(out.success.sum()) / float((pred == y).sum())
    assert out.adversarial_accuracy == float((adv_pred == y).double().mean())
    assert 0 < int(out.success.sum()) < int(out.eligible.sum()) + 1
    # batching does not change an input-wise deterministic attack
    whole = run_attack(linear_net, x, y, FGS(eta=0.15), k=1, k_eval=1, batch_size=100)
    assert torch.equal(whole.x_adv, out.x_adv)
    # a spec string goes through the registry to the same attack
    by_spec = run_attack(linear_net, x, y, "fgs:eta=0.15", k=1, k_eval=1, batch_size=7)
    assert by_spec.attack == FGS(eta=0.15) and torch.equal(by_spec.x_adv, out.x_adv)
    torch.testing.assert_close(out.linf, (out.x_adv - x).flatten(1).abs().amax(1))


def test_targeted_verdicts(linear_net: LinearNet) -> None:
    x, y, pred = _data(linear_net)
    spec = TargetedFGS(eta=0.05, steps=10, target=2)
    out = run_attack(linear_net, x, y, spec, k=1, k_eval=1, batch_size=16)
    adv_pred = linear_net(out.x_adv).argmax(1)
    assert bool((out.target == 2).all())
    assert torch.equal(out.eligible, (pred == y) & (y != 2))
    assert torch.equal(out.success, out.eligible & (adv_pred == 2))
    assert int(out.success.sum()) > 0


def test_targeted_success_means_landing_on_the_target_not_just_off_the_label() -> None:
    """A targeted attack succeeds only where ``x_adv`` is classified as the target: an image
    pushed off its label onto a third class (neither the label nor the target) is a failure,
    while the untargeted verdict on the same predictions counts it as a success."""
    y = torch.tensor([0, 0, 0, 1, 2, 1])
    clean_pred = torch.tensor([0, 0, 0, 1, 2, 0])
    target = torch.full_like(y, 2)
    adv_pred = torch.tensor([2, 1, 0, 2, 2, 2])
    # image 0 lands on the target, 1 on class 1 (neither 0 nor 2), 2 stays put, 3 lands on the
    # target; 4 is its own target (not eligible), 5 was misclassified when clean (not eligible)
    eligible, success = verdicts(TargetedFGS(target=2), y, clean_pred, adv_pred, target)
    assert eligible.tolist() == [True, True, True, True, False, False]
    assert success.tolist() == [True, False, False, True, False, False]
    no_target = torch.full_like(y, NO_TARGET)
    eligible, success = verdicts(FGS(eta=0.1), y, clean_pred, adv_pred, no_target)
    assert eligible.tolist() == [True, True, True, True, True, False]
    assert success.tolist() == [True, True, False, True, False, False]


def _dropout_net(classes: int = 3) -> torch.nn.Module:
    """``mlp-2x32`` at p = 0.5 on 4×4 images with tripled weights: its K passes disagree a lot."""
    torch.manual_seed(0)
    net = build_network(
        {**preset_architecture("mlp-2x32", p=0.5), "in_shape": [1, 4, 4], "classes": classes}
    )
    with torch.no_grad():
        for name, param in net.named_parameters():
            if name.endswith("weight"):
                param.mul_(3.0)
    return net.eval()


def _hand_log_predictive(net: torch.nn.Module, x: torch.Tensor, k: int, seed: int) -> torch.Tensor:
    """``log p̄(·|x) = logsumexp_k log softmax(f^{ω_k}(x)) − log k`` written out: the trunk once,
    the head on every example repeated k times (row ``b·k + j`` = pass j of example b, the MC
    engine's layout), masks from a generator seeded ``seed`` as ``attack_in_batches`` seeds its
    masks."""
    with mc_sampling(torch.Generator().manual_seed(seed)):
        h = net.trunk(x)
        logits = net.head(h.repeat_interleave(k, dim=0)).view(x.shape[0], k, -1)
    log_p = torch.log_softmax(logits, dim=-1)
    return torch.logsumexp(log_p, dim=1) - math.log(k)


def test_fgs_through_run_attack_follows_the_k_pass_mc_predictive() -> None:
    """With K = 4 on a dropout net, run_attack's FGS step is ``clip(x + η·sgn ∇_x(−log p̄(y|x)))``
    of the 4-pass MC predictive with the masks seeded ``seed`` (gradient by hand here), ``y`` its
    ``k_eval`` clean prediction; the 1-pass predictive of the same masks steps otherwise on many
    pixels, so an attack that ignored ``k`` fails."""
    net, k, seed, eta = _dropout_net(), 4, 3, 0.1
    x = torch.rand(12, 1, 4, 4, generator=torch.Generator().manual_seed(7))
    y = torch.zeros(12, dtype=torch.int64)
    out = run_attack(net, x, y, FGS(eta=eta), k=k, k_eval=5, batch_size=100, seed=seed)

    def gradient(passes: int) -> torch.Tensor:
        xg = x.clone().requires_grad_(True)
        log_pbar = _hand_log_predictive(net, xg, passes, seed)
        (-log_pbar.gather(1, out.clean_pred.view(-1, 1)).sum()).backward()
        return xg.grad

    grad, grad_one = gradient(k), gradient(1)
    clear = grad.abs() > 1e-6 * grad.abs().max()  # signs that round-off cannot flip
    assert clear.double().mean() > 0.5
    expected = (x + eta * grad.sign()).clamp(0.0, 1.0)
    assert torch.equal(out.x_adv[clear], expected[clear])
    # the test tells K apart: the one-pass gradient points elsewhere on many clear pixels
    assert (grad_one.sign() != grad.sign())[clear].double().mean() > 0.1


def test_clean_and_adversarial_images_are_scored_with_the_same_masks() -> None:
    """Common random numbers: ``x`` and ``x_adv`` are evaluated with masks seeded alike, so an
    attack that moves no pixel (FGS at η = 0) leaves every MC probability bit-identical and no
    prediction changed — on a dropout net whose passes disagree a lot. Catches the adversarial
    images scored with other masks (say seeded ``seed + 1``)."""
    net = _dropout_net()
    x = torch.rand(30, 1, 4, 4, generator=torch.Generator().manual_seed(3))
    y = torch.randint(0, 3, (30,), generator=torch.Generator().manual_seed(4))
    outcome = run_attack(net, x, y, FGS(eta=0.0), k=2, k_eval=8, seed=7, batch_size=7)
    assert torch.equal(outcome.x_adv, x)
    clean, _ = mc_predictions(net, x, 8, seed=7)  # how run_attack scores the clean images
    assert torch.equal(outcome.adv_probs, clean)
    assert torch.equal(outcome.adv_pred, outcome.clean_pred) and not outcome.success.any()
    other = run_attack(net, x, y, FGS(eta=0.0), k=2, k_eval=8, seed=8, batch_size=7)
    assert not torch.equal(other.adv_probs, outcome.adv_probs)  # the masks do matter here


def test_step_hook_sees_every_step_of_every_batch(linear_net: LinearNet) -> None:
    x, y, _ = _data(linear_net, n=10)
    calls: list[tuple[int, int, int]] = []
    spec = TargetedFGS(steps=3, target=0)
    run_attack(
        linear_net,
        x,
        y,
        spec,
        k=1,
        k_eval=1,
        batch_size=4,
        step_hook=lambda t, xt, rows: calls.append((t, rows.start, xt.shape[0])),
    )
    assert calls == [(t, s, n) for s, n in ((0, 4), (4, 4), (8, 2)) for t in range(4)]


def test_npz_loads_without_pickle(linear_net: LinearNet, tmp_path: Path) -> None:
    x, y, _ = _data(linear_net, n=12)
    out = run_attack(linear_net, x, y, FGS(eta=0.3), k=1, k_eval=1)
    path = out.save_npz(tmp_path / "adv.npz", x)
    with np.load(path, allow_pickle=False) as data:
        assert data["x_adv"].shape == (12, 1, 4, 4) and data["x_adv"].dtype == np.float32
        np.testing.assert_array_equal(data["success"], out.success.numpy())
        np.testing.assert_array_equal(data["labels"], y.numpy())
        np.testing.assert_array_equal(data["x_clean"], x.numpy())
        meta = json.loads(str(data["meta"]))
    assert (
        meta["attack"] == "fgs:eta=0.3"
        and meta["method"] == "fgs"
        and meta["successful"] == int(out.success.sum())
    )
    with pytest.raises(ValueError, match=r"\.npz"):
        out.save_npz(tmp_path / "adv.npy")


def test_run_attack_on_a_dropout_net_leaves_its_parameters_alone() -> None:
    torch.manual_seed(0)
    arch = preset_architecture("mlp-2x32")
    arch["in_shape"] = [1, 4, 4]
    net = build_network(arch)
    x = torch.rand(8, 1, 4, 4, generator=torch.Generator().manual_seed(2))
    y = torch.arange(8) % 10
    before = [p.detach().clone() for p in net.parameters()]
    run_attack(net, x, y, FGS(eta=0.2), k=3, k_eval=3, batch_size=3)
    assert all(p.requires_grad for p in net.parameters())  # parameters unfrozen afterwards
    assert all(p.grad is None for p in net.parameters())  # and never accumulated gradients
    assert all(torch.equal(a, b) for a, b in zip(before, net.parameters(), strict=True))


def test_a_target_out_of_range_fails_before_any_prediction(monkeypatch: pytest.MonkeyPatch) -> None:
    """The target is checked before the clean MC predictions of every image (a full test split
    took minutes before ``target class 99 out of range`` was reported)."""
    from bayesgate.attacks import run

    net = LinearNet()
    x, y, _ = _data(net)

    def no_predictions(*args: object, **kwargs: object) -> None:
        raise AssertionError("clean predictions computed before the target was checked")

    monkeypatch.setattr(run, "mc_predictions", no_predictions)
    with pytest.raises(ValueError, match="target class 99 out of range for 3 classes"):
        run_attack(net, x, y, "targeted:target=99", k=2, k_eval=2)
