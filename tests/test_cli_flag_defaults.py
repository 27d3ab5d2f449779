"""The defaults that ``bayesgate predict``, ``serve`` and ``fit-detector`` (and the ``--device`` of
``train``, ``evaluate``, ``attack``, ``calibrate``, ``sweep`` and ``evaluate-robust``) state in
``--help`` are the ones that run: each flag's default equals the default of what the command
calls — the settings dataclass, the pydantic settings, the function's keyword — read here from
that side, not from the shared constant, so a change of either side alone fails."""

from __future__ import annotations

import argparse
import dataclasses
import inspect
from collections.abc import Callable
from typing import Any

import pytest

from bayesgate import cli
from bayesgate.attacks.fit_settings import FitSettings
from bayesgate.models.device import DEVICE_CHOICES, pick_device
from bayesgate.service.gate import Gate
from bayesgate.service.settings import Settings

PARSERS = cli.subcommand_parsers(cli.build_parser())


def _keyword_default(function: Callable[..., Any], name: str) -> Any:
    return inspect.signature(function).parameters[name].default


def _setting_default(field: str) -> Any:
    return Settings.model_fields[field].default


def _action(command: str, dest: str) -> argparse.Action:
    (action,) = [a for a in PARSERS[command]._actions if a.dest == dest]
    return action


def _parser_default(command: str, dest: str) -> Any:
    return _action(command, dest).default


FIT_FIELDS = [f.name for f in dataclasses.fields(FitSettings)]


@pytest.mark.parametrize("field", FIT_FIELDS)
def test_fit_detector_flags_default_to_fit_settings(field: str) -> None:
    """Every :class:`FitSettings` field is a flag of ``fit-detector`` with the field's default
    (``cmd_fit_detector`` passes each flag's value to the settings)."""
    declared = getattr(FitSettings(), field)
    if isinstance(declared, tuple):
        declared = list(declared)  # nargs="+" flags hold lists
    assert _parser_default("fit-detector", field) == declared


# every command below passes its --device to pick_device (attack, calibrate and sweep share
# attacks/cli.py's flags; train and evaluate, models/cli.py's; detect-eval and adaptive-eval,
# evaluate_cli.py's)
PICK_DEVICE_COMMANDS = (
    "fit-detector",
    "train",
    "evaluate",
    "attack",
    "calibrate",
    "sweep",
    "evaluate-robust",
    "detect-eval",
    "adaptive-eval",
)
DECLARED: list[tuple[str, str, Callable[[], Any]]] = [
    *[
        (command, "device", lambda: _keyword_default(pick_device, "preference"))
        for command in PICK_DEVICE_COMMANDS
    ],
    ("predict", "device", lambda: _keyword_default(pick_device, "preference")),
    ("predict", "device", lambda: _keyword_default(Gate.load, "device")),
    ("predict", "batch_size", lambda: _keyword_default(Gate.chunks, "batch_size")),
    ("predict", "batch_size", lambda: _keyword_default(Gate.predict, "batch_size")),
    # gate.py: a chunk of predict is one request of the service at its default limit
    ("predict", "batch_size", lambda: _setting_default("max_instances")),
]


@pytest.mark.parametrize(
    ("command", "dest", "declared"),
    DECLARED,
    ids=[f"{c}-{d}-{i}" for i, (c, d, _) in enumerate(DECLARED)],
)
def test_flag_default_is_the_declared_one(
    command: str, dest: str, declared: Callable[[], Any]
) -> None:
    assert _parser_default(command, dest) == declared()


@pytest.mark.parametrize("command", [*PICK_DEVICE_COMMANDS, "predict"])
def test_device_help_lists_the_choices(command: str) -> None:
    """``--device`` lists the values :func:`pick_device` takes (besides ``cuda:N``)."""
    help_text = _action(command, "device").help or ""
    assert f"one of {', '.join(DEVICE_CHOICES)}" in help_text


SERVE_HELP = {  # serve's flags default to None (the environment, then Settings): --help names both
    "host": "default {prefix}HOST or {value}",
    "port": "default {prefix}PORT or {value}",
    "workers": "default {prefix}WORKERS or {value}",
    "model_dir": "default {prefix}MODEL_DIR or {value.name}",
    "device": "(default {value})",
}


@pytest.mark.parametrize("field", sorted(SERVE_HELP))
def test_serve_help_states_the_settings_defaults(field: str) -> None:
    action = _action("serve", field)
    assert action.default is None  # the setting decides: BAYESGATE_<FIELD>, else its default
    prefix = Settings.model_config["env_prefix"]
    expected = SERVE_HELP[field].format(prefix=prefix, value=_setting_default(field))
    assert expected in " ".join((action.help or "").split())


def test_serve_names_the_settings_prefix() -> None:
    assert f"{Settings.model_config['env_prefix']}* environment" in PARSERS["serve"].description
