"""Letters rendered offline as MNIST-style 28×28 images: an out-of-distribution set with strokes.

Each image is one of the 52 Latin letters ``A–Z a–z`` in one of the TrueType fonts matplotlib
ships (:data:`FONTS`; no download, the same files on every machine with the same matplotlib),
rendered white on black with anti-aliasing at :data:`RENDER_SIZE` px, cropped to its ink, scaled
so that its longer side is 20 px (aspect kept, Lanczos) and pasted into a 28×28 frame with its
centre of mass at the centre — the preprocessing of MNIST (LeCun et al. 1998). Image ``i`` is
letter ``i mod 52`` in font ``(i div 52) mod |FONTS|`` rotated by an angle drawn uniformly from
``[−15°, 15°]`` by the seeded generator.
"""

from __future__ import annotations

import string
from pathlib import Path

import numpy as np
import torch

LETTERS = string.ascii_uppercase + string.ascii_lowercase
FONTS = (
    "DejaVuSans.ttf",
    "DejaVuSans-Bold.ttf",
    "DejaVuSans-Oblique.ttf",
    "DejaVuSerif.ttf",
    "DejaVuSerif-Italic.ttf",
    "DejaVuSansMono.ttf",
    "cmss10.ttf",
    "STIXGeneral.ttf",
)
RENDER_SIZE = 96
BOX, FRAME = 20, 28
MAX_ANGLE = 15.0


def font_dir() -> Path:
    import matplotlib

    return Path(matplotlib.get_data_path()) / "fonts" / "ttf"


def letter_images(n: int, rng: torch.Generator) -> torch.Tensor:
    """``n`` letter images ``n×1×28×28`` in [0, 1] (see the module docstring)."""
    from PIL import ImageFont

    fonts = [ImageFont.truetype(str(font_dir() / f), RENDER_SIZE) for f in FONTS]
    angles = (torch.rand(n, generator=rng, dtype=torch.float64) * 2 - 1) * MAX_ANGLE
    out = np.zeros((n, 1, FRAME, FRAME), dtype=np.float32)
    for i in range(n):
        font = fonts[(i // len(LETTERS)) % len(fonts)]
        out[i, 0] = mnist_frame(render(LETTERS[i % len(LETTERS)], font, float(angles[i])))
    return torch.from_numpy(out)


def render(letter: str, font, angle: float) -> np.ndarray:
    """The letter's ink, white on black, rotated by ``angle`` degrees, cropped (float in [0, 1])."""
    from PIL import Image, ImageDraw

    canvas = Image.new("L", (2 * RENDER_SIZE, 2 * RENDER_SIZE), 0)
    ImageDraw.Draw(canvas).text((RENDER_SIZE // 2, RENDER_SIZE // 4), letter, fill=255, font=font)
    canvas = canvas.rotate(angle, resample=Image.Resampling.BILINEAR)
    box = canvas.getbbox()
    if box is None:
        raise ValueError(f"the font rendered no ink for {letter!r}")
    return np.asarray(canvas.crop(box), dtype=np.float64) / 255.0


def mnist_frame(ink: np.ndarray) -> np.ndarray:
    """Scale ``ink`` so its longer side is 20 px and centre its mass in a 28×28 frame."""
    from PIL import Image

    h, w = ink.shape
    scale = BOX / max(h, w)
    size = (max(1, round(w * scale)), max(1, round(h * scale)))
    img = Image.fromarray((ink * 255).astype(np.uint8)).resize(size, Image.Resampling.LANCZOS)
    small = np.asarray(img, dtype=np.float64) / 255.0
    frame = np.zeros((FRAME, FRAME))
    rows, cols = np.indices(small.shape)
    mass = small.sum()
    cy, cx = (rows * small).sum() / mass, (cols * small).sum() / mass
    top = int(np.clip(round(FRAME / 2 - 0.5 - cy), 0, FRAME - small.shape[0]))
    left = int(np.clip(round(FRAME / 2 - 0.5 - cx), 0, FRAME - small.shape[1]))
    frame[top : top + small.shape[0], left : left + small.shape[1]] = small
    return np.clip(frame, 0.0, 1.0)
