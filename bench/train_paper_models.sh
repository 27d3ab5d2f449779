#!/usr/bin/env bash
# Train the models the docs report on (full MNIST: 50k train / 10k validation), then evaluate each
# on the 10k test images with K=100 MC samples. Slow: about 1.5 h on 2 busy CPU cores. Run by hand:
#   OMP_NUM_THREADS=1 BAYESGATE_DATA_DIR=../shared/data bash bench/train_paper_models.sh [runs]
set -euo pipefail
out=${1:-runs}
train() {  # name, then train flags
  local name=$1; shift
  if [ ! -f "$out/$name/card.json" ]; then
    bayesgate train --name "$name" --out "$out/$name" --no-progress "$@"
  fi
  bayesgate evaluate "$out/$name" --k 100 --write-card --no-progress --json "$out/$name/test_metrics.json"
}
train cnn-alpha0.5 --preset cnn --alpha 0.5 --k-train 10 --epochs 10
for a in 0 0.5 1; do
  train "mlp-3x1000-alpha$a" --preset mlp-3x1000 --alpha "$a" --k-train 10 --epochs 3
done
train mlp-3x1000-det --preset mlp-3x1000-det --epochs 3
for a in 0 0.5 1; do
  train "mlp-2x100-alpha$a" --preset mlp-2x100 --alpha "$a" --k-train 10 --epochs 15
done
