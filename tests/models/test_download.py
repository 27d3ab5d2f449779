"""Tests for bayesgate.models.data.download against a real HTTP server on 127.0.0.1 serving shared
MNIST."""

from __future__ import annotations

import hashlib
import socket
import threading
from collections.abc import Iterator
from dataclasses import dataclass, field
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path

import pytest

from bayesgate.models.data import download
from bayesgate.models.data import mnist as data
from bayesgate.models.data.download import DEFAULT_MIRRORS, download_mnist, resolve_mirrors
from bayesgate.models.data.mnist import MNIST_FILES, DataError, load_mnist, mnist_fingerprint

LABELS = "t10k-labels-idx1-ubyte.gz"
IMAGES = "t10k-images-idx3-ubyte.gz"


@pytest.fixture(scope="module")
def source(mnist_root: Path) -> Path:
    """The real MNIST files to serve (``mnist_root`` comes from conftest.py)."""
    return mnist_root / "mnist"


@pytest.fixture(autouse=True)
def no_proxy_no_env(monkeypatch: pytest.MonkeyPatch) -> None:
    """Talk to 127.0.0.1 directly, and start without a mirror override."""
    for var in ("http_proxy", "https_proxy", "HTTP_PROXY", "HTTPS_PROXY", "ALL_PROXY", "all_proxy"):
        monkeypatch.delenv(var, raising=False)
    monkeypatch.setenv("no_proxy", "*")
    monkeypatch.delenv("BAYESGATE_MNIST_MIRRORS", raising=False)


@dataclass
class Mirror:
    """A local server; URL path ``/<mode>/<file>`` picks how ``<file>`` is served."""

    port: int
    requests: list[str] = field(default_factory=list)

    def url(self, mode: str) -> str:
        return f"http://127.0.0.1:{self.port}/{mode}/"


def _handler(folder: Path, requests: list[str]) -> type[BaseHTTPRequestHandler]:
    class Handler(BaseHTTPRequestHandler):
        """Modes: ok, missing (404), corrupt (one byte flipped), short (first half, honest
        Content-Length), truncated (first half, then the connection closes early)."""

        def do_GET(self) -> None:
            requests.append(self.path)
            _, mode, name = [*self.path.split("/", 2), "", ""][:3]
            path = folder / name
            if mode == "missing" or not path.is_file():
                self.send_error(404)
                return
            body = path.read_bytes()
            declared = len(body)
            if mode == "corrupt":
                middle = len(body) // 2
                body = body[:middle] + bytes([body[middle] ^ 0xFF]) + body[middle + 1 :]
            elif mode in ("short", "truncated"):
                body = body[: len(body) // 2]
                declared = len(body) if mode == "short" else declared
            self.send_response(200)
            self.send_header("Content-Type", "application/gzip")
            self.send_header("Content-Length", str(declared))
            self.end_headers()
            self.wfile.write(body)
            self.close_connection = True

        def log_message(self, format: str, *args: object) -> None:
            pass

    return Handler


class _QuietServer(ThreadingHTTPServer):
    def handle_error(self, request: object, client_address: object) -> None:
        pass  # a client that hangs up early is expected here


@pytest.fixture
def mirror(source: Path) -> Iterator[Mirror]:
    requests: list[str] = []
    server = _QuietServer(("127.0.0.1", 0), _handler(source, requests))
    thread = threading.Thread(target=server.serve_forever, args=(0.05,), daemon=True)
    thread.start()
    try:
        yield Mirror(server.server_address[1], requests)
    finally:
        server.shutdown()
        server.server_close()
        thread.join(timeout=5)


@pytest.fixture
def refused_url() -> str:
    """A 127.0.0.1 URL with nothing listening (the port was just free)."""
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]
    return f"http://127.0.0.1:{port}/mnist/"


def sha256(path: Path) -> str:
    return hashlib.sha256(path.read_bytes()).hexdigest()


def fetch(root: Path, mirrors: list[str], *names: str) -> Path:
    return download_mnist(root, files=names, mirrors=mirrors, progress=False, timeout=10)


def test_downloads_all_files_verified(tmp_path: Path, mirror: Mirror, source: Path) -> None:
    folder = fetch(tmp_path, [mirror.url("ok")], *MNIST_FILES)
    assert folder == tmp_path / "mnist"
    assert sorted(p.name for p in folder.iterdir()) == sorted(MNIST_FILES)  # no temp files
    for name in MNIST_FILES:
        assert sha256(folder / name) == sha256(source / name)
    x, y = load_mnist("test", data_dir=tmp_path, download=False)
    assert x.shape == (10_000, 1, 28, 28) and y[0] == 7
    assert mnist_fingerprint(tmp_path, download=False) == data.MNIST_FINGERPRINT
    # Present files are not fetched again.
    count = len(mirror.requests)
    fetch(tmp_path, [mirror.url("ok")], *MNIST_FILES)
    assert len(mirror.requests) == count


