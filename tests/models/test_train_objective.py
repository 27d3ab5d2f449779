"""The training objective of one minibatch against Li & Gal's (2017) formula written out by hand.

The loop minimises ``mean_n L_n(α) + λ·Σ_i ‖W_i‖²`` with the BB-α energy
``L_n(α) = −(1/α)·(logsumexp_k(α·log p(y_n|x_n, ω_k)) − log K)`` over the K dropout passes
and the L2 term over weight matrices only (biases not regularised: docs/models.md, the authors'
``W_regularizer=l2(λ)``). The references here are computed in float64 from the logits the head
actually produced for the loss (a forward hook), so they use the very same dropout masks.
"""

from __future__ import annotations

import copy
import math

import pytest
import torch
from torch import nn

from bayesgate.models.networks.dropout import DropoutMLP
from bayesgate.models.training.train import TrainConfig, _Trainer, train

B, K, C = 6, 5, 3


def _net() -> DropoutMLP:
    """A tiny dropout MLP (p = 0.5) on 4×4 images, weights tripled and biases set to 1: the
    per-pass log-likelihoods then spread widely over the masks (so α matters), and a
    regulariser that counted the biases would be visibly off."""
    torch.manual_seed(0)
    net = DropoutMLP(hidden=(16, 16), p=0.5, in_shape=(1, 4, 4), classes=C)
    with torch.no_grad():
        for layer in _linears(net):
            layer.weight.mul_(3.0)
            layer.bias.fill_(1.0)
    return net


def _linears(net: nn.Module) -> list[nn.Linear]:
    return [m for m in net.modules() if isinstance(m, nn.Linear)]


def _batch() -> tuple[torch.Tensor, torch.Tensor]:
    gen = torch.Generator().manual_seed(1)
    return torch.rand(B, 1, 4, 4, generator=gen), torch.randint(0, C, (B,), generator=gen)


def _record_head(net: nn.Module) -> list[torch.Tensor]:
    """Every head output (``K·B × C``, row ``b·K + k`` = pass k of example b), as it was made."""
    outputs: list[torch.Tensor] = []
    net.head.register_forward_hook(lambda _m, _i, out: outputs.append(out.detach().clone()))
    return outputs


def _per_pass_log_lik(head_out: torch.Tensor, y: torch.Tensor) -> torch.Tensor:
    """``ℓ_nk = log p(y_n | x_n, ω_k)`` (B×K, float64) from the head's ``K·B × C`` logits."""
    logits = head_out.double().view(B, K, C)
    log_p = logits - torch.logsumexp(logits, dim=2, keepdim=True)
    return torch.stack([log_p[n, :, int(y[n])] for n in range(B)])


def _bb_alpha(log_lik: torch.Tensor, alpha: float) -> float:
    """``mean_n −(1/α)·(logsumexp_k(α·ℓ_nk) − log K)``; α = 0: ``mean_n −(1/K) Σ_k ℓ_nk``."""
    if alpha == 0:
        return float(-log_lik.mean())
    per_example = -(torch.logsumexp(alpha * log_lik, dim=1) - math.log(K)) / alpha
    return float(per_example.mean())


def _weights_squared(net: nn.Module) -> float:
    """``Σ_i ‖W_i‖²`` over the Linear layers' weight matrices, biases excluded (float64)."""
    return sum(float(m.weight.detach().double().pow(2).sum()) for m in _linears(net))


