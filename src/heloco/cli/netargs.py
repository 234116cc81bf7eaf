"""Flags and checks the network commands share: secret file, message-size cap, output folders."""

from __future__ import annotations

import argparse
from pathlib import Path

from shardmeter.errors import UserInputError

MIB = 1 << 20  # bytes per MiB


def add_wire_args(p: argparse.ArgumentParser) -> None:
    """Add ``--max-mb`` and ``--secret-file`` (the secret never goes on the command line)."""
    p.add_argument(
        "--max-mb", type=float, default=1024.0, help="largest message sent or accepted (MiB)"
    )
    p.add_argument(
        "--secret-file",
        type=Path,
        help="file holding the shared secret (default: $HELOCO_SECRET or $HELOCO_SECRET_FILE)",
    )


def max_bytes(args: argparse.Namespace) -> int:
    """``--max-mb`` in bytes; a one-line error unless it is a number > 0."""
    if not args.max_mb > 0:
        raise UserInputError("--max-mb", args.max_mb, "a number > 0")
    return int(args.max_mb * MIB)


def check_folder(flag: str, path: Path | None) -> None:
    """Raise unless ``path`` is a folder or can be created as one (no file in the way)."""
    if path is None:
        return
    for p in (path, *path.parents):
        if p.exists():
            if not p.is_dir():
                raise UserInputError(flag, str(path), f"a folder ({p} is a file)")
            return
