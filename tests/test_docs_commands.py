"""Every command a reader can copy from a fenced code block of README.md or docs/ still parses:
``bayesgate SUBCOMMAND …`` against the CLI's own parser, ``python bench/SCRIPT.py …`` against the
script's (the script is run up to its argument parsing, never past it). A flag renamed or removed
in the code fails here with the file and line of every command that still uses it.

Line continuations (``\\``) are joined, ``#`` comments dropped, a command ends at ``&&``, ``||``,
``;``, ``|`` or a redirection, and a shell variable (``$R``, ``${e}``) stands for ``1`` (it fills
a path or a number in the docs). A command with an elision (``…``) is shorthand, not a command,
and is not checked."""

from __future__ import annotations

import argparse
import contextlib
import io
import re
import runpy
import shlex
import sys
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path

import pytest

from bayesgate import cli

ROOT = Path(__file__).resolve().parents[1]
DOCS = [ROOT / "README.md", *sorted((ROOT / "docs").rglob("*.md"))]
SUBCOMMANDS = frozenset(cli.subcommand_parsers(cli.build_parser()))
COMMENT = re.compile(r"(?:^|\s)#.*$")
FD_REDIRECTION = re.compile(r"(?:^|\s)\d+>")  # 2>file, 2>&1
SHELL_VARIABLE = re.compile(r"\$\{?\w+\}?")
BENCH_SCRIPT = re.compile(r"bench/\w+\.py")


@dataclass(frozen=True)
class Command:
    """One command of a code block: ``program`` is ``bayesgate`` or a ``bench/*.py`` path."""

    where: str  # "docs/x.md:12"
    program: str
    argv: tuple[str, ...]

    def __str__(self) -> str:
        return f"{self.where}: {self.program} {' '.join(self.argv)}"


def code_lines(text: str) -> Iterator[tuple[int, str]]:
    """``(first line number, logical line)`` of fenced code, continuations joined."""
    lines = text.splitlines()
    fenced, i = False, 0
    while i < len(lines):
        line = lines[i]
        if line.lstrip().startswith(("```", "~~~")):
            fenced = not fenced
        elif fenced:
            start = i
            while line.rstrip().endswith("\\") and i + 1 < len(lines):
                i += 1
                line = line.rstrip()[:-1] + " " + lines[i]
            yield start + 1, line
        i += 1


def shell_words(line: str) -> list[str]:
    """The words of a shell line, with ``;``, ``&&``, ``|``, ``>`` … as words of their own."""
    line = FD_REDIRECTION.sub(" >", COMMENT.sub("", line))
    lexer = shlex.shlex(line, posix=True, punctuation_chars=True)
    lexer.whitespace_split = True
    lexer.commenters = ""
    return list(lexer)


def _arguments(words: list[str]) -> tuple[str, ...]:
    """The words up to the end of the command, shell variables replaced by ``1``."""
    out: list[str] = []
    for word in words:
        if set(word) <= set("();<>|&"):
            break
        out.append(SHELL_VARIABLE.sub("1", word))
    return tuple(out)


def commands_in(text: str, where: str) -> Iterator[Command]:
    """The ``bayesgate`` and ``python bench/*.py`` commands of a Markdown text's code blocks."""
    for number, line in code_lines(text):
        if "…" in line:
            continue
        try:
            tokens = shell_words(line)
        except ValueError:  # an unbalanced quote: not shell
            continue
        for i, token in enumerate(tokens):
            following = tokens[i + 1] if i + 1 < len(tokens) else ""
            if Path(token).name == "bayesgate" and (
                following in SUBCOMMANDS or following in {"--help", "-h"}
            ):
                yield Command(f"{where}:{number}", "bayesgate", _arguments(tokens[i + 1 :]))
                break
            if (
                BENCH_SCRIPT.fullmatch(token)
                and i > 0
                and Path(tokens[i - 1]).name.startswith("python")
            ):
                yield Command(f"{where}:{number}", token, _arguments(tokens[i + 1 :]))
                break


class _Parsed(Exception):
    """Raised in place of returning from the outermost argument parsing."""


def parse_error(command: Command) -> str | None:
    """``None`` when the command's arguments parse, else the parser's message."""
    stderr = io.StringIO()
    if command.program == "bayesgate":
        with contextlib.redirect_stderr(stderr), contextlib.redirect_stdout(io.StringIO()):
            try:
                cli.build_parser().parse_args(list(command.argv))
            except SystemExit as exit_:
                if exit_.code:
                    return stderr.getvalue().strip() or f"exit {exit_.code}"
        return None
    script = ROOT / command.program
    if not script.is_file():
        return f"no such script {command.program}"
    if "ArgumentParser" not in script.read_text(encoding="utf-8"):
        return f"{command.program} has no argparse parser to check the arguments against"
    return _script_parse_error(script, command.argv, stderr)


