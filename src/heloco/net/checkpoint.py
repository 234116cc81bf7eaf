"""Server checkpoints: safetensors for tensors, JSON for the rest, checksummed, published by
atomic rename, loaded newest-valid-first.

A checkpoint is a directory ``ckpt-<revision:09d>-<n:04d>/`` (``n`` counts saves at the same
revision, so a save never replaces an existing checkpoint) holding ``tensors.safetensors``,
``state.json`` and ``checksums.json`` (SHA-256 of the other two). It is written as
``.tmp-...``, every file and the directory are flushed to disk, and only then is it renamed
into place (``os.replace``), so a reader sees a whole checkpoint or none. A write that fails
(a full disk) removes its temporary directory and leaves every published checkpoint as it
was. ``LATEST`` names the newest one (for people and tools; loading does not need it); the
newest ``keep`` checkpoints are kept. No pickle.

Loading (:func:`newest_valid`) walks the checkpoints from the newest down and takes the first
whose checksums match and whose files parse; the ones skipped are returned with the reason,
so the caller can warn.
"""

from __future__ import annotations

import contextlib
import hashlib
import json
import os
import re
import shutil
from collections.abc import Callable, Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any, TypeVar

import torch
from safetensors import SafetensorError
from safetensors.torch import load_file

from heloco.net.compress import as_bytes
from shardmeter.io import write_atomic

TENSORS_FILE = "tensors.safetensors"
STATE_FILE = "state.json"
CHECKSUMS_FILE = "checksums.json"
LATEST_FILE = "LATEST"
PREFIX = "ckpt-"
_NAME = re.compile(rf"^{PREFIX}(\d{{9}})(?:-(\d{{4}}))?$")
_CHUNK = 1 << 22  # bytes hashed per read


class CheckpointError(RuntimeError):
    """A checkpoint that cannot be used (corrupt, truncated, unreadable) or written."""


@dataclass(frozen=True)
class Checkpoint:
    """A loaded checkpoint: flat tensors, JSON state and where it came from."""

    tensors: dict[str, torch.Tensor]
    state: dict[str, Any]
    path: Path


@dataclass(frozen=True)
class Skipped:
    """A checkpoint passed over while loading, and why."""

    path: Path
    reason: str


def _fsync(path: Path) -> None:
    fd = os.open(path, os.O_RDONLY)
    try:
        os.fsync(fd)
    finally:
        os.close(fd)


def _write_text(path: Path, text: str) -> None:
    write_atomic(path, text, fsync=True)


_DTYPE_NAMES = {
    torch.float32: "F32",
    torch.float64: "F64",
    torch.float16: "F16",
    torch.bfloat16: "BF16",
    torch.int64: "I64",
    torch.int32: "I32",
    torch.int8: "I8",
    torch.uint8: "U8",
    torch.bool: "BOOL",
}


def write_safetensors(path: Path, tensors: dict[str, torch.Tensor]) -> str:
    """Write ``tensors`` as a safetensors file one tensor at a time, straight from their
    memory (no copy of the model, unlike ``safetensors.torch.save_file``), fsynced; returns
    the file's SHA-256, computed on the way.

    Format (huggingface/safetensors): 8-byte little-endian header length, a JSON header
    {name: {dtype, shape, data_offsets}} padded with spaces to 8 bytes, then the data."""
    header: dict[str, Any] = {}
    offset = 0
    for name, t in tensors.items():
        if t.dtype not in _DTYPE_NAMES:
            raise CheckpointError(f"{name}: dtype {t.dtype} has no safetensors name")
        size = t.numel() * t.element_size()
        header[name] = {
            "dtype": _DTYPE_NAMES[t.dtype],
            "shape": list(t.shape),
            "data_offsets": [offset, offset + size],
        }
        offset += size
    raw = json.dumps(header, separators=(",", ":")).encode()
    raw += b" " * (-len(raw) % 8)
    digest = hashlib.sha256()
    with path.open("wb") as f:
        for chunk in (len(raw).to_bytes(8, "little"), raw):
            f.write(chunk)
            digest.update(chunk)
        for t in tensors.values():
            data = as_bytes(t)
            f.write(data)
            digest.update(data)
        f.flush()
        os.fsync(f.fileno())
    return digest.hexdigest()


def sha256(path: Path) -> str:
    """Hex SHA-256 of a file, read in chunks."""
    digest = hashlib.sha256()
    with path.open("rb") as f:
        while chunk := f.read(_CHUNK):
            digest.update(chunk)
    return digest.hexdigest()


def checkpoints(root: Path) -> list[Path]:
    """Published checkpoint directories under ``root``, oldest first (by revision, then save)."""
    if not root.is_dir():
        return []
    found = []
    for p in root.iterdir():
        m = _NAME.match(p.name)
        if m is not None and p.is_dir():
            found.append(((int(m.group(1)), int(m.group(2) or -1)), p))
    return [p for _, p in sorted(found)]


