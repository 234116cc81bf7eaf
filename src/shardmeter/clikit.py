"""The subcommand dispatcher both CLIs share: one module per subcommand, one-line user errors."""

from __future__ import annotations

import argparse
import importlib
import sys
from collections.abc import Sequence
from types import ModuleType
from typing import NoReturn

from shardmeter.errors import UserInputError


def load_command(package: str, name: str) -> ModuleType | None:
    """`package.name`, a module with `add_parser(subparsers)` and `run(args) -> int`, if present."""
    try:
        return importlib.import_module(f"{package}.{name}")
    except ModuleNotFoundError as exc:
        if exc.name == f"{package}.{name}":
            return None
        raise


class OneLineParser(argparse.ArgumentParser):
    """An ArgumentParser whose usage errors are one line (no usage block), as all user errors."""

    def error(self, message: str) -> NoReturn:
        self.exit(2, f"{self.prog}: error: {message} (see {self.prog} --help)\n")


def build_parser(
    prog: str, description: str, package: str, commands: Sequence[str]
) -> argparse.ArgumentParser:
    """A parser with one subparser per command module that exists, in `commands` order."""
    parser = OneLineParser(prog=prog, description=description)
    sub = parser.add_subparsers(dest="command", metavar="COMMAND")
    for name in commands:
        module = load_command(package, name)
        if module is not None:
            module.add_parser(sub)
    return parser


def dispatch(prog: str, package: str, args: argparse.Namespace) -> int:
    """Run the chosen command; a user mistake prints one line to stderr and exits 2."""
    module = load_command(package, args.command)
    assert module is not None
    try:
        return int(module.run(args))
    except UserInputError as exc:
        print(f"{prog}: error: {exc}", file=sys.stderr)
        return 2
    except FileNotFoundError as exc:
        print(f"{prog}: error: file not found: {exc.filename}", file=sys.stderr)
        return 2
    except BrokenPipeError:
        return 0
    except KeyboardInterrupt:
        print(f"{prog}: interrupted", file=sys.stderr)
        return 130
