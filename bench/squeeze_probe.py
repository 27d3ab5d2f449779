"""A probe, not a served detector: feature squeezing (Xu, Evans & Qi 2018) beside the fused flag,
against the L0 attacks that get through it — the detector-blind images ``adaptive-eval`` cached,
and an informed Sparse-RS that knows both flags.

    python bench/squeeze_probe.py MODEL_DIR --limit N --images A.npz … [--attack-limit M] \
        [--weights 1] [--steps 1000] [--pixels 10] [--region anywhere|strokes] [--patch] \
        [--requery N] \
        [--fpr 0.01] [--json OUT]

The squeezer is a 3×3 median filter (zero padding: the MNIST background), which removes isolated
pixels. Its score is the L1 distance between the MC predictive means of the image and of its
squeezed copy, ``q(x) = ‖p̄(·|x) − p̄(·|median₃(x))‖₁`` (Xu et al.'s detection score), each mean
from one K-pass draw. An image is flagged when the served fused flag is up **or** ``q`` exceeds
``t_q``, the ``1 − fpr`` quantile of ``q`` on the first ``--val`` validation digits (so the
union's clean FPR is at most the fused flag's plus ``fpr``; measured on the test digits). With
``--shared-fpr T`` the two flags share one budget instead — the min-p rule over the two scores
(:func:`shared_thresholds`): both at the same validation level, the union flagging ``T`` of the
validation digits — as a served version would have to (the fused flag alone spends the budget
today); every verdict below then uses those two thresholds, the attacker's included.

1. Clean: the first ``--limit`` test digits, how often each flag and the union are up.
2. ``--images``: ``adaptive-eval`` cache files of at least those digits (their first ``--limit``
   images are read; e.g. the adaptive Sparse-RS's);
   per file, the digits misclassified and not flagged by the fused flag alone and by the union,
   judged as ``adaptive-eval`` judges (masks seeded ``seed + 1_000_003``, K = the detector's).
3. The informed attacker against the union, on the first ``--attack-limit`` digits:
   :class:`~bayesgate.attacks.adaptive_sparse_rs.AdaptiveSparseRS` (k = ``--pixels``,
   ``--steps`` queries, λ from ``--weights``, pixels anywhere or with ``--region strokes`` only
   on the digit's strokes and their one-pixel border — clumps with the strokes, which the median
   keeps; or with ``--patch`` :class:`~bayesgate.attacks.adaptive_patch_rs.AdaptivePatchRS`, one
   ``⌊√k⌋``-sided square patch — a clump anywhere) on the combined score
   ``c(x) = max(s(x) − t_s, a·(q(x) − t_q))`` with threshold 0 (``a = 1/t_q`` puts both margins in
   units of their thresholds), ``q`` from a second K = 10 draw on the squeezed image; with λ = 0
   the plain search. Judged on the fresh draw as above; with ``--requery N`` also by the
   re-sending attacker: a digit counts when at least one of ``N`` draws (seeds ``seed +
   1_000_003 + d``, ``d < N``; ``d = 0`` is the single-shot verdict) is misclassified and
   unflagged.

What it is not: a defence claim. The squeezer also changes clean predictions (reported), and an
attacker who places pixels in clumps the median keeps is exactly what step 3 is for; its numbers
are the ones that count.
"""

from __future__ import annotations

import argparse
import json
import math
import sys
import time
from pathlib import Path
from typing import Any

import numpy as np
import torch
import torch.nn.functional as F

from bayesgate.attacks.methods.parameters import SPARSE_REGIONS


def median3(x: torch.Tensor) -> torch.Tensor:
    """The 3×3 median of every pixel of ``x`` (B×C×H×W), zero padding."""
    patches = F.pad(x, (1, 1, 1, 1)).unfold(2, 3, 1).unfold(3, 3, 1)  # B×C×H×W×3×3
    return patches.reshape(*patches.shape[:4], 9).median(dim=-1).values


