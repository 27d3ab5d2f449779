"""Download the MNIST archives from a list of mirrors, verified and atomically.

Each file is fetched with urllib into a temporary file in the destination folder, checked
(complete, known size and sha256, published MD5 of the decompressed content) and only then
renamed into place, so a failed or interrupted download never leaves a partial file. When a
mirror fails the next one is tried; when all fail, :class:`~bayesgate.models.data.mnist.DataError`
lists each
mirror's error on one line.

Mirrors: the ``mirrors`` argument, else ``$BAYESGATE_MNIST_MIRRORS`` (comma-separated base URLs),
else :data:`~bayesgate.models.data.settings.DEFAULT_MIRRORS` (read by
:mod:`bayesgate.models.data.settings`). ``http``, ``https`` and ``file`` URLs are accepted.
"""

from __future__ import annotations

import gzip
import hashlib
import http.client
import os
import socket
import sys
import tempfile
import urllib.error
import urllib.parse
import urllib.request
import zlib
from collections.abc import Iterable, Sequence
from pathlib import Path
from typing import BinaryIO

from tqdm import tqdm

from bayesgate.models.data.mnist import (
    MNIST_FILES,
    DataError,
    MnistFile,
    find_mnist_file,
    mnist_dir,
)
from bayesgate.models.data.settings import DEFAULT_MIRRORS, MIRRORS_ENV, data_settings

__all__ = ["DEFAULT_MIRRORS", "MIRRORS_ENV", "download_file", "download_mnist", "resolve_mirrors"]

DEFAULT_TIMEOUT = 30.0  # seconds, per connection attempt and per read
USER_AGENT = "bayesgate-data/0.1 (python-urllib)"
_SCHEMES = ("http", "https", "file")
_CHUNK = 1 << 16


class _MirrorError(Exception):
    """One mirror failed for one file (the message is a short reason); try the next one."""


def resolve_mirrors(mirrors: Sequence[str] | None = None) -> list[str]:
    """Base URLs to try, in order: ``mirrors``, else $BAYESGATE_MNIST_MIRRORS, else defaults.

    Blank entries are dropped and every URL gets a trailing slash.
    """
    if mirrors is None:
        mirrors = data_settings().mnist_mirrors
    urls = [m.strip() for m in mirrors if m.strip()]
    if not urls:
        raise DataError("no MNIST download mirrors given")
    return [u if u.endswith("/") else u + "/" for u in urls]


def download_mnist(
    data_dir: Path | None = None,
    *,
    files: Iterable[str] | None = None,
    mirrors: Sequence[str] | None = None,
    progress: bool | None = None,
    timeout: float = DEFAULT_TIMEOUT,
    mirrors_flag: str | None = None,
) -> Path:
    """Download the MNIST files missing from ``<data_dir>/mnist`` and return that folder.

    ``files`` are ``.gz`` names from :data:`~bayesgate.models.data.mnist.MNIST_FILES` (default: all
    four);
    files already present (gzipped or not) are left alone. ``progress`` shows a tqdm bar on
    stderr (default: only when stderr is a terminal). Raises DataError when a file cannot be
    fetched intact from any mirror; its hint names ``mirrors_flag`` (the command-line flag that
    gave ``mirrors``), or $BAYESGATE_MNIST_MIRRORS when the mirrors came from there.
    """
    names = list(MNIST_FILES) if files is None else list(files)
    unknown = [n for n in names if n not in MNIST_FILES]
    if unknown:
        raise ValueError(f"unknown MNIST files {unknown}; known: {', '.join(MNIST_FILES)}")
    urls = resolve_mirrors(mirrors)
    if mirrors is None:
        hint = f"set {MIRRORS_ENV} or copy the original file there"
    else:
        hint = f"try another {mirrors_flag or 'mirror'} or copy the original file there"
    show = _isatty() if progress is None else progress
    folder = mnist_dir(data_dir)
    try:
        folder.mkdir(parents=True, exist_ok=True)
    except OSError as e:
        raise DataError(f"{folder}: cannot create data folder ({e.strerror or e})") from e
    for name in names:
        if find_mnist_file(folder, name) is None:
            download_file(
                MNIST_FILES[name], folder, urls, progress=show, timeout=timeout, hint=hint
            )
    return folder


def download_file(
    spec: MnistFile,
    folder: Path,
    mirrors: Sequence[str],
    *,
    progress: bool = False,
    timeout: float = DEFAULT_TIMEOUT,
    hint: str = f"set {MIRRORS_ENV} or copy the original file there",
) -> Path:
    """Fetch ``spec`` into ``folder`` from the first mirror that serves it intact (``hint``:
    what to do when none does, at the end of the error)."""
    errors = []
    for base in mirrors:
        url = base + spec.name
        try:
            return _fetch_verified(url, spec, folder / spec.name, progress, timeout)
        except _MirrorError as e:
            errors.append(f"{url}: {e}")
    raise DataError(f"could not download {spec.name} into {folder}: {'; '.join(errors)} ({hint})")


def _fetch_verified(url: str, spec: MnistFile, final: Path, progress: bool, timeout: float) -> Path:
    """Download into a temp file next to ``final``, verify, rename; never leave the temp file."""
    scheme = urllib.parse.urlsplit(url).scheme
    if scheme not in _SCHEMES:
        raise _MirrorError(f"unsupported URL scheme {scheme!r} (use {', '.join(_SCHEMES)})")
    try:
        fd, tmp_name = tempfile.mkstemp(dir=final.parent, prefix=f".{final.name}.", suffix=".part")
    except OSError as e:
        raise DataError(f"{final.parent}: cannot create a file ({e.strerror or e})") from e
    tmp = Path(tmp_name)
    try:
        with os.fdopen(fd, "wb") as out:
            received, declared, sha256 = _stream(url, out, spec, progress, timeout)
            _sync(out)
        _verify(tmp, spec, received, declared, sha256)
        os.chmod(tmp, 0o644)
        os.replace(tmp, final)
        return final
    finally:
        tmp.unlink(missing_ok=True)


