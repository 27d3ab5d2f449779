"""``bayesgate`` — one command with a subcommand per job.

Each package contributes its subcommands through a ``register(subparsers)`` function. Errors the
user can fix — :class:`bayesgate.errors.UserError` and its subclasses (bad flags and values,
missing data, a broken model directory) — are printed as one line ``bayesgate: error: …`` with
exit code 2; ``bayesgate --debug …`` shows their traceback too. Any other exception is a bug and
keeps its traceback.

A command whose work needs an optional module (an extra of ``pyproject.toml``) declares it with
``set_defaults(needs=FUNCTION)`` (:mod:`bayesgate.extras`); a missing one is such a one-line
error before the command starts. Every subcommand's ``--help`` shows each flag's default.

``bayesgate COMMAND …`` imports only the module of COMMAND (:data:`COMMANDS`); the other
commands are listed by name and help line alone. No command module imports torch to build its
parser: the choices, defaults and settings they check come from torch-free modules, and the
commands import torch when they run, after the flags and settings they can check without it. So
``bayesgate --help``, ``bayesgate COMMAND --help`` and a refused flag or setting answer in a
fraction of a second instead of after torch's ~3 s import (``tests/test_cli_imports.py`` checks
every command's ``--help`` in a fresh interpreter). :func:`build_parser` without a
command builds every parser (the tests, and the docs' command check, read them all);
``tests/test_cli_imports.py`` checks that :data:`COMMANDS` names each command, its module and
its help line exactly as the modules register them.
"""

from __future__ import annotations

import argparse
import copy
import importlib
import sys
import typing
from collections.abc import Sequence
from typing import Any

from bayesgate.errors import UserError
from bayesgate.extras import check_needs

# Each command: the module that registers it and its help line (as that module registers it:
# a test compares the two), so that a command's parser needs only its own module imported.
COMMANDS: dict[str, tuple[str, str]] = {
    "train": (
        "bayesgate.models.cli",
        "train a dropout or Bayes-by-Backprop network on MNIST (BB-α or ELBO)",
    ),
    "evaluate": (
        "bayesgate.models.cli",
        "test-set accuracy, log-likelihood, NLL, Brier, ECE of a model",
    ),
    "fetch-data": (
        "bayesgate.models.data.cli",
        "download the four MNIST files into the data directory (checksummed)",
    ),
    "attack": ("bayesgate.attacks.cli", "craft adversarial MNIST images against a model (.npz)"),
    "calibrate": (
        "bayesgate.attacks.cli",
        "set rejection thresholds on validation images, measure detection on attacks",
    ),
    "fit-detector": (
        "bayesgate.attacks.cli",
        "fit the feature-density + uncertainty detector (fused) and store it by the model",
    ),
    "sweep": ("bayesgate.attacks.cli", "reproduce the paper's Figures 6-7 and the detection table"),
    "detect-eval": (
        "bayesgate.attacks.cli",
        "every detector score (and the fused one) vs seen/unseen attacks and OOD inputs",
    ),
    "adaptive-eval": (
        "bayesgate.attacks.cli",
        "adaptive white-box PGD against the fused detector (and plain PGD)",
    ),
    "evaluate-robust": (
        "bayesgate.attacks.robust_cli",
        "robust accuracy under PGD × restarts, APGD-CE and APGD-DLR (worst of) per ε",
    ),
    "serve": (
        "bayesgate.service.cli",
        "serve predictions with uncertainty and the adversarial flag over HTTP",
    ),
    "build-native": (
        "bayesgate.service.cli",
        "build the native front end's library (Rust, cargo) for serve --native-port",
    ),
    "predict": (
        "bayesgate.service.predict_cli",
        "score image files (PNG, .npy, .npz) offline: the service's answers and flag",
    ),
    "uci": (
        "bayesgate.models.uci.cli",
        "BB-α dropout regression on a UCI benchmark (Li & Gal 2017, Tables 1–2)",
    ),
    "uci-table": (
        "bayesgate.models.uci.cli",
        "markdown table of `bayesgate uci` results vs the paper",
    ),
}
# The modules, in the order their commands appear in --help. Optional ones (whose dependencies
# may be missing in a slim install) list their commands as unavailable if they fail to import.
COMMAND_MODULES = tuple(dict.fromkeys(module for module, _ in COMMANDS.values()))


def shows_default(action: argparse.Action) -> bool:
    """Whether ``--help`` should state the action's default: an option with a value whose default
    means something (not None, not an empty list, not a store_true/false flag's False/True)."""
    default = action.default
    if not action.option_strings or action.nargs == 0 or default is argparse.SUPPRESS:
        return False
    return default is not None and not (isinstance(default, list | tuple) and not default)


