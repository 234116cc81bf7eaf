"""`heloco launch`: a server and N workers on this machine (loopback) for demos and tests.

The run is the same as `heloco simulate` runs, in real time: ``--paces`` are seconds per
inner step, and each worker makes every step last at least its pace, so a worker's share of
the updates follows its pace as on the simulated clock. Keys are generated per run folder.
"""

from __future__ import annotations

import argparse
import json
import sys
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from rich.console import Console
from rich.progress import BarColumn, Progress, TextColumn, TimeElapsedColumn

from heloco.cli import main
from heloco.cli.common import (
    add_config_args,
    add_out,
    load_run_config,
    parse_paces,
    require_out,
    set_overrides,
)
from heloco.cli.netargs import check_folder
from heloco.config import save_config
from heloco.metrics import EVENTS_FILE, SUMMARY_FILE
from heloco.net.endpoint import MAX_SHARDS
from heloco.net.launcher import TORCH_PRELOAD, LaunchConfig, LaunchResult, LocalCluster, launch
from heloco.sim import SimConfig, resolve_paces
from shardmeter.clikit import bounded
from shardmeter.errors import UserInputError

PRELOAD = (*TORCH_PRELOAD, "heloco.cli.serve", "heloco.cli.work")
START_WAIT_S = 120.0  # the server waits this long for every worker's first pull


def local_cluster(cfg: LaunchConfig, secret: bytes | None = None) -> LocalCluster:
    """A :class:`LocalCluster` whose children run this command line (tests kill and restart
    its processes)."""
    return LocalCluster(cfg, main, secret, PRELOAD)


def add_parser(sub: Any) -> None:
    p = sub.add_parser(
        "launch",
        help="run a server and N workers as local processes, in real time",
        description="Start `heloco serve` on 127.0.0.1 (free port) and N `heloco work` "
        "processes with per-run keys, show progress, and end when the run's budget is "
        "reached. --paces are seconds per inner step, as in `heloco simulate`: each "
        "worker's steps last at least that long. Results go to OUT (read by "
        "`heloco report`); exit code 1 if any process failed.",
    )
    add_config_args(p)
    add_out(p, "run folder: events.jsonl, summary.json, checkpoints, keys, logs (required)")
    p.add_argument("--workers", type=int, help="default: the config's workers")
    p.add_argument(
        "--paces", help="seconds per inner step per worker, e.g. 1,2,4 (default: the config's)"
    )
    p.add_argument("--codec", default="fp32", choices=("fp32", "bf16", "int8"))
    p.add_argument(
        "--payload",
        metavar="KIND[:KEY=VALUE,...]",
        help="what each worker sends, as `shardmeter plan --payload`: dense, "
        "topk:fraction=0.01, sign; replaces --codec for Δ (the run config's `payload`)",
    )
    p.add_argument(
        "--shards",
        type=bounded(int, 1, MAX_SHARDS),
        default=1,
        metavar="N",
        help="serve with N shards (heloco serve --shards; default 1)",
    )
    p.add_argument(
        "--threads",
        type=int,
        help="torch threads per worker (default: the run config's `threads`, as simulate)",
    )
    p.add_argument("--timeout-s", type=float, default=3600.0)
    p.add_argument("--serve-arg", action="append", default=[], help="extra flag for serve")
    p.add_argument("--quiet", action="store_true", help="no progress bar")


def run_config(args: argparse.Namespace) -> SimConfig:
    """The run config: file or preset, then ``--set``, then ``--workers``/``--paces``."""
    overrides = set_overrides(args)
    if args.paces is not None:
        overrides["paces"] = parse_paces(args.paces)
    if args.payload is not None:
        overrides["payload"] = args.payload
    if args.workers is not None:
        overrides["workers"] = args.workers
        # a preset's paces are for its own K: one second per step unless --paces says more
        overrides.setdefault("paces", [1.0] * args.workers)
    return load_run_config(args, overrides)


