"""The answers built per batch (:func:`bayesgate.service.prediction.predictions`) equal, bit for
bit, a straightforward reference: every measure by its own function, the detector's scores from
its parts with the kernel density computed class by class (rows picked with ``nonzero``), the
variation ratio from one-hot votes, one ``float()`` per value and image, ``score > threshold``.

Checked on the bundled ``bayesgate-robust`` (two Mahalanobis layers, kernel density over 10
classes, logistic fusion under the conformal min-p-value rule) and on the tiny model without a
detector, for B = 1 and B > 1, MNIST images and noise, the default and an overridden decision."""

from __future__ import annotations

import dataclasses
from collections.abc import Mapping
from pathlib import Path

import pytest
import torch

from bayesgate.models.detection import Detector
from bayesgate.models.detection.detector import FUSED, FUSED_LOGISTIC, KDE_SCORE, mahalanobis_names
from bayesgate.models.detection.kde import ClassKDE
from bayesgate.models.mc import uncertainty
from bayesgate.service.engine import mc_engine
from bayesgate.service.prediction import Prediction, predictions
from bayesgate.service.served_model import DecisionOverride, ServedModel, load_served_model
from bayesgate.service.settings import DEFAULT_MODEL_DIR

K = 10


def reference_variation_ratio(probs: torch.Tensor) -> torch.Tensor:
    """``1 − f_mode/K`` from one-hot votes (the formula as first written)."""
    _, k, c = probs.shape
    votes = torch.nn.functional.one_hot(probs.argmax(dim=-1), c).sum(dim=1)
    return 1.0 - votes.max(dim=-1).values.to(probs.dtype) / k


def reference_log_density(kde: ClassKDE, f: torch.Tensor, classes: torch.Tensor) -> torch.Tensor:
    """``log KD(f_b)`` class by class: the rows of each class picked with ``nonzero``."""
    out = f.new_zeros(f.shape[0])
    for c in classes.unique().tolist():
        rows = (classes == c).nonzero().squeeze(1)
        out = out.index_put((rows,), kde._class_log_density(f[rows], c))
    return out


def reference_scores(
    detector: Detector | None, probs: torch.Tensor, features: Mapping[str, torch.Tensor] | None
) -> dict[str, torch.Tensor]:
    """Every score, each from its own function or the detector's parts."""
    out = {
        "predictive_entropy": uncertainty.predictive_entropy(probs),
        "mutual_information": uncertainty.mutual_information(probs),
        "variation_ratio": reference_variation_ratio(probs),
    }
    if detector is None:
        return out
    assert features is not None
    predicted = uncertainty.predictive_mean(probs).argmax(dim=-1)
    for layer, gaussians in detector.gaussians.items():
        d = gaussians.distances(features[layer])
        closest, to_predicted = mahalanobis_names(layer)
        out[closest] = d.min(dim=1).values
        out[to_predicted] = d.gather(1, predicted.view(-1, 1)).squeeze(1)
    if detector.kde is not None:
        f = features[detector.kde_layer]
        out[KDE_SCORE] = -reference_log_density(detector.kde, f, predicted)
    if detector.fusion is not None:
        out[FUSED] = detector.fusion.logit(out)
    if detector.conformal is not None:
        out[FUSED_LOGISTIC] = out.pop(FUSED)
        out[FUSED] = detector.conformal.score(out)
    return out


def reference_predictions(
    probs: torch.Tensor, model: ServedModel, features: Mapping[str, torch.Tensor] | None
) -> list[Prediction]:
    """One :class:`Prediction` per image, every value read with its own ``float()``."""
    probs = probs.detach().float()
    with torch.no_grad():
        mean = uncertainty.predictive_mean(probs)
        scores = reference_scores(model.detector, probs, features)
        aleatoric, epistemic = uncertainty.kwon_uncertainty(probs)
    decision, classes = model.decision, model.card.classes
    answers = []
    for b in range(probs.shape[0]):
        label = int(mean[b].argmax())
        row = {name: float(values[b]) for name, values in scores.items()}
        answers.append(
            Prediction(
                label=label,
                class_name=classes[label] if label < len(classes) else str(label),
                probabilities=[float(v) for v in mean[b]],
                predictive_entropy=float(scores["predictive_entropy"][b]),
                mutual_information=float(scores["mutual_information"][b]),
                variation_ratio=float(scores["variation_ratio"][b]),
                aleatoric_variance=float(aleatoric[b]),
                epistemic_variance=float(epistemic[b]),
                score_name=decision.score,
                score=row[decision.score],
                threshold=decision.threshold,
                adversarial=row[decision.score] > decision.threshold,
                scores=row,
                model=model.ref,
            )
        )
    return answers


@pytest.fixture(scope="module")
def robust() -> ServedModel:
    return load_served_model(DEFAULT_MODEL_DIR, "cpu")


@pytest.fixture(scope="module")
def tiny(tiny_model_dir: Path) -> ServedModel:
    return load_served_model(tiny_model_dir, "cpu")


