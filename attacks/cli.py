"""``bayesgate attack``, ``bayesgate calibrate`` and ``bayesgate sweep`` (and, through
:mod:`.detector_cli` and :mod:`.evaluate_cli`, ``fit-detector``, ``detect-eval`` and
``adaptive-eval``).

Building these parsers imports no torch: the attacks' flags come from their torch-free parameter
declarations (:mod:`bayesgate.attacks.methods.parameters`), the default attacks from
:mod:`bayesgate.attacks.specs` and the scores from :mod:`bayesgate.models.mc.options`; what runs an
attack, loads a model or reads MNIST is imported inside the command functions, after the flags
they check. So ``--help``
and a refused flag answer in a fraction of a second instead of after torch's ~3 s import.
"""

from __future__ import annotations

import argparse
import json
import time
from pathlib import Path
from typing import Any

from bayesgate.attacks.methods.parameters import (
    ATTACK_PARAMETERS,
    AttackParameters,
    parameter_defaults,
)
from bayesgate.attacks.specs import (
    DEFAULT_ATTACKS,
    DETECTION_ATTACKS,
    attack_of,
    build_parameters,
    parse_parameter_list,
    parse_parameters,
    spec_help,
    spec_needs,
)
from bayesgate.attacks.sweep_append import fit_to_earlier, print_notes
from bayesgate.errors import InvalidArgument, check_at_least, writable_dir, writable_file
from bayesgate.extras import Need
from bayesgate.models.device import (
    DEFAULT_DEVICE,
    DEVICE_CHOICES,
    add_threads_flag,
    pick_device,
    set_threads,
)
from bayesgate.models.mc.options import SCORE_NAMES
from bayesgate.models.store.bundled import READ_MODEL_HELP, ModelsToRead, model_to_read
from bayesgate.models.store.own_files import (
    check_distinct_models,
    check_split,
    refuse_model_file,
)
from bayesgate.outputs import note_replacing, write_text_atomically

FIGURES = ("6", "7", "detection")
PARAM_DEST = "attack_param_"
"""Namespace prefix of the attack-parameter flags of ``bayesgate attack``."""
DEFAULT_ATTACK = "fgs"
"""The attack of ``bayesgate attack`` given neither ``--attack`` nor ``--spec``."""


def register(sub: argparse._SubParsersAction) -> None:
    from bayesgate.attacks import detector_cli, evaluate_cli

    _register_attack(sub)
    _register_calibrate(sub)
    detector_cli.register(sub)
    _register_sweep(sub)
    evaluate_cli.register(sub)


def _common(p: argparse.ArgumentParser) -> None:
    p.add_argument("--seed", type=int, default=0, help="seed of dropout masks and random starts")
    p.add_argument("--batch-size", type=int, default=100, help="images per attack batch")
    p.add_argument("--device", default=DEFAULT_DEVICE, help=f"one of {', '.join(DEVICE_CHOICES)}")
    add_threads_flag(p)
    p.add_argument("--no-progress", action="store_true", help="no progress bars")


def _register_attack(sub: argparse._SubParsersAction) -> None:
    p = sub.add_parser("attack", help="craft adversarial MNIST images against a model (.npz)")
    p.add_argument("model", type=model_to_read, help=READ_MODEL_HELP)
    p.add_argument(
        "--attack",
        choices=tuple(ATTACK_PARAMETERS),
        default=None,  # None: not given (--spec may replace it); the attack is then DEFAULT_ATTACK
        help=f"the attack, its parameters below (default: {DEFAULT_ATTACK}; not with --spec)",
    )
    _attack_parameter_flags(p)
    p.add_argument(
        "--spec",
        default=None,
        help="the whole attack in one spec instead of --attack and its parameter flags, "
        "e.g. 'targeted:steps=40,target=0'",
    )
    p.add_argument("--split", choices=("test", "val"), default="test", help="MNIST split attacked")
    p.add_argument("--limit", type=int, default=None, help="first N images of the split")
    p.add_argument("--k", type=int, default=None, help="MC passes attacked (card k_attack)")
    p.add_argument("--k-eval", type=int, default=None, help="MC passes judging success (k_test)")
    p.add_argument("--out", type=Path, required=True, help="output .npz")
    p.add_argument("--save-clean", action="store_true", help="also store the clean images")
    _common(p)
    p.set_defaults(func=cmd_attack, needs=_attack_needs)


