"""The package installs one import namespace, ``bayesgate``: the wheel's ``top_level.txt``, every
source file mapped from the top-level folders, and no generic ``models``/``service`` import."""

from __future__ import annotations

import subprocess
import sys
import zipfile
from pathlib import Path

import pytest

REPO_ROOT = Path(__file__).resolve().parents[1]
FOLDERS = {
    "bayesgate": "bayesgate",
    "models": "bayesgate/models",
    "attacks": "bayesgate/attacks",
    "service": "bayesgate/service",
}


@pytest.fixture(scope="module")
def wheel(tmp_path_factory: pytest.TempPathFactory) -> Path:
    out = tmp_path_factory.mktemp("dist")
    done = subprocess.run(
        [
            sys.executable,
            "-m",
            "pip",
            "wheel",
            str(REPO_ROOT),
            "--no-deps",
            "--no-build-isolation",
            "-v",  # setuptools' own warnings reach the log only with -v
            "-w",
            str(out),
        ],
        check=True,
        capture_output=True,
        text=True,
        cwd=out,
    )
    (out / "build.log").write_text(done.stdout + done.stderr)
    (found,) = out.glob("bayesgate-*.whl")
    return found


def test_build_has_no_unlisted_data_package(wheel: Path) -> None:
    """setuptools warns ("Package would be ignored") about an importable folder that holds data
    but is missing from ``packages``, and plans to stop shipping it: every data folder is listed."""
    log = (wheel.parent / "build.log").read_text()
    assert "Building wheel for bayesgate" in log  # the -v log of this build, not an empty one
    assert "would be ignored" not in log and "absent from the `packages`" not in log, log[-3000:]


def test_wheel_has_one_top_level_package(wheel: Path) -> None:
    with zipfile.ZipFile(wheel) as zf:
        (top_level,) = [n for n in zf.namelist() if n.endswith(".dist-info/top_level.txt")]
        assert zf.read(top_level).decode().split() == ["bayesgate"]
        roots = {n.split("/")[0] for n in zf.namelist() if ".dist-info/" not in n}
    assert roots == {"bayesgate"}


def test_wheel_holds_every_source_file_the_bundled_model_and_the_page(wheel: Path) -> None:
    with zipfile.ZipFile(wheel) as zf:
        names = set(zf.namelist())
    expected = {
        f"{dest}/{path.relative_to(REPO_ROOT / folder).as_posix()}"
        for folder, dest in FOLDERS.items()
        for path in (REPO_ROOT / folder).rglob("*.py")
    }
    assert expected - names == set(), "source files missing from the wheel (pyproject packages?)"
    for model in ("bayesgate-cnn", "bayesgate-robust"):  # the bundled models and their files
        for path in (REPO_ROOT / "models" / "pretrained" / model).iterdir():
            assert f"bayesgate/models/pretrained/{model}/{path.name}" in names
    static = sorted(p.name for p in (REPO_ROOT / "service" / "static").iterdir())
    assert {"index.html", "app.js", "style.css", "digits.png", "digits.json"} <= set(static)
    for name in static:  # the demo page and its test digits (package data)
        assert f"bayesgate/service/static/{name}" in names
    crate = REPO_ROOT / "service" / "native_front"  # the native front end's Rust sources
    sources = [p for p in crate.rglob("*") if p.is_file() and "target" not in p.parts]
    assert {"Cargo.toml", "Cargo.lock", "lib.rs", "ffi.rs"} <= {p.name for p in sources}
    for path in sources:
        assert f"bayesgate/service/native_front/{path.relative_to(crate).as_posix()}" in names


def test_installed_wheel_imports_as_bayesgate_only(wheel: Path, tmp_path: Path) -> None:
    target = tmp_path / "site"
    subprocess.run(
        [
            sys.executable,
            "-m",
            "pip",
            "install",
            "--no-deps",
            "-q",
            "--target",
            str(target),
            str(wheel),
        ],
        check=True,
        capture_output=True,
    )
    probe = (
        "import sys; sys.path.insert(0, sys.argv[1]); import bayesgate.models.mc.engine as m; "
        "print(m.__file__)\n"
        "try:\n    import models\nexcept ModuleNotFoundError:\n    print('no models')\n"
    )
    # -I: no current directory, PYTHONPATH or user site on sys.path (the repo must not leak in)
    done = subprocess.run(
        [sys.executable, "-I", "-c", probe, str(target)],
        check=True,
        capture_output=True,
        text=True,
        cwd=tmp_path,
    )
    engine_file, verdict = done.stdout.splitlines()
    assert Path(engine_file).is_relative_to(target)
    assert verdict == "no models"  # `import models` failed


def test_ruff_targets_the_oldest_python_the_package_allows() -> None:
    """``requires-python``'s floor and ruff's ``target-version`` move together: ruff then flags
    syntax and APIs newer than the floor (and rewrites what the floor makes obsolete)."""
    import tomllib

    from packaging.specifiers import SpecifierSet

    meta = tomllib.loads((REPO_ROOT / "pyproject.toml").read_text())
    (floor,) = [s.version for s in SpecifierSet(meta["project"]["requires-python"])]
    assert meta["tool"]["ruff"]["target-version"] == "py" + floor.replace(".", "")
    assert sys.version_info >= tuple(int(p) for p in floor.split("."))
