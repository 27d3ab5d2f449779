"""Sweeps reproducing Li & Gal (2017) Figures 6–7, and the detection table.

- :func:`figure6` — untargeted FGS with step size ``η``: accuracy and mean predictive entropy of
  the MC predictive on the attacked test images, per model, as ``η`` grows.
- :func:`figure7` — targeted iterative FGS towards class 0 on the non-zero test digits: accuracy,
  target-class rate and mean predictive entropy after each step ``t = 0…steps``.
- :func:`detection` — AUROC / TPR at 5 % FPR / FPR at 95 % TPR of every score, successful
  adversarial vs clean test images, per model and attack.

Each returns result rows (dicts); :func:`write_csv` stores them.
"""

from __future__ import annotations

import csv
import sys
import time
from collections.abc import Sequence
from pathlib import Path
from typing import IO, Any

import numpy as np
import torch

from bayesgate.attacks.methods import FGS, TargetedFGS
from bayesgate.attacks.pipeline import AttackResult, DetectionRun, detection_run
from bayesgate.attacks.run import mc_predictions, run_attack
from bayesgate.attacks.specs import DETECTION_ATTACKS, parse_attack
from bayesgate.models.mc.engine import mc_predict
from bayesgate.models.mc.uncertainty import mutual_information, predictive_entropy, predictive_mean
from bayesgate.models.store.directory import LoadedModel
from bayesgate.models.store.own_files import check_distinct_models
from bayesgate.outputs import write_atomically

FIGURE6_ETAS = tuple(round(0.05 * i, 2) for i in range(11))  # 0, 0.05, …, 0.5


_KINDS = {
    "dropout_mlp": "MLP",
    "dropout_cnn": "CNN",
    "dropout_cnn_wide": "wide CNN",  # cnn-wide: the bundled bayesgate-robust
    "bbb_lenet5": "BBB LeNet-5",
    "bbb_alexnet": "BBB AlexNet",
}


def describe(loaded: LoadedModel) -> dict[str, Any]:
    """Label and identity of a model: ``det`` for a deterministic net, else ``α=<alpha>``; a
    model exported with its last epoch's weights instead of its best-LL ones (``long_runs.py
    export --last`` names it ``NAME-last``) gets `` last`` appended, so both can share a figure."""
    card = loaded.card
    arch = card.architecture
    kind = _KINDS.get(arch.get("type", ""), str(arch.get("type", "net")))
    alpha = card.training.alpha
    if card.stochastic:
        label = f"{kind} α={alpha:g}" if alpha is not None else f"{kind} {card.name}"
    else:
        label = f"{kind} det"
    if card.name.endswith("-last"):
        label += " last"
    return {
        "model": label,
        "name": card.name,
        "alpha": alpha if card.stochastic else None,
        "stochastic": card.stochastic,
        "sha256": card.weights_sha256,
        "directory": str(loaded.directory.resolve()),  # which model it is, for sweep --append
    }


def describe_models(models: Sequence[LoadedModel]) -> list[dict[str, Any]]:
    """:func:`describe` of each model, made distinct, so that each model gets its own row, line
    and file: models that share a label (two MLPs trained with the same α, say) get their card's
    name appended to it in parentheses — ``MLP α=0.5 (mlp-2x32-alpha0.5)`` —, or where the names
    are equal too, their directory (its name, or as many of its path's last parts as tell them
    apart); models that share a card name (``name``: the rows' key, the ``seconds`` key, the
    ROC plot's file name) get ``-<directory>`` appended to it. A label or name no other model has
    is kept as it is. The same model directory given twice is an :class:`InvalidArgument`."""
    check_distinct_models([m.directory for m in models])
    infos = [describe(m) for m in models]
    # parts of each directory's absolute path: distinct, since no directory is there twice
    parts = [m.directory.resolve().parts for m in models]
    by_label = _clashes([info["model"] for info in infos])
    for group in by_label:
        cards = [models[i].card.name for i in group]
        suffixes = cards if len(set(cards)) == len(cards) else _path_tails(group, parts, "/")
        for i, suffix in zip(group, suffixes, strict=True):
            infos[i]["model"] = f"{infos[i]['model']} ({suffix})"
    for group in _clashes([info["name"] for info in infos]):
        for i, suffix in zip(group, _path_tails(group, parts, "-"), strict=True):
            infos[i]["name"] = f"{infos[i]['name']}-{suffix}"
    for key, sep in (("model", " #"), ("name", "-")):  # a suffixed one equal to another's own
        for group in _clashes([info[key] for info in infos]):
            for i in group:
                infos[i][key] = f"{infos[i][key]}{sep}{i + 1}"  # its place on the command line
    return infos


