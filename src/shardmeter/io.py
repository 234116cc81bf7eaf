"""Atomic file writes: a run's outputs appear whole or not at all (write a temp file in the
same folder, then `os.replace`), so an interrupted run never leaves a half-written file."""

from __future__ import annotations

import os
import tempfile
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path
from typing import Any

from shardmeter.errors import UserInputError


@contextmanager
def _temp_beside(path: Path) -> Iterator[str]:
    """A hidden temp file next to `path` (created with its parents), moved onto `path` with
    mode 0644 when the block succeeds and removed when it fails. A path that cannot be a file
    (a folder, or under a file) or is not writable is a UserInputError."""
    try:
        path.parent.mkdir(parents=True, exist_ok=True)
        fd, tmp = tempfile.mkstemp(prefix=f".{path.name}.", dir=path.parent)
    except OSError as exc:
        raise UserInputError("output", str(path), _unwritable(exc)) from None
    os.close(fd)
    try:
        yield tmp
        os.chmod(tmp, 0o644)
        try:
            os.replace(tmp, path)
        except OSError as exc:
            raise UserInputError("output", str(path), _unwritable(exc)) from None
    finally:
        if os.path.exists(tmp):
            os.remove(tmp)


def _unwritable(exc: OSError) -> str:
    return f"a writable file path ({exc.strerror or type(exc).__name__})"


def atomic_write_text(path: Path, text: str) -> None:
    """Write `text` (UTF-8) to `path` atomically."""
    with _temp_beside(path) as tmp:
        Path(tmp).write_text(text, encoding="utf-8")


def atomic_savefig(fig: Any, path: Path, **savefig: Any) -> None:
    """`fig.savefig(path, **savefig)` atomically (pass `format`: the temp name has no suffix)."""
    with _temp_beside(path) as tmp:
        fig.savefig(tmp, **savefig)
