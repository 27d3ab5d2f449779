"""An attacker who runs several ``adaptive-eval`` attacks and sends, per digit, the first image its
own query saw get through: how many digits that attacker gets misclassified and not flagged.

    python bench/adaptive_union.py MODEL_DIR --images A.npz B.npz … --limit N [--k K] [--seed S] \
        [--json OUT]

``A.npz``, ``B.npz``, … are ``adaptive-eval`` cache files (``x_adv`` and ``found`` of the first
``N`` test digits, one attack each), in the attacker's order of preference. Per digit the
attacker sends the image of the first file whose ``found`` is set (its own K-sample query saw it
misclassified and unflagged); where none is, the last file's image. Every file's images and the
combined set are judged as ``adaptive-eval`` judges (one K-pass draw, masks seeded
``seed + 1_000_003``, K = the detector's unless ``--k``; the denominators are the digits right
clean on that draw), so each file's count equals ``evaded`` of its row in ``adaptive.json``.

Also reported, **not an attack**: the digits that *some* file gets through on the verdict's own
draw (the attacker cannot see that draw; an upper bound on any choice among these images).
"""

from __future__ import annotations

import argparse
import json
import sys
from pathlib import Path
from typing import Any

import numpy as np
import torch


def choose(found: list[np.ndarray]) -> np.ndarray:
    """Per digit, the index of the first file whose ``found`` is set, else the last file's."""
    stacked = np.stack(found)  # F×N
    first = np.argmax(stacked, axis=0)
    return np.where(stacked.any(axis=0), first, len(found) - 1)


def union(
    network: Any,
    detector: Any,
    x: torch.Tensor,
    y: torch.Tensor,
    files: list[Path],
    k: int,
    seed: int,
) -> dict[str, Any]:
    """The counts of the module docstring (JSON-ready)."""
    from bayesgate.attacks.adaptive_eval import EVAL_SEED_OFFSET, judge

    verdict_seed = seed + EVAL_SEED_OFFSET
    clean = judge(network, detector, x, y, k, verdict_seed)
    eligible = clean["correct"]
    images, found, through = [], [], []
    for path in files:
        with np.load(path, allow_pickle=False) as data:
            x_adv, f = torch.from_numpy(data["x_adv"]), data["found"].astype(bool)
        if x_adv.shape != x.shape:
            raise SystemExit(f"{path}: {tuple(x_adv.shape)} images, --limit gives {tuple(x.shape)}")
        verdict = judge(network, detector, x_adv, y, k, verdict_seed)
        images.append(x_adv)
        found.append(f)
        through.append(eligible & ~verdict["correct"] & ~verdict["flagged"])
    picked = choose(found)
    sent = torch.stack(images)[torch.from_numpy(picked), torch.arange(len(x))]
    verdict = judge(network, detector, sent, y, k, verdict_seed)
    sent_through = eligible & ~verdict["correct"] & ~verdict["flagged"]
    n = int(eligible.sum())
    return {
        "images": len(x),
        "eligible": n,
        "files": [
            {
                "file": path.name,
                "through": int(t.sum()),
                "own_found": int((f & eligible).sum()),
                "sent": int((picked == i).sum()),
            }
            for i, (path, t, f) in enumerate(zip(files, through, found, strict=True))
        ],
        "attacker_through": int(sent_through.sum()),
        "attacker_through_rate": float(sent_through.sum() / n),
        "misclassified_sent": int((eligible & ~verdict["correct"]).sum()),
        # the chosen file's own verdict per digit: equal to attacker_through, as in sets of one
        # size the verdict's masks depend on a digit's place, not on the other digits (a draw of
        # another size differs)
        "chosen_files_through": int(np.stack(through)[picked, np.arange(len(x))].sum()),
        "some_file_through": int(np.any(through, axis=0).sum()),
        "some_file_through_rate": float(np.any(through, axis=0).sum() / n),
        "k": k,
        "seed_eval": verdict_seed,
        "score": detector.score,
        "threshold": float(detector.threshold),
    }


def main(argv: list[str] | None = None) -> int:
    from bayesgate.models.store.bundled import model_to_read

    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("model", type=model_to_read, help="a model directory or bundled name")
    parser.add_argument("--images", type=Path, nargs="+", required=True)
    parser.add_argument("--limit", type=int, required=True, help="the adaptive-eval run's --limit")
    parser.add_argument("--k", type=int, default=None, help="default: the detector's K")
    parser.add_argument("--seed", type=int, default=0, help="the adaptive-eval run's --seed")
    parser.add_argument("--threads", type=int, default=1)
    parser.add_argument("--json", type=Path, default=None)
    args = parser.parse_args(argv)
    if args.limit < 1:
        parser.error("--limit must be ≥ 1")
    for path in args.images:
        if not path.is_file():
            parser.error(f"--images: no file {path}")
    torch.set_num_threads(args.threads)

    from bayesgate.models.data.mnist import load_mnist
    from bayesgate.models.detection.store import load_detector
    from bayesgate.models.store.directory import load_model

    loaded = load_model(args.model)
    detector = load_detector(args.model, loaded.card.weights_sha256)
    x, y = load_mnist("test", limit=args.limit)
    k = int(args.k or detector.k)
    result = {
        "model": loaded.card.name,
        **union(loaded.network, detector, x, y, args.images, k, args.seed),
        "command": "python bench/adaptive_union.py " + " ".join(argv or sys.argv[1:]),
    }
    print(json.dumps(result, indent=1))
    if args.json:
        args.json.parent.mkdir(parents=True, exist_ok=True)
        args.json.write_text(json.dumps(result, indent=1) + "\n")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
