"""Merge the ``robust.json`` of several ``bayesgate evaluate-robust`` runs into one table and plot.

    python bench/robust_merge.py RUN1/robust.json RUN2/robust.json --out DIR

For models evaluated by separate commands (other ``--adaptive-*`` flags per model, or runs in
parallel): their rows go into one ``robust.json``/``robust.md``/``robust.png`` in ``DIR``, written
by the command's own :func:`bayesgate.attacks.robust_report.write_outputs`. The robust-accuracy
settings must be the same in every input (ε, n, attacks, steps, restarts, K, seed); the settings
of the first input are kept, and each model keeps its own adaptive-step settings in its row.

Each model must be in one input only: a model of the same name, or of the same weights (the rows'
``weights_sha256``, where both record one), in two inputs is refused with exit code 2 (the table
would show it twice, with two results), naming the model and both files. The one exception is the
very same row twice (equal JSON, key order aside: e.g. one run's file given twice, or a merged
file given with one of its inputs): it is the same result, kept once, where it first appears.
"""

from __future__ import annotations

import argparse
import json
import sys
from collections.abc import Sequence
from pathlib import Path

from bayesgate.attacks.robust_report import write_outputs

SAME = ("eps", "n", "attacks", "pgd_steps", "restarts", "apgd_steps", "k_attack", "k_eval", "seed")


def merge(results: list[dict], sources: Sequence[str] | None = None) -> dict:
    """One result with every input's models; refuses inputs whose robust settings differ, and a
    model in two inputs with different rows (same name or same weights). ``sources`` names the
    inputs in the errors (default ``input 1``, ``input 2``, …)."""
    if sources is None:
        sources = [f"input {i + 1}" for i in range(len(results))]
    first = results[0]["settings"]
    for other in results[1:]:
        diff = [k for k in SAME if other["settings"].get(k) != first.get(k)]
        if diff:
            raise ValueError(f"the runs differ in {', '.join(diff)}: not one table")
    kept: list[tuple[dict, str]] = []  # each model's row and the input it came from
    for result, source in zip(results, sources, strict=True):
        for model in result["models"]:
            twin = next(((row, where) for row, where in kept if _same_model(row, model)), None)
            if twin is None:
                kept.append((model, source))
            elif _canonical(twin[0]) != _canonical(model):
                raise ValueError(_twice(model, source, *twin))
            # else: the very same row again (the same run's file twice): kept once
    return {"settings": first, "models": [row for row, _ in kept]}


def _same_model(a: dict, b: dict) -> bool:
    """Same name, or same weights where both rows record their sha256."""
    sha_a, sha_b = a.get("weights_sha256"), b.get("weights_sha256")
    return a.get("name") == b.get("name") or (sha_a is not None and sha_a == sha_b)


def _canonical(row: dict) -> str:
    return json.dumps(row, sort_keys=True)


def _twice(model: dict, source: str, earlier: dict, earlier_source: str) -> str:
    """The one-line error of a model in two inputs with different rows."""
    name, other = model.get("name"), earlier.get("name")
    if name == other:
        return (
            f"model {name!r} is in both {earlier_source} and {source}, with different rows: "
            "not one table"
        )
    sha = str(model.get("weights_sha256"))[:16]
    return (
        f"models {other!r} ({earlier_source}) and {name!r} ({source}) have the same weights "
        f"(sha256 {sha}…): not one table"
    )


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("inputs", type=Path, nargs="+")
    p.add_argument("--out", type=Path, required=True)
    args = p.parse_args(argv)
    try:
        results = [json.loads(path.read_text()) for path in args.inputs]
        merged = merge(results, [str(path) for path in args.inputs])
    except ValueError as exc:
        print(f"robust_merge: {exc}", file=sys.stderr)
        return 2
    for kind, path in write_outputs(merged, args.out).items():
        print(f"{kind}: {path}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
