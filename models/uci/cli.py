"""``bayesgate uci`` (run the UCI regression protocol) and ``bayesgate uci-table`` (compare).

``uci`` writes, into ``--out`` (default ``runs/uci/<dataset>``), after every split:
``results.csv`` (one row per split and α: chosen p and τ, validation and test metrics) and
``summary.json`` (settings, and per α the mean ± standard error over splits beside the paper).
An ``--out`` that already holds results is checked before the work: ``--resume`` keeps their
finished splits, a run of the same settings without it replaces them (saying so on stderr), and
results of other settings (or of another dataset) are refused unless ``--force``
(:func:`_check_previous_run`) — a run of the default settings takes hours.

``uci`` checks its settings (:class:`~bayesgate.models.uci.config.UCIConfig`, torch-free) before
it imports the data and the experiment (torch), so a value it refuses answers at once.
"""

from __future__ import annotations

import argparse
import csv
import json
import math
import sys
from pathlib import Path
from typing import IO, Any

from tqdm.auto import tqdm

from bayesgate.errors import InvalidArgument, check_at_least, writable_dir, writable_file
from bayesgate.models.device import add_threads_flag, set_threads
from bayesgate.models.uci.config import UCIConfig, UCIConfigError
from bayesgate.outputs import note_replacing, write_atomically, write_text_atomically

SUMMARY_FILE = "summary.json"
RESULTS_FILE = "results.csv"


def register(sub: argparse._SubParsersAction) -> None:
    p = sub.add_parser(
        "uci", help="BB-α dropout regression on a UCI benchmark (Li & Gal 2017, Tables 1–2)"
    )
    d = UCIConfig()  # the defaults of the flags that set its fields (FLAGS: where not by name)
    p.add_argument("--dataset", required=True, help="folder name under <data>/uci or an alias")
    p.add_argument(
        "--alpha",
        type=float,
        nargs="+",
        default=list(d.alphas),
        help="α value(s), trained together",
    )
    p.add_argument("--splits", type=int, default=None, help="first N standard splits (default all)")
    p.add_argument(
        "--epochs", type=int, default=d.epochs, help="default: the folder's n_epochs.txt"
    )
    p.add_argument("--k-train", type=int, default=d.k_train, help="MC samples per training example")
    p.add_argument("--k-val", type=int, default=d.k_val, help="MC samples for grid selection")
    p.add_argument("--k-test", type=int, default=d.k_test, help="MC samples at test (Gal: 10000)")
    p.add_argument("--batch-size", type=int, default=d.batch_size, help="minibatch size")
    p.add_argument("--lr", type=float, default=d.lr, help="Adam learning rate")
    p.add_argument("--lengthscale", type=float, default=d.lengthscale, help="prior length-scale l")
    p.add_argument(
        "--dropout-rates", type=float, nargs="+", default=d.dropout_rates, help="override grid"
    )
    p.add_argument(
        "--tau-values", type=float, nargs="+", default=d.tau_values, help="override grid"
    )
    p.add_argument(
        "--learn-tau",
        action="store_true",  # False: UCIConfig's learn_tau (tests/models/test_cli_defaults.py)
        help="learn the noise precision τ with the weights under the BB-α energy (no τ grid)",
    )
    p.add_argument(
        "--tau-init", type=float, default=d.tau_init, help="learned τ's start in standardised units"
    )
    p.add_argument("--tau-lr", type=float, default=d.tau_lr, help="Adam rate of the learned log τ")
    p.add_argument(
        "--hidden", type=int, default=d.hidden, help="default: the folder's n_hidden.txt"
    )
    p.add_argument(
        "--no-refit",
        action="store_true",  # sets refit=False: UCIConfig's refit is True
        help="test the selected grid net (trained on 80%%) instead of retraining on the split",
    )
    p.add_argument("--seed", type=int, default=d.seed, help="seed of the splits' training")
    add_threads_flag(p)
    p.add_argument("--data-dir", type=Path, default=None, help="default $BAYESGATE_DATA_DIR")
    p.add_argument("--out", type=Path, default=None, help="default runs/uci/<dataset>")
    p.add_argument(
        "--resume",
        action="store_true",
        help="keep the splits already in --out (same settings required) and run the rest",
    )
    p.add_argument(
        "--force",
        action="store_true",
        help="replace results in --out made with other settings (refused without it)",
    )
    p.add_argument("--no-progress", action="store_true", help="no progress bars")
    p.set_defaults(
        func=cmd_uci,
        on_interrupt="every finished split is in --out: run the same command with --resume to "
        "go on from there",
    )

    t = sub.add_parser("uci-table", help="markdown table of `bayesgate uci` results vs the paper")
    t.add_argument("dirs", type=Path, nargs="+", help="folders searched for summary.json files")
    t.add_argument("--csv", type=Path, default=None, help="also write the table as CSV")
    t.set_defaults(func=cmd_uci_table)


