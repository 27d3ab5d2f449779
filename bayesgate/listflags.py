"""List-valued flags that take their values either way: ``--eps 0.1 0.2 0.3`` (space-separated,
as argparse's ``nargs``), ``--eps 0.1,0.2,0.3`` (one comma-separated word) or a mix of both
(``--eps 0.1, 0.2 0.3``).

The words are read as one text whose items are separated by a comma (spaces around it allowed)
or by spaces; each item is converted by ``item`` (``float``, ``str``, …). An empty item between
two separators or at either end (``0.1,,0.2``, ``0.1,``: a typo that would silently drop a value)
and an item that does not convert are argparse's one-line error naming the flag. Nothing but
separators (``--eps ,``, ``--attacks ""``) is an empty list, for the command to refuse with its own
message. Not for attack specs (``pgd:eps=0.3,steps=40``): their commas separate parameters.
"""

from __future__ import annotations

import argparse
import re
from collections.abc import Callable, Iterable, Sequence
from typing import Any

LIST_HELP = "space- or comma-separated (a list takes every word after it: give it after the "
LIST_HELP += "positional arguments)"
"""Appended to the help of every flag made by :func:`list_flag`."""


SEPARATOR = re.compile(r"\s*,\s*|\s+")
"""Between two items: a comma with optional spaces around it, or spaces."""


def split_words(words: Iterable[str]) -> list[str]:
    """``["0.1,", "0.2,0.3"]`` → ``["0.1", "0.2", "0.3"]``; ``[","]`` → ``[]``. An empty item
    (``"0.1,,0.2"``, ``"0.1,"``) is a :class:`ValueError`."""
    text = " ".join(words).strip()
    if not text.strip(" ,"):
        return []
    items = SEPARATOR.split(text)
    if "" in items:
        raise ValueError(f"empty item in {text!r} (items are separated by spaces or commas)")
    return items


class SplitList(argparse.Action):
    """``nargs`` values, each of which may itself be comma-separated, stored as one flat list of
    ``item(piece)``."""

    def __init__(
        self,
        option_strings: Sequence[str],
        dest: str,
        *,
        item: Callable[[str], Any] = str,
        **kwargs: Any,
    ) -> None:
        kwargs.setdefault("nargs", "+")
        super().__init__(option_strings, dest, **kwargs)
        self.item = item

    def __call__(
        self,
        parser: argparse.ArgumentParser,
        namespace: argparse.Namespace,
        values: str | Sequence[Any] | None,
        option_string: str | None = None,
    ) -> None:
        words = [values] if isinstance(values, str) else list(values or [])
        try:
            pieces = split_words(words)
        except ValueError as exc:
            parser.error(f"argument {option_string}: {exc}")
        items = []
        for piece in pieces:
            try:
                items.append(self.item(piece))
            except (TypeError, ValueError):
                name = getattr(self.item, "__name__", "")
                parser.error(
                    f"argument {option_string}: invalid {name} value: {piece!r} (a list flag "
                    "takes every word after it: give it after the positional arguments)"
                )
        setattr(namespace, self.dest, items)


def list_flag(
    parser: argparse.ArgumentParser,
    flag: str,
    *,
    help: str,
    item: Callable[[str], Any] = str,
    nargs: str = "+",
    **kwargs: Any,
) -> argparse.Action:
    """``parser.add_argument(flag, …)`` of a list-valued flag taking space- and/or
    comma-separated values (:class:`SplitList`); its help says so. ``nargs="*"`` lets the flag
    be given without values (an empty list)."""
    return parser.add_argument(
        flag, action=SplitList, item=item, nargs=nargs, help=f"{help}; {LIST_HELP}", **kwargs
    )