def _clashes(values: Sequence[str]) -> list[list[int]]:
    """The indices of each value that occurs more than once, in order of first occurrence."""
    groups: dict[str, list[int]] = {}
    for i, value in enumerate(values):
        groups.setdefault(value, []).append(i)
    return [group for group in groups.values() if len(group) > 1]


def _path_tails(group: Sequence[int], parts: Sequence[tuple[str, ...]], sep: str) -> list[str]:
    """The shortest tails of the paths (``parts``) of ``group`` that tell them apart: their
    directories' names, else their last two parts, and so on."""
    longest = max(len(parts[i]) for i in group)
    for depth in range(1, longest + 1):
        tails = [sep.join(parts[i][-depth:]) for i in group]
        if len(set(tails)) == len(tails):
            return tails
    return [sep.join(parts[i]) for i in group]  # not reached: the paths differ


def _infos(
    models: Sequence[LoadedModel], infos: Sequence[dict[str, Any]] | None
) -> Sequence[dict[str, Any]]:
    """``infos`` (one per model), else :func:`describe_models` of the models."""
    if infos is None:
        return describe_models(models)
    if len(infos) != len(models):
        raise ValueError(f"{len(infos)} model descriptions for {len(models)} models")
    return infos


def _log(progress: bool, message: str) -> None:
    if progress:
        print(message, file=sys.stderr, flush=True)


def figure6(
    models: Sequence[LoadedModel],
    x: torch.Tensor,
    y: torch.Tensor,
    *,
    etas: Sequence[float] = FIGURE6_ETAS,
    k: int = 10,
    k_eval: int = 10,
    seed: int = 0,
    batch_size: int = 100,
    device: torch.device | str = "cpu",
    progress: bool = False,
    infos: Sequence[dict[str, Any]] | None = None,
) -> list[dict[str, Any]]:
    """Rows ``(model, eta, accuracy, mean_entropy, mean_mi, success_rate)`` for untargeted FGS.

    ``infos``: the models' labels (:func:`describe_models` of all the models of a sweep run one
    at a time); by default :func:`describe_models` of ``models``."""
    rows = []
    for loaded, info in zip(models, _infos(models, infos), strict=True):
        t0 = time.perf_counter()
        clean_probs, clean_pred = mc_predictions(
            loaded.network, x, k_eval, device=device, seed=seed
        )
        for eta in etas:
            if eta == 0:
                probs, pred, rate = clean_probs, clean_pred, 0.0
            else:
                out = run_attack(
                    loaded.network,
                    x,
                    y,
                    FGS(eta=eta),
                    k=k,
                    k_eval=k_eval,
                    clean_pred=clean_pred,
                    batch_size=batch_size,
                    seed=seed,
                    device=device,
                    progress=progress,
                )
                probs, pred, rate = out.adv_probs, out.adv_pred, out.success_rate
            rows.append(
                {
                    "model": info["model"],
                    "eta": float(eta),
                    "accuracy": float((pred == y).double().mean()),
                    "mean_entropy": float(predictive_entropy(probs).double().mean()),
                    "mean_mi": float(mutual_information(probs).double().mean()),
                    "success_rate": rate,
                    "images": int(x.shape[0]),
                    "k": k,
                    "k_eval": k_eval,
                    "name": info["name"],
                }
            )
        _log(progress, f"figure 6: {info['model']} done in {time.perf_counter() - t0:.0f} s")
    return rows


