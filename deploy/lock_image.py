"""Lock the Docker image's Python packages: ``deploy/image-constraints.txt``.

``pyproject.toml`` gives floors (``fastapi>=0.132``, …), as a library should; an image built from
floors alone takes whatever each package's newest release is on the day of the build, so two
builds of one commit can differ, and a release that breaks the service reaches the next build
unseen. The image therefore installs with this file as pip *constraints* (``pip install -c``):
every package the image installs, at one exact version. Constraints, not requirements: a build
without an extra (``EXTRAS=""``) installs none of that extra's packages, and those that it does
install are held to their locked version.

The lock is what pip resolves for ``pip install ".[ray,grpc]"`` (the package with every extra the
image can take) on the image's interpreter — Ubuntu 24.04's Python 3.12 on x86-64 Linux — by
pip's dry run (``--dry-run --report``: nothing is installed). Left out:

- ``bayesgate`` itself;
- ``torch``: the Dockerfile's ``TORCH_VERSION`` pins it (PyPI's CUDA build or the CPU index's
  ``+cpu`` build of the same release);
- the CUDA libraries (``nvidia-*``, ``cuda-*``, ``triton``): torch's own metadata pins each of
  them exactly for the GPU build, and the CPU build has none.

Run by hand when a dependency changes (pyproject.toml) or to take new releases; it needs PyPI,
and a Python 3.12 interpreter (the one the image runs)::

    python deploy/lock_image.py --python python3.12           # rewrite the lock
    python deploy/lock_image.py --python python3.12 --check   # exit 1 if it is out of date

``tests/deploy/test_image_lock.py`` checks, offline, that every dependency of pyproject.toml is
locked within its own range and that every ``pip install`` of the Dockerfile uses the lock.
"""

from __future__ import annotations

import argparse
import json
import re
import subprocess
import sys
import tempfile
from collections.abc import Iterable, Mapping
from pathlib import Path
from typing import Any

REPO_ROOT = Path(__file__).resolve().parents[1]
LOCK_FILE = REPO_ROOT / "deploy" / "image-constraints.txt"
EXTRAS = ("ray", "grpc")
"""Every extra the image can install (its ``EXTRAS`` build argument)."""
IMAGE_PYTHON = "3.12"
"""The Python of the image's base (Ubuntu 24.04)."""
LEFT_OUT = re.compile(r"^(bayesgate|torch|triton|nvidia-.*|cuda-.*)$")
"""Packages the lock leaves to others: the project, torch (``TORCH_VERSION``) and the CUDA
libraries torch pins exactly."""


class LockError(Exception):
    """The resolution cannot make a lock (wrong interpreter, a yanked release, pip failed)."""


def normalize(name: str) -> str:
    """A distribution name as PEP 503 compares them: ``Jinja2`` → ``jinja2``,
    ``prometheus_client`` → ``prometheus-client``."""
    return re.sub(r"[-_.]+", "-", name).lower()


def pins_from_report(report: Mapping[str, Any]) -> list[tuple[str, str]]:
    """``(name, version)`` of every package pip's installation report would install, names
    normalised and sorted, without the packages of :data:`LEFT_OUT`. A yanked release or a
    report for another Python than :data:`IMAGE_PYTHON` is a :class:`LockError`."""
    python = report.get("environment", {}).get("python_version")
    if python != IMAGE_PYTHON:
        raise LockError(
            f"the report was resolved for Python {python}, the image runs Python {IMAGE_PYTHON}: "
            f"give --python a Python {IMAGE_PYTHON} interpreter"
        )
    pins: dict[str, str] = {}
    for item in report["install"]:
        name, version = normalize(item["metadata"]["name"]), item["metadata"]["version"]
        if LEFT_OUT.match(name):
            continue
        if item.get("is_yanked"):
            raise LockError(
                f"{name}=={version} is a yanked release; pin around it in pyproject.toml"
            )
        if pins.get(name, version) != version:
            raise LockError(f"{name} resolved twice: {pins[name]} and {version}")
        pins[name] = version
    return sorted(pins.items())


