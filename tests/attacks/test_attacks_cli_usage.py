"""What a new user of the attack-side commands meets: no flag silently ignored (``attack --spec``
with ``--attack`` or a parameter flag), no default output inside the repository's docs (``sweep``),
``--threads`` on every command that computes, and a note when existing results are replaced."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest

from bayesgate.attacks import cli as attacks_cli
from bayesgate.cli import build_parser, main


def _never(*args: Any, **kwargs: Any) -> Any:
    raise AssertionError("the work started before the arguments were checked")


def _error(capsys: pytest.CaptureFixture[str]) -> str:
    """The one line printed on stderr (and nothing else)."""
    err = capsys.readouterr().err
    assert err.count("\n") == 1 and err.startswith("bayesgate: error: "), err
    return err.strip().removeprefix("bayesgate: error: ")


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
    attack = attacks_cli._attack(args)
    assert attack.name == name
    assert {key: getattr(attack, key) for key in params} == params