class _StepStats:
    """Running sums per step of the targeted attack, filled by the step hook."""

    def __init__(
        self,
        model: torch.nn.Module,
        y: torch.Tensor,
        target: int,
        k_eval: int,
        steps: int,
        seed: int,
        device: torch.device,
    ) -> None:
        self.model, self.y, self.target, self.k_eval = model, y, target, k_eval
        self.generator = torch.Generator(device=device).manual_seed(seed)
        self.correct = np.zeros(steps + 1)
        self.on_target = np.zeros(steps + 1)
        self.entropy = np.zeros(steps + 1)
        self.mi = np.zeros(steps + 1)

    def __call__(self, t: int, x_t: torch.Tensor, rows: slice) -> None:
        probs = mc_predict(self.model, x_t, self.k_eval, generator=self.generator).probs.cpu()
        pred = predictive_mean(probs).argmax(dim=1)
        self.correct[t] += float((pred == self.y[rows]).sum())
        self.on_target[t] += float((pred == self.target).sum())
        self.entropy[t] += float(predictive_entropy(probs).double().sum())
        self.mi[t] += float(mutual_information(probs).double().sum())

    def rows(self, info: dict[str, Any], n: int, **settings: Any) -> list[dict[str, Any]]:
        """Figure 7 rows of one model, ``step = 0…steps``, rates over the ``n`` images."""
        return [
            {
                "model": info["model"],
                "step": t,
                "accuracy": self.correct[t] / n,
                "target_rate": self.on_target[t] / n,
                "mean_entropy": self.entropy[t] / n,
                "mean_mi": self.mi[t] / n,
                "images": n,
                **settings,
                "name": info["name"],
            }
            for t in range(len(self.correct))
        ]


def figure7(
    models: Sequence[LoadedModel],
    x: torch.Tensor,
    y: torch.Tensor,
    *,
    steps: int = 40,
    eta: float = 0.01,
    target: int = 0,
    k: int = 10,
    k_eval: int = 10,
    seed: int = 0,
    batch_size: int = 100,
    device: torch.device | str = "cpu",
    progress: bool = False,
    infos: Sequence[dict[str, Any]] | None = None,
) -> list[dict[str, Any]]:
    """Rows ``(model, step, accuracy, target_rate, mean_entropy, mean_mi)``, ``step = 0…steps``.

    ``x, y`` should hold only images whose label is not ``target`` (the paper attacks the
    non-zero digits towards 0); rates are over all of them. ``infos`` as for :func:`figure6`.
    """
    if bool((y == target).any()):
        raise ValueError(f"figure 7 attacks images of other classes than the target {target}")
    device = torch.device(device)
    rows = []
    attack = TargetedFGS(eta=eta, steps=steps, target=target)
    for loaded, info in zip(models, _infos(models, infos), strict=True):
        t0 = time.perf_counter()
        stats = _StepStats(loaded.network, y, target, k_eval, steps, seed, device)
        run_attack(
            loaded.network,
            x,
            y,
            attack,
            k=k,
            k_eval=k_eval,
            batch_size=batch_size,
            seed=seed,
            device=device,
            progress=progress,
            step_hook=stats,
        )
        rows += stats.rows(info, x.shape[0], eta=eta, k=k, k_eval=k_eval)
        _log(progress, f"figure 7: {info['model']} done in {time.perf_counter() - t0:.0f} s")
    return rows


