"""`heloco work`: a worker (or, under torchrun, an island) that trains for a `heloco serve`."""

from __future__ import annotations

import argparse
import sys
from pathlib import Path
from typing import Any

from heloco.cli.netargs import add_wire_args, client_keys, max_bytes, secret
from heloco.net import compress
from heloco.net.client import ClientConfig, ServerUnreachable
from heloco.net.link import ProtocolError
from heloco.net.worker_loop import NetWorker, Replaced, WorkerOptions
from shardmeter.errors import UserInputError


def add_parser(sub: Any) -> None:
    """Register `heloco work` and its flags on the subcommand parsers."""
    p = sub.add_parser(
        "work",
        help="train for a server: pull, H inner steps, push",
        description="Connect out to a `heloco serve` address and train until the "
        "run's budget is reached. Run under torchrun for a data-parallel island "
        "(only rank 0 talks to the server).",
    )
    p.add_argument(
        "--connect", required=True, metavar="ADDR", help="server address, tcp://HOST:PORT"
    )
    p.add_argument("--worker", type=int, required=True, help="worker slot (its data shard)")
    p.add_argument(
        "--codec", default="fp32", choices=compress.CODECS, help="pseudo-gradient encoding"
    )
    p.add_argument("--block", type=int, default=compress.DEFAULT_BLOCK, help="int8 block size")
    p.add_argument(
        "--pace",
        type=float,
        metavar="SECONDS",
        help="emulate a slower machine: every inner step lasts at least SECONDS "
        "(as `heloco simulate --paces`; default: full speed)",
    )
    p.add_argument("--device", default="cpu")
    p.add_argument("--island-mode", default="grads", choices=("grads", "deltas"))
    p.add_argument(
        "--threads",
        type=int,
        help="torch CPU threads (default: the run config's `threads`; another count gives "
        "losses that differ from the simulator's in the last bits)",
    )
    p.add_argument("--timeout-s", type=float, default=60.0, help="wait per request before retrying")
    p.add_argument(
        "--deadline-s", type=float, default=600.0, help="give up after this long unanswered"
    )
    p.add_argument(
        "--exchange",
        choices=("blocking", "overlapped", "streaming"),
        help="default: the run config's `exchange`; blocking also joins an overlapped run; "
        "streaming only a streaming one (docs/wan.md)",
    )
    p.add_argument("--report", type=Path, help="write a JSON report of this worker here")
    p.add_argument(
        "--state",
        type=Path,
        metavar="FILE",
        help="keep this worker's state (data position, schedule) here, so a restarted "
        "worker continues its data exactly (safetensors, written every round)",
    )
    add_wire_args(p)


def run(args: argparse.Namespace) -> int:
    """Run `heloco work`; bad input raises UserInputError (one line, exit 2)."""
    hmac_secret = secret(args)
    if not args.connect.startswith("tcp://"):
        raise UserInputError("--connect", args.connect, "a tcp://HOST:PORT address")
    if not (args.timeout_s > 0 and args.deadline_s >= args.timeout_s):
        raise UserInputError("--deadline-s", args.deadline_s, "a number >= --timeout-s > 0")
    limit = max_bytes(args)
    keys = client_keys(args)
    opts = WorkerOptions(
        worker=args.worker,
        codec=args.codec,
        block=args.block,
        pace=args.pace,
        device=args.device,
        island_mode=args.island_mode,
        report=args.report,
        threads=args.threads,
        state=args.state,
        exchange=args.exchange,
    )
    client = ClientConfig(
        args.connect,
        timeout_s=args.timeout_s,
        deadline_s=args.deadline_s,
        max_bytes=limit,
        keys=keys,
    )
    try:
        report = NetWorker(client, hmac_secret, opts).run()
    except (ServerUnreachable, Replaced, ProtocolError) as exc:
        print(f"heloco work: {exc}", file=sys.stderr)
        return 1
    if report.rank == 0:
        print(
            f"heloco work: worker {report.worker}: {report.rounds} rounds, {len(report.acked)} "
            f"acknowledged, rejected {report.rejected or 0}, comm {report.comm_s:.2f} s of "
            f"{report.wall_s:.2f} s",
            file=sys.stderr,
        )
    return 0
