"""The image's lock (``deploy/image-constraints.txt``, written by ``deploy/lock_image.py``):
every dependency of pyproject.toml locked inside its own range, every ``pip install`` of the
Dockerfile held to it, and the script's reading of pip's installation report. Offline: the
resolution itself (PyPI, Python 3.12) is run by hand (``lock_image.py --check``, docs/deploy.md).
"""

from __future__ import annotations

import copy
import tomllib
from pathlib import Path
from typing import Any

import pytest
from deploy_files import REPO_ROOT, Dockerfile, dockerignore_excludes, read_dockerignore
from packaging.requirements import Requirement
from packaging.version import Version

from tests.bench_scripts import load_bench

lock_image = load_bench("lock_image", REPO_ROOT / "deploy")
LOCK_IN_IMAGE = "/src/deploy/image-constraints.txt"


def _pyproject_requirements() -> list[Requirement]:
    """The package's dependencies and those of every extra the image can install."""
    project = tomllib.loads((REPO_ROOT / "pyproject.toml").read_text())["project"]
    extras = project["optional-dependencies"]
    lines = [*project["dependencies"], *(r for extra in lock_image.EXTRAS for r in extras[extra])]
    return [Requirement(line) for line in lines]


def test_every_dependency_is_locked_inside_its_own_range() -> None:
    """A floor raised or a dependency added in pyproject.toml fails here until the lock is
    regenerated (the lock would otherwise hold the image below the new floor, or leave the new
    package to float)."""
    locked = lock_image.read_lock(lock_image.LOCK_FILE.read_text())
    checked = set()
    for requirement in _pyproject_requirements():
        name = lock_image.normalize(requirement.name)
        if name == "torch":  # the Dockerfile's TORCH_VERSION (its own test checks the pin)
            continue
        assert name in locked, f"{name} is not in {lock_image.LOCK_FILE.name}: regenerate it"
        version = Version(locked[name])
        assert requirement.specifier.contains(version, prereleases=True), (
            f"{name}=={version} is outside pyproject.toml's {requirement}: regenerate the lock"
        )
        checked.add(name)
    assert {"fastapi", "numpy", "ray", "tritonclient"} <= checked  # the package's and the extras'


def test_the_lock_is_the_scripts_output_with_nothing_left_to_others() -> None:
    """Well-formed (one ``name==version`` a line, names once, sorted, as :func:`render` writes
    them), the header naming the command that regenerates it, and no package the lock leaves to
    torch's pin."""
    text = lock_image.LOCK_FILE.read_text()
    locked = lock_image.read_lock(text)
    assert list(locked) == sorted(locked)
    assert not [name for name in locked if name in lock_image.LEFT_OUT]
    assert "python deploy/lock_image.py --python python3.12" in text
    # resolved with the torch release the image installs (pyproject's pin = TORCH_VERSION)
    (torch,) = lock_image.TORCH_LINE.findall(text)
    (pin,) = [r for r in _pyproject_requirements() if r.name == "torch"]
    assert str(pin.specifier) == f"=={torch}", (pin, torch)
    # torch's own dependencies are locked too (the torch layers install with the lock)
    assert {"sympy", "networkx", "jinja2", "filelock", "fsspec", "typing-extensions"} <= set(locked)
    assert {"nvidia-cublas", "nvidia-cudnn-cu13", "cuda-bindings"} <= set(locked)  # GPU build's


def test_every_pip_install_of_the_dockerfile_takes_the_lock(dockerfile: Dockerfile) -> None:
    installs = [
        (stage.name, run)
        for stage in dockerfile.stages
        for run in stage.all("RUN")
        if "pip install" in run.args
    ]
    assert {name for name, _ in installs} == {"torch-gpu", "torch-cpu", "venv"}
    for torch_stage in ("torch-gpu", "torch-cpu"):  # both built on the stage the lock is copied in
        assert dockerfile.stage(torch_stage).base == "builder"
    for name, run in installs:
        assert f"--constraint {LOCK_IN_IMAGE}" in run.args, f"Dockerfile:{run.line} ({name})"
    # the lock is copied where those commands read it, in the stage both torch stages build on
    copies = [i.args.split() for i in dockerfile.stage("builder").all("COPY")]
    assert ["deploy/image-constraints.txt", LOCK_IN_IMAGE] in copies
    assert not dockerignore_excludes(read_dockerignore(), "deploy/image-constraints.txt")


def _report(
    python: str = "3.12", machine: str = "x86_64", **extra: dict[str, Any]
) -> dict[str, Any]:
    """A pip installation report (``pip install --dry-run --report``), cut to the fields read."""
    packages = [
        ("bayesgate", "0.1.0"),
        ("torch", "2.13.0"),
        ("nvidia-cublas", "13.1.1.3"),
        ("cuda-toolkit", "13.0.3.0"),
        ("triton", "3.6.0"),
        ("Jinja2", "3.1.6"),
        ("prometheus_client", "0.26.0"),
        ("fastapi", "0.165.0"),
    ]
    return {
        "pip_version": "26.3",
        "environment": {
            "python_version": python,
            "sys_platform": "linux",
            "platform_machine": machine,
        },
        "install": [
            {
                "metadata": {"name": name, "version": version},
                "is_yanked": False,
                **extra.get(name, {}),
            }
            for name, version in packages
        ],
    }


