"""Collectives and HeLoCo's own exchange over emulated WAN links, measured vs predicted.

    python benchmarks/wan_collectives.py                       # every setting (root; minutes)
    python benchmarks/wan_collectives.py --quick               # 3 settings
    python benchmarks/wan_collectives.py --load results.json   # re-predict saved measurements
    python benchmarks/wan_collectives.py --only 6,7 --reps 5   # measure two settings again

Each process runs in its own network namespace behind its own access link
(:mod:`heloco.net.wan`): ``bw`` each way and a round trip ``rtt`` between any two processes
(each link adds half of it; the relay delays packets, so TCP's window, slow start and ACK
clock see the real round trip). The processes run stock Linux TCP buffers (tcp_rmem max
6 MiB, tcp_wmem max 4 MiB), whatever this machine's own are.

Measured, per setting (n processes, bw, rtt) and size M (bytes per process):

* torch.distributed over gloo (CPU tensors): ``allreduce`` (gloo's ring), ``reduce`` to rank 0,
  ``broadcast`` from rank 0, the two one after the other (``reduce+bcast``), ``allgather``
  (M per rank in, n·M out) and ``p2p`` (rank 0 sends M to rank 1). Rank 0 enters every call
  one round trip + LATE_S after the others (ranks never arrive together; gloo's rendezvous then
  has one order, not a race). A timing runs from the moment the last rank entered the call to
  the moment the last rank left it (one clock: the namespaces share CLOCK_MONOTONIC); best of
  ``--reps`` back-to-back calls, so the connections are warm (no slow-start restart).
* HeLoCo's server (endpoint + coordinator + async Nesterov, fp32) in rank 0's namespace and
  n−1 workers (``NetLink``, the client of ``heloco work``), each in its own: once all have
  joined, all pull at one instant, wait, then all push at once (timed from that instant to
  the last reply); best of ``--reps`` such runs. Each waits 1 s (> TCP's RTO) before each, as a worker that
  trained in between does, so every exchange restarts from TCP's initial window.

The prediction beside each row is ShardMeter's (``shardmeter.estimate.wan``), given the same
n, M, link, round trip, window and transport; error = predicted / measured − 1.
Measurements are written to ``--save`` (JSON) so the model can be re-checked with ``--load``.
"""

from __future__ import annotations

import argparse
import dataclasses
import json
import math
import os
import statistics
import subprocess
import sys
import tempfile
import time
from dataclasses import asdict, dataclass
from functools import partial
from pathlib import Path
from typing import Any

MB = 1_000_000
# Rank 0 enters every gloo call this long after one round trip past the others: ranks never
# arrive together, and gloo's rendezvous (a send waits for the peer's recv-ready message) then
# takes one deterministic order instead of a race between the two ranks' messages.
LATE_S = 0.02
OPS = ("allreduce", "reduce", "broadcast", "reduce+bcast", "allgather", "p2p")


@dataclass(frozen=True)
class Setting:
    """n processes, each link ``bw`` bit/s both ways, ``rtt`` s between any two; sizes in MB."""

    n: int
    bw: float
    rtt: float
    sizes: tuple[int, ...]
    heloco: bool = True
    gloo: bool = True


SETTINGS = (
    Setting(2, 10e6, 0.0, (1, 4)),
    Setting(2, 10e6, 0.1, (1, 4)),
    Setting(4, 10e6, 0.04, (1, 2)),
    Setting(2, 100e6, 0.04, (4, 32)),
    Setting(4, 100e6, 0.02, (4, 16)),
    Setting(8, 100e6, 0.0, (4, 8), heloco=False),
    Setting(2, 1e9, 0.0, (32, 256)),
    Setting(4, 1e9, 0.0, (16, 64)),
    Setting(2, 1e9, 0.1, (8, 32)),
)
QUICK = (SETTINGS[1], SETTINGS[3], SETTINGS[7])


@dataclass(frozen=True)
class Row:
    """One measured transfer: the setting, the op, bytes per process, seconds."""

    n: int
    bw: float
    rtt: float
    mtu: int
    op: str
    nbytes: int
    measured_s: float
    load1: float | None = None  # 1-minute load average when its setting finished


# -- processes inside the namespaces -----------------------------------------------------------


