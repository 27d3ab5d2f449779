"""``bayesgate attack``, ``bayesgate calibrate`` and ``bayesgate sweep``."""

from __future__ import annotations

import argparse
import json
import time
from pathlib import Path
from typing import Any

from bayesgate.models.device import DEVICE_CHOICES, pick_device

FIGURES = ("6", "7", "detection")


def register(sub: argparse._SubParsersAction) -> None:
    _register_attack(sub)
    _register_calibrate(sub)
    _register_sweep(sub)


def _common(p: argparse.ArgumentParser) -> None:
    p.add_argument("--seed", type=int, default=0, help="seed of dropout masks and random starts")
    p.add_argument("--batch-size", type=int, default=100, help="images per attack batch")
    p.add_argument("--device", default="auto", help=f"one of {', '.join(DEVICE_CHOICES)}")
    p.add_argument("--no-progress", action="store_true", help="no progress bars")


def _register_attack(sub: argparse._SubParsersAction) -> None:
    p = sub.add_parser("attack", help="craft adversarial MNIST images against a model (.npz)")
    p.add_argument("model", type=Path, help="model directory")
    p.add_argument("--attack", choices=("fgs", "targeted", "pgd", "cw"), default="fgs")
    p.add_argument("--eta", type=float, default=None, help="FGS / targeted step size")
    p.add_argument("--steps", type=int, default=None, help="targeted / PGD steps")
    p.add_argument("--target", default=None, help="targeted: class index or 'random'")
    p.add_argument("--eps", type=float, default=None, help="PGD L∞ radius")
    p.add_argument("--eps-iter", type=float, default=None, help="PGD step size")
    p.add_argument("--iterations", type=int, default=None, help="CW iterations per binary step")
    p.add_argument("--binary-steps", type=int, default=None, help="CW binary-search steps")
    p.add_argument(
        "--spec", default=None, help="full attack spec instead, e.g. 'targeted:steps=40,target=0'"
    )
    p.add_argument("--split", choices=("test", "val"), default="test")
    p.add_argument("--limit", type=int, default=None, help="first N images of the split")
    p.add_argument("--k", type=int, default=None, help="MC passes attacked (card k_attack)")
    p.add_argument("--k-eval", type=int, default=None, help="MC passes judging success (k_test)")
    p.add_argument("--out", type=Path, required=True, help="output .npz")
    p.add_argument("--save-clean", action="store_true", help="also store the clean images")
    _common(p)
    p.set_defaults(func=cmd_attack)


def _register_calibrate(sub: argparse._SubParsersAction) -> None:
    from bayesgate.attacks.specs import DEFAULT_ATTACKS
    from bayesgate.models.mc.uncertainty import SCORES

    p = sub.add_parser(
        "calibrate",
        help="set rejection thresholds on validation images, measure detection on attacks",
    )
    p.add_argument("model", type=Path, help="model directory (calibration.json is written there)")
    p.add_argument("--score", choices=tuple(SCORES), default="predictive_entropy")
    p.add_argument("--target-fpr", type=float, default=0.05, help="clean false-positive rate")
    p.add_argument("--k", type=int, default=None, help="MC passes of the scores (card k_test)")
    p.add_argument("--k-attack", type=int, default=None, help="MC passes attacked (k_attack)")
    p.add_argument(
        "--attacks",
        nargs="+",
        default=list(DEFAULT_ATTACKS),
        metavar="SPEC",
        help="attack specs NAME[:key=value,...] (default: %(default)s); also pgd:eps=0.3, cw",
    )
    p.add_argument("--val-limit", type=int, default=None, help="first N validation images")
    p.add_argument("--test-limit", type=int, default=None, help="first N test images")
    p.add_argument("--no-report", action="store_true", help="skip calibration.md and plots")
    _common(p)
    p.set_defaults(func=cmd_calibrate)


def _register_sweep(sub: argparse._SubParsersAction) -> None:
    p = sub.add_parser("sweep", help="reproduce the paper's Figures 6-7 and the detection table")
    p.add_argument("models", type=Path, nargs="+", help="model directories")
    p.add_argument("--figure", choices=FIGURES, required=True)
    p.add_argument("--limit", type=int, default=1000, help="test images (figure 7: non-zero)")
    p.add_argument("--k", type=int, default=10, help="MC passes attacked (paper: 10)")
    p.add_argument(
        "--k-eval",
        type=int,
        default=None,
        help="MC passes evaluating the results (default 10 for figures, 100 for detection)",
    )
    p.add_argument("--steps", type=int, default=40, help="figure 7: targeted steps")
    p.add_argument("--eta", type=float, default=0.01, help="figure 7: step size")
    p.add_argument("--cw-limit", type=int, default=100, help="detection: images CW attacks")
    p.add_argument(
        "--attacks", nargs="+", default=None, metavar="SPEC", help="detection: attack specs"
    )
    p.add_argument("--out", type=Path, default=Path("docs/attacks"), help="output directory")
    p.add_argument(
        "--append",
        action="store_true",
        help="merge with the results already in --out (same settings; re-run models replaced)",
    )
    _common(p)
    p.set_defaults(func=cmd_sweep)


