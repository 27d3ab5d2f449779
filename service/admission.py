"""Admission by work before the body is read: the ``/v1`` prediction routes' route class.

A request's cost is its work in image-passes, ``B × K`` (images × MC samples), and the inference
queue holds a bounded amount of it (``BAYESGATE_MAX_QUEUED_WORK``, see
:class:`~bayesgate.service.worker.BatchWorker`). Reading, parsing and decoding a 256-image body
costs the server far more than answering 503, so the decision is made in two steps:

1. before the body is read and parsed, the work is estimated as
   ``images ≈ ⌊Content-Length / bytes per image⌋`` (:data:`BYTES_PER_IMAGE` for base64
   ``images``, :data:`BYTES_PER_INSTANCE` when the first piece of the body — what arrived with the
   head — names ``"instances"``; capped at ``BAYESGATE_MAX_INSTANCES``; one image for a file
   upload or a body of unknown length) times the server's default K, and held
   (:meth:`~bayesgate.service.worker.BatchWorker.reserve`) — or refused at once with 503
   ``queue_full`` + ``Retry-After`` when it does not fit beside the work already queued or held by
   requests still being read. When even the smaller estimate (``"instances"``) does not fit, the
   refusal comes from the head alone, without waiting for the first piece;
2. once the body is parsed and the image count and K are known, the estimate is replaced by the
   exact ``B × K`` (:meth:`~bayesgate.service.worker.BatchWorker.resize`), refused the same way
   if that does not fit, before any image is decoded.

The estimate only decides how early a refusal comes: a request the estimate lets in is still
checked exactly, and one it refuses would have found the queue at least nearly full.
"""

from __future__ import annotations

from collections.abc import Callable

from fastapi import Request

from bayesgate.service.deps import default_mc_samples
from bayesgate.service.jobs import Reservation
from bayesgate.service.request_body import ReadBodyFirst, first_piece
from bayesgate.service.worker import BatchWorker

# A base64 28×28 8-bit PNG in a JSON list: ~1.15 kB for uniform noise, ~0.3–0.5 kB for a digit.
BYTES_PER_IMAGE = 1024
# 784 numbers in nested lists: 2 bytes each at least ("0,"), 4 for "0.5," and up to ~20.
BYTES_PER_INSTANCE = 3072


def estimated_images(content_length: int | None, max_instances: int, per_image: int) -> int:
    """``⌊Content-Length / per_image⌋`` clipped to ``[1, max_instances]`` (1 if unknown)."""
    if content_length is None:
        return 1
    return max(1, min(max_instances, content_length // per_image))


def estimate_text(images: int, k: int, where: str) -> str:
    return f"needs about {images * k} ({images} image(s) estimated from {where} × K = {k})"


def content_length(request: Request) -> int | None:
    value = request.headers.get("content-length", "")
    return int(value) if value.isdigit() else None


def reservation_of(request: Request) -> Reservation | None:
    """The work held for this request by :class:`AdmitByWork` (None outside such a route)."""
    return getattr(request.state, "reservation", None)


class AdmitByWork(ReadBodyFirst):
    """:class:`ReadBodyFirst` that holds (or refuses) the request's estimated work before the body
    is read, and gives back what is still held when the route is done."""

    async def admit(self, request: Request, takes_form: bool) -> Callable[[], None] | None:
        state = request.app.state
        worker: BatchWorker | None = getattr(state, "worker", None)
        if worker is None or not getattr(state, "ready", False):
            return None  # the route's dependencies answer 503 not_ready
        reservation = await hold_estimate(request, worker, takes_form)
        return lambda: worker.release(reservation)


async def hold_estimate(request: Request, worker: BatchWorker, takes_form: bool) -> Reservation:
    """Hold the request's estimated work (step 1 above) as ``request.state.reservation``;
    :class:`~bayesgate.service.errors.QueueFull` when it does not fit. The caller releases it
    (:meth:`~bayesgate.service.worker.BatchWorker.release`) when the request is done."""
    settings = request.app.state.settings
    length = content_length(request)
    k = default_mc_samples(settings, worker.model)
    if takes_form:
        images, where = 1, "a file upload"
    else:
        where = "a body of unknown length" if length is None else f"a body of {length} bytes"
        # Refused from the head alone when even the fewer images of "instances" do not fit.
        fewest = estimated_images(length, settings.max_instances, BYTES_PER_INSTANCE)
        worker.check_fits(fewest * k, estimate_text(fewest, k, where))
        instances = b'"instances"' in await first_piece(request)
        per_image = BYTES_PER_INSTANCE if instances else BYTES_PER_IMAGE
        images = estimated_images(length, settings.max_instances, per_image)
    reservation = worker.reserve(images * k, estimate_text(images, k, where))
    request.state.reservation = reservation
    return reservation


def hold_exact_work(request: Request, worker: BatchWorker, work: int) -> Reservation:
    """Replace the request's estimate by its exact ``work`` (step 2 above; held anew when no
    estimate was held); :class:`~bayesgate.service.errors.QueueFull` when it does not fit."""
    reservation = reservation_of(request)
    if reservation is None:
        request.state.reservation = reservation = worker.reserve(work)
    else:
        worker.resize(reservation, work)
    return reservation
