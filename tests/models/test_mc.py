"""The vectorised MC engine against naive loops, exact identities and statistical checks."""

from __future__ import annotations

import math

import pytest
import torch
from torch import nn

from bayesgate.models.mc.dropout import mc_sampling
from bayesgate.models.mc.engine import mc_log_predictive, mc_logits, mc_predict
from bayesgate.models.networks.dropout import DropoutMLP
from bayesgate.models.networks.registry import build_network, preset_architecture


def _gen(seed: int) -> torch.Generator:
    return torch.Generator().manual_seed(seed)


def _small_mlp(p: float = 0.5, sharpen: float = 8.0, seed: int = 0) -> DropoutMLP:
    """A 36→32→32→4 dropout MLP; the last layer is scaled so the MC samples vary a lot."""
    torch.manual_seed(seed)
    net = DropoutMLP(hidden=(32, 32), p=p, in_shape=(1, 6, 6), classes=4)
    with torch.no_grad():
        net.head[-1].weight.mul_(sharpen)
    return net.eval()


def _x(b: int, seed: int = 1, shape: tuple[int, ...] = (1, 6, 6)) -> torch.Tensor:
    return torch.rand(b, *shape, generator=_gen(seed))


def test_shapes_and_normalisation() -> None:
    net = _small_mlp()
    out = mc_predict(net, _x(5), 7, generator=_gen(0))
    assert out.probs.shape == out.log_probs.shape == (5, 7, 4)
    assert out.probs.dtype == torch.float32
    assert torch.allclose(out.probs.sum(-1), torch.ones(5, 7), atol=1e-6)
    assert torch.allclose(out.probs, out.log_probs.exp())
    assert not out.probs.requires_grad
    assert mc_logits(net, _x(5), 3).shape == (5, 3, 4)
    assert mc_log_predictive(net, _x(5), 3).shape == (5, 4)


def test_samples_differ_along_k_and_across_identical_inputs() -> None:
    net = _small_mlp()
    x = _x(1).expand(8, -1, -1, -1)  # 8 copies of the same image
    probs = mc_predict(net, x, 6, generator=_gen(0)).probs
    for b in range(8):
        # every pass differs from the first one: a fresh mask per sample
        spread = (probs[b] - probs[b, :1]).abs().amax(dim=-1)[1:]
        assert (spread > 1e-4).all(), f"example {b} has repeated MC samples"
    for b in range(8):
        for c in range(b + 1, 8):
            assert not torch.allclose(probs[b], probs[c]), f"rows {b} and {c} share masks"


def test_generator_gives_bit_identical_results() -> None:
    net = _small_mlp()
    x = _x(4)
    for max_rows in (None, 3):
        a = mc_predict(net, x, 10, generator=_gen(123), max_rows=max_rows)
        b = mc_predict(net, x, 10, generator=_gen(123), max_rows=max_rows)
        c = mc_predict(net, x, 10, generator=_gen(124), max_rows=max_rows)
        assert torch.equal(a.probs, b.probs) and torch.equal(a.log_probs, b.log_probs)
        assert not torch.equal(a.probs, c.probs)
    # the global RNG has no influence when a generator is given
    torch.manual_seed(1)
    a = mc_predict(net, x, 10, generator=_gen(5)).probs
    torch.manual_seed(2)
    assert torch.equal(a, mc_predict(net, x, 10, generator=_gen(5)).probs)


@pytest.mark.parametrize("max_rows", [1, 2, 4, 5, 6, 9, 14, 15, 16, 1000])
def test_chunking_fills_every_slot_with_the_right_example(max_rows: int) -> None:
    # With p = 0 the head is deterministic, so slot [b, k] must equal softmax(net(x_b)) exactly
    # wherever the chunk boundaries fall (B = 3, K = 5, so K·B = 15).
    torch.manual_seed(0)
    net = DropoutMLP(hidden=(8,), p=0.0, in_shape=(1, 6, 6), classes=4).eval()
    x = _x(3)
    expected = torch.softmax(net(x), dim=-1).detach()
    out = mc_predict(net, x, 5, max_rows=max_rows)
    assert out.probs.shape == (3, 5, 4)
    assert torch.allclose(out.probs, expected.unsqueeze(1).expand(3, 5, 4), atol=1e-6)


