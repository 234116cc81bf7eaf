"""`shardmeter` command line: one module per subcommand, each with `add_parser` and `run`."""

from __future__ import annotations

import argparse
from collections.abc import Sequence

from shardmeter.clikit import build_parser as _build_parser
from shardmeter.clikit import dispatch

# Subcommands in help order; each is `shardmeter.cli.<name>` exposing
# `add_parser(subparsers) -> None` and `run(args) -> int`.
COMMANDS: tuple[str, ...] = ("predict", "plan", "sweep", "validate", "presets")


def build_parser() -> argparse.ArgumentParser:
    return _build_parser(
        "shardmeter",
        "Analytical performance model and planner for sharded, multi-island "
        "and decentralized transformer training.",
        __name__,
        COMMANDS,
    )


def main(argv: Sequence[str] | None = None) -> int:
    parser = build_parser()
    args = parser.parse_args(argv)
    if args.command is None:  # bare `shardmeter` runs the built-in default prediction
        args = parser.parse_args(["predict", *(argv or [])])
    return dispatch("shardmeter", __name__, args)


if __name__ == "__main__":
    raise SystemExit(main())
