"""``bayesgate train`` and ``bayesgate evaluate``.

Building their parsers, and checking the flags ``train`` refuses before any work, imports no
torch, so ``--help`` and a refused flag answer in a fraction of a second instead of after torch's
~3 s import: the choices and defaults the parsers show — the presets, losses, optimisers,
learning-rate schedules, BBB sampling modes and the validation size — and the settings ``train``
checks come from torch-free modules (:mod:`~bayesgate.models.networks.presets`,
:mod:`~bayesgate.models.training.config`, :mod:`~bayesgate.models.training.adversarial_config`,
:mod:`~bayesgate.models.data.splits`, :mod:`~bayesgate.models.store.files`); the networks, the
trainer and the model store (all torch) are imported inside the functions that run the commands.
"""

from __future__ import annotations

import argparse
import json
import shlex
import sys
from pathlib import Path
from typing import TYPE_CHECKING, Any

from bayesgate.errors import (
    InvalidArgument,
    ModelStoreError,
    check_at_least,
    writable_dir,
    writable_file,
)
from bayesgate.models import adversarial_cli
from bayesgate.models.data.splits import DEFAULT_VAL_SIZE
from bayesgate.models.device import (
    DEFAULT_DEVICE,
    DEVICE_CHOICES,
    add_threads_flag,
    pick_device,
    set_threads,
)
from bayesgate.models.networks.presets import SAMPLING_MODES, preset_architecture, preset_names
from bayesgate.models.store import bundled
from bayesgate.models.store.bundled import READ_MODEL_HELP, resolve_model_dir
from bayesgate.models.store.files import (
    CALIBRATION_FILE,
    CARD_FILE,
    DETECTOR_JSON,
    DETECTOR_TENSORS,
    HIST_FILE,
    REPORT_FILE,
    ROC_FILE,
)
from bayesgate.models.store.names import served_name_problem
from bayesgate.models.store.own_files import check_split, refuse_model_file
from bayesgate.models.training.config import LOSSES, LR_SCHEDULES, OPTIMIZERS, TrainConfig
from bayesgate.models.training.init_from import init_source, load_init_weights

if TYPE_CHECKING:
    import torch

    from bayesgate.models.store.card import ModelCard
    from bayesgate.models.store.directory import LoadedModel
    from bayesgate.models.training.adversarial_config import AdversarialConfig
    from bayesgate.models.training.checkpoint import Checkpointing
    from bayesgate.models.training.train import TrainResult

STALE_FILES = (
    CALIBRATION_FILE,
    REPORT_FILE,
    ROC_FILE,
    HIST_FILE,
    DETECTOR_JSON,
    DETECTOR_TENSORS,
)
"""What ``calibrate`` and ``fit-detector`` write beside the weights: they belong to those weights,
so ``train --force`` removes them when it replaces the model."""


# The trainer and the model loader stay names of this module, which the commands call (and tests
# replace, to see that a refused command never reaches them), imported on the first call (torch).


def train(*args: Any, **kwargs: Any) -> TrainResult:
    """:func:`bayesgate.models.training.train.train`, imported on the first call (torch)."""
    from bayesgate.models.training.train import train

    return train(*args, **kwargs)


def load_model(*args: Any, **kwargs: Any) -> LoadedModel:
    """:func:`bayesgate.models.store.directory.load_model`, imported on the first call (torch)."""
    from bayesgate.models.store.directory import load_model

    return load_model(*args, **kwargs)


def register(sub: argparse._SubParsersAction) -> None:
    _add_train_parser(sub)
    _add_evaluate_parser(sub)


def _add_train_parser(sub: argparse._SubParsersAction) -> None:
    p = sub.add_parser(
        "train", help="train a dropout or Bayes-by-Backprop network on MNIST (BB-α or ELBO)"
    )
    _network_flags(p)
    _optimisation_flags(p)
    _run_flags(p)
    p.add_argument("--no-progress", action="store_true", help="no progress bars")
    adversarial_cli.add_arguments(p)
    p.set_defaults(
        func=cmd_train,
        on_interrupt="every finished epoch is in the checkpoint: run the same command with "
        "--resume to continue from the last one",
    )


