"""The MC engine: the dropout layer, K vectorised stochastic passes (``B×K×C``), the BB-α losses
and the uncertainty measures computed from the samples.

The names below are imported on first use (they import torch): importing the torch-free
:mod:`.options` (the scores' names, the seeds' range), which ``bayesgate calibrate`` and
``bayesgate predict`` check their flags against, does not import torch."""

from __future__ import annotations

from typing import TYPE_CHECKING

from bayesgate.lazy import lazy_names

if TYPE_CHECKING:  # what type checkers and IDEs see; at run time, __getattr__ below
    from bayesgate.models.mc.dropout import MCDropout, mc_sampling
    from bayesgate.models.mc.engine import (
        MCPrediction,
        mc_log_predictive,
        mc_logits,
        mc_predict,
    )
    from bayesgate.models.mc.losses import (
        alpha_energy,
        bbalpha_gaussian_loss,
        bbalpha_softmax_loss,
    )
    from bayesgate.models.mc.uncertainty import (
        SCORES,
        expected_entropy,
        mutual_information,
        predictive_entropy,
        predictive_mean,
        variation_ratio,
    )

_SOURCES = {
    "MCDropout": "dropout",
    "mc_sampling": "dropout",
    "MCPrediction": "engine",
    "mc_log_predictive": "engine",
    "mc_logits": "engine",
    "mc_predict": "engine",
    "alpha_energy": "losses",
    "bbalpha_gaussian_loss": "losses",
    "bbalpha_softmax_loss": "losses",
    "SCORES": "uncertainty",
    "expected_entropy": "uncertainty",
    "mutual_information": "uncertainty",
    "predictive_entropy": "uncertainty",
    "predictive_mean": "uncertainty",
    "variation_ratio": "uncertainty",
}

__all__ = [  # the names of _SOURCES (a test checks that each resolves)
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

__getattr__, __dir__ = lazy_names(__name__, _SOURCES, globals())
