"""The answer for one input: :class:`Prediction`, built from the engine's ``B×K×C`` probabilities.

The worker makes one :class:`Prediction` per instance; ``/v1`` (:mod:`bayesgate.service.schemas`)
and ``/v2`` (:mod:`bayesgate.service.inference_protocol`) only encode it. For instance ``b`` with
MC samples ``p_k = probs[b, k]`` (``K×C``):

- ``probabilities = p̄ = (1/K) Σ_k p_k`` and ``label = argmax_c p̄_c``;
- ``predictive_entropy = H[p̄] = −Σ_c p̄_c log p̄_c``;
- ``mutual_information = H[p̄] − (1/K) Σ_k H[p_k]``;
- ``variation_ratio = 1 − f_mode / K``;
- ``aleatoric_variance = 1 − (1/K) Σ_k ‖p_k‖²`` and ``epistemic_variance = (1/K) Σ_k ‖p_k‖² − ‖p̄‖²``
  (Kwon et al.);
- ``scores``: every score by name — the three above and, when the model has a fused detector
  (:mod:`bayesgate.models.detection`), ``mahalanobis_<layer>``, ``mahalanobis_<layer>_predicted``,
  ``neg_log_kde`` and ``fused``, computed from the features of the same K passes;
- the decision (:attr:`ServedModel.decision`): ``score = scores[score_name]``, the fused score when
  there is a detector (else calibration.json's), or the admin's override;
  ``adversarial = score > threshold``;
- ``model``: the weights and calibration that computed it (never read anywhere else, so an admin
  reload between a request's arrival and its batch cannot mislabel the answer).

A new score is one more field here, computed in :func:`predictions`, and named in the two
encoders (the ``/v1`` response model and the ``/v2`` output table).
"""

from __future__ import annotations

from collections.abc import Callable, Mapping
from dataclasses import dataclass
from typing import Any

import torch

from bayesgate.models.mc import uncertainty
from bayesgate.service.served_model import ModelRef, ServedModel


@dataclass(slots=True)  # not frozen: a frozen dataclass is ~2× slower to build, per instance
class Prediction:
    """One instance's answer (plain Python values, ready to encode; not changed once built)."""

    label: int
    class_name: str
    probabilities: list[float]
    predictive_entropy: float
    mutual_information: float
    variation_ratio: float
    aleatoric_variance: float
    epistemic_variance: float
    score_name: str
    score: float
    threshold: float
    adversarial: bool
    scores: dict[str, float]  # every score by name (uncertainty, density, fused)
    model: ModelRef
    samples: list[list[float]] | None = None  # K×C, when the request asked for them


def predictions(
    probs: torch.Tensor,
    model: ServedModel,
    features: Mapping[str, torch.Tensor] | None = None,
) -> list[Prediction]:
    """One :class:`Prediction` per row of ``probs`` (``B×K×C``, any device), computed by
    ``model``; without the samples (the worker attaches them on request). ``features`` (from the
    same K passes) are needed when the model has a fused detector.

    Built per batch, not per image: every measure and score is one tensor over the batch
    (:func:`~bayesgate.models.mc.uncertainty.summary`, :meth:`Detector.scores`), all of them are
    stacked into one ``B×(scores + 2)`` float64 table read back with one ``tolist()``, and the
    per-image work is only making the :class:`Prediction` from its row (plain Python). The
    values are those of each measure's own function (``tests/service/test_service_answers.py``
    checks them against a straightforward reference, bit for bit).
    """
    return rows_of(answer_columns(probs, model, features), model)


def engine_outputs(
    engine: Callable[..., Any],
    model: ServedModel,
    x: torch.Tensor,
    k: int,
    generator: torch.Generator | None,
) -> tuple[torch.Tensor, dict[str, torch.Tensor] | None]:
    """``(probs B×K×C, features)`` of one call of ``engine`` (``mc_engine``'s signature) with
    ``k`` passes over ``x``: the features — of the same K passes, the layers the detector reads —
    only when the model has a detector (``None`` otherwise)."""
    if model.detector is None:
        return engine(model.network, x, k, generator), None
    out = engine(model.network, x, k, generator, features=model.detector.layers)
    return out.probs, out.features


def answer(
    model: ServedModel, x: torch.Tensor, k: int, generator: torch.Generator | None
) -> list[Prediction]:
    """The :class:`Prediction` s of the batch ``x`` (on ``model.device``) from one engine call of
    ``k`` passes (:func:`engine_outputs`), as the worker computes a request (with its own,
    replaceable engine)."""
    from bayesgate.service.engine import mc_engine

    with torch.inference_mode():
        probs, features = engine_outputs(mc_engine, model, x, k, generator)
        return predictions(probs, model, features)


