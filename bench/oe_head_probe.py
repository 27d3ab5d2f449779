"""Would outlier exposure *in the network* move rotated digits? A probe on the bundled robust
network's dropout head (issue 15, option (c) of the closing notes). Not a candidate model: no
adversarial training happens here, so nothing is said about attacks.

Everything below was fixed before the first run:

- the conv trunk is frozen; its outputs are computed once for every image used;
- the dropout head starts from the bundled ``bayesgate-robust`` weights and is fine-tuned for
  ``--epochs`` (2) over the 50 000 training digits, batch 128, Adam (lr 1e-4, weight decay 1e-6,
  the card's), K = 10 passes per example;
- loss = BB-α energy of the clean batch (α = 0.5, the card's) + λ · the outlier term on a batch of
  128 synthetic outliers: the cross-entropy from the uniform distribution to the MC predictive,
  ``−(1/C) Σ_c log p̄_c(x)`` with ``p̄ = mean_k softmax(f_k(x))`` (Hendrycks et al. 2019,
  "Deep anomaly detection with outlier exposure", λ = 0.5 as theirs);
- outliers: :mod:`bayesgate.attacks.outliers` — chimera, patches, overlay, a third of the
  training digits each (seed 1) — none an evaluation set's transformation;
- arms: the bundled head as it is; λ = 0 (the same fine-tuning without outliers: the control);
  λ = 0.5;
- measured per arm with K = 20 (seed 0): test accuracy (10 000 digits), the predictive-entropy
  threshold at 5 % FPR on 5 000 validation digits (the fit part's seed-0 shuffle is not needed
  here: the first 5 000), the clean FPR on the first 1 000 test digits, and the fraction flagged
  of each OOD set of ``detect-eval`` made from those 1 000 digits.

    bench/quiet.sh python bench/oe_head_probe.py --json docs/robustness/oe-probe/oe_head_probe.json
"""

from __future__ import annotations

import argparse
import copy
import json
import sys
import time
from pathlib import Path
from typing import Any

import torch

ROOT = Path(__file__).resolve().parent.parent
MODEL = ROOT / "models" / "pretrained" / "bayesgate-robust"
OOD = ("uniform", "gaussian", "rotated", "inverted", "rotated45", "rotated180", "shifted",
       "blurred", "letters")  # fmt: skip


def trunk_outputs(network: torch.nn.Module, x: torch.Tensor, batch: int = 1000) -> torch.Tensor:
    """The frozen trunk's (flattened) output for every image."""
    with torch.inference_mode():
        return torch.cat([network.trunk(x[i : i + batch]) for i in range(0, len(x), batch)])


def head_log_probs(head: torch.nn.Module, h: torch.Tensor, k: int) -> torch.Tensor:
    """``B×K×C`` log-softmax of ``k`` dropout passes of ``head`` over trunk outputs ``h``."""
    from bayesgate.models.mc.dropout import mc_sampling

    with mc_sampling():
        out = head(h.repeat_interleave(k, dim=0))
    return torch.log_softmax(out.view(h.shape[0], k, -1), dim=-1)


def outlier_term(log_p: torch.Tensor) -> torch.Tensor:
    """``mean_b −(1/C) Σ_c log p̄_c`` with ``p̄ = mean_k p_k`` (``log_p`` is ``B×K×C``)."""
    k = log_p.shape[1]
    log_mean = torch.logsumexp(log_p, dim=1) - torch.log(torch.tensor(float(k)))
    return -log_mean.mean(dim=-1).mean()


def fine_tune(
    head: torch.nn.Module,
    h_clean: torch.Tensor,
    y: torch.Tensor,
    h_out: torch.Tensor,
    lam: float,
    epochs: int,
    progress: bool,
) -> list[dict[str, float]]:
    from tqdm import tqdm

    from bayesgate.models.mc.losses import bbalpha_softmax_loss

    gen = torch.Generator().manual_seed(0)
    opt = torch.optim.Adam(head.parameters(), lr=1e-4, weight_decay=1e-6)
    log = []
    head.train()
    for epoch in range(epochs):
        order = torch.randperm(len(h_clean), generator=gen)
        out_order = torch.randperm(len(h_out), generator=gen)
        total = {"bbalpha": 0.0, "outlier": 0.0, "steps": 0}
        steps = range(0, len(order), 128)
        for i in tqdm(steps, desc=f"λ={lam} epoch {epoch + 1}", disable=not progress, leave=False):
            rows = order[i : i + 128]
            logits = head(h_clean[rows].repeat_interleave(10, dim=0)).view(len(rows), 10, -1)
            loss = bbalpha_softmax_loss(logits, y[rows], 0.5)
            total["bbalpha"] += float(loss.detach())
            if lam > 0:
                o = out_order[i % len(out_order) :][:128]
                out = head(h_out[o].repeat_interleave(10, dim=0)).view(len(o), 10, -1)
                term = outlier_term(torch.log_softmax(out, dim=-1))
                total["outlier"] += float(term.detach())
                loss = loss + lam * term
            opt.zero_grad()
            loss.backward()
            opt.step()
            total["steps"] += 1
        log.append({k: v / max(total["steps"], 1) for k, v in total.items() if k != "steps"})
    head.eval()
    return log