def _network_flags(p: argparse.ArgumentParser) -> None:
    """The network and its objective: preset, α, loss, BBB options."""
    d = TrainConfig()  # the defaults of the flags that set its fields
    p.add_argument(
        "--preset",
        default="mlp-2x100",
        choices=preset_names(bbb=True),
        help="network preset (default %(default)s); bbb-* = Bayes-by-Backprop CNNs",
    )
    p.add_argument(
        "--alpha",
        type=float,
        default=None,  # None: by --loss, TrainConfig's α or 0 (_resolve_alpha)
        help=f"BB-α α; 0 = VI (default {d.alpha:g} for --loss bbalpha, 0 for --loss elbo)",
    )
    p.add_argument(
        "--loss",
        choices=LOSSES,
        default=d.loss,
        help="bbalpha, or elbo (= α 0; for bbb-* presets NLL·N + β·KL) (default %(default)s)",
    )
    p.add_argument(
        "--beta-schedule",
        default=d.beta_schedule,
        help="bbb-* only: KL weight per minibatch, blundell (2^(M-i)/(2^M-1)), uniform (1/M) "
        f"or a constant number (default {d.beta_schedule})",
    )
    p.add_argument(
        "--sampling",
        choices=SAMPLING_MODES,
        default=None,
        help="bbb-* only: local reparameterisation or weight sampling (default: the preset's)",
    )


def _optimisation_flags(p: argparse.ArgumentParser) -> None:
    """MC samples, epochs, optimiser, learning rate and its schedule, regularisation."""
    d = TrainConfig()  # the defaults of the flags that set its fields
    p.add_argument(
        "--k-train",
        type=int,
        default=d.k_train,
        help="MC samples per training example (default %(default)s)",
    )
    p.add_argument("--epochs", type=int, default=d.epochs, help="passes over the training images")
    p.add_argument(
        "--k-val",
        type=int,
        default=d.k_val,
        help="MC samples of the per-epoch validation (default %(default)s)",
    )
    p.add_argument(
        "--batch-size", type=int, default=d.batch_size, help="training images per minibatch"
    )
    p.add_argument("--optimizer", choices=OPTIMIZERS, default=d.optimizer, help="optimiser")
    p.add_argument("--lr", type=float, default=d.lr, help="learning rate")
    p.add_argument(
        "--momentum",
        type=float,
        default=d.momentum,
        help=f"--optimizer sgd only: momentum (default {d.momentum:g}; Li & Gal's Keras "
        "code: plain SGD, 0)",
    )
    p.add_argument(
        "--lr-schedule",
        choices=LR_SCHEDULES,
        default=d.lr_schedule,
        help="constant, or cosine annealing to 0 over the run (per minibatch)",
    )
    p.add_argument(
        "--weight-decay", type=float, default=d.weight_decay, help="λ of λ·Σ‖W‖² (paper: 1e-6)"
    )
    p.add_argument("--p", type=float, default=None, help="dropout rate (default: the preset's)")
    p.add_argument(
        "--seed",
        type=int,
        default=d.seed,
        help="seed of the initial weights, minibatches and masks",
    )
    p.add_argument(
        "--patience", type=int, default=d.patience, help="early stopping on validation LL; 0 = off"
    )
    p.add_argument(
        "--keep-best",
        action="store_true",  # False: TrainConfig's keep_best (tests/models/test_cli_defaults.py)
        help="train every epoch but end with the weights of the best validation LL "
        "(kept in the checkpoint too)",
    )


