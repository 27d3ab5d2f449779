"""Li & Gal (2017) Figures 4 and 5: test error and test log-likelihood against α, from our runs.

Figure 4 is the 2×100 MLP, Figure 5 the Keras-example CNN; each at α ∈ {0, 0.5, 1} (BB-α with
K = 10 training samples; α = 0 is MC-dropout VI) beside the same network trained by maximum
likelihood and evaluated without dropout (``det``), three seeds each where the CPU allowed. The
models are the long runs of ``bench/long_runs.py`` (best validation LL, stopped after
``PATIENCE`` epochs without improvement), so this script only evaluates and plots:

    python bench/alpha_figures.py evaluate 5 [--partial] # K = 100 test metrics → docs/mnist/figure5
    python bench/alpha_figures.py plot 5                  # figure5.png, figure5.md, figure5.csv

``6`` does the same for the 3×1000 MLP that Figures 6–7 attack (clean test metrics against α;
the paper has no such figure, its text quotes the accuracies).

``evaluate`` runs ``bayesgate evaluate MODEL --k 100 --seed 0`` on every finished run of the
figure (its model directory under ``~/.cache/bayesgate/runs``) and writes ``NAME.json`` with the
run's state (converged, epochs run, best epoch). ``--partial`` also exports and evaluates runs
still going (from a copy of their checkpoint, best-LL weights so far), marked not converged. A
JSON whose weights match the model's is not redone.

Mean ± s.e. over seeds, ``s.e. = s / √n`` with the sample standard deviation ``s`` (n − 1); with
one seed there is no error bar and the table says n = 1.
"""

from __future__ import annotations

import argparse
import csv
import hashlib
import json
import math
import os
import subprocess
import sys
import tempfile
from dataclasses import dataclass
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))
import long_runs  # a sibling script, not a package

ROOT = Path(__file__).resolve().parents[1]
GROUPS = ("0", "0.5", "1", "det")  # the x positions: α values, then the deterministic baseline
PREFIX = {  # 6: not a figure of the paper, the clean test metrics of Figures 6–7's models
    4: ("mlp-2x100-",),
    5: ("cnn-alpha", "cnn-det"),  # not cnn-wide-robust (issue 21)
    6: ("mlp-3x1000-",),
}
TITLE = {
    4: "Figure 4: MLP 2×100 on MNIST",
    5: "Figure 5: CNN on MNIST",
    6: "MLP 3×1000 on MNIST (the models of Figures 6–7)",
}


def figure_runs(figure: int) -> list[long_runs.Run]:
    """The long runs a figure is made of, in ``RUNS`` order."""
    return [run for name, run in long_runs.RUNS.items() if name.startswith(PREFIX[figure])]


def group_of(result: dict) -> str:
    """``det`` for a deterministic net, else its training α as written in ``GROUPS``."""
    if not result["stochastic"]:
        return "det"
    return f"{float(result['training']['alpha']):g}"


@dataclass(frozen=True)
class Summary:
    group: str
    n: int
    error_mean: float  # test error, %
    error_se: float | None  # None with one seed
    ll_mean: float  # test log-likelihood, nats per image
    ll_se: float | None
    converged: int  # how many of the n models stopped by their patience
    epochs: str  # "best/run" per seed


def mean_se(values: list[float]) -> tuple[float, float | None]:
    """Mean and standard error ``s/√n`` (sample s.d., n − 1) by the UCI tables' own
    :func:`~bayesgate.models.uci.experiment.mean_and_se`; ``None`` instead of NaN for one value."""
    from bayesgate.models.uci.experiment import mean_and_se

    mean, se = mean_and_se(values)
    return mean, None if math.isnan(se) else se


def summarise(results: list[dict]) -> list[Summary]:
    """One row per group present, in ``GROUPS`` order."""
    rows = []
    for group in GROUPS:
        mine = sorted(
            (r for r in results if group_of(r) == group), key=lambda r: r["training"]["seed"]
        )
        if not mine:
            continue
        error, error_se = mean_se([100 * (1 - r["accuracy"]) for r in mine])
        ll, ll_se = mean_se([r["log_likelihood"] for r in mine])
        epochs = ", ".join(f"{r['training']['best_epoch']}/{r['training']['epochs_run']}"
                           for r in mine)  # fmt: skip
        converged = sum(bool(r.get("run", {}).get("converged")) for r in mine)
        rows.append(Summary(group, len(mine), error, error_se, ll, ll_se, converged, epochs))
    return rows


def load_results(folder: Path) -> list[dict]:
    return [json.loads(p.read_text()) for p in sorted(folder.glob("*.json"))]


# --- evaluate ---------------------------------------------------------------------------------


def _sha256(path: Path) -> str:
    return hashlib.sha256(path.read_bytes()).hexdigest()


def _evaluate(model: Path, out: Path, run: long_runs.Run, k: int, converged: bool) -> None:
    bayesgate = str(Path(sys.executable).with_name("bayesgate"))
    argv = [bayesgate, "evaluate", str(model), "--k", str(k), "--seed", "0", "--device", "cpu",
            "--no-progress", "--json", str(out)]  # fmt: skip
    subprocess.run(argv, check=True, stdout=subprocess.DEVNULL, env={**os.environ})
    result = json.loads(out.read_text())
    result["run"] = {"name": run.name, "converged": converged, "flags": list(run.flags)}
    out.write_text(json.dumps(result, indent=2) + "\n")