def _stream(
    url: str, out: BinaryIO, spec: MnistFile, progress: bool, timeout: float
) -> tuple[int, int | None, str]:
    """Copy ``url`` into ``out``; return (bytes received, declared length or None, sha256)."""
    max_size = max(size for size, _ in spec.gz_variants)
    sha256 = hashlib.sha256()
    received = 0
    request = urllib.request.Request(url, headers={"User-Agent": USER_AGENT})
    try:
        with urllib.request.urlopen(request, timeout=timeout) as response:
            declared = _content_length(response.headers.get("Content-Length"))
            with tqdm(
                total=declared,
                desc=spec.name,
                unit="B",
                unit_scale=True,
                unit_divisor=1024,
                disable=not progress,
                leave=False,
            ) as bar:
                while chunk := response.read(_CHUNK):
                    received += len(chunk)
                    if received > max_size:
                        raise _MirrorError(f"larger than expected (over {max_size} bytes)")
                    sha256.update(chunk)
                    _write(out, chunk)
                    bar.update(len(chunk))
    except urllib.error.HTTPError as e:
        e.close()
        raise _MirrorError(f"HTTP {e.code} {e.reason}") from e
    except urllib.error.URLError as e:
        raise _MirrorError(_describe(e.reason)) from e
    except http.client.IncompleteRead as e:
        raise _MirrorError(f"truncated: connection closed after {received} bytes") from e
    except (OSError, http.client.HTTPException) as e:
        raise _MirrorError(_describe(e)) from e
    return received, declared, sha256.hexdigest()


def _verify(path: Path, spec: MnistFile, received: int, declared: int | None, sha: str) -> None:
    """Raise _MirrorError unless the download is complete and one of the known archives."""
    if declared is not None and received < declared:
        raise _MirrorError(f"truncated: received {received} of {declared} bytes")
    sizes = sorted({size for size, _ in spec.gz_variants})
    if received not in sizes:
        raise _MirrorError(
            f"size mismatch: {received} bytes, expected one of {sizes} (truncated or corrupted)"
        )
    if (received, sha) not in spec.gz_variants:
        raise _MirrorError(f"checksum mismatch: sha256 {sha[:16]}... is not a known digest")
    md5 = _decompressed_md5(path)
    if md5 != spec.raw_md5:
        raise _MirrorError(f"checksum mismatch: decompressed MD5 {md5} != {spec.raw_md5}")


def _decompressed_md5(path: Path) -> str:
    """MD5 of the gzip file's decompressed content (the published MNIST checksum)."""
    md5 = hashlib.md5(usedforsecurity=False)
    try:
        with gzip.open(path, "rb") as f:
            while chunk := f.read(1 << 20):
                md5.update(chunk)
    except (EOFError, OSError, zlib.error) as e:
        raise _MirrorError(f"not a valid gzip file ({e})") from e
    return md5.hexdigest()


def present_file_problem(path: Path, spec: MnistFile) -> str | None:
    """Why the MNIST file at ``path`` (gzipped or not, detected by its magic bytes) is not
    ``spec``'s content — None when its decompressed MD5 is the published one. Any gzip of the
    right content passes, not only the known archives."""
    try:
        with open(path, "rb") as f:
            gzipped = f.read(2) == b"\x1f\x8b"
        if gzipped:
            md5 = _decompressed_md5(path)
        else:
            with open(path, "rb") as f:
                md5 = hashlib.file_digest(f, lambda: hashlib.md5(usedforsecurity=False)).hexdigest()
    except _MirrorError as e:
        return str(e)
    except OSError as e:
        return f"cannot read it ({e.strerror or e})"
    if md5 != spec.raw_md5:
        return f"content MD5 {md5} is not the published {spec.raw_md5} (corrupt or another file)"
    return None


def _write(out: BinaryIO, chunk: bytes) -> None:
    """Write to the temp file; a local OSError is a DataError, not a mirror's fault."""
    try:
        out.write(chunk)
    except OSError as e:
        raise DataError(f"{out.name}: cannot write downloaded data ({e.strerror or e})") from e


def _sync(out: BinaryIO) -> None:
    """Flush the temp file to disk before it is verified and renamed."""
    try:
        out.flush()
        os.fsync(out.fileno())
    except OSError as e:
        raise DataError(f"{out.name}: cannot write downloaded data ({e.strerror or e})") from e


def _content_length(value: str | None) -> int | None:
    """Parse a Content-Length header; None when absent or malformed."""
    try:
        return int(value) if value is not None else None
    except ValueError:
        return None


def _describe(error: object) -> str:
    """Short one-line reason for a network error."""
    if isinstance(error, ConnectionRefusedError):
        return "connection refused"
    if isinstance(error, socket.gaierror):
        return f"cannot resolve host, offline? ({error.strerror or error})"
    if isinstance(error, TimeoutError):
        return "timed out"
    text = f"{type(error).__name__}: {error}" if isinstance(error, BaseException) else str(error)
    text = " ".join(text.split())
    return text if len(text) <= 160 else text[:157] + "..."


def _isatty() -> bool:
    """Whether stderr (where tqdm draws) is a terminal."""
    try:
        return sys.stderr is not None and sys.stderr.isatty()
    except (AttributeError, ValueError):
        return False
