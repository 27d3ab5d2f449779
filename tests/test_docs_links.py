"""Every relative link in README.md and docs/ points at a file that exists, and every ``#anchor``
at a heading of its target — the anchor as GitHub makes it from the heading (lower case, ``` `` ```
and link syntax dropped, punctuation other than ``-`` and ``_`` dropped, spaces to ``-``, a
repeated heading suffixed ``-1``, ``-2``, …). Links in code blocks and inline code are text, not
links; absolute URLs are not fetched."""

from __future__ import annotations

import re
import sys
from functools import cache
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]
DOCS = [ROOT / "README.md", *sorted((ROOT / "docs").rglob("*.md"))]

# [text](target) or ![alt](target "title"); the text may hold one level of [brackets]
LINK = re.compile(r"!?\[(?:[^\]\[]|\[[^\]]*\])*\]\(([^)\s]+)(?:\s+\"[^\"]*\")?\)")
HEADING = re.compile(r"(#{1,6})\s+(.*?)\s*#*\s*$")
SCHEME = re.compile(r"[A-Za-z][A-Za-z0-9+.-]*:")


def github_anchor(heading: str) -> str:
    """The anchor GitHub gives a heading's text (before the ``-N`` suffix of repeats)."""
    text = re.sub(r"\[([^\]]*)\]\([^)]*\)", r"\1", heading.replace("`", ""))
    kept = "".join(c for c in text.strip().lower() if c.isalnum() or c in "-_ ")
    return kept.replace(" ", "-")


def prose_lines(path: Path) -> list[tuple[int, str]]:
    """``(line number, text)`` of every line outside fenced code blocks."""
    out, fenced = [], False
    for number, line in enumerate(path.read_text(encoding="utf-8").splitlines(), 1):
        if line.lstrip().startswith(("```", "~~~")):
            fenced = not fenced
        elif not fenced:
            out.append((number, line))
    return out


@cache
def anchors(path: Path) -> frozenset[str]:
    seen: dict[str, int] = {}
    for _, line in prose_lines(path):
        match = HEADING.match(line)
        if match:
            base = github_anchor(match.group(2))
            n = seen.get(base, 0)
            seen[base] = n + 1
    found = set()
    for base, n in seen.items():
        found.add(base)
        found.update(f"{base}-{i}" for i in range(1, n))
    return frozenset(found)


def relative_links(path: Path) -> list[tuple[int, str]]:
    """``(line number, target)`` of every link that is not an absolute URL."""
    out = []
    for number, line in prose_lines(path):
        for match in LINK.finditer(re.sub(r"`[^`]*`", "", line)):
            target = match.group(1)
            if not SCHEME.match(target):
                out.append((number, target))
    return out


def broken_links(path: Path) -> list[str]:
    problems = []
    for number, target in relative_links(path):
        file_part, _, fragment = target.partition("#")
        linked = (path.parent / file_part).resolve() if file_part else path
        where = f"{path.relative_to(ROOT)}:{number}: {target}"
        if not linked.exists():
            problems.append(f"{where}: no such file")
        elif fragment and linked.suffix == ".md" and fragment not in anchors(linked):
            problems.append(f"{where}: no heading makes #{fragment}")
    return problems


@pytest.mark.parametrize(
    ("heading", "anchor"),
    [
        # anchors these docs link to, as GitHub renders them
        ("`POST /v1/predict`", "post-v1predict"),
        ("The native front end (`--native-port`)", "the-native-front-end---native-port"),
        (
            "Re-measured on 2026-11-26: httptools, the robust model, the GIL switch interval",
            "re-measured-on-2026-11-26-httptools-the-robust-model-the-gil-switch-interval",
        ),
        (
            "Cheaper answers: the same bits in fewer torch calls (measured, kept)",
            "cheaper-answers-the-same-bits-in-fewer-torch-calls-measured-kept",
        ),
        ("snake_case and [a link](x.md)", "snake_case-and-a-link"),
    ],
)
def test_github_anchor(heading: str, anchor: str) -> None:
    assert github_anchor(heading) == anchor


def test_repeated_headings_get_numbered_anchors(tmp_path: Path) -> None:
    page = tmp_path / "page.md"
    page.write_text("# Runs\n## Results\n```\n## Results\n```\n## Results\n", encoding="utf-8")
    assert anchors(page) == {"runs", "results", "results-1"}


def test_broken_links_are_found(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(sys.modules[__name__], "ROOT", tmp_path)
    (tmp_path / "b.md").write_text("## Far away\n", encoding="utf-8")
    page = tmp_path / "a.md"
    page.write_text(
        "# Here\n[ok](b.md#far-away) [ok](#here) ![img](b.md) [web](https://x.org/#nope)\n"
        "`[code](gone.md)`\n```\n[fenced](gone.md)\n```\n"
        "[gone](gone.md) [no anchor](b.md#near) [self](#there)\n",
        encoding="utf-8",
    )
    assert broken_links(page) == [
        "a.md:7: gone.md: no such file",
        "a.md:7: b.md#near: no heading makes #near",
        "a.md:7: #there: no heading makes #there",
    ]


def test_docs_links_resolve() -> None:
    assert len(DOCS) > 10
    assert sum(len(relative_links(p)) for p in DOCS) > 300  # the parser still finds the links
    problems = [problem for page in DOCS for problem in broken_links(page)]
    assert not problems, "\n".join(problems)