def _run_flags(p: argparse.ArgumentParser) -> None:
    """Data, device, output and checkpoint of the run."""
    p.add_argument(
        "--val-size",
        type=int,
        default=DEFAULT_VAL_SIZE,
        help="validation images held out of the 60k (default %(default)s)",
    )
    p.add_argument(
        "--limit", type=int, default=None, help="train on the first N training images only"
    )
    p.add_argument("--device", default=DEFAULT_DEVICE, help=f"one of {', '.join(DEVICE_CHOICES)}")
    p.add_argument("--name", default=None, help="model name (default: preset-alphaA)")
    p.add_argument("--out", type=Path, default=None, help="model directory (default runs/NAME)")
    p.add_argument(
        "--force",
        action="store_true",
        help="replace the model already in --out, removing its calibration and detector files "
        "(they belong to the old weights)",
    )
    p.add_argument(
        "--checkpoint-dir",
        type=Path,
        default=None,
        help="checkpoint written after every epoch (default "
        "$XDG_CACHE_HOME/bayesgate/checkpoints/NAME, i.e. ~/.cache/bayesgate/checkpoints/NAME)",
    )
    p.add_argument(
        "--resume",
        action="store_true",
        help="continue from the checkpoint (same settings; --epochs may grow with a constant "
        "lr; with --keep-best, --patience may change: it only decides when to stop)",
    )
    p.add_argument(
        "--init-from",
        type=Path,
        default=None,
        metavar="MODEL",
        help="start from this model's weights (a directory or bundled name, e.g. "
        "bayesgate-robust): fine-tuning; its architecture must be the preset's",
    )
    add_threads_flag(p)


def _add_evaluate_parser(sub: argparse._SubParsersAction) -> None:
    e = sub.add_parser(
        "evaluate", help="test-set accuracy, log-likelihood, NLL, Brier, ECE of a model"
    )
    e.add_argument("model", type=Path, help=READ_MODEL_HELP + " (a directory with --write-card)")
    e.add_argument(
        "--k", type=int, default=100, help="MC samples (default %(default)s, as in the paper)"
    )
    e.add_argument(
        "--split", default="test", choices=["test", "val", "train"], help="MNIST split evaluated"
    )
    e.add_argument("--limit", type=int, default=None, help="first N images of the split only")
    e.add_argument("--batch-size", type=int, default=500, help="images per MC batch")
    e.add_argument("--seed", type=int, default=0, help="seed of the dropout masks")
    e.add_argument("--device", default=DEFAULT_DEVICE, help=f"one of {', '.join(DEVICE_CHOICES)}")
    add_threads_flag(e)
    e.add_argument("--write-card", action="store_true", help="store the metrics in the model card")
    e.add_argument("--json", type=Path, default=None, help="also write the metrics to this file")
    e.add_argument("--no-progress", action="store_true", help="no progress bars")
    e.set_defaults(func=cmd_evaluate)


