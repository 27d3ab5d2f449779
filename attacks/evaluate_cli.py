"""``bayesgate detect-eval`` and ``bayesgate adaptive-eval``: a fitted detector, test split.

The parsers' defaults and choices — the attacks and OOD sets of
:mod:`~bayesgate.attacks.detect_eval` and :mod:`~bayesgate.attacks.ood`,
:class:`~bayesgate.attacks.adaptive_eval.AdaptiveSettings`'s values — are written out here rather
than read from those modules: they import torch, which ``--help`` and a refused flag should not
wait for (~3 s). tests/test_cli_imports.py checks that they are the same.
"""

from __future__ import annotations

import argparse
import json
import time
from pathlib import Path
from typing import Any

from bayesgate.attacks.specs import spec_needs
from bayesgate.errors import InvalidArgument, check_at_least, writable_dir
from bayesgate.extras import Need
from bayesgate.listflags import list_flag
from bayesgate.models.device import DEVICE_CHOICES, add_threads_flag, pick_device, set_threads
from bayesgate.models.store.bundled import READ_MODEL_HELP, model_to_read
from bayesgate.outputs import note_replacing

EVAL_ATTACKS = (
    "fgs:eta=0.1",
    "fgs:eta=0.2",
    "fgs:eta=0.3",
    "targeted:steps=40,eta=0.01",
    "pgd:eps=0.3,eps_iter=0.01,steps=40",
    "cw",
    "square:eps=0.3,queries=1000",
)
"""= :data:`bayesgate.attacks.detect_eval.EVAL_ATTACKS`, what ``detect-eval`` runs by default."""
OOD_SETS = (
    "uniform",
    "gaussian",
    "rotated",
    "inverted",
    "rotated45",
    "rotated180",
    "shifted",
    "blurred",
    "letters",
)
"""= the names of :data:`bayesgate.attacks.ood.OOD_SETS`."""
DEFAULT_OOD = ("uniform", "gaussian", "rotated", "inverted")
"""= :data:`bayesgate.attacks.ood.DEFAULT_OOD`."""


def register(sub: argparse._SubParsersAction) -> None:
    _register_detect_eval(sub)
    _register_adaptive_eval(sub)


def _common(p: argparse.ArgumentParser) -> None:
    p.add_argument("model", type=model_to_read, help=READ_MODEL_HELP + ", with a fitted detector")
    p.add_argument("--out", type=Path, required=True, help="output directory")
    p.add_argument("--k", type=int, default=None, help="MC passes of the scores (detector's K)")
    p.add_argument("--k-attack", type=int, default=None, help="MC passes attacked (k_attack)")
    p.add_argument("--seed", type=int, default=0, help="seed of masks, starts and noise")
    p.add_argument("--batch-size", type=int, default=100, help="images per attack batch")
    p.add_argument(
        "--cache-dir",
        type=Path,
        default=None,
        help="where adversarial examples are cached, kept across runs and --out folders "
        "(default: detect-eval/ in the user cache, ~/.cache/bayesgate/detect-eval)",
    )
    p.add_argument("--device", default="auto", help=f"one of {', '.join(DEVICE_CHOICES)}")
    add_threads_flag(p)
    p.add_argument("--no-progress", action="store_true", help="no progress bars")


def _register_detect_eval(sub: argparse._SubParsersAction) -> None:
    p = sub.add_parser(
        "detect-eval",
        help="every detector score (and the fused one) vs seen/unseen attacks and OOD inputs",
    )
    _common(p)
    p.add_argument("--limit", type=int, default=1000, help="first N test images")
    p.add_argument(
        "--attacks", nargs="*", default=list(EVAL_ATTACKS), metavar="SPEC", help="attack specs"
    )
    p.add_argument(
        "--attack-limit",
        nargs="*",
        default=[],
        metavar="NAME=N",
        help="attack only the first N images with attack NAME, e.g. cw=300",
    )
    p.add_argument(
        "--ood",
        nargs="*",
        default=list(DEFAULT_OOD),
        choices=OOD_SETS,
        help="OOD sets (default: %(default)s, the four of issue 15; the fresh ones are opt-in)",
    )
    p.set_defaults(
        func=cmd_detect_eval,
        needs=_detect_eval_needs,
        on_interrupt="every finished attack's images are cached: run the same command again to "
        "go on from the next one",
    )


