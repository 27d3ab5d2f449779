"""The defaults of ``train``'s and ``uci``'s flags are those of the settings they set
(:class:`TrainConfig`, :class:`AdversarialConfig`, :class:`UCIConfig`): the parsers read them from
the dataclasses, and these tests fail when a flag's default is written out again and drifts.
A flag whose default deliberately differs (None: "decided later") is listed here, with why."""

from __future__ import annotations

import argparse
from dataclasses import asdict
from typing import Any

from bayesgate import cli
from bayesgate.models import adversarial_cli
from bayesgate.models import cli as train_cli
from bayesgate.models.training.adversarial_config import AdversarialConfig
from bayesgate.models.training.config import TrainConfig
from bayesgate.models.uci import cli as uci_cli
from bayesgate.models.uci.config import UCIConfig

PARSERS = cli.subcommand_parsers(cli.build_parser())


def _flag_defaults(parser: argparse.ArgumentParser) -> dict[str, Any]:
    """``{dest: default}`` of the parser's options (lists as tuples, as the configs hold them)."""
    return {
        action.dest: tuple(action.default) if isinstance(action.default, list) else action.default
        for action in parser._actions
        if action.option_strings
    }


def _differing(
    flags: dict[str, Any], config: dict[str, Any], unflagged: tuple[str, ...] = ()
) -> dict[str, tuple[Any, Any]]:
    """``{field: (flag default, field default)}`` of the fields whose flag defaults otherwise;
    every field but ``unflagged`` has its flag (a field added without one fails here)."""
    assert set(config) - set(flags) == set(unflagged), "fields without a flag"
    return {
        name: (flags[name], value)
        for name, value in config.items()
        if name not in unflagged and flags[name] != value
    }


def test_train_flags_default_to_train_config() -> None:
    flags = _flag_defaults(PARSERS["train"])
    config = asdict(TrainConfig())
    # --alpha None: by --loss, TrainConfig's α (bbalpha) or 0 (elbo), in _resolve_alpha
    assert _differing(flags, config) == {"alpha": (None, config["alpha"])}


def test_uci_flags_default_to_uci_config() -> None:
    flags = _flag_defaults(PARSERS["uci"])
    # the fields not set by the flag of their name: --alpha sets alphas, --no-refit clears refit
    flags.update(
        {field: flags.pop(flag.removeprefix("--")) for field, flag in uci_cli.FLAGS.items()}
    )
    flags["refit"] = not flags.pop("no_refit")
    # val_fraction: no flag (the protocol's 80/20 split of every training set)
    assert _differing(flags, asdict(UCIConfig()), unflagged=("val_fraction",)) == {}


def test_adversarial_flags_default_to_adversarial_config() -> None:
    """Their parser defaults are None (given without ``--adversarial`` they are refused);
    :data:`~bayesgate.models.adversarial_cli.ADVERSARIAL_DEFAULTS`, what they become with it, are
    the config's."""
    flags = _flag_defaults(PARSERS["train"])
    assert all(flags[key] is None for key in adversarial_cli.FIELDS)
    config = asdict(AdversarialConfig())
    expected = {key: config[field] for key, field in adversarial_cli.FIELDS.items()}
    assert expected == adversarial_cli.ADVERSARIAL_DEFAULTS


def test_no_flags_give_the_configs_defaults() -> None:
    """What the commands build from their flags' defaults, values resolved later included."""
    args = cli.build_parser("train").parse_args(["train", "--adversarial", "pgd"])
    config = train_cli._train_config(args)
    assert config == TrainConfig()
    adversarial_cli.check_arguments(args)
    adversarial = adversarial_cli.adversarial_config(args, config.alpha)
    assert adversarial == AdversarialConfig(method="pgd", alpha=config.alpha)
    uci_args = cli.build_parser("uci").parse_args(["uci", "--dataset", "boston"])
    assert uci_cli._uci_config(uci_args) == UCIConfig()
