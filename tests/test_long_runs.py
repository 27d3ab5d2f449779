"""bench/long_runs.py: every registered run is a valid resumable ``bayesgate train`` command, and
``status`` reads a checkpoint's history as the trainer writes it."""

from __future__ import annotations

import importlib.util
import json
import shutil
import subprocess
import sys
import time
from pathlib import Path
from types import ModuleType
from typing import Any

import pytest
from bench_scripts import run_bayesgate

from bayesgate.cli import build_parser

ROOT = Path(__file__).resolve().parents[1]


def load_long_runs() -> ModuleType:
    spec = importlib.util.spec_from_file_location("long_runs", ROOT / "bench" / "long_runs.py")
    assert spec is not None and spec.loader is not None
    module = importlib.util.module_from_spec(spec)
    sys.modules["long_runs"] = module
    spec.loader.exec_module(module)
    return module


def test_every_run_parses_as_a_resumable_train_command(private_user_cache: Path) -> None:
    long_runs = load_long_runs()
    kinds = set()
    for run in long_runs.RUNS.values():
        args = build_parser().parse_args(run.argv("bayesgate")[1:])
        kinds.add(args.command)
        assert args.command == run.command and args.resume and args.threads == 1
        assert Path(args.out).is_relative_to(private_user_cache / "bayesgate")
        if run.command == "train":
            assert args.name == run.name and args.epochs == run.total
            assert (
                Path(args.checkpoint_dir) == private_user_cache / "bayesgate/checkpoints" / run.name
            )
        else:
            assert args.learn_tau and args.splits == run.total and args.alpha == [0.5]
    assert kinds == {"train", "uci"}


def test_a_longer_uci_pass_differs_from_its_first_pass_only_in_epochs(
    private_user_cache: Path,
) -> None:
    """A second, longer pass must be comparable with the first: same dataset, splits, α, p grid
    and learned τ; only the epochs (and its own output folder) differ."""
    long_runs = load_long_runs()
    for dataset, epochs in long_runs.UCI_LONGER.items():
        first = long_runs.RUNS[f"uci-{dataset}-learned-tau"]
        longer = long_runs.RUNS[f"uci-{dataset}-learned-tau-{epochs}ep"]
        a = vars(build_parser().parse_args(first.argv("bayesgate")[1:]))
        b = vars(build_parser().parse_args(longer.argv("bayesgate")[1:]))
        assert b["epochs"] == epochs > a["epochs"] and b["out"] != a["out"]
        assert {k: v for k, v in a.items() if k not in ("epochs", "out")} == {
            k: v for k, v in b.items() if k not in ("epochs", "out")
        }


def test_the_gal_recipe_pass_differs_from_its_first_pass_only_in_the_optimiser_recipe(
    private_user_cache: Path,
) -> None:
    """Concrete's third pass changes what Gal's scripts changed (epochs, lr, batch size) and
    nothing else: the dataset, splits, α, p grid and learned τ are the first pass's."""
    long_runs = load_long_runs()
    for dataset in long_runs.UCI_GAL_RECIPE:
        first = long_runs.RUNS[f"uci-{dataset}-learned-tau"]
        recipe = long_runs.RUNS[f"uci-{dataset}-learned-tau-gal-recipe"]
        a = vars(build_parser().parse_args(first.argv("bayesgate")[1:]))
        b = vars(build_parser().parse_args(recipe.argv("bayesgate")[1:]))
        assert (b["epochs"], b["lr"], b["batch_size"]) == (400, 1e-3, 32)
        assert (a["lr"], a["batch_size"]) == (1e-2, 128) and b["out"] != a["out"]
        changed = ("epochs", "lr", "batch_size", "out")
        assert {k: v for k, v in a.items() if k not in changed} == {
            k: v for k, v in b.items() if k not in changed
        }