def cmd_train(args: argparse.Namespace) -> int:
    # the settings first: a value they refuse costs no torch import
    config = _train_config(args)
    check_at_least("--limit", args.limit)
    adversarial_cli.check_arguments(args)
    if (args.patience or args.keep_best) and not args.val_size:
        flag = "--patience" if args.patience else "--keep-best"
        raise InvalidArgument(
            f"{flag} needs validation data: it watches the validation "
            "log-likelihood, and --val-size 0 holds none out"
        )
    arch = _architecture(args)
    adversarial = adversarial_cli.adversarial_config(args, config.alpha)
    init = None if args.init_from is None else init_source(args.init_from, arch, args.preset)
    suffix = "elbo" if args.loss == "elbo" else f"alpha{config.alpha:g}"
    name = args.name or (f"{args.preset}" if not arch["stochastic"] else f"{args.preset}-{suffix}")
    if (problem := served_name_problem(name)) is not None:  # `serve` would refuse the model
        raise InvalidArgument(f"--name: {problem}")
    out = args.out or Path("runs") / name
    # where the run writes, checked before the training (not after it), and before torch loads
    writable_dir(out, "--out")
    writable_dir(Path(_checkpoint_dir(args, name)), "--checkpoint-dir")
    if args.epoch_log is not None:
        writable_file(args.epoch_log, "--epoch-log")
    set_threads(args.threads)
    device = pick_device(args.device)
    import torch

    from bayesgate.models.data.mnist import load_mnist
    from bayesgate.models.networks.registry import build_network
    from bayesgate.models.store.directory import save_model
    from bayesgate.models.training import outputs as run_outputs
    from bayesgate.models.training.checkpoint import STATE_FILE, finished_run_in

    checkpointing = _checkpointing(args, name, arch, adversarial, init)
    # --resume with this run's checkpoint continues the run that wrote --out (same name):
    # writing its model there again is the point; anything else needs --force
    held = (out / CARD_FILE).is_file()
    old_card = readable_card(out) if held else None
    checkpoint_dir = Path(checkpointing.directory)
    has_checkpoint = (checkpoint_dir / STATE_FILE).is_file()
    continuing = args.resume and has_checkpoint and old_card is not None and old_card.name == name
    if continuing and not args.force:
        assert old_card is not None
        _check_run_wrote(checkpoint_dir, out, old_card.weights_sha256)
    check_out(out, args.force or continuing)
    # the weights the files in --out belong to ("": a card that does not read: another model's)
    old_sha = None if not held else old_card.weights_sha256 if old_card is not None else ""
    train_data = load_mnist("train", val_size=args.val_size, limit=args.limit)
    val_data = load_mnist("val", val_size=args.val_size) if args.val_size else None
    torch.manual_seed(args.seed)  # the initial weights, too, follow --seed
    model = build_network(arch)
    if init is not None:  # a resumed run's checkpoint replaces these weights with its own
        load_init_weights(model, init)
    print(f"training {name} on {train_data[0].shape[0]} images, device {device}, checkpoint "
          f"{checkpointing.directory}", file=sys.stderr)  # fmt: skip
    if args.resume and not (Path(checkpointing.directory) / STATE_FILE).is_file():
        # not an error: a long run is launched with --resume every time (bench/long_runs.py)
        print(f"--resume: no checkpoint in {checkpointing.directory} yet; starting at epoch 1",
              file=sys.stderr)  # fmt: skip
    if not has_checkpoint:
        run_outputs.start(checkpoint_dir)  # a new run: nothing written by it yet
    transform, on_epoch = _epoch_hooks(
        args, model, adversarial, config, (train_data, val_data), device, checkpointing
    )
    if not args.resume and has_checkpoint and finished_run_in(checkpoint_dir):
        # a new run over a finished one (train() refuses an unfinished one): once its first
        # epoch's checkpoint replaces the old run's, what the old run wrote is not its own
        on_epoch = run_outputs.starting_at_first_epoch(checkpoint_dir, on_epoch)
    result = train(
        model,
        train_data,
        val_data,
        config,
        device=device,
        progress=not args.no_progress,
        on_epoch=on_epoch,
        checkpointing=checkpointing,
        batch_transform=transform,
    )
    card = _model_card(name, arch, config, args, result, int(train_data[0].shape[0]), device)
    if init is not None:
        card.training.init_from = init
    card.training.command = command_line(args, omit=("force",))
    card = save_model(model, card, out)
    if old_sha is not None and old_sha != card.weights_sha256:
        # the old weights' calibration and detector no longer describe this model
        remove_stale_files(out, "--force" if args.force else "--resume")
    # a run that did not continue this checkpoint replaced it: forget what the old run wrote
    fresh = not (args.resume and has_checkpoint)
    run_outputs.record(checkpoint_dir, out, card.weights_sha256, replace=fresh)
    print(json.dumps({"model": str(out), "val": result.val_metrics}, indent=2))
    return 0


def _check_run_wrote(checkpoint_dir: Path, out: Path, weights_sha256: str) -> None:
    """``--resume`` into an ``--out`` holding a model of the same name: refuse (one line) unless
    the checkpoint's run wrote that model there (:mod:`~bayesgate.models.training.outputs`);
    a checkpoint that keeps no record (older than the record) is trusted, with a note."""
    from bayesgate.models.training import outputs as run_outputs

    wrote = run_outputs.wrote(checkpoint_dir, out, weights_sha256)
    if wrote is None:
        print(f"--resume: the checkpoint in {checkpoint_dir} keeps no record of the models it "
              f"wrote (older than that record); trusting that it wrote {out}",
              file=sys.stderr)  # fmt: skip
        return
    if not wrote:
        elsewhere = ", ".join(run_outputs.written(checkpoint_dir)) or "none yet"
        raise InvalidArgument(
            f"--resume: the model in --out {out} was not written by the run of the checkpoint "
            f"in {checkpoint_dir} (that run wrote: {elsewhere}); resuming would replace it and "
            "remove its calibration and detector: give the --out that run wrote, another "
            "--checkpoint-dir, or --force to replace the model"
        )