def cmd_uci(args: argparse.Namespace) -> int:
    config = _uci_config(args)  # its checks import no torch
    check_at_least("--splits", args.splits)  # its upper bound is the dataset's split count
    if args.out is not None:  # before the work: not a failure after a split's training
        writable_dir(args.out, "--out")
    set_threads(args.threads)
    from bayesgate.models.uci.data import load_uci, resolve_name  # torch: after the checks above
    from bayesgate.models.uci.experiment import grid_edge_counts, run_split, summarise

    out = args.out
    if out is None:  # runs/uci/<the dataset's folder>: checked before the data is read, too
        out = Path("runs") / "uci" / resolve_name(args.dataset, args.data_dir).name
        writable_dir(out, "--out")
    ds = load_uci(args.dataset, args.data_dir)
    n = ds.n_splits if args.splits is None else args.splits
    if n > ds.n_splits:
        raise InvalidArgument(f"--splits must be in [1, {ds.n_splits}] for {ds.name}, got {n}")
    out.mkdir(parents=True, exist_ok=True)
    settings = config.resolved(ds)
    previous = _check_previous_run(out, ds.name, settings, resume=args.resume, force=args.force)
    print(
        f"{ds.name}: {ds.x.shape[0]} rows, {ds.x.shape[1]} features, {n} splits, "
        f"{settings['epochs']} epochs, grid {len(settings['dropout_rates'])} p × "
        f"{len(settings['tau_values']) or 'learned'} τ × {len(config.alphas)} α → {out}",
        file=sys.stderr,
    )
    rows = _previous_rows(out) if args.resume and previous == "same" else []
    done = {r["split"] for r in rows}
    bar = tqdm(range(n), desc=ds.name, disable=args.no_progress, file=sys.stderr)
    for split in bar:
        if split in done:
            continue
        rows += run_split(ds, split, config, progress=not args.no_progress)
        _write_results(out / RESULTS_FILE, rows)
        summary = summarise(rows)
        edges = grid_edge_counts(rows, settings)
        document = {
            "dataset": ds.name,
            "settings": settings,
            "summary": summary,
            "grid_edges": edges,
        }
        write_text_atomically(out / SUMMARY_FILE, json.dumps(document, indent=2) + "\n")
        bar.set_postfix(nll=" ".join(f"{s['test_nll']:.2f}" for s in summary))
    tau = "learned" if config.learn_tau else "grid"
    print(format_table([{**e, "epochs": settings["epochs"], "tau": tau} for e in summarise(rows)]))
    print(f"choices at a grid edge: {json.dumps(grid_edge_counts(rows, settings))}")
    return 0


FLAGS = {"alphas": "--alpha"}
"""The flag of a :class:`UCIConfig` field, where it is not ``--`` + the field's name."""


def _flag(field: str) -> str:
    """The flag that sets :class:`UCIConfig` field ``field``."""
    return FLAGS.get(field, "--" + field.replace("_", "-"))


