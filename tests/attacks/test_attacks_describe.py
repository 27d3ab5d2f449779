"""Sweep labels name the network family and how it was trained."""

from __future__ import annotations

from pathlib import Path

import pytest

from bayesgate.attacks.sweep import describe
from bayesgate.models.networks.registry import build_network, preset_architecture
from bayesgate.models.store.directory import ModelCard, load_model, save_model


@pytest.mark.parametrize(
    ("preset", "name", "alpha", "label"),
    [
        ("mlp-2x32", "m", 0.5, "MLP α=0.5"),
        ("mlp-2x32-det", "m", 0.5, "MLP det"),
        ("mlp-2x32-det", "m-last", 0.5, "MLP det last"),  # long_runs.py export --last
        ("cnn", "m", 1.0, "CNN α=1"),
        ("bbb-lenet5", "m", 0.0, "BBB LeNet-5 α=0"),
    ],
)
def test_describe_labels_each_family(
    tmp_path: Path, preset: str, name: str, alpha: float, label: str
) -> None:
    arch = preset_architecture(preset)
    card = ModelCard(name=name, architecture=arch, training={"alpha": alpha})
    save_model(build_network(arch), card, tmp_path)
    described = describe(load_model(tmp_path))
    assert described["model"] == label
    assert described["stochastic"] is arch["stochastic"]
    assert described["alpha"] == (alpha if arch["stochastic"] else None)
