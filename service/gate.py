"""The service's answers without a server: score images from Python (and ``bayesgate predict``).

::

    from bayesgate import Gate

    gate = Gate.load("bayesgate-robust")    # a model directory, or a bundled model's name
    answers = gate.predict(images, seed=0)  # N×28×28, N×784 or N×1×28×28, in [0, 1] (uint8: /255)
    answers[0].label, answers[0].adversarial, answers[0].scores["fused"]

A :class:`Gate` loads a model exactly as ``bayesgate serve`` does (:func:`load_served_model`:
weights checked against the card's sha256, ``calibration.json`` and the fused detector checked
against the weights) and answers through the same path as the service's worker: the engine with
the detector's features, then every measure and score
(:func:`~bayesgate.service.prediction.answer`). Each answer is a
:class:`~bayesgate.service.prediction.Prediction`, the object ``/v1/predict`` encodes;
:func:`~bayesgate.service.schemas.instance_dict` gives its ``/v1`` JSON fields.

Images are cut into chunks of ``batch_size``; each chunk is one engine call. With a ``seed`` each
chunk's masks come from a generator seeded with it, as the service seeds one request: the answers
of a chunk equal those ``POST /v1/predict`` gives for a request holding the same images with the
same ``seed`` and ``mc_samples`` (``tests/service/test_gate.py`` checks this). An image's masks
depend on its place in its chunk, so the same images in another order or chunking get other
(equally valid) draws. Without a seed the masks come from torch's global generator, as an
unseeded request's do.

Every problem — a model that cannot be served, a bad image, a bad argument — raises
:class:`~bayesgate.errors.InvalidArgument` (a ``ValueError``) whose message names it.
"""

from __future__ import annotations

from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import numpy as np
import torch

from bayesgate.errors import InvalidArgument
from bayesgate.models.device import DEFAULT_DEVICE
from bayesgate.models.store.bundled import DEFAULT_ALIAS, resolve_model_dir
from bayesgate.service.defaults import DEFAULT_BATCH_SIZE
from bayesgate.service.errors import InvalidInput, StartupError
from bayesgate.service.inputs import accepted_shapes, check_values, kind_text, reject_booleans
from bayesgate.service.prediction import Prediction, answer
from bayesgate.service.schemas import MAX_SEED
from bayesgate.service.served_model import ServedModel, load_served_model


