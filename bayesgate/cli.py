"""``bayesgate`` — one command with a subcommand per job.

Each package contributes its subcommands through a ``register(subparsers)`` function; errors the
user can fix (bad flags, missing data, a broken model directory) are printed as one line
``bayesgate: error: …`` with exit code 2 instead of a traceback.
"""

from __future__ import annotations

import argparse
import importlib
import sys
from collections.abc import Sequence

# Modules providing subcommands, in the order they appear in --help. Optional ones (whose
# dependencies may be missing in a slim install) are skipped with a note if they fail to import.
COMMAND_MODULES = (
    "bayesgate.models.cli",
    "bayesgate.attacks.cli",
    "bayesgate.attacks.robust_cli",
    "bayesgate.service.cli",
    "bayesgate.models.uci.cli",
)


class UserError(Exception):
    """An error caused by the user's input, printed without a traceback."""


def build_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(
        prog="bayesgate",
        description="Train Bayesian dropout nets, calibrate adversarial-input thresholds, serve.",
    )
    sub = parser.add_subparsers(dest="command", metavar="COMMAND")
    for name in COMMAND_MODULES:
        try:
            module = importlib.import_module(name)
        except ModuleNotFoundError as exc:
            if not exc.name or exc.name.split(".")[0] == "bayesgate":
                raise  # our own code is broken: fail loudly, never hide a subcommand
            sub.add_parser(
                name.split(".")[-2], help=f"unavailable: missing dependency {exc.name!r}"
            )
            continue
        module.register(sub)
    return parser


def user_errors() -> tuple[type[BaseException], ...]:
    """Exception types that mean 'the input is wrong', gathered from the packages."""
    from bayesgate.models.data.mnist import DataError
    from bayesgate.models.store.directory import ModelStoreError

    return (UserError, DataError, ModelStoreError, ValueError, FileNotFoundError)


def main(argv: Sequence[str] | None = None) -> int:
    parser = build_parser()
    args = parser.parse_args(argv)
    if not getattr(args, "func", None):
        parser.print_help()
        return 2
    try:
        result = args.func(args)
    except user_errors() as exc:
        print(f"bayesgate: error: {exc}", file=sys.stderr)
        return 2
    except KeyboardInterrupt:
        print("bayesgate: interrupted", file=sys.stderr)
        return 130
    return int(result or 0)


if __name__ == "__main__":
    sys.exit(main())