def _mean_and_se(probs: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
    """p̄ over K (B×C) and its standard error std/√K."""
    k = probs.shape[1]
    return probs.double().mean(1), probs.double().std(1) / math.sqrt(k)


def _assert_same_distribution(a: torch.Tensor, b: torch.Tensor) -> None:
    """Means of two independent K-sample sets agree within 5 standard errors of the difference
    (two-sided, per entry: p ≈ 6e-7 each, so a failure means a real difference), and their
    per-entry standard deviations agree within 20 % (sampling error of a std is ≈ 1/√(2K))."""
    mean_a, se_a = _mean_and_se(a)
    mean_b, se_b = _mean_and_se(b)
    z = (mean_a - mean_b).abs() / (se_a.pow(2) + se_b.pow(2)).sqrt()
    assert z.max().item() < 5.0, f"MC means differ by {z.max().item():.1f} standard errors"
    std_a, std_b = a.double().std(1), b.double().std(1)
    assert torch.allclose(std_a, std_b, rtol=0.2), (std_a, std_b)


K_STAT = 2000


def test_chunked_engine_has_the_same_distribution() -> None:
    net = _small_mlp()
    x = _x(3)
    whole = mc_predict(net, x, K_STAT, generator=_gen(10)).probs
    for seed, max_rows in ((11, 7), (12, K_STAT + 500), (13, 2 * K_STAT)):
        chunked = mc_predict(net, x, K_STAT, generator=_gen(seed), max_rows=max_rows).probs
        assert chunked.shape == (3, K_STAT, 4)
        _assert_same_distribution(whole, chunked)


def test_engine_matches_a_naive_loop_of_training_mode_forwards() -> None:
    net = _small_mlp()
    x = _x(3)
    engine = mc_predict(net, x, K_STAT, generator=_gen(20)).probs
    net.train()
    torch.manual_seed(21)
    with torch.no_grad():
        naive = torch.stack([torch.softmax(net(x), dim=-1) for _ in range(K_STAT)], dim=1)
    net.eval()
    # the samples really vary, so the comparison has power
    assert naive.std(1).min().item() > 0.05
    _assert_same_distribution(engine, naive)
    # and a wrong dropout rate would be detected by the same check
    wrong = _small_mlp(p=0.2)
    wrong_probs = mc_predict(wrong, x, K_STAT, generator=_gen(22)).probs
    with pytest.raises(AssertionError):
        _assert_same_distribution(wrong_probs, naive)


def _row_counter(module: nn.Module) -> list[int]:
    rows: list[int] = []
    module.register_forward_hook(lambda _m, inputs, _out: rows.append(inputs[0].shape[0]))
    return rows


@pytest.mark.parametrize("max_rows", [None, 8, 2])
def test_cnn_trunk_runs_once_per_example(max_rows: int | None) -> None:
    torch.manual_seed(0)
    net = build_network(preset_architecture("cnn")).eval()
    trunk_rows, head_rows = _row_counter(net.trunk), _row_counter(net.head)
    b, k = 3, 4
    out = mc_predict(net, _x(b, shape=(1, 28, 28)), k, generator=_gen(0), max_rows=max_rows)
    assert out.probs.shape == (b, k, 10)
    assert sum(trunk_rows) == b
    assert sum(head_rows) == k * b
    if max_rows is not None:
        assert max(head_rows) <= max_rows
    trunk_rows.clear()
    head_rows.clear()
    mc_logits(net, _x(b, shape=(1, 28, 28)), k)
    assert trunk_rows == [b] and head_rows == [k * b]


@pytest.mark.parametrize("name", ["mlp-2x32-det", "cnn-det"])
def test_deterministic_network_gives_identical_samples(name: str) -> None:
    torch.manual_seed(0)
    net = build_network(preset_architecture(name))
    x = _x(4, shape=(1, 28, 28))
    net.eval()
    with torch.no_grad():
        expected = torch.softmax(net(x), dim=-1)
    net.train()  # mc_predict must switch dropout off for a deterministic net regardless
    out = mc_predict(net, x, 6, generator=_gen(0), max_rows=3)
    assert out.probs.shape == (4, 6, 10)
    for k in range(6):
        assert torch.equal(out.probs[:, k], out.probs[:, 0])
    assert torch.allclose(out.probs[:, 0], expected, atol=1e-6)
    log_pred = mc_log_predictive(net, x, 6)
    assert torch.allclose(log_pred, expected.log(), atol=1e-5)
    assert net.training


@pytest.mark.parametrize("training", [True, False])
def test_training_flag_is_restored(training: bool) -> None:
    net = _small_mlp()
    net.train(training)
    mc_predict(net, _x(2), 3)
    assert net.training is training
    assert all(m.training is training for m in net.modules())
    mc_log_predictive(net, _x(2), 3)
    assert all(m.training is training for m in net.modules())
    with pytest.raises(RuntimeError):
        mc_predict(net, torch.rand(2, 5), 3)  # wrong input size fails inside the forward
    assert all(m.training is training for m in net.modules())


def test_mc_predict_equals_mc_logits_under_the_same_generator() -> None:
    net = _small_mlp()
    x = _x(3)
    out = mc_predict(net, x, 5, generator=_gen(7))
    with torch.no_grad(), mc_sampling(_gen(7)):
        logits = mc_logits(net, x, 5)
    assert torch.allclose(out.log_probs, torch.log_softmax(logits, dim=-1), atol=1e-6)


def test_mc_log_predictive_is_logsumexp_of_the_same_masks() -> None:
    net = _small_mlp()
    x = _x(3)
    k = 9
    got = mc_log_predictive(net, x, k, generator=_gen(3))
    with torch.no_grad(), mc_sampling(_gen(3)):
        log_p = torch.log_softmax(mc_logits(net, x, k).double(), dim=-1)
    expected = torch.logsumexp(log_p, dim=1) - math.log(k)
    assert torch.allclose(got.double(), expected, atol=1e-6)
    # = log of the mean probability, i.e. log p̄
    assert torch.allclose(got.double().exp(), log_p.exp().mean(1), atol=1e-6)
    assert torch.allclose(got.exp().sum(-1), torch.ones(3), atol=1e-6)


def test_mc_log_predictive_has_correct_gradients_wrt_x() -> None:
    torch.manual_seed(0)
    net = DropoutMLP(hidden=(16,), p=0.5, in_shape=(1, 3, 3), classes=3).eval()
    x0 = torch.rand(2, 1, 3, 3, generator=_gen(9))

    def f(inp: torch.Tensor) -> torch.Tensor:
        # the same seed → the same masks on every call, so this is a fixed function of x
        return mc_log_predictive(net, inp, 5, generator=_gen(4))[:, 1].sum()

    x = x0.clone().requires_grad_(True)
    f(x).backward()
    grad = x.grad
    assert grad is not None and torch.isfinite(grad).all() and grad.abs().sum() > 0

    # reference: the same masks through mc_logits, log p̄ assembled by hand in float64
    xr = x0.clone().requires_grad_(True)
    with mc_sampling(_gen(4)):
        log_p = torch.log_softmax(mc_logits(net, xr, 5).double(), dim=-1)
    (torch.logsumexp(log_p, dim=1) - math.log(5))[:, 1].sum().backward()
    assert torch.allclose(grad, xr.grad.float(), atol=1e-6)

    # central finite differences along random directions. The output is float32 (≈1e-7
    # rounding), so with ε = 1e-4 the noise is ≈1e-3; ε is small so that no ReLU kink is crossed.
    with torch.no_grad():
        for seed in range(3):
            v = torch.randn(x0.shape, generator=_gen(100 + seed))
            eps = 1e-4
            numeric = (f(x0 + eps * v) - f(x0 - eps * v)) / (2 * eps)
            assert numeric.item() == pytest.approx((grad * v).sum().item(), abs=3e-3)


@pytest.mark.parametrize("k", [0, -1, 2.5])
def test_bad_k_is_rejected(k) -> None:
    net = _small_mlp()
    for call in (
        lambda: mc_predict(net, _x(2), k),
        lambda: mc_logits(net, _x(2), k),
        lambda: mc_log_predictive(net, _x(2), k),
    ):
        with pytest.raises(ValueError, match="k must be a positive integer"):
            call()


def test_bad_max_rows_precision_and_empty_input_are_rejected() -> None:
    net = _small_mlp()
    with pytest.raises(ValueError, match="max_rows"):
        mc_predict(net, _x(2), 3, max_rows=0)
    with pytest.raises(ValueError, match="precision"):
        mc_predict(net, _x(2), 3, precision="fp8")
    with pytest.raises(ValueError, match="at least one input"):
        mc_predict(net, _x(2)[:0], 3)


def test_bf16_precision_returns_float32_probabilities() -> None:
    net = _small_mlp()
    out = mc_predict(net, _x(2), 4, generator=_gen(0), precision="bf16")
    assert out.probs.dtype == torch.float32
    assert torch.allclose(out.probs.sum(-1), torch.ones(2, 4), atol=1e-5)


@pytest.mark.parametrize("use_generator", [True, False])
@pytest.mark.parametrize(("b", "max_rows"), [(1, None), (3, 8), (2, 3)])
def test_chunks_of_one_example_give_distinct_samples(
    use_generator: bool, b: int, max_rows: int | None
) -> None:
    # A chunk holding a single example repeats one trunk row K times; the head must still get
    # K independent masks (regression: in-place masking of that stride-0 view failed).
    torch.manual_seed(0)
    net = build_network(preset_architecture("cnn")).eval()
    x = _x(b, shape=(1, 28, 28))
    generator = _gen(0) if use_generator else None
    probs = mc_predict(net, x, 4, generator=generator, max_rows=max_rows).probs
    assert probs.shape == (b, 4, 10)
    for i in range(b):
        assert (probs[i, 1:] - probs[i, :1]).abs().amax(-1).min() > 0


@pytest.mark.parametrize("make_in_inference_mode", [True, False])
@pytest.mark.parametrize(("b", "k"), [(4, 1), (1, 1), (1, 5), (4, 5)])
def test_mc_predict_does_not_modify_its_input(make_in_inference_mode: bool, b: int, k: int):
    net = _small_mlp()
    if make_in_inference_mode:  # as a serving worker would build its batch
        with torch.inference_mode():
            x = _x(b)
    else:
        x = _x(b)
    before = x.clone()
    with torch.inference_mode():
        mc_predict(net, x, k, generator=_gen(0))
        mc_predict(net, x, k)
    assert torch.equal(x, before)