@dataclass(frozen=True)
class Gate:
    """A loaded model that answers as the service would (see the module's docstring)."""

    model: ServedModel

    def __repr__(self) -> str:
        """One line (the dataclass's own repr would print every weight and detector tensor)."""
        m, decision = self.model, self.model.decision
        return (
            f"Gate({m.card.name!r} from {str(m.directory)!r} on {m.device}, "
            f"K={self.default_k}, flags {decision.score} > {decision.threshold:.4g})"
        )

    @classmethod
    def load(cls, model: str | Path = DEFAULT_ALIAS, device: str = DEFAULT_DEVICE) -> Gate:
        """The model directory ``model``, or the bundled model of that name (``bayesgate-robust``,
        ``bayesgate-cnn``, ``bayesgate-default``); ``device`` ``auto`` takes CUDA when there is
        one."""
        try:
            return cls(load_served_model(resolve_model_dir(Path(model)), device, source="model"))
        except StartupError as exc:
            raise InvalidArgument(str(exc)) from None

    @property
    def default_k(self) -> int:
        """The K the flag's threshold was set at: the service's default ``mc_samples``."""
        return self.model.basis.k

    def single_image(self, shape: tuple[int, ...]) -> bool:
        """Whether an array of ``shape`` is one image (else N images, first axis)."""
        return tuple(shape) in accepted_shapes(self.model.input_shape)

    def shape_message(self, field: str, shape: tuple[int, ...]) -> str:
        """What is wrong with an array of ``shape``: neither one image nor N images."""
        accepted = accepted_shapes(self.model.input_shape)
        text = " or ".join("N×" + "×".join(map(str, s)) for s in accepted)
        return f"{field}: expected shape {text}, got {'×'.join(map(str, shape)) or 'a scalar'}"

    def to_batch(self, images: Any, field: str = "images") -> torch.Tensor:
        """``images`` as a float32 ``N×(card input shape)`` tensor, checked as the service checks
        ``/v1`` ``instances``; the message of the :class:`InvalidArgument` names ``field``.

        Accepted: an array (numpy, torch or nested lists) of one image or of N images, each in
        one of the shapes the service takes (``1×28×28``, ``28×28`` or ``784``). ``uint8`` values
        are pixels, read as ``v / 255`` (as a PNG's are); any other numbers must be finite and in
        the card's range ([0, 1]). Booleans are refused, in an array or among numbers in lists.
        A float32 array already in shape is checked in place, without a copy."""
        try:
            return self._to_batch(images, field)
        except InvalidInput as exc:
            raise InvalidArgument(str(exc)) from None

    def _to_batch(self, images: Any, field: str) -> torch.Tensor:
        shape = tuple(self.model.input_shape)
        if isinstance(images, torch.Tensor):
            images = images.detach().cpu()
            if images.dtype in (torch.bfloat16, torch.float8_e4m3fn, torch.float8_e5m2):
                images = images.float()  # dtypes numpy has not
            images = images.numpy()
        elif isinstance(images, list | tuple):
            reject_booleans(field, images)  # numpy reads [True, 0.5] as [1.0, 0.5]
        try:
            arr = np.asarray(images)
        except (ValueError, TypeError, RecursionError) as exc:
            raise InvalidInput(f"{field}: not an array of numbers ({exc})") from None
        if arr.dtype.kind not in "iuf":
            raise InvalidInput(f"{field}: expected numbers, got {kind_text(arr)}")
        single = self.single_image(arr.shape)
        if single:
            arr = arr[None]
        elif arr.ndim == 0 or not self.single_image(arr.shape[1:]):
            raise InvalidInput(self.shape_message(field, arr.shape))
        if arr.shape[0] == 0:
            raise InvalidInput(f"{field}: no images (the first axis is 0 long)")
        arr = arr.reshape(len(arr), *shape)  # a message's index is into the card's shape
        if arr.dtype == np.uint8:
            batch = arr.astype(np.float32) / np.float32(255.0)
        else:
            # float32 is compared as it is (0 and 1 are exact in it); anything else in float64,
            # as the service checks JSON numbers, so 1.00000000001 is refused, not rounded to 1
            batch = arr if arr.dtype == np.float32 else arr.astype(np.float64)
            try:  # one image: no index to name (its answer's index is null too)
                check_values(field, batch, self.model.input_range, indexed=not single)
            except InvalidInput as exc:
                text = str(exc)
                pixels = arr.dtype.kind in "iu" or bool(np.all(arr == np.round(arr)))
                if pixels and arr.min() >= 0 and 1 < arr.max() <= 255:  # whole numbers 0–255
                    text += " (pixels 0–255: give them as uint8)"
                raise InvalidInput(text) from None
        return torch.from_numpy(np.ascontiguousarray(batch, dtype=np.float32))

    def predict(
        self,
        images: Any,
        k: int | None = None,
        seed: int | None = None,
        batch_size: int = DEFAULT_BATCH_SIZE,
    ) -> list[Prediction]:
        """One :class:`Prediction` per image of ``images`` (see :meth:`to_batch`), from ``k`` MC
        passes (default :attr:`default_k`); ``seed`` seeds each chunk of ``batch_size`` images
        as the service seeds one request."""
        return [p for chunk in self.chunks(images, k, seed, batch_size) for p in chunk]

    def chunks(
        self,
        images: Any,
        k: int | None = None,
        seed: int | None = None,
        batch_size: int = DEFAULT_BATCH_SIZE,
    ) -> Iterator[list[Prediction]]:
        """:meth:`predict`'s answers a chunk of ``batch_size`` images at a time, each as soon as
        it is computed (every argument and image is checked before the first)."""
        k = self.default_k if k is None else k
        _check_int("k", k, 1)
        _check_int("batch_size", batch_size, 1)
        if seed is not None:
            _check_int("seed", seed, 0, MAX_SEED)
        x = self.to_batch(images)
        return (self._answer(x[i : i + batch_size], k, seed) for i in range(0, len(x), batch_size))

    def _answer(self, x: torch.Tensor, k: int, seed: int | None) -> list[Prediction]:
        """One engine call, as the worker makes it for one request."""
        device = self.model.device
        generator = None if seed is None else torch.Generator(device=device).manual_seed(seed)
        return answer(self.model, x.to(device), k, generator)


def _check_int(name: str, value: Any, minimum: int, maximum: int | None = None) -> None:
    """:class:`InvalidArgument` unless ``value`` is an int (not a bool) in [minimum, maximum]."""
    if isinstance(value, bool) or not isinstance(value, int | np.integer):
        raise InvalidArgument(f"{name} must be an integer, got {value!r}")
    if value < minimum or (maximum is not None and value > maximum):
        bound = f"≥ {minimum}" if maximum is None else f"in [{minimum}, {maximum}]"
        raise InvalidArgument(f"{name} must be {bound}, got {value}")