def check_out(out: Path, force: bool) -> None:
    """Refuse (one line) an output directory that already holds a model, unless ``force``: its
    calibration and detector would stay beside weights they were not made for."""
    if (out / CARD_FILE).is_file() and not force:
        raise InvalidArgument(
            f"--out {out} already holds a model ({CARD_FILE}); its calibration and detector "
            "files would no longer match the new weights: choose another --out, --resume to "
            "continue the run that wrote it (its checkpoint), or --force to replace the model "
            "(new weights then remove them)"
        )


def readable_card(out: Path) -> ModelCard | None:
    """``out``'s model card, or None when it does not read."""
    from bayesgate.models.store.directory import read_card

    try:
        return read_card(out)
    except ModelStoreError:
        return None


def remove_stale_files(out: Path, flag: str = "--force") -> list[str]:
    """Delete the files of :data:`STALE_FILES` in ``out`` (before new weights are written there)
    and say on stderr which were removed (naming ``flag``, the option that allowed it); returns
    their names."""
    removed = [name for name in STALE_FILES if (out / name).is_file()]
    for name in removed:
        (out / name).unlink()
    if removed:
        print(f"{flag}: removed from {out}, made for the old weights: {', '.join(removed)}",
              file=sys.stderr)  # fmt: skip
    return removed


def _checkpoint_dir(args: argparse.Namespace, name: str) -> Path:
    """The run's checkpoint folder: ``--checkpoint-dir``, else the user cache's folder for
    ``name``."""
    return args.checkpoint_dir or checkpoint_root() / name


def _checkpointing(
    args: argparse.Namespace,
    name: str,
    arch: dict[str, Any],
    adversarial: AdversarialConfig | None,
    init: dict[str, str] | None = None,
) -> Checkpointing:
    """Where the per-epoch checkpoint goes, and the settings a resumed run must match (the
    starting weights only when ``--init-from`` gave some: older checkpoints have no such key)."""
    from bayesgate.models.training.checkpoint import Checkpointing

    settings = {
        "preset": args.preset,
        "architecture": arch,
        "val_size": args.val_size,
        "limit": args.limit,
        "adversarial": adversarial.as_dict() if adversarial else None,
    }
    if init is not None:
        settings["init_from"] = init["weights_sha256"]
    return Checkpointing(
        directory=_checkpoint_dir(args, name), resume=args.resume, settings=settings
    )


def _epoch_hooks(
    args: argparse.Namespace,
    model: torch.nn.Module,
    adversarial: AdversarialConfig | None,
    config: TrainConfig,
    data: tuple[Any, Any],
    device: torch.device,
    checkpointing: Checkpointing,
) -> tuple[Any, adversarial_cli.EpochLog]:
    """The adversarial batch transform (None without ``--adversarial``) and the per-epoch log
    (with the clean/PGD accuracy of held-out monitor images when training adversarially)."""
    train_data, val_data = data
    transform = None
    if adversarial is not None:
        transform = adversarial_cli.batch_transform(
            adversarial, len(train_data[0]), config.batch_size, checkpointing.directory, args.resume
        )
    monitor = None
    if adversarial is not None and val_data is not None and adversarial.monitor_size:
        monitor = (val_data[0][: adversarial.monitor_size], val_data[1][: adversarial.monitor_size])
    on_epoch = adversarial_cli.EpochLog(
        model,
        adversarial,
        monitor,
        k=config.k_val,
        device=device,
        path=args.epoch_log,
        printer=lambda line: print(line, file=sys.stderr),
    )
    return transform, on_epoch


