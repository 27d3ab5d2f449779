"""``writable_file`` / ``writable_dir``: an output path a command cannot use is refused up front,
as one ``InvalidArgument`` naming the flag, before any work. ``write_atomically``: a file is
replaced whole, with the umask's permissions, and nothing is left behind when the writer fails."""

from __future__ import annotations

import errno
import os
import stat
from collections.abc import Iterator
from pathlib import Path

import numpy as np
import pytest

from bayesgate.errors import InvalidArgument, writable_dir, writable_file
from bayesgate.outputs import write_atomically, write_text_atomically


def test_a_writable_file_path_passes_and_its_folders_are_made(tmp_path: Path) -> None:
    target = tmp_path / "a" / "b" / "out.npz"
    writable_file(target, "--out", suffix=".npz")
    assert target.parent.is_dir() and not target.exists()


@pytest.mark.parametrize(
    ("make", "message"),
    [
        (lambda t: t / "plain" / "out.json", "cannot create"),  # a file where a folder must be
        (lambda t: t, "is a folder, not a file"),
        (lambda t: t / "out.txt", "must end in .npz"),
    ],
)
def test_an_unusable_file_path_is_one_line_naming_the_flag(
    tmp_path: Path, make, message: str
) -> None:
    (tmp_path / "plain").write_text("x")
    suffix = ".npz" if message.startswith("must end") else None
    with pytest.raises(InvalidArgument, match=message) as caught:
        writable_file(make(tmp_path), "--out", suffix=suffix)
    assert str(caught.value).startswith("--out ") and "\n" not in str(caught.value)


def test_a_folder_path_creates_nothing(tmp_path: Path) -> None:
    writable_dir(tmp_path / "new" / "deeper", "--out")
    assert not (tmp_path / "new").exists()
    writable_dir(tmp_path, "--out")  # an existing folder is fine (the command decides on reuse)


def test_a_folder_path_under_or_at_a_file_is_refused(tmp_path: Path) -> None:
    plain = tmp_path / "plain"
    plain.write_text("x")
    with pytest.raises(InvalidArgument, match="is a file, not a folder"):
        writable_dir(plain, "--checkpoint-dir")
    with pytest.raises(InvalidArgument, match=r"--out .*plain is a file, not a folder"):
        writable_dir(plain / "sub" / "deeper", "--out")


@pytest.mark.skipif(not Path("/proc/self").is_dir(), reason="needs Linux's /proc")
def test_a_folder_nothing_can_be_created_in_is_refused_even_for_root() -> None:
    """``/proc`` refuses new files to everyone, root included (``os.access`` would say yes)."""
    with pytest.raises(InvalidArgument, match=r"--out /proc/a\.npz: cannot write in /proc"):
        writable_file(Path("/proc/a.npz"), "--out", suffix=".npz")
    with pytest.raises(InvalidArgument, match="cannot write in /proc"):
        writable_dir(Path("/proc/new/run"), "--out")


@pytest.fixture
def umask_027() -> Iterator[None]:
    """A umask that gives neither ``mkstemp``'s 0o600 nor the common 0o644."""
    old = os.umask(0o027)
    try:
        yield
    finally:
        os.umask(old)


def _write_atomically(target: Path, write, binary: bool) -> None:
    if binary:
        write_atomically(target, write, binary=True)
    else:
        write_atomically(target, write)


@pytest.mark.usefixtures("umask_027")
@pytest.mark.parametrize("binary", [False, True])
def test_write_atomically_replaces_the_file_with_the_umasks_permissions(
    tmp_path: Path, binary: bool
) -> None:
    target = tmp_path / "out.bin"
    target.write_bytes(b"old")
    os.chmod(target, 0o600)  # the new file's mode comes from the umask, not the old file
    beside: list[str] = []

    def write(stream) -> None:
        beside.extend(os.listdir(tmp_path))  # the temporary is in the target's folder
        if binary:
            stream.write(b"\x00\xffbytes\r\n")
        else:
            stream.write("é\r\n")

    _write_atomically(target, write, binary)
    assert target.read_bytes() == (b"\x00\xffbytes\r\n" if binary else "é\r\n".encode())
    assert stat.S_IMODE(target.stat().st_mode) == 0o640
    assert len(beside) == 2 and any(n.startswith(".out.bin.") for n in beside)
    assert os.listdir(tmp_path) == ["out.bin"]


