"""Atomic writes (shardmeter.io): whole file or none, no temp files left behind."""

from __future__ import annotations

import stat
from pathlib import Path
from typing import Any

import pytest

from shardmeter.errors import UserInputError
from shardmeter.io import atomic_savefig, atomic_write_text


def test_atomic_write_text_replaces_whole_file(tmp_path: Path) -> None:
    path = tmp_path / "sub" / "out.toml"
    atomic_write_text(path, "a = 1\n")
    atomic_write_text(path, "a = 2\n")
    assert path.read_text() == "a = 2\n"
    assert stat.S_IMODE(path.stat().st_mode) == 0o644
    assert [p.name for p in path.parent.iterdir()] == ["out.toml"]


class _FailingFigure:
    def savefig(self, fname: str, **kwargs: Any) -> None:
        Path(fname).write_text("partial")
        raise RuntimeError("disk full")


def test_failed_savefig_leaves_the_old_file_and_no_temp(tmp_path: Path) -> None:
    path = tmp_path / "plot.png"
    path.write_text("old")
    with pytest.raises(RuntimeError, match="disk full"):
        atomic_savefig(_FailingFigure(), path, format="png")
    assert path.read_text() == "old"
    assert [p.name for p in tmp_path.iterdir()] == ["plot.png"]


def test_unwritable_output_paths_are_user_input_errors(tmp_path: Path) -> None:
    (tmp_path / "folder.txt").mkdir()
    (tmp_path / "file").write_text("")
    for bad in (tmp_path / "folder.txt", tmp_path / "file" / "out.txt"):
        with pytest.raises(UserInputError, match=r"^output: got .*; a writable file path"):
            atomic_write_text(bad, "x")
    assert sorted(p.name for p in tmp_path.iterdir()) == ["file", "folder.txt"]


def test_write_atomic_text_bytes_private_mode_and_fsync(tmp_path: Path) -> None:
    """The one helper both packages write through: bytes or text, 0600 for secrets, fsync on
    request, OSError (not a UserInputError) for a library caller, nothing left behind."""
    from shardmeter.io import write_atomic

    write_atomic(tmp_path / "a.bin", b"\x00\x01")
    write_atomic(tmp_path / "key", "secret", mode=0o600, fsync=True)
    assert (tmp_path / "a.bin").read_bytes() == b"\x00\x01"
    assert stat.S_IMODE((tmp_path / "key").stat().st_mode) == 0o600
    (tmp_path / "dir").mkdir()
    with pytest.raises(OSError) as info:
        write_atomic(tmp_path / "dir", "x")
    assert not isinstance(info.value, UserInputError)
    assert sorted(p.name for p in tmp_path.iterdir()) == ["a.bin", "dir", "key"]