def _script_parse_error(script: Path, argv: tuple[str, ...], stderr: io.StringIO) -> str | None:
    """Run the script as ``__main__`` until its outermost argument parsing (``parse_args``,
    ``parse_intermixed_args`` or their ``known`` forms) returns."""
    originals = {
        name: getattr(argparse.ArgumentParser, name)
        for name in (
            "parse_args",
            "parse_known_args",
            "parse_intermixed_args",  # bench/long_runs.py; it calls parse_known_args twice
            "parse_known_intermixed_args",
        )
    }
    depth = 0

    def stop_after(name: str):  # type: ignore[no-untyped-def]
        def parse(self, *args, **kwargs):  # type: ignore[no-untyped-def]
            nonlocal depth
            depth += 1
            try:
                result = originals[name](self, *args, **kwargs)
            finally:
                depth -= 1
            if depth == 0:
                raise _Parsed
            return result

        return parse

    saved_argv, saved_path = sys.argv, list(sys.path)
    sys.argv = [str(script), *argv]
    sys.path.insert(0, str(script.parent))
    for name in originals:
        setattr(argparse.ArgumentParser, name, stop_after(name))
    try:
        with contextlib.redirect_stderr(stderr), contextlib.redirect_stdout(io.StringIO()):
            runpy.run_path(str(script), run_name="__main__")
    except _Parsed:
        return None
    except SystemExit as exit_:
        if exit_.code:
            return stderr.getvalue().strip()[-400:] or f"exit {exit_.code}"
        return None  # --help
    finally:
        for name, method in originals.items():
            setattr(argparse.ArgumentParser, name, method)
        sys.argv, sys.path[:] = saved_argv, saved_path
    return f"{script.name} ran to the end without parsing its arguments"


def all_commands() -> list[Command]:
    return [
        command
        for path in DOCS
        for command in commands_in(path.read_text(encoding="utf-8"), str(path.relative_to(ROOT)))
    ]


def test_the_docs_hold_commands_of_both_kinds() -> None:
    commands = all_commands()
    programs = {c.program for c in commands}
    assert sum(c.program == "bayesgate" for c in commands) >= 50
    assert len(programs - {"bayesgate"}) >= 20


@pytest.mark.parametrize("program", ["bayesgate", "bench"])
def test_every_command_in_the_docs_parses(program: str) -> None:
    chosen = [c for c in all_commands() if (c.program == "bayesgate") == (program == "bayesgate")]
    failures = [f"{c}\n    -> {error}" for c in chosen if (error := parse_error(c)) is not None]
    assert not failures, "\n".join(failures)


def test_the_extraction_joins_continuations_and_stops_at_shell_syntax() -> None:
    text = (
        "prose `bayesgate train --nope` is not a block\n"
        "```bash\n"
        "export X=1  # bayesgate serve in a comment\n"
        "nice -n 5 .venv/bin/bayesgate calibrate $R/model --k 20 \\\n"
        "    --out ${OUT}/cal --threads 1 \\\n"
        "    > out.json 2>&1  # note\n"
        "for e in 0.1; do python bench/load.py --seconds $e; done 2>/dev/null\n"
        "bayesgate train … --resume\n"
        "cd bayesgate && git status\n"
        "BAYESGATE_PORT=1 bayesgate serve --port 8000&& curl x | head\n"
        "```\n"
    )
    assert list(commands_in(text, "x.md")) == [
        Command(
            "x.md:4",
            "bayesgate",
            ("calibrate", "1/model", "--k", "20", "--out", "1/cal", "--threads", "1"),
        ),
        Command("x.md:7", "bench/load.py", ("--seconds", "1")),
        Command("x.md:10", "bayesgate", ("serve", "--port", "8000")),
    ]


def test_a_wrong_flag_or_script_is_reported() -> None:
    assert parse_error(Command("x", "bayesgate", ("calibrate", "m", "--k", "20"))) is None
    error = parse_error(Command("x", "bayesgate", ("calibrate", "m", "--no-such-flag")))
    assert error is not None and "--no-such-flag" in error
    error = parse_error(Command("x", "bench/load.py", ("--no-such-flag",)))
    assert error is not None and "--no-such-flag" in error
    for argv in (("nonsense",), ("status", "--no-such-flag")):  # parse_intermixed_args
        assert parse_error(Command("x", "bench/long_runs.py", argv)) is not None, argv
    assert parse_error(Command("x", "bench/long_runs.py", ("status",))) is None
    assert parse_error(Command("x", "bench/load.py", ("--help",))) is None
    assert (
        parse_error(Command("x", "bench/nonexistent.py", ()))
        == "no such script bench/nonexistent.py"
    )