def _positive(name: str, value: int | None) -> None:
    if value is not None and value < 1:
        raise ValueError(f"{name} must be ≥ 1, got {value}")


def _attack_spec(args: argparse.Namespace) -> Any:
    from bayesgate.attacks.specs import AttackSpec

    if args.spec:
        return AttackSpec.parse(args.spec)
    names = {
        "eta": args.eta,
        "steps": args.steps,
        "target": args.target,
        "eps": args.eps,
        "eps_iter": args.eps_iter,
        "iterations": args.iterations,
        "binary_steps": args.binary_steps,
    }
    params = {k: v for k, v in names.items() if v is not None}
    return AttackSpec(args.attack, params)


def cmd_attack(args: argparse.Namespace) -> int:
    from bayesgate.attacks.run import run_attack
    from bayesgate.models.data.mnist import load_mnist
    from bayesgate.models.store.directory import load_model

    spec = _attack_spec(args)
    for name in ("k", "k_eval", "limit", "batch_size"):
        _positive(name.replace("_", "-"), getattr(args, name))
    device = pick_device(args.device)
    loaded = load_model(args.model, device)
    k = args.k or int(loaded.card.inference.get("k_attack", 10))
    k_eval = args.k_eval or int(loaded.card.inference.get("k_test", 100))
    val_size = int(loaded.card.training.get("val_size", 10_000))
    x, y = load_mnist(args.split, val_size=val_size, limit=args.limit)
    t0 = time.perf_counter()
    outcome = run_attack(
        loaded.network,
        x,
        y,
        spec,
        k=k,
        k_eval=k_eval,
        batch_size=args.batch_size,
        seed=args.seed,
        device=device,
        progress=not args.no_progress,
    )
    outcome.save_npz(args.out, x if args.save_clean else None)
    summary = {
        "model": loaded.card.name,
        "split": args.split,
        "out": str(args.out),
        "seconds": round(time.perf_counter() - t0, 1),
        **outcome.summary(),
    }
    print(json.dumps(summary, indent=2, ensure_ascii=False))
    return 0


def cmd_calibrate(args: argparse.Namespace) -> int:
    from bayesgate.attacks.calibrate import calibrate
    from bayesgate.attacks.report import write_report
    from bayesgate.models.store.calibration import write_calibration
    from bayesgate.models.store.directory import load_model

    for name in ("k", "k_attack", "val_limit", "test_limit", "batch_size"):
        _positive(name.replace("_", "-"), getattr(args, name))
    device = pick_device(args.device)
    loaded = load_model(args.model, device)
    run = calibrate(
        loaded,
        score=args.score,
        target_fpr=args.target_fpr,
        k=args.k,
        k_attack=args.k_attack,
        attacks=args.attacks,
        val_limit=args.val_limit,
        test_limit=args.test_limit,
        seed=args.seed,
        device=device,
        batch_size=args.batch_size,
        progress=not args.no_progress,
    )
    path = write_calibration(run.calibration, args.model)
    outputs = {"calibration": str(path)}
    if not args.no_report:
        outputs["report"] = str(write_report(run, args.model, loaded.card.name))
    cal = run.calibration
    print(
        json.dumps(
            {
                **outputs,
                "score": cal.score,
                "threshold": cal.threshold,
                "realised_val_fpr": cal.validation["realised_fpr"][cal.score],
                "attacks": {
                    r["label"]: {"success_rate": r["success_rate"], "auroc": r.get("auroc")}
                    for r in cal.attacks
                },
            },
            indent=2,
            ensure_ascii=False,
        )
    )
    return 0