def render(pins: Iterable[tuple[str, str]], report: Mapping[str, Any]) -> str:
    """The lock file: a header saying where it comes from, then one ``name==version`` a line."""
    env = report["environment"]
    header = [
        "# The Docker image's Python packages, one exact version each, used as pip constraints by",
        "# every `pip install` of the Dockerfile. Generated — do not edit; regenerate with",
        f"#   python deploy/lock_image.py --python python{IMAGE_PYTHON}",
        f'# Resolved: pip install ".[{",".join(EXTRAS)}]" for Python {env["python_version"]} on '
        f"{env['sys_platform']} {env['platform_machine']} (pip {report['pip_version']});",
        "# left out: bayesgate, torch (the Dockerfile's TORCH_VERSION) and the CUDA libraries",
        "# (torch pins them).",
    ]
    return "\n".join([*header, *(f"{name}=={version}" for name, version in pins)]) + "\n"


def read_lock(text: str) -> dict[str, str]:
    """``{name: version}`` of a lock file's text (comments and blank lines skipped); a line that
    is not ``name==version`` or a name given twice is a ``ValueError`` naming the line."""
    pins: dict[str, str] = {}
    for number, line in enumerate(text.splitlines(), 1):
        line = line.strip()
        if not line or line.startswith("#"):
            continue
        match = re.fullmatch(r"([A-Za-z0-9][A-Za-z0-9._-]*)==([^\s=;#]+)", line)
        if match is None:
            raise ValueError(f"line {number}: {line!r} is not name==version")
        name = normalize(match.group(1))
        if name in pins:
            raise ValueError(f"line {number}: {name} is locked twice")
        pins[name] = match.group(2)
    return pins


def resolve(python: str, root: Path = REPO_ROOT) -> dict[str, Any]:
    """pip's installation report for ``pip install "ROOT[EXTRAS]"`` with ``python``: a new
    virtual environment (so nothing installed elsewhere counts) and a dry run."""
    with tempfile.TemporaryDirectory(prefix="bayesgate-lock-") as tmp:
        venv, report = Path(tmp) / "venv", Path(tmp) / "report.json"
        steps = [
            [python, "-m", "venv", str(venv)],
            [
                str(venv / "bin" / "python"),
                "-m",
                "pip",
                "install",
                "--dry-run",
                "--ignore-installed",
                "--quiet",
                "--report",
                str(report),
                f"{root}[{','.join(EXTRAS)}]",
            ],
        ]
        for step in steps:
            try:
                done = subprocess.run(step, capture_output=True, text=True, check=False)
            except FileNotFoundError:
                raise LockError(f"no such interpreter: {python}") from None
            if done.returncode != 0:
                raise LockError(f"{' '.join(step[:4])} … failed:\n{done.stderr.strip()}")
        return json.loads(report.read_text())


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(
        description="Lock the Docker image's Python packages (deploy/image-constraints.txt).",
        formatter_class=argparse.ArgumentDefaultsHelpFormatter,
    )
    parser.add_argument(
        "--python", default=f"python{IMAGE_PYTHON}", help="the image's Python, to resolve with"
    )
    parser.add_argument(
        "--check", action="store_true", help="only compare: exit 1 if the lock would change"
    )
    parser.add_argument("--out", type=Path, default=LOCK_FILE, help="the lock file")
    args = parser.parse_args(argv)
    try:
        report = resolve(args.python)
        pins = pins_from_report(report)
    except LockError as exc:
        print(f"lock_image: error: {exc}", file=sys.stderr)
        return 2
    text = render(pins, report)
    old = read_lock(args.out.read_text()) if args.out.is_file() else {}
    new = dict(pins)
    changes = [
        f"  {name}: {old.get(name, '-')} -> {new.get(name, '-')}"
        for name in sorted(old.keys() | new.keys())
        if old.get(name) != new.get(name)
    ]
    if args.check:
        if changes:
            print(f"{args.out} is out of date:", *changes, sep="\n", file=sys.stderr)
            return 1
        print(f"{args.out}: up to date ({len(pins)} packages)")
        return 0
    args.out.write_text(text)
    print(f"{args.out}: {len(pins)} packages, {len(changes)} changed", *changes, sep="\n")
    return 0


if __name__ == "__main__":
    sys.exit(main())