def test_minibatch_objective_is_the_bb_alpha_energy_plus_the_l2_term() -> None:
    """At α = 0.5 the trainer's (loss, objective) for one batch are the BB-α energy of the
    batch's K passes and that energy plus ``λ·Σ‖W‖²`` (full λ, weights only). The α = 0 energy of
    the same passes is far from it, so a loss computed at another α than the config's fails."""
    net, (x, y) = _net(), _batch()
    lam = 0.01
    config = TrainConfig(alpha=0.5, k_train=K, batch_size=B, weight_decay=lam)
    trainer = _Trainer(net, (x, y), config, "cpu", progress=False, batch_transform=None)
    outputs = _record_head(net)
    net.train()
    loss, objective = trainer.loss(x, y, 1)

    assert len(outputs) == 1 and outputs[0].shape == (B * K, C)
    log_lik = _per_pass_log_lik(outputs[0], y)
    assert float(log_lik.std(dim=1).min()) > 0.1  # the K passes really differ (masks on)
    energy = _bb_alpha(log_lik, 0.5)
    assert loss.item() == pytest.approx(energy, rel=1e-5)
    assert abs(energy - _bb_alpha(log_lik, 0.0)) > 0.05  # α matters on these passes
    assert abs(energy - _bb_alpha(log_lik, 1.0)) > 0.05

    l2 = _weights_squared(net)
    with_biases = l2 + sum(float(m.bias.detach().double().pow(2).sum()) for m in _linears(net))
    assert lam * (with_biases - l2) > 0.3  # counting the biases would be visible
    assert objective.item() == pytest.approx(energy + lam * l2, rel=1e-5)
    # the regulariser alone: objective − data term = λ·Σ‖W‖², not ½·λ·Σ‖W‖² or a bias-inclusive sum
    assert (objective - loss).item() == pytest.approx(lam * l2, rel=1e-4)
    assert lam * l2 > 0.5


@pytest.mark.parametrize("alpha", [0.0, 0.5, 1.0])
def test_reported_train_loss_is_the_bb_alpha_energy_at_the_configured_alpha(alpha: float) -> None:
    """Through :func:`train`: one epoch of one minibatch reports the loss of that batch before
    its step, which is the BB-α energy at the config's α of the K passes the head computed."""
    net, (x, y) = _net(), _batch()
    outputs = _record_head(net)
    config = TrainConfig(alpha=alpha, k_train=K, epochs=1, batch_size=B, weight_decay=0.0)
    result = train(net, (x, y), None, config, progress=False)
    assert len(outputs) == 1
    # the batch is the whole data in a random order: reorder the labels the same way
    order = torch.randperm(B, generator=torch.Generator().manual_seed(config.seed))
    expected = _bb_alpha(_per_pass_log_lik(outputs[0], y[order]), alpha)
    assert result.history[0]["train_loss"] == pytest.approx(expected, rel=1e-5)


def test_one_sgd_step_shrinks_each_weight_by_two_lr_lambda_and_leaves_biases_alone() -> None:
    """∂(λ·Σ‖W‖²)/∂W = 2λW: one plain-SGD step (momentum 0) from the same weights with the same
    masks differs between λ and λ = 0 by exactly ``−lr·2λ·W₀`` on every weight matrix and by
    nothing on the biases. A halved (or bias-inclusive) regulariser moves them otherwise."""
    x, y = _batch()
    lr, lam = 0.1, 0.05

    def one_step(decay: float) -> tuple[dict[str, torch.Tensor], dict[str, torch.Tensor]]:
        net = _net()
        before = copy.deepcopy(net.state_dict())
        config = TrainConfig(
            alpha=0.5, k_train=K, epochs=1, batch_size=B, optimizer="sgd", lr=lr, momentum=0.0,
            weight_decay=decay,
        )  # fmt: skip
        train(net, (x, y), None, config, progress=False)
        return before, net.state_dict()

    w0, with_decay = one_step(lam)
    _, without = one_step(0.0)
    assert any(not torch.equal(w0[n], without[n]) for n in w0)  # the data term did move them
    for name, start in w0.items():
        moved = (with_decay[name] - without[name]).double()
        if name.endswith("weight"):
            expected = -lr * 2 * lam * start.double()
            torch.testing.assert_close(moved, expected, rtol=1e-3, atol=2e-7)
        else:
            assert torch.equal(with_decay[name], without[name]), name
