"""Finding, or building, the native front end's library (``bayesgate serve --native-port``).

The front end is the Rust crate in ``service/native_front/`` (std only: no crates, so it builds
offline). It installs with the package as source; the shared library is built with ``cargo`` on
first use (``bayesgate build-native``, or ``serve --native-port`` when it is missing; a few seconds)
into the user cache, one directory per digest of the crate's sources:

    $XDG_CACHE_HOME/bayesgate/native/<digest>/libbgfront.so   (~/.cache/… when unset)

so an upgraded package never loads a library built from other sources. A library built elsewhere
(e.g. by the Docker image's build stage) is used instead when the setting
``BAYESGATE_NATIVE_LIBRARY`` names it. Nothing is downloaded and nothing is unpickled:
``ctypes`` loads the file.
"""

from __future__ import annotations

import hashlib
import os
import shutil
import subprocess
import sys
from pathlib import Path

from bayesgate.errors import InvalidArgument
from bayesgate.outputs import write_atomically

CRATE = Path(__file__).resolve().parent / "native_front"
LIBRARY_ENV = "BAYESGATE_NATIVE_LIBRARY"
CRATE_NAME = "bgfront"


class NativeUnavailable(InvalidArgument):
    """The native front end's library is neither built nor buildable here (the message says
    what to do)."""


def library_file_name() -> str:
    """``libbgfront.so`` (Linux), ``libbgfront.dylib`` (macOS) or ``bgfront.dll`` (Windows)."""
    if sys.platform == "darwin":
        return f"lib{CRATE_NAME}.dylib"
    if sys.platform == "win32":
        return f"{CRATE_NAME}.dll"
    return f"lib{CRATE_NAME}.so"


def source_files() -> list[Path]:
    """What the library is built from: the manifest, the lock file and every ``src/*.rs``."""
    files = [CRATE / "Cargo.toml", CRATE / "Cargo.lock", *sorted((CRATE / "src").glob("*.rs"))]
    missing = [str(f) for f in files if not f.is_file()]
    if missing:
        raise NativeUnavailable(f"the native front end's sources are incomplete: {missing}")
    return files


def source_digest() -> str:
    """sha256 over each source file's path (relative to the crate) and contents, 16 hex
    digits."""
    h = hashlib.sha256()
    for path in source_files():
        h.update(path.relative_to(CRATE).as_posix().encode() + b"\0")
        h.update(path.read_bytes() + b"\0")
    return h.hexdigest()[:16]


def cache_root() -> Path:
    """``$XDG_CACHE_HOME/bayesgate/native`` (``~/.cache/bayesgate/native`` when unset)."""
    from bayesgate.models.data.settings import data_settings

    return data_settings().cache_root / "native"


def cached_library() -> Path:
    """Where the library of these sources is (or will be) built."""
    return cache_root() / source_digest() / library_file_name()


def find_cargo() -> str | None:
    """``cargo`` on ``PATH``, or in rustup's default place; None when there is none."""
    found = shutil.which("cargo")
    if found:
        return found
    rustup = Path(os.environ.get("CARGO_HOME", Path.home() / ".cargo")) / "bin" / "cargo"
    return str(rustup) if rustup.is_file() else None


def build_library(quiet: bool = True) -> Path:
    """``cargo build --release --offline`` of the crate into the cache; the library's path.

    The build's target directory is ``<cache>/native/target``; the library is copied to its
    digest's directory and renamed into place (another process never sees half a file)."""
    cargo = find_cargo()
    if cargo is None:
        raise NativeUnavailable(
            "the native front end needs its library: no cargo (Rust) found to build it. Install "
            "Rust (https://rustup.rs), then run `bayesgate build-native`; or set "
            f"{LIBRARY_ENV} to a library built elsewhere (the Docker image has one)"
        )
    final = cached_library()
    target = cache_root() / "target"
    command = [cargo, "build", "--release", "--offline", "--lib"]
    if quiet:
        command.append("--quiet")
    env = {**os.environ, "CARGO_TARGET_DIR": str(target)}
    done = subprocess.run(command, cwd=CRATE, env=env, capture_output=quiet, text=True)
    if done.returncode != 0:
        detail = (done.stderr or "").strip().splitlines()[-5:] if quiet else []
        raise NativeUnavailable(
            f"building the native front end failed (cargo exit {done.returncode})"
            + (": " + " | ".join(detail) if detail else "")
        )
    built = target / "release" / library_file_name()
    final.parent.mkdir(parents=True, exist_ok=True)
    with built.open("rb") as library:
        write_atomically(final, lambda out: shutil.copyfileobj(library, out), binary=True)
    return final


def library_path(given: Path | None = None, build: bool = True) -> Path:
    """The library to load: ``given`` (the ``native_library`` setting,
    ``BAYESGATE_NATIVE_LIBRARY``) if set, else the cached build of these sources, built now when
    missing (``build``) — :class:`NativeUnavailable` when that cannot be."""
    if given is not None:
        if not given.is_file():
            raise NativeUnavailable(f"{LIBRARY_ENV}={given}: no such file")
        return given
    path = cached_library()
    if path.is_file():
        return path
    if not build:
        raise NativeUnavailable(
            f"the native front end is not built (no {path}): run `bayesgate build-native`"
        )
    return build_library()
