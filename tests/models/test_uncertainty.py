"""Uncertainty measures: analytic examples and a brute-force float64 numpy reference."""

from __future__ import annotations

import math

import numpy as np
import pytest
import torch

from bayesgate.models.mc.uncertainty import (
    SCORES,
    expected_entropy,
    kwon_variance,
    mc_log_likelihood,
    mutual_information,
    predictive_entropy,
    predictive_mean,
    summary,
    variation_ratio,
)

LN2 = math.log(2)


def _passes(*rows: tuple[float, ...]) -> torch.Tensor:
    """One example (B = 1) whose K passes are ``rows``."""
    return torch.tensor([rows], dtype=torch.float64)


# ---------------------------------------------------------------- analytic examples


@pytest.mark.parametrize(
    ("probs", "h", "e", "mi", "vr"),
    [
        (_passes(*[(1.0, 0.0)] * 4), 0.0, 0.0, 0.0, 0.0),  # confident and agreeing
        (_passes(*[(0.5, 0.5)] * 4), LN2, LN2, 0.0, 0.0),  # aleatoric only
        (_passes(*[(1.0, 0.0)] * 2, *[(0.0, 1.0)] * 2), LN2, 0.0, LN2, 0.5),  # epistemic only
    ],
    ids=["all-(1,0)", "all-(1/2,1/2)", "half-(1,0)-half-(0,1)"],
)
def test_binary_sanity_values(probs: torch.Tensor, h: float, e: float, mi: float, vr: float):
    assert predictive_entropy(probs).item() == pytest.approx(h, abs=1e-12)
    assert expected_entropy(probs).item() == pytest.approx(e, abs=1e-12)
    assert mutual_information(probs).item() == pytest.approx(mi, abs=1e-12)
    assert variation_ratio(probs).item() == pytest.approx(vr, abs=1e-12)


@pytest.mark.parametrize("c", [2, 3, 10, 1000])
def test_uniform_predictive_has_entropy_log_c(c: int) -> None:
    probs = torch.full((3, 5, c), 1.0 / c, dtype=torch.float64)
    assert torch.allclose(
        predictive_entropy(probs), torch.full((3,), math.log(c), dtype=torch.float64)
    )
    assert torch.allclose(mutual_information(probs), torch.zeros(3, dtype=torch.float64))


def test_one_hot_passes_over_c_classes_give_mi_log_c() -> None:
    # K = C passes, pass k certain of class k: H[p̄] = ln C, every H[p_k] = 0, so MI = ln C
    c = 7
    probs = torch.eye(c, dtype=torch.float64).unsqueeze(0)
    assert mutual_information(probs).item() == pytest.approx(math.log(c), abs=1e-12)
    assert variation_ratio(probs).item() == pytest.approx(1 - 1 / c, abs=1e-12)


def _votes(counts: list[int], c: int) -> torch.Tensor:
    """K = sum(counts) passes, ``counts[j]`` of them voting for class j (soft, not one-hot)."""
    rows = []
    for cls, n in enumerate(counts):
        row = [0.1 / (c - 1)] * c
        row[cls] = 0.9
        rows += [row] * n
    return torch.tensor([rows], dtype=torch.float32)


@pytest.mark.parametrize(
    ("counts", "expected"),
    [
        ([3, 2], 1 - 3 / 5),  # 3 of 5 votes → 0.4
        ([5, 0], 0.0),
        ([4, 3, 3], 1 - 4 / 10),
        ([1, 1, 1, 1], 0.75),
        ([2, 7, 1], 1 - 7 / 10),
    ],
)
def test_variation_ratio_by_hand(counts: list[int], expected: float) -> None:
    got = variation_ratio(_votes(counts, len(counts)))
    assert got.item() == pytest.approx(expected, abs=1e-6)
    # the order of the passes does not matter
    perm = torch.randperm(sum(counts), generator=torch.Generator().manual_seed(0))
    assert variation_ratio(_votes(counts, len(counts))[:, perm]).item() == pytest.approx(
        expected, abs=1e-6
    )


# ---------------------------------------------------------------- brute-force reference


def _dirichlet(seed: int, b: int = 6, k: int = 9, c: int = 5, conc: float = 0.7) -> np.ndarray:
    return np.random.default_rng(seed).dirichlet([conc] * c, size=(b, k))


def _h(p: np.ndarray) -> float:
    return float(-sum(v * math.log(v) for v in p if v > 0))