def test_load_mnist_downloads_missing_files_from_env_mirrors(
    tmp_path: Path, mirror: Mirror, refused_url: str, monkeypatch: pytest.MonkeyPatch
) -> None:
    mirrors = [mirror.url("missing"), refused_url, mirror.url("ok")]
    monkeypatch.setenv("BAYESGATE_MNIST_MIRRORS", ", ".join(mirrors))
    x, y = load_mnist("test", data_dir=tmp_path, limit=5)
    assert x.shape == (5, 1, 28, 28) and y.tolist() == [7, 2, 1, 0, 4]
    assert sorted(p.name for p in (tmp_path / "mnist").iterdir()) == sorted([IMAGES, LABELS])
    expected = [f"/{mode}/{name}" for name in (IMAGES, LABELS) for mode in ("missing", "ok")]
    assert mirror.requests == expected


@pytest.mark.parametrize(
    ("mode", "needle"),
    [("corrupt", "checksum mismatch"), ("short", "truncated"), ("truncated", "truncated")],
)
def test_bad_download_is_rejected_and_removed(
    tmp_path: Path, mirror: Mirror, mode: str, needle: str
) -> None:
    with pytest.raises(DataError) as info:
        fetch(tmp_path, [mirror.url(mode)], IMAGES)
    message = str(info.value)
    assert needle in message and mirror.url(mode) + IMAGES in message
    assert "\n" not in message
    assert list((tmp_path / "mnist").iterdir()) == []  # no partial or temp file left


def test_bad_mirror_falls_back_to_next(tmp_path: Path, mirror: Mirror, source: Path) -> None:
    folder = fetch(
        tmp_path, [mirror.url("corrupt"), mirror.url("truncated"), mirror.url("ok")], LABELS
    )
    assert [p.name for p in folder.iterdir()] == [LABELS]
    assert sha256(folder / LABELS) == sha256(source / LABELS)
    assert mirror.requests == [f"/{m}/{LABELS}" for m in ("corrupt", "truncated", "ok")]


def test_all_mirrors_unreachable(tmp_path: Path, refused_url: str) -> None:
    second = refused_url.replace("/mnist/", "/other/")
    with pytest.raises(DataError) as info:
        fetch(tmp_path, [refused_url, second, "ftp://example.invalid/x"], LABELS)
    message = str(info.value)
    assert message.startswith(f"could not download {LABELS} into {tmp_path / 'mnist'}")
    assert f"{refused_url}{LABELS}: connection refused" in message
    assert f"{second}{LABELS}: connection refused" in message
    assert "unsupported URL scheme 'ftp'" in message
    # the mirrors were given, so $BAYESGATE_MNIST_MIRRORS would change nothing: not named
    assert "(try another mirror or copy the original file there)" in message
    assert "BAYESGATE_MNIST_MIRRORS" not in message and "\n" not in message
    assert list((tmp_path / "mnist").iterdir()) == []


