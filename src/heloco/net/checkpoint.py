"""Server checkpoints: safetensors for tensors, JSON for the rest, published by atomic rename.

A checkpoint is a directory ``ckpt-<revision:09d>/`` holding ``tensors.safetensors`` and
``state.json``. It is written as ``.tmp-...`` and renamed into place (``os.replace``) once both
files are flushed to disk, so a reader sees a whole checkpoint or none. ``LATEST`` names the
newest one (also replaced atomically); the newest ``keep`` checkpoints are kept. No pickle.
"""

from __future__ import annotations

import json
import os
import shutil
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import torch
from safetensors.torch import load_file, save_file

TENSORS_FILE = "tensors.safetensors"
STATE_FILE = "state.json"
LATEST_FILE = "LATEST"
PREFIX = "ckpt-"


@dataclass(frozen=True)
class Checkpoint:
    """A loaded checkpoint: flat tensors, JSON state and where it came from."""

    tensors: dict[str, torch.Tensor]
    state: dict[str, Any]
    path: Path


def _fsync_file(path: Path) -> None:
    fd = os.open(path, os.O_RDONLY)
    try:
        os.fsync(fd)
    finally:
        os.close(fd)


def _write_text(path: Path, text: str) -> None:
    tmp = path.with_name(f".{path.name}.tmp")
    with tmp.open("w") as f:
        f.write(text)
        f.flush()
        os.fsync(f.fileno())
    os.replace(tmp, path)


def save(
    root: Path,
    revision: int,
    tensors: dict[str, torch.Tensor],
    state: dict[str, Any],
    keep: int = 2,
) -> Path:
    """Write checkpoint ``revision`` under ``root`` atomically; returns its directory."""
    root.mkdir(parents=True, exist_ok=True)
    final = root / f"{PREFIX}{revision:09d}"
    tmp = root / f".tmp-{PREFIX}{revision:09d}-{os.getpid()}"
    if tmp.exists():
        shutil.rmtree(tmp)
    tmp.mkdir()
    cpu = {k: v.detach().contiguous().cpu() for k, v in tensors.items()}
    save_file(cpu, str(tmp / TENSORS_FILE))
    _fsync_file(tmp / TENSORS_FILE)
    _write_text(tmp / STATE_FILE, json.dumps(state, allow_nan=True, indent=1))
    if final.exists():
        shutil.rmtree(final)
    os.replace(tmp, final)
    _write_text(root / LATEST_FILE, final.name + "\n")
    _prune(root, keep)
    return final


def _complete(root: Path) -> list[Path]:
    dirs = [p for p in root.glob(f"{PREFIX}*") if p.is_dir()]
    return sorted(p for p in dirs if (p / TENSORS_FILE).is_file() and (p / STATE_FILE).is_file())


def _prune(root: Path, keep: int) -> None:
    for old in _complete(root)[:-keep] if keep > 0 else []:
        shutil.rmtree(old, ignore_errors=True)


def latest(root: Path) -> Path | None:
    """The newest complete checkpoint directory under ``root``, or None."""
    if not root.is_dir():
        return None
    named = root / LATEST_FILE
    if named.is_file():
        candidate = root / named.read_text().strip()
        if (candidate / TENSORS_FILE).is_file() and (candidate / STATE_FILE).is_file():
            return candidate
    done = _complete(root)
    return done[-1] if done else None


def load(path: Path) -> Checkpoint:
    """Read one checkpoint directory (tensors on CPU)."""
    tensors = load_file(str(path / TENSORS_FILE))
    state = json.loads((path / STATE_FILE).read_text())
    return Checkpoint(tensors, state, path)
