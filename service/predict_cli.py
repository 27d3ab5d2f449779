"""``bayesgate predict MODEL INPUT...`` — score image files offline, as the service would.

Reads PNG files, ``.npy``/``.npz`` arrays or folders of them (:mod:`bayesgate.service.input_files`),
answers them with :class:`~bayesgate.service.gate.Gate` (the service's engine and scores, the
model's own flag) and writes one answer per image: JSON lines (each line ``file``, ``index`` and
the ``/v1`` prediction's fields) or CSV (one row per image, a column per score and class
probability). The output goes to stdout, or to ``--out`` (written whole at the end: an
interrupted run leaves no half file); a one-line summary (images, how many flagged, by which
score and threshold) goes to stderr.

The service's modules (they import torch) are imported when the command runs, after the flags
that need none of them are checked: ``--help`` and such a refusal answer without torch's ~3 s.
"""

from __future__ import annotations

import argparse
import csv
import os
import sys
from collections.abc import Iterable, Iterator
from pathlib import Path
from typing import IO, Any

from bayesgate.errors import InvalidArgument, check_at_least, writable_file
from bayesgate.models.device import DEFAULT_DEVICE, DEVICE_CHOICES, add_threads_flag, set_threads
from bayesgate.models.mc.options import MAX_SEED
from bayesgate.models.store.bundled import READ_MODEL_HELP, model_to_read
from bayesgate.models.store.own_files import refuse_model_file
from bayesgate.outputs import note_replacing, write_atomically
from bayesgate.service.defaults import DEFAULT_BATCH_SIZE

FORMATS = ("jsonl", "csv")
CSV_FIRST = (
    "file",
    "index",
    "label",
    "class_name",
    "adversarial",
    "score_name",
    "score",
    "threshold",
    "predictive_entropy",
    "mutual_information",
    "variation_ratio",
    "aleatoric_variance",
    "epistemic_variance",
)


def register(sub: argparse._SubParsersAction) -> None:
    p = sub.add_parser(
        "predict",
        help="score image files (PNG, .npy, .npz) offline: the service's answers and flag",
        description="Answer every image of the inputs as POST /v1/predict would (same model "
        "checks, engine, scores and adversarial flag), without a server. Writes one JSON line "
        "(or CSV row) per image; a summary goes to stderr.",
    )
    p.add_argument("model", type=model_to_read, help=READ_MODEL_HELP + ", or bayesgate-default")
    p.add_argument(
        "inputs",
        nargs="+",
        type=Path,
        metavar="INPUT",
        help="grayscale PNG files, .npy/.npz arrays of one image or N images (N×28×28, N×784, "
        "N×1×28×28; uint8 read as v/255, other numbers in [0, 1]), or folders of them",
    )
    p.add_argument(
        "--k",
        type=int,
        default=None,
        help="MC samples (default: the K the model's flag threshold was set at)",
    )
    p.add_argument(
        "--seed",
        type=int,
        default=0,
        help="seed of the dropout masks, per chunk of --batch-size images as the service seeds "
        "one request (the same command line gives the same answers)",
    )
    p.add_argument(
        "--batch-size",
        type=int,
        default=DEFAULT_BATCH_SIZE,  # Gate's, from its torch-free module
        help="images per engine call: each chunk is answered as one seeded /v1 request",
    )
    p.add_argument(
        "--key",
        default=None,
        help="the array of each .npz to score (default: x_adv or the only one)",
    )
    p.add_argument(
        "--out",
        default=None,  # a str: Path() drops a trailing slash, which says a folder was meant
        help="the file to write (whole, once complete) instead of stdout (-: stdout)",
    )
    p.add_argument(
        "--format",
        choices=FORMATS,
        default=None,
        help="jsonl or csv (default: csv when --out ends in .csv, else jsonl)",
    )
    p.add_argument("--device", default=DEFAULT_DEVICE, help=f"one of {', '.join(DEVICE_CHOICES)}")
    add_threads_flag(p)
    p.add_argument("--no-progress", action="store_true", help="no progress bar")
    p.set_defaults(
        func=cmd_predict,
        on_interrupt="an --out file is written only once complete, so none was; on stdout the "
        "lines printed are whole answers",
    )