def gloo_rank(rank: int, n: int, master: str, sizes: list[int], reps: int, late_s: float) -> None:
    """One rank: every op at every size, ``reps`` times, rank 0 entering each call ``late_s``
    after the others; rank 0 prints all ranks' clocks."""
    import torch
    import torch.distributed as dist

    torch.set_num_threads(1)
    dist.init_process_group("gloo", init_method=f"tcp://{master}:29501", rank=rank, world_size=n)
    marks: list[tuple[str, int, int, float, float]] = []
    for size in sizes:
        numel = size // 4
        x = torch.ones(numel)
        out = [torch.empty(numel) for _ in range(n)]
        for op in OPS:
            if op == "p2p" and rank > 1:
                continue
            for rep in range(reps):
                if op == "p2p":
                    _pair_barrier(rank, dist, torch)
                else:
                    dist.barrier()
                if rank == 0:  # rank 0 enters last, after every peer's notifications arrived
                    time.sleep(late_s)
                t0 = time.monotonic()
                if op == "allreduce":
                    dist.all_reduce(x)
                elif op == "reduce":
                    dist.reduce(x, dst=0)
                elif op == "broadcast":
                    dist.broadcast(x, src=0)
                elif op == "reduce+bcast":
                    dist.reduce(x, dst=0)
                    dist.broadcast(x, src=0)
                elif op == "allgather":
                    dist.all_gather(out, x)
                elif rank == 0:
                    dist.send(x, 1)
                else:
                    dist.recv(x, 0)
                marks.append((op, size, rep, t0, time.monotonic()))
    got: list[Any] = [None] * n
    dist.all_gather_object(got, marks)
    if rank == 0:
        print(json.dumps(got), flush=True)
    dist.destroy_process_group()


def _pair_barrier(rank: int, dist: Any, torch: Any) -> None:
    """Ranks 0 and 1 meet (one small message each way)."""
    t = torch.zeros(1)
    if rank == 0:
        dist.send(t, 1)
        dist.recv(t, 1)
    else:
        dist.recv(t, 0)
        dist.send(t, 0)


def heloco_server(secret_file: str, n_params: int, workers: int, bind: str) -> None:
    """HeLoCo's real endpoint and async-Nesterov server over ``n_params`` fp32 parameters."""
    import torch

    from heloco.net.coordinator import Budget, Coordinator
    from heloco.net.endpoint import Endpoint, EndpointConfig
    from heloco.outer import OuterConfig, build_optimizer
    from heloco.server import Server, ServerConfig

    torch.set_num_threads(1)
    init = {"w": torch.zeros(n_params)}
    opt = build_optimizer("async-nesterov", init, OuterConfig(), workers)
    server = Server(init, opt, ServerConfig(n_workers=workers, inner_steps=1))
    cfg = EndpointConfig(bind=bind, max_bytes=2 << 30, keys=None, shards=1, poll_ms=10)
    secret = bytes.fromhex(Path(secret_file).read_text())
    ep = Endpoint(partial(Coordinator, server, Budget()), secret, cfg)
    print(ep.open(), flush=True)
    ep.serve()


def heloco_worker(secret_file: str, address: str, worker: int, idle_s: float) -> None:
    """Join, say so, read the common start time from stdin; then at it: pull; ``idle_s``
    later: push. Prints both timings as JSON."""
    import torch

    from heloco.net.client import ClientConfig
    from heloco.net.link import NetLink
    from heloco.types import RoundResult

    torch.set_num_threads(1)
    secret = bytes.fromhex(Path(secret_file).read_text())
    cfg = ClientConfig(address, timeout_s=600, deadline_s=600, max_bytes=2 << 30)
    link = NetLink(cfg, secret, worker)
    link.join()
    print("joined", flush=True)
    start = float(sys.stdin.readline())
    time.sleep(max(0.0, start - time.monotonic()))
    traffic = link.client.traffic
    t0 = time.monotonic()
    d = link.pull()
    t1 = time.monotonic()
    assert d is not None
    pulled = traffic.recv_bytes
    delta = {k: torch.full_like(v, 1e-3) for k, v in d.params.items()}
    revision, round_id = d.revision, d.round_id
    del d
    time.sleep(max(0.0, start + idle_s - time.monotonic()))
    sent0 = traffic.sent_bytes
    t2 = time.monotonic()
    out = link.push(RoundResult(worker, delta, 1, 1, 0.0, revision, round_id), 1.0)
    t3 = time.monotonic()
    print(
        json.dumps(
            {
                "pull": [t0, t1, pulled],
                "push": [t2, t3, traffic.sent_bytes - sent0],
                "accepted": out.accepted,
            }
        ),
        flush=True,
    )
    link.close()


# -- the driver (root namespace) ---------------------------------------------------------------