class DefaultsHelpFormatter(argparse.HelpFormatter):
    """Appends `` (default: X)`` to an option's help unless the text already states its default
    (``%(default)s`` or the word "default") or it has none worth stating; list defaults are
    shown as the words one would type (``fgs:eta=0.1 pgd``), not as a Python list."""

    def _get_help_string(self, action: argparse.Action) -> str:
        text = action.help or ""
        if "%(default)" in text or "default" in text.lower() or not shows_default(action):
            return text
        return f"{text} (default: %(default)s)"

    def _expand_help(self, action: argparse.Action) -> str:
        if isinstance(action.default, list | tuple) and action.default:
            action = copy.copy(action)
            action.default = " ".join(str(v) for v in action.default)
        return super()._expand_help(action)


class OneLineErrorParser(argparse.ArgumentParser):
    """An argument parser whose own errors (an unknown flag, ``--k abc``, a missing argument) are
    one line, as every other user error of the command line is: ``bayesgate train: error: …``
    and where to read the usage, instead of argparse's whole usage block before the error line
    (twenty lines for ``train``). Exit code 2, as argparse's."""

    def error(self, message: str) -> typing.NoReturn:
        self.exit(2, f"{self.prog}: error: {message} (see: {self.prog} --help)\n")


def subcommand_parsers(parser: argparse.ArgumentParser) -> dict[str, Any]:
    """``{name: parser}`` of the subcommands."""
    for action in parser._actions:
        if isinstance(action, argparse._SubParsersAction):
            return dict(action.choices)
    return {}


def _version() -> str:
    """The installed distribution's version (``unknown`` when run from a tree not installed)."""
    from importlib.metadata import PackageNotFoundError, version

    try:
        return version("bayesgate")
    except PackageNotFoundError:
        return "unknown"


def build_parser(command: str | None = None) -> argparse.ArgumentParser:
    """The ``bayesgate`` parser with every command's parser (``command`` None), or with only the
    parsers of ``command``'s module (:data:`COMMANDS`), the other commands listed by name and
    help line without importing their modules (``""``, which names no command: none imported —
    ``bayesgate --help``)."""
    parser = OneLineErrorParser(  # its subcommands' parsers are of its class too
        prog="bayesgate",
        description="Train Bayesian dropout nets, calibrate adversarial-input thresholds, serve.",
    )
    parser.add_argument(
        "--debug", action="store_true", help="show the traceback of user errors too"
    )
    parser.add_argument("--version", action="version", version=f"%(prog)s {_version()}")
    sub = parser.add_subparsers(dest="command", metavar="COMMAND")
    chosen = COMMANDS[command][0] if command in COMMANDS else None
    for name in COMMAND_MODULES:
        if command is not None and name != chosen:
            for listed, (module, help_line) in COMMANDS.items():
                if module == name:
                    sub.add_parser(listed, help=help_line)
            continue
        try:
            module = importlib.import_module(name)
        except ModuleNotFoundError as exc:
            if not exc.name or exc.name.split(".")[0] == "bayesgate":
                raise  # our own code is broken: fail loudly, never hide a subcommand
            note = f"unavailable: missing dependency {exc.name!r}"
            for listed, (module, _) in COMMANDS.items():
                if module == name:  # listed, and running it says why it cannot run
                    unavailable = sub.add_parser(listed, help=note)
                    unavailable.set_defaults(unavailable=f"{listed}: {note}")
            continue
        module.register(sub)
    for subparser in subcommand_parsers(parser).values():
        subparser.formatter_class = DefaultsHelpFormatter
    return parser


def command_in(argv: Sequence[str]) -> str | None:
    """The command ``argv`` names: its first word that is not an option (``bayesgate``'s own
    options take no value), when it is one of :data:`COMMANDS`."""
    word = next((a for a in argv if not a.startswith("-")), None)
    return word if word in COMMANDS else None


def main(argv: Sequence[str] | None = None) -> int:
    argv = sys.argv[1:] if argv is None else list(argv)
    parser = build_parser(command_in(argv) or "")  # "": no command module imported
    args, unknown = parser.parse_known_args(argv)
    if (unavailable := getattr(args, "unavailable", None)) is not None:  # whatever its arguments
        print(f"bayesgate: error: {unavailable}", file=sys.stderr)
        return 2
    if unknown:  # named by the subcommand's parser: "bayesgate train: error: …train --help"
        command = subcommand_parsers(parser).get(getattr(args, "command", None) or "", parser)
        command.error(f"unrecognized arguments: {' '.join(unknown)}")
    if not getattr(args, "func", None):
        parser.print_help()
        return 2
    needs = vars(args).pop("needs", None)  # what the command imports from the extras
    # what to say on Ctrl-C; popped, so that commands recording their arguments never see it
    hint = vars(args).pop("on_interrupt", None)
    try:
        if needs is not None:
            check_needs(args.command, needs(args))
        result = args.func(args)
    except UserError as exc:
        if args.debug:
            raise
        print(f"bayesgate: error: {exc}", file=sys.stderr)
        return 2
    except KeyboardInterrupt:
        print(f"bayesgate: interrupted{f'; {hint}' if hint else ''}", file=sys.stderr)
        return 130
    return int(result or 0)


if __name__ == "__main__":
    sys.exit(main())
