"""`heloco` command line: one module per subcommand, each with `add_parser` and `run`."""

from __future__ import annotations

import argparse
from collections.abc import Sequence

from shardmeter.clikit import build_parser as _build_parser
from shardmeter.clikit import dispatch

# Subcommands in help order; each is `heloco.cli.<name>` exposing
# `add_parser(subparsers) -> None` and `run(args) -> int`.
COMMANDS: tuple[str, ...] = ("simulate", "report", "serve", "work", "launch")


def build_parser() -> argparse.ArgumentParser:
    return _build_parser(
        "heloco",
        "Asynchronous low-communication training (HeLoCo and its baselines), "
        "simulated or over the network.",
        __name__,
        COMMANDS,
    )


def main(argv: Sequence[str] | None = None) -> int:
    parser = build_parser()
    args = parser.parse_args(argv)
    if args.command is None:
        parser.print_help()
        return 2
    return dispatch("heloco", __name__, args)


if __name__ == "__main__":
    raise SystemExit(main())
