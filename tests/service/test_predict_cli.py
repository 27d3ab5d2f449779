"""``bayesgate predict``: files in, one answer per image out, each equal to ``Gate.predict``'s
(itself checked against ``/v1`` in test_gate.py); every bad file or flag is one line naming it."""

from __future__ import annotations

import csv
import json
import os
import stat
import subprocess
import sys
from pathlib import Path
from typing import Any

import numpy as np
import pytest
import torch
from PIL import Image

from bayesgate.cli import main
from bayesgate.service import predict_cli
from bayesgate.service.gate import DEFAULT_BATCH_SIZE, Gate
from bayesgate.service.input_files import MAX_IMAGES, MAX_PNG_BYTES
from bayesgate.service.schemas import instance_dict


@pytest.fixture(scope="module")
def gate(tiny_model_dir: Path) -> Gate:
    return Gate.load(tiny_model_dir, "cpu")


@pytest.fixture
def files(tmp_path: Path, mnist_test: tuple[torch.Tensor, torch.Tensor]) -> dict[str, Path]:
    """Two PNG digits in a folder, a uint8 .npy of three, an attack-style .npz (x_adv + others)
    and a one-image float .npy."""
    pixels = (mnist_test[0][:8].numpy() * 255).round().astype(np.uint8)
    folder = tmp_path / "pngs"
    folder.mkdir()
    for i in (0, 1):
        Image.fromarray(pixels[i, 0]).save(folder / f"digit{i}.png")
    (folder / "notes.txt").write_text("not an image: skipped in a folder")
    np.save(tmp_path / "three.npy", pixels[2:5])
    np.savez(
        tmp_path / "attack.npz",
        x_adv=pixels[5:7].astype(np.float32) / 255,
        labels=np.array([1, 2]),
        meta=np.array("{}"),
    )
    np.save(tmp_path / "one.npy", pixels[7, 0].astype(np.float32) / 255)
    return {
        "folder": folder,
        "npy": tmp_path / "three.npy",
        "npz": tmp_path / "attack.npz",
        "one": tmp_path / "one.npy",
    }


def _run(capsys: pytest.CaptureFixture[str], *argv: Any) -> tuple[int, str, str]:
    code = main(["predict", *map(str, argv), "--no-progress"])
    out, err = capsys.readouterr()
    return code, out, err


def _expected(gate: Gate, pixels: np.ndarray, seed: int = 0) -> list[dict[str, Any]]:
    answers = gate.predict(pixels, seed=seed)
    rows = [json.loads(json.dumps(instance_dict(p))) for p in answers]
    for row in rows:
        del row["samples"]
    return rows


def test_every_kind_of_input_is_answered_in_order(
    capsys: pytest.CaptureFixture[str],
    gate: Gate,
    tiny_model_dir: Path,
    files: dict[str, Path],
    mnist_test: tuple[torch.Tensor, torch.Tensor],
) -> None:
    inputs = [files["folder"], files["npy"], files["npz"], files["one"]]
    code, out, err = _run(capsys, tiny_model_dir, *inputs)
    assert code == 0
    lines = [json.loads(line) for line in out.splitlines()]
    where = [(Path(r["file"]).name, r["index"]) for r in lines]
    assert where == [
        ("digit0.png", None),
        ("digit1.png", None),
        ("three.npy", 0),
        ("three.npy", 1),
        ("three.npy", 2),
        ("attack.npz", 0),
        ("attack.npz", 1),
        ("one.npy", None),
    ]
    # one engine call over all eight (one chunk, seed 0): Gate's answers for the same pixels
    pixels = (mnist_test[0][:8].numpy() * 255).round().astype(np.uint8)
    answers = [{k: v for k, v in r.items() if k not in ("file", "index")} for r in lines]
    assert answers == _expected(gate, pixels)
    flagged = sum(r["adversarial"] for r in lines)
    assert err.strip().splitlines()[-1] == (
        f"predict: 8 images from 5 files, {flagged} flagged adversarial "
        f"({100 * flagged / 8:.1f} %) by mutual_information > "
        f"{gate.model.decision.threshold:.6g} at K = 10, seed 0; model tiny-mlp"
    )