def run_setting(s: Setting, reps: int) -> list[Row]:
    """Every op of one setting in one emulated WAN."""
    from heloco.net.wan import EmulatedWan, LinkSpec

    links = [LinkSpec(s.bw, s.bw, s.rtt / 2.0)] * s.n  # each adds half: rtt between any two
    rows: list[Row] = []
    me = [sys.executable, str(Path(__file__).resolve())]
    with EmulatedWan([f"p{i}" for i in range(s.n)], links, tcp_defaults=True) as w:
        env = os.environ | {"GLOO_SOCKET_IFNAME": "wan0", "OMP_NUM_THREADS": "1"}
        sizes = [m * MB for m in s.sizes]
        if s.gloo:
            procs = [
                w.popen(
                    r,
                    [
                        *me,
                        "gloo",
                        str(r),
                        str(s.n),
                        w.address(0),
                        ",".join(map(str, sizes)),
                        str(reps),
                        repr(s.rtt + LATE_S),
                    ],
                    stdout=subprocess.PIPE,
                    env=env,
                )
                for r in range(s.n)
            ]
            out, _ = procs[0].communicate(timeout=1800)
            for p in procs[1:]:
                p.wait(timeout=60)
            rows += gloo_rows(s, w.mtu, json.loads(out))
        if s.heloco:
            for size in sizes:
                runs = [heloco_rows(s, w, me, size, env) for _ in range(reps)]
                rows += [min(same, key=lambda r: r.measured_s) for same in zip(*runs, strict=True)]
    return rows


def gloo_rows(s: Setting, mtu: int, ranks: list[list[list[Any]]]) -> list[Row]:
    """Best over reps of (last exit − last entry) per op and size."""
    by: dict[tuple[str, int, int], list[tuple[float, float]]] = {}
    for marks in ranks:
        for op, size, rep, t0, t1 in marks:
            by.setdefault((op, size, rep), []).append((t0, t1))
    best: dict[tuple[str, int], float] = {}
    for (op, size, _), ts in by.items():
        t = max(b for _, b in ts) - max(a for a, _ in ts)
        best[(op, size)] = min(best.get((op, size), math.inf), t)
    return [Row(s.n, s.bw, s.rtt, mtu, op, size, t) for (op, size), t in best.items()]


