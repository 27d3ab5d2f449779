"""What a new user of the attack-side commands meets: no flag silently ignored (``attack --spec``
with ``--attack`` or a parameter flag), no default output inside the repository's docs (``sweep``),
``--threads`` on every command that computes, and a note when existing results are replaced."""

from __future__ import annotations

import json
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

from bayesgate.attacks import cli as attacks_cli
from bayesgate.cli import build_parser, main, subcommand_parsers
from tests.cli_checks import never as _never
from tests.cli_checks import one_error_line as _error

PARSERS = subcommand_parsers(build_parser())


# --- attack: --spec is the whole attack ------------------------------------------------------


@pytest.mark.parametrize(
    ("flags", "named"),
    [
        (["--eps", "0.1"], "--eps"),
        (["--attack", "fgs"], "--attack"),  # the default attack, typed: still a conflict
        (
            ["--attack", "pgd", "--eps-iter", "0.02", "--steps", "5"],
            "--attack, --steps, --eps-iter",
        ),
    ],
)
def test_attack_refuses_spec_with_attack_or_parameter_flags(
    flags: list[str],
    named: str,
    tmp_path: Path,
    tiny_model_dir: Path,
    monkeypatch: pytest.MonkeyPatch,
    capsys: pytest.CaptureFixture[str],
) -> None:
    monkeypatch.setattr("bayesgate.attacks.run.run_attack", _never)
    argv = ["attack", str(tiny_model_dir), "--spec", "pgd:eps=0.3", *flags,
            "--out", str(tmp_path / "adv.npz"), "--no-progress"]  # fmt: skip
    assert main(argv) == 2
    err = _error(capsys)
    assert err.startswith(f"--spec cannot be combined with {named}: "), err
    assert not (tmp_path / "adv.npz").exists()


@pytest.mark.parametrize(
    ("flags", "name", "params"),
    [
        ([], "fgs", {}),  # neither: the default attack
        (["--spec", "pgd:eps=0.2,steps=2"], "pgd", {"eps": 0.2, "steps": 2}),
        (["--attack", "pgd", "--eps", "0.2", "--steps", "2"], "pgd", {"eps": 0.2, "steps": 2}),
        (["--eta", "0.1"], "fgs", {"eta": 0.1}),
    ],
)
def test_attack_takes_either_form_alone(
    flags: list[str], name: str, params: dict[str, Any]
) -> None:
    args = build_parser().parse_args(["attack", "m", "--out", "x.npz", *flags])
    attack = attacks_cli._attack_parameters(args)
    assert attack.name == name
    assert {key: getattr(attack, key) for key in params} == params


# --- --threads on every command that computes ------------------------------------------------

THREADS_COMMANDS = {  # a command line up to --threads; every one loads the tiny model first
    "evaluate": ["evaluate", "{model}", "--limit", "5", "--k", "2"],
    "attack": ["attack", "{model}", "--out", "{tmp}/adv.npz", "--limit", "5"],
    "calibrate": ["calibrate", "{model}", "--val-limit", "5", "--test-limit", "5"],
    "sweep": ["sweep", "{model}", "--figure", "6", "--limit", "5", "--out", "{tmp}/s"],
    "evaluate-robust": ["evaluate-robust", "{model}", "--n", "5", "--out", "{tmp}/r"],
}


def _argv(command: str, model: Path, tmp_path: Path, *more: str) -> list[str]:
    words = [w.format(model=model, tmp=tmp_path) for w in THREADS_COMMANDS[command]]
    return [*words, *more, "--no-progress"]


@pytest.fixture
def no_model_loading(monkeypatch: pytest.MonkeyPatch) -> None:
    """Loading a model fails the test: the flags must have been checked (and applied) before."""
    monkeypatch.setattr("bayesgate.models.store.directory.load_model", _never)
    monkeypatch.setattr("bayesgate.models.cli.load_model", _never)
    monkeypatch.setattr("bayesgate.attacks.robust_cli.load_for_evaluation", _never)


