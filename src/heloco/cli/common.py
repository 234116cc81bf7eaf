"""Flags every `heloco` command spells the same way: --out, --config/--preset/--set, --paces.

One vocabulary across the commands: ``--out`` names the output folder
(``--out-dir`` is a hidden, deprecated alias), ``--config`` a run config TOML, ``--set`` a
dotted override (a misspelt key gets suggestions), and ``--paces`` seconds per inner step.
"""

from __future__ import annotations

import argparse
import math
from pathlib import Path
from typing import Any

from heloco.config import PACE_RULE, RunConfig, load_config, parse_assignment, preset_names
from shardmeter.errors import UserInputError


def add_out(p: argparse.ArgumentParser, help_text: str) -> None:
    """``--out FOLDER`` (and the hidden ``--out-dir`` alias) into ``args.out``."""
    p.add_argument("--out", type=Path, metavar="FOLDER", help=help_text)
    p.add_argument("--out-dir", dest="out", type=Path, help=argparse.SUPPRESS)


def add_overwrite(p: argparse.ArgumentParser, resume: bool = False) -> None:
    """``--overwrite`` (replace the run a non-empty ``--out`` holds) and, where a run can
    continue, ``--resume``."""
    p.add_argument(
        "--overwrite",
        action="store_true",
        help="replace the run the --out folder holds (default: refuse a folder holding files)",
    )
    if resume:
        p.add_argument(
            "--resume",
            action="store_true",
            help="continue the run the --out folder holds, from its newest checkpoint (its "
            "keys and events are kept)",
        )


def require_out(args: argparse.Namespace) -> Path:
    """``args.out``, or a one-line error where the command needs an output folder."""
    if args.out is None:
        raise UserInputError("--out", None, "a folder for the results, e.g. --out runs/net")
    return Path(args.out)


def add_config_args(p: argparse.ArgumentParser) -> None:
    """``--config FILE``, ``--preset NAME`` and repeatable ``--set KEY=VALUE``."""
    p.add_argument(
        "--config", type=Path, metavar="FILE", help="run config TOML (default: --preset)"
    )
    p.add_argument("--preset", metavar="NAME", help=f"shipped preset: {', '.join(preset_names())}")
    p.add_argument(
        "--set",
        action="append",
        default=[],
        metavar="KEY=VALUE",
        help="override any config key (repeatable; dotted for tables: inner.lr=1e-3)",
    )


def set_overrides(args: argparse.Namespace) -> dict[str, Any]:
    """The ``--set`` items as dotted-key overrides, later items winning."""
    return dict(parse_assignment(item) for item in args.set)


def load_run_config(args: argparse.Namespace, overrides: dict[str, Any] | None = None) -> RunConfig:
    """The run config of ``--config``/``--preset`` with ``overrides`` (default: ``--set``).

    A misspelt key is a one-line error with suggestions (``heloco.config.load_config``).
    """
    return load_config(
        args.config, args.preset, set_overrides(args) if overrides is None else overrides
    )


def parse_paces(text: str, flag: str = "--paces") -> list[float]:
    """``"1,1,2"`` -> ``[1.0, 1.0, 2.0]``: seconds per inner step, each finite and > 0.

    The same rule (and error text) as the config's ``paces`` key, in every command.
    """
    try:
        values = [float(x) for x in text.split(",") if x.strip()]
    except ValueError:
        raise UserInputError(flag, text, PACE_RULE) from None
    if not values or not all(math.isfinite(v) and v > 0 for v in values):
        raise UserInputError(flag, text, PACE_RULE)
    return values
