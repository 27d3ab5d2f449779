"""Merge the ``robust.json`` of several ``bayesgate evaluate-robust`` runs into one table and plot.

    python bench/robust_merge.py RUN1/robust.json RUN2/robust.json --out DIR

For models evaluated by separate commands (other ``--adaptive-*`` flags per model, or runs in
parallel): their rows go into one ``robust.json``/``robust.md``/``robust.png`` in ``DIR``, written
by the command's own :func:`bayesgate.attacks.robust_report.write_outputs`. The robust-accuracy
settings must be the same in every input (ε, n, attacks, steps, restarts, K, seed); the settings
of the first input are kept, and each model keeps its own adaptive-step settings in its row.
"""

from __future__ import annotations

import argparse
import json
import sys
from pathlib import Path

from bayesgate.attacks.robust_report import write_outputs

SAME = ("eps", "n", "attacks", "pgd_steps", "restarts", "apgd_steps", "k_attack", "k_eval", "seed")


def merge(results: list[dict]) -> dict:
    """One result with every input's models; refuses inputs whose robust settings differ."""
    first = results[0]["settings"]
    for other in results[1:]:
        diff = [k for k in SAME if other["settings"].get(k) != first.get(k)]
        if diff:
            raise ValueError(f"the runs differ in {', '.join(diff)}: not one table")
    return {"settings": first, "models": [m for r in results for m in r["models"]]}


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("inputs", type=Path, nargs="+")
    p.add_argument("--out", type=Path, required=True)
    args = p.parse_args(argv)
    try:
        merged = merge([json.loads(path.read_text()) for path in args.inputs])
    except ValueError as exc:
        print(f"robust_merge: {exc}", file=sys.stderr)
        return 2
    for kind, path in write_outputs(merged, args.out).items():
        print(f"{kind}: {path}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
