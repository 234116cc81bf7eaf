"""Atomic file writes, written once for both packages: a file appears whole or not at all.

`atomic_path` yields a hidden temp file beside the target (parents created); the caller writes
it; on success it is optionally fsynced, given its mode (0644, or 0600 for secrets: the temp
file is created 0600, so a secret is never readable by others) and moved into place with
`os.replace`; on failure it is removed and the error propagates. `write_atomic` writes text or
bytes that way and raises OSError like `open`. ShardMeter's output writers (`atomic_write_text`,
`atomic_savefig`) turn an unwritable path into a one-line UserInputError.
"""

from __future__ import annotations

import os
import tempfile
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path
from typing import Any

from shardmeter.errors import UserInputError


def _fsync(path: str | Path) -> None:
    fd = os.open(path, os.O_RDONLY)
    try:
        os.fsync(fd)
    finally:
        os.close(fd)


@contextmanager
def atomic_path(path: Path, *, mode: int = 0o644, fsync: bool = False) -> Iterator[Path]:
    """A temp file next to `path` for the block to write; moved onto `path` when the block
    succeeds (fsynced first when `fsync`), removed when it fails."""
    path = Path(path)
    path.parent.mkdir(parents=True, exist_ok=True)
    fd, tmp = tempfile.mkstemp(prefix=f".{path.name}.", suffix=".tmp", dir=path.parent)
    os.close(fd)
    try:
        yield Path(tmp)
        if fsync:
            _fsync(tmp)
        os.chmod(tmp, mode)
        os.replace(tmp, path)
    finally:
        if os.path.exists(tmp):
            os.remove(tmp)


def write_atomic(path: Path, data: str | bytes, *, mode: int = 0o644, fsync: bool = False) -> None:
    """Write `data` (text as UTF-8, or bytes) to `path` atomically; OSError as `open` raises."""
    with atomic_path(path, mode=mode, fsync=fsync) as tmp:
        if isinstance(data, bytes):
            tmp.write_bytes(data)
        else:
            tmp.write_text(data, encoding="utf-8")


def _unwritable(exc: OSError) -> str:
    return f"a writable file path ({exc.strerror or type(exc).__name__})"


def atomic_write_text(path: Path, text: str) -> None:
    """Write `text` (UTF-8) to `path` atomically; an unwritable path is a UserInputError."""
    try:
        write_atomic(path, text)
    except OSError as exc:
        raise UserInputError("output", str(path), _unwritable(exc)) from None


def atomic_savefig(fig: Any, path: Path, **savefig: Any) -> None:
    """`fig.savefig(path, **savefig)` atomically (pass `format`: the temp name ends in .tmp);
    an unwritable path is a UserInputError."""
    try:
        with atomic_path(path) as tmp:
            fig.savefig(tmp, **savefig)
    except OSError as exc:
        raise UserInputError("output", str(path), _unwritable(exc)) from None
