"""Sum up the engine traces of ``sitecustomize.py`` (``BAYESGATE_ENGINE_TRACE=<prefix>``).

    python bench/engine_process_proto/trace_summary.py <prefix> [--json out.json]

Per trace file (one per server process and side, ``worker`` or ``child``): calls, mean batch,
wall and CPU ms per image of the traced thread, and the share of the traced span it was inside an
engine call. The first ``--skip`` calls (the warm-up traffic) are left out.
"""

from __future__ import annotations

import argparse
import json
import sys
from pathlib import Path


def summarize(path: Path, skip: int) -> dict[str, float | int | str]:
    rows = [tuple(float(v) for v in line.split()) for line in path.read_text().splitlines()]
    rows = rows[skip:]
    images = sum(r[1] for r in rows)
    wall = sum(r[2] for r in rows)
    cpu = sum(r[3] for r in rows)
    span = rows[-1][0] - (rows[0][0] - rows[0][2])
    return {
        "file": path.name,
        "calls": len(rows),
        "mean_batch": images / len(rows),
        "wall_ms_per_image": 1000 * wall / images,
        "cpu_ms_per_image": 1000 * cpu / images,
        "busy": wall / span,
    }


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(description=__doc__)
    p.add_argument("prefix")
    p.add_argument("--skip", type=int, default=100)
    p.add_argument("--json", type=Path, default=None)
    args = p.parse_args(argv)
    prefix = Path(args.prefix)
    out = [
        summarize(f, args.skip)
        for f in sorted(prefix.parent.glob(prefix.name + ".*"))
        if f.suffix in (".worker", ".child")
    ]
    for r in out:
        print(
            f"{r['file']:<40} calls {r['calls']:>5}  batch {r['mean_batch']:5.1f}  "
            f"wall {r['wall_ms_per_image']:.3f} ms/img  CPU {r['cpu_ms_per_image']:.3f} ms/img  "
            f"busy {r['busy']:.2f}"
        )
    if args.json:
        args.json.write_text(json.dumps(out, indent=2))
    return 0


if __name__ == "__main__":
    sys.exit(main())
