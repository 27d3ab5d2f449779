"""docs/service.md's settings table names every setting once, with the default the code has."""

from __future__ import annotations

import re
from pathlib import Path

import pytest

from bayesgate.service.settings import DEFAULT_MODEL_DIR, ENV_PREFIX, Settings

DOC = Path(__file__).resolve().parents[2] / "docs" / "service.md"
ROW = re.compile(r"^\| `(BAYESGATE_[A-Z0-9_]+)` \| (.*?) \| (.*) \|$")


def documented() -> dict[str, str]:
    """``BAYESGATE_*`` variable → its default cell, from the table under ``## Settings``."""
    text = DOC.read_text(encoding="utf-8")
    section = text.split("\n## Settings\n", 1)[1].split("\n## ", 1)[0]
    rows: dict[str, str] = {}
    for line in section.splitlines():
        match = ROW.match(line)
        if match:
            name, default, _ = match.groups()
            assert name not in rows, f"{name} documented twice"
            rows[name] = default
    return rows


def as_documented(value: object) -> str:
    """How the table writes a default: ``unset`` for None, lower-case booleans, ``5`` for 5.0."""
    if value is None:
        return "unset"
    if isinstance(value, bool):
        return f"`{str(value).lower()}`"
    if isinstance(value, float) and value.is_integer():
        return str(int(value))
    return str(value)


def test_every_setting_is_documented_and_nothing_else() -> None:
    names = {ENV_PREFIX + field.upper() for field in Settings.model_fields}
    assert set(documented()) == names


@pytest.mark.parametrize("field", sorted(Settings.model_fields))
def test_the_documented_default_is_the_code_default(field: str) -> None:
    cell = documented()[ENV_PREFIX + field.upper()]
    default = Settings.model_fields[field].default
    if field == "model_dir":
        assert default == DEFAULT_MODEL_DIR
        expected = f"`<package>/models/pretrained/{DEFAULT_MODEL_DIR.name}`"
        assert cell == expected
        return
    written = as_documented(default)
    # the cell starts with the value; a note may follow ("8388608 (8 MiB)", "unset (a fresh …)")
    plain = cell.strip("`")
    assert cell == written or plain == written or cell.startswith(written + " "), (field, cell)
