#!/usr/bin/env bash
# Train the MLPs docs/models.md reports on (full MNIST: 50k train / 10k validation), evaluate each
# on the 10k test images with K=100 MC samples, and write one raw-output JSON per model (metrics,
# the exact evaluate command, the model card's training settings and train command) into RESULTS.
# The CNN row is the bundled model, evaluated as it is. Slow (about 45 min on one busy core).
# Run by hand, from the repository root:
#   BAYESGATE_DATA_DIR=../shared/data nice -n 19 bash bench/train_paper_models.sh \
#       ~/.cache/bayesgate/runs docs/mnist
# then check the docs against the JSON files: python bench/check_readme_numbers.py
set -euo pipefail
out=${1:-$HOME/.cache/bayesgate/runs}
results=${2:-docs/mnist}
mkdir -p "$out" "$results"
evaluate() {  # model dir, result name
  bayesgate evaluate "$1" --k 100 --seed 0 --no-progress --device cpu --json "$results/$2.json" >/dev/null
}
train() {  # name, then train flags
  local name=$1; shift
  if [ ! -f "$out/$name/card.json" ]; then
    bayesgate train --name "$name" --out "$out/$name" --threads 1 --no-progress --device cpu "$@"
  fi
  evaluate "$out/$name" "$name"
}
evaluate models/pretrained/bayesgate-cnn cnn-alpha0.5
for a in 0 0.5 1; do
  train "mlp-2x100-alpha$a" --preset mlp-2x100 --alpha "$a" --k-train 10 --epochs 15
done
for a in 0 0.5 1; do
  train "mlp-3x1000-alpha$a" --preset mlp-3x1000 --alpha "$a" --k-train 10 --epochs 3
done
train mlp-3x1000-det --preset mlp-3x1000-det --epochs 3
