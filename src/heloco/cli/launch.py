"""`heloco launch`: a server and N workers on this machine (loopback) for demos and tests.

The run is the same as `heloco simulate` runs, in real time: ``--paces`` are seconds per
inner step, and each worker makes every step last at least its pace, so a worker's share of
the updates follows its pace as on the simulated clock. Keys are generated per run folder.

``--wan SPEC`` (or ``--topology``) runs every process in its own network namespace behind
shaped, delayed links (:mod:`heloco.net.wan`, docs/wan.md).
"""

from __future__ import annotations

import argparse
import contextlib
import dataclasses
import json
import sys
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from rich.console import Console
from rich.progress import BarColumn, Progress, TextColumn, TimeElapsedColumn

from heloco import runfolder
from heloco.cli import main
from heloco.cli.common import (
    add_config_args,
    add_out,
    add_overwrite,
    load_run_config,
    parse_paces,
    require_out,
    set_overrides,
)
from heloco.cli.netargs import check_folder
from heloco.config import RunConfig, save_config
from heloco.metrics import EVENTS_FILE, SUMMARY_FILE
from heloco.net import wan as wan_mod
from heloco.net.endpoint import MAX_SHARDS
from heloco.net.launcher import TORCH_PRELOAD, LaunchConfig, LaunchResult, LocalCluster, launch
from heloco.net.wanfile import write_settings
from heloco.sim import InnerSetup, resolve_paces
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
    add_overwrite(p, resume=True)
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
        "--exchange",
        choices=("blocking", "overlapped", "streaming"),
        help="blocking (default): push, pull, then train; overlapped: push and pull in the "
        "background while the next round trains; streaming: one of --fragments fragments every "
        "H/P steps, in the background (the run config's `exchange`; docs/wan.md)",
    )
    p.add_argument(
        "--fragments",
        type=int,
        metavar="P",
        help="streaming: fragments of the model (the run config's `fragments`)",
    )
    p.add_argument(
        "--link-slots",
        action="store_true",
        help="the workers take turns on the server's link: one push at a time, first come "
        "first served (heloco serve --link-slots; for a shared --wan-server; docs/wan.md)",
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
    g = p.add_argument_group("emulated WAN (root; docs/wan.md)")
    g.add_argument(
        "--wan",
        metavar="SPEC",
        help="each worker's link to the server, e.g. bw=100Mbit,rtt=40ms (up=/down= for "
        "asymmetric rates); ';'-separated for one spec per worker",
    )
    g.add_argument(
        "--wan-server",
        metavar="SPEC",
        help="the server's own link, shared by every worker (default: unshaped)",
    )
    g.add_argument(
        "--topology",
        metavar="NAME|FILE",
        help="ShardMeter topology: one worker per island, paces from its predicted step "
        "times and links from its WAN (bandwidth × --wan-scale, round trip as given)",
    )
    g.add_argument(
        "--wan-scale",
        type=float,
        default=1.0,
        metavar="F",
        help="multiply the topology's bandwidths by F (e.g. 0.01 so a CPU run ends in "
        "minutes; default 1)",
    )


def run_config(args: argparse.Namespace) -> RunConfig:
    """The run config: file or preset, then ``--set``, then ``--workers``/``--paces``."""
    overrides = set_overrides(args)
    if getattr(args, "topology", None) is not None:
        from heloco import topology as topology_flags

        if args.paces is not None:
            raise UserInputError("--paces", args.paces, "not with --topology (it sets them)")
        overrides = topology_flags.apply(args, overrides)
        overrides.pop("comm_delays")  # the emulated links take the time, not a fixed delay
    if args.paces is not None:
        overrides["paces"] = parse_paces(args.paces)
    if args.payload is not None:
        overrides["payload"] = args.payload
    if args.exchange is not None:
        overrides["exchange"] = args.exchange
    if getattr(args, "fragments", None) is not None:
        overrides["fragments"] = args.fragments
    if args.workers is not None:
        overrides["workers"] = args.workers
        # a preset's paces are for its own K: one second per step unless --paces says more
        overrides.setdefault("paces", [1.0] * args.workers)
    return load_run_config(args, overrides)


def run(args: argparse.Namespace) -> int:
    """Run `heloco launch`; bad input raises UserInputError (one line, exit 2)."""
    out = require_out(args)
    check_folder("--out", out)
    runfolder.prepare("--out", out, args.overwrite, args.resume)
    if not args.timeout_s > 0:
        raise UserInputError("--timeout-s", args.timeout_s, "a number of seconds > 0")
    run_cfg = run_config(args)
    if run_cfg.exchange == "streaming" and args.shards > 1:  # the server would refuse it
        raise UserInputError("--shards", args.shards, "1 with exchange = 'streaming'")
    wan = wan_links(args, run_cfg.workers)
    out.mkdir(parents=True, exist_ok=True)
    resolved = out / "launch-config.toml"
    save_config(run_cfg, resolved)
    cfg = LaunchConfig(
        config=resolved,
        out_dir=out,
        workers=run_cfg.workers,
        paces=resolve_paces(InnerSetup.of(run_cfg)),
        serve_args=[
            "--wait-for-workers",
            str(START_WAIT_S),
            *(["--link-slots"] if args.link_slots else []),
            *args.serve_arg,
        ],
        work_args=["--codec", args.codec],
        threads=args.threads,
        shards=args.shards,
    )
    watch = EventWatch(out / EVENTS_FILE, run_cfg)
    with contextlib.ExitStack() as stack:
        if wan is not None:
            cfg = start_wan(stack, wan, cfg, args)
            write_settings(out, wan)  # wan.json: the links as set, for `heloco report`
        if args.quiet:
            result = launch(cfg, main, args.timeout_s, preload=PRELOAD)
        else:
            with watch.progress():
                result = launch(cfg, main, args.timeout_s, watch.poll, preload=PRELOAD)
    return report(result, out)


def wan_links(args: argparse.Namespace, workers: int) -> wan_mod.EmulatedWan | None:
    """The emulated WAN ``--wan``/``--wan-server``/``--topology`` ask for (not started), or
    None: endpoint 0 is the server, endpoint ``1 + i`` worker ``i``."""
    spec, server, topo = args.wan, args.wan_server, getattr(args, "topology", None)
    if not (args.wan_scale > 0 and args.wan_scale < float("inf")):
        raise UserInputError("--wan-scale", args.wan_scale, "a factor > 0")
    if spec is None and server is None and topo is None:
        if args.wan_scale != 1.0:
            raise UserInputError("--wan-scale", args.wan_scale, "needs --topology")
        return None
    if spec is not None and topo is not None:
        raise UserInputError("--wan", spec, "not with --topology (it sets the links)")
    if topo is not None:
        links = wan_mod.topology_links(args.pace_map, topo, args.wan_scale)
    else:
        links = wan_mod.parse_links(spec or "none", workers)
    server_link = wan_mod.parse_link(server or "none")
    names = ["server", *(f"worker{w}" for w in range(workers))]
    return wan_mod.EmulatedWan(names, [server_link, *links])


def start_wan(
    stack: contextlib.ExitStack,
    wan: wan_mod.EmulatedWan,
    cfg: LaunchConfig,
    args: argparse.Namespace,
) -> LaunchConfig:
    """Start ``wan`` (closed by ``stack``, also on Ctrl-C) and return ``cfg`` inside it; a
    machine that cannot shape refuses in one line."""
    try:
        stack.enter_context(wan)
    except wan_mod.WanUnavailable as exc:
        flag = "--topology" if args.wan is None and args.wan_server is None else "--wan"
        raise UserInputError(flag, args.wan or args.wan_server or args.topology, str(exc)) from None
    for name, link in zip(wan.names, wan.links, strict=True):
        print(f"heloco launch: {name} link {link.describe()}", file=sys.stderr)
    netns = {name: wan.netns(i) for i, name in enumerate(wan.names)}
    return dataclasses.replace(cfg, netns=netns, host=wan.address(0))


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
    cfg: RunConfig
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