def heloco_rows(s: Setting, w: Any, me: list[str], size: int, env: dict[str, str]) -> list[Row]:
    """All workers pull at once, then push at once (after 1 s idle, > RTO): from the common
    start to the last to finish."""
    from heloco.net import auth
    from heloco.net.wan import PORT

    workers = s.n - 1
    with tempfile.TemporaryDirectory() as tmp:
        secret = Path(tmp) / "secret"
        secret.write_text(auth.new_secret().hex())
        os.chmod(secret, 0o600)
        server = w.popen(0, [*me, "serve", str(secret), str(size // 4), str(workers),
                             f"tcp://{w.address(0)}:{PORT}"], stdout=subprocess.PIPE, env=env)  # fmt: skip
        try:
            assert server.stdout is not None
            address = server.stdout.readline().decode().strip()
            procs = [
                w.popen(
                    1 + k,
                    [*me, "work", str(secret), address, str(k), "1.0"],
                    stdin=subprocess.PIPE,
                    stdout=subprocess.PIPE,
                    env=env,
                )
                for k in range(workers)
            ]
            for p in procs:  # every worker has joined: their pulls start together
                assert p.stdout is not None and p.stdout.readline().strip() == b"joined"
            start = repr(time.monotonic() + 0.5).encode() + b"\n"
            for p in procs:
                assert p.stdin is not None
                p.stdin.write(start)
                p.stdin.flush()
            got = [json.loads(p.communicate(timeout=1800)[0]) for p in procs]
        finally:
            server.kill()
            server.wait()
    rows = []
    for op in ("pull", "push"):
        t = max(g[op][1] for g in got) - min(g[op][0] for g in got)
        if not all(g["accepted"] for g in got):
            raise RuntimeError(f"a push was not accepted: {got}")
        rows.append(Row(s.n, s.bw, s.rtt, w.mtu, f"heloco-{op}", int(got[0][op][2]), t))
    return rows


# -- predictions and the table -----------------------------------------------------------------


def predict(r: Row) -> float:
    """ShardMeter's prediction for a row (shardmeter.estimate.wan.pattern_s)."""
    from shardmeter.estimate.wan import TcpPath, pattern_s

    path = TcpPath(link_Bps=r.bw / 8.0, rtt_s=r.rtt, mtu_bytes=r.mtu, window_bytes=None, streams=1)
    transport = "zmq" if r.op.startswith("heloco") else "gloo"
    return float(pattern_s(r.op, r.nbytes, r.n, path, transport))


def print_table(rows: list[Row]) -> list[float]:
    """Measured vs predicted per row; returns the relative errors."""
    print(f"{'n':>2} {'Mbit/s':>7} {'RTT ms':>6} {'op':<13} {'MB':>7} "
          f"{'measured s':>10} {'predicted s':>11} {'error':>7}")  # fmt: skip
    errors = []
    for r in rows:
        p = predict(r)
        e = p / r.measured_s - 1.0
        errors.append(e)
        print(f"{r.n:>2} {r.bw / 1e6:>7g} {r.rtt * 1e3:>6g} {r.op:<13} {r.nbytes / MB:>7.2f} "
              f"{r.measured_s:>10.3f} {p:>11.3f} {e:>+7.1%}")  # fmt: skip
    abs_e = [abs(e) for e in errors]
    print(f"\n{len(rows)} rows: median |error| {statistics.median(abs_e):.1%}, "
          f"max {max(abs_e):.1%}")  # fmt: skip
    return errors


def save(path: Path, rows: list[Row]) -> None:
    """Measured rows and the load average as JSON, written atomically."""
    path.parent.mkdir(parents=True, exist_ok=True)
    tmp = path.with_suffix(".tmp")
    tmp.write_text(json.dumps({"load": os.getloadavg(), "rows": [asdict(r) for r in rows]}))
    tmp.replace(path)


def _setting_index(text: str) -> int:
    """A setting number of --only, or a one-line error naming it."""
    if not text.strip().isdigit() or int(text) >= len(SETTINGS):
        raise SystemExit(f"--only: {text!r} is not a setting number 0..{len(SETTINGS) - 1}")
    return int(text)


def main() -> None:
    if len(sys.argv) > 1 and sys.argv[1] in ("gloo", "serve", "work"):
        cmd, *a = sys.argv[1:]
        if cmd == "gloo":
            sizes = [int(x) for x in a[3].split(",")]
            gloo_rank(int(a[0]), int(a[1]), a[2], sizes, int(a[4]), float(a[5]))
        elif cmd == "serve":
            heloco_server(a[0], int(a[1]), int(a[2]), a[3])
        else:
            heloco_worker(a[0], a[1], int(a[2]), float(a[3]))
        return
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--quick", action="store_true", help="3 settings instead of all")
    parser.add_argument("--reps", type=int, default=3, help="calls per op (best kept)")
    parser.add_argument(
        "--save", type=Path, default=Path("benchmarks/results/wan_collectives.json")
    )
    parser.add_argument("--load", type=Path, help="re-predict saved measurements")
    parser.add_argument(
        "--only",
        help="comma-separated setting numbers (0-based, in SETTINGS order) to measure again; "
        "the other settings' rows in --save are kept",
    )
    parser.add_argument(
        "--heloco-only", action="store_true", help="with --only: measure HeLoCo's rows only"
    )
    args = parser.parse_args()
    if args.load is not None:
        rows = [Row(**x) for x in json.loads(args.load.read_text())["rows"]]
    else:
        from heloco.net.wan import unavailable

        why = unavailable()
        if why is not None:
            raise SystemExit(f"wan_collectives: {why}")
        chosen = QUICK if args.quick else SETTINGS
        rows = []
        if args.only is not None:
            chosen = tuple(SETTINGS[_setting_index(x)] for x in args.only.split(","))
            if args.heloco_only:
                chosen = tuple(dataclasses.replace(c, gloo=False) for c in chosen)
            if args.save.exists():
                keys = {(c.n, c.bw, c.rtt) for c in chosen}
                old = [Row(**x) for x in json.loads(args.save.read_text())["rows"]]
                rows = [
                    r
                    for r in old
                    if (r.n, r.bw, r.rtt) not in keys
                    or (args.heloco_only and not r.op.startswith("heloco"))
                ]
        for s in chosen:
            t = time.monotonic()
            new = run_setting(s, args.reps)
            load1 = os.getloadavg()[0]
            rows += [dataclasses.replace(r, load1=load1) for r in new]
            print(f"# n={s.n} {s.bw / 1e6:g} Mbit/s rtt {s.rtt * 1e3:g} ms: "
                  f"{time.monotonic() - t:.0f} s, load {os.getloadavg()[0]:.2f}",
                  file=sys.stderr, flush=True)  # fmt: skip
            order = {(c.n, c.bw, c.rtt): k for k, c in enumerate(SETTINGS)}
            rows.sort(key=lambda r: order.get((r.n, r.bw, r.rtt), len(order)))
            save(args.save, rows)  # after every setting: a long run keeps what it measured
    print_table(rows)


if __name__ == "__main__":
    main()