def test_status_reads_the_history_and_start_skips_finished_runs(
    private_user_cache: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    long_runs = load_long_runs()
    run = long_runs.RUNS["mlp-3x1000-det-long"]
    run.checkpoint.mkdir(parents=True)
    rows = [
        {"epoch": e, "val_accuracy": a, "val_log_likelihood": ll, "seconds": 40.0}
        for e, a, ll in [(1, 0.95, -0.2), (2, 0.97, -0.1), (3, 0.975, -0.12)]
    ]
    (run.checkpoint / "history.jsonl").write_text("".join(json.dumps(r) + "\n" for r in rows))
    monitor = {"epoch": 3, "monitor_robust_acc": 0.25, "val_accuracy": 0.1}  # the epoch log's
    (run.checkpoint / "epochs.jsonl").write_text(json.dumps(monitor) + "\n")
    (row,) = long_runs.status_rows([run])
    assert row["done"] == "3/100" and row["val_acc"] == 0.975  # history wins where both say
    assert row["robust_acc"] == 0.25
    assert row["best_ll_epoch"] == 2 and row["state"] == "–"
    (run.checkpoint / "pid").write_text("1\n")  # pid 1 is not this training
    assert long_runs.pid_alive(run) is None
    done = [dict(rows[0], epoch=e) for e in range(1, 101)]
    (run.checkpoint / "history.jsonl").write_text("".join(json.dumps(r) + "\n" for r in done))
    assert long_runs.main(["start", run.name]) == 0
    assert "finished (100 epochs)" in capsys.readouterr().out
    assert long_runs.main(["start", "no-such-run"]) == 2
    assert long_runs.main(["curves", str(private_user_cache / "curves"), run.name]) == 0
    assert (private_user_cache / "curves" / "long-runs.png").stat().st_size > 1000
    copied = (private_user_cache / "curves" / f"{run.name}.jsonl").read_text().splitlines()
    assert len(copied) == 100 and json.loads(copied[2])["monitor_robust_acc"] == 0.25


def test_uci_progress_counts_finished_splits(private_user_cache: Path) -> None:
    long_runs = load_long_runs()
    run = long_runs.RUNS["uci-yacht-learned-tau"]
    assert long_runs.progress(run) == 0 and run.total == 20
    run.out.mkdir(parents=True)
    header = "dataset,split,alpha,dropout,tau\n"
    rows = "".join(f"yacht,{split},0.5,0.01,2.0\n" for split in (0, 1, 2))
    (run.out / "results.csv").write_text(header + rows)
    assert long_runs.progress(run) == 3
    assert long_runs.status_rows([run])[0]["done"] == "3/20"


def test_a_running_uci_sweep_is_seen_as_running(private_user_cache: Path) -> None:
    """A UCI sweep's command line names its output directory, not the run: ``status`` must
    still see it running and ``start`` must not start it twice."""
    long_runs = load_long_runs()
    run = long_runs.RUNS["uci-power-plant-learned-tau-200ep"]
    run.out.mkdir(parents=True)
    stand_in = [sys.executable, "-c", "import time; time.sleep(30)", "--out", str(run.out)]
    child = subprocess.Popen(stand_in)
    try:
        cmdline = Path(f"/proc/{child.pid}/cmdline")
        deadline = time.monotonic() + 10
        while str(run.out).encode() not in cmdline.read_bytes().split(b"\0"):  # until exec'd
            assert time.monotonic() < deadline, "the stand-in process never started"
            time.sleep(0.01)
        (run.checkpoint / "pid").write_text(f"{child.pid}\n")
        assert long_runs.pid_alive(run) == child.pid
        shorter = long_runs.RUNS["uci-power-plant-learned-tau"]  # its out is a prefix of this one
        (shorter.checkpoint).mkdir(parents=True)
        (shorter.checkpoint / "pid").write_text(f"{child.pid}\n")
        assert long_runs.pid_alive(shorter) is None
        assert long_runs.status_rows([run])[0]["state"] == "running"
    finally:
        child.kill()
        child.wait()


def test_a_started_run_gets_the_lowest_autogroup_priority() -> None:
    """A run in its own session must not outrank the user's work: its autogroup gets nice 19
    where the kernel has autogroups, and the call says False where it has none."""
    long_runs = load_long_runs()
    child = subprocess.Popen(["sleep", "30"], start_new_session=True)
    try:
        group = Path(f"/proc/{child.pid}/autogroup")
        has_groups = group.is_file()
        assert long_runs.lowest_group_priority(child.pid) is has_groups
        if has_groups:
            assert group.read_text().split()[-2:] == ["nice", "19"]
    finally:
        child.kill()
        child.wait()


def _tiny_keep_best_run(
    monkeypatch: pytest.MonkeyPatch, name: str, lr: str, epochs_done: int
) -> tuple[ModuleType, Any, str]:
    """A registered tiny ``--keep-best`` run (6-epoch cap) trained for ``epochs_done`` epochs:
    ``(long_runs module, run, bayesgate executable)``."""
    long_runs = load_long_runs()
    flags = ("--preset", "mlp-2x32", "--alpha", "0.5", "--k-train", "2", "--k-val", "2",
             "--epochs", "6", "--limit", "512", "--val-size", "1000", "--lr", lr,
             "--keep-best", "--no-progress")  # fmt: skip
    run = long_runs.Run(name, "train", flags, 17)
    monkeypatch.setitem(long_runs.RUNS, run.name, run)
    bayesgate = str(Path(sys.executable).with_name("bayesgate"))
    argv = long_runs.export_argv(run, bayesgate, run.checkpoint, run.out, epochs_done)
    run_bayesgate(argv)
    return long_runs, run, bayesgate


def test_export_writes_the_best_epoch_without_touching_the_running_checkpoint(
    private_user_cache: Path, mnist_root: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """``export`` resumes a *copy* of the checkpoint with ``--epochs`` cut to the epochs done:
    the model it writes equals a fresh run trained to the best-LL epoch (same seed), and the
    run's own checkpoint is left as it was, so a run still going is not disturbed."""
    from safetensors.torch import load_file

    monkeypatch.setenv("BAYESGATE_DATA_DIR", str(mnist_root))
    # three of the six epochs done, as a run interrupted (or still going) would have them
    long_runs, run, bayesgate = _tiny_keep_best_run(monkeypatch, "tiny-long", "0.05", 3)
    before = {p.name: p.stat().st_mtime_ns for p in run.checkpoint.iterdir()}
    history = [json.loads(line) for line in (run.checkpoint / "history.jsonl").open()]
    best = max(history, key=lambda r: r["val_log_likelihood"])["epoch"]

    out = private_user_cache / "exported"
    assert long_runs.main(["export", run.name, str(out)]) == 0
    assert {p.name: p.stat().st_mtime_ns for p in run.checkpoint.iterdir()} == before
    card = json.loads((out / "card.json").read_text())
    assert card["training"]["best_epoch"] == best and card["training"]["epochs_run"] == 3
    # exporting again into the same directory replaces the earlier export (train alone refuses
    # it: the checkpoint copy never wrote it); the same weights keep their calibration
    (out / "calibration.json").write_text("of these weights")
    assert long_runs.main(["export", run.name, str(out)]) == 0
    assert (out / "calibration.json").read_text() == "of these weights"
    # any other model there is refused — one of the same name too (not an export of this run)
    other = private_user_cache / "other-model"
    shutil.copytree(out, other)
    (other / long_runs.EXPORT_RECORD).unlink()
    (other / "calibration.json").write_text("of the other model")
    assert long_runs.main(["export", run.name, str(other)]) == 2
    (other / "card.json").write_text(json.dumps({**card, "name": "someone-else"}))
    assert long_runs.main(["export", run.name, str(other)]) == 2
    assert json.loads((other / "card.json").read_text())["name"] == "someone-else"
    assert (other / "calibration.json").read_text() == "of the other model"

    fresh = private_user_cache / "fresh"
    argv = long_runs.export_argv(run, bayesgate, private_user_cache / "fresh-ckpt", fresh, best)
    argv.remove("--keep-best")
    run_bayesgate(argv)
    exported, reference = (
        load_file(out / "model.safetensors"),
        load_file(fresh / "model.safetensors"),
    )
    assert exported.keys() == reference.keys()
    assert all(exported[k].equal(reference[k]) for k in reference)
    assert long_runs.main(["export", "no-such-run", str(out)]) == 2


def test_export_last_writes_the_last_epoch_with_its_own_metrics(
    private_user_cache: Path, mnist_root: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """``export --last`` writes the last finished epoch's weights of a ``--keep-best`` run: equal
    to a fresh run trained that many epochs without ``--keep-best`` (same seed), named
    ``NAME-last``, with that epoch's validation metrics; the run's checkpoint is untouched."""
    from safetensors.torch import load_file

    monkeypatch.setenv("BAYESGATE_DATA_DIR", str(mnist_root))
    long_runs, run, bayesgate = _tiny_keep_best_run(monkeypatch, "tiny-last", "0.1", 4)
    before = {p.name: p.stat().st_mtime_ns for p in run.checkpoint.iterdir()}
    history = [json.loads(line) for line in (run.checkpoint / "history.jsonl").open()]
    best = max(history, key=lambda r: r["val_log_likelihood"])["epoch"]
    assert best < 4  # this lr overshoots at epoch 4, so the best-LL and the last weights differ

    out = private_user_cache / "last"
    assert long_runs.main(["export", run.name, str(out), "--last"]) == 0
    assert {p.name: p.stat().st_mtime_ns for p in run.checkpoint.iterdir()} == before
    card = json.loads((out / "card.json").read_text())
    assert card["name"] == "tiny-last-last"
    assert card["training"]["best_epoch"] == 4 and card["training"]["epochs_run"] == 4
    assert card["metrics"]["val"]["log_likelihood"] == pytest.approx(
        history[3]["val_log_likelihood"], abs=1e-5
    )

    fresh = private_user_cache / "fresh-last"
    argv = long_runs.export_argv(run, bayesgate, private_user_cache / "fresh-last-ckpt", fresh, 4)
    argv.remove("--keep-best")
    run_bayesgate(argv)
    exported = load_file(out / "model.safetensors")
    reference = load_file(fresh / "model.safetensors")
    assert exported.keys() == reference.keys()
    assert all(exported[k].equal(reference[k]) for k in reference)
    default = private_user_cache / "best-of-last"  # without --last: the best-LL epoch's
    assert long_runs.main(["export", run.name, str(default)]) == 0
    kept = load_file(default / "model.safetensors")
    assert any(not kept[k].equal(reference[k]) for k in reference)


def test_export_last_refuses_a_run_that_keeps_its_last_weights_anyway(
    private_user_cache: Path, monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    long_runs = load_long_runs()
    run = long_runs.Run("tiny-no-best", "train", ("--preset", "mlp-2x32", "--epochs", "2"), 17)
    monkeypatch.setitem(long_runs.RUNS, run.name, run)
    assert long_runs.main(["export", run.name, str(private_user_cache / "x"), "--last"]) == 2
    assert "keeps its last weights anyway" in capsys.readouterr().err
    assert not (private_user_cache / "x").exists()


def test_a_run_stopped_by_its_patience_is_converged_and_not_restarted(
    private_user_cache: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    """Early stopping ends a run before its ``--epochs`` cap: ``status`` calls it converged and
    ``start`` does not resume it; a checkpoint that merely has fewer epochs is not finished."""
    long_runs = load_long_runs()
    run = long_runs.RUNS["mlp-3x1000-alpha1-long"]
    run.checkpoint.mkdir(parents=True)
    rows = [{"epoch": e, "val_accuracy": 0.98, "val_log_likelihood": -0.1 - e, "seconds": 1.0}
            for e in (1, 2, 3)]  # fmt: skip
    (run.checkpoint / "history.jsonl").write_text("".join(json.dumps(r) + "\n" for r in rows))
    state = {"progress": {"epoch": 3, "stopped": False}}
    (run.checkpoint / "checkpoint.json").write_text(json.dumps(state))
    assert not long_runs.finished(run) and long_runs.status_rows([run])[0]["state"] == "–"
    state["progress"]["stopped"] = True
    (run.checkpoint / "checkpoint.json").write_text(json.dumps(state))
    assert long_runs.finished(run)
    assert long_runs.status_rows([run])[0]["state"] == "converged"
    assert long_runs.main(["start", run.name]) == 0
    assert "converged (3 epochs)" in capsys.readouterr().out
    assert long_runs.pid_alive(run) is None


def test_every_mnist_run_keeps_its_best_weights_and_stops_at_the_same_patience(
    private_user_cache: Path,
) -> None:
    long_runs = load_long_runs()
    seeds: dict[str, set[int]] = {}
    for run in long_runs.RUNS.values():
        if run.command != "train" or run is long_runs.ROBUST:
            continue
        args = build_parser().parse_args(run.argv("bayesgate")[1:])
        assert args.keep_best and args.patience == int(long_runs.PATIENCE), run.name
        seeds.setdefault(run.name.split("-seed")[0], set()).add(args.seed)
    figure4 = {f"mlp-2x100-{tag}" for tag in ("alpha0", "alpha0.5", "alpha1", "det")}
    figure5 = {f"cnn-{tag}-long" for tag in ("alpha0", "alpha0.5", "alpha1", "det")}
    for name in figure4 | figure5:
        assert seeds[name] == {0, 1, 2}, name


def test_the_queue_runs_its_runs_one_after_another(
    private_user_cache: Path, mnist_root: Path, monkeypatch: pytest.MonkeyPatch,
    capsys: pytest.CaptureFixture[str],
) -> None:  # fmt: skip
    """``drain`` (the queue's loop) with ``--jobs 1`` starts the second run only after the first
    ended, leaves a finished run alone, and returns when all have ended."""
    monkeypatch.setenv("BAYESGATE_DATA_DIR", str(mnist_root))
    long_runs = load_long_runs()
    flags = ("--preset", "mlp-2x32", "--alpha", "0.5", "--k-train", "2", "--k-val", "2",
             "--epochs", "2", "--limit", "256", "--val-size", "500", "--no-progress")  # fmt: skip
    runs = [long_runs.Run(f"tiny-queue-{i}", "train", flags, 17) for i in range(3)]
    monkeypatch.setattr(long_runs, "RUNS", {run.name: run for run in runs})
    done = runs[2]  # already finished: two epochs in its history
    done.checkpoint.mkdir(parents=True)
    rows = [{"epoch": e, "val_accuracy": 0.5, "val_log_likelihood": -1.0} for e in (1, 2)]
    (done.checkpoint / "history.jsonl").write_text("".join(json.dumps(r) + "\n" for r in rows))

    assert long_runs.main(["drain", "--jobs", "1", "--poll", "0.2", *long_runs.RUNS]) == 0
    log = capsys.readouterr().out.splitlines()
    events = [line.split(": ")[0].split()[-1] + ": " + line.split(": ")[1].split()[0]
              for line in log if "tiny-queue" in line]  # fmt: skip
    assert events == [
        "tiny-queue-0: started", "tiny-queue-0: ended",
        "tiny-queue-1: started", "tiny-queue-1: ended",
    ]  # fmt: skip
    assert all(long_runs.progress(run) == 2 for run in runs)
    assert long_runs.main(["queue", "--jobs", "0", "tiny-queue-0"]) == 2


def test_a_live_queue_is_seen_refused_twice_and_ended_by_stop(
    private_user_cache: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    """``queue`` refuses to start a second scheduler while one is alive, and ``stop`` without
    names ends it (before the runs, so it cannot start the next one)."""
    long_runs = load_long_runs()
    stand_in = [sys.executable, "-c", "import time; time.sleep(30)", "/x/long_runs.py", "drain"]
    child = subprocess.Popen(stand_in)
    try:
        long_runs.QUEUE_PID.parent.mkdir(parents=True, exist_ok=True)
        long_runs.QUEUE_PID.write_text(f"{child.pid}\n")
        deadline = time.monotonic() + 10
        while long_runs.queue_alive() != child.pid:  # until the stand-in has exec'd
            assert time.monotonic() < deadline, "the stand-in queue never started"
            time.sleep(0.01)
        assert long_runs.main(["queue", "cnn-det-long"]) == 1
        assert "already running" in capsys.readouterr().err
        assert long_runs.main(["stop"]) == 0
        assert child.wait(timeout=10) != 0 and long_runs.queue_alive() is None
        assert f"queue: SIGTERM sent to {child.pid}" in capsys.readouterr().out
    finally:
        child.kill()
        child.wait()


def test_runs_without_their_data_are_refused_before_anything_starts(
    private_user_cache: Path, mnist_root: Path, tmp_path: Path, monkeypatch: pytest.MonkeyPatch,
    capsys: pytest.CaptureFixture[str],
) -> None:  # fmt: skip
    """``start`` and ``queue`` name the missing MNIST files (or UCI folder) and the variable to set,
    and start nothing; with the data in place the same check passes."""
    long_runs = load_long_runs()
    empty = tmp_path / "empty-data"
    (empty / "mnist").mkdir(parents=True)
    (empty / "mnist" / "train-images-idx3-ubyte.gz").write_bytes(b"")  # one of the four
    monkeypatch.setenv("BAYESGATE_DATA_DIR", str(empty))
    for command in ("start", "queue"):
        assert long_runs.main([command, "cnn-det-long-seed2"]) == 2
        err = capsys.readouterr().err
        assert "no MNIST train-labels-idx1-ubyte.gz, t10k-images-idx3-ubyte.gz" in err
        assert "train-images" not in err and "BAYESGATE_DATA_DIR" in err
    assert not long_runs.RUNS["cnn-det-long-seed2"].checkpoint.exists()
    assert long_runs.queue_alive() is None
    uci = long_runs.RUNS["uci-yacht-learned-tau"]
    assert long_runs.missing_data([uci]) == (
        f"uci-yacht-learned-tau: no UCI folder {empty / 'uci' / 'yacht'} (BAYESGATE_DATA_DIR)"
    )
    monkeypatch.setenv("BAYESGATE_DATA_DIR", str(mnist_root))
    assert long_runs.missing_data([long_runs.RUNS["cnn-det-long-seed2"], uci]) is None


def test_a_run_that_ends_unfinished_is_reported_with_the_last_line_of_its_log(
    private_user_cache: Path, mnist_root: Path, monkeypatch: pytest.MonkeyPatch,
    capsys: pytest.CaptureFixture[str],
) -> None:  # fmt: skip
    """A run whose ``bayesgate train`` fails says why in the queue's log, not only "see the log"."""
    monkeypatch.setenv("BAYESGATE_DATA_DIR", str(mnist_root))
    long_runs = load_long_runs()
    flags = ("--preset", "no-such-preset", "--epochs", "2", "--no-progress")
    run = long_runs.Run("tiny-broken", "train", flags, 17)
    monkeypatch.setattr(long_runs, "RUNS", {run.name: run})
    assert long_runs.main(["drain", "--jobs", "1", "--poll", "0.2", run.name]) == 0
    line = next(x for x in capsys.readouterr().out.splitlines() if "tiny-broken: ended" in x)
    assert "ended UNFINISHED (train.log: " in line and "no-such-preset" in line