def command_line(
    args: argparse.Namespace, positional: tuple[str, ...] = (), omit: tuple[str, ...] = ()
) -> str:
    """The command as a re-runnable line with every option spelt out (defaults included), e.g.
    ``bayesgate evaluate DIR --k 100 --seed 0 …``; ``omit`` drops options that change no
    number (where the output goes)."""
    words = ["bayesgate", args.command, *(str(getattr(args, name)) for name in positional)]
    skip = {"command", "func", "no_progress", *positional, *omit}
    for key, value in vars(args).items():
        if key in skip or value is None or value is False:
            continue
        words.append("--" + key.replace("_", "-"))
        if value is not True:
            words.append(str(value))
    return shlex.join(words)


def _print_row(row: dict[str, float]) -> None:
    print(json.dumps({k: round(v, 5) for k, v in row.items()}), file=sys.stderr)


def checkpoint_root() -> Path:
    """``$XDG_CACHE_HOME/bayesgate/checkpoints`` (``~/.cache/…`` when unset or relative;
    ``mnist.cache_dir()``, read from the torch-free settings: train checks the folder before
    torch loads)."""
    from bayesgate.models.data.settings import data_settings

    return data_settings().cache_root / "checkpoints"


def _train_config(args: argparse.Namespace) -> TrainConfig:
    """The run's settings. A flag set to other than its default where it cannot apply
    (``--momentum`` without SGD, ``--beta-schedule`` without a bbb-* preset) is refused rather
    than recorded unused — a checkpoint would then refuse a later run over a setting that never
    mattered. Its default stays accepted everywhere: every card's recorded command names it."""
    default = TrainConfig()
    if args.momentum != default.momentum and args.optimizer != "sgd":
        raise InvalidArgument(
            f"--momentum applies to --optimizer sgd only, not {args.optimizer} (got "
            f"{args.momentum:g})"
        )
    bbb = "sampling" in preset_architecture(args.preset)
    if args.beta_schedule != default.beta_schedule and not bbb:
        raise InvalidArgument(
            f"--beta-schedule applies to the bbb-* presets only, not {args.preset} (got "
            f"{args.beta_schedule})"
        )
    return TrainConfig(
        alpha=_resolve_alpha(args.loss, args.alpha),
        k_train=args.k_train,
        epochs=args.epochs,
        batch_size=args.batch_size,
        optimizer=args.optimizer,
        lr=args.lr,
        momentum=args.momentum,
        lr_schedule=args.lr_schedule,
        weight_decay=args.weight_decay,
        seed=args.seed,
        patience=args.patience,
        keep_best=args.keep_best,
        k_val=args.k_val,
        loss=args.loss,
        beta_schedule=args.beta_schedule,
    )


def _architecture(args: argparse.Namespace) -> dict[str, Any]:
    """The preset's architecture with ``--p`` and (bbb-* presets only) ``--sampling`` applied."""
    arch = preset_architecture(args.preset, p=args.p)
    if args.sampling is not None:
        if "sampling" not in arch:
            raise InvalidArgument(
                f"--sampling applies to the bbb-* presets only, not {args.preset}"
            )
        arch["sampling"] = args.sampling
    return arch


def _model_card(
    name: str,
    arch: dict[str, Any],
    config: TrainConfig,
    args: argparse.Namespace,
    result: TrainResult,
    train_images: int,
    device: torch.device,
) -> ModelCard:
    from bayesgate.models.data.mnist import mnist_fingerprint
    from bayesgate.models.store.card import ModelCard

    card = ModelCard(
        name=name,
        architecture=arch,
        training={
            **vars(config),
            "k_train": config.k_train if arch["stochastic"] else 1,
            "data": "mnist",
            "train_images": train_images,
            "val_size": args.val_size,
            "data_sha256": mnist_fingerprint(),
            "epochs_run": len(result.history),
            "best_epoch": result.best_epoch,
            # training wall time of every epoch kept, over all sittings of a resumed run
            "seconds": round(sum(row["seconds"] for row in result.history), 1),
            "sitting_seconds": round(result.seconds, 1),  # this call, validation included
            "rows_per_second": round(result.samples_per_second, 1),
            "device": str(device),
        },
        metrics={"val": result.val_metrics},
    )
    if args.adversarial is not None:
        card.training.adversarial = adversarial_cli.adversarial_config(args, config.alpha).as_dict()
    return card