@pytest.mark.parametrize("command", sorted(THREADS_COMMANDS))
def test_threads_below_one_is_refused_before_any_work(
    command: str,
    model_copy: Path,
    tmp_path: Path,
    no_model_loading: None,
    capsys: pytest.CaptureFixture[str],
) -> None:
    assert main(_argv(command, model_copy, tmp_path, "--threads", "0")) == 2
    assert _error(capsys) == "--threads must be ≥ 1, got 0"


@pytest.mark.parametrize("command", sorted(THREADS_COMMANDS))
def test_threads_is_applied_before_the_model_is_loaded(
    command: str,
    model_copy: Path,
    tmp_path: Path,
    no_model_loading: None,
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    import torch

    applied: list[int] = []
    monkeypatch.setattr(torch, "set_num_threads", applied.append)
    with pytest.raises(AssertionError, match="the work started"):
        main(_argv(command, model_copy, tmp_path, "--threads", "3"))
    assert applied == [3]


@pytest.mark.parametrize("command", ["evaluate", "attack", "calibrate", "sweep"])
def test_threads_has_the_same_help_and_default_as_the_other_commands(command: str) -> None:
    (reference,) = [a for a in PARSERS["detect-eval"]._actions if "--threads" in a.option_strings]
    (action,) = [a for a in PARSERS[command]._actions if "--threads" in a.option_strings]
    assert (action.help, action.default, action.type) == (reference.help, None, int)


# --- sweep: the default output folder, per-model seconds -------------------------------------


@pytest.fixture
def restore_threads() -> Iterator[None]:
    import torch

    threads = torch.get_num_threads()
    yield
    torch.set_num_threads(threads)


def test_sweep_writes_into_a_folder_of_the_current_directory_by_default(
    tiny_model_dir: Path,
    tiny_det_dir: Path,
    tmp_path: Path,
    monkeypatch: pytest.MonkeyPatch,
    restore_threads: None,
) -> None:
    """Not ``docs/attacks`` (in a checkout: the committed results) but ``./sweep-figure6``."""
    monkeypatch.chdir(tmp_path)
    argv = ["sweep", str(tiny_det_dir), str(tiny_model_dir), "--figure", "6", "--limit", "5",
            "--k", "2", "--k-eval", "2", "--threads", "1", "--no-progress"]  # fmt: skip
    assert main(argv) == 0
    assert not (tmp_path / "docs").exists()
    out = tmp_path / "sweep-figure6"
    names = {p.name for p in out.iterdir()}
    assert names == {"figure6.csv", "figure6.json", "figure6.md", "figure6.png"}
    meta = json.loads((out / "figure6.json").read_text())
    assert meta["seconds"].keys() == {"tiny-mlp-2x32-det", "tiny-mlp-2x32"}  # one per model
    assert all(s >= 0 for s in meta["seconds"].values())
    assert meta["torch_threads"] == 1


def test_sweep_out_help_names_the_default() -> None:
    (action,) = [a for a in PARSERS["sweep"]._actions if "--out" in a.option_strings]
    assert "sweep-figure6" in action.help and action.default is None


# --- a note when existing results are replaced -----------------------------------------------


def _replacing_lines(err: str) -> list[str]:
    return [line for line in err.splitlines() if "replacing" in line]


def test_attack_says_when_it_replaces_its_out_file(
    tiny_model_dir: Path, tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    out = tmp_path / "adv.npz"
    argv = ["attack", str(tiny_model_dir), "--out", str(out), "--limit", "3", "--k", "2",
            "--k-eval", "2", "--no-progress"]  # fmt: skip
    assert main(argv) == 0
    assert _replacing_lines(capsys.readouterr().err) == []  # a new file: nothing to say
    assert main(argv) == 0
    assert _replacing_lines(capsys.readouterr().err) == [
        f"attack: replacing the existing adv.npz in {tmp_path}"
    ]


@pytest.mark.parametrize(
    ("command", "files", "extra"),
    [
        ("detect-eval", ["detect_eval.json", "detect_eval_roc.png"], []),
        ("adaptive-eval", ["adaptive.md"], []),
        ("evaluate-robust", ["robust.json", "robust.md", "robust.png"], []),
        ("sweep", ["figure6.csv", "figure6.md"], ["--figure", "6"]),
    ],
)
def test_evaluations_say_which_existing_files_they_replace_before_the_work(
    command: str,
    files: list[str],
    extra: list[str],
    tiny_model_dir: Path,
    tmp_path: Path,
    monkeypatch: pytest.MonkeyPatch,
    capsys: pytest.CaptureFixture[str],
) -> None:
    """One line on stderr, before the work (not an error: detect-eval and evaluate-robust resume
    from their caches by design); files that are not the command's own are not named."""
    from bayesgate.attacks import adaptive_eval, detect_eval, evaluate_cli, robust_cli

    # detect-eval and adaptive-eval load the model first (one it cannot use fails before the
    # note); the work they then start is the evaluation
    monkeypatch.setattr(evaluate_cli, "_load", lambda args: (None, None, None))
    monkeypatch.setattr(detect_eval, "evaluate_detector", _never)
    monkeypatch.setattr(adaptive_eval, "evaluate_adaptive", _never)
    monkeypatch.setattr(robust_cli, "load_for_evaluation", _never)
    monkeypatch.setattr(attacks_cli, "_sweep_images", _never)
    out = tmp_path / "out"
    out.mkdir()
    for name in [*files, "notes.txt"]:
        (out / name).write_text("old")
    with pytest.raises(AssertionError, match="the work started"):
        main([command, str(tiny_model_dir), "--out", str(out), *extra, "--no-progress"])
    assert _replacing_lines(capsys.readouterr().err) == [
        f"{command}: replacing the existing {', '.join(files)} in {out}"
    ]
    for name in files:
        (out / name).unlink()
    with pytest.raises(AssertionError, match="the work started"):
        main([command, str(tiny_model_dir), "--out", str(out), *extra, "--no-progress"])
    assert _replacing_lines(capsys.readouterr().err) == []


@pytest.mark.parametrize("command", ["detect-eval", "adaptive-eval"])
def test_a_model_it_cannot_use_is_refused_before_any_replacing_note(
    command: str, tiny_model_dir: Path, tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    """The tiny model has no detector: the error, and no "replacing" line for files it keeps."""
    out = tmp_path / "out"
    out.mkdir()
    (out / ("detect_eval.json" if command == "detect-eval" else "adaptive.md")).write_text("old")
    assert main([command, str(tiny_model_dir), "--out", str(out), "--no-progress"]) == 2
    err = capsys.readouterr().err
    assert "has no detector.json" in err and _replacing_lines(err) == []


def test_detect_eval_with_nothing_to_evaluate_is_refused(
    tiny_model_dir: Path, tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    argv = ["detect-eval", str(tiny_model_dir), "--out", str(tmp_path / "de"), "--attacks", "--ood"]
    assert main(argv) == 2
    assert _error(capsys) == "nothing to evaluate: give --attacks SPEC … or --ood SET …"
    assert not (tmp_path / "de").exists()


@pytest.mark.parametrize(
    ("flags", "note"),
    [(["--attacks", "fgs", "--ood"], "--ood given with no names"),
     (["--attacks", "--ood", "uniform"], "--attacks given with no names")],
)  # fmt: skip
def test_detect_eval_says_a_bare_flag_means_none(
    flags: list[str], note: str, tiny_model_dir: Path, tmp_path: Path,
    capsys: pytest.CaptureFixture[str],
) -> None:  # fmt: skip
    """``--ood`` with no names evaluates no OOD set (not the default four): a note says so,
    before the model is loaded (the tiny model, without a detector, is refused after it)."""
    argv = ["detect-eval", str(tiny_model_dir), "--out", str(tmp_path / "de"), *flags]
    assert main(argv) == 2
    err = capsys.readouterr().err
    assert f"note: {note}: none are evaluated" in err and "has no detector.json" in err
    assert main(["detect-eval", str(tiny_model_dir), "--out", str(tmp_path / "de")]) == 2
    assert "note:" not in capsys.readouterr().err  # nothing bare: no note
