"""Figures of docs/bbb.md from the recorded results (no training, no model files needed).

Reads ``docs/bbb/train_*.jsonl`` (per-epoch logs of ``bayesgate train``) and
``docs/bbb/results.json`` (cards' settings, test metrics at K = 100) and writes

- ``docs/bbb/training_curves.png``: validation accuracy and mean mutual information per epoch;
- ``docs/bbb/kwon.png``: Kwon et al.'s aleatoric and epistemic parts (means over the test set of
  the per-class means, i.e. trace / C) next to Shridhar et al.'s Table 2 for LeNet-5 on MNIST.

    python bench/bbb_plots.py [--docs docs/bbb]
"""

from __future__ import annotations

import argparse
import json
from pathlib import Path

import matplotlib

matplotlib.use("Agg")
import matplotlib.pyplot as plt

# log file → label, in drawing order
RUNS = {
    "train_lenet.jsonl": "bbb-lenet5 (Blundell β, 12 ep.)",
    "train_lenet_beta1.jsonl": "bbb-lenet5-beta1 (β = 1, 12 ep.)",
    "train_lenet_beta1_cos.jsonl": "bbb-lenet5-beta1-cos (β = 1, cosine lr, 30 ep.)",
    "train_lenet_bbalpha.jsonl": "bbb-lenet5-alpha0.5 (BB-α, 6 ep.)",
    "train_lenet_bbalpha_beta1.jsonl": "bbb-lenet5-alpha0.5-beta1 (BB-α, β = 1, cosine, 30 ep.)",
    "train_alexnet_5ep.jsonl": "bbb-alexnet-5ep (Blundell β, 5 ep.)",
    "train_alexnet.jsonl": "bbb-alexnet (Blundell β, cosine lr, 30 ep.)",
    "train_alexnet_beta1.jsonl": "bbb-alexnet-beta1 (β = 1, cosine lr, 30 ep.)",
}
SHRIDHAR_TABLE2_LENET = (0.0096, 0.0026)  # aleatoric, epistemic: MNIST, LeNet-5
CLASSES = 10


def read_jsonl(path: Path) -> list[dict[str, float]]:
    return [json.loads(line) for line in path.read_text().splitlines() if line.strip()]


def training_curves(docs: Path) -> Path:
    fig, (acc, mi) = plt.subplots(1, 2, figsize=(11, 4.2))
    for name, label in RUNS.items():
        path = docs / name
        if not path.is_file():
            continue
        rows = read_jsonl(path)
        epochs = [r["epoch"] for r in rows]
        acc.plot(epochs, [100 * r["val_accuracy"] for r in rows], marker=".", label=label)
        mi.plot(epochs, [r["val_mean_mutual_information"] for r in rows], marker=".")
    acc.set(xlabel="epoch", ylabel="validation accuracy (%)", ylim=(94, 100))
    acc.set_title("accuracy (10,000 held-out images)")
    mi.set(xlabel="epoch", ylabel="mean mutual information (nats)", yscale="log")
    mi.set_title("epistemic uncertainty on clean images")
    acc.legend(fontsize=7, loc="lower right")
    for ax in (acc, mi):
        ax.grid(alpha=0.3)
    fig.tight_layout()
    out = docs / "training_curves.png"
    fig.savefig(out, dpi=120)
    plt.close(fig)
    return out


def kwon_bars(docs: Path) -> Path:
    results = json.loads((docs / "results.json").read_text())
    names = [n for n in results if "mean_kwon_epistemic" in results[n].get("test", {})]
    labels = ["Shridhar et al.\nTable 2 (LeNet-5)", *names]
    aleatoric = [SHRIDHAR_TABLE2_LENET[0]]
    epistemic = [SHRIDHAR_TABLE2_LENET[1]]
    for n in names:
        test = results[n]["test"]
        aleatoric.append(test["mean_kwon_aleatoric"] / CLASSES)
        epistemic.append(test["mean_kwon_epistemic"] / CLASSES)
    fig, ax = plt.subplots(figsize=(11, 4.2))
    xs = range(len(labels))
    width = 0.4
    ax.bar([x - width / 2 for x in xs], aleatoric, width, label="aleatoric")
    ax.bar([x + width / 2 for x in xs], epistemic, width, label="epistemic")
    ax.set_xticks(list(xs), [label.replace("bbb-", "bbb-\n", 1) for label in labels], fontsize=7)
    ax.set(ylabel="mean per-class variance (trace / 10)", yscale="log")
    ax.set_title("Kwon et al. decomposition on the MNIST test set (K = 100)")
    ax.legend()
    ax.grid(alpha=0.3, axis="y")
    fig.tight_layout()
    out = docs / "kwon.png"
    fig.savefig(out, dpi=120)
    plt.close(fig)
    return out


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--docs", type=Path, default=Path("docs/bbb"))
    args = parser.parse_args(argv)
    for out in (training_curves(args.docs), kwon_bars(args.docs)):
        print(out)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