def test_file_urls_and_progress_bar(
    tmp_path: Path, source: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    folder = download_mnist(tmp_path, files=[LABELS], mirrors=[source.as_uri()], progress=True)
    assert sha256(folder / LABELS) == sha256(source / LABELS)
    assert LABELS in capsys.readouterr().err  # tqdm drew its bar on stderr


def test_unknown_file_name(tmp_path: Path) -> None:
    with pytest.raises(ValueError, match="unknown MNIST files"):
        download_mnist(tmp_path, files=["train-images.gz"], mirrors=["http://127.0.0.1:9/"])


def test_resolve_mirrors(monkeypatch: pytest.MonkeyPatch) -> None:
    assert resolve_mirrors() == list(DEFAULT_MIRRORS)
    monkeypatch.setenv("BAYESGATE_MNIST_MIRRORS", " http://a/x , ,https://b/y/ ")
    assert resolve_mirrors() == ["http://a/x/", "https://b/y/"]
    assert resolve_mirrors(["http://c"]) == ["http://c/"]
    monkeypatch.setenv("BAYESGATE_MNIST_MIRRORS", " ")
    assert resolve_mirrors() == list(DEFAULT_MIRRORS)
    with pytest.raises(DataError, match="no MNIST download mirrors"):
        resolve_mirrors([" "])
    assert download.MIRRORS_ENV == "BAYESGATE_MNIST_MIRRORS"


def test_fetch_data_command(
    tmp_path: Path, mirror: Mirror, source: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    """``bayesgate fetch-data``: the four files, verified, then nothing fetched again; a mirror
    that refuses is a one-line error (exit 2), not a traceback."""
    from bayesgate.cli import main

    argv = ["fetch-data", "--data-dir", str(tmp_path), "--mirror", mirror.url("ok")]
    assert main([*argv, "--no-progress"]) == 0
    out = capsys.readouterr().out
    for name in MNIST_FILES:
        assert sha256(tmp_path / "mnist" / name) == sha256(source / name)
        assert f"downloaded  {tmp_path / 'mnist' / name}" in out
    count = len(mirror.requests)
    assert main([*argv, "--no-progress"]) == 0
    assert len(mirror.requests) == count and capsys.readouterr().out.count("present") == 4

    empty = tmp_path / "other"
    refused = socket.socket()
    refused.bind(("127.0.0.1", 0))
    url = f"http://127.0.0.1:{refused.getsockname()[1]}/"
    refused.close()
    assert main(["fetch-data", "--data-dir", str(empty), "--mirror", url, "--timeout", "2"]) == 2
    err = capsys.readouterr().err
    assert err.startswith("bayesgate: error: could not download") and "Traceback" not in err
    assert main(["fetch-data", "--data-dir", str(empty), "--timeout", "0"]) == 2
    assert "--timeout must be > 0" in capsys.readouterr().err


def test_fetch_data_checks_the_files_already_there(
    tmp_path: Path, mirror: Mirror, source: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    """A file already present is checked against the published MD5 of its content, not taken
    on trust: a truncated archive and an un-gzipped file of the wrong content are fetched
    again (and the bad copies removed); good files — gzipped or not — are left alone. Before,
    both bad files were reported "present" and the next `train` failed on them."""
    import gzip
    import shutil

    from bayesgate.cli import main

    folder = tmp_path / "mnist"
    folder.mkdir()
    for name in MNIST_FILES:
        shutil.copy(source / name, folder / name)
    truncated = folder / IMAGES
    truncated.write_bytes(truncated.read_bytes()[:100_000])
    good_raw = folder / "train-labels-idx1-ubyte"  # a good un-gzipped copy stays as it is
    good_raw.write_bytes(gzip.decompress((folder / f"{good_raw.name}.gz").read_bytes()))
    (folder / f"{good_raw.name}.gz").unlink()
    wrong_raw = folder / LABELS.removesuffix(".gz")  # valid IDX bytes, but not this file's
    wrong_raw.write_bytes(good_raw.read_bytes())
    (folder / LABELS).unlink()

    with pytest.raises(DataError, match=r"corrupt or truncated gzip data .*bayesgate fetch-data"):
        load_mnist("test", data_dir=tmp_path, download=False)
    argv = ["fetch-data", "--data-dir", str(tmp_path), "--mirror", mirror.url("ok")]
    assert main([*argv, "--no-progress"]) == 0
    out = capsys.readouterr().out
    assert f"corrupt  {truncated}: not a valid gzip file" in out
    assert f"corrupt  {wrong_raw}: content MD5" in out
    assert sorted(r.rsplit("/", 1)[-1] for r in mirror.requests) == [IMAGES, LABELS]
    assert sha256(truncated) == sha256(source / IMAGES)
    assert sha256(folder / LABELS) == sha256(source / LABELS) and not wrong_raw.exists()
    assert f"present  {good_raw}" in out and good_raw.exists()
    assert out.count("downloaded") == 2 and out.count("present") == 2
    assert load_mnist("test", data_dir=tmp_path, download=False)[1].shape == (10_000,)


def test_a_corrupt_file_that_cannot_be_removed_is_one_line(
    tmp_path: Path,
    mirror: Mirror,
    source: Path,
    capsys: pytest.CaptureFixture[str],
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    """A read-only data folder (root ignores the mode bits, so unlink is made to fail): exit 2
    with one line naming the file, not a traceback."""
    import shutil

    from bayesgate.cli import main

    folder = tmp_path / "mnist"
    folder.mkdir()
    for name in MNIST_FILES:
        shutil.copy(source / name, folder / name)
    (folder / LABELS).write_bytes(b"\x1f\x8b not gzip")

    def read_only(self: Path, missing_ok: bool = False) -> None:
        raise PermissionError(13, "Permission denied", str(self))

    monkeypatch.setattr(Path, "unlink", read_only)
    argv = ["fetch-data", "--data-dir", str(tmp_path), "--mirror", mirror.url("ok")]
    assert main([*argv, "--no-progress"]) == 2
    err = capsys.readouterr().err
    assert (
        err == f"bayesgate: error: {folder / LABELS}: corrupt, and cannot be removed "
        "(Permission denied)\n"
    )
    assert mirror.requests == []
