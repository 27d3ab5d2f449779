"""``bayesgate train`` / ``bayesgate evaluate`` end to end through :func:`bayesgate.cli.main`."""

from __future__ import annotations

import contextlib
import gzip
import hashlib
import io
import json
import math
from pathlib import Path

import pytest
import torch

from bayesgate import cli
from bayesgate.cli import main
from bayesgate.models import cli as models_cli
from bayesgate.models.data.mnist import MNIST_FINGERPRINT, load_mnist
from bayesgate.models.mc.engine import mc_predict
from bayesgate.models.store.directory import CARD_FILE, WEIGHTS_FILE, load_model, read_card

MNIST_ORDER = (
    "train-images-idx3-ubyte.gz",
    "train-labels-idx1-ubyte.gz",
    "t10k-images-idx3-ubyte.gz",
    "t10k-labels-idx1-ubyte.gz",
)


def _run(argv: list[str]) -> tuple[int, str, str]:
    out, err = io.StringIO(), io.StringIO()
    with contextlib.redirect_stdout(out), contextlib.redirect_stderr(err):
        code = main(argv)
    return code, out.getvalue(), err.getvalue()


@pytest.fixture(scope="module")
def trained(tmp_path_factory: pytest.TempPathFactory, mnist_root: Path):
    """One `bayesgate train` run shared by the tests: (model dir, exit code, stdout, stderr)."""
    out = tmp_path_factory.mktemp("cli") / "model"
    argv = [
        "train",
        "--preset",
        "mlp-2x32",
        "--epochs",
        "1",
        "--limit",
        "1000",
        "--val-size",
        "1000",
        "--out",
        str(out),
        "--no-progress",
        "--device",
        "cpu",
    ]
    with pytest.MonkeyPatch.context() as mp:
        mp.setenv("BAYESGATE_DATA_DIR", str(mnist_root))
        mp.setenv("XDG_CACHE_HOME", str(out.parent / "cache"))  # checkpoints go there
        code, stdout, stderr = _run(argv)
    return out, code, stdout, stderr


@pytest.fixture
def data_env(monkeypatch: pytest.MonkeyPatch, mnist_root: Path, tmp_path: Path) -> None:
    monkeypatch.setenv("BAYESGATE_DATA_DIR", str(mnist_root))
    monkeypatch.setenv("XDG_CACHE_HOME", str(tmp_path / "cache"))  # default checkpoint folder


def test_train_writes_a_loadable_model(trained, mnist_root: Path) -> None:
    out, code, stdout, stderr = trained
    assert code == 0, stderr
    assert sorted(p.name for p in out.iterdir()) == sorted([CARD_FILE, WEIGHTS_FILE])
    loaded = load_model(out)
    card = loaded.card
    assert card.name == "mlp-2x32-alpha0.5"
    assert card.architecture["preset"] == "mlp-2x32"
    training = card.training
    assert training.alpha == 0.5
    assert training.k_train == 10
    assert training.epochs == 1 and training.epochs_run == 1
    assert training.train_images == 1000
    assert training.val_size == 1000
    assert training.data == "mnist"
    # data_sha256: sha256 of the four decompressed IDX files in order, computed here by hand
    digest = hashlib.sha256()
    for name in MNIST_ORDER:
        digest.update(gzip.decompress((mnist_root / "mnist" / name).read_bytes()))
    assert training.data_sha256 == digest.hexdigest() == MNIST_FINGERPRINT
    # the validation metrics of the run, also printed as JSON on stdout
    report = json.loads(stdout)
    assert report["model"] == str(out)
    assert report["val"] == card.metrics["val"]
    assert 0.0 <= card.metrics["val"]["accuracy"] <= 1.0
    assert math.isfinite(card.metrics["val"]["nll"])
    # one JSON progress line per epoch on stderr
    epochs = [json.loads(line) for line in stderr.splitlines() if line.startswith("{")]
    assert [row["epoch"] for row in epochs] == [1]


def test_train_alpha_and_det_names(tmp_path: Path, data_env: None) -> None:
    code, _, err = _run(
        ["train", "--preset", "mlp-2x32-det", "--epochs", "1", "--limit", "200",
         "--val-size", "100", "--k-train", "7", "--alpha", "0", "--out", str(tmp_path),
         "--no-progress", "--device", "cpu"]
    )  # fmt: skip
    assert code == 0, err
    card = read_card(tmp_path)
    assert card.name == "mlp-2x32-det"
    assert card.architecture["stochastic"] is False
    assert card.training.k_train == 1  # deterministic baselines train with K = 1
    assert card.training.alpha == 0.0