def _attack_parameter_flags(p: argparse.ArgumentParser) -> None:
    """``--<parameter>`` for every parameter of a registered attack (``eps_iter`` → ``--eps-iter``),
    its help naming the attacks that have it and their defaults."""
    users: dict[str, list[str]] = {}
    for name, cls in ATTACK_PARAMETERS.items():
        for key, default in parameter_defaults(cls).items():
            users.setdefault(key, []).append(f"{name} (default {default})")
    for key, used_by in users.items():
        p.add_argument(
            "--" + key.replace("_", "-"),
            dest=PARAM_DEST + key,
            default=None,
            metavar=key.upper(),
            help="parameter of " + ", ".join(used_by),
        )


def _register_calibrate(sub: argparse._SubParsersAction) -> None:

    p = sub.add_parser(
        "calibrate",
        help="set rejection thresholds on validation images, measure detection on attacks",
    )
    p.add_argument("model", type=Path, help="model directory (calibration.json is written there)")
    p.add_argument(
        "--score",
        choices=SCORE_NAMES,
        default="predictive_entropy",
        help="uncertainty score thresholded",
    )
    p.add_argument("--target-fpr", type=float, default=0.05, help="clean false-positive rate")
    p.add_argument("--k", type=int, default=None, help="MC passes of the scores (card k_test)")
    p.add_argument("--k-attack", type=int, default=None, help="MC passes attacked (k_attack)")
    p.add_argument(
        "--attacks",
        nargs="+",
        default=list(DEFAULT_ATTACKS),
        metavar="SPEC",
        help="attack specs NAME[:key=value,...] (default: %(default)s); attacks and their "
        f"parameters: {spec_help()}",
    )
    p.add_argument("--val-limit", type=int, default=None, help="first N validation images")
    p.add_argument("--test-limit", type=int, default=None, help="first N test images")
    p.add_argument("--no-report", action="store_true", help="skip calibration.md and plots")
    _common(p)
    p.set_defaults(func=cmd_calibrate, needs=_calibrate_needs)


def _register_sweep(sub: argparse._SubParsersAction) -> None:
    p = sub.add_parser("sweep", help="reproduce the paper's Figures 6-7 and the detection table")
    p.add_argument(
        "models",
        nargs="+",
        action=ModelsToRead,  # resolved; args.models_given: as typed, for the errors
        help="model directories, or bundled models' names (bayesgate-robust, bayesgate-cnn)",
    )
    p.add_argument(
        "--figure", choices=FIGURES, required=True, help="6, 7 (the paper's) or the detection table"
    )
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
    p.add_argument(
        "--slow-limit",
        "--cw-limit",
        dest="cw_limit",
        type=int,
        default=100,
        help="detection: images the slow attacks (CW) attack",
    )
    p.add_argument(
        "--attacks", nargs="+", default=None, metavar="SPEC", help="detection: attack specs"
    )
    p.add_argument(
        "--out",
        type=Path,
        default=None,  # sweep_out(): a folder of the current directory named for the figure
        help="output directory (default: sweep-figure6, sweep-figure7 or sweep-detection in the "
        "current directory, by --figure)",
    )
    p.add_argument(
        "--append",
        action="store_true",
        help="merge with the results already in --out (same settings; a model run again, by "
        "directory or weights, replaced; another with an earlier model's label told apart)",
    )
    _common(p)
    p.set_defaults(func=cmd_sweep, needs=_sweep_needs)


PLOT = "matplotlib"


def _attack_needs(args: argparse.Namespace) -> list[Need]:
    return spec_needs([_attack_spec(args)])


def _calibrate_needs(args: argparse.Namespace) -> list[Need]:
    report = [] if args.no_report else [Need(PLOT, "the report (its plots; --no-report skips it)")]
    return spec_needs(args.attacks) + report


def _sweep_needs(args: argparse.Namespace) -> list[Need]:
    specs = {"6": ["fgs"], "7": ["targeted"]}.get(args.figure, args.attacks or DETECTION_ATTACKS)
    return [*spec_needs(specs), Need(PLOT, f"--figure {args.figure}'s plot")]


def _parameter_flags(args: argparse.Namespace) -> dict[str, str]:
    """``{parameter: value}`` of the attack-parameter flags the user gave (default None: not
    given)."""
    return {
        key[len(PARAM_DEST) :]: value
        for key, value in vars(args).items()
        if key.startswith(PARAM_DEST) and value is not None
    }


def _attack_spec(args: argparse.Namespace) -> str:
    """``--spec``, else ``--attack`` (default :data:`DEFAULT_ATTACK`). ``--spec`` is the whole
    attack: with ``--attack`` or a parameter flag it is an error naming them, never a flag
    silently ignored."""
    if args.spec is None:
        return args.attack or DEFAULT_ATTACK
    given = (["attack"] if args.attack is not None else []) + list(_parameter_flags(args))
    if given:
        flags = ", ".join("--" + key.replace("_", "-") for key in given)
        raise InvalidArgument(
            f"--spec cannot be combined with {flags}: the spec is the whole attack, "
            "its parameters included (e.g. --spec pgd:eps=0.1,steps=40); give one form"
        )
    return args.spec