def _reference(probs: np.ndarray) -> dict[str, np.ndarray]:
    """Every measure by explicit loops in float64, covariance matrices built in full."""
    b, k, c = probs.shape
    out: dict[str, list] = {n: [] for n in ("mean", "h", "e", "mi", "vr", "ale", "epi")}
    for n in range(b):
        mean = np.zeros(c)
        for j in range(k):
            mean += probs[n, j] / k
        h = _h(mean)
        e = sum(_h(probs[n, j]) for j in range(k)) / k
        votes = [0] * c
        for j in range(k):
            votes[int(np.argmax(probs[n, j]))] += 1
        ale = np.zeros((c, c))
        epi = np.zeros((c, c))
        for j in range(k):
            p = probs[n, j]
            ale += (np.diag(p) - np.outer(p, p)) / k
            epi += np.outer(p - mean, p - mean) / k
        out["mean"].append(mean)
        out["h"].append(h)
        out["e"].append(e)
        out["mi"].append(h - e)
        out["vr"].append(1 - max(votes) / k)
        out["ale"].append(np.diag(ale))
        out["epi"].append(np.diag(epi))
    return {name: np.array(v) for name, v in out.items()}


@pytest.mark.parametrize("seed", [0, 1, 2, 3])
def test_all_measures_match_the_bruteforce_reference(seed: int) -> None:
    np_probs = _dirichlet(seed, conc=[0.3, 0.7, 2.0, 5.0][seed])
    ref = _reference(np_probs)
    probs = torch.from_numpy(np_probs)
    np.testing.assert_allclose(predictive_mean(probs).numpy(), ref["mean"], rtol=1e-12)
    np.testing.assert_allclose(predictive_entropy(probs).numpy(), ref["h"], rtol=1e-10)
    np.testing.assert_allclose(expected_entropy(probs).numpy(), ref["e"], rtol=1e-10)
    np.testing.assert_allclose(mutual_information(probs).numpy(), ref["mi"], atol=1e-12)
    np.testing.assert_allclose(variation_ratio(probs).numpy(), ref["vr"], atol=1e-12)
    aleatoric, epistemic = kwon_variance(probs)
    assert aleatoric.shape == epistemic.shape == (6, 5)
    np.testing.assert_allclose(aleatoric.numpy(), ref["ale"], atol=1e-12)
    np.testing.assert_allclose(epistemic.numpy(), ref["epi"], atol=1e-12)
    # aleatoric + epistemic = diag(diag(p̄) − p̄p̄ᵀ) = p̄(1 − p̄)
    mean = ref["mean"]
    np.testing.assert_allclose((aleatoric + epistemic).numpy(), mean * (1 - mean), atol=1e-12)
    # float32 inputs agree to single precision
    p32 = probs.float()
    np.testing.assert_allclose(predictive_entropy(p32).numpy(), ref["h"], rtol=1e-5)
    np.testing.assert_allclose(mutual_information(p32).numpy(), ref["mi"], atol=1e-5)


@pytest.mark.parametrize("seed", range(5))
def test_mutual_information_is_non_negative(seed: int) -> None:
    probs = torch.from_numpy(_dirichlet(seed, b=50, k=4, c=10, conc=0.2)).float()
    assert (mutual_information(probs) >= 0).all()
    # identical passes: MI is 0 up to round-off, and the clamp keeps it ≥ 0
    same = probs[:, :1].expand(-1, 8, -1).contiguous()
    mi = mutual_information(same)
    assert (mi >= 0).all()
    assert mi.max().item() < 1e-5
    # H = E + MI, E ≥ 0
    assert (expected_entropy(probs) >= 0).all()
    assert torch.allclose(
        predictive_entropy(probs), expected_entropy(probs) + mutual_information(probs), atol=1e-5
    )