def test_evaluate_writes_metrics_into_the_card(trained, tmp_path: Path, data_env: None) -> None:
    out, code, _, _ = trained
    assert code == 0
    json_path = tmp_path / "metrics.json"
    code, stdout, stderr = _run(
        ["evaluate", str(out), "--k", "5", "--limit", "500", "--json",
         str(json_path), "--no-progress", "--device", "cpu"]
    )  # fmt: skip
    assert code == 0, stderr
    report = json.loads(stdout)
    assert json.loads(json_path.read_text()) == report
    assert (report["split"], report["images"], report["k"]) == ("test", 500, 5)
    assert "test" not in read_card(out).metrics  # no --write-card: the card is unchanged
    # the raw output says how it was made: the command re-runs it, the weights are named
    assert report["command"] == (
        f"bayesgate evaluate {out} --k 5 --split test --limit 500 --batch-size 500 --seed 0 "
        "--device cpu"
    )
    card = read_card(out)
    assert report["weights_sha256"] == card.weights_sha256 and report["stochastic"] is True
    assert report["training"]["epochs_run"] == 1 and report["training"]["command"].startswith(
        "bayesgate train --preset mlp-2x32"
    )
    # recompute accuracy and log-likelihood from the same seeded masks (seed 0, one batch)
    loaded = load_model(out)
    x, y = load_mnist("test", limit=500)
    mc = mc_predict(loaded.network, x, 5, generator=torch.Generator().manual_seed(0))
    accuracy = (mc.probs.mean(1).argmax(1) == y).double().mean().item()
    log_lik = mc.probs.double().gather(2, y.view(-1, 1, 1).expand(-1, 5, 1)).mean(1).log().mean()
    assert report["accuracy"] == pytest.approx(accuracy)
    assert report["log_likelihood"] == pytest.approx(log_lik.item(), rel=1e-5)
    assert report["nll"] == pytest.approx(-log_lik.item(), rel=1e-5)

    # --write-card: the metrics of the whole split (--limit is refused with it) go in the card
    code, stdout, stderr = _run(
        ["evaluate", str(out), "--k", "2", "--write-card", "--no-progress", "--device", "cpu"]
    )
    assert code == 0, stderr
    report = json.loads(stdout)
    assert (report["split"], report["images"], report["k"]) == ("test", 10_000, 2)
    card = read_card(out)
    provenance = ("command", "weights_sha256", "stochastic", "training")
    assert card.metrics["test"] == {
        k: v for k, v in report.items() if k not in ("model", "split", *provenance)
    }
    assert "val" in card.metrics  # earlier metrics kept
    # the weights are untouched: the card's sha256 still verifies
    assert load_model(out).card.weights_sha256 == card.weights_sha256


