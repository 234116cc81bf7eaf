"""The argparse kit both CLIs share: the subcommand dispatcher (one module per subcommand),
a parser whose usage errors are one line, and bounded number types for flags."""

from __future__ import annotations

import argparse
import importlib
import math
import sys
from collections.abc import Callable, Sequence
from types import ModuleType
from typing import Any, NoReturn

from shardmeter.errors import UserInputError


def load_command(package: str, name: str) -> ModuleType | None:
    """`package.name`, a module with `add_parser(subparsers)` and `run(args) -> int`, if present."""
    try:
        return importlib.import_module(f"{package}.{name}")
    except ModuleNotFoundError as exc:
        if exc.name == f"{package}.{name}":
            return None
        raise


# -- argparse types: numbers checked where they are typed, named in one line -------------------
MAX_INT = 2**31 - 1  # counts and degrees on the command line (GPUs, tp, steps, ...)


def _number(text: str, kind: type[int] | type[float]) -> float:
    try:
        value = kind(text)
    except ValueError:
        raise argparse.ArgumentTypeError(f"got {text!r}; {_noun(kind)}") from None
    if not math.isfinite(value):
        raise argparse.ArgumentTypeError(f"got {text!r}; a finite number")
    return value


def _noun(kind: type[int] | type[float]) -> str:
    return "an integer" if kind is int else "a number"


def bounded(
    kind: type[int] | type[float],
    low: float | None = None,
    high: float | None = None,
    *,
    low_open: bool = False,
) -> Callable[[str], Any]:
    """An argparse ``type``: ``kind`` (int or float), finite, in [low, high] (``(low, high]``
    with ``low_open``); integers are at most MAX_INT. A refusal reads
    ``argument --tp: got '0'; an integer >= 1``."""
    top = MAX_INT if kind is int and high is None else high

    def parse(text: str) -> Any:
        value = _number(text, kind)
        too_low = low is not None and (value <= low if low_open else value < low)
        too_high = top is not None and value > top
        if too_low or too_high:
            rule = [f"{'>' if low_open else '>='} {_plain(low)}"] if low is not None else []
            if high is not None or too_high:
                rule.append(f"<= {_plain(top)}")
            raise argparse.ArgumentTypeError(f"got {text!r}; {_noun(kind)} {' and '.join(rule)}")
        return value

    parse.__name__ = f"{kind.__name__} in range"  # argparse names the type in some messages
    return parse


def _plain(x: float | None) -> str:
    """3 -> '3', 0.5 -> '0.5', 2147483647 -> '2147483647' (no exponent for whole numbers)."""
    return str(int(x)) if x is not None and float(x).is_integer() else f"{x:g}"


positive_int = bounded(int, 1)
nonneg_int = bounded(int, 0)
finite_float = bounded(float)
positive_float = bounded(float, 0, low_open=True)
nonneg_float = bounded(float, 0)


class UsageError(Exception):
    """A command-line mistake argparse found; `parse_args` prints it as one line."""


class OneLineParser(argparse.ArgumentParser):
    """An ArgumentParser whose usage errors are one line (no usage block), as all user errors."""

    def error(self, message: str) -> NoReturn:
        root = self.prog.split()[0]  # "shardmeter plan" -> "shardmeter", as in all errors
        raise UsageError(f"{root}: error: {message} (see {self.prog} --help)")


def parse_args(
    parser: argparse.ArgumentParser, argv: Sequence[str] | None
) -> argparse.Namespace | None:
    """``parser.parse_args(argv)``, or None after printing a usage mistake as one line (the
    caller returns 2), so ``main(argv)`` returns its exit code in process too."""
    try:
        args = parser.parse_args(argv)
    except UsageError as exc:
        print(exc, file=sys.stderr)
        return None
    args.argv = list(sys.argv[1:] if argv is None else argv)  # the command as typed (--html)
    return args


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