def test_summary_mutual_information_is_clamped_where_round_off_makes_it_negative() -> None:
    """K identical float32 passes: MI is exactly 0, but ``H[p̄] − (1/K) Σ_k H[p_k]`` rounds
    below 0 for some rows (checked here with ``torch.special.entr``, so the case is real); the
    service's ``summary`` must report 0 there, like :func:`mutual_information`, never < 0."""
    rows = torch.softmax(torch.randn(300, 4, generator=torch.Generator().manual_seed(0)), -1)
    probs = rows.unsqueeze(1).expand(-1, 7, -1).contiguous()  # K = 7 identical passes
    mean = probs.mean(dim=1)
    raw = torch.special.entr(mean).sum(-1) - torch.special.entr(probs).sum(-1).mean(dim=1)
    assert (raw < 0).any()  # round-off does go negative on some of these rows
    mi = summary(probs)["mutual_information"]
    assert (mi >= 0).all()
    assert torch.equal(mi[raw < 0], torch.zeros(int((raw < 0).sum())))
    assert float(mi.max()) < 1e-6
    assert torch.equal(mi, mutual_information(probs))


@pytest.mark.parametrize("seed", [0, 1])
def test_mc_log_likelihood_is_log_of_mean_probability(seed: int) -> None:
    np_probs = _dirichlet(seed, b=8, k=6, c=4, conc=0.5)
    y = np.random.default_rng(seed + 10).integers(0, 4, size=8)
    ref = [math.log(np.mean([np_probs[n, j, y[n]] for j in range(6)])) for n in range(8)]
    log_probs = torch.from_numpy(np.log(np_probs))
    got = mc_log_likelihood(log_probs, torch.from_numpy(y).long())
    np.testing.assert_allclose(got.numpy(), ref, rtol=1e-12)


def test_mc_log_likelihood_is_stable_for_tiny_probabilities() -> None:
    # log p = −1000 for every pass: p̄ underflows in float64 but its log is exactly −1000
    log_probs = torch.full((2, 5, 3), -1000.0)
    got = mc_log_likelihood(log_probs, torch.tensor([0, 2]))
    assert torch.allclose(got, torch.full((2,), -1000.0))


def test_scores_name_the_thresholdable_measures() -> None:
    assert {
        "predictive_entropy": predictive_entropy,
        "mutual_information": mutual_information,
        "variation_ratio": variation_ratio,
    } == SCORES


@pytest.mark.parametrize(
    "fn",
    [
        predictive_mean,
        predictive_entropy,
        expected_entropy,
        mutual_information,
        variation_ratio,
        kwon_variance,
    ],
)
def test_measures_reject_non_bkc_input(fn) -> None:
    with pytest.raises(ValueError, match="B×K×C"):
        fn(torch.full((4, 3), 1 / 3))
    with pytest.raises(ValueError, match="B×K×C"):
        mc_log_likelihood(torch.zeros(4, 3), torch.zeros(4, dtype=torch.long))


def test_gradients_stay_finite_when_a_softmax_underflows_to_exact_zeros() -> None:
    """A confident pass (``softmax`` of a 120-logit gap is exactly 0 elsewhere in float32) must
    not turn ∇ of the measures into NaN (``entr``'s derivative at 0 is +∞, and ``0·∞`` is NaN in
    the softmax's backward). Reference: the gradients of the same functions written out by hand,
    on logits where nothing underflows, agree with ours there; at the underflowing pass the
    softmax Jacobian is 0 to float32 precision, so its logits' gradient is 0."""
    z = torch.tensor([[[120.0, 0.0, 0.0], [0.0, 0.0, 0.0]]], requires_grad=True)
    assert (torch.softmax(z, -1)[0, 0, 1:] == 0).all()  # the case: exact zeros
    for fn in (predictive_entropy, mutual_information, expected_entropy):
        (grad,) = torch.autograd.grad(fn(torch.softmax(z, -1)).sum(), z)
        assert torch.isfinite(grad).all(), fn.__name__
        assert torch.equal(grad[0, 0], torch.zeros(3)), fn.__name__
    # the values are the same bits as torch.special.entr's, with or without autograd
    probs = torch.softmax(torch.randn(4, 5, 6) * 40, -1).requires_grad_()
    assert (probs == 0).any()
    expected = torch.special.entr(probs.detach()).sum(-1).mean(1)
    assert torch.equal(expected_entropy(probs).detach(), expected)
    # and where nothing is 0, the gradient is the analytic one: ∂H[p̄]/∂p_kc = −(log p̄_c + 1)/K
    q = torch.softmax(torch.randn(2, 3, 4), -1).requires_grad_()
    (g,) = torch.autograd.grad(predictive_entropy(q).sum(), q)
    analytic = (-(q.detach().mean(1).log() + 1) / 3).unsqueeze(1).expand(-1, 3, -1)
    torch.testing.assert_close(g, analytic)
