"""Pictures of the adversarial digits that get *through* a model's flag: misclassified and not
flagged, with ``detect-eval``'s own images and verdicts (its cache, K, seed and threshold).

    python bench/through_examples.py MODEL_DIR --attack SPEC [--limit 1000] [--show 8] \
        [--out docs/robustness/slide/through.png] [--json …]

    python bench/through_examples.py MODEL_DIR --adaptive-images CACHE.npz [--limit N] …

For the first ``--limit`` test digits and the attack ``SPEC`` (e.g. ``slide``), the images come
from ``detect-eval``'s cache when it has them (else the attack runs and is cached, as
``detect-eval`` would); a digit is *through* when its clean prediction is right, the attacked
one wrong (this run's K-pass MC prediction, as ``detect-eval`` judges) and the detector's served
score is at most its threshold. The figure shows the first ``--show`` of them, three rows each
column: the clean digit, the attacked digit (titled with the two predictions and the score) and
the perturbation ``δ = x' − x`` (red up, blue down). The JSON has the counts and, per shown digit,
its index, labels, score and ``‖δ‖₁``, ``‖δ‖₂``, ``‖δ‖∞`` and the number of pixels changed.

With ``--adaptive-images`` the images are one attack's of ``bayesgate adaptive-eval`` (its cache
file, ``x_adv`` of the first ``--limit`` digits — the run's ``--limit``) and the verdicts are
``adaptive-eval``'s: clean and attacked digits each judged in one K-pass draw with masks seeded
``--seed + 1_000_003``, a digit through when right clean, wrong attacked and not flagged — the
``evaded`` count of its row.
"""

from __future__ import annotations

import argparse
import json
import sys
from pathlib import Path
from typing import Any

import numpy as np
import torch

CHANGED = 1e-3
"""A pixel counts as changed when ``|δ|`` exceeds this."""


def through(
    run: Any, spec: Any, x: torch.Tensor, y: torch.Tensor
) -> tuple[torch.Tensor, dict[str, Any], list[dict[str, Any]]]:
    """``(x_adv, counts, rows)``: ``detect-eval``'s images and verdicts for ``spec`` on ``x``,
    and one row per digit that gets through (index, labels, score, perturbation sizes)."""
    from bayesgate.models.mc.uncertainty import predictive_mean

    clean_probs, _ = run.score(x, "clean test")
    clean_pred = predictive_mean(clean_probs).argmax(dim=1)
    x_adv, success, summary = run.adversarial(spec, x, y, clean_pred)
    # scored as detect-eval scores them: the successful images only, in one call (the MC masks
    # depend on an image's place in the batch, so this gives its scores exactly)
    probs, scores = run.score(x_adv[success], spec.label)
    adv_pred = torch.full_like(y, -1)
    adv_pred[success] = predictive_mean(probs).argmax(dim=1)
    score = torch.full((len(x),), float("nan"), dtype=torch.float64)
    score[success] = torch.from_numpy(np.asarray(scores[run.detector.score], dtype=np.float64))
    passed = success & (score <= run.detector.threshold)
    delta = (x_adv - x).flatten(1)
    rows = [_row(i, y, adv_pred, score, delta) for i in torch.nonzero(passed).flatten().tolist()]
    counts = {
        "images": summary["images"],
        "eligible": summary["eligible"],
        "successful": summary["successful"],
        "through": len(rows),
        "score": run.detector.score,
        "threshold": run.detector.threshold,
    }
    return x_adv, counts, rows


def through_adaptive(
    network: Any, detector: Any, images: Path, x: torch.Tensor, y: torch.Tensor, k: int, seed: int
) -> tuple[torch.Tensor, dict[str, Any], list[dict[str, Any]]]:
    """``(x_adv, counts, rows)`` of one ``adaptive-eval`` attack's cached ``images`` on ``x``,
    judged as ``adaptive-eval`` judges (:func:`bayesgate.attacks.adaptive_eval.served_draw`)."""
    from bayesgate.attacks.adaptive_eval import EVAL_SEED_OFFSET, served_draw

    with np.load(images, allow_pickle=False) as data:
        x_adv = torch.from_numpy(data["x_adv"])
    if x_adv.shape != x.shape:
        raise SystemExit(f"{images}: {tuple(x_adv.shape)} images, --limit gives {tuple(x.shape)}")
    verdict_seed = seed + EVAL_SEED_OFFSET
    clean_mean, _ = served_draw(network, detector, x, k, verdict_seed)
    mean, score_np = served_draw(network, detector, x_adv, k, verdict_seed)
    eligible, pred = clean_mean.argmax(dim=1) == y, mean.argmax(dim=1)
    score = torch.from_numpy(np.asarray(score_np, dtype=np.float64))
    mis = eligible & (pred != y)
    passed = mis & (score <= float(detector.threshold))
    rows = [_row(i, y, pred, score, x_adv - x) for i in torch.nonzero(passed).flatten().tolist()]
    counts = {
        "images": len(x),
        "eligible": int(eligible.sum()),
        "successful": int(mis.sum()),
        "through": len(rows),
        "score": detector.score,
        "threshold": float(detector.threshold),
    }
    return x_adv, counts, rows


