"""Checks on what a model directory holds, before and after the network is built: the values of
its JSON files, the card's architecture numbers, the weights' tensor names and shapes, and the
card's input shape and classes against the network. Each returns or raises a one-line problem
naming the field (:mod:`bayesgate.models.store.directory` adds the file)."""

from __future__ import annotations

import json
import math
import numbers
from pathlib import Path
from typing import Any

import torch
from torch import nn

from bayesgate.errors import ModelStoreError
from bayesgate.models.store.card import ModelCard

MAX_JSON_DEPTH = 64  # nesting levels of a store JSON file (ours use 5; orjson encodes 254)
INT64_RANGE = 1 << 63  # JSON integers are kept to what every encoder and client reads exactly


class LongInt(str):
    """A JSON integer literal too long to convert (Python refuses over 4,300 digits): kept as
    text by :func:`read_json_object` so the check names its field."""


def parse_int(text: str) -> int | LongInt:
    return LongInt(text) if len(text) > 40 else int(text)


def json_value_problem(data: Any) -> str | None:
    """A value of a parsed JSON document that the store refuses, as ``field: problem``
    (``field`` a dotted path like ``training.seed`` or ``attacks.0.auroc``); ``None`` if none."""
    stack: list[tuple[Any, str, int]] = [(data, "", 0)]
    while stack:
        value, where, depth = stack.pop()
        if isinstance(value, dict | list):
            if depth >= MAX_JSON_DEPTH:
                return f"{_shown(where)}: nested deeper than {MAX_JSON_DEPTH} levels"
            items = value.items() if isinstance(value, dict) else enumerate(value)
            for key, item in items:
                part = str(key) if str(key).isprintable() else ascii(key)
                inner = f"{where}.{part}" if where else part
                if isinstance(key, str) and not _valid_unicode(key):
                    return f"{_shown(inner)}: key is not valid Unicode (lone surrogate)"
                stack.append((item, inner, depth + 1))
        elif isinstance(value, LongInt):
            digits = len(value.lstrip("-"))
            return f"{_shown(where)}: integer of {digits} digits is outside the signed 64-bit range"
        elif isinstance(value, str) and not _valid_unicode(value):
            return f"{_shown(where)}: string is not valid Unicode (lone surrogate)"
        elif is_int(value) and not -INT64_RANGE <= value < INT64_RANGE:
            return f"{_shown(where)}: integer {value} is outside the signed 64-bit range"
    return None


def _shown(where: str, limit: int = 80) -> str:
    """A field path for a one-line message: at most ``limit`` characters."""
    return where if len(where) <= limit else where[: limit - 1] + "…"


def _valid_unicode(text: str) -> bool:
    if text.isascii():
        return True
    try:
        text.encode("utf-8")
    except UnicodeEncodeError:
        return False
    return True


# Architecture keys the networks take, by kind (registry.build_network passes every key but
# ``type`` and ``preset`` to the network's constructor); checked before anything is built.
_SIZE_KEYS = ("hidden", "channels")  # a positive integer, or a non-empty list of them


def architecture_problem(arch: dict[str, Any]) -> str | None:
    """``architecture.<key>: problem`` for the first unusable constructor argument of a card's
    architecture, ``None`` when the known keys are well typed (unknown keys are left to the
    network's constructor)."""
    for key in _SIZE_KEYS:
        if key in arch:
            value = arch[key]
            values = value if isinstance(value, list) else [value]
            if not values or not all(is_int(v) and v > 0 for v in values):
                return (
                    f"architecture.{key}: must be a positive integer or a non-empty list of "
                    f"them, got {brief(value)}"
                )
    if "classes" in arch and not (is_int(arch["classes"]) and arch["classes"] > 0):
        return f"architecture.classes: must be a positive integer, got {brief(arch['classes'])}"
    if "in_shape" in arch:
        shape = arch["in_shape"]
        if not (isinstance(shape, list) and shape and all(is_int(v) and v > 0 for v in shape)):
            return (
                "architecture.in_shape: must be a non-empty list of positive integers, "
                f"got {brief(shape)}"
            )
    padding = arch.get("conv1_padding", 0)
    if not (is_int(padding) and padding >= 0):
        return f"architecture.conv1_padding: must be a non-negative integer, got {brief(padding)}"
    if "p" in arch and not (is_real(arch["p"]) and 0.0 <= arch["p"] < 1.0):
        return f"architecture.p: must be a number in [0, 1), got {brief(arch['p'])}"
    for key in ("rho_init", "mu_init_std"):
        value = arch.get(key)
        if value is not None and not is_real(value):
            return f"architecture.{key}: must be a finite number, got {brief(value)}"
    if "stochastic" in arch and not isinstance(arch["stochastic"], bool):
        return f"architecture.stochastic: must be true or false, got {brief(arch['stochastic'])}"
    for key in ("type", "preset", "sampling", "activation"):
        if key in arch and not isinstance(arch[key], str):
            return f"architecture.{key}: must be a string, got {brief(arch[key])}"
    return None


