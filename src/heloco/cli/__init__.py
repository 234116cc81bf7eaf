"""`heloco` command line: one module per subcommand, each with `add_parser` and `run`."""

from __future__ import annotations

import argparse
import importlib
import sys
from collections.abc import Sequence
from types import ModuleType

from shardmeter.errors import UserInputError

# Subcommands in help order; each is `heloco.cli.<name>` exposing
# `add_parser(subparsers) -> None` and `run(args) -> int`.
COMMANDS: tuple[str, ...] = ("simulate", "report", "serve", "work", "launch")


def _load(name: str) -> ModuleType | None:
    try:
        return importlib.import_module(f"heloco.cli.{name}")
    except ModuleNotFoundError as exc:
        if exc.name == f"heloco.cli.{name}":
            return None
        raise


def build_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(
        prog="heloco",
        description="Asynchronous low-communication training (HeLoCo and its baselines), "
        "simulated or over the network.",
    )
    sub = parser.add_subparsers(dest="command", metavar="COMMAND")
    for name in COMMANDS:
        module = _load(name)
        if module is not None:
            module.add_parser(sub)
    return parser


def main(argv: Sequence[str] | None = None) -> int:
    parser = build_parser()
    args = parser.parse_args(argv)
    if args.command is None:
        parser.print_help()
        return 2
    module = _load(args.command)
    assert module is not None
    try:
        return int(module.run(args))
    except UserInputError as exc:
        print(f"heloco: error: {exc}", file=sys.stderr)
        return 2
    except FileNotFoundError as exc:
        print(f"heloco: error: file not found: {exc.filename}", file=sys.stderr)
        return 2
    except KeyboardInterrupt:
        print("heloco: interrupted", file=sys.stderr)
        return 130


if __name__ == "__main__":
    raise SystemExit(main())