def _inputs(kind: str, n: int, mnist: tuple[torch.Tensor, torch.Tensor]) -> torch.Tensor:
    if kind == "mnist":
        return mnist[0][:n]
    return torch.rand(n, 1, 28, 28, generator=torch.Generator().manual_seed(n))


def _check(model: ServedModel, x: torch.Tensor) -> list[Prediction]:
    features = model.detector is not None
    out = mc_engine(model.network, x, K, torch.Generator().manual_seed(7), features=features)
    probs, feats = (out.probs, out.features) if features else (out, None)
    got, want = predictions(probs, model, feats), reference_predictions(probs, model, feats)
    assert len(got) == len(want) == x.shape[0]
    for g, w in zip(got, want, strict=True):
        assert list(g.scores) == list(w.scores)  # the same names in the same order
        assert dataclasses.asdict(g) == dataclasses.asdict(w)  # every value, bit for bit
    return got


@pytest.mark.parametrize("kind", ["mnist", "noise"])
@pytest.mark.parametrize("batch", [1, 2, 16, 37])
def test_robust_model_answers_equal_the_reference(
    robust: ServedModel, mnist_test: tuple[torch.Tensor, torch.Tensor], kind: str, batch: int
) -> None:
    got = _check(robust, _inputs(kind, batch, mnist_test))
    assert got[0].score_name == FUSED
    assert {FUSED, FUSED_LOGISTIC, KDE_SCORE} <= set(got[0].scores)


def test_robust_model_flags_some_and_passes_some(
    robust: ServedModel, mnist_test: tuple[torch.Tensor, torch.Tensor]
) -> None:
    """Both sides of the threshold are exercised: clean digits and noise in one batch."""
    x = torch.cat([_inputs("mnist", 24, mnist_test), _inputs("noise", 8, mnist_test)])
    got = _check(robust, x)
    assert any(p.adversarial for p in got) and not all(p.adversarial for p in got)
    assert len({p.label for p in got}) > 3  # several kernel-density groups


@pytest.mark.parametrize("score", ["mahalanobis_penultimate_predicted", "variation_ratio"])
def test_overridden_decision_answers_equal_the_reference(
    robust: ServedModel, mnist_test: tuple[torch.Tensor, torch.Tensor], score: str
) -> None:
    threshold = 0.1 if score == "variation_ratio" else 50.0
    model = dataclasses.replace(robust, override=DecisionOverride(score, threshold, "now"))
    got = _check(model, _inputs("mnist", 20, mnist_test))
    assert {p.score_name for p in got} == {score}


@pytest.mark.parametrize("batch", [1, 5])
def test_model_without_detector_answers_equal_the_reference(
    tiny: ServedModel, mnist_test: tuple[torch.Tensor, torch.Tensor], batch: int
) -> None:
    got = _check(tiny, _inputs("mnist", batch, mnist_test))
    assert list(got[0].scores) == list(uncertainty.SCORES)


def test_summary_equals_each_measure() -> None:
    g = torch.Generator().manual_seed(0)
    for b, k, c in [(1, 10, 10), (16, 10, 10), (7, 1, 3)]:
        for dtype in (torch.float32, torch.float64):
            probs = torch.softmax(3 * torch.randn(b, k, c, generator=g, dtype=dtype), dim=-1)
            got = uncertainty.summary(probs)
            aleatoric, epistemic = uncertainty.kwon_uncertainty(probs)
            want = {
                "mean": uncertainty.predictive_mean(probs),
                **{name: fn(probs) for name, fn in uncertainty.SCORES.items()},
                "aleatoric_variance": aleatoric,
                "epistemic_variance": epistemic,
            }
            assert list(got) == list(want)
            for name, values in want.items():
                assert torch.equal(got[name], values), name
            assert torch.equal(got["variation_ratio"], reference_variation_ratio(probs))


@pytest.mark.parametrize("equal_sizes", [True, False])
def test_kde_grouped_equals_class_by_class_and_keeps_gradients(equal_sizes: bool) -> None:
    """Classes of equal and unequal sizes (one logsumexp, or one per class), classes absent,
    float32 and float64 with a gradient, one row, no rows."""
    g = torch.Generator().manual_seed(1)
    bounds = [0, 4, 8, 12, 16] if equal_sizes else [0, 3, 4, 9, 16]
    kde = ClassKDE(torch.randn(16, 5, generator=g), torch.tensor(bounds), 1.7)
    for classes in ([3, 0, 3, 2, 0, 0, 3], [1, 1, 1], [2], list(range(4)) * 9):
        labels = torch.tensor(classes)
        for dtype in (torch.float32, torch.float64):
            f = torch.randn(len(classes), 5, generator=g, dtype=dtype, requires_grad=True)
            got = kde.log_density(f, labels)
            want = reference_log_density(kde, f, labels)
            assert got.dtype == dtype and torch.equal(got, want)
            (grad,) = torch.autograd.grad(got.sum(), f)
            (want_grad,) = torch.autograd.grad(want.sum(), f)
            torch.testing.assert_close(grad, want_grad, rtol=0, atol=1e-12)
    assert kde.log_density(torch.zeros(0, 5), torch.zeros(0, dtype=torch.int64)).shape == (0,)
