"""``bayesgate`` — one command with a subcommand per job.

Each package contributes its subcommands through a ``register(subparsers)`` function. Errors the
user can fix — :class:`bayesgate.errors.UserError` and its subclasses (bad flags and values,
missing data, a broken model directory) — are printed as one line ``bayesgate: error: …`` with
exit code 2; ``bayesgate --debug …`` shows their traceback too. Any other exception is a bug and
keeps its traceback.
"""

from __future__ import annotations

import argparse
import importlib
import sys
from collections.abc import Sequence

from bayesgate.errors import UserError

# Modules providing subcommands, in the order they appear in --help. Optional ones (whose
# dependencies may be missing in a slim install) are skipped with a note if they fail to import.
COMMAND_MODULES = (
    "bayesgate.models.cli",
    "bayesgate.models.data.cli",
    "bayesgate.attacks.cli",
    "bayesgate.attacks.robust_cli",
    "bayesgate.service.cli",
    "bayesgate.models.uci.cli",
)


def build_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(
        prog="bayesgate",
        description="Train Bayesian dropout nets, calibrate adversarial-input thresholds, serve.",
    )
    parser.add_argument(
        "--debug", action="store_true", help="show the traceback of user errors too"
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


def main(argv: Sequence[str] | None = None) -> int:
    parser = build_parser()
    args = parser.parse_args(argv)
    if not getattr(args, "func", None):
        parser.print_help()
        return 2
    try:
        result = args.func(args)
    except UserError as exc:
        if args.debug:
            raise
        print(f"bayesgate: error: {exc}", file=sys.stderr)
        return 2
    except KeyboardInterrupt:
        print("bayesgate: interrupted", file=sys.stderr)
        return 130
    return int(result or 0)


if __name__ == "__main__":
    sys.exit(main())
