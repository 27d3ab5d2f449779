"""The model store: a directory with ``model.safetensors``, ``card.json`` and ``calibration.json``,
sha256-verified, rebuilt from the card (no pickle)."""
