"""``bayesgate detect-eval`` and ``bayesgate adaptive-eval``: a fitted detector, test split.

The parsers' defaults and choices, and the settings' checks, come from torch-free modules —
:class:`~bayesgate.attacks.detect_settings.EvalSettings` (its attacks),
:mod:`~bayesgate.attacks.ood_names` (the OOD sets) and
:class:`~bayesgate.attacks.adaptive_settings.AdaptiveSettings` — so ``--help`` and a refused flag
or setting do not wait for torch (~3 s); the evaluations (torch) are imported after the checks.
"""

from __future__ import annotations

import argparse
import json
import sys
import time
from pathlib import Path
from typing import Any

from bayesgate.attacks.adaptive_settings import (
    OPTIMIZERS,
    RANDOM_SEARCH_LABELS,
    RANDOM_SEARCHES,
    AdaptiveSettings,
    check_non_negative,
    default_steps,
    radius_check,
)
from bayesgate.attacks.detect_settings import EvalSettings
from bayesgate.attacks.methods.parameters import SPARSE_REGIONS
from bayesgate.attacks.ood_names import OOD_NAMES
from bayesgate.attacks.specs import spec_needs
from bayesgate.errors import InvalidArgument, check_at_least, writable_dir
from bayesgate.extras import Need
from bayesgate.listflags import list_flag
from bayesgate.models.device import (
    DEFAULT_DEVICE,
    DEVICE_CHOICES,
    add_threads_flag,
    pick_device,
    set_threads,
)
from bayesgate.models.store.bundled import READ_MODEL_HELP, model_to_read
from bayesgate.outputs import note_replacing


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
    p.add_argument("--device", default=DEFAULT_DEVICE, help=f"one of {', '.join(DEVICE_CHOICES)}")
    add_threads_flag(p)
    p.add_argument("--no-progress", action="store_true", help="no progress bars")