def evaluate(head: torch.nn.Module, h: dict[str, torch.Tensor], y_test: torch.Tensor) -> dict:
    from bayesgate.attacks.metrics import flag_rate, threshold_at_fpr
    from bayesgate.models.mc.uncertainty import predictive_entropy

    torch.manual_seed(0)

    def entropy(x: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        with torch.inference_mode():
            chunks = [
                head_log_probs(head, x[i : i + 1000], 20).exp() for i in range(0, len(x), 1000)
            ]
        probs = torch.cat(chunks)
        return predictive_entropy(probs), probs.mean(dim=1)

    ent_val, _ = entropy(h["val"])
    threshold = threshold_at_fpr(ent_val.numpy(), 0.05)
    ent_test, p_test = entropy(h["test"])
    result: dict[str, Any] = {
        "accuracy": float((p_test.argmax(-1) == y_test).float().mean()),
        "threshold": float(threshold),
        "clean_fpr_1000": flag_rate(ent_test[:1000].numpy(), threshold),
        "flagged": {},
    }
    for name in OOD:
        result["flagged"][name] = flag_rate(entropy(h[name])[0].numpy(), threshold)
    return result


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--model", type=Path, default=MODEL)
    parser.add_argument("--epochs", type=int, default=2)
    parser.add_argument("--train-limit", type=int, default=None, help="training digits (all)")
    parser.add_argument("--val-limit", type=int, default=5000, help="validation digits")
    parser.add_argument("--test-limit", type=int, default=None, help="test digits (all)")
    parser.add_argument("--lambdas", type=float, nargs="+", default=[0.0, 0.5])
    parser.add_argument("--json", type=Path, default=None)
    parser.add_argument("--threads", type=int, default=2)
    parser.add_argument("--no-progress", action="store_true")
    args = parser.parse_args(argv)
    torch.set_num_threads(args.threads)

    from bayesgate.attacks.ood import ood_images
    from bayesgate.attacks.outliers import outlier_images
    from bayesgate.models.data.mnist import load_mnist
    from bayesgate.models.store.directory import load_model

    started = time.perf_counter()
    loaded = load_model(args.model)
    network = loaded.network.eval()
    x_train, y_train = load_mnist("train", val_size=10_000, limit=args.train_limit)
    x_val, _ = load_mnist("val", val_size=10_000, limit=args.val_limit)
    x_test, y_test = load_mnist("test", limit=args.test_limit)
    thirds = torch.tensor_split(torch.arange(len(x_train)), 3)
    x_out = torch.cat(
        [
            outlier_images(kind, x_train[rows], y_train[rows], seed=1)
            for kind, rows in zip(("chimera", "patches", "overlay"), thirds, strict=True)
        ]
    )
    first = x_test[:1000]
    h = {
        "train": trunk_outputs(network, x_train),
        "outliers": trunk_outputs(network, x_out),
        "val": trunk_outputs(network, x_val),
        "test": trunk_outputs(network, x_test),
        **{name: trunk_outputs(network, ood_images(name, first, seed=0)) for name in OOD},
    }
    print(f"trunk outputs: {time.perf_counter() - started:.0f} s", file=sys.stderr)

    arms: dict[str, Any] = {"bundled": evaluate(network.head, h, y_test)}
    for lam in args.lambdas:
        head = copy.deepcopy(network.head)
        t0 = time.perf_counter()
        log = fine_tune(head, h["train"], y_train, h["outliers"], lam, args.epochs,
                        not args.no_progress)  # fmt: skip
        arms[f"lambda={lam:g}"] = {**evaluate(head, h, y_test), "train_log": log,
                                   "seconds": round(time.perf_counter() - t0, 1)}  # fmt: skip
    for name, arm in arms.items():
        flagged = " ".join(f"{k} {100 * v:.1f}" for k, v in arm["flagged"].items())
        fpr = 100 * arm["clean_fpr_1000"]
        print(f"{name:12s} acc {100 * arm['accuracy']:.2f} clean FPR {fpr:.1f} | {flagged}")
    if args.json:
        args.json.parent.mkdir(parents=True, exist_ok=True)
        report = {"model": str(args.model.name), "epochs": args.epochs, "arms": arms,
                  "command": "python bench/oe_head_probe.py " + " ".join(argv or sys.argv[1:]),
                  "seconds": round(time.perf_counter() - started, 1)}  # fmt: skip
        args.json.write_text(json.dumps(report, indent=1) + "\n")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
