"""Write the demo page's "random test digit" set: MNIST test digits as one PNG sprite + JSON.

    python bench/demo_digits.py [--per-class 30] [--seed 0] [--out service/static]

Reads the t10k IDX files from the data directory (``BAYESGATE_DATA_DIR``; never downloads),
draws ``per-class`` test images of each digit with a seeded generator, and writes

- ``digits.png``: an 8-bit grayscale sprite, one row per class (row ``c`` holds digits ``c``),
  ``per-class`` columns of 28×28 tiles, pixels exactly as in the IDX file;
- ``digits.json``: ``{"tile": 28, "columns", "count", "labels", "indices"}`` — tile ``i`` sits at
  column ``i % columns``, row ``i // columns``; ``indices[i]`` is its position in the test set.

The page (``service/static/app.js``) cuts a tile out of the sprite and sends it as it is. The two
files must stay under 200 KB together (the package ships them); the script fails otherwise.
"""

from __future__ import annotations

import argparse
import io
import json
from pathlib import Path

import numpy as np
from PIL import Image

from bayesgate.models.data.mnist import ensure_mnist_files, read_idx_images, read_idx_labels

TEST_FILES = ("t10k-images-idx3-ubyte.gz", "t10k-labels-idx1-ubyte.gz")
MAX_BYTES = 200 * 1024
DEFAULT_OUT = Path(__file__).resolve().parents[1] / "service" / "static"


def pick(labels: np.ndarray, per_class: int, seed: int) -> np.ndarray:
    """``per_class`` test indices of each class 0…9 (sorted within a class), class by class."""
    rng = np.random.default_rng(seed)
    chosen = []
    for c in range(10):
        (where,) = np.nonzero(labels == c)
        chosen.append(np.sort(rng.choice(where, size=per_class, replace=False)))
    return np.concatenate(chosen)


def sprite(images: np.ndarray, columns: int) -> np.ndarray:
    """``N×28×28`` uint8 tiles → one ``(N/columns·28)×(columns·28)`` image, row-major."""
    n, h, w = images.shape
    rows = n // columns
    return images.reshape(rows, columns, h, w).transpose(0, 2, 1, 3).reshape(rows * h, columns * w)


def png_bytes(pixels: np.ndarray) -> bytes:
    out = io.BytesIO()
    Image.fromarray(pixels, mode="L").save(out, format="PNG", optimize=True)
    return out.getvalue()


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--per-class", type=int, default=30)
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument("--out", type=Path, default=DEFAULT_OUT)
    args = parser.parse_args()
    images_path, labels_path = ensure_mnist_files(TEST_FILES, download=False)
    images, labels = read_idx_images(images_path), read_idx_labels(labels_path)
    index = pick(labels, args.per_class, args.seed)
    png = png_bytes(sprite(images[index], args.per_class))
    manifest = {
        "source": "MNIST test set (t10k), bench/demo_digits.py "
        f"--per-class {args.per_class} --seed {args.seed}",
        "tile": int(images.shape[1]),
        "columns": args.per_class,
        "count": len(index),
        "labels": labels[index].tolist(),
        "indices": index.tolist(),
    }
    text = json.dumps(manifest, separators=(",", ":")) + "\n"
    total = len(png) + len(text.encode())
    if total > MAX_BYTES:
        raise SystemExit(f"demo_digits: {total} bytes > {MAX_BYTES}; use fewer --per-class")
    args.out.mkdir(parents=True, exist_ok=True)
    (args.out / "digits.png").write_bytes(png)
    (args.out / "digits.json").write_text(text)
    print(f"{len(index)} digits, {len(png)} + {len(text)} bytes → {args.out}")


if __name__ == "__main__":
    main()