def squeeze_distance(mean: torch.Tensor, squeezed_mean: torch.Tensor) -> torch.Tensor:
    """``‖p̄(·|x) − p̄(·|median₃(x))‖₁`` per image (B×C means in, B out)."""
    return (mean - squeezed_mean).abs().sum(dim=1)


def verdicts(
    network: Any, detector: Any, x: torch.Tensor, y: torch.Tensor, k: int, seed: int, t_q: float,
    t_s: float | None = None,
) -> dict[str, np.ndarray]:  # fmt: skip
    """Served prediction right, fused flag (score above ``t_s``, default the served threshold),
    squeeze flag (``q`` above ``t_q``), and both scores, of one K-pass draw each."""
    from bayesgate.attacks.adaptive_eval import served_draw

    t_s = float(detector.threshold) if t_s is None else t_s

    mean, score = served_draw(network, detector, x, k, seed)
    squeezed, _ = served_draw(network, detector, median3(x), k, seed)
    q = squeeze_distance(mean, squeezed).numpy()
    return {
        "correct": (mean.argmax(dim=1) == y).numpy(),
        "fused": score > t_s,
        "squeeze": q > t_q,
        "score": score,
        "q": q,
    }


def shared_thresholds(
    s_val: np.ndarray, q_val: np.ndarray, target: float
) -> tuple[float, float, float]:
    """``(t_s, t_q, a)``: both flags at the same per-score level ``a`` — ``t_s``, ``t_q`` the
    ``1 − a`` quantiles of the clean validation scores — with ``a`` the largest level (found by
    bisection, monotone) at which the union flags at most ``target`` of those digits. This is
    the min-p rule over the two scores (flag when ``min(p_s, p_q) ≤ a``, ``p`` the fraction of
    validation digits at least as suspicious): one clean-FPR budget for both."""

    def at(level: float) -> tuple[float, float, float]:
        t_s = float(np.quantile(s_val, 1 - level))
        t_q = float(np.quantile(q_val, 1 - level))
        return t_s, t_q, float(((s_val > t_s) | (q_val > t_q)).mean())

    low, high = 0.0, target
    for _ in range(40):
        mid = (low + high) / 2
        low, high = (mid, high) if at(mid)[2] <= target else (low, mid)
    t_s, t_q, _ = at(low)
    return t_s, t_q, low