def _uci_config(args: argparse.Namespace) -> UCIConfig:
    """The settings of ``args``; a value out of range, or a flag that cannot apply (a τ grid
    with ``--learn-tau``; a learned τ's start or rate without it, set to other than its
    default: :class:`UCIConfig`'s checks), is refused naming the flags."""
    try:
        return _config_of(args)
    except UCIConfigError as exc:
        raise InvalidArgument(exc.naming(_flag)) from None


def _config_of(args: argparse.Namespace) -> UCIConfig:
    """The settings (checked by :class:`UCIConfig`, naming its fields)."""
    return UCIConfig(
        alphas=tuple(args.alpha),
        k_train=args.k_train,
        k_val=args.k_val,
        k_test=args.k_test,
        epochs=args.epochs,
        batch_size=args.batch_size,
        lr=args.lr,
        lengthscale=args.lengthscale,
        refit=not args.no_refit,
        dropout_rates=tuple(args.dropout_rates) if args.dropout_rates else None,
        tau_values=tuple(args.tau_values) if args.tau_values else None,
        hidden=args.hidden,
        seed=args.seed,
        learn_tau=args.learn_tau,
        tau_init=args.tau_init,
        tau_lr=args.tau_lr,
    )


def _check_previous_run(
    out: Path, dataset: str, settings: dict[str, Any], *, resume: bool, force: bool
) -> str | None:
    """What ``out`` holds, checked before the work: None (no results), ``"same"`` (results of
    ``dataset`` with ``settings``: ``--resume`` keeps their splits, else they are replaced, said
    on stderr) or ``"other"`` (other settings, another dataset, or settings that do not read:
    refused in one line naming them unless ``force``, which replaces them)."""
    files = [out / RESULTS_FILE, out / SUMMARY_FILE]
    if not any(f.is_file() for f in files):
        return None
    differing = _differing_settings(out, dataset, settings)
    if differing is None:
        if not resume:
            note_replacing("uci", files)
        return "same"
    if not force:
        prefix = "--resume: " if resume else ""
        raise InvalidArgument(
            f"{prefix}--out {out} holds results made with other settings ({differing}): "
            "choose another --out, or --force to replace them"
        )
    note_replacing("uci", files)
    return "other"


def _differing_settings(out: Path, dataset: str, settings: dict[str, Any]) -> str | None:
    """How the run in ``out`` differs from ``dataset`` with ``settings`` (``epochs: 5 → 3``);
    None when it does not. A setting its file does not name is one an older version did not
    have: ``learn_tau`` was then False; the learned τ's start and rate count only with it."""
    try:
        document = json.loads((out / SUMMARY_FILE).read_text())
        previous = dict(document["settings"])
        previous["dataset"] = document["dataset"]
    except FileNotFoundError:
        return f"unknown: no {SUMMARY_FILE}"
    except (OSError, ValueError, KeyError, TypeError) as exc:
        return f"unknown: {SUMMARY_FILE} does not read: {type(exc).__name__}: {exc}"
    ours = {"dataset": dataset, **settings}
    previous.setdefault("learn_tau", False)
    if not previous["learn_tau"] and not ours["learn_tau"]:
        for key in ("tau_init", "tau_lr"):
            previous.pop(key, None)
            ours.pop(key, None)
    differing = [k for k in ours if previous.get(k) != ours[k]]
    if not differing:
        return None
    return ", ".join(f"{k}: {previous.get(k)!r} → {ours[k]!r}" for k in differing)


def _previous_rows(out: Path) -> list[dict[str, Any]]:
    """Rows of the earlier run in ``out`` (of our settings: :func:`_check_previous_run`)."""
    if not (out / RESULTS_FILE).is_file():
        return []
    with open(out / RESULTS_FILE, newline="") as f:
        return [{k: _number(v) for k, v in row.items()} for row in csv.DictReader(f)]


def _number(text: str) -> int | float | str:
    for kind in (int, float):
        try:
            return kind(text)
        except ValueError:
            pass
    return text