def cmd_predict(args: argparse.Namespace) -> int:
    for flag in ("k", "batch_size"):
        check_at_least("--" + flag.replace("_", "-"), getattr(args, flag))
    check_at_least("--seed", args.seed, minimum=0)
    if args.seed > MAX_SEED:
        raise InvalidArgument(f"--seed must be ≤ {MAX_SEED}, got {args.seed}")
    given = "-" if args.out is None else str(args.out)
    out = None if given == "-" else Path(given)
    fmt = args.format or ("csv" if out is not None and out.suffix.lower() == ".csv" else "jsonl")
    if out is not None:
        _check_out_file(given, out, fmt)
        refuse_model_file(out, args.model, "--out")
    elif sys.stdout is None:
        raise InvalidArgument("stdout is closed: give --out FILE")
    # imported after the checks above, which therefore answer without torch (these import it)
    from bayesgate.service.gate import Gate
    from bayesgate.service.input_files import display, read_inputs

    set_threads(args.threads)
    gate = Gate.load(args.model, args.device)
    batch = read_inputs(args.inputs, gate, args.key)
    if out is not None and (clash := _same_file(out, batch.paths)) is not None:
        raise InvalidArgument(f"--out {display(out)}: is the input {display(clash)}")
    k = gate.default_k if args.k is None else args.k
    if k != gate.default_k:
        print(_other_k_note(gate, k), file=sys.stderr)
    chunks = gate.chunks(batch.images, k, args.seed, args.batch_size)
    answers = _with_progress(chunks, len(batch.sources), not args.no_progress)
    flagged = 0

    def rows() -> Iterator[dict[str, Any]]:
        nonlocal flagged
        sources = iter(batch.sources)
        for chunk in answers:
            for prediction in chunk:
                flagged += prediction.adversarial
                source = next(sources)
                yield {"file": source.file, "index": source.index, **_fields(prediction)}

    if out is None:
        try:
            _write(rows(), fmt, sys.stdout)
            sys.stdout.flush()
        except BrokenPipeError:  # the reader stopped (``| head``): not an error, and no summary
            os.dup2(os.open(os.devnull, os.O_WRONLY), sys.stdout.fileno())
            return 0
    else:
        note_replacing("predict", [out])
        write_atomically(out, lambda stream: _write(rows(), fmt, stream))
    decision = gate.model.decision
    n = len(batch.sources)
    print(
        f"predict: {n} image{'s' * (n != 1)} from {batch.files} file{'s' * (batch.files != 1)}, "
        f"{flagged} flagged adversarial ({100 * flagged / n:.1f} %) by {decision.score} > "
        f"{decision.threshold:.6g} at K = {k}, seed {args.seed}; model {gate.model.name}"
        + (f"; answers in {display(out)}" if out is not None else ""),
        file=sys.stderr,
    )
    return 0


def _other_k_note(gate: Any, k: int) -> str:
    """The note for a K other than the one the flag's threshold was set at."""
    decision, basis = gate.model.decision, gate.model.basis
    return (
        f"predict: note: --k {k}: the flag's threshold ({decision.score} > "
        f"{decision.threshold:.6g}, {basis.source}) was set at K = {basis.k}; at another K it "
        f"no longer holds its false-positive rate (target {basis.target_fpr:g})"
    )


def _check_out_file(given: str, out: Path, fmt: str) -> None:
    """``--out`` names the file to write: a folder (an existing one, or a path ending in a
    slash, which ``Path`` would drop) is refused with the hint of a file in it."""
    if given.endswith(("/", os.sep)) or out.is_dir():
        raise InvalidArgument(
            f"--out {given}: is a folder, not a file (--out names the file to write, e.g. "
            f"--out {out / ('answers.' + fmt)})"
        )
    writable_file(out, "--out")


def _same_file(out: Path, inputs: list[Path]) -> Path | None:
    """The input that ``out`` names (the same file, by any path), if any."""
    if not out.exists():
        return None
    return next((p for p in inputs if os.path.samefile(out, p)), None)


def _fields(prediction: Any) -> dict[str, Any]:
    from bayesgate.service.schemas import instance_dict

    fields = instance_dict(prediction)
    del fields["samples"]  # never asked for here
    return fields


def _with_progress(chunks: Iterable[list[Any]], total: int, show: bool) -> Iterator[list[Any]]:
    from tqdm import tqdm

    with tqdm(total=total, unit="img", desc="predict", disable=not show, file=sys.stderr) as bar:
        for chunk in chunks:
            yield chunk
            bar.update(len(chunk))


def _write(rows: Iterable[dict[str, Any]], fmt: str, stream: IO[str]) -> None:
    """Each row as a JSON line, or as CSV (header from the first row)."""
    if fmt == "jsonl":
        import orjson

        for row in rows:
            stream.write(orjson.dumps(row).decode() + "\n")
        return
    writer = csv.writer(stream, lineterminator="\n")
    header = False
    for row in rows:
        flat = _csv_row(row)
        if not header:
            writer.writerow(list(flat))
            header = True
        writer.writerow(flat.values())


def _csv_row(row: dict[str, Any]) -> dict[str, Any]:
    """One CSV row: :data:`CSV_FIRST`, then ``score:<name>`` per score, ``p:<class>`` per class."""
    flat = {name: row[name] for name in CSV_FIRST}
    flat["index"] = "" if row["index"] is None else row["index"]
    flat.update({f"score:{name}": value for name, value in row["scores"].items()})
    flat.update({f"p:{c}": value for c, value in enumerate(row["probabilities"])})
    return flat
