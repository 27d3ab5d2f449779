"""Plot the server's CPU per image against images per request, from ``bench/load.py`` JSONs.

Each JSON is one ``bench/load.py --images-per-request N`` run; per run, the batched row of
``--protocol`` gives the server's CPU per image, the part outside the model (server CPU − engine
alone at the same batch) and the event loop's share. Runs with the same N are drawn as points
and joined through their median. Writes ``OUT.png``:

    python bench/images_per_request_plot.py docs/bench/images-per-request-2026-11-27/*.json \\
        --out docs/bench/images-per-request-2026-11-27/cpu_per_image
"""

from __future__ import annotations

import argparse
import json
import statistics
from pathlib import Path
from typing import Any

TARGET_MS = 0.25  # issue 19: server CPU per image outside the model, /v2 binary
SERIES = (  # (row key, label)
    ("cpu_ms_per_request", "server CPU"),
    ("cpu_ms_outside_model", "outside the model"),
    ("cpu_ms_loop", "event loop"),
)


def points(paths: list[Path], protocol: str) -> dict[int, list[dict[str, Any]]]:
    """``{N: [batched row of protocol, …]}`` over the runs (N = the row's images per request)."""
    runs: dict[int, list[dict[str, Any]]] = {}
    for path in paths:
        rows = json.loads(path.read_text())["rows"]
        row = next((r for r in rows if r["mode"] == protocol), None)
        if row is None:
            raise SystemExit(f"{path}: no {protocol!r} row")
        runs.setdefault(int(row.get("images_per_request", 1)), []).append(row)
    return dict(sorted(runs.items()))


def plot(runs: dict[int, list[dict[str, Any]]], out: Path, protocol: str) -> Path:
    from matplotlib.figure import Figure

    fig = Figure(figsize=(6.4, 4.0), layout="constrained")
    ax = fig.add_subplot()
    ns = list(runs)
    for key, label in SERIES:
        medians = [statistics.median(r[key] for r in runs[n]) for n in ns]
        (line,) = ax.plot(ns, medians, marker="o", label=f"{label} (median)")
        for n, rows in runs.items():  # every run, in its series' colour
            ax.scatter([n] * len(rows), [r[key] for r in rows], s=14, alpha=0.5,
                       color=line.get_color())  # fmt: skip
    ax.axhline(TARGET_MS, color="grey", linestyle="--", linewidth=1)
    ax.text(ns[-1], TARGET_MS + 0.02, "target outside the model: 0.25 ms", fontsize=8,
            color="grey", ha="right")  # fmt: skip
    ax.set_xscale("log", base=2)
    ax.set_xticks(ns, [str(n) for n in ns])
    ax.set_xlabel("images per request")
    ax.set_ylabel("CPU ms per image")
    ax.set_title(f"{protocol}: server CPU per image against images per request", fontsize=10)
    ax.grid(alpha=0.3)
    ax.legend(fontsize=8)
    path = out.with_suffix(".png")
    fig.savefig(path, dpi=120)
    return path


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("runs", type=Path, nargs="+", help="bench/load.py JSON outputs")
    parser.add_argument("--out", type=Path, required=True, help="output path without suffix")
    parser.add_argument("--protocol", default="/v2 binary")
    args = parser.parse_args(argv)
    runs = points(args.runs, args.protocol)
    for n, rows in runs.items():
        values = ", ".join(f"{r['cpu_ms_outside_model']:.2f}" for r in rows)
        print(f"N = {n:>3}: outside the model {values} ms per image")
    print(f"wrote {plot(runs, args.out, args.protocol)}")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