def cmd_uci_table(args: argparse.Namespace) -> int:
    from bayesgate.models.uci.experiment import compare_with_paper

    if args.csv is not None:
        writable_file(args.csv, "--csv")
    entries = []
    for folder in args.dirs:
        if not folder.exists():
            raise InvalidArgument(f"{folder} does not exist")
        files = [folder] if folder.is_file() else sorted(folder.rglob(SUMMARY_FILE))
        for path in files:
            document = json.loads(path.read_text())
            settings = document["settings"]
            for entry in document["summary"]:  # compared afresh: the rule may have changed
                entries.append(
                    {
                        **compare_with_paper(entry),
                        "epochs": epochs_text(settings),
                        "tau": "learned" if settings.get("learn_tau") else "grid",
                    }
                )
    if not entries:
        raise InvalidArgument(f"no {SUMMARY_FILE} found under {', '.join(map(str, args.dirs))}")
    print(format_table(entries))
    if args.csv:
        _write_results(args.csv, entries)
    return 0


def epochs_text(settings: dict[str, Any]) -> str:
    """The epochs of a run, with its optimiser when that is not the default one
    (``400 (lr 0.001, batch 32)``), so two runs of the same length stay apart in the table."""
    default = UCIConfig()
    lr, batch = settings.get("lr", default.lr), settings.get("batch_size", default.batch_size)
    if (lr, batch) == (default.lr, default.batch_size):
        return str(settings["epochs"])
    return f"{settings['epochs']} (lr {lr:g}, batch {batch})"


def format_table(entries: list[dict[str, Any]]) -> str:
    """Markdown: ours (mean ± SE) beside the paper (mean ± SE) for NLL and RMSE; ✓ = within
    two combined standard errors, "better" = lower than the paper's by more, ✗ = higher by more
    (lower is better for both metrics)."""
    lines = [
        "| dataset | α | τ | splits | epochs | NLL ours | NLL paper | | RMSE ours | RMSE paper | |",
        "|---|---|---|---|---|---|---|---|---|---|---|",
    ]
    for e in entries:
        digits = 2 if e["test_rmse"] >= 0.1 else 3 if e["test_rmse"] >= 0.01 else 4
        lines.append(
            f"| {e['dataset']} | {e['alpha']:g} | {e.get('tau', 'grid')} | {e['splits']} "
            f"| {e.get('epochs', '')} "
            f"| {_ours(e['test_nll'], e['test_nll_se'], 2)} "
            f"| {_fmt(e.get('paper_nll'), e.get('paper_nll_se'))} "
            f"| {_mark(e, 'nll')} "
            f"| {_ours(e['test_rmse'], e['test_rmse_se'], digits)} "
            f"| {_fmt(e.get('paper_rmse'), e.get('paper_rmse_se'))} "
            f"| {_mark(e, 'rmse')} |"
        )
    return "\n".join(lines)


def _mark(entry: dict[str, Any], metric: str) -> str:
    """✓ within two combined SE of the paper, "better" below that band, ✗ above, ? unknown."""
    within = entry.get(f"{metric}_within_2se")
    if within is None:
        return "?"
    if within:
        return "✓"
    return "better" if entry[f"test_{metric}"] < entry[f"paper_{metric}"] else "✗"


def _ours(value: float, se: float, digits: int) -> str:
    """``mean ± SE``; the SE of one split is not defined (NaN): ``mean ± –``."""
    spread = f"{se:.{digits}f}" if math.isfinite(se) else "–"
    return f"{value:.{digits}f} ± {spread}"


def _fmt(value: float | None, se: float | None = None) -> str:
    if value is None:
        return "–"
    return f"{value:.2f}" if se is None else f"{value:.2f} ± {se:.2f}"


def _write_results(path: Path, rows: list[dict[str, Any]]) -> None:
    fields = list(dict.fromkeys(key for row in rows for key in row))

    def write(f: IO[str]) -> None:
        writer = csv.DictWriter(f, fieldnames=fields)
        writer.writeheader()
        writer.writerows(rows)

    write_atomically(path, write)