def detection(
    models: Sequence[LoadedModel],
    x: torch.Tensor,
    y: torch.Tensor,
    *,
    attacks: Sequence[str] = DETECTION_ATTACKS,
    k: int = 10,
    k_eval: int = 100,
    cw_limit: int | None = 100,
    seed: int = 0,
    batch_size: int = 100,
    device: torch.device | str = "cpu",
    progress: bool = False,
    roc_dir: Path | None = None,
    infos: Sequence[dict[str, Any]] | None = None,
) -> list[dict[str, Any]]:
    """One row per (model, attack, score): AUROC, TPR at 5 % FPR, FPR at 95 % TPR, success rate.

    Negatives are all clean images of ``x``; positives the successful adversarial examples
    (:func:`bayesgate.attacks.pipeline.detection_run`). Deterministic models get
    predictive-entropy rows only (their MI and variation ratio are 0). Slow attacks (CW) attack
    only the first ``cw_limit`` images. With ``roc_dir``, an ROC plot per model is written there
    as ``detection_roc_<name>.png`` (``name``: of :func:`describe_models`, distinct). ``infos``
    as for :func:`figure6`.
    """
    parsed = [parse_attack(a) for a in attacks]
    rows = []
    for loaded, info in zip(models, _infos(models, infos), strict=True):
        t0 = time.perf_counter()
        run = detection_run(
            loaded.network,
            x,
            y,
            parsed,
            k_attack=k,
            k_eval=k_eval,
            slow_limit=cw_limit,
            seed=seed,
            batch_size=batch_size,
            device=device,
            progress=progress,
            log=lambda r, model=info["model"]: (
                f"detection: {model} {r.attack.label} "
                f"AUROC(H)={r.record['scores']['predictive_entropy']['auroc']}"
            ),
        )
        # K identical passes: MI and variation ratio are 0 up to round-off, ranking them is noise
        kept = tuple(run.clean.scores) if info["stochastic"] else ("predictive_entropy",)
        clean_accuracy = float((run.clean.pred == y).double().mean())
        for result in run.results:
            rows += _detection_rows(info, result, kept, clean_accuracy, k, k_eval)
        if roc_dir is not None:
            _detection_roc(info, run, kept, Path(roc_dir))
        _log(progress, f"detection: {info['model']} done in {time.perf_counter() - t0:.0f} s")
    return rows


def _detection_rows(
    info: dict[str, Any],
    result: AttackResult,
    kept: Sequence[str],
    clean_accuracy: float,
    k: int,
    k_eval: int,
) -> list[dict[str, Any]]:
    """The rows of one attack on one model, one per score in ``kept``."""
    record = result.record
    return [
        {
            "model": info["model"],
            "attack": result.attack.label,
            "score": score,
            "auroc": m["auroc"],
            "tpr_at_5fpr": m["tpr_at_5fpr"],
            "fpr_at_95tpr": m["fpr_at_95tpr"],
            "success_rate": record["success_rate"],
            "successful": record["successful"],
            "eligible": record["eligible"],
            "attacked_images": record["images"],
            "clean_images": m["n_clean"],
            "clean_accuracy": clean_accuracy,
            "adversarial_accuracy": record["adversarial_accuracy"],
            "mean_clean": m["mean_clean"],
            "mean_adversarial": m["mean_adversarial"],
            "mean_linf": record["mean_linf_success"],
            "mean_l2": record["mean_l2_success"],
            "k": k,
            "k_eval": k_eval,
            "attack_key": result.attack.key,
            "name": info["name"],
        }
        for score, m in record["scores"].items()
        if score in kept
    ]


def _detection_roc(info: dict[str, Any], run: DetectionRun, kept: Sequence[str], out: Path) -> None:
    from bayesgate.attacks.plots import roc_plot

    roc_plot(
        run.clean.scores,
        run.adversarial_scores,
        out / f"detection_roc_{info['name']}.png",
        scores=kept,
        title=f"{info['model']} ({info['name']}): successful adversarial vs clean",
    )