def _detect_eval_needs(args: argparse.Namespace) -> list[Any]:
    return [*spec_needs(args.attacks), Need("matplotlib", "the ROC plot")]


def _register_adaptive_eval(sub: argparse._SubParsersAction) -> None:
    p = sub.add_parser(
        "adaptive-eval", help="adaptive white-box PGD against the fused detector (and plain PGD)"
    )
    _common(p)
    p.add_argument("--limit", type=int, default=500, help="first N test images")
    list_flag(p, "--eps", item=float, default=[0.1, 0.2, 0.3], metavar="EPS", help="L∞ radii")
    list_flag(
        p, "--weights", item=float, default=[0.1, 1.0, 10.0], metavar="WEIGHT", help="λ values"
    )
    list_flag(
        p,
        "--joint-weights",
        item=float,
        nargs="*",
        default=[],
        metavar="WEIGHT",
        help="also run the detector term from step 0 at these λ (shows the pinning failure)",
    )
    p.add_argument("--steps", type=int, default=100, help="PGD steps")
    p.add_argument("--kappa", type=float, default=1.0, help="margin κ (nats)")
    p.add_argument("--delta", type=float, default=0.5, help="detector margin δ")
    p.add_argument(
        "--optimizer",
        choices=("pgd", "apgd"),
        default="pgd",
        help="pgd: fixed steps of ε/25; apgd: Auto-PGD's step schedule and momentum "
        "(Croce & Hein 2020), the stronger optimiser",
    )
    p.add_argument(
        "--restarts",
        type=int,
        default=1,
        help="with --optimizer apgd: runs from new random starts on the digits not yet found",
    )
    p.set_defaults(
        func=cmd_adaptive_eval,
        on_interrupt="every finished attack's images are cached: run the same command again to "
        "go on from the next one",
    )


def _load(args: argparse.Namespace) -> tuple[Any, Any, Any]:
    from bayesgate.models.detection.store import DETECTOR_JSON, load_detector
    from bayesgate.models.store.directory import load_model

    set_threads(args.threads)  # checked by check_common before anything was loaded
    device = pick_device(args.device)
    loaded = load_model(args.model, device)
    if not (Path(args.model) / DETECTOR_JSON).is_file():
        raise InvalidArgument(
            f"{args.model} has no {DETECTOR_JSON}: run `bayesgate fit-detector` first"
        )
    detector = load_detector(args.model, loaded.card.weights_sha256)
    return loaded, detector, device


def check_common(args: argparse.Namespace) -> None:
    """The flags of :func:`_common`, checked before any work: counts ≥ 1, ``--out`` and
    ``--cache-dir`` folders that can be written."""
    for name in ("k", "k_attack", "limit", "batch_size", "threads"):
        check_at_least("--" + name.replace("_", "-"), getattr(args, name, None))
    writable_dir(args.out, "--out")
    if args.cache_dir is not None:
        writable_dir(args.cache_dir, "--cache-dir")


def _attack_limits(items: list[str]) -> dict[str, int]:
    limits = {}
    for item in items:
        name, sep, value = item.partition("=")
        if not sep or not value.strip().isdigit():
            raise InvalidArgument(f"--attack-limit expects NAME=N, got {item!r}")
        limits[name.strip()] = int(value)
    return limits


