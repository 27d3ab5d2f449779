"""``writable_file`` / ``writable_dir``: an output path a command cannot use is refused up front,
as one ``InvalidArgument`` naming the flag, before any work."""

from __future__ import annotations

from pathlib import Path

import pytest

from bayesgate.errors import InvalidArgument, writable_dir, writable_file


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
