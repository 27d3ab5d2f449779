"""``bayesgate COMMAND --help`` documents every flag (README): each option of every subcommand has
a help text, and one with a default worth stating shows it (not ``(default: None)``)."""

from __future__ import annotations

import argparse
import re

import pytest

from bayesgate import cli

PARSERS = cli.subcommand_parsers(cli.build_parser())


def _option_help(parser: argparse.ArgumentParser, action: argparse.Action) -> str:
    """The help of one option as ``COMMAND --help`` renders it."""
    return " ".join(parser._get_formatter()._expand_help(action).split())


@pytest.mark.parametrize("command", sorted(PARSERS))
def test_every_option_has_help_and_shows_its_default(command: str) -> None:
    parser = PARSERS[command]
    problems = []
    for action in parser._actions:
        if isinstance(action, argparse._HelpAction):
            continue
        flag = "/".join(action.option_strings) or action.dest
        if not (action.help or "").strip():
            problems.append(f"{flag}: no help text")
            continue
        text = _option_help(parser, action)
        if "(default: None)" in text:
            problems.append(f"{flag}: shows (default: None)")
        if cli.shows_default(action):
            default = action.default
            forms = {str(default)}
            if isinstance(default, list | tuple):
                forms.add(" ".join(str(v) for v in default))
            # as a whole value: "default 100" does not show a default of 10
            if not any(re.search(rf"(?<![\w.]){re.escape(f)}(?![\w.])", text) for f in forms):
                problems.append(f"{flag}: default {default!r} not in {text!r}")
    assert not problems, f"bayesgate {command}: " + "; ".join(problems)


def test_the_help_renders_defaults_readably() -> None:
    text = PARSERS["train"].format_help()
    assert "--epochs EPOCHS" in text and "(default: 10)" in text
    calibrate = " ".join(PARSERS["calibrate"].format_help().split())
    assert "fgs:eta=0.1 fgs:eta=0.2" in calibrate and "['fgs" not in calibrate
    assert "(default: False)" not in text and "(default: None)" not in text
