"""`shardmeter` command line: one module per subcommand, each with `add_parser` and `run`."""

from __future__ import annotations

import argparse
from collections.abc import Sequence

from shardmeter.clikit import build_parser as _build_parser
from shardmeter.clikit import dispatch, parse_args

# Subcommands in help order; each is `shardmeter.cli.<name>` exposing
# `add_parser(subparsers) -> None` and `run(args) -> int`.
COMMANDS: tuple[str, ...] = ("predict", "plan", "fit", "sweep", "validate", "presets")


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
    args = parse_args(parser, argv)
    if args is not None and args.command is None:  # bare `shardmeter`: the default prediction
        args = parse_args(parser, ["predict", *(argv or [])])
    if args is None:
        return 2
    return dispatch("shardmeter", __name__, args)


if __name__ == "__main__":
    raise SystemExit(main())
