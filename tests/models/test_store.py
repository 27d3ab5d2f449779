"""Model store: safetensors + card.json round trip, integrity checks, and clear errors."""

from __future__ import annotations

import datetime as dt
import hashlib
import json
import re
from pathlib import Path

import pytest
import torch
from torch import nn

from bayesgate.models.networks.registry import build_network, preset_architecture
from bayesgate.models.store.directory import (
    CARD_FILE,
    CARD_FORMAT,
    WEIGHTS_FILE,
    ModelCard,
    ModelStoreError,
    load_model,
    read_card,
    save_model,
    write_card,
)

MODELS_DIR = Path(__file__).resolve().parents[2] / "models"


def _card(preset: str = "mlp-2x32") -> ModelCard:
    return ModelCard(
        name=f"test-{preset}",
        architecture=preset_architecture(preset),
        training={"alpha": 0.5, "k_train": 10, "epochs": 1},
        metrics={"val": {"accuracy": 0.91, "nll": 0.3}},
    )


def _net(preset: str = "mlp-2x32") -> nn.Module:
    torch.manual_seed(0)
    return build_network(preset_architecture(preset)).eval()


@pytest.fixture
def saved(tmp_path: Path) -> tuple[nn.Module, ModelCard, Path]:
    net, card = _net(), _card()
    directory = tmp_path / "model"
    written = save_model(net, card, directory)
    return net, written, directory


@pytest.mark.parametrize("preset", ["mlp-2x32", "mlp-2x32-det", "cnn"])
def test_round_trip_gives_identical_outputs_and_card(tmp_path: Path, preset: str) -> None:
    net = _net(preset)
    written = save_model(net, _card(preset), tmp_path)
    loaded = load_model(tmp_path)
    assert loaded.directory == tmp_path
    assert not loaded.network.training
    assert loaded.network.stochastic is (not preset.endswith("-det"))
    x = torch.rand(4, 1, 28, 28, generator=torch.Generator().manual_seed(1))
    with torch.no_grad():
        assert torch.equal(loaded.network(x), net(x))
    for name, tensor in net.state_dict().items():
        assert torch.equal(loaded.network.state_dict()[name], tensor)
    assert loaded.card == written
    assert read_card(tmp_path) == written
    assert loaded.card.training.alpha == 0.5 and loaded.card.training.k_train == 10
    assert loaded.card.training.model_extra == {"epochs": 1}
    assert loaded.card.metrics == {"val": {"accuracy": 0.91, "nll": 0.3}}
    assert (loaded.card.inference.k_test, loaded.card.inference.k_attack) == (100, 10)
    assert loaded.card.input.shape == [1, 28, 28] and loaded.card.input.range == (0.0, 1.0)
    assert loaded.card.classes == [str(i) for i in range(10)]
    assert loaded.card.format == CARD_FORMAT
    assert loaded.card.stochastic is (not preset.endswith("-det"))
    assert written.code_version
    created = dt.datetime.fromisoformat(written.created)
    assert created.tzinfo is not None
    assert abs((dt.datetime.now(dt.UTC) - created).total_seconds()) < 600


def test_card_sha256_is_the_sha256_of_the_weights_file(saved) -> None:
    _, card, directory = saved
    digest = hashlib.sha256((directory / WEIGHTS_FILE).read_bytes()).hexdigest()
    assert card.weights_sha256 == digest
    assert json.loads((directory / CARD_FILE).read_text())["weights_sha256"] == digest
    assert re.fullmatch(r"[0-9a-f]{64}", digest)


def test_same_weights_give_the_same_sha256_every_time(tmp_path: Path) -> None:
    """safetensors writes its metadata in hash-map order (it varied between saves in one process
    before the header was canonicalised); the stored file must not."""
    digests = {save_model(_net(), _card(), tmp_path / f"m{i}").weights_sha256 for i in range(12)}
    assert len(digests) == 1
    other = _net()
    with torch.no_grad():
        next(other.parameters())[0, 0] += 1e-3
    assert save_model(other, _card(), tmp_path / "other").weights_sha256 not in digests


def test_weights_header_is_canonical(saved) -> None:
    _, _, directory = saved
    blob = (directory / WEIGHTS_FILE).read_bytes()
    size = int.from_bytes(blob[:8], "little")
    text = blob[8 : 8 + size]
    assert (8 + size) % 8 == 0  # tensor data starts 8-byte aligned
    header = json.loads(text)
    assert text.rstrip(b" ") == json.dumps(header, sort_keys=True, separators=(",", ":")).encode()


def test_weights_file_is_safetensors_not_pickle(saved) -> None:
    net, _, directory = saved
    blob = (directory / WEIGHTS_FILE).read_bytes()
    # safetensors: u64 little-endian header length, then a JSON header, then raw tensor bytes
    header_len = int.from_bytes(blob[:8], "little")
    assert 0 < header_len < len(blob)
    header = json.loads(blob[8 : 8 + header_len])
    assert blob[8:9] == b"{"
    tensors = {k: v for k, v in header.items() if k != "__metadata__"}
    state = net.state_dict()
    assert set(tensors) == set(state)
    end = 0
    for name, info in tensors.items():
        assert info["dtype"] == "F32"
        assert info["shape"] == list(state[name].shape)
        start, stop = info["data_offsets"]
        assert stop - start == state[name].numel() * 4
        end = max(end, stop)
    assert 8 + header_len + end == len(blob)  # nothing else (no pickled payload) in the file
    assert header["__metadata__"]["format"] == CARD_FORMAT
    assert not blob.startswith((b"\x80", b"PK"))  # pickle protocol / torch zip archive