def test_csv_holds_the_same_answers_as_json_lines(
    capsys: pytest.CaptureFixture[str], tiny_model_dir: Path, files: dict[str, Path], tmp_path: Path
) -> None:
    _, out, _ = _run(capsys, tiny_model_dir, files["npy"], "--seed", 4, "--k", 3)
    lines = [json.loads(line) for line in out.splitlines()]
    target = tmp_path / "answers.csv"
    target.write_text("an older file")
    code, out, err = _run(
        capsys, tiny_model_dir, files["npy"], "--seed", 4, "--k", 3, "--out", target
    )
    assert code == 0 and out == ""
    assert f"predict: replacing the existing answers.csv in {tmp_path}" in err
    assert f"; answers in {target}" in err
    with target.open(newline="") as stream:
        rows = list(csv.DictReader(stream))
    assert len(rows) == 3
    for row, line in zip(rows, lines, strict=True):
        assert row["index"] == str(line["index"]) and row["file"] == line["file"]
        assert row["adversarial"] == str(line["adversarial"])
        assert float(row["score"]) == line["score"]
        for name, value in line["scores"].items():
            assert float(row[f"score:{name}"]) == value
        assert [float(row[f"p:{c}"]) for c in range(10)] == line["probabilities"]
    assert list(rows[0])[: len(predict_cli.CSV_FIRST)] == list(predict_cli.CSV_FIRST)


def test_the_seed_and_k_change_the_answers_as_asked(
    capsys: pytest.CaptureFixture[str], tiny_model_dir: Path, files: dict[str, Path]
) -> None:
    runs = {
        args: _run(capsys, tiny_model_dir, files["npy"], *args)[1]
        for args in [(), ("--seed", "0"), ("--seed", "1"), ("--k", "4")]
    }
    assert runs[()] == runs[("--seed", "0")]  # seed 0 is the default: the same file twice
    assert runs[("--seed", "1")] != runs[()] and runs[("--k", "4")] != runs[()]


