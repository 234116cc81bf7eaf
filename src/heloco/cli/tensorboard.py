"""`heloco tensorboard`: a run's events as TensorBoard scalars (the JSONL stays canonical)."""

from __future__ import annotations

import argparse
import sys
from pathlib import Path
from typing import Any


def add_parser(sub: Any) -> None:
    """Register `heloco tensorboard` and its flags on the subcommand parsers."""
    p = sub.add_parser(
        "tensorboard",
        help="write a run's losses, staleness, shares and statistics as TensorBoard scalars",
        description="Convert RUN_DIR/events.jsonl (simulate, serve or launch) into TensorBoard "
        "event files; --follow keeps converting a live run until it writes summary.json. "
        "Needs the optional extra: pip install -e '.[tensorboard]'.",
    )
    p.add_argument("run_dir", type=Path, metavar="RUN_DIR")
    p.add_argument("--out", type=Path, metavar="FOLDER", help="default: RUN_DIR/tensorboard")
    p.add_argument("--follow", action="store_true", help="follow a live run")
    p.add_argument(
        "--idle-s", type=float, default=600.0, help="with --follow: stop after this long quiet"
    )


def run(args: argparse.Namespace) -> int:
    """Run `heloco tensorboard`; bad input raises UserInputError (one line, exit 2)."""
    from heloco.tensorboard import convert

    out = args.out or args.run_dir / "tensorboard"
    n = convert(args.run_dir, out, follow=args.follow, idle_s=args.idle_s)
    print(f"heloco tensorboard: {n} scalars in {out} (tensorboard --logdir {out})", file=sys.stderr)
    return 0