def _next_name(root: Path, revision: int) -> str:
    same = [p for p in checkpoints(root) if p.name.startswith(f"{PREFIX}{revision:09d}")]
    n = 0
    for p in same:
        m = _NAME.match(p.name)
        assert m is not None
        n = max(n, int(m.group(2) or -1) + 1)
    return f"{PREFIX}{revision:09d}-{n:04d}"


def save(
    root: Path,
    revision: int,
    tensors: dict[str, torch.Tensor],
    state: dict[str, Any],
    keep: int = 2,
) -> Path:
    """Write checkpoint ``revision`` under ``root`` atomically; returns its directory.

    Raises :class:`CheckpointError` (after removing the partial write) if any write fails;
    the checkpoints already published are untouched.
    """
    try:
        root.mkdir(parents=True, exist_ok=True)
        text = json.dumps(state, allow_nan=False, indent=1)
    except (OSError, ValueError) as exc:
        raise CheckpointError(f"cannot write a checkpoint under {root}: {exc}") from exc
    final = root / _next_name(root, revision)
    tmp = root / f".tmp-{final.name}-{os.getpid()}"
    try:
        shutil.rmtree(tmp, ignore_errors=True)
        tmp.mkdir()
        sums = {TENSORS_FILE: write_safetensors(tmp / TENSORS_FILE, tensors)}
        _write_text(tmp / STATE_FILE, text)
        sums[STATE_FILE] = hashlib.sha256(text.encode()).hexdigest()
        _write_text(tmp / CHECKSUMS_FILE, json.dumps(sums, indent=1))
        _fsync(tmp)
        os.replace(tmp, final)
        _fsync(root)
    except (OSError, SafetensorError) as exc:
        shutil.rmtree(tmp, ignore_errors=True)
        raise CheckpointError(f"writing {final.name} failed: {exc}") from exc
    with contextlib.suppress(OSError):  # LATEST is a convenience: loading scans the folders
        _write_text(root / LATEST_FILE, final.name + "\n")
    _prune(root, keep)
    return final


def _prune(root: Path, keep: int) -> None:
    for old in checkpoints(root)[:-keep] if keep > 0 else []:
        shutil.rmtree(old, ignore_errors=True)


def latest(root: Path) -> Path | None:
    """The newest published checkpoint directory under ``root`` (not verified), or None."""
    found = checkpoints(root)
    return found[-1] if found else None


def verify(path: Path) -> None:
    """Raise :class:`CheckpointError` unless both files exist and match ``checksums.json``.

    A checkpoint without ``checksums.json`` (written before checksums existed) passes if its
    files parse (:func:`load` checks that).
    """
    for name in (TENSORS_FILE, STATE_FILE):
        if not (path / name).is_file():
            raise CheckpointError(f"{path.name}: {name} is missing")
    sums_path = path / CHECKSUMS_FILE
    if not sums_path.is_file():
        return
    try:
        sums = json.loads(sums_path.read_text())
    except (OSError, ValueError) as exc:
        raise CheckpointError(f"{path.name}: unreadable {CHECKSUMS_FILE} ({exc})") from None
    if not isinstance(sums, dict):
        raise CheckpointError(f"{path.name}: {CHECKSUMS_FILE} is not an object")
    for name in (TENSORS_FILE, STATE_FILE):
        try:
            actual = sha256(path / name)
        except OSError as exc:
            raise CheckpointError(f"{path.name}: cannot read {name} ({exc})") from None
        if sums.get(name) != actual:
            raise CheckpointError(f"{path.name}: checksum of {name} does not match")


def load(path: Path) -> Checkpoint:
    """Verify and read one checkpoint directory (tensors on CPU)."""
    verify(path)
    try:
        tensors = load_file(str(path / TENSORS_FILE))
        state = json.loads((path / STATE_FILE).read_text())
    except (OSError, ValueError, SafetensorError) as exc:  # JSONDecodeError is a ValueError
        raise CheckpointError(f"{path.name}: unreadable ({exc})") from None
    if not isinstance(state, dict):
        raise CheckpointError(f"{path.name}: {STATE_FILE} is not an object")
    return Checkpoint(tensors, state, path)


T = TypeVar("T")


def newest_valid(root: Path, use: Callable[[Checkpoint], T]) -> tuple[T | None, list[Skipped]]:
    """Apply ``use`` to the newest checkpoint that loads and that ``use`` accepts.

    ``use`` raises :class:`CheckpointError` (or ``KeyError``/``ValueError``/``TypeError``)
    to reject one whose content does not fit. Returns ``use``'s result (None if there was
    no checkpoint) and the checkpoints skipped on the way, newest first.
    """
    skipped: list[Skipped] = []
    for path in _newest_first(root):
        try:
            return use(load(path)), skipped
        except (CheckpointError, KeyError, ValueError, TypeError) as exc:
            skipped.append(Skipped(path, str(exc)[:300]))
    return None, skipped


def _newest_first(root: Path) -> Iterator[Path]:
    yield from reversed(checkpoints(root))