def cmd_sweep(args: argparse.Namespace) -> int:
    import torch

    from bayesgate.attacks import sweep
    from bayesgate.models.data.mnist import load_mnist
    from bayesgate.models.store.directory import load_model

    for name in ("k", "k_eval", "limit", "batch_size", "steps"):
        _positive(name.replace("_", "-"), getattr(args, name))
    device = pick_device(args.device)
    models = [load_model(d, device) for d in args.models]
    common = {
        "seed": args.seed,
        "batch_size": args.batch_size,
        "device": device,
        "progress": not args.no_progress,
        "k": args.k,
    }
    t0 = time.perf_counter()
    x, y = load_mnist("test")
    if args.figure == "7":
        keep = torch.nonzero(y != 0).squeeze(1)[: args.limit]
        x, y = x[keep], y[keep]
    else:
        x, y = x[: args.limit], y[: args.limit]
    k_eval = args.k_eval or (100 if args.figure == "detection" else 10)
    stem = "detection" if args.figure == "detection" else f"figure{args.figure}"
    config: dict[str, Any] = {
        "figure": args.figure,
        "images": int(x.shape[0]),
        "k": args.k,
        "k_eval": k_eval,
        "seed": args.seed,
    }
    if args.figure == "6":
        rows = sweep.figure6(models, x, y, k_eval=k_eval, **common)
    elif args.figure == "7":
        config.update(eta=args.eta, steps=args.steps, target=0)
        rows = sweep.figure7(models, x, y, steps=args.steps, eta=args.eta, k_eval=k_eval, **common)
    else:
        config.update(cw_limit=args.cw_limit, attacks=args.attacks or list(sweep.DETECTION_ATTACKS))
        rows = sweep.detection(
            models,
            x,
            y,
            attacks=config["attacks"],
            k_eval=k_eval,
            cw_limit=args.cw_limit,
            roc_dir=args.out,
            **common,
        )
    described = [sweep.describe(m) for m in models]
    seconds = round(time.perf_counter() - t0, 1)
    meta = {
        **config,
        "models": described,
        "seconds": {", ".join(d["name"] for d in described): seconds},
        "torch_threads": torch.get_num_threads(),
    }
    path = args.out / f"{stem}.json"
    if args.append and path.is_file():
        meta, rows = _merge_sweep(json.loads(path.read_text()), meta, rows, config, path)
    _write_sweep(args.out, stem, args.figure, meta, rows)
    summary = {k: v for k, v in meta.items() if k != "models"}
    print(json.dumps(summary, indent=2, ensure_ascii=False))
    return 0


def _merge_sweep(
    old: dict[str, Any],
    meta: dict[str, Any],
    rows: list[dict[str, Any]],
    config: dict[str, Any],
    path: Path,
) -> tuple[dict[str, Any], list[dict[str, Any]]]:
    """Add this run's models to an earlier run's results (same configuration required);
    rows of a model that is run again are replaced."""
    differ = [k for k, v in config.items() if old.get(k) != v]
    if differ:
        raise ValueError(
            f"{path}: cannot --append, the earlier run used different "
            + ", ".join(f"{k}={old.get(k)!r}" for k in differ)
        )
    names = {d["name"] for d in meta["models"]}
    kept_models = [d for d in old.get("models", []) if d["name"] not in names]
    kept_rows = [r for r in old.get("rows", []) if r.get("name") not in names]
    merged = {
        **meta,
        "models": kept_models + meta["models"],
        "seconds": {**old.get("seconds", {}), **meta["seconds"]},
    }
    return merged, kept_rows + rows


def _write_sweep(
    out: Path, stem: str, figure: str, meta: dict[str, Any], rows: list[dict[str, Any]]
) -> None:
    """``<stem>.csv``, ``<stem>.json`` and the figure (or, for detection, the Markdown table)."""
    from bayesgate.attacks import sweep
    from bayesgate.attacks.plots import sweep_plot

    out.mkdir(parents=True, exist_ok=True)
    # a fixed model order whatever order they were run in: deterministic, MLPs by α, CNNs
    meta["models"].sort(key=lambda d: ("CNN" in d["model"], d["stochastic"], d["alpha"] or 0.0))
    rank = {d["name"]: i for i, d in enumerate(meta["models"])}
    rows.sort(key=lambda r: rank.get(r["name"], len(rank)))
    images = meta["images"]
    if figure == "6":
        sweep_plot(
            rows,
            out / "figure6.png",
            "eta",
            [("accuracy", "test accuracy"), ("mean_entropy", "mean predictive entropy (nats)")],
            "FGS step size η",
            title=f"Untargeted FGS, {images} MNIST test images",
        )
    elif figure == "7":
        sweep_plot(
            rows,
            out / "figure7.png",
            "step",
            [
                ("accuracy", "test accuracy"),
                ("target_rate", "classified as target 0"),
                ("mean_entropy", "mean predictive entropy (nats)"),
            ],
            f"targeted FGS steps (η={meta['eta']:g})",
            title=f"Targeted attack to class 0, {images} non-zero MNIST test digits",
        )
    else:
        (out / "detection.md").write_text(sweep.detection_table(rows))
    sweep.write_csv(rows, out / f"{stem}.csv")
    text = json.dumps({**meta, "rows": rows}, indent=2, ensure_ascii=False)
    (out / f"{stem}.json").write_text(text + "\n")
