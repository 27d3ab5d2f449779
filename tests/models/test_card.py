"""The typed model card: defaults in one place, old cards (the bundled one included) read
unchanged, dropped keys ignored, bad values named, and a lossless JSON round trip."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from bayesgate.models.store.card import (
    CARD_FORMAT,
    InferenceSettings,
    InputSpec,
    ModelCard,
    TrainingRecord,
)
from bayesgate.models.store.directory import (
    CARD_FILE,
    ModelStoreError,
    load_model,
    read_card,
    sha256_file,
)

BUNDLED = Path(__file__).resolve().parents[2] / "models" / "pretrained" / "bayesgate-cnn"
MINIMAL = {
    "name": "m",
    "architecture": {"type": "dropout_mlp", "hidden": [4]},
    "weights_sha256": "0" * 64,
    "format": CARD_FORMAT,
}


def test_bundled_card_reads_into_the_typed_sections_and_its_weights_verify() -> None:
    raw = json.loads((BUNDLED / CARD_FILE).read_text())
    card = read_card(BUNDLED)
    assert card.input.shape == raw["input"]["shape"] == [1, 28, 28]
    assert list(card.input.range) == raw["input"]["range"]
    assert card.input.dtype == raw["input"]["dtype"]
    assert card.inference.k_test == raw["inference"]["k_test"]
    assert card.inference.k_attack == raw["inference"]["k_attack"]
    assert card.training.alpha == raw["training"]["alpha"] == 0.5
    assert card.training.k_train == raw["training"]["k_train"]
    assert card.training.val_size == raw["training"]["val_size"]
    assert card.training.epochs_run == raw["training"]["epochs_run"]  # kept as written
    assert card.to_dict() == raw  # nothing lost, nothing added
    assert sha256_file(BUNDLED / "model.safetensors") == card.weights_sha256
    assert load_model(BUNDLED).card == card


def test_a_minimal_card_gets_every_default_from_the_card_module() -> None:
    card = ModelCard.from_dict(MINIMAL)
    assert card.input == InputSpec(shape=[1, 28, 28], dtype="float32", range=(0.0, 1.0))
    assert card.inference == InferenceSettings(k_test=100, k_attack=10)
    assert card.training == TrainingRecord(alpha=None, k_train=None, val_size=10_000)
    assert card.classes == [str(i) for i in range(10)]
    assert card.metrics == {} and card.stochastic is True


def test_round_trip_through_json_is_lossless() -> None:
    card = ModelCard(
        name="round-trip",
        architecture={"type": "dropout_cnn", "p": 0.25, "stochastic": False},
        input={"shape": [3, 8, 9], "range": [-1.0, 1.0]},
        classes=["cat", "dog"],
        training={"alpha": 0.0, "k_train": 1, "val_size": 0, "lr": 3e-3, "config": {"a": [1]}},
        inference={"k_test": 7, "k_attack": 2},
        metrics={"test": {"accuracy": 0.5}},
        weights_sha256="ab" * 32,
    )
    text = card.to_json()
    again = ModelCard.from_dict(json.loads(text))
    assert again == card
    assert again.to_json() == text
    assert again.training.lr == 3e-3 and again.training.config == {"a": [1]}
    assert again.input.range == (-1.0, 1.0) and again.stochastic is False
    assert list(json.loads(text)) == [
        "name",
        "architecture",
        "input",
        "classes",
        "training",
        "inference",
        "metrics",
        "weights_sha256",
        "code_version",
        "created",
        "format",
    ]


def test_keys_the_format_dropped_are_ignored() -> None:
    old = {
        **MINIMAL,
        "inference": {"k_test": 50, "k_attack": 10, "variance_decomposition": "kwon"},
        "input": {"shape": [1, 28, 28], "layout": "NCHW"},
        "future_field": 1,
    }
    card = ModelCard.from_dict(old)
    assert card.inference.k_test == 50
    assert "variance_decomposition" not in card.to_dict()["inference"]
    assert "layout" not in card.to_dict()["input"] and "future_field" not in card.to_dict()


@pytest.mark.parametrize(
    ("section", "value", "where"),
    [
        ("input", {"shape": [1, 0, 28]}, "input.shape.1"),
        ("input", {"shape": []}, "input.shape"),
        ("input", {"shape": "28x28"}, "input.shape"),
        ("input", {"range": [1.0, 0.0]}, "input.range"),
        ("inference", {"k_test": 0}, "inference.k_test"),
        ("inference", {"k_attack": "many"}, "inference.k_attack"),
        ("training", {"val_size": -1}, "training.val_size"),
        ("training", {"alpha": -0.5}, "training.alpha"),
        ("classes", "0123456789", "classes"),
    ],
)
def test_bad_values_name_the_field(section: str, value: object, where: str) -> None:
    with pytest.raises(ModelStoreError, match=rf"^card.json: {where}: "):
        ModelCard.from_dict({**MINIMAL, section: value}, source="card.json")


def test_assignments_are_validated_like_parsed_cards() -> None:
    card = ModelCard.from_dict(MINIMAL)
    card.inference = {"k_test": 30, "k_attack": 5}
    assert card.inference == InferenceSettings(k_test=30, k_attack=5)
    with pytest.raises(ValueError, match="k_test"):
        card.inference.k_test = 0
