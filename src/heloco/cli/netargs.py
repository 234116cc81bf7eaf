"""Flags and checks the network commands share: keys, secret, message-size cap, folders."""

from __future__ import annotations

import argparse
from pathlib import Path

from heloco.net import auth
from heloco.net.keys import ClientKeys, ServerKeys, hmac_secret_file, load_client, load_server
from shardmeter.errors import UserInputError

MIB = 1 << 20  # bytes per MiB
MAX_MB = 65536  # 64 GiB: larger than any one message should be


def add_wire_args(p: argparse.ArgumentParser) -> None:
    """Add ``--keys``, ``--max-mb`` and ``--secret-file`` (no secret on the command line)."""
    p.add_argument(
        "--keys",
        type=Path,
        metavar="DIR",
        help="this host's key folder from `heloco keys` (CURVE keys and the HMAC secret)",
    )
    p.add_argument(
        "--max-mb", type=float, default=1024.0, help="largest message sent or accepted (MiB)"
    )
    p.add_argument(
        "--secret-file",
        type=Path,
        help="file holding the HMAC secret (default: $HELOCO_SECRET, $HELOCO_SECRET_FILE, "
        "then DIR/hmac.secret of --keys)",
    )


def _need_keys(args: argparse.Namespace) -> Path:
    if args.keys is None:
        raise UserInputError(
            "--keys", None, "a key folder; create them with `heloco keys --out DIR --workers N`"
        )
    return Path(args.keys)


def server_keys(args: argparse.Namespace) -> ServerKeys:
    """The server's CURVE keys from ``--keys`` (required: the server never runs without)."""
    return load_server(_need_keys(args))


def client_keys(args: argparse.Namespace) -> ClientKeys:
    """A client's CURVE keys from ``--keys`` (required)."""
    return load_client(_need_keys(args))


def secret(args: argparse.Namespace) -> bytes:
    """The HMAC secret: ``--secret-file``, the environment, or the key folder's file."""
    return auth.load_secret(args.secret_file, hmac_secret_file(args.keys))


def max_bytes(args: argparse.Namespace) -> int:
    """``--max-mb`` in bytes; a one-line error unless it is a number > 0."""
    if not 0 < args.max_mb <= MAX_MB:
        raise UserInputError("--max-mb", args.max_mb, f"a number of MiB in (0, {MAX_MB}]")
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