def evaluate(figure: int, folder: Path, *, partial: bool, k: int) -> int:
    """Evaluate each finished (with ``partial``: each started) run of the figure into
    ``folder/NAME.json``; a JSON of the same weights is kept as it is."""
    folder.mkdir(parents=True, exist_ok=True)
    done = 0
    for run in figure_runs(figure):
        out = folder / f"{run.name}.json"
        if long_runs.finished(run):
            model = run.out
            if not (model / "model.safetensors").is_file():
                print(f"{run.name}: finished but no model in {model}", file=sys.stderr)
                continue
            sha = _sha256(model / "model.safetensors")
            if out.is_file() and json.loads(out.read_text()).get("weights_sha256") == sha:
                print(f"{run.name}: already evaluated")
                done += 1
                continue
            _evaluate(model, out, run, k, converged=long_runs.stopped_early(run))
        elif partial and long_runs.progress(run) > 0:
            with tempfile.TemporaryDirectory(prefix=f"{run.name}-") as tmp:
                if long_runs.export(run, Path(tmp) / "model") != 0:
                    return 1
                _evaluate(Path(tmp) / "model", out, run, k, converged=False)
        else:
            continue
        done += 1
        print(f"{run.name}: {out}")
    print(f"{done} of {len(figure_runs(figure))} runs of figure {figure} evaluated in {folder}")
    return 0


# --- plot -------------------------------------------------------------------------------------


def _fmt(mean: float, se: float | None, digits: int) -> str:
    return f"{mean:.{digits}f}" + ("" if se is None else f" ± {se:.{digits}f}")


def table(rows: list[Summary]) -> str:
    lines = [
        "| model | seeds | test error (%) | test LL (nats) | converged | best/run epochs |",
        "|---|---|---|---|---|---|",
    ]
    for r in rows:
        name = "deterministic" if r.group == "det" else f"α = {r.group}"
        lines.append(
            f"| {name} | {r.n} | {_fmt(r.error_mean, r.error_se, 2)} | "
            f"{_fmt(r.ll_mean, r.ll_se, 4)} | {r.converged}/{r.n} | {r.epochs} |"
        )
    return "\n".join(lines) + "\n"


def plot(figure: int, folder: Path) -> int:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    results = load_results(folder)
    if not results:
        print(f"alpha_figures: no evaluations in {folder}; run `evaluate {figure}` first",
              file=sys.stderr)  # fmt: skip
        return 2
    rows = summarise(results)
    fig, axes = plt.subplots(1, 2, figsize=(10, 3.8))
    alphas = [r for r in rows if r.group != "det"]
    det = next((r for r in rows if r.group == "det"), None)
    for ax, key, label in ((axes[0], "error", "test error (%)"), (axes[1], "ll", "test LL")):
        xs = [float(r.group) for r in alphas]
        ys = [getattr(r, f"{key}_mean") for r in alphas]
        errs = [getattr(r, f"{key}_se") or 0.0 for r in alphas]
        ax.errorbar(xs, ys, yerr=errs, marker="o", capsize=4, label="BB-α dropout (K = 10)")
        for r, x, y in zip(alphas, xs, ys, strict=True):
            ax.annotate(f"n={r.n}" + ("" if r.converged == r.n else " *"), (x, y),
                        textcoords="offset points", xytext=(6, 6), fontsize=8)  # fmt: skip
        if det is not None:
            y, se = getattr(det, f"{key}_mean"), getattr(det, f"{key}_se") or 0.0
            ax.axhline(y, color="grey", linestyle="--", label=f"deterministic (n={det.n})")
            if se:
                ax.axhspan(y - se, y + se, color="grey", alpha=0.2)
        ax.set(xlabel="α", ylabel=label, xticks=[0, 0.5, 1])
        ax.grid(alpha=0.3)
    axes[0].legend(fontsize=8)
    fig.suptitle(f"{TITLE[figure]} (K = 100 at test; mean ± s.e. over seeds; * = a model "
                 "not yet converged)", fontsize=9)  # fmt: skip
    fig.tight_layout()
    fig.savefig(folder / f"figure{figure}.png", dpi=110)
    (folder / f"figure{figure}.md").write_text(table(rows))
    with open(folder / f"figure{figure}.csv", "w", newline="") as f:
        writer = csv.writer(f)
        writer.writerow(["model", "alpha_or_det", "seed", "test_error_pct", "test_ll",
                         "converged", "best_epoch", "epochs_run", "weights_sha256"])  # fmt: skip
        for r in sorted(results, key=lambda r: (GROUPS.index(group_of(r)), r["training"]["seed"])):
            writer.writerow([
                r["model"], group_of(r), r["training"]["seed"], round(100 * (1 - r["accuracy"]), 4),
                round(r["log_likelihood"], 6), bool(r.get("run", {}).get("converged")),
                r["training"]["best_epoch"], r["training"]["epochs_run"], r["weights_sha256"],
            ])  # fmt: skip
    print(table(rows), end="")
    print(f"wrote {folder / f'figure{figure}.png'}")
    return 0


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("command", choices=("evaluate", "plot"))
    parser.add_argument("figure", type=int, choices=sorted(PREFIX))
    parser.add_argument("--out", type=Path, help="folder (default docs/mnist/figureN)")
    parser.add_argument("--partial", action="store_true",
                        help="evaluate: runs still going too (best weights so far)")  # fmt: skip
    parser.add_argument("--k", type=int, default=100, help="evaluate: MC samples (default 100)")
    args = parser.parse_args(argv)
    folder = args.out or ROOT / "docs" / "mnist" / f"figure{args.figure}"
    if args.command == "evaluate":
        return evaluate(args.figure, folder, partial=args.partial, k=args.k)
    return plot(args.figure, folder)


if __name__ == "__main__":
    sys.exit(main())