def combined_score_fn(
    model: Any, detector: Any, k: int, t_q: float, generator: Any, t_s: float | None = None
) -> Any:
    """``x ↦ (log p̄(·|x), max(s − t_s, (q − t_q)/t_q))`` for the adaptive attack (threshold 0;
    ``t_s`` default the served threshold)."""
    from bayesgate.attacks.adaptive_eval import detector_score_fn

    fn = detector_score_fn(model, detector, k, generator=generator)
    t_s = float(detector.threshold) if t_s is None else t_s

    def score(x: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        log_p, s = fn(x)
        log_p_sq, _ = fn(median3(x))
        q = squeeze_distance(log_p.exp(), log_p_sq.exp())
        return log_p, torch.maximum(s - t_s, (q - t_q) / t_q)

    return score


def through(clean: dict[str, np.ndarray], adv: dict[str, np.ndarray]) -> dict[str, int]:
    """Digits right clean, wrong attacked and unflagged: by the fused flag, by the union."""
    mis = clean["correct"] & ~adv["correct"]
    return {
        "misclassified": int(mis.sum()),
        "through_fused": int((mis & ~adv["fused"]).sum()),
        "through_union": int((mis & ~adv["fused"] & ~adv["squeeze"]).sum()),
    }


def requeried(
    network: Any, detector: Any, x: torch.Tensor, y: torch.Tensor, k: int, seed: int, t_q: float,
    clean: dict[str, np.ndarray], draws: int, t_s: float | None = None,
) -> dict[str, int]:  # fmt: skip
    """:func:`through` for the re-sending attacker: digits right clean that at least one of
    ``draws`` MC draws (seeds ``seed + d``) sees misclassified and unflagged."""
    mis = np.zeros(x.shape[0], dtype=bool)
    fused = np.zeros(x.shape[0], dtype=bool)
    union = np.zeros(x.shape[0], dtype=bool)
    for d in range(draws):
        adv = verdicts(network, detector, x, y, k, seed + d, t_q, t_s)
        wrong = clean["correct"] & ~adv["correct"]
        mis |= wrong
        fused |= wrong & ~adv["fused"]
        union |= wrong & ~adv["fused"] & ~adv["squeeze"]
    return {
        "draws": draws,
        "misclassified": int(mis.sum()),
        "through_fused": int(fused.sum()),
        "through_union": int(union.sum()),
    }


def main(argv: list[str] | None = None) -> int:
    from bayesgate.models.store.bundled import model_to_read

    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("model", type=model_to_read, help="a model directory or bundled name")
    parser.add_argument("--limit", type=int, default=500, help="first N test digits")
    parser.add_argument("--images", type=Path, nargs="*", default=[])
    parser.add_argument("--attack-limit", type=int, default=0, help="digits attacked (0: none)")
    parser.add_argument("--weights", type=float, nargs="+", default=[1.0])
    parser.add_argument("--steps", type=int, default=1000)
    parser.add_argument("--pixels", type=int, default=10, help="the attack's k (L0 budget)")
    parser.add_argument("--region", choices=SPARSE_REGIONS, default="anywhere",
                        help="where the attack's pixels go")  # fmt: skip
    parser.add_argument("--requery", type=int, default=1, help="draws the re-sender tries")
    parser.add_argument("--patch", action="store_true", help="attack with one square patch")
    parser.add_argument("--val", type=int, default=2000, help="validation digits for t_q")
    parser.add_argument("--fpr", type=float, default=0.01, help="the squeeze flag's own FPR")
    parser.add_argument("--shared-fpr", type=float, default=None,
                        help="one budget: both flags at one level, the union's validation FPR "
                        "this (replaces the served threshold and --fpr)")  # fmt: skip
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument("--threads", type=int, default=1)
    parser.add_argument("--json", type=Path, default=None)
    args = parser.parse_args(argv)
    if args.limit < 1 or args.val < 1 or not 0 < args.fpr < 1 or args.attack_limit < 0:
        parser.error("--limit, --val ≥ 1, --fpr in (0, 1), --attack-limit ≥ 0")
    if args.requery < 1 or not 1 <= args.pixels < 784 or args.attack_limit > args.limit:
        parser.error("--requery ≥ 1, --pixels in [1, 784), --attack-limit ≤ --limit")
    if args.patch and args.region != "anywhere":
        parser.error("--patch places one square anywhere: no --region")
    if args.shared_fpr is not None and not 0 < args.shared_fpr < 1:
        parser.error(f"--shared-fpr must be in (0, 1), got {args.shared_fpr}")
    for path in args.images:
        if not path.is_file():
            parser.error(f"--images: no file {path}")
    torch.set_num_threads(args.threads)

    from bayesgate.attacks.adaptive_eval import EVAL_SEED_OFFSET
    from bayesgate.attacks.adaptive_patch_rs import AdaptivePatchRS
    from bayesgate.attacks.adaptive_sparse_rs import AdaptiveSparseRS
    from bayesgate.models.data.mnist import load_mnist
    from bayesgate.models.detection.store import load_detector
    from bayesgate.models.store.directory import load_model

    loaded = load_model(args.model)
    detector = load_detector(args.model, loaded.card.weights_sha256)
    net, k, seed = loaded.network, int(detector.k), args.seed + EVAL_SEED_OFFSET
    x_val, y_val = load_mnist("val", limit=args.val)
    val = verdicts(net, detector, x_val, y_val, k, seed, math.inf)
    t_s, t_q, level = float(detector.threshold), float(np.quantile(val["q"], 1 - args.fpr)), None
    if args.shared_fpr is not None:
        t_s, t_q, level = shared_thresholds(val["score"], val["q"], args.shared_fpr)
    x, y = load_mnist("test", limit=args.limit)
    clean = verdicts(net, detector, x, y, k, seed, t_q, t_s)
    eligible = clean["correct"]
    squeezed_pred_changed = float((~verdicts(net, detector, median3(x), y, k, seed, t_q)["correct"]
                                   & eligible).mean())  # fmt: skip
    result: dict[str, Any] = {
        "model": loaded.card.name,
        "t_s": t_s,
        "t_s_served": float(detector.threshold),
        "t_q": t_q,
        "fpr_target_squeeze": args.fpr if level is None else None,
        "shared_fpr": args.shared_fpr,
        "shared_level": level,
        "val_flagged_union": float(((val["score"] > t_s) | (val["q"] > t_q)).mean()),
        "val_digits": args.val,
        "test_digits": args.limit,
        "eligible": int(eligible.sum()),
        "clean_flagged_fused": float(clean["fused"].mean()),
        "clean_flagged_squeeze": float(clean["squeeze"].mean()),
        "clean_flagged_union": float((clean["fused"] | clean["squeeze"]).mean()),
        "clean_right_but_wrong_after_median": squeezed_pred_changed,
        "files": [],
        "attacks": [],
    }
    for path in args.images:
        with np.load(path, allow_pickle=False) as data:
            x_adv = torch.from_numpy(data["x_adv"])[: args.limit]
        if x_adv.shape != x.shape:
            raise SystemExit(f"{path}: {tuple(x_adv.shape)} images, --limit needs {tuple(x.shape)}")
        adv = verdicts(net, detector, x_adv, y, k, seed, t_q, t_s)
        result["files"].append({"file": path.name, **through(clean, adv)})
    n = args.attack_limit
    for weight in args.weights if n else []:
        started = time.perf_counter()
        attack: Any = (
            AdaptivePatchRS(eps=args.pixels, steps=args.steps, weight=weight)
            if args.patch
            else AdaptiveSparseRS(
                eps=args.pixels, steps=args.steps, weight=weight, region=args.region
            )
        )
        score_fn = combined_score_fn(
            net, detector, k, t_q, torch.Generator().manual_seed(args.seed), t_s
        )
        for p in net.parameters():
            p.requires_grad_(False)
        chunks = []
        start_rng = torch.Generator().manual_seed(args.seed + 7)
        for i in range(0, n, 100):
            chunks.append(attack(score_fn, x[i : min(i + 100, n)], y[i : min(i + 100, n)], 0.0,
                                 generator=start_rng).x_adv)  # fmt: skip
        x_adv = torch.cat(chunks)
        # the clean verdict of the attacked digits on a draw of the same size as the attacked
        # verdict's (an MC draw's masks depend on the batch: the first n of the --limit draw
        # would be another draw)
        sub = clean if n == args.limit else verdicts(net, detector, x[:n], y[:n], k, seed, t_q, t_s)
        adv = verdicts(net, detector, x_adv, y[:n], k, seed, t_q, t_s)
        row = {"weight": weight, "pixels": args.pixels, "region": args.region,
               "attacker": attack.optimizer, "digits": n,
               "eligible": int(sub["correct"].sum()), **through(sub, adv),
               "seconds": round(time.perf_counter() - started, 1)}  # fmt: skip
        if args.requery > 1:
            row["requery"] = requeried(net, detector, x_adv, y[:n], k, seed, t_q, sub,
                                       args.requery, t_s)  # fmt: skip
        result["attacks"].append(row)
        print(json.dumps(row), file=sys.stderr)
    result["command"] = "python bench/squeeze_probe.py " + " ".join(argv or sys.argv[1:])
    print(json.dumps(result, indent=1))
    if args.json:
        args.json.parent.mkdir(parents=True, exist_ok=True)
        args.json.write_text(json.dumps(result, indent=1) + "\n")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
