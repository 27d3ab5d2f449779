"""``train --out`` into a directory that holds a model (refused, or ``--force`` removing what
belonged to the old weights), and ``fetch-data --mirror`` failures naming the flag."""

from __future__ import annotations

import contextlib
import io
import json
import shlex
from pathlib import Path

import pytest

from bayesgate.cli import build_parser, main
from bayesgate.models import cli as models_cli
from bayesgate.models.data.download import download_mnist
from bayesgate.models.store.directory import CARD_FILE, load_model

TINY = ["train", "--preset", "mlp-2x32", "--epochs", "1", "--limit", "100", "--val-size", "50",
        "--k-train", "1", "--k-val", "1", "--no-progress", "--device", "cpu"]  # fmt: skip
OLD_FILES = ("calibration.json", "calibration.md", "calibration_roc.png", "calibration_hist.png",
             "detector.json", "detector.safetensors")  # fmt: skip


def _run(argv: list[str]) -> tuple[int, str, str]:
    out, err = io.StringIO(), io.StringIO()
    with contextlib.redirect_stdout(out), contextlib.redirect_stderr(err):
        code = main(argv)
    return code, out.getvalue(), err.getvalue()


@pytest.fixture
def data_env(monkeypatch: pytest.MonkeyPatch, mnist_root: Path, tmp_path: Path) -> None:
    monkeypatch.setenv("BAYESGATE_DATA_DIR", str(mnist_root))
    monkeypatch.setenv("XDG_CACHE_HOME", str(tmp_path / "cache"))


def test_train_refuses_an_out_holding_a_model_unless_forced(
    tmp_path: Path, data_env: None, monkeypatch: pytest.MonkeyPatch
) -> None:
    out = tmp_path / "model"
    out.mkdir()
    (out / CARD_FILE).write_text('{"old": true}')
    for name in OLD_FILES:
        (out / name).write_text("of the old weights")
    (out / "notes.txt").write_text("mine")

    def no_data(*args: object, **kwargs: object) -> None:
        raise AssertionError("training started although --out was refused")

    with monkeypatch.context() as mp:
        mp.setattr("bayesgate.models.data.mnist.load_mnist", no_data)
        code, stdout, stderr = _run([*TINY, "--out", str(out)])
    assert code == 2 and stdout == "" and stderr.count("\n") == 1
    assert stderr.startswith(f"bayesgate: error: --out {out} already holds a model (card.json)")
    assert "would no longer match the new weights" in stderr and "--force" in stderr
    assert sorted(p.name for p in out.iterdir()) == sorted([CARD_FILE, *OLD_FILES, "notes.txt"])

    code, stdout, stderr = _run([*TINY, "--out", str(out), "--force"])
    assert code == 0, stderr
    removed = ", ".join(OLD_FILES)
    assert f"--force: removed from {out}, made for the old weights: {removed}\n" in stderr
    assert sorted(p.name for p in out.iterdir()) == sorted([CARD_FILE, "model.safetensors",
                                                            "notes.txt"])  # fmt: skip
    card = load_model(out).card
    assert "--force" not in card.training.command  # the recorded command changes no number
    # the recorded command runs again as it is: every word of it is a flag of train
    recorded = build_parser().parse_args(shlex.split(card.training.command)[1:])
    assert recorded.command == "train" and recorded.out == out
    assert json.loads(stdout)["model"] == str(out)

    # --resume with the run's checkpoint continues the run that wrote --out (bench/long_runs.py
    # grows a run's epochs): allowed without --force. Weights unchanged (the run was done):
    # its calibration and detector still describe them and stay.
    for name in OLD_FILES:
        (out / name).write_text("of these weights")
    sha = load_model(out).card.weights_sha256
    code, _, stderr = _run([*TINY, "--out", str(out), "--resume"])
    assert code == 0, stderr
    assert load_model(out).card.weights_sha256 == sha and "removed" not in stderr
    assert all((out / name).read_text() == "of these weights" for name in OLD_FILES)
    # more epochs: new weights, so the files go, and the line names --resume
    code, _, stderr = _run([*TINY[:4], "2", *TINY[5:], "--out", str(out), "--resume"])
    assert code == 0, stderr
    assert load_model(out).card.weights_sha256 != sha
    assert f"--resume: removed from {out}, made for the old weights: {removed}\n" in stderr
    assert not any((out / name).exists() for name in OLD_FILES)
    # --resume into another run's --out (another name: not this checkpoint's) is refused
    other = [*TINY, "--name", "other-run", "--out", str(out), "--resume"]
    code, _, stderr = _run(other)
    assert code == 2 and "already holds a model" in stderr