def test_no_pickle_in_the_models_package() -> None:
    pattern = re.compile(r"\bimport pickle\b|\bpickle\.loads?\(|torch\.load\(|weights_only")
    offenders = [
        str(path)
        for path in MODELS_DIR.rglob("*.py")
        if pattern.search(path.read_text(encoding="utf-8"))
    ]
    assert offenders == []


@pytest.mark.parametrize("where", ["header", "data", "last"])
def test_tampered_weights_are_rejected(saved, where: str) -> None:
    _, _, directory = saved
    path = directory / WEIGHTS_FILE
    blob = bytearray(path.read_bytes())
    header_len = int.from_bytes(blob[:8], "little")
    index = {"header": 8 + header_len // 2, "data": 8 + header_len + 100, "last": len(blob) - 1}
    blob[index[where]] ^= 0x01
    path.write_bytes(bytes(blob))
    with pytest.raises(ModelStoreError, match="sha256") as info:
        load_model(directory)
    assert str(path) in str(info.value)


def test_truncated_weights_are_rejected(saved) -> None:
    _, _, directory = saved
    path = directory / WEIGHTS_FILE
    path.write_bytes(path.read_bytes()[:-17])
    with pytest.raises(ModelStoreError, match="truncated or tampered") as info:
        load_model(directory)
    assert str(path) in str(info.value)


def test_truncated_weights_with_a_matching_card_are_still_rejected(saved) -> None:
    # someone truncated the file and "fixed" the card's sha256: safetensors parsing catches it
    _, card, directory = saved
    path = directory / WEIGHTS_FILE
    blob = path.read_bytes()[:-17]
    path.write_bytes(blob)
    card.weights_sha256 = hashlib.sha256(blob).hexdigest()
    write_card(card, directory)
    with pytest.raises(ModelStoreError, match="not a valid safetensors file") as info:
        load_model(directory)
    assert str(path) in str(info.value)


def test_missing_files(saved, tmp_path: Path) -> None:
    _, _, directory = saved
    with pytest.raises(ModelStoreError, match="model card not found"):
        load_model(tmp_path / "nowhere")
    (directory / WEIGHTS_FILE).unlink()
    with pytest.raises(ModelStoreError, match="weights file not found") as info:
        load_model(directory)
    assert str(directory / WEIGHTS_FILE) in str(info.value)
    (directory / CARD_FILE).unlink()
    with pytest.raises(ModelStoreError, match="model card not found") as info:
        load_model(directory)
    assert str(directory / CARD_FILE) in str(info.value)


@pytest.mark.parametrize(
    ("text", "message"),
    [
        ("{not json", "not valid JSON"),
        ("[1, 2, 3]", "expected a JSON object"),
        (b"\xff\xfe\x00".decode("latin-1"), "not valid JSON"),
    ],
)
def test_unreadable_card(saved, text: str, message: str) -> None:
    _, _, directory = saved
    (directory / CARD_FILE).write_text(text, encoding="latin-1")
    with pytest.raises(ModelStoreError, match=message) as info:
        load_model(directory)
    assert str(directory / CARD_FILE) in str(info.value)


def _edit_card(directory: Path, **changes) -> None:
    data = json.loads((directory / CARD_FILE).read_text())
    for key, value in changes.items():
        if value is None:
            del data[key]
        else:
            data[key] = value
    (directory / CARD_FILE).write_text(json.dumps(data))


def test_wrong_card_format(saved) -> None:
    _, _, directory = saved
    _edit_card(directory, format="bayesgate-model/0")
    with pytest.raises(ModelStoreError, match="unsupported card format 'bayesgate-model/0'"):
        load_model(directory)
    _edit_card(directory, format=None)
    with pytest.raises(ModelStoreError, match="unsupported card format None"):
        read_card(directory)


@pytest.mark.parametrize("field", ["name", "architecture", "weights_sha256"])
def test_card_lacking_a_required_field(saved, field: str) -> None:
    _, _, directory = saved
    _edit_card(directory, **{field: None})
    with pytest.raises(ModelStoreError, match=f"lacks required field.*{field}"):
        load_model(directory)


def test_architecture_mismatch(saved) -> None:
    _, card, directory = saved
    _edit_card(directory, architecture={**card.architecture, "hidden": [64, 64]})
    with pytest.raises(ModelStoreError, match="do not fit the card's architecture") as info:
        load_model(directory)
    assert str(directory / WEIGHTS_FILE) in str(info.value)
    _edit_card(directory, architecture={**card.architecture, "type": "resnet"})
    with pytest.raises(ModelStoreError, match="unknown network type 'resnet'"):
        load_model(directory)
    _edit_card(directory, architecture={**card.architecture, "depth": 3})
    with pytest.raises(ModelStoreError, match="does not fit DropoutMLP"):
        load_model(directory)


def test_write_card_updates_metadata_only(saved) -> None:
    _, card, directory = saved
    weights_before = (directory / WEIGHTS_FILE).read_bytes()
    card.metrics["test"] = {"accuracy": 0.5}
    write_card(card, directory)
    assert (directory / WEIGHTS_FILE).read_bytes() == weights_before
    loaded = load_model(directory)
    assert loaded.card.metrics["test"] == {"accuracy": 0.5}
    assert loaded.card.metrics["val"] == {"accuracy": 0.91, "nll": 0.3}
    # no temporaries left behind by the atomic writes
    assert sorted(p.name for p in directory.iterdir()) == sorted([CARD_FILE, WEIGHTS_FILE])


def test_unknown_card_fields_are_ignored(saved) -> None:
    _, card, directory = saved
    _edit_card(directory, future_field={"x": 1})
    assert read_card(directory) == card