def test_an_interrupted_run_leaves_no_output_file(
    capsys: pytest.CaptureFixture[str],
    tiny_model_dir: Path,
    files: dict[str, Path],
    tmp_path: Path,
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    calls = 0
    answer = Gate._answer

    def stop_at_second_chunk(self: Gate, *args: Any) -> Any:
        nonlocal calls
        calls += 1
        if calls == 2:
            raise KeyboardInterrupt
        return answer(self, *args)

    monkeypatch.setattr(Gate, "_answer", stop_at_second_chunk)
    target = tmp_path / "out" / "answers.jsonl"
    code, _, err = _run(capsys, tiny_model_dir, files["npy"], "--batch-size", 2, "--out", target)
    assert code == 130 and calls == 2
    assert "interrupted; an --out file is written only once complete, so none was" in err
    assert list(target.parent.iterdir()) == []  # neither the file nor its temporary


@pytest.mark.parametrize(
    ("make", "extra", "message"),
    [
        (lambda d: d / "missing.png", (), "missing.png: no such file or folder"),
        (lambda d: _write(d / "a.jpg", b"x"), (), "a.jpg: unknown kind of file (expected .png"),
        (lambda d: _mkdir(d / "empty"), (), "empty: no .png, .npy, .npz files in this folder"),
        (
            lambda d: _write(d / "cut.png", _png_bytes()[:-20]),
            (),
            "cut.png: truncated PNG: chunk IDAT",
        ),
        (
            lambda d: _save_png(d / "big.png", np.zeros((30, 28), np.uint8)),
            (),
            "big.png: expected a 28×28 image, got 30×28",
        ),
        (
            lambda d: _npy(d / "wide.npy", np.zeros((2, 28, 29), np.float32)),
            (),
            "wide.npy: expected shape N×1×28×28 or N×28×28 or N×784, got 2×28×29",
        ),
        (
            lambda d: _npy(d / "range.npy", np.full((2, 784), 255.0)),
            (),
            "range.npy[0]: values must lie in [0, 1], found 255.0 at index [0, 0, 0] of 1×28×28",
        ),
        (
            lambda d: _write(d / "obj.npy", _pickled_npy()),
            (),
            "obj.npy: an array of Python objects (a pickle inside); only numbers are read, "
            "and pickles never",
        ),
        (
            lambda d: _npz(d / "two.npz", a=np.zeros(784), b=np.zeros(784)),
            (),
            "two.npz: which array? it has a, b (choose one with --key)",
        ),
        (
            lambda d: _npz(d / "two.npz", a=np.zeros(784), b=np.zeros(784)),
            ("--key", "c"),
            "two.npz: no array 'c' (--key); it has a, b",
        ),
        (
            lambda d: _write(d / "bad.npz", b"PK\x03\x04 not a zip"),
            (),
            "bad.npz: not a readable array file (",
        ),
        (
            lambda d: _write(d / "text.npz", b"hello"),
            (),
            "text.npz: neither .npy nor .npz content (an array file starts with \\x93NUMPY or PK)",
        ),
        (lambda d: _write(d / "empty.npy", b""), (), "empty.npy: an empty file"),
        (
            lambda d: _write(d / "shape.npy", _npy_header((1, 2**26))),
            (),
            "shape.npy: expected shape N×1×28×28 or N×28×28 or N×784, got 1×67108864",
        ),
        (lambda d: _zip(d / "text.npz", "readme.txt"), (), "text.npz: no arrays in this archive"),
        (lambda d: _npz(d / "none.npz"), (), "none.npz: no arrays in this archive"),
        (
            lambda d: _write(d / "huge.png", _png_bytes() + bytes(1 << 20)),
            (),
            "huge.png: {png} bytes, more than a digit's PNG ({cap})",
        ),
        (
            lambda d: _write(d / "cut.npy", _npy_bytes(np.zeros((4, 784), np.float32))[:-100]),
            (),
            "cut.npy: not a readable array file (",
        ),
        (
            lambda d: _write(d / "bomb.npy", _npy_header((2**40, 784))),
            (),
            f"bomb.npy: 1099511627776 more images would take the run past {MAX_IMAGES} images",
        ),
        (
            lambda d: _npz(d / "bomb.npz", x_adv=np.zeros(1)),
            (),
            "bomb.npz: expected shape N×1×28×28 or N×28×28 or N×784, got 1",
        ),
        (
            lambda d: _write(d / "deflate.npz", _corrupt_deflate_npz()),
            (),
            "deflate.npz: not a readable array file (",
        ),
        (
            lambda d: _npy(d / "ints.npy", np.full((2, 784), 200, np.int64)),
            (),
            "ints.npy[0]: values must lie in [0, 1], found 200.0 at index [0, 0, 0] of 1×28×28 "
            "(pixels 0–255: give them as uint8)",
        ),
        (lambda d: _fifo(d / "pipe.npy"), (), "pipe.npy: not a regular file or a folder"),
        (
            lambda d: _npy(d / "ok.npy", np.zeros(784)),
            ("--key", "x"),
            "--key x: applies to .npz inputs, and none was given",
        ),
        (
            lambda d: _npy(d / "ok.npy", np.zeros(784)),
            ("--out", "{d}/ok.npy"),
            "--out {d}/ok.npy: is the input {d}/ok.npy",
        ),
        (
            lambda d: _npy(d / "ok.npy", np.zeros(784)),
            ("--out", "{d}/./ok.npy"),
            "--out {d}/ok.npy: is the input {d}/ok.npy",
        ),
        (lambda d: _npy(d / "ok.npy", np.zeros(784)), ("--seed", "-1"), "--seed must be ≥ 0"),
        (lambda d: _npy(d / "ok.npy", np.zeros(784)), ("--k", "0"), "--k must be ≥ 1, got 0"),
        (
            lambda d: _npy(d / "ok.npy", np.zeros(784)),
            ("--out", "{d}"),
            "--out {d}: is a folder, not a file",
        ),
    ],
)
def test_bad_inputs_are_one_line_naming_the_file(
    capsys: pytest.CaptureFixture[str],
    tiny_model_dir: Path,
    tmp_path: Path,
    make: Any,
    extra: tuple[str, ...],
    message: str,
) -> None:
    path = make(tmp_path)
    extra = tuple(a.format(d=tmp_path) for a in extra)
    code, out, err = _run(capsys, tiny_model_dir, path, *extra)
    assert code == 2 and out == ""
    lines = err.strip().splitlines()
    assert len(lines) == 1 and lines[0].startswith("bayesgate: error: ")
    # the message itself, whole from its start: never wrapped in another refusal
    where = "" if message.startswith("--") else f"{tmp_path}/"
    png = len(_png_bytes()) + (1 << 20)  # huge.png's size
    expected = message.format(d=tmp_path, png=png, cap=MAX_PNG_BYTES)
    assert lines[0].startswith(f"bayesgate: error: {where}{expected}"), lines


@pytest.mark.parametrize("spelling", ["{d}/answers/", "{d}/answers//", "{d}/pngs/"])
def test_an_out_that_names_a_folder_is_refused_with_a_file_to_name(
    capsys: pytest.CaptureFixture[str],
    tiny_model_dir: Path,
    files: dict[str, Path],
    tmp_path: Path,
    spelling: str,
) -> None:
    """``--out answers/`` (a trailing slash, the folder missing) wrote a FILE named answers."""
    out = spelling.format(d=tmp_path)
    code, stdout, err = _run(capsys, tiny_model_dir, files["npy"], "--out", out)
    assert code == 2 and stdout == ""
    folder = Path(out)
    assert err == (
        f"bayesgate: error: --out {out}: is a folder, not a file (--out names the file to "
        f"write, e.g. --out {folder / 'answers.jsonl'})\n"
    )
    assert not (tmp_path / "answers").exists()
    assert sorted(p.name for p in files["folder"].iterdir()) == [
        "digit0.png",
        "digit1.png",
        "notes.txt",
    ]


def test_another_k_than_the_thresholds_is_noted(
    capsys: pytest.CaptureFixture[str], gate: Gate, tiny_model_dir: Path, files: dict[str, Path]
) -> None:
    """The docs: at another K the threshold no longer holds its false-positive rate — said."""
    k = gate.default_k
    _, _, err = _run(capsys, tiny_model_dir, files["npy"], "--k", k + 3)
    decision = gate.model.decision
    note = (
        f"predict: note: --k {k + 3}: the flag's threshold ({decision.score} > "
        f"{decision.threshold:.6g}, calibration.json) was set at K = {k}; at another K it no "
        f"longer holds its false-positive rate (target {gate.model.basis.target_fpr:g})"
    )
    assert err.splitlines()[0] == note
    for same in (("--k", k), ()):  # the threshold's own K, given or by default: no note
        code, _, err = _run(capsys, tiny_model_dir, files["npy"], *same)
        assert code == 0 and "note" not in err and err.count("\n") == 1


@pytest.mark.parametrize(
    ("array", "hint"),
    [
        (np.full((2, 784), 84.0), True),  # float64 pixels 0–255
        (np.full((2, 784), 255, np.float32), True),
        (np.full((2, 784), 1.5, np.float16), False),  # not whole numbers: not pixels
        (np.full((2, 784), 256.0), False),
        (np.full((2, 784), -3.0), False),
        (np.full((2, 784), np.nan), False),
    ],
)
def test_a_float_array_of_pixels_gets_the_uint8_hint(
    capsys: pytest.CaptureFixture[str], tiny_model_dir: Path, tmp_path: Path, array: Any, hint: bool
) -> None:
    """Whole numbers 0–255 saved as floats get the hint an integer array gets (Gate's check)."""
    bad = _npy(tmp_path / "floats.npy", array)
    code, _, err = _run(capsys, tiny_model_dir, bad)
    assert code == 2 and err.startswith(f"bayesgate: error: {bad}[0]: values must ")
    assert err.endswith(" (pixels 0–255: give them as uint8)\n") == hint, err


def test_odd_but_valid_inputs_and_outputs(
    capsys: pytest.CaptureFixture[str],
    gate: Gate,
    tiny_model_dir: Path,
    tmp_path: Path,
    mnist_test: tuple[torch.Tensor, torch.Tensor],
) -> None:
    """A .npy under a .npz name (told by its bytes), a file name that is not UTF-8, hidden files
    in a folder (skipped), ``--out -`` (stdout), ``--format`` over the suffix, the file mode."""
    pixels = (mnist_test[0][:3].numpy() * 255).round().astype(np.uint8)
    folder = tmp_path / "in"
    folder.mkdir()
    np.save(folder / "a.npy", pixels[:2])
    os.rename(folder / "a.npy", folder / "a.npz")
    odd = os.fsdecode(bytes(folder) + b"/\xff.npy")
    np.save(odd, pixels[2:3])
    (folder / "._a.png").write_bytes(b"macOS resource fork, not an image")
    code, out, err = _run(capsys, tiny_model_dir, folder, "--out", "-")
    assert code == 0, err
    lines = [json.loads(line) for line in out.splitlines()]
    assert [(Path(r["file"]).name, r["index"]) for r in lines] == [
        ("a.npz", 0),
        ("a.npz", 1),
        ("\\xff.npy", 0),
    ]
    target = tmp_path / "answers.csv"
    old_mask = os.umask(0o022)
    try:
        code, _, _ = _run(capsys, tiny_model_dir, folder, "--out", target, "--format", "jsonl")
    finally:
        os.umask(old_mask)
    assert code == 0 and json.loads(target.read_text().splitlines()[0])["file"].endswith("a.npz")
    assert stat.S_IMODE(target.stat().st_mode) == 0o644
    # several chunks: each is Gate's answer for that chunk
    code, out, _ = _run(capsys, tiny_model_dir, folder, "--batch-size", 2)
    lines = [json.loads(line) for line in out.splitlines()]
    first, second = _expected(gate, pixels[:2]), _expected(gate, pixels[2:])
    assert [{k: v for k, v in r.items() if k not in ("file", "index")} for r in lines] == (
        first + second
    )


def test_a_bad_file_among_good_ones_writes_nothing_and_sub_folders_are_skipped(
    capsys: pytest.CaptureFixture[str], tiny_model_dir: Path, files: dict[str, Path], tmp_path: Path
) -> None:
    (files["folder"] / "deeper").mkdir()
    _npy(files["folder"] / "deeper" / "bad.npy", np.full((1, 784), 7.0))  # never read
    bad = _npy(tmp_path / "bad.npy", np.full((1, 784), 7.0))
    target = tmp_path / "answers.jsonl"
    code, _, err = _run(capsys, tiny_model_dir, files["folder"], bad, "--out", target)
    assert code == 2 and f"{bad}[0]: values must lie in [0, 1]" in err
    assert not target.exists()
    code, _, _ = _run(capsys, tiny_model_dir, files["folder"], "--out", target)
    assert code == 0 and len(target.read_text().splitlines()) == 2  # the two PNGs only


def test_the_cli_chunk_is_gates(tiny_model_dir: Path) -> None:
    from bayesgate.cli import build_parser

    args = build_parser().parse_args(["predict", str(tiny_model_dir), "x.png"])
    assert args.batch_size == DEFAULT_BATCH_SIZE


def test_an_input_named_as_out_is_left_alone(
    capsys: pytest.CaptureFixture[str], tiny_model_dir: Path, tmp_path: Path
) -> None:
    path = _npy(tmp_path / "keep.npy", np.zeros((2, 784), np.float32))
    before = path.read_bytes()
    code, _, err = _run(capsys, tiny_model_dir, path, "--out", tmp_path / "keep.npy")
    assert code == 2 and "is the input" in err
    assert path.read_bytes() == before


def test_a_closed_stdout_is_one_line(tiny_model_dir: Path, tmp_path: Path) -> None:
    path = _npy(tmp_path / "ok.npy", np.zeros(784, np.float32))
    argv = [sys.executable, "-m", "bayesgate.cli", "predict", str(tiny_model_dir), str(path)]
    done = subprocess.run(
        argv, stdout=subprocess.DEVNULL, stderr=subprocess.PIPE, text=True, timeout=120,
        preexec_fn=lambda: os.close(1),
    )  # fmt: skip
    assert done.returncode == 2, done.stderr
    assert done.stderr.strip() == "bayesgate: error: stdout is closed: give --out FILE"


def test_a_missing_model_names_the_bundled_ones(
    capsys: pytest.CaptureFixture[str], tmp_path: Path
) -> None:
    path = _npy(tmp_path / "ok.npy", np.zeros(784))
    code, _, err = _run(capsys, tmp_path / "no-model", path)
    assert code == 2
    assert "model directory not found" in err and "bayesgate-robust" in err


def _write(path: Path, data: bytes) -> Path:
    path.write_bytes(data)
    return path


def _mkdir(path: Path) -> Path:
    path.mkdir()
    return path


def _npy(path: Path, array: np.ndarray) -> Path:
    np.save(path, array)
    return path


def _npz(path: Path, **arrays: np.ndarray) -> Path:
    np.savez(path, **arrays)
    return path


def _save_png(path: Path, pixels: np.ndarray) -> Path:
    Image.fromarray(pixels).save(path)
    return path


def _png_bytes() -> bytes:
    import io

    stream = io.BytesIO()
    Image.fromarray(np.zeros((28, 28), np.uint8)).save(stream, format="PNG")
    return stream.getvalue()


def _npy_bytes(array: np.ndarray) -> bytes:
    import io

    stream = io.BytesIO()
    np.save(stream, array)
    return stream.getvalue()


def _npy_header(shape: tuple[int, ...]) -> bytes:
    """A .npy header claiming ``shape`` float32, and no data."""
    import io

    stream = io.BytesIO()
    header = {"descr": "<f4", "fortran_order": False, "shape": shape}
    np.lib.format.write_array_header_1_0(stream, header)
    return stream.getvalue()


def _corrupt_deflate_npz() -> bytes:
    """A compressed .npz whose deflate stream is damaged in the middle."""
    import io

    stream = io.BytesIO()
    np.savez_compressed(stream, x_adv=np.random.default_rng(0).random((50, 784)))
    data = bytearray(stream.getvalue())
    middle = len(data) // 2
    data[middle : middle + 64] = bytes(64)
    return bytes(data)


def _zip(path: Path, member: str) -> Path:
    import zipfile

    with zipfile.ZipFile(path, "w") as archive:
        archive.writestr(member, "not an array")
    return path


def _fifo(path: Path) -> Path:
    os.mkfifo(path)
    return path


def _pickled_npy() -> bytes:
    """An object-array .npy (a pickle inside); loading it must be refused, never unpickled."""
    import io

    stream = io.BytesIO()
    np.save(stream, np.array([{"a": 1}], dtype=object), allow_pickle=True)
    return stream.getvalue()
