"""The MC engine: the dropout layer, K vectorised stochastic passes (``B×K×C``), the BB-α losses
and the uncertainty measures computed from the samples."""

from bayesgate.models.mc.dropout import MCDropout, mc_sampling
from bayesgate.models.mc.engine import MCPrediction, mc_log_predictive, mc_logits, mc_predict
from bayesgate.models.mc.losses import alpha_energy, bbalpha_gaussian_loss, bbalpha_softmax_loss
from bayesgate.models.mc.uncertainty import (
    SCORES,
    expected_entropy,
    mutual_information,
    predictive_entropy,
    predictive_mean,
    variation_ratio,
)

__all__ = [
    "SCORES",
    "MCDropout",
    "MCPrediction",
    "alpha_energy",
    "bbalpha_gaussian_loss",
    "bbalpha_softmax_loss",
    "expected_entropy",
    "mc_log_predictive",
    "mc_logits",
    "mc_predict",
    "mc_sampling",
    "mutual_information",
    "predictive_entropy",
    "predictive_mean",
    "variation_ratio",
]