def _attack_parameters(args: argparse.Namespace) -> AttackParameters:
    """The attack of ``bayesgate attack``, checked (without torch): ``--spec``, else ``--attack``
    with the parameter flags given (a flag the attack does not have is an error naming its
    parameters)."""
    spec = _attack_spec(args)
    if args.spec is not None:
        return parse_parameters(spec)
    return build_parameters(spec, _parameter_flags(args))


def cmd_attack(args: argparse.Namespace) -> int:
    parameters = _attack_parameters(args)
    for name in ("k", "k_eval", "limit", "batch_size"):
        check_at_least("--" + name.replace("_", "-"), getattr(args, name))
    writable_file(args.out, "--out", ".npz")  # before the attack, not after it
    refuse_model_file(args.out, args.model, "--out")  # a link named .npz to the weights, say
    set_threads(args.threads)  # imports torch: after the checks above
    note_replacing("attack", [args.out])
    from bayesgate.attacks.run import run_attack  # torch: after the checks above
    from bayesgate.models.data.mnist import load_mnist
    from bayesgate.models.store.directory import load_model

    attack = attack_of(parameters)
    device = pick_device(args.device)
    loaded = load_model(args.model, device)
    check_split(args.split, loaded.card.name, loaded.card.training.val_size, "attack")
    k = args.k or loaded.card.inference.k_attack
    k_eval = args.k_eval or loaded.card.inference.k_test
    x, y = load_mnist(args.split, val_size=loaded.card.training.val_size, limit=args.limit)
    t0 = time.perf_counter()
    outcome = run_attack(
        loaded.network,
        x,
        y,
        attack,
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
    for name in ("k", "k_attack", "val_limit", "test_limit", "batch_size"):
        check_at_least("--" + name.replace("_", "-"), getattr(args, name))
    parse_parameter_list(args.attacks)  # a bad spec is refused now, not after the model loads
    writable_dir(args.model, "MODEL")  # calibration.json and the report go there, at the end
    set_threads(args.threads)
    from bayesgate.attacks.calibrate import calibrate  # torch: after the checks above
    from bayesgate.attacks.detector_cli import detector_reference
    from bayesgate.models.store.calibration import write_calibration
    from bayesgate.models.store.directory import load_model

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
    run.calibration.detector = detector_reference(args.model, loaded.card.weights_sha256)
    path = write_calibration(run.calibration, args.model)
    outputs = {"calibration": str(path)}
    if not args.no_report:
        from bayesgate.attacks.report import write_report  # matplotlib: only for the report

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


def sweep_stem(figure: str) -> str:
    """The file stem of a figure's outputs: ``figure6``, ``figure7``, ``detection``."""
    return "detection" if figure == "detection" else f"figure{figure}"


def sweep_out(args: argparse.Namespace) -> Path:
    """``--out``, else ``sweep-<stem>`` in the current directory: never the repository's
    ``docs/attacks``, whose committed results a default there overwrote."""
    return args.out if args.out is not None else Path(f"sweep-{sweep_stem(args.figure)}")


def cmd_sweep(args: argparse.Namespace) -> int:
    for name in ("k", "k_eval", "limit", "batch_size", "steps"):
        check_at_least("--" + name.replace("_", "-"), getattr(args, name))
    check_at_least("--slow-limit", args.cw_limit)  # 0 read as no limit, −1 as all but one
    if args.figure == "detection":  # figures 6 and 7 take no --attacks
        parse_parameter_list(args.attacks or DETECTION_ATTACKS)
    # one row, line and file each: not one model twice (named as given)
    check_distinct_models(args.models, getattr(args, "models_given", None))
    args.out = sweep_out(args)
    writable_dir(args.out, "--out")
    set_threads(args.threads)  # recorded as torch_threads; imports torch, after the checks
    import torch  # after the checks above

    from bayesgate.attacks import sweep
    from bayesgate.models.store.directory import load_model

    device = pick_device(args.device)
    models = [load_model(d, device) for d in args.models]
    infos = sweep.describe_models(models)  # labels and names told apart where they clash
    stem = sweep_stem(args.figure)
    path = args.out / f"{stem}.json"
    earlier = json.loads(path.read_text()) if args.append and path.is_file() else None
    if earlier is None:  # --append merges into them: replacing is what was asked for
        note_replacing("sweep", _sweep_files(args.out, args.figure, infos))
    else:  # the earlier run's models keep their labels; a model that is one of them replaces it
        infos, notes = fit_to_earlier(infos, earlier.get("models", []))
        print_notes(notes)
    x, y = _sweep_images(args.figure, args.limit)
    config: dict[str, Any] = {}
    rows: list[dict[str, Any]] = []
    seconds: dict[str, float] = {}  # per model (the figure functions run one model at a time)
    for loaded, info in zip(models, infos, strict=True):
        t0 = time.perf_counter()
        config, model_rows = _run_sweep(args, [loaded], [info], x, y, device)
        rows += model_rows
        seconds[info["name"]] = round(time.perf_counter() - t0, 1)
    meta = {
        **config,
        "models": infos,
        "seconds": seconds,
        "torch_threads": torch.get_num_threads(),
    }
    if earlier is not None:
        meta, rows = _merge_sweep(earlier, meta, rows, config, path)
    _write_sweep(args.out, stem, args.figure, meta, rows)
    summary = {k: v for k, v in meta.items() if k != "models"}
    print(json.dumps(summary, indent=2, ensure_ascii=False))
    return 0


def _sweep_files(out: Path, figure: str, infos: list[dict[str, Any]]) -> list[Path]:
    """The files a sweep writes into ``out`` (:func:`_write_sweep`, the detection ROC plots);
    ``infos``: the models' :func:`bayesgate.attacks.sweep.describe_models`."""
    stem = sweep_stem(figure)
    files = [out / f"{stem}.{ext}" for ext in ("csv", "json", "md")]
    if figure == "detection":
        return files + [out / f"detection_roc_{d['name']}.png" for d in infos]
    return [*files, out / f"{stem}.png"]


def _sweep_images(figure: str, limit: int) -> tuple[Any, Any]:
    """The first ``limit`` test images (figure 7: the first ``limit`` that are not a 0)."""
    import torch

    from bayesgate.models.data.mnist import load_mnist

    x, y = load_mnist("test")
    if figure == "7":
        keep = torch.nonzero(y != 0).squeeze(1)[:limit]
        return x[keep], y[keep]
    return x[:limit], y[:limit]


def _run_sweep(
    args: argparse.Namespace,
    models: list[Any],
    infos: list[dict[str, Any]],
    x: Any,
    y: Any,
    device: Any,
) -> tuple[dict[str, Any], list[dict[str, Any]]]:
    """The figure's rows, and the settings that ``--append`` requires to match; ``infos``: the
    models' labels (of :func:`bayesgate.attacks.sweep.describe_models` of all the models given)."""
    from bayesgate.attacks import sweep

    k_eval = args.k_eval or (100 if args.figure == "detection" else 10)
    common = {
        "seed": args.seed,
        "batch_size": args.batch_size,
        "device": device,
        "progress": not args.no_progress,
        "k": args.k,
        "k_eval": k_eval,
        "infos": infos,
    }
    config: dict[str, Any] = {
        "figure": args.figure,
        "images": int(x.shape[0]),
        "k": args.k,
        "k_eval": k_eval,
        "seed": args.seed,
    }
    if args.figure == "6":
        return config, sweep.figure6(models, x, y, **common)
    if args.figure == "7":
        config.update(eta=args.eta, steps=args.steps, target=0)
        return config, sweep.figure7(models, x, y, steps=args.steps, eta=args.eta, **common)
    config.update(cw_limit=args.cw_limit, attacks=args.attacks or list(DETECTION_ATTACKS))
    rows = sweep.detection(
        models, x, y, attacks=config["attacks"], cw_limit=args.cw_limit, roc_dir=args.out, **common
    )
    return config, rows


def _merge_sweep(
    old: dict[str, Any],
    meta: dict[str, Any],
    rows: list[dict[str, Any]],
    config: dict[str, Any],
    path: Path,
) -> tuple[dict[str, Any], list[dict[str, Any]]]:
    """Add this run's models to an earlier run's results (same configuration required);
    rows of a model that is run again are replaced (``meta``'s models: fitted to the earlier
    ones by :func:`~bayesgate.attacks.sweep_append.fit_to_earlier`, a name each)."""
    differ = [k for k, v in config.items() if old.get(k) != v]
    if differ:
        raise InvalidArgument(
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
    """``<stem>.csv``, ``<stem>.json`` and a Markdown table, plus the figure's PNG."""
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
        write_text_atomically(out / "figure6.md", sweep.curve_table(rows, *sweep.FIGURE6_TABLE))
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
        write_text_atomically(out / "figure7.md", sweep.curve_table(rows, *sweep.FIGURE7_TABLE))
    else:
        write_text_atomically(out / "detection.md", sweep.detection_table(rows))
    sweep.write_csv(rows, out / f"{stem}.csv")
    text = json.dumps({**meta, "rows": rows}, indent=2, ensure_ascii=False)
    write_text_atomically(out / f"{stem}.json", text + "\n")
