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
pip's dry run (``--dry-run --report``: nothing is installed; the temporary venv's pip is first
upgraded, since a pip older than 23.3 does not report whether a release is yanked). Left out:
``bayesgate`` itself, and ``torch``, which the Dockerfile's ``TORCH_VERSION`` pins (PyPI's CUDA
build or the CPU index's ``+cpu`` build of the same release); the header names the torch release
the lock was resolved with, which a test keeps equal to pyproject.toml's pin. The CUDA libraries
of PyPI's build (``nvidia-*``, ``cuda-*``) are locked like any package — torch pins some only to a
release series (``nvidia-cublas==13.1.1.*``) or a range (``cuda-bindings>=13.0.3,<14``) — and, as
constraints of packages it never installs, cost the CPU build nothing.

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
IMAGE_PLATFORM = ("linux", "x86_64")
"""``sys_platform`` and ``platform_machine`` of the image (PyPI's CUDA build of torch is x86-64)."""
LEFT_OUT = ("bayesgate", "torch")
"""Packages the lock leaves to others: the project, and torch (``TORCH_VERSION``)."""
TORCH_LINE = re.compile(r"^# torch==(\S+) ", re.MULTILINE)
"""The header line naming the torch release the lock was resolved with."""


class LockError(Exception):
    """The resolution cannot make a lock (wrong interpreter, a yanked release, pip failed)."""


def normalize(name: str) -> str:
    """A distribution name as PEP 503 compares them: ``Jinja2`` → ``jinja2``,
    ``prometheus_client`` → ``prometheus-client``."""
    return re.sub(r"[-_.]+", "-", name).lower()


def pins_from_report(report: Mapping[str, Any]) -> list[tuple[str, str]]:
    """``(name, version)`` of every package pip's installation report would install, names
    normalised and sorted, without the packages of :data:`LEFT_OUT`. A yanked release, a report
    that does not say (pip older than 23.3), or one for another Python or platform than the
    image's is a :class:`LockError`."""
    env = report.get("environment", {})
    python = env.get("python_version")
    if python != IMAGE_PYTHON:
        raise LockError(
            f"the report was resolved for Python {python}, the image runs Python {IMAGE_PYTHON}: "
            f"give --python a Python {IMAGE_PYTHON} interpreter"
        )
    platform = (env.get("sys_platform"), env.get("platform_machine"))
    if platform != IMAGE_PLATFORM:
        raise LockError(
            f"the report was resolved for {platform[0]} {platform[1]}, the image is "
            f"{' '.join(IMAGE_PLATFORM)}: run this on such a machine"
        )
    pins: dict[str, str] = {}
    for item in report["install"]:
        name, version = normalize(item["metadata"]["name"]), item["metadata"]["version"]
        if name in LEFT_OUT:
            continue
        if "is_yanked" not in item:
            raise LockError(
                f"pip {report.get('pip_version')}'s report does not say whether a release is "
                "yanked: resolve with pip 23.3 or newer"
            )
        if item["is_yanked"]:
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
    torch = next(
        (
            i["metadata"]["version"]
            for i in report["install"]
            if normalize(i["metadata"]["name"]) == "torch"
        ),
        None,
    )
    header = [
        "# The Docker image's Python packages, one exact version each, used as pip constraints by",
        "# every `pip install` of the Dockerfile. Generated — do not edit; regenerate with",
        f"#   python deploy/lock_image.py --python python{IMAGE_PYTHON}",
        f'# Resolved: pip install ".[{",".join(EXTRAS)}]" for Python {env["python_version"]} on '
        f"{env['sys_platform']} {env['platform_machine']} (pip {report['pip_version']});",
        f"# torch=={torch} resolved with it, not locked here: the Dockerfile's TORCH_VERSION",
        "# installs it (left out too: bayesgate).",
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
        pip = [str(venv / "bin" / "python"), "-m", "pip"]
        steps = [
            [python, "-m", "venv", str(venv)],
            [*pip, "install", "--quiet", "--upgrade", "pip>=23.3"],  # reports is_yanked
            [
                *pip,
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
    try:
        old = read_lock(args.out.read_text()) if args.out.is_file() else {}
    except ValueError as exc:  # a file this script did not write: replaced, unless --check
        if args.check:
            print(f"lock_image: error: {args.out}: {exc}", file=sys.stderr)
            return 2
        old = {}
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