def cmd_detect_eval(args: argparse.Namespace) -> int:
    check_common(args)
    from bayesgate.attacks.detect_eval import EvalSettings, evaluate_detector  # torch
    from bayesgate.attacks.detect_report import detect_eval_paths, write_detect_eval

    settings = EvalSettings(
        attacks=tuple(args.attacks),
        ood=tuple(args.ood),
        limit=args.limit,
        attack_limits=_attack_limits(args.attack_limit),
        k=args.k,
        k_attack=args.k_attack,
        seed=args.seed,
        batch_size=args.batch_size,
        cache_dir=args.cache_dir,
    )
    settings.check()  # the attacks and --attack-limit names, before the model is loaded
    note_replacing("detect-eval", detect_eval_paths(args.out).values())
    loaded, detector, device = _load(args)
    started = time.perf_counter()
    result = evaluate_detector(
        loaded, detector, settings, device=device, progress=not args.no_progress
    )
    result.seconds["total"] = round(time.perf_counter() - started, 1)
    paths = write_detect_eval(result, args.out)
    fused = detector.score
    summary = {
        "files": {k: str(v) for k, v in paths.items()},
        "score": fused,
        "seconds": result.seconds["total"],
        "rows": {
            r["label"]: {
                "auroc": r["scores"][fused]["auroc"],
                "tpr_at_threshold": r["scores"][fused].get("tpr_at_threshold"),
            }
            for r in result.rows()
        },
    }
    print(json.dumps(summary, indent=2, ensure_ascii=False, default=float))
    return 0


def cmd_adaptive_eval(args: argparse.Namespace) -> int:
    check_common(args)
    _check_adaptive_flags(args)
    from bayesgate.attacks.adaptive_eval import (  # torch
        AdaptiveSettings,
        adaptive_paths,
        evaluate_adaptive,
        write_adaptive,
    )

    try:  # the settings check themselves; their message becomes the one-line CLI error
        settings = AdaptiveSettings(
            eps=tuple(args.eps),
            weights=tuple(args.weights),
            joint_weights=tuple(args.joint_weights),
            steps=args.steps,
            kappa=args.kappa,
            delta=args.delta,
            limit=args.limit,
            k_attack=args.k_attack,
            k=args.k,
            seed=args.seed,
            batch_size=args.batch_size,
            cache_dir=args.cache_dir,
            optimizer=args.optimizer,
            restarts=args.restarts,
        )
    except ValueError as exc:
        given = f"--optimizer {args.optimizer} --restarts {args.restarts}"
        raise InvalidArgument(f"{given}: {exc}") from None
    note_replacing("adaptive-eval", adaptive_paths(args.out).values())
    loaded, detector, device = _load(args)
    started = time.perf_counter()
    result = evaluate_adaptive(
        loaded, detector, settings, device=device, progress=not args.no_progress
    )
    result["seconds"] = round(time.perf_counter() - started, 1)
    paths = write_adaptive(result, args.out)
    files = {k: str(v) for k, v in paths.items()}
    print_report(paths["md"], files | {"seconds": result["seconds"]})
    return 0


def _check_adaptive_flags(args: argparse.Namespace) -> None:
    """``adaptive-eval``'s numbers, each error naming its flag (NaN and ∞ refused: they would
    also be written as invalid JSON)."""
    from bayesgate.attacks.adaptive import check_non_negative, check_radius

    check_at_least("--steps", args.steps)
    check_at_least("--restarts", args.restarts)
    if not args.eps:  # `--eps ,`
        raise InvalidArgument("--eps: give at least one radius")
    for eps in args.eps:
        check_radius("--eps", eps)
    for flag in ("weights", "joint_weights"):
        for weight in getattr(args, flag):
            check_non_negative("--" + flag.replace("_", "-"), weight)
    check_non_negative("--kappa", args.kappa)
    check_non_negative("--delta", args.delta)


def print_report(table: Path, summary: dict[str, Any]) -> None:
    """On stdout: the Markdown table the command wrote to ``table``, a blank line, then
    ``summary`` (the files written, …) as JSON."""
    print(Path(table).read_text(encoding="utf-8").rstrip("\n"))
    print()
    print(json.dumps(summary, indent=2, ensure_ascii=False))