def test_write_atomically_binary_takes_what_numpy_writes(tmp_path: Path) -> None:
    target = tmp_path / "cache.npz"
    x = np.arange(6, dtype=np.float32).reshape(2, 3)
    write_atomically(target, lambda out: np.savez_compressed(out, x=x), binary=True)
    with np.load(target, allow_pickle=False) as data:
        assert np.array_equal(data["x"], x)
    assert os.listdir(tmp_path) == ["cache.npz"]  # numpy did not add a suffix to a temporary


@pytest.mark.parametrize("error", [OSError("disk full"), KeyboardInterrupt()])
@pytest.mark.parametrize("binary", [False, True])
def test_write_atomically_leaves_the_old_file_and_no_temporary_when_the_writer_fails(
    tmp_path: Path, binary: bool, error: BaseException
) -> None:
    target = tmp_path / "out.json"
    target.write_text("old")

    def write(stream) -> None:
        stream.write(b"half" if binary else "half")
        stream.flush()
        raise error

    with pytest.raises(type(error)):
        _write_atomically(target, write, binary)
    assert target.read_text() == "old"
    assert os.listdir(tmp_path) == ["out.json"]


@pytest.mark.skipif(not Path("/proc/self/fd").is_dir(), reason="needs Linux's /proc")
def test_write_atomically_fsyncs_the_file_and_its_folder_only_when_asked(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    synced: list[str] = []
    real_fsync = os.fsync

    def fsync(fd: int) -> None:
        mode = os.fstat(fd).st_mode
        synced.append("folder" if stat.S_ISDIR(mode) else os.readlink(f"/proc/self/fd/{fd}"))
        real_fsync(fd)

    monkeypatch.setattr(os, "fsync", fsync)
    target = tmp_path / "state.json"
    write_atomically(target, lambda out: out.write(b"one"), binary=True)
    assert synced == []
    write_atomically(target, lambda out: out.write(b"two"), binary=True, fsync=True)
    assert target.read_bytes() == b"two"
    assert len(synced) == 2 and synced[1] == "folder"
    assert Path(synced[0]).parent == tmp_path and Path(synced[0]).name.startswith(".state.json.")


@pytest.mark.usefixtures("umask_027")
def test_write_atomically_sets_the_mode_before_the_data_so_fsync_covers_it(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    modes: list[int] = []
    real_fsync = os.fsync

    def fsync(fd: int) -> None:
        if stat.S_ISREG(os.fstat(fd).st_mode):
            modes.append(stat.S_IMODE(os.fstat(fd).st_mode))
        real_fsync(fd)

    monkeypatch.setattr(os, "fsync", fsync)
    write_atomically(tmp_path / "state.json", lambda out: out.write("{}"), fsync=True)
    assert modes == [0o640]


@pytest.mark.parametrize(
    ("code", "written"), [(errno.EPERM, True), (errno.ENOTSUP, True), (errno.EIO, False)]
)
def test_write_atomically_on_a_file_system_without_modes(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, code: int, written: bool
) -> None:
    """Where the file system keeps no modes (vfat, some network mounts: fchmod fails with
    EPERM or ENOTSUP) the file is still written; any other error is raised, nothing left."""

    def fchmod(fd: int, mode: int) -> None:
        raise OSError(code, os.strerror(code))

    monkeypatch.setattr(os, "fchmod", fchmod)
    target = tmp_path / "out.json"
    if written:
        write_atomically(target, lambda out: out.write("new"))
        assert target.read_text() == "new"
    else:
        with pytest.raises(OSError, match=os.strerror(errno.EIO)):
            write_atomically(target, lambda out: out.write("new"))
        assert not target.exists()
    assert os.listdir(tmp_path) == (["out.json"] if written else [])


def test_write_text_atomically_writes_utf8_as_given(tmp_path: Path) -> None:
    """The reports' writer: UTF-8 whatever the locale, newlines untranslated, no temporary."""
    target = tmp_path / "report.md"
    target.write_text("old")
    write_text_atomically(target, "ε = 0.3 → 1.4 %\r\nnext\n")
    assert target.read_bytes() == "ε = 0.3 → 1.4 %\r\nnext\n".encode()
    assert os.listdir(tmp_path) == ["report.md"]