def rows_of(columns: AnswerColumns, model: ServedModel) -> list[Prediction]:
    """The :class:`Prediction` of each row of ``columns`` (:func:`predictions`' per-image step)."""
    classes, ref, decision = model.card.classes, model.ref, model.decision
    with torch.inference_mode():
        scores = columns.scores
        names = tuple(scores)
        # float32 → float64 is exact: the same Python floats as each column's own tolist()
        table = torch.stack(
            [*scores.values(), columns.aleatoric_variance, columns.epistemic_variance], dim=1
        ).double()
        rows, labels, means = table.tolist(), columns.labels.tolist(), columns.mean.tolist()
    position = {name: i for i, name in enumerate(names)}
    entropy, mutual, ratio = (position[n] for n in UNCERTAINTY)
    chosen, threshold = position[decision.score], decision.threshold
    n_classes = len(classes)
    return [
        Prediction(
            label=label,
            class_name=classes[label] if label < n_classes else str(label),
            probabilities=means[b],
            predictive_entropy=row[entropy],
            mutual_information=row[mutual],
            variation_ratio=row[ratio],
            aleatoric_variance=row[-2],
            epistemic_variance=row[-1],
            score_name=decision.score,
            score=row[chosen],
            threshold=threshold,
            adversarial=row[chosen] > threshold,
            scores=dict(zip(names, row, strict=False)),  # the row's last two are not scores
            model=ref,
        )
        for b, (label, row) in enumerate(zip(labels, rows, strict=True))
    ]


@dataclass(frozen=True, slots=True)
class AnswerColumns:
    """A batch's answers as tensors (float32 unless said; ``B`` rows each), before any
    per-image object is made."""

    mean: torch.Tensor  # p̄, B×C
    labels: torch.Tensor  # argmax_c p̄_c, int64
    scores: dict[str, torch.Tensor]  # every score by name: the uncertainty ones first
    aleatoric_variance: torch.Tensor
    epistemic_variance: torch.Tensor

    def rows(self, start: int, stop: int) -> AnswerColumns:
        """Rows ``start:stop`` (views)."""
        return AnswerColumns(
            self.mean[start:stop],
            self.labels[start:stop],
            {name: score[start:stop] for name, score in self.scores.items()},
            self.aleatoric_variance[start:stop],
            self.epistemic_variance[start:stop],
        )

    def take(self, index: torch.Tensor) -> AnswerColumns:
        """The rows ``index`` (int64), in its order (copies)."""
        return AnswerColumns(
            self.mean.index_select(0, index),
            self.labels.index_select(0, index),
            {name: score.index_select(0, index) for name, score in self.scores.items()},
            self.aleatoric_variance.index_select(0, index),
            self.epistemic_variance.index_select(0, index),
        )

    def flagged(self, score: str, threshold: float) -> torch.Tensor:
        """``score > threshold`` per row, compared as :class:`Prediction` does (the float32
        score as float64)."""
        return self.scores[score].double() > threshold


@dataclass(frozen=True, slots=True)
class ColumnAnswer:
    """A job's answers as columns (a native front end's batch, ``Job.columnar``): no
    per-image object; the same values as the :class:`Prediction` s of its rows."""

    columns: AnswerColumns
    model: ModelRef
    score_name: str
    threshold: float


def answer_columns(
    probs: torch.Tensor,
    model: ServedModel,
    features: Mapping[str, torch.Tensor] | None = None,
) -> AnswerColumns:
    """Every measure and score of :func:`predictions` for the batch ``probs`` (``B×K×C``), one
    tensor each (:func:`~bayesgate.models.mc.uncertainty.summary`, :meth:`Detector.scores`)."""
    probs = _cpu_float(probs)
    with torch.inference_mode():
        measures = uncertainty.summary(probs)
        mean = measures["mean"]
        labels = mean.argmax(dim=-1)
        scores = _all_scores(model, probs, features, measures, labels)
    return AnswerColumns(mean, labels, scores, measures[ALEATORIC], measures[EPISTEMIC])


UNCERTAINTY = ("predictive_entropy", "mutual_information", "variation_ratio")
ALEATORIC, EPISTEMIC = "aleatoric_variance", "epistemic_variance"


def _cpu_float(t: torch.Tensor) -> torch.Tensor:
    """``t`` as a float32 CPU tensor without autograd history (itself when it is one already)."""
    if t.dtype != torch.float32 or t.device.type != "cpu":
        t = t.float().cpu()
    return t.detach() if t.requires_grad else t


def _all_scores(
    model: ServedModel,
    probs: torch.Tensor,
    features: Mapping[str, torch.Tensor] | None,
    measures: Mapping[str, torch.Tensor],
    predicted: torch.Tensor,
) -> dict[str, torch.Tensor]:
    """The uncertainty scores, and with a detector every density score and the fused one
    (``predicted``: the predicted classes, ``argmax p̄``)."""
    uncertain = {name: measures[name] for name in UNCERTAINTY}
    if model.detector is None:
        return uncertain
    if features is None:
        raise RuntimeError("the served model has a detector but the engine gave no features")
    cpu = {name: _cpu_float(features[name]) for name in model.detector.layers if name in features}
    return model.detector.scores(probs, cpu, uncertain, predicted=predicted)
