"""`heloco` command line: one module per subcommand, each with `add_parser` and `run`."""

from __future__ import annotations

import argparse
import sys
from collections.abc import Sequence

from shardmeter.clikit import build_parser as _build_parser
from shardmeter.clikit import dispatch, parse_args

# Subcommands in help order; each is `heloco.cli.<name>` exposing
# `add_parser(subparsers) -> None` and `run(args) -> int`.
COMMANDS: tuple[str, ...] = (
    "simulate",
    "report",
    "serve",
    "work",
    "launch",
    "keys",
    "export",
    "tensorboard",
)


def build_parser() -> argparse.ArgumentParser:
    return _build_parser(
        "heloco",
        "Asynchronous low-communication training (HeLoCo and its baselines), "
        "simulated or over the network.",
        __name__,
        COMMANDS,
    )


# Modules of the `train` extra: without them every command is a one-line install hint.
TRAIN_MODULES: tuple[str, ...] = ("torch", "safetensors", "zmq", "tokenizers")
INSTALL_HINT = (
    "heloco needs the `train` extra (missing: {name}); install it with "
    "pip install -e '.[train]' in the repository, or pip install 'shardmeter-heloco[train]'"
)


def main(argv: Sequence[str] | None = None) -> int:
    """Run `heloco`; without the `train` extra, one line that says how to install it."""
    try:
        return _main(argv)
    except ModuleNotFoundError as exc:
        name = (exc.name or "").partition(".")[0]
        if name not in TRAIN_MODULES:
            raise
        print(f"heloco: error: {INSTALL_HINT.format(name=name)}", file=sys.stderr)
        return 2


def _main(argv: Sequence[str] | None) -> int:
    parser = build_parser()
    args = parse_args(parser, argv)
    if args is None:
        return 2
    if args.command is None:
        parser.print_help()
        return 2
    return dispatch("heloco", __name__, args)


if __name__ == "__main__":
    raise SystemExit(main())
