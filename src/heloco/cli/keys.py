"""`heloco keys --out DIR --workers N`: key folders for a server and N workers."""

from __future__ import annotations

import argparse
import sys
from typing import Any

from heloco.cli.common import add_out, require_out
from heloco.cli.netargs import check_folder
from heloco.net.keys import generate


def add_parser(sub: Any) -> None:
    """Register `heloco keys` and its flags on the subcommand parsers."""
    p = sub.add_parser(
        "keys",
        help="create key folders (CURVE keys + HMAC secret) for a server and its workers",
        description="Write DIR/server (for `heloco serve --keys`) and DIR/worker<i> (for "
        "`heloco work --keys`, one per worker host). Copy each folder to its host with "
        "`scp -rp`; secret files are mode 0600. Run again with a larger --workers to add "
        "workers: existing keys are kept.",
    )
    add_out(p, "folder to write the key folders into (required)")
    p.add_argument("--workers", type=int, required=True, help="number of worker key folders")


def run(args: argparse.Namespace) -> int:
    """Run `heloco keys`; bad input raises UserInputError (one line, exit 2)."""
    out = require_out(args)
    check_folder("--out", out)
    made = generate(out, args.workers)
    for path in made.created:
        print(f"created {path}")
    for path in made.kept:
        print(f"kept    {path}")
    print(
        f"heloco keys: copy {out / 'server'} to the server host and each "
        f"{out / 'worker<i>'} to worker i's host (scp -rp)",
        file=sys.stderr,
    )
    return 0