def test_pins_from_a_report_normalised_sorted_and_without_torchs_own() -> None:
    pins = lock_image.pins_from_report(_report())
    assert pins == [
        ("cuda-toolkit", "13.0.3.0"),
        ("fastapi", "0.165.0"),
        ("jinja2", "3.1.6"),
        ("nvidia-cublas", "13.1.1.3"),
        ("prometheus-client", "0.26.0"),
        ("triton", "3.6.0"),
    ]
    text = lock_image.render(pins, _report())
    assert lock_image.read_lock(text) == dict(pins)
    assert 'pip install ".[ray,grpc]" for Python 3.12 on linux x86_64 (pip 26.3)' in text
    assert lock_image.TORCH_LINE.findall(text) == ["2.13.0"]


def test_a_report_that_cannot_be_a_lock_is_refused_by_name() -> None:
    with pytest.raises(lock_image.LockError, match=r"resolved for Python 3\.11, the image runs"):
        lock_image.pins_from_report(_report("3.11"))
    with pytest.raises(lock_image.LockError, match=r"fastapi==0\.165\.0 is a yanked release"):
        lock_image.pins_from_report(_report(fastapi={"is_yanked": True}))
    with pytest.raises(lock_image.LockError, match=r"resolved for linux aarch64, the image is"):
        lock_image.pins_from_report(_report(machine="aarch64"))
    silent = _report()  # pip < 23.3: no is_yanked in the report
    del silent["install"][-1]["is_yanked"]
    with pytest.raises(lock_image.LockError, match=r"does not say whether a release is yanked"):
        lock_image.pins_from_report(silent)
    twice = _report()
    twice["install"].append(
        {"metadata": {"name": "jinja2", "version": "3.0.0"}, "is_yanked": False}
    )
    with pytest.raises(lock_image.LockError, match=r"jinja2 resolved twice: 3\.1\.6 and 3\.0\.0"):
        lock_image.pins_from_report(twice)


@pytest.mark.parametrize(
    ("text", "message"),
    [
        ("fastapi>=0.132\n", "line 1: 'fastapi>=0.132' is not name==version"),
        ("# header\nJinja2==3.1.6\njinja2==3.1.5\n", "line 3: jinja2 is locked twice"),
        ("numpy==2.5.5 ; python_version < '3.13'\n", "is not name==version"),
    ],
)
def test_a_lock_line_that_is_not_an_exact_pin_is_refused(text: str, message: str) -> None:
    with pytest.raises(ValueError, match=message):
        lock_image.read_lock(text)


def test_check_and_rewrite_without_the_network(
    monkeypatch: pytest.MonkeyPatch, tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    """``--check`` names each change and exits 1; a rewrite writes the lock, and ``--check``
    then passes; a resolution error is one line and exit 2. (The resolution is replaced: it needs
    PyPI and Python 3.12.)"""
    report = _report()
    monkeypatch.setattr(lock_image, "resolve", lambda python: copy.deepcopy(report))
    lock = tmp_path / "image-constraints.txt"
    lock.write_text("fastapi==0.164.0\nnumpy==2.5.5\n")
    assert lock_image.main(["--check", "--out", str(lock)]) == 1
    err = capsys.readouterr().err
    assert "fastapi: 0.164.0 -> 0.165.0" in err and "numpy: 2.5.5 -> -" in err
    assert "jinja2: - -> 3.1.6" in err
    assert lock.read_text() == "fastapi==0.164.0\nnumpy==2.5.5\n"  # --check writes nothing
    assert lock_image.main(["--out", str(lock)]) == 0
    assert lock.read_text() == lock_image.render(lock_image.pins_from_report(report), report)
    assert lock_image.main(["--check", "--out", str(lock)]) == 0
    assert "up to date (6 packages)" in capsys.readouterr().out
    lock.write_text("not a lock\n")  # a file the script did not write: --check says so
    assert lock_image.main(["--check", "--out", str(lock)]) == 2
    assert "line 1: 'not a lock' is not name==version" in capsys.readouterr().err
    assert lock_image.main(["--out", str(lock)]) == 0  # and a rewrite replaces it
    assert lock_image.read_lock(lock.read_text()) == dict(lock_image.pins_from_report(report))

    def fails(python: str) -> dict[str, Any]:
        raise lock_image.LockError(f"no such interpreter: {python}")

    monkeypatch.setattr(lock_image, "resolve", fails)
    assert lock_image.main(["--python", "nopython", "--out", str(lock)]) == 2
    assert capsys.readouterr().err == "lock_image: error: no such interpreter: nopython\n"


def test_resolve_names_a_missing_interpreter() -> None:
    with pytest.raises(
        lock_image.LockError, match=r"no such interpreter: /nonexistent/python3\.12"
    ):
        lock_image.resolve("/nonexistent/python3.12")
