"""`heloco launch`: a server and N workers on this machine (loopback) for demos and tests."""

from __future__ import annotations

import argparse
import json
import sys
from pathlib import Path
from typing import Any

from heloco.cli.netargs import check_folder
from heloco.config import load_config, parse_assignment, preset_names, save_config
from heloco.metrics import SUMMARY_FILE
from heloco.net.launcher import LaunchConfig, launch
from shardmeter.errors import UserInputError


def add_parser(sub: Any) -> None:
    p = sub.add_parser(
        "launch",
        help="run a server and N workers as local processes",
        description="Start `heloco serve` on 127.0.0.1 (free port) and N "
        "`heloco work` processes; results go to OUT (read by `heloco report`).",
    )
    p.add_argument("--config", type=Path, help="run config TOML (as for `heloco simulate`)")
    p.add_argument("--preset", choices=preset_names(), help="start from a shipped preset instead")
    p.add_argument("--set", action="append", default=[], metavar="KEY=VALUE")
    p.add_argument("--out", type=Path, required=True)
    p.add_argument("--workers", type=int, help="default: the config's workers")
    p.add_argument("--paces", help="comma-separated slowdown factors >= 1, one per worker")
    p.add_argument("--seconds-per-step", help="comma-separated fixed seconds per inner step")
    p.add_argument("--codec", default="fp32", choices=("fp32", "bf16", "int8"))
    p.add_argument("--threads", type=int, help="torch threads per worker")
    p.add_argument("--timeout-s", type=float, default=3600.0)
    p.add_argument("--serve-arg", action="append", default=[], help="extra flag for serve")


def _floats(text: str | None, name: str) -> list[float] | None:
    if text is None:
        return None
    try:
        return [float(x) for x in text.split(",")]
    except ValueError:
        raise UserInputError(name, text, "comma-separated numbers") from None


def run(args: argparse.Namespace) -> int:
    """Run `heloco launch`; bad input raises UserInputError (one line, exit 2)."""
    check_folder("--out", args.out)
    paces = _floats(args.paces, "--paces")
    seconds_per_step = _floats(args.seconds_per_step, "--seconds-per-step")
    overrides = dict(parse_assignment(x) for x in args.set)
    if args.workers is not None:
        overrides["workers"] = args.workers
        # the run's nominal paces follow the launch's slowdowns, so a preset's K need not match
        overrides.setdefault("paces", paces or [1.0] * args.workers)
    run_cfg = load_config(args.config, args.preset, overrides)
    resolved = args.out / "launch-config.toml"
    save_config(run_cfg, resolved)
    cfg = LaunchConfig(
        config=resolved,
        out_dir=args.out,
        workers=run_cfg.workers,
        paces=paces,
        seconds_per_step=seconds_per_step,
        serve_args=list(args.serve_arg),
        work_args=["--codec", args.codec],
        threads=args.threads,
    )
    code = launch(cfg, args.timeout_s)
    summary = args.out / SUMMARY_FILE
    if summary.is_file():
        s = json.loads(summary.read_text())
        print(
            f"heloco launch: {s['updates']} updates, final loss {s['final_loss']}; results in {args.out}",
            file=sys.stderr,
        )
    return code