def test_missing_model_dir_is_a_one_line_error(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    missing = tmp_path / "no-such-model"
    code = main(["evaluate", str(missing), "--k", "2", "--no-progress", "--device", "cpu"])
    captured = capsys.readouterr()
    assert code == 2
    lines = captured.err.strip().splitlines()
    assert len(lines) == 1, captured.err
    assert lines[0].startswith("bayesgate: error: ")
    assert str(missing) in lines[0]
    assert "Traceback" not in captured.err
    assert captured.out == ""


def test_tampered_model_is_a_one_line_error(
    trained, tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    out, _, _, _ = trained
    copy = tmp_path / "copy"
    copy.mkdir()
    for name in (CARD_FILE, WEIGHTS_FILE):
        (copy / name).write_bytes((out / name).read_bytes())
    blob = bytearray((copy / WEIGHTS_FILE).read_bytes())
    blob[-1] ^= 0xFF
    (copy / WEIGHTS_FILE).write_bytes(bytes(blob))
    code = main(["evaluate", str(copy), "--k", "2", "--no-progress", "--device", "cpu"])
    err = capsys.readouterr().err.strip().splitlines()
    assert code == 2
    assert len(err) == 1 and err[0].startswith("bayesgate: error: ") and "sha256" in err[0]


def test_invalid_training_value_is_a_one_line_error(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    code = main(["train", "--preset", "mlp-2x32", "--alpha", "-1", "--out", str(tmp_path / "m"),
                 "--no-progress", "--device", "cpu"])  # fmt: skip
    err = capsys.readouterr().err.strip().splitlines()
    assert code == 2
    assert err == ["bayesgate: error: alpha must be a finite number ≥ 0, got -1.0"]
    assert not (tmp_path / "m").exists()


@pytest.mark.parametrize(("flags", "name"), [(["--patience", "2"], "--patience"),
                                             (["--keep-best"], "--keep-best")])  # fmt: skip
def test_early_stopping_without_validation_data_is_refused(
    tmp_path: Path, capsys: pytest.CaptureFixture[str], flags: list[str], name: str
) -> None:
    code = main(["train", "--preset", "mlp-2x32", *flags, "--val-size", "0",
                 "--out", str(tmp_path / "m"), "--no-progress", "--device", "cpu"])  # fmt: skip
    err = capsys.readouterr().err.strip().splitlines()
    assert code == 2
    assert len(err) == 1 and err[0].startswith(f"bayesgate: error: {name} needs validation data")
    assert not (tmp_path / "m").exists()


@pytest.mark.parametrize(
    ("flags", "message"),
    [
        (["--momentum", "0.5"], "--momentum applies to --optimizer sgd only, not adam (got 0.5)"),
        (
            ["--beta-schedule", "uniform"],
            "--beta-schedule applies to the bbb-* presets only, not mlp-2x32 (got uniform)",
        ),
    ],
)
def test_a_flag_that_cannot_apply_is_refused(
    tmp_path: Path, capsys: pytest.CaptureFixture[str], flags: list[str], message: str
) -> None:
    """Refused before any data is read, instead of being recorded in the card and checkpoint
    unused (a later run sharing the checkpoint was then refused over a setting that never
    mattered). The defaults, which every recorded command names, stay accepted."""
    code = main(["train", "--preset", "mlp-2x32", *flags, "--out", str(tmp_path / "m"),
                 "--no-progress", "--device", "cpu"])  # fmt: skip
    err = capsys.readouterr().err.strip().splitlines()
    assert code == 2 and err == [f"bayesgate: error: {message}"]
    assert not (tmp_path / "m").exists()
    args = cli.build_parser().parse_args(
        ["train", "--preset", "mlp-2x32", "--momentum", "0.9", "--beta-schedule", "blundell"]
    )
    config = models_cli._train_config(args)
    assert (config.momentum, config.beta_schedule) == (0.9, "blundell")


def _weights(model_dir: Path) -> dict[str, torch.Tensor]:
    return load_model(model_dir).network.state_dict()


def test_train_resume_continues_to_the_same_weights(tmp_path: Path, data_env: None) -> None:
    """`--epochs 1`, then `--resume --epochs 2`, equals `--epochs 2` in one go (SGD, the
    authors' plain-SGD settings); a resume with another --lr is refused naming the setting."""
    common = ["train", "--preset", "mlp-2x32", "--limit", "200", "--val-size", "100",
              "--k-train", "2", "--k-val", "2", "--optimizer", "sgd", "--lr", "0.01",
              "--momentum", "0", "--threads", "1", "--no-progress", "--device", "cpu"]  # fmt: skip
    ckpt_dir = tmp_path / "ckpt"
    assert _run([*common, "--epochs", "2", "--out", str(tmp_path / "once")])[0] == 0
    # --force: each sitting writes its model into the same --out, replacing the last one's
    first = [*common, "--checkpoint-dir", str(ckpt_dir), "--out", str(tmp_path / "twice"),
             "--force"]  # fmt: skip
    code, _, stderr = _run([*first, "--epochs", "1", "--resume"])  # nothing to resume yet
    assert code == 0 and f"--resume: no checkpoint in {ckpt_dir} yet; starting at epoch 1" in stderr
    assert _run([*first, "--epochs", "1"])[0] == 0
    code, _, stderr = _run([*first, "--epochs", "2", "--resume", "--lr", "0.02"])
    assert code == 2 and "lr=0.01" in stderr and "lr=0.02" in stderr
    code, _, stderr = _run([*first, "--epochs", "2", "--resume"])
    assert code == 0 and "no checkpoint" not in stderr
    once, twice = _weights(tmp_path / "once"), _weights(tmp_path / "twice")
    assert all(torch.equal(once[k], twice[k]) for k in once)
    training = load_model(tmp_path / "twice").card.training
    assert training.momentum == 0
    # the card's training time covers both sittings: every kept epoch of the checkpoint history
    history = [json.loads(line) for line in (ckpt_dir / "history.jsonl").read_text().splitlines()]
    assert [row["epoch"] for row in history] == [1, 2]
    assert training.seconds == round(sum(row["seconds"] for row in history), 1)
    assert training.model_extra["sitting_seconds"] >= 0
    # the default checkpoint folder of a run without --checkpoint-dir is in the user cache
    assert (tmp_path / "cache" / "bayesgate" / "checkpoints" / "mlp-2x32-alpha0.5").is_dir()


def test_threads_must_be_positive(tmp_path: Path, data_env: None) -> None:
    code, _, stderr = _run(["train", "--preset", "mlp-2x32", "--threads", "0", "--out",
                            str(tmp_path / "m"), "--no-progress"])  # fmt: skip
    assert code == 2 and "--threads must be ≥ 1, got 0" in stderr
    before = torch.get_num_threads()
    try:
        argv = ["train", "--preset", "mlp-2x32", "--threads", "1", "--epochs", "1", "--limit",
                "100", "--val-size", "50", "--k-train", "1", "--k-val", "1", "--out",
                str(tmp_path / "m"), "--no-progress", "--device", "cpu"]  # fmt: skip
        code, _, _ = _run(argv)
        assert code == 0 and torch.get_num_threads() == 1
    finally:
        torch.set_num_threads(before)


@pytest.mark.parametrize(
    ("flags", "message"),
    [
        (["--k", "0"], "--k must be ≥ 1, got 0"),
        (["--k", "-5"], "--k must be ≥ 1, got -5"),
        (["--limit", "0"], "--limit must be ≥ 1, got 0"),
        (["--batch-size", "0"], "--batch-size must be ≥ 1, got 0"),
        (["--seed", "-1"], "--seed must be ≥ 0, got -1"),
    ],
)
def test_evaluate_checks_its_numbers_first(
    tmp_path: Path, capsys: pytest.CaptureFixture[str], flags: list[str], message: str
) -> None:
    """One line naming the flag, before any model or data is read (the model does not exist)."""
    code = main(["evaluate", str(tmp_path / "no-model"), *flags, "--no-progress"])
    err = capsys.readouterr().err.strip().splitlines()
    assert code == 2 and err == [f"bayesgate: error: {message}"]


def test_evaluate_json_path_is_checked_before_the_work(
    trained, tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    out, _, _, _ = trained
    blocker = tmp_path / "a-file"
    blocker.write_text("")
    target = blocker / "metrics.json"  # its folder would have to be inside a file
    code = main(["evaluate", str(out), "--k", "2", "--limit", "5", "--json", str(target),
                 "--no-progress", "--device", "cpu"])  # fmt: skip
    captured = capsys.readouterr()
    assert code == 2 and captured.out == ""  # no metrics printed: it stopped first
    assert captured.err.startswith(f"bayesgate: error: --json {target}: cannot create {blocker}")
    # a folder that does not exist yet is made, as for the other commands' outputs
    nested = tmp_path / "new" / "dir" / "metrics.json"
    code = main(["evaluate", str(out), "--k", "2", "--limit", "5", "--json", str(nested),
                 "--no-progress", "--device", "cpu"])  # fmt: skip
    assert code == 0 and json.loads(nested.read_text())["images"] == 5


@pytest.mark.parametrize("name", ["a/b", "..", " padded"])
def test_train_refuses_a_name_the_service_cannot_serve(
    name: str, tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    """Trained, such a model was refused by ``serve`` afterwards; now before any work."""
    code = main(["train", "--preset", "mlp-2x32", "--name", name, "--epochs", "1",
                 "--out", str(tmp_path / "m"), "--no-progress"])  # fmt: skip
    err = capsys.readouterr().err.strip()
    assert code == 2 and err.startswith("bayesgate: error: --name: ") and "\n" not in err
    assert not (tmp_path / "m").exists()