def _row(
    i: int, y: torch.Tensor, pred: torch.Tensor, score: torch.Tensor, delta: torch.Tensor
) -> dict[str, Any]:
    d = delta[i].flatten()
    return {
        "index": i,
        "label": int(y[i]),
        "predicted": int(pred[i]),
        "score": round(float(score[i]), 4),
        "l1": round(float(d.abs().sum()), 3),
        "l2": round(float(d.norm()), 3),
        "linf": round(float(d.abs().max()), 3),
        "pixels_changed": int((d.abs() > CHANGED).sum()),
    }


def plot(x: torch.Tensor, x_adv: torch.Tensor, rows: list[dict[str, Any]], title: str, out: Path):
    """Clean, attacked and perturbation of each row's digit, one column each."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    n = max(len(rows), 1)
    fig, axes = plt.subplots(3, n, figsize=(1.45 * n + 0.4, 4.9), squeeze=False)
    for col in range(n):
        for ax in axes[:, col]:
            ax.set_xticks([])
            ax.set_yticks([])
        if col >= len(rows):
            continue
        r = rows[col]
        i = r["index"]
        clean, adv = x[i, 0].numpy(), x_adv[i, 0].numpy()
        axes[0, col].imshow(clean, cmap="gray", vmin=0, vmax=1)
        axes[0, col].set_title(f"{r['label']}", fontsize=9)
        axes[1, col].imshow(adv, cmap="gray", vmin=0, vmax=1)
        axes[1, col].set_title(f"→ {r['predicted']}  s={r['score']:.2f}", fontsize=8)
        axes[2, col].imshow(adv - clean, cmap="bwr", vmin=-1, vmax=1)
        axes[2, col].set_title(f"{r['pixels_changed']} px", fontsize=8)
    axes[0, 0].set_ylabel("clean", fontsize=9)
    axes[1, 0].set_ylabel("attacked", fontsize=9)
    axes[2, 0].set_ylabel("δ", fontsize=9)
    fig.suptitle(title, fontsize=9)
    fig.tight_layout()
    out.parent.mkdir(parents=True, exist_ok=True)
    fig.savefig(out, dpi=110)
    plt.close(fig)


def main(argv: list[str] | None = None) -> int:
    from bayesgate.models.store.bundled import model_to_read

    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("model", type=model_to_read, help="a model directory or bundled name")
    source = parser.add_mutually_exclusive_group(required=True)
    source.add_argument("--attack", help="attack spec, e.g. slide or slide:eps=5")
    source.add_argument(
        "--adaptive-images",
        type=Path,
        help="an adaptive-eval cache file (.npz) of the first --limit digits",
    )
    parser.add_argument("--limit", type=int, default=1000)
    parser.add_argument("--show", type=int, default=8)
    parser.add_argument("--k", type=int, default=None, help="default: the detector's K")
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument("--cache-dir", type=Path, default=None)
    parser.add_argument("--threads", type=int, default=1)
    parser.add_argument("--out", type=Path, required=True, help="the PNG")
    parser.add_argument("--json", type=Path, default=None)
    args = parser.parse_args(argv)
    if args.limit < 1 or args.show < 1:
        parser.error("--limit and --show must be ≥ 1")
    if args.adaptive_images is not None and not args.adaptive_images.is_file():
        parser.error(f"--adaptive-images: no file {args.adaptive_images}")
    torch.set_num_threads(args.threads)

    from bayesgate.attacks.detect_eval import EvalRun
    from bayesgate.attacks.detect_settings import EvalSettings
    from bayesgate.models.data.mnist import load_mnist
    from bayesgate.models.detection.store import load_detector
    from bayesgate.models.store.directory import load_model

    loaded = load_model(args.model)
    detector = load_detector(args.model, loaded.card.weights_sha256)
    x, y = load_mnist("test", limit=args.limit)
    if args.adaptive_images is not None:
        k = int(args.k or detector.k)
        x_adv, counts, rows = through_adaptive(
            loaded.network, detector, args.adaptive_images, x, y, k, args.seed
        )
        label, key = f"adaptive-eval {args.adaptive_images.stem}", str(args.adaptive_images.name)
    else:
        settings = EvalSettings(
            attacks=(args.attack,), ood=(), limit=args.limit, k=args.k, seed=args.seed,
            cache_dir=args.cache_dir,
        )  # fmt: skip
        settings.check()
        (spec,) = settings.specs()
        run = EvalRun(loaded, detector, settings, torch.device("cpu"), progress=False)
        x_adv, counts, rows = through(run, spec, x, y)
        k, label, key = run.k, spec.label, spec.key
    shown = rows[: args.show]
    title = (
        f"{loaded.card.name}, {label}: {counts['through']} of {counts['eligible']} digits "
        f"misclassified and not flagged ({counts['score']} ≤ {counts['threshold']:.3g}); "
        f"the first {len(shown)}"
    )
    plot(x, x_adv, shown, title, args.out)
    result = {
        "model": loaded.card.name,
        "attack": key,
        "k": k,
        "seed": args.seed,
        **counts,
        "shown": shown,
        "command": "python bench/through_examples.py " + " ".join(argv or sys.argv[1:]),
    }
    print(json.dumps({k: v for k, v in result.items() if k != "shown"}))
    if args.json:
        args.json.parent.mkdir(parents=True, exist_ok=True)
        args.json.write_text(json.dumps(result, indent=1) + "\n")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
