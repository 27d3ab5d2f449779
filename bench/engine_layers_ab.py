"""CPU per engine call with every feature layer vs only the layers the bundled detector reads.

Interleaved pairs of 20 calls (B = 16, K = 10, one thread, seeded masks); prints both medians
and the paired ratio (detector's layers ÷ all layers).

    bench/quiet.sh python bench/engine_layers_ab.py
"""

from __future__ import annotations

import statistics
import time

import torch

from bayesgate.models.detection import load_detector
from bayesgate.models.mc.engine import mc_predict_features
from bayesgate.models.store.directory import load_model
from bayesgate.service.settings import DEFAULT_MODEL_DIR


def main(pairs: int = 15, calls: int = 20) -> None:
    torch.set_num_threads(1)
    loaded = load_model(DEFAULT_MODEL_DIR)
    layers = load_detector(DEFAULT_MODEL_DIR, loaded.card.weights_sha256).layers
    x = torch.rand(16, 1, 28, 28, generator=torch.Generator().manual_seed(0))

    def cpu_ms(wanted: tuple[str, ...] | None) -> float:
        start = time.process_time()
        for _ in range(calls):
            generator = torch.Generator().manual_seed(1)
            mc_predict_features(loaded.network, x, 10, generator=generator, layers=wanted)
        return 1e3 * (time.process_time() - start) / calls

    cpu_ms(None), cpu_ms(layers)  # warm-up
    full, some = [], []
    for _ in range(pairs):
        full.append(cpu_ms(None))
        some.append(cpu_ms(layers))
    ratios = [b / a for a, b in zip(full, some, strict=True)]
    print(
        f"layers {layers}: all {statistics.median(full):.2f} ms, detector's "
        f"{statistics.median(some):.2f} ms per call; paired ratio median "
        f"{statistics.median(ratios):.3f} ({min(ratios):.3f}–{max(ratios):.3f})"
    )


if __name__ == "__main__":
    main()