def is_int(value: Any) -> bool:
    """An integer (numpy's too), not a bool (``true`` is 1 to Python, never a count)."""
    return isinstance(value, numbers.Integral) and not isinstance(value, bool)


def is_real(value: Any) -> bool:
    """A finite real number (numpy's too), not a bool nor a string holding one."""
    if not isinstance(value, numbers.Real) or isinstance(value, bool):
        return False
    try:
        return math.isfinite(value)
    except OverflowError:  # an integer too large for a float
        return False


def brief(value: Any, limit: int = 60) -> str:
    """A value of a store file as JSON (``true``, ``"5"``, ``2.5``) for a one-line message, cut
    at ``limit`` characters."""
    try:
        text = json.dumps(value)
    except (TypeError, ValueError):  # not a JSON value (set from code): its repr
        text = ascii(value)
    return first_line(text, limit)


def first_line(text: str, limit: int = 160) -> str:
    """The first line of ``text`` (an exception's message), cut at ``limit`` characters."""
    lines = text.splitlines()
    first = lines[0] if lines else ""
    return first if len(first) <= limit else first[: limit - 1] + "…"


def state_mismatch(network: nn.Module, state: dict[str, torch.Tensor]) -> str | None:
    """How the tensors of a weights file differ from the network's (names, then shapes)."""
    expected = {name: tuple(t.shape) for name, t in network.state_dict().items()}
    missing = sorted(set(expected) - set(state))
    unexpected = sorted(set(state) - set(expected))
    if missing or unexpected:
        parts = []
        if missing:
            parts.append(f"missing {', '.join(missing[:3])}{' …' if len(missing) > 3 else ''}")
        if unexpected:
            extra = ", ".join(unexpected[:3])
            parts.append(f"unexpected {extra}{' …' if len(unexpected) > 3 else ''}")
        return "; ".join(parts)
    for name, shape in expected.items():
        if tuple(state[name].shape) != shape:
            return f"{name}: shape {list(state[name].shape)} in the file, {list(shape)} in the card"
    return None


def check_input_and_classes(network: nn.Module, card: ModelCard, card_path: Path) -> None:
    """One blank input of the card's ``input.shape`` through the network (on the CPU, in eval
    mode: deterministic, no random number drawn): it must hold as many values as the network was
    built for, run, and give ``len(card.classes)`` outputs."""
    shape = list(card.input.shape)
    in_shape = getattr(network, "in_shape", None)  # every network records what it was built for
    if in_shape is not None and math.prod(shape) != math.prod(in_shape):
        source = "architecture.in_shape" if "in_shape" in card.architecture else "its default"
        raise ModelStoreError(
            f"{card_path}: input.shape {shape} does not fit the network, "
            f"built for inputs of shape {list(in_shape)} ({source})"
        )
    try:
        with torch.no_grad():  # eval mode, outside mc_sampling: no dropout, no random draw
            out = network(torch.zeros(1, *shape))
    except (RuntimeError, ValueError, TypeError) as exc:
        raise ModelStoreError(
            f"{card_path}: input.shape {shape} does not fit the network "
            f"({first_line(str(exc)) or type(exc).__name__})"
        ) from exc
    if out.dim() != 2 or out.shape[0] != 1:
        raise ModelStoreError(
            f"{card_path}: input.shape {shape} does not fit the network "
            f"(output of shape {list(out.shape)} for one input)"
        )
    if out.shape[1] != len(card.classes):
        raise ModelStoreError(
            f"{card_path}: classes: {len(card.classes)} class names, but the network has "
            f"{out.shape[1]} outputs"
        )