def _register_detect_eval(sub: argparse._SubParsersAction) -> None:
    d = EvalSettings()
    p = sub.add_parser(
        "detect-eval",
        help="every detector score (and the fused one) vs seen/unseen attacks and OOD inputs",
    )
    _common(p)
    p.add_argument("--limit", type=int, default=d.limit, help="first N test images")
    p.add_argument(
        "--attacks",
        nargs="*",
        default=list(d.attacks),
        metavar="SPEC",
        help="attack specs (default: %(default)s; --attacks with no spec: none, OOD sets only)",
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
        default=list(d.ood),
        choices=OOD_NAMES,
        help="OOD sets (default: %(default)s, the four of issue 15; the fresh ones are opt-in; "
        "--ood with no name: none, attacks only)",
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
    d = AdaptiveSettings()
    p = sub.add_parser(
        "adaptive-eval", help="adaptive white-box PGD against the fused detector (and plain PGD)"
    )
    _common(p)
    p.add_argument("--limit", type=int, default=d.limit, help="first N test images")
    list_flag(
        p,
        "--eps",
        item=float,
        default=list(d.eps),
        metavar="EPS",
        help="L∞ radii (L1 radii with --optimizer slide, e.g. 10; pixel counts with "
        "--optimizer sparse-rs or patch-rs, e.g. 10, below 784)",
    )
    list_flag(
        p, "--weights", item=float, default=list(d.weights), metavar="WEIGHT", help="λ values"
    )
    list_flag(
        p,
        "--joint-weights",
        item=float,
        nargs="*",
        default=list(d.joint_weights),
        metavar="WEIGHT",
        help="also run the detector term from step 0 at these λ (shows the pinning failure)",
    )
    p.add_argument(
        "--steps",
        type=int,
        default=None,
        help=f"steps of the attack (default {default_steps('pgd')}; with --optimizer sparse-rs "
        f"or patch-rs: queries per image, default {default_steps('patch-rs')})",
    )
    p.add_argument("--kappa", type=float, default=d.kappa, help="margin κ (nats)")
    p.add_argument("--delta", type=float, default=d.delta, help="detector margin δ")
    p.add_argument(
        "--optimizer",
        choices=OPTIMIZERS,
        default=d.optimizer,
        help="pgd: fixed steps of ε/25; apgd: Auto-PGD's step schedule and momentum "
        "(Croce & Hein 2020), the stronger optimiser; slide: sparse L1 steps of ε/10 (Tramèr & "
        "Boneh 2019), --eps then L1 radii; sparse-rs: Sparse-RS's random search over which "
        "pixels to set to 0 or 1 (Croce et al. 2022; no gradients), --eps then pixel counts; "
        "patch-rs: Sparse-RS's random search over the location and the 0/1 content of one "
        "square patch (no gradients), --eps then pixel budgets k, the patch ⌊√k⌋×⌊√k⌋ (k = 10: "
        "3×3; never more than k pixels, where the authors round the side up)",
    )
    p.add_argument(
        "--restarts",
        type=int,
        default=d.restarts,
        help="with --optimizer apgd: runs from new random starts on the digits not yet found",
    )
    p.add_argument(
        "--region",
        choices=SPARSE_REGIONS,
        default=d.region,
        help="with --optimizer sparse-rs: where the pixels go — anywhere, or only on the digit's "
        "strokes and their one-pixel border (clumps with the strokes, which a median filter "
        "keeps)",
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
    for flag, given, other in (
        ("--ood", args.ood, args.attacks),
        ("--attacks", args.attacks, args.ood),
    ):
        if given == [] and other:  # a bare flag means none, not the default sets: say so
            print(f"note: {flag} given with no names: none are evaluated (leave {flag} out for "
                  "the default ones)", file=sys.stderr)  # fmt: skip
    if not settings.attacks and not settings.ood:
        raise InvalidArgument("nothing to evaluate: give --attacks SPEC … or --ood SET …")
    from bayesgate.attacks.detect_eval import evaluate_detector  # torch: after the checks
    from bayesgate.attacks.detect_report import detect_eval_paths, write_detect_eval

    loaded, detector, device = _load(args)  # a model it cannot use fails before the note below
    note_replacing("detect-eval", detect_eval_paths(args.out).values())
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
            region=args.region,
        )
    except ValueError as exc:
        given = f"--optimizer {args.optimizer} --restarts {args.restarts} --region {args.region}"
        raise InvalidArgument(f"{given}: {exc}") from None
    from bayesgate.attacks.adaptive_eval import (  # torch: after the checks
        adaptive_paths,
        evaluate_adaptive,
        write_adaptive,
    )

    loaded, detector, device = _load(args)  # a model it cannot use fails before the note below
    note_replacing("adaptive-eval", adaptive_paths(args.out).values())
    started = time.perf_counter()
    result = evaluate_adaptive(
        loaded, detector, settings, device=device, progress=not args.no_progress
    )
    result["seconds"] = round(time.perf_counter() - started, 1)
    paths = write_adaptive(result, args.out)
    files = {k: str(v) for k, v in paths.items()}
    print_report(paths["md"], files | {"seconds": result["seconds"]})
    return 0


MNIST_PIXELS = 28 * 28
"""Pixels of the test digits ``adaptive-eval`` attacks (``models.data.mnist.IMAGE_SIZE``², not
imported: that module imports torch, and these checks run before it is loaded)."""


def _check_adaptive_flags(args: argparse.Namespace) -> None:
    """``adaptive-eval``'s numbers, each error naming its flag (NaN and ∞ refused: they would
    also be written as invalid JSON)."""
    check_at_least("--steps", args.steps)
    check_at_least("--restarts", args.restarts)
    if not args.eps:  # `--eps ,`
        raise InvalidArgument("--eps: give at least one radius")
    for eps in args.eps:  # L1 radii for slide, pixel counts for sparse/patch-rs, L∞ otherwise
        radius_check(args.optimizer)("--eps", eps)
        if args.optimizer in RANDOM_SEARCHES and eps >= MNIST_PIXELS:
            raise InvalidArgument(
                f"--eps {eps:g}: {RANDOM_SEARCH_LABELS[args.optimizer]} changes fewer pixels "
                f"than the {MNIST_PIXELS} of an MNIST digit"
            )
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
