"""The test suite at the lowest dependency versions ``pyproject.toml`` allows.

A fresh install takes the newest release of every dependency, so CI never sees the floors
(``fastapi>=…``); a user whose environment pins an older release gets whatever the floor
promises. This script checks the promise: it reads the floors from ``pyproject.toml`` (the
``>=`` bound of every runtime dependency, the ``==`` pins as they are), installs bayesgate into
its own venv with each one pinned to its floor (``pip -c``), checks that pip really installed
them, and runs the test suite there.

    python bench/dependency_floors.py                    # venv under ~/.cache/bayesgate/
    python bench/dependency_floors.py --list             # the floors only
    python bench/dependency_floors.py -- tests/service   # pytest arguments after --

Left out, and why: the ``ray`` extra (``ray[serve]==2.60.0`` requires newer FastAPI, Starlette
and pydantic than the floors, so it cannot be installed beside them; its tests are skipped by
``--ignore-glob '*ray*'``) and the development tools of the ``dev`` extra, which are installed at
their newest versions (they test, they are not what a user runs). ``torch`` is pinned in
``pyproject.toml`` already. Measured on 2 cores: 529–707 s of tests after the install.
"""

from __future__ import annotations

import argparse
import os
import subprocess
import sys
import tempfile
from pathlib import Path

from packaging.requirements import Requirement

ROOT = Path(__file__).resolve().parents[1]
DEFAULT_VENV = Path(os.environ.get("XDG_CACHE_HOME", Path.home() / ".cache")) / "bayesgate/floors"
LEFT_OUT_EXTRAS = {"ray"}  # see the module docstring
SKIPPED_TESTS = "*ray*"


def floor(requirement: str) -> str:
    """``name==version`` of the lowest version ``requirement`` allows: its ``>=`` bound or its
    ``==`` pin. ``ValueError`` without one (a floor must be stated, not implied)."""
    req = Requirement(requirement)
    pins = [s.version for s in req.specifier if s.operator == "=="]
    lows = [s.version for s in req.specifier if s.operator == ">="]
    if len(pins) + len(lows) != 1:
        raise ValueError(f"{requirement!r}: expected exactly one >= or == bound")
    version = (pins or lows)[0]
    if not req.specifier.contains(version, prereleases=True):
        raise ValueError(f"{requirement!r}: its own floor {version} is excluded")
    return f"{req.name}=={version}"


def project() -> dict:
    """``[project]`` of ``pyproject.toml`` (``tomllib``: Python ≥ 3.11 for this script)."""
    import tomllib

    return tomllib.loads((ROOT / "pyproject.toml").read_text())["project"]


def kept_extras(meta: dict) -> list[str]:
    """The extras installed at their floors: all but ``dev`` and :data:`LEFT_OUT_EXTRAS`."""
    extras = meta.get("optional-dependencies", {})
    return [name for name in sorted(extras) if name not in LEFT_OUT_EXTRAS | {"dev"}]


def runtime_floors(meta: dict) -> list[str]:
    """The floor of every runtime dependency and of every kept extra's dependencies."""
    extras = meta.get("optional-dependencies", {})
    kept = [r for name in kept_extras(meta) for r in extras[name]]
    return [floor(r) for r in [*meta["dependencies"], *kept]]


def dev_tools(meta: dict) -> list[str]:
    """The ``dev`` extra without its ``bayesgate[…]`` self-reference (installed at the newest
    versions)."""
    return [r for r in meta["optional-dependencies"]["dev"] if Requirement(r).name != "bayesgate"]


def installed(python: Path, names: list[str]) -> dict[str, str]:
    """``{name: version}`` of ``names`` in the venv of ``python`` (``importlib.metadata``)."""
    code = "import sys, importlib.metadata as m\nfor n in sys.argv[1:]: print(n, m.version(n))"
    out = subprocess.run(
        [str(python), "-c", code, *names], capture_output=True, text=True, check=True
    ).stdout
    return dict(line.split() for line in out.splitlines())


def mismatches(wanted: list[str], got: dict[str, str]) -> list[str]:
    """``name: floor … installed …`` for every floor pip did not install exactly."""
    out = []
    for pin in wanted:
        name, version = pin.split("==")
        if not Requirement(pin).specifier.contains(got.get(name, "0"), prereleases=True):
            out.append(f"{name}: floor {version}, installed {got.get(name, 'nothing')}")
    return out


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    p.add_argument("--venv", type=Path, default=DEFAULT_VENV, help="made when missing")
    p.add_argument("--list", action="store_true", help="print the floors and stop")
    p.add_argument("pytest_args", nargs="*", help="after --: passed to pytest")
    args = p.parse_args(argv)
    meta = project()
    try:
        floors = runtime_floors(meta)
    except ValueError as exc:
        print(f"pyproject.toml: {exc}", file=sys.stderr)
        return 2
    print("floors:", " ".join(floors), flush=True)
    if args.list:
        return 0
    python = args.venv / "bin/python"
    if not python.exists():
        subprocess.run([sys.executable, "-m", "venv", str(args.venv)], check=True)
    extras = ",".join(kept_extras(meta))
    with tempfile.NamedTemporaryFile("w", suffix=".txt", delete=False) as f:
        f.write("\n".join(floors) + "\n")
        constraints = f.name
    try:
        subprocess.run(
            [str(python), "-m", "pip", "install", "-q", "-c", constraints,
             "-e", f"{ROOT}[{extras}]", *dev_tools(meta)],
            check=True,
        )  # fmt: skip
    finally:
        os.unlink(constraints)
    got = installed(python, [pin.split("==")[0] for pin in floors])
    print("installed:", " ".join(f"{n}=={v}" for n, v in got.items()), flush=True)
    if wrong := mismatches(floors, got):
        print("pip did not install the floors:\n  " + "\n  ".join(wrong), file=sys.stderr)
        return 1
    pytest = [str(python), "-m", "pytest", "-p", "no:cacheprovider", "--ignore-glob",
              SKIPPED_TESTS, *args.pytest_args]  # fmt: skip
    print("running:", " ".join(pytest), flush=True)
    return subprocess.run(pytest, cwd=ROOT).returncode


if __name__ == "__main__":
    sys.exit(main())