def detection_table(
    rows: Sequence[dict[str, Any]],
    scores: Sequence[str] = ("predictive_entropy", "mutual_information"),
) -> str:
    """Markdown table, one line per (attack, model): success rate, number of successful
    examples (the positives), then AUROC and TPR at 5 % FPR of each score (``–`` where a model
    has no such score, e.g. the MI of a deterministic net)."""
    short = {"predictive_entropy": "H", "mutual_information": "MI", "variation_ratio": "VR"}
    models = list(dict.fromkeys(r["model"] for r in rows))
    attacks = list(dict.fromkeys(r["attack"] for r in rows))
    index = {(r["model"], r["attack"], r["score"]): r for r in rows}
    header = ["attack", "model", "success", "n adv"]
    header += [f"AUROC {short.get(s, s)}" for s in scores]
    header += [f"TPR@5%FPR {short.get(s, s)}" for s in scores]
    lines = ["| " + " | ".join(header) + " |", "|" + "---|" * len(header)]

    def num(v: Any) -> str:
        return "n/a" if v is None else f"{v:.3f}"

    for attack in attacks:
        for model in models:
            found = [index.get((model, attack, s)) for s in scores]
            first = next((r for r in found if r is not None), None)
            if first is None:
                continue
            rate = first["success_rate"]
            cells = [attack, model, "n/a" if rate is None else f"{rate:.0%}"]
            cells.append(str(first["successful"]))
            cells += ["–" if r is None else num(r["auroc"]) for r in found]
            cells += ["–" if r is None else num(r["tpr_at_5fpr"]) for r in found]
            lines.append("| " + " | ".join(cells) + " |")
    return "\n".join(lines) + "\n"


FIGURE6_TABLE = ("eta", (0.0, 0.05, 0.1, 0.2, 0.3, 0.5), ("accuracy", "mean_entropy", "mean_mi"))
FIGURE7_TABLE = ("step", (0, 10, 20, 30, 40), ("accuracy", "target_rate", "mean_entropy"))
_CURVE_LABELS = {"eta": "η", "mean_entropy": "entropy", "mean_mi": "MI", "target_rate": "as 0"}


def curve_table(
    rows: Sequence[dict[str, Any]], x: str, xs: Sequence[float], metrics: Sequence[str]
) -> str:
    """Markdown table of a figure's curves at a few x values: one line per (metric, model) in
    the rows' model order, one column per x (``–`` where a model has no row at that x);
    accuracies and rates with 3 decimals, entropies and MI with 2."""
    models = list(dict.fromkeys(r["model"] for r in rows))
    index = {(r["model"], float(r[x])): r for r in rows}
    head = [_CURVE_LABELS.get(x, x), *(f"{v:g}" for v in xs)]
    lines = ["| " + " | ".join(head) + " |", "|" + "---|" * len(head)]
    for metric in metrics:
        digits = 2 if metric in ("mean_entropy", "mean_mi") else 3
        for model in models:
            cells = [f"{_CURVE_LABELS.get(metric, metric)} {model}"]
            for v in xs:
                row = index.get((model, float(v)))
                cells.append("–" if row is None else f"{row[metric]:.{digits}f}")
            lines.append("| " + " | ".join(cells) + " |")
    return "\n".join(lines) + "\n"


def write_csv(rows: Sequence[dict[str, Any]], path: Path | str) -> Path:
    """Rows to CSV (columns of the first row; floats with 6 significant digits)."""
    if not rows:
        raise ValueError("no rows to write")
    path = Path(path)
    path.parent.mkdir(parents=True, exist_ok=True)

    def write(f: IO[str]) -> None:
        writer = csv.DictWriter(f, fieldnames=list(rows[0]))
        writer.writeheader()
        for row in rows:
            writer.writerow({k: _cell(v) for k, v in row.items()})

    write_atomically(path, write)
    return path


def _cell(value: Any) -> Any:
    if value is None:
        return ""
    if isinstance(value, float):
        return f"{value:.6g}"
    return value