def test_resume_refuses_an_out_another_run_of_the_same_name_wrote(
    tmp_path: Path, data_env: None
) -> None:
    """Same name is not the same run: a calibrated model in --out, written by one run, is not
    replaced by ``--resume`` with the checkpoint of another run of that preset (other data,
    other checkpoint folder) — it used to be, its calibration and detector removed. The run
    that wrote it still resumes into it; a checkpoint without the record (older) is trusted."""
    out, mine, theirs = tmp_path / "model", tmp_path / "ckpt-mine", tmp_path / "ckpt-theirs"
    assert _run([*TINY, "--out", str(out), "--checkpoint-dir", str(mine)])[0] == 0
    other_out = tmp_path / "other"
    other = [*TINY[:6], "80", *TINY[7:], "--checkpoint-dir", str(theirs)]  # --limit 80
    assert _run([*other, "--out", str(other_out)])[0] == 0
    for name in OLD_FILES:
        (out / name).write_text("of these weights")
    sha = load_model(out).card.weights_sha256

    code, stdout, stderr = _run([*other, "--out", str(out), "--resume"])
    assert code == 2 and stdout == "" and stderr.count("\n") == 1, stderr
    assert stderr.startswith(f"bayesgate: error: --resume: the model in --out {out} was not ")
    assert f"{theirs} (that run wrote: {other_out.resolve()})" in stderr and "--force" in stderr
    assert load_model(out).card.weights_sha256 == sha
    assert all((out / name).read_text() == "of these weights" for name in OLD_FILES)

    code, _, stderr = _run([*TINY, "--out", str(out), "--checkpoint-dir", str(mine), "--resume"])
    assert code == 0 and "removed" not in stderr, stderr
    (mine / "outputs.json").unlink()  # as a checkpoint written before the record existed
    code, _, stderr = _run([*TINY, "--out", str(out), "--checkpoint-dir", str(mine), "--resume"])
    assert code == 0 and "keeps no record of the models it wrote" in stderr, stderr
    code, _, stderr = _run([*other, "--out", str(out), "--resume", "--force"])
    assert code == 0 and "--force: removed from" in stderr, stderr


def test_an_interrupted_new_run_over_a_finished_checkpoint_cannot_resume_into_the_old_out(
    tmp_path: Path, data_env: None, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Run 1 finishes into A; run 2 starts afresh in the same checkpoint folder (its own --out
    B) and is interrupted after its first epoch: its checkpoint is not the one that wrote A, so
    ``--resume --out A`` is refused. The record is cleared when run 2 starts, not when it ends
    (the review's bypass) — and not before its first epoch's checkpoint replaces run 1's (a run
    that fails before that leaves run 1 resumable into A)."""
    from bayesgate.models.training import train as training

    out, ckpt = tmp_path / "A", tmp_path / "ckpt"
    first = [*TINY, "--checkpoint-dir", str(ckpt)]
    assert _run([*first, "--out", str(out)])[0] == 0
    (out / "calibration.json").write_text("A's")
    save, saves = training._save, []

    def interrupted_after_one_epoch(*args: object, **kwargs: object) -> None:
        if saves:  # Ctrl-C in the second epoch, before its checkpoint
            raise KeyboardInterrupt
        save(*args, **kwargs)
        saves.append(1)

    second = [*TINY[:4], "3", *TINY[5:], "--checkpoint-dir", str(ckpt)]  # --epochs 3
    with monkeypatch.context() as mp:
        mp.setattr(training, "_save", interrupted_after_one_epoch)
        assert _run([*second, "--out", str(tmp_path / "B")])[0] == 130 and saves == [1]
    code, _, stderr = _run([*second, "--out", str(out), "--resume"])
    assert code == 2 and "was not written by the run of the checkpoint" in stderr, stderr
    assert (out / "calibration.json").read_text() == "A's"
    code, _, stderr = _run([*second, "--out", str(tmp_path / "B"), "--resume"])
    assert code == 0, stderr

    # a new run over run 3's finished checkpoint that stops before its first checkpoint leaves
    # run 3's record: run 3 still resumes into its --out
    third = [*TINY, "--checkpoint-dir", str(tmp_path / "ckpt3")]
    assert _run([*third, "--out", str(tmp_path / "C")])[0] == 0

    def interrupted_before_its_first_checkpoint(*args: object, **kwargs: object) -> None:
        raise KeyboardInterrupt

    with monkeypatch.context() as mp:
        mp.setattr(training, "_save", interrupted_before_its_first_checkpoint)
        assert _run([*third, "--out", str(tmp_path / "D")])[0] == 130
    code, _, stderr = _run([*third, "--out", str(tmp_path / "C"), "--resume"])
    assert code == 0 and "not written" not in stderr, stderr


def test_the_stale_files_are_what_calibrate_and_fit_detector_write() -> None:
    pytest.importorskip("matplotlib")
    from bayesgate.attacks import report
    from bayesgate.models.detection import store
    from bayesgate.models.store.directory import CALIBRATION_FILE

    written = {CALIBRATION_FILE, report.REPORT_FILE, report.ROC_FILE, report.HIST_FILE,
               store.DETECTOR_JSON, store.DETECTOR_TENSORS}  # fmt: skip
    assert set(models_cli.STALE_FILES) == written == set(OLD_FILES)


def test_a_mirror_failure_names_where_the_mirrors_came_from(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    dead = "http://127.0.0.1:9/"  # the discard port: nothing listens
    argv = ["fetch-data", "--data-dir", str(tmp_path), "--mirror", dead, "--timeout", "5",
            "--no-progress"]  # fmt: skip
    assert main(argv) == 2
    err = capsys.readouterr().err
    assert err.startswith("bayesgate: error: could not download") and err.count("\n") == 1
    assert "(try another --mirror or copy the original file there)" in err
    assert "BAYESGATE_MNIST_MIRRORS" not in err
    monkeypatch.setenv("BAYESGATE_MNIST_MIRRORS", dead)
    with pytest.raises(Exception, match=r"\(set BAYESGATE_MNIST_MIRRORS or copy the original"):
        download_mnist(tmp_path, files=["t10k-labels-idx1-ubyte.gz"], timeout=5)