def cmd_evaluate(args: argparse.Namespace) -> int:
    for flag in ("k", "limit", "batch_size"):
        check_at_least("--" + flag.replace("_", "-"), getattr(args, flag))
    check_at_least("--seed", args.seed, minimum=0)
    if args.write_card:
        _check_card_writable(args)
    # a bundled model's name reads the bundled model; --write-card writes into a directory only
    model_dir = args.model if args.write_card else resolve_model_dir(args.model)
    if args.json:
        writable_file(args.json, "--json")
        refuse_model_file(args.json, model_dir, "--json")
    from bayesgate.models.data.mnist import load_mnist  # torch: after the checks above
    from bayesgate.models.mc.uncertainty import kwon_uncertainty
    from bayesgate.models.store.directory import write_card
    from bayesgate.models.training.evaluate import collect_mc, metrics_from_mc

    set_threads(args.threads)
    device = pick_device(args.device)
    loaded = load_model(model_dir, device)
    check_split(args.split, loaded.card.name, loaded.card.training.val_size, "evaluate on")
    x, y = load_mnist(args.split, val_size=loaded.card.training.val_size, limit=args.limit)
    probs, log_probs = collect_mc(
        loaded.network,
        x,
        args.k,
        device=device,
        batch_size=args.batch_size,
        seed=args.seed,
        progress=not args.no_progress,
    )
    metrics = metrics_from_mc(
        probs, log_probs, y.cpu()
    )  # = bayesgate.models.training.evaluate.evaluate
    aleatoric, epistemic = kwon_uncertainty(probs)
    metrics["mean_kwon_aleatoric"] = float(aleatoric.double().mean())
    metrics["mean_kwon_epistemic"] = float(epistemic.double().mean())
    report = {
        "model": loaded.card.name,
        "split": args.split,
        "images": int(x.shape[0]),
        "k": args.k,
        **metrics,
        "command": command_line(args, positional=("model",), omit=("json", "write_card")),
        "weights_sha256": loaded.card.weights_sha256,
        "stochastic": loaded.card.stochastic,
        "training": loaded.card.training.model_dump(mode="json"),
    }
    text = json.dumps(report, indent=2)
    print(text)
    if args.json:
        args.json.write_text(text + "\n")
    if args.write_card:
        loaded.card.metrics[args.split] = {"k": args.k, "images": int(x.shape[0]), **metrics}
        write_card(loaded.card, args.model)
    return 0


def _check_card_writable(args: argparse.Namespace) -> None:
    """Refuse ``--write-card`` where the card's metrics would not be the model's: with ``--limit``
    (a card's metrics are those of the whole split), or into a bundled model's directory (the
    package's models are not the user's to change; by name, :func:`read_card` says so)."""
    if args.limit is not None:
        raise InvalidArgument(
            f"--write-card with --limit {args.limit}: a card's metrics are those of the whole "
            f"{args.split} split; drop --limit, or --write-card (--json keeps the numbers)"
        )
    model = args.model.resolve()
    pretrained = bundled.BUNDLED_MODELS_DIR.resolve()
    if model.is_relative_to(pretrained):
        raise InvalidArgument(
            f"--write-card: {args.model} is a bundled model (in {bundled.BUNDLED_MODELS_DIR}); "
            "the package's models are not to be changed: evaluate a copy of your own"
        )


def _resolve_alpha(loss: str, alpha: float | None) -> float:
    """α of the run: 0 for the ELBO (another explicit α is a contradiction), else ``alpha`` or
    :class:`TrainConfig`'s default."""
    if loss == "elbo":
        if alpha not in (None, 0.0):
            raise InvalidArgument(f"--loss elbo is BB-α with α = 0; drop --alpha {alpha:g}")
        return 0.0
    return TrainConfig().alpha if alpha is None else alpha
