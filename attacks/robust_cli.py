"""``bayesgate evaluate-robust MODEL [MODEL …]``: the robust-accuracy table of several models.

A MODEL is a model directory (``card.json`` + weights) or a training checkpoint directory
(``checkpoint.json`` of ``bayesgate train``, so a run still training can be evaluated).

The evaluation's modules (torch) are imported when the command runs, after the flags are checked:
the parser's defaults and choices, and the settings' checks, are those of the torch-free
:mod:`~bayesgate.attacks.robust_settings` (:class:`RobustSettings`, :data:`ROBUST_ATTACKS`), so
that ``--help`` and a refused flag do not wait ~3 s for torch.
"""

from __future__ import annotations

import argparse
import math
import sys
from collections.abc import Sequence
from pathlib import Path
from typing import TYPE_CHECKING

from bayesgate.attacks.robust_settings import ROBUST_ATTACKS, RobustSettings
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
from bayesgate.models.store.bundled import ModelsToRead
from bayesgate.models.store.files import CARD_FILE
from bayesgate.models.store.own_files import check_distinct_models
from bayesgate.outputs import note_replacing

if TYPE_CHECKING:
    import torch
    from torch import nn

ADAPTIVE_WEIGHTS = (0.1, 1.0, 10.0)
"""Default detector weights λ of the adaptive attack (``--adaptive-weights``)."""


def register(sub: argparse._SubParsersAction) -> None:
    p = sub.add_parser(
        "evaluate-robust",
        help="robust accuracy under PGD × restarts, APGD-CE and APGD-DLR (worst of) per ε",
    )
    p.add_argument(
        "models",
        nargs="+",
        action=ModelsToRead,  # resolved; args.models_given: as typed, for the errors
        help="model or training checkpoint directories, or bundled models' names "
        "(bayesgate-robust, bayesgate-cnn)",
    )
    d = RobustSettings()
    list_flag(p, "--eps", item=float, default=list(d.eps), metavar="EPS", help="L∞ radii")
    p.add_argument("--n", type=int, default=d.n, help="first N test digits")
    p.add_argument("--out", type=Path, required=True, help="output directory (also the cache)")
    p.add_argument("--pgd-steps", type=int, default=d.pgd_steps, help="steps of each PGD run")
    p.add_argument("--restarts", type=int, default=d.restarts, help="PGD runs from random starts")
    p.add_argument(
        "--apgd-steps", type=int, default=d.apgd_steps, help="steps of APGD-CE and APGD-DLR"
    )
    p.add_argument("--k-attack", type=int, default=d.k_attack, help="MC passes per attack query")
    p.add_argument("--k-eval", type=int, default=d.k_eval, help="MC passes of the verdict")
    list_flag(
        p,
        "--attacks",
        default=list(d.attacks),
        metavar="NAME",
        help=f"attacks, worst of ({', '.join(ROBUST_ATTACKS)})",
    )
    list_flag(
        p,
        "--adaptive-weights",
        item=float,
        default=list(ADAPTIVE_WEIGHTS),
        metavar="WEIGHT",
        help="detector weights λ of the adaptive attack on a fused detector (plain PGD always)",
    )
    p.add_argument("--adaptive-steps", type=int, default=100, help="steps of the adaptive attack")
    p.add_argument("--batch-size", type=int, default=d.batch_size, help="images per attack batch")
    p.add_argument("--seed", type=int, default=d.seed, help="seed of masks and random starts")
    add_threads_flag(p)
    p.add_argument("--device", default=DEFAULT_DEVICE, help=f"one of {', '.join(DEVICE_CHOICES)}")
    p.add_argument("--no-progress", action="store_true", help="no progress bars")
    # its attacks (PGD with restarts, APGD) are our own; only the plot needs an extra
    p.set_defaults(func=cmd_evaluate_robust, needs=lambda args: [Need("matplotlib", "the plot")])


def cmd_evaluate_robust(args: argparse.Namespace) -> int:
    # every check of the flags, the output folder and the models before the first attack
    check_distinct_models(args.models, getattr(args, "models_given", None))
    settings = _settings(args)
    weights = _adaptive_weights(args.adaptive_weights)
    check_at_least("--adaptive-steps", args.adaptive_steps)
    writable_dir(args.out, "--out")
    set_threads(args.threads)
    from bayesgate.attacks.evaluate_cli import print_report
    from bayesgate.attacks.robust_adaptive import adaptive_detector_step  # torch: after the checks
    from bayesgate.attacks.robust_eval import BatchCache, evaluate_robust, model_key
    from bayesgate.attacks.robust_report import output_paths, write_outputs
    from bayesgate.models.data.mnist import load_mnist

    note_replacing("evaluate-robust", output_paths(args.out).values())  # its cache/ is kept
    device = pick_device(args.device)
    networks = [(path, *load_for_evaluation(path, device)) for path in args.models]
    x, y = load_mnist("test", limit=settings.n)
    x, y = x.to(device), y.to(device)
    models = []
    for path, network, name, sha in networks:
        print(f"evaluate-robust: {name} ({path})", file=sys.stderr)
        cache = BatchCache(args.out / "cache", model_key(name, sha))
        row = evaluate_robust(network, x, y, settings, cache, progress=not args.no_progress)
        row.update({"name": name, "path": str(path), "weights_sha256": sha})
        row["adaptive"] = adaptive_detector_step(
            path,
            settings,
            weights=weights,
            steps=args.adaptive_steps,
            cache_dir=args.out / "cache" / "adaptive",
            device=device,
            progress=not args.no_progress,
        )
        models.append(row)
    result = {"settings": models[0]["settings"], "models": models}
    paths = write_outputs(result, args.out)
    print_report(paths["markdown"], {k: str(v) for k, v in paths.items()})
    return 0


def _settings(args: argparse.Namespace) -> RobustSettings:
    return RobustSettings(
        eps=tuple(args.eps),
        n=args.n,
        attacks=tuple(args.attacks),
        pgd_steps=args.pgd_steps,
        restarts=args.restarts,
        apgd_steps=args.apgd_steps,
        k_attack=args.k_attack,
        k_eval=args.k_eval,
        batch_size=args.batch_size,
        seed=args.seed,
    )


def _adaptive_weights(weights: Sequence[float]) -> tuple[float, ...]:
    """``--adaptive-weights``: finite λ ≥ 0."""
    bad = [w for w in weights if not (math.isfinite(w) and w >= 0)]
    if bad:
        raise InvalidArgument(f"--adaptive-weights must be finite numbers ≥ 0, got {bad[0]}")
    return tuple(weights)


def load_for_evaluation(path: Path, device: torch.device) -> tuple[nn.Module, str, str]:
    """``(network in eval mode, name, weights sha256)`` from a model or checkpoint directory."""
    from bayesgate.models.networks.registry import build_network
    from bayesgate.models.store.directory import load_model
    from bayesgate.models.training import checkpoint as ckpt

    if (path / ckpt.STATE_FILE).is_file() and not (path / CARD_FILE).is_file():
        found = ckpt.read_checkpoint(path)
        if found is None:
            raise InvalidArgument(f"{path}: no checkpoint")
        tensors, state = found
        network = build_network(state["settings"]["architecture"])
        network.load_state_dict(ckpt.prefixed(tensors, "model"))
        name = f"{path.name} (checkpoint, epoch {state['progress']['epoch']})"
        return network.to(device).eval(), name, state["tensors_sha256"]
    loaded = load_model(path, device)
    return loaded.network, loaded.card.name, loaded.card.weights_sha256
