"""`heloco serve`: the HeLoCo server behind ZeroMQ (or `--status ADDR` to query one)."""

from __future__ import annotations

import argparse
import json
import signal
import sys
from pathlib import Path
from types import FrameType
from typing import Any

from heloco import runfolder
from heloco.cli.common import add_config_args, add_out, add_overwrite, load_run_config
from heloco.cli.netargs import (
    add_wire_args,
    check_folder,
    client_keys,
    max_bytes,
    secret,
    server_keys,
)
from heloco.net.client import Client, ClientConfig, ServerUnreachable
from heloco.net.endpoint import MAX_SHARDS, EndpointConfig
from heloco.net.keys import ClientKeys
from heloco.net.session import Liveness, Session
from shardmeter.clikit import bounded
from shardmeter.errors import UserInputError

MAX_PERIOD_S = 86400.0  # heartbeat and eviction periods: at most a day


def add_parser(sub: Any) -> None:
    """Register `heloco serve` and its flags on the subcommand parsers."""
    p = sub.add_parser(
        "serve",
        help="serve a run to networked workers (ZeroMQ, CURVE + HMAC)",
        description="Serve a run to workers that connect out to this address. Only "
        "workers whose CURVE key is in --keys DIR/allowed/ complete the handshake; every "
        "message also carries an HMAC of the shared secret (DIR/hmac.secret, "
        "--secret-file, $HELOCO_SECRET or $HELOCO_SECRET_FILE; never a command-line value).",
    )
    add_config_args(p)
    p.add_argument(
        "--bind",
        default="tcp://127.0.0.1:5555",
        help="listen address; use tcp://0.0.0.0:PORT for other hosts, port 0 = any free",
    )
    add_out(p, "results folder (events.jsonl, summary.json, checkpoints)")
    add_overwrite(p, resume=True)
    p.add_argument("--checkpoint-dir", type=Path, help="default: OUT/checkpoints")
    p.add_argument("--checkpoint-every", type=int, default=0, metavar="UPDATES")
    p.add_argument("--checkpoint-every-s", type=float, default=60.0, metavar="SECONDS")
    p.add_argument(
        "--durable",
        action="store_true",
        help="checkpoint every accepted push before acknowledging it",
    )
    p.add_argument("--heartbeat-s", type=float, default=2.0)
    p.add_argument("--evict-after-s", type=float, default=10.0)
    p.add_argument(
        "--wait-for-workers",
        type=float,
        default=0.0,
        metavar="SECONDS",
        help="a fresh run starts when every worker has pulled, or SECONDS after the first "
        "pull (default 0: each worker starts at once)",
    )
    p.add_argument(
        "--link-slots",
        action="store_true",
        help="the workers share this server's link: each asks for it before a push, and the "
        "pushes cross it one at a time, first come first served (docs/wan.md)",
    )
    p.add_argument(
        "--shards",
        type=bounded(int, 1, MAX_SHARDS),
        default=1,
        metavar="N",
        help="split the tensors over N sockets and threads (ports PORT..PORT+N-1), balanced by "
        "bytes; workers talk to all of them in parallel (default 1)",
    )
    add_wire_args(p)
    p.add_argument(
        "--status", metavar="ADDR", help="print the status of the server at ADDR and exit"
    )
    p.add_argument("--timeout-s", type=float, default=10.0, help="with --status: how long to wait")


def status(
    address: str, secret: bytes, timeout_s: float, keys: ClientKeys | None = None
) -> dict[str, Any]:
    """Ask a running server for its status (revision, workers, throughput, counters)."""
    cfg = ClientConfig(address, timeout_s=timeout_s, deadline_s=timeout_s, keys=keys)
    client = Client(cfg, secret)
    try:
        reply = client.request("status")
    finally:
        client.close()
    return reply.body


def _check(args: argparse.Namespace) -> None:
    max_bytes(args)
    for name in ("heartbeat_s", "evict_after_s"):
        if not 0 < getattr(args, name) <= MAX_PERIOD_S:
            raise UserInputError(
                f"--{name.replace('_', '-')}",
                getattr(args, name),
                f"seconds in (0, {MAX_PERIOD_S:g}]",
            )
    if args.evict_after_s <= args.heartbeat_s:
        raise UserInputError(
            "--evict-after-s", args.evict_after_s, f"more than --heartbeat-s ({args.heartbeat_s})"
        )
    for name in ("checkpoint_every", "checkpoint_every_s", "wait_for_workers"):
        if not getattr(args, name) >= 0:
            raise UserInputError(
                f"--{name.replace('_', '-')}", getattr(args, name), "a number >= 0"
            )
    if not args.bind.startswith("tcp://"):
        raise UserInputError("--bind", args.bind, "a tcp://HOST:PORT address")
    check_folder("--out", args.out)
    check_folder("--checkpoint-dir", args.checkpoint_dir)


def run(args: argparse.Namespace) -> int:
    """Run `heloco serve`; bad input raises UserInputError (one line, exit 2)."""
    hmac_secret = secret(args)
    if args.status:
        if not args.status.startswith("tcp://"):
            raise UserInputError("--status", args.status, "a tcp://HOST:PORT address")
        ask = client_keys(args)
        try:
            print(json.dumps(status(args.status, hmac_secret, args.timeout_s, ask), indent=1))
        except ServerUnreachable as exc:
            print(f"heloco: error: {exc}", file=sys.stderr)
            return 1
        return 0
    _check(args)
    keys = server_keys(args)
    cfg = load_run_config(args)
    out = args.out if args.out is not None else cfg.out_dir
    if out is not None:
        # Keys and logs a launcher put there first are not a run: only a run's files count.
        runfolder.prepare("--out", out, args.overwrite, args.resume, server=True)
    ckpt = args.checkpoint_dir or (out / "checkpoints" if out is not None else None)
    endpoint = EndpointConfig(
        bind=args.bind,
        max_bytes=max_bytes(args),
        checkpoint_dir=ckpt,
        checkpoint_every=args.checkpoint_every,
        checkpoint_every_s=args.checkpoint_every_s,
        durable=args.durable,
        keys=keys,
        shards=args.shards,
    )
    session = Session(
        cfg,
        hmac_secret,
        endpoint,
        Liveness(args.heartbeat_s, args.evict_after_s, args.wait_for_workers, args.link_slots),
        out,
    )

    def on_signal(signum: int, frame: FrameType | None) -> None:
        session.endpoint.stop.set()

    signal.signal(signal.SIGTERM, on_signal)
    signal.signal(signal.SIGINT, on_signal)

    def ready(address: str) -> None:
        resumed = (
            f" (resumed at revision {session.side.server.revision})" if session.resumed else ""
        )
        shards = session.endpoint.listeners[1:]
        also = f" and {', '.join(s.address for s in shards)} (shards)" if shards else ""
        print(f"heloco serve: listening on {address}{also}{resumed}", file=sys.stderr, flush=True)

    summary = session.serve(ready)
    counters = session.coord.counters
    print(
        f"heloco serve: {summary.updates} updates, {summary.tokens} tokens, final loss "
        f"{summary.final_loss}; accepted {counters.accepted}, rejected {counters.rejected}, "
        f"dropped {counters.bad_mac + counters.replay + counters.stale} (auth/replay)",
        file=sys.stderr,
    )
    return 0