def run(args: argparse.Namespace) -> int:
    """Run `heloco launch`; bad input raises UserInputError (one line, exit 2)."""
    out = require_out(args)
    check_folder("--out", out)
    if not args.timeout_s > 0:
        raise UserInputError("--timeout-s", args.timeout_s, "a number of seconds > 0")
    run_cfg = run_config(args)
    out.mkdir(parents=True, exist_ok=True)
    resolved = out / "launch-config.toml"
    save_config(run_cfg, resolved)
    cfg = LaunchConfig(
        config=resolved,
        out_dir=out,
        workers=run_cfg.workers,
        paces=resolve_paces(run_cfg),
        serve_args=["--wait-for-workers", str(START_WAIT_S), *args.serve_arg],
        work_args=["--codec", args.codec],
        threads=args.threads,
        shards=args.shards,
    )
    watch = EventWatch(out / EVENTS_FILE, run_cfg)
    if args.quiet:
        result = launch(cfg, main, args.timeout_s, preload=PRELOAD)
    else:
        with watch.progress():
            result = launch(cfg, main, args.timeout_s, watch.poll, preload=PRELOAD)
    return report(result, out)


def report(result: LaunchResult, out: Path) -> int:
    """One line for the run, one per failed process; exit code 1 if any failed."""
    summary = out / SUMMARY_FILE
    if summary.is_file():
        s = json.loads(summary.read_text())
        loss = "-" if s.get("final_loss") is None else f"{s['final_loss']:.4f}"
        shares = ", ".join(f"{x:.2f}" for x in s.get("worker_shares") or [])
        print(
            f"heloco launch: {s['updates']} updates, final loss {loss}, update shares "
            f"{shares}; results in {out}",
            file=sys.stderr,
        )
    for p in result.failures:
        how = "did not finish" if p.code is None else f"exited with {p.code}"
        print(f"heloco launch: {p.name} {how}; see {p.log}", file=sys.stderr)
    return 1 if result.failures else 0


@dataclass
class EventWatch:
    """Follows a run's ``events.jsonl`` as the server appends to it: tokens, updates, loss."""

    path: Path
    cfg: SimConfig
    tokens: int = 0
    updates: int = 0
    loss: float | None = None
    rounds: list[int] = field(default_factory=list)
    _offset: int = 0
    _bar: Progress | None = None

    def __post_init__(self) -> None:
        self.rounds = [0] * self.cfg.workers

    def read(self) -> None:
        """Consume the whole lines appended since the last call."""
        if not self.path.is_file():
            return
        with self.path.open("rb") as f:
            f.seek(self._offset)
            chunk = f.read()
        end = chunk.rfind(b"\n") + 1
        self._offset += end
        for line in chunk[:end].splitlines():
            try:
                event = json.loads(line)
            except ValueError:
                continue
            kind = event.get("type") if isinstance(event, dict) else None
            if kind == "update":
                self.tokens, self.updates = int(event["tokens"]), int(event["revision"])
            elif kind == "round" and 0 <= event.get("worker", -1) < len(self.rounds):
                self.rounds[event["worker"]] += 1
            elif kind == "eval" and event.get("loss") is not None:
                self.loss = float(event["loss"])

    def progress(self) -> Progress:
        """A rich progress bar over the token budget (or the time budget), on stderr."""
        self._bar = Progress(
            TextColumn(f"[bold]{self.cfg.method}[/]"),
            BarColumn(),
            TextColumn("{task.fields[done]}"),
            TextColumn("{task.fields[info]}"),
            TimeElapsedColumn(),
            console=Console(stderr=True),
        )
        self._bar.add_task("run", total=float(self.cfg.token_budget or 1), done="", info="")
        return self._bar

    def poll(self) -> None:
        """Read new events and redraw the bar."""
        self.read()
        if self._bar is None:
            return
        budget = self.cfg.token_budget
        loss = "-" if self.loss is None else f"{self.loss:.3f}"
        self._bar.update(
            self._bar.task_ids[0],
            completed=float(min(self.tokens, budget)) if budget else 0.0,
            done=f"{self.tokens:,}/{budget:,} tok" if budget else f"{self.tokens:,} tok",
            info=f"{self.updates} upd, rounds {'/'.join(map(str, self.rounds))}, loss {loss}",
        )
