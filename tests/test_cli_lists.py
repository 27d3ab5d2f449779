"""List-valued flags take space- and comma-separated values alike (``bayesgate.listflags``):
``evaluate-robust --eps 0.1,0.2`` and ``adaptive-eval --eps 0.1 0.2`` are the same list, and so
is every mix of the two, on every list-valued flag of both commands."""

from __future__ import annotations

import argparse

import pytest

from bayesgate import cli
from bayesgate.listflags import LIST_HELP, list_flag, split_words

PARSERS = cli.subcommand_parsers(cli.build_parser())
LIST_FLAGS = {
    "evaluate-robust": ("--eps", "--attacks", "--adaptive-weights"),
    "adaptive-eval": ("--eps", "--weights", "--joint-weights"),
}
FORMS = (
    ["0.1", "0.2", "0.3"],  # space-separated
    ["0.1,0.2,0.3"],  # comma-separated
    ["0.1,", "0.2,", "0.3"],  # a comma and a space (typed as `0.1, 0.2, 0.3`)
    ["0.1,0.2", "0.3"],  # a mix
    ["0.1", ",", "0.2", ",0.3"],  # spaces around the commas (`0.1 , 0.2 ,0.3`)
)


def _parse(command: str, *flags: str) -> argparse.Namespace:
    return cli.build_parser().parse_args([command, "m", "--out", "x", *flags])


def test_split_words_reads_commas_and_spaces_as_separators() -> None:
    assert split_words(["0.1,0.2", " 0.3 ", ",", "", "0.4"]) == ["0.1", "0.2", "0.3", "0.4"]
    assert split_words(["pgd,", "apgd-ce"]) == ["pgd", "apgd-ce"]
    assert split_words([]) == split_words([","]) == split_words([""]) == []


@pytest.mark.parametrize("words", [["0.1,,0.2"], ["0.1,"], [",0.1"], ["0.1", ",", ",", "0.2"]])
def test_an_empty_item_is_an_error(words: list[str]) -> None:
    """``0.1,,0.2`` is a typo that would silently drop a radius."""
    with pytest.raises(ValueError, match="empty item"):
        split_words(words)


@pytest.mark.parametrize("command", sorted(LIST_FLAGS))
@pytest.mark.parametrize("flag", ["--eps", "weights"])
@pytest.mark.parametrize("words", FORMS)
def test_numbers_in_either_form_are_the_same_list(
    command: str, flag: str, words: list[str]
) -> None:
    if flag == "weights":
        flag = "--adaptive-weights" if command == "evaluate-robust" else "--weights"
    args = _parse(command, flag, *words)
    assert getattr(args, flag[2:].replace("-", "_")) == [0.1, 0.2, 0.3]


def test_evaluate_robust_attacks_in_either_form() -> None:
    for words in (["pgd", "apgd-dlr"], ["pgd,apgd-dlr"], ["pgd,", "apgd-dlr"]):
        assert _parse("evaluate-robust", "--attacks", *words).attacks == ["pgd", "apgd-dlr"]


def test_evaluate_robust_settings_from_either_form() -> None:
    from bayesgate.attacks import robust_cli

    spaced = _parse("evaluate-robust", "--eps", "0.1", "0.3", "--attacks", "pgd", "apgd-ce")
    commas = _parse("evaluate-robust", "--eps", "0.1,0.3", "--attacks", "pgd,apgd-ce")
    assert robust_cli._settings(spaced) == robust_cli._settings(commas)
    assert robust_cli._settings(spaced).eps == (0.1, 0.3)
    assert robust_cli._settings(spaced).attacks == ("pgd", "apgd-ce")


def test_adaptive_eval_joint_weights_may_be_given_without_values() -> None:
    assert _parse("adaptive-eval", "--joint-weights").joint_weights == []
    assert _parse("adaptive-eval", "--joint-weights", "1,10").joint_weights == [1.0, 10.0]


@pytest.mark.parametrize(("command", "flag"), [(c, f) for c, fs in LIST_FLAGS.items() for f in fs])
def test_every_list_flag_says_it_takes_both_forms(command: str, flag: str) -> None:
    (action,) = [a for a in PARSERS[command]._actions if flag in a.option_strings]
    assert LIST_HELP in action.help


@pytest.mark.parametrize(
    ("command", "flag"),
    [("evaluate-robust", "--eps"), ("evaluate-robust", "--adaptive-weights"),
     ("adaptive-eval", "--eps"), ("adaptive-eval", "--joint-weights")],
)  # fmt: skip
def test_a_piece_that_is_no_number_is_one_line_naming_the_flag(
    command: str, flag: str, capsys: pytest.CaptureFixture[str]
) -> None:
    with pytest.raises(SystemExit) as info:
        cli.main([command, "m", "--out", "x", flag, "0.1,x"])
    assert info.value.code == 2
    err = capsys.readouterr().err
    assert err.count("\n") == 1
    assert f"bayesgate {command}: error: argument {flag}: invalid float value: 'x'" in err
    with pytest.raises(SystemExit):
        cli.main([command, "m", "--out", "x", flag, "0.1,,0.2"])
    err = capsys.readouterr().err
    assert f"bayesgate {command}: error: argument {flag}: empty item in '0.1,,0.2'" in err


def test_a_model_after_a_list_flag_is_told_where_to_go(capsys: pytest.CaptureFixture[str]) -> None:
    """A list flag takes every word after it, so a model typed after ``--eps 0.1,0.2`` is read
    as a radius; the error says why and how to write it. ``--`` ends the list when only
    positional arguments follow it."""
    with pytest.raises(SystemExit):
        cli.main(["evaluate-robust", "--eps", "0.1,0.2", "bayesgate-robust", "--out", "x"])
    err = capsys.readouterr().err
    assert "invalid float value: 'bayesgate-robust'" in err
    assert "give it after the positional arguments)" in err
    parser = cli.subcommand_parsers(cli.build_parser())["evaluate-robust"]
    args = parser.parse_args(["--out", "x", "--eps", "0.1,0.2", "--", "bayesgate-robust"])
    assert args.eps == [0.1, 0.2] and [m.name for m in args.models] == ["bayesgate-robust"]


def test_list_flag_keeps_nargs_and_default() -> None:
    parser = argparse.ArgumentParser()
    list_flag(parser, "--xs", item=int, default=[1, 2], help="numbers")
    list_flag(parser, "--ys", nargs="*", default=[], help="more")
    assert parser.parse_args([]).xs == [1, 2]
    assert parser.parse_args(["--xs", "3,4", "5", "--ys"]) == argparse.Namespace(
        xs=[3, 4, 5], ys=[]
    )
