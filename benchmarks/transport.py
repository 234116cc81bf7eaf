"""Loopback transport benchmark of the HeLoCo server, as ratios to the machine's own limit.

    python benchmarks/transport.py                   # 10M and 100M; CURVE off and on; 1, 2 shards
    python benchmarks/transport.py --sizes 100 --curve on --reps 5
    python benchmarks/transport.py --rounds          # also: comm share of real training rounds
    python benchmarks/transport.py --payload topk:fraction=0.01 --payload sign   # codec cost

The limit, measured in the same run over the same bytes (the model's 8 fp32 tensors as frames):
raw ZeroMQ on loopback (a DEALER sends the frames from memory to a ROUTER in another process,
which answers one small frame) plus one pass of the message tag over those bytes on one core
(``auth.sign``: HMAC-SHA256, large frames through their 1 MiB pieces' SHA-256), one after the
other: limit MB/s = bytes / (t_zmq + t_hmac). With CURVE on (as `heloco serve`
always runs), the raw ZeroMQ leg is CURVE-encrypted too, so each setting has its own limit.

The server is the real one (endpoint, coordinator, ``Server``, async Nesterov outer step) in
its own process over N fp32 parameters in 8 tensors, with ``--workers`` worker slots (4).
This process is the workers, with the client `heloco work` uses (``NetLink``). Two measures,
both in wire bytes per second (MB/s) and updates/s:

* end to end (``push``): ONE worker pulls the model (fp32) and pushes a pseudo-gradient (fp32,
  bf16 or int8), timed per request: the worker's encoding (int8 quantising) and tag, loopback
  TCP, the server's verification, decoding, finiteness check and outer update, and the reply.
  updates/s = 1 / seconds per push: what one worker waits for. The worker's own work is in
  every figure, so a second shard can only shorten the server's share of it.
* server capacity (``queued``): what sharding is for. Every worker slot pulls (its one round
  in flight), then its push is encoded and signed BEFORE the timed window; the pushes are then
  sent back to back (to a sharded server: each worker's ``stage`` messages, and its ``push``
  as soon as every shard has staged its part, as ``NetLink`` does), timed from the first send
  to the last reply. Every push must come back applied (no duplicate, no rejection: the
  server's revision, replay and one-round-per-worker rules are the normal ones). MB/s = wire
  bytes of all pushes / window seconds; updates/s = pushes / window seconds.

The servers of every shard count run at once and take turns round by round (a pull, a push
and a queued window each), so the load of a shared machine falls on each of them alike.
Every process runs ``--threads`` torch threads (default 1, the run config's default); the
worker hashes and quantises on up to 4 threads of its own (``heloco.net.pool``), a server
shard on one, so a figure may exceed the one-core limit. Each figure is the best of ``--reps``
at the largest size and of proportionally more (at most 10) at smaller ones, whose pushes
last tens of ms (the machine is shared: the best run is the least disturbed), and so is the
limit, measured once before every round of the setting (the same load).

Last, the unit costs at the largest size, on one core in this process: the outer step per
parameter (u), what int8 decoding adds to it (q), the fp32 finiteness check (f) and the
worker's int8 quantising (w), and the int8/fp32 ratio they would give if a push were these
costs plus c = ZeroMQ + tag per wire byte one after the other (BENCHMARKS.md derives it),
beside the memory floor of any outer step (θ and the momentum read and written once).

Every push and window also records the CPU seconds of both processes (all threads, from
/proc), so the report gives the cores each kept busy and, for each ratio of the targets, its
ceiling on this machine: the same CPU work cannot take less wall time than its CPU seconds
over the cores, so a ratio above its ceiling needs less work, not better overlap.
"""

from __future__ import annotations

import argparse
import math
import multiprocessing as mp
import os
import tempfile
import time
from dataclasses import dataclass, field
from functools import partial
from pathlib import Path
from typing import Any

import torch
import zmq

from heloco.net import auth, compress, wire
from heloco.net.client import ClientConfig
from heloco.net.compress import Codec
from heloco.net.coordinator import Budget, Coordinator
from heloco.net.endpoint import Endpoint, EndpointConfig
from heloco.net.keys import (
    AllowList,
    ClientKeys,
    ServerKeys,
    connect_securely,
    new_keypair,
    serve_securely,
)
from heloco.net.link import NetLink
from heloco.net.pool import WORKER_THREADS
from heloco.net.session import Session
from heloco.net.worker_loop import NetWorker, WorkerOptions
from heloco.outer import OuterConfig, build_optimizer
from heloco.outer.base import Arrival
from heloco.server import Server, ServerConfig
from heloco.sim import parse_sim_config
from heloco.types import RoundResult
from shardmeter.clikit import positive_int

N_TENSORS = 8
MB = 1e6


def fake_params(n_params: int) -> dict[str, torch.Tensor]:
    """N fp32 parameters split over ``N_TENSORS`` tensors of about equal size."""
    per, extra = divmod(n_params, N_TENSORS)
    return {f"layer{i}.weight": torch.zeros(per + (i < extra)) for i in range(N_TENSORS)}


def curve_keys(workers: int = 1) -> tuple[ServerKeys, list[ClientKeys]]:
    """A fresh server key pair that admits one fresh client key per worker (named worker<i>,
    so each may speak only for its own slot)."""
    server = new_keypair()
    clients = [new_keypair() for _ in range(workers)]
    allowed = {c.public: f"worker{i}" for i, c in enumerate(clients)}
    return ServerKeys(server, allowed), [ClientKeys(server.public, c) for c in clients]


# -- the machine's limit ------------------------------------------------------------------------
def echo(keys: ServerKeys | None, address: Any) -> None:
    """A ROUTER that answers every message with one small frame (raw ZeroMQ, no HeLoCo)."""
    ctx = zmq.Context()
    auth_thread = None
    sock = ctx.socket(zmq.ROUTER)
    if keys is not None:
        auth_thread = AllowList(ctx, keys.allowed)
        auth_thread.start()
        serve_securely(sock, keys)
    address.put(f"tcp://127.0.0.1:{sock.bind_to_random_port('tcp://127.0.0.1')}")
    while True:
        frames = sock.recv_multipart(copy=False)
        sock.send_multipart([frames[0], b"ok"])


@dataclass(frozen=True)
class Limit:
    """Raw ZeroMQ and HMAC rates over the same bytes, and the two combined (MB/s); and the
    CPU seconds per byte that the raw ZeroMQ transfer costs both processes together (the
    sender's and the receiver's I/O threads, CURVE included when on; ns per byte)."""

    zmq_mbs: float
    hmac_mbs: float
    zmq_cpu_ns: float = math.nan

    @property
    def mbs(self) -> float:
        """bytes / (t_zmq + t_hmac), as MB/s."""
        return 1.0 / (1.0 / self.zmq_mbs + 1.0 / self.hmac_mbs)


def process_cpu_s(pid: int | None) -> float:
    """CPU seconds (user + system, all threads) of process ``pid`` so far, from Linux's
    /proc (clock ticks, usually 10 ms); nan where there is no /proc."""
    try:
        fields = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()
    except OSError:
        return math.nan
    return (int(fields[11]) + int(fields[12])) / os.sysconf("SC_CLK_TCK")


def cpu_now(server_pid: int | None) -> float:
    """CPU seconds so far of this process (the workers, their I/O threads included) plus the
    server process ``server_pid``: differences of two readings bound how many cores a
    measure kept busy (/proc ticks: about 10 ms resolution)."""
    return time.process_time() + process_cpu_s(server_pid)


class LimitProbe:
    """The machine's limit, measured between the transport's rounds: an echo process and a
    DEALER to it; each :meth:`measure` times one raw ZeroMQ request and one tag over the frames
    of ``n_params`` fp32. :meth:`limit` is the best of each."""

    def __init__(self, n_params: int, curve: bool) -> None:
        server_keys, client_keys = curve_keys() if curve else (None, [])
        q: Any = mp.get_context("spawn").Queue()
        self.proc = mp.get_context("spawn").Process(target=echo, args=(server_keys, q), daemon=True)
        self.proc.start()
        self.ctx: zmq.Context[Any] = zmq.Context()
        self.sock = self.ctx.socket(zmq.DEALER)
        if client_keys:
            connect_securely(self.sock, client_keys[0])
        self.sock.connect(q.get(timeout=60))
        self.frames = [compress.as_bytes(t) for t in fake_params(n_params).values()]
        self.nbytes = sum(len(f) for f in self.frames)
        self.secret = auth.new_secret()
        self.zmq_s: list[float] = []
        self.hmac_s: list[float] = []
        self.cpu_s: list[float] = []
        self.sock.send_multipart([b"warm-up"])
        self.sock.recv_multipart()

    def measure(self) -> None:
        """One raw ZeroMQ request of the frames, then one tag over them (one core)."""
        cpu0 = cpu_now(self.proc.pid)
        t0 = time.perf_counter()
        self.sock.send_multipart(self.frames, copy=False)
        self.sock.recv_multipart()
        self.zmq_s.append(time.perf_counter() - t0)
        self.cpu_s.append(cpu_now(self.proc.pid) - cpu0)
        t0 = time.perf_counter()
        auth.sign(self.secret, self.frames)
        self.hmac_s.append(time.perf_counter() - t0)

    def limit(self) -> Limit:
        """Best raw ZeroMQ and best tag rate so far; the transfer's least CPU time."""
        return Limit(
            self.nbytes / MB / min(self.zmq_s),
            self.nbytes / MB / min(self.hmac_s),
            min(self.cpu_s) / self.nbytes * 1e9,
        )

    def close(self) -> None:
        """Stop the echo process."""
        self.sock.close(linger=0)
        self.ctx.term()
        self.proc.kill()
        self.proc.join(10)


# -- the HeLoCo transport -----------------------------------------------------------------------
def serve_fake(
    n_params: int,
    secret: bytes,
    keys: ServerKeys | None,
    shards: int,
    threads: int,
    workers: int,
    q: Any,
) -> None:
    """Server process: a real endpoint in front of a Server with async Nesterov."""
    torch.set_num_threads(threads)
    init = fake_params(n_params)
    opt = build_optimizer("async-nesterov", init, OuterConfig(), workers)
    server = Server(init, opt, ServerConfig(n_workers=workers, inner_steps=1))
    del init
    cfg = EndpointConfig(
        bind="tcp://127.0.0.1:0", max_bytes=2 << 30, keys=keys, shards=shards, poll_ms=10
    )
    ep = Endpoint(partial(Coordinator, server, Budget()), secret, cfg)
    q.put(ep.open())
    ep.serve()


@dataclass(frozen=True)
class Row:
    """One setting and codec over loopback: pull/push sizes (MB) and throughput (MB/s) end to
    end, and the server's capacity (``workers`` queued pushes of ``queued_mb`` each, MB/s)."""

    params_m: int
    curve: bool
    shards: int
    codec: str
    pull_mb: float
    pull_mbs: float
    push_mb: float
    push_mbs: float
    workers: int
    queued_mb: float
    queued_mbs: float
    push_cpu_s: float = math.nan
    queued_cpu_s: float = math.nan

    @property
    def push_cores(self) -> float:
        """Cores busy on average during the best push: CPU seconds of every process (both
        ends, all threads) / wall seconds."""
        return self.push_cpu_s * self.push_mbs / self.push_mb

    @property
    def queued_cores(self) -> float:
        """Cores busy on average during the best queued window (as :attr:`push_cores`)."""
        return self.queued_cpu_s * self.queued_mbs / (self.queued_mb * self.workers)

    @property
    def updates_per_s(self) -> float:
        """Pushes applied per second, end to end (1 / seconds per push)."""
        return self.push_mbs / self.push_mb

    @property
    def queued_updates_per_s(self) -> float:
        """Pushes applied per second while pushes queue up (pushes / seconds of the window)."""
        return self.queued_mbs / self.queued_mb


@dataclass
class Timings:
    """Seconds and wire bytes of every pull, push and queued window of one shard count and
    codec (bytes: of one pull, one push, one window), and the CPU seconds of each push and
    window in both processes (:func:`cpu_now`)."""

    pulls: list[float] = field(default_factory=list)
    pushes: list[float] = field(default_factory=list)
    windows: list[float] = field(default_factory=list)
    push_cpu: list[float] = field(default_factory=list)
    window_cpu: list[float] = field(default_factory=list)
    pull_bytes: int = 0
    push_bytes: int = 0
    window_bytes: int = 0


def start_server(
    n_params: int, curve: bool, shards: int, threads: int, workers: int
) -> tuple[mp.process.BaseProcess, list[NetLink]]:
    """A server process of ``shards`` shards for ``workers`` worker slots, and a joined link
    for each slot (each with its own CURVE key when ``curve``)."""
    secret = auth.new_secret()
    server_keys, client_keys = curve_keys(workers) if curve else (None, [])
    ctx = mp.get_context("spawn")
    q: Any = ctx.Queue()
    args = (n_params, secret, server_keys, shards, threads, workers, q)
    proc = ctx.Process(target=serve_fake, args=args, daemon=True)
    proc.start()
    address = q.get(timeout=300)
    links = []
    for w in range(workers):
        keys = client_keys[w] if client_keys else None
        cfg = ClientConfig(address, timeout_s=600, deadline_s=600, max_bytes=2 << 30, keys=keys)
        links.append(NetLink(cfg, secret, w))
        links[-1].join()
    return proc, links


def bench(
    n_params: int,
    curve: bool,
    shard_counts: list[int],
    codecs: list[str],
    reps: int,
    threads: int,
    workers: int,
    probe: LimitProbe,
) -> list[Row]:
    """Best pull, push and queued window of ``n_params`` per shard count and codec (``reps``
    each), against one server process per shard count, all up at once: the limit ``probe``
    and the shard counts take turns round by round, so a shared machine's load falls on
    each alike."""
    servers: list[tuple[mp.process.BaseProcess, list[NetLink]]] = []
    try:
        for k in shard_counts:
            servers.append(start_server(n_params, curve, k, threads, workers))
        gen = torch.Generator().manual_seed(0)
        delta = {
            k: torch.randn(v.shape, generator=gen) * 1e-3 for k, v in fake_params(n_params).items()
        }
        got = {(k, c): Timings() for k in shard_counts for c in codecs}
        for name in codecs:
            codec = compress.check_codec(name)
            for _ in range(reps):
                probe.measure()
                for k, (proc, links) in zip(shard_counts, servers, strict=True):
                    links[0].codec = codec
                    one_round(links[0], delta, got[(k, codec)], proc.pid)
                    queued_round(links, delta, codec, got[(k, codec)], proc.pid)
        return [
            Row(
                n_params // 1_000_000,
                curve,
                k,
                c,
                t.pull_bytes / MB,
                t.pull_bytes / MB / min(t.pulls),
                t.push_bytes / MB,
                t.push_bytes / MB / min(t.pushes),
                workers,
                t.window_bytes / workers / MB,
                t.window_bytes / MB / min(t.windows),
                t.push_cpu[t.pushes.index(min(t.pushes))],
                t.window_cpu[t.windows.index(min(t.windows))],
            )
            for (k, c), t in got.items()
        ]
    finally:
        for proc, links in servers:
            for link in links:
                link.close()
            proc.kill()
            proc.join(10)


def one_round(
    link: NetLink, delta: dict[str, torch.Tensor], into: Timings, server_pid: int | None = None
) -> None:
    """One timed pull and one timed push of ``delta``, added to ``into`` (with the push's CPU
    seconds in this process and the server process ``server_pid``)."""
    traffic = link.client.traffic
    before = traffic.recv_bytes
    t0 = time.perf_counter()
    d = link.pull()
    into.pulls.append(time.perf_counter() - t0)
    into.pull_bytes = traffic.recv_bytes - before
    assert d is not None
    result = RoundResult(0, delta, 1, 1, 0.0, d.revision, d.round_id)
    del d
    before = traffic.sent_bytes
    cpu0 = cpu_now(server_pid)
    t0 = time.perf_counter()
    outcome = link.push(result, 1.0)
    into.pushes.append(time.perf_counter() - t0)
    into.push_cpu.append(cpu_now(server_pid) - cpu0)
    into.push_bytes = traffic.sent_bytes - before
    assert outcome.accepted, outcome


@dataclass
class Queued:
    """One worker's push, encoded and signed ahead: a ``stage`` message per shard (sharded
    server) and the ``push`` itself, each with the DEALER socket it goes out on."""

    worker: int
    stages: list[tuple[zmq.Socket[bytes], list[wire.Frame]]]
    push: tuple[zmq.Socket[bytes], list[wire.Frame]]

    @property
    def nbytes(self) -> int:
        """Wire bytes of all its messages."""
        return sum(wire.wire_bytes(f) for _, f in [*self.stages, self.push])


def worker_sockets(link: NetLink) -> list[zmq.Socket[bytes]]:
    """Fresh DEALER sockets of the link's worker (its CURVE key) to every shard (shard 0 is
    the server's own address), on a context of their own (closed with the sockets)."""
    addresses = [c.cfg.address for c in link.shards.clients] if link.shards else [link.cfg.address]
    ctx: zmq.Context[Any] = zmq.Context()
    socks = []
    for address in addresses:
        sock = ctx.socket(zmq.DEALER)
        sock.setsockopt(zmq.LINGER, 0)
        if link.cfg.keys is not None:
            connect_securely(sock, link.cfg.keys)
        sock.connect(address)
        socks.append(sock)
    return socks


def prepare(
    link: NetLink, socks: list[zmq.Socket[bytes]], delta: dict[str, torch.Tensor], codec: Codec
) -> Queued:
    """Pull the worker's next dispatch (its one round in flight) and encode and sign the push
    of ``delta`` that answers it, as ``NetLink.push`` would, without sending anything."""
    d = link.pull()
    assert d is not None
    body = link.ident | {
        "round_id": d.round_id,
        "base_revision": d.revision,
        "steps": 1,
        "tokens": 1,
        "mean_loss": 0.0,
        "compute_s": 1.0,
    }
    del d

    def framed(
        type_: str, body: dict[str, Any], tensors: dict[str, torch.Tensor]
    ) -> list[wire.Frame]:
        msg = wire.make(type_, body, tensors, codec, compress.DEFAULT_BLOCK, threads=WORKER_THREADS)
        return wire.encode(msg, link.secret, WORKER_THREADS)

    if link.shards is None:
        return Queued(link.worker, [], (socks[0], framed("push", body, delta)))
    ref = link.ident | {"round_id": body["round_id"]}
    stages = [
        (sock, framed("stage", ref, {k: delta[k] for k in names}))
        for sock, names in zip(socks, link.shards.names, strict=True)
    ]
    return Queued(link.worker, stages, (socks[0], framed("push", body, {})))


def queued_round(
    links: list[NetLink],
    delta: dict[str, torch.Tensor],
    codec: Codec,
    into: Timings,
    server_pid: int | None = None,
) -> None:
    """The server's capacity: every worker's push prepared and signed first, then all sent
    back to back (a sharded server's: each worker's stages, its push once they are staged),
    timed from the first send to the last reply; every push must be applied."""
    socks = [worker_sockets(link) for link in links]
    try:
        queue = [prepare(link, s, delta, codec) for link, s in zip(links, socks, strict=True)]
        secret = links[0].secret
        owner = {id(sock): q for q in queue for sock, _ in [*q.stages, q.push]}
        poller = zmq.Poller()
        for sock in {id(s): s for group in socks for s in group}.values():
            poller.register(sock, zmq.POLLIN)
        left = {q.worker: len(q.stages) for q in queue}
        applied = 0
        cpu0 = cpu_now(server_pid)
        t0 = time.perf_counter()
        for q in queue:
            for sock, frames in q.stages or [q.push]:
                sock.send_multipart(frames, copy=False)
        while applied < len(queue):
            events = poller.poll(600_000)
            if not events:
                raise RuntimeError("no reply from the server within 600 s")
            for sock, _ in events:
                frames = [f.buffer for f in sock.recv_multipart(copy=False)]
                reply = wire.decode(frames, secret)
                q = owner[id(sock)]
                if reply.type == "staged":
                    left[q.worker] -= 1
                    if left[q.worker] == 0:
                        q.push[0].send_multipart(q.push[1], copy=False)
                elif reply.type == "ack" and reply.body["applied"] and not reply.body["duplicate"]:
                    applied += 1
                else:
                    raise RuntimeError(f"worker {q.worker}: {reply.type} {reply.body}")
        into.windows.append(time.perf_counter() - t0)
        into.window_cpu.append(cpu_now(server_pid) - cpu0)
        into.window_bytes = sum(q.nbytes for q in queue)
    finally:
        for group in socks:
            ctx = group[0].context
            for sock in group:
                sock.close(linger=0)
            ctx.term()


# -- unit costs ----------------------------------------------------------------------------
@dataclass(frozen=True)
class UnitCosts:
    """What one push costs per parameter on one core (ns), measured in process at one size:
    ``u`` the outer step as the server applies an fp32 push (async Nesterov over the frames'
    memory), ``q`` what an int8 push's step costs more (its decoding), ``f`` the finiteness
    check of an fp32 push, ``w`` the worker's int8 quantising; ``floor`` the least any outer
    step with fp32 θ and momentum can cost here: both read and written once from memory, timed
    as two copies of N fp32 elements (8 bytes moved per element each)."""

    params_m: int
    u: float
    q: float
    f: float
    w: float
    floor: float = math.nan

    def ratio(self, limit: Limit, end_to_end: bool) -> float:
        """int8/fp32 push MB/s if a push were these costs one after the other, with
        c = ZeroMQ + tag per wire byte (the worker's tag too, end to end; BENCHMARKS.md):
        (4c + f + u) / (4(c + u + q [+ w]))."""
        tag = 1e3 / limit.hmac_mbs
        c = 1e3 / limit.zmq_mbs + tag * (2 if end_to_end else 1)
        extra = self.w if end_to_end else 0.0
        return (4 * c + self.f + self.u) / (4 * (c + self.u + self.q + extra))


def unit_costs(n_params: int, reps: int) -> UnitCosts:
    """Best of ``reps`` of each cost (:class:`UnitCosts`) over ``n_params`` in 8 tensors."""
    params = fake_params(n_params)
    gen = torch.Generator().manual_seed(0)
    delta = {k: torch.randn(v.shape, generator=gen) * 1e-3 for k, v in params.items()}
    opt = build_optimizer("async-nesterov", params, OuterConfig(), 1)

    def received(codec: Codec) -> compress.Decoded:
        """Δ as the server holds a push: decoded from writable frames (copies of the bytes)."""
        out = {}
        for k, v in delta.items():
            e = compress.encode(v, codec)
            out[k] = compress.Encoded(
                e.codec, e.shape, e.block, bytearray(e.data), bytearray(e.scales)
            )
        return compress.Decoded(out)

    fp32, int8 = received("fp32"), received("int8")
    opt.step(params, [Arrival(fp32, 0, 0)])  # seeds the momentum: later steps do all the work

    def best(fn: Any) -> float:
        times = []
        for _ in range(reps):
            t0 = time.perf_counter()
            fn()
            times.append(time.perf_counter() - t0)
        return min(times) / n_params * 1e9

    u = best(lambda: opt.step(params, [Arrival(fp32, 0, 0)]))
    u8 = best(lambda: opt.step(params, [Arrival(int8, 0, 0)]))
    f = best(lambda: [compress.is_finite(e) for e in fp32.encoded.values()])
    w = best(lambda: [compress.quantize_int8(v) for v in delta.values()])
    src, dst = torch.ones(n_params), torch.zeros(n_params)  # both written: no page faults timed
    floor = 2 * best(lambda: dst.copy_(src))
    return UnitCosts(n_params // 1_000_000, u, u8 - u, f, w, floor)


def print_costs(costs: UnitCosts, limits: dict[tuple[int, bool], Limit]) -> None:
    """The unit costs, and the int8/fp32 ratio they imply in each setting of that size."""
    print(
        f"\nunit costs at {costs.params_m}M, one core, ns per parameter: outer step u "
        f"{costs.u:.2f}\n(memory floor {costs.floor:.2f}), int8 decoding q {costs.q:.2f}, "
        f"fp32 finiteness f {costs.f:.2f}, worker's int8\nquantising w {costs.w:.2f}; "
        "c = ZeroMQ + tag per wire byte"
    )
    print(
        "ns per byte: zmq the raw transfer, io its CPU time in both processes, tag one\ncore's HMAC"
    )
    print(
        f"{'curve':>5} | {'zmq':>5} {'io':>5} {'tag':>5} | {'int8/fp32 if serial: queued':>27} "
        f"{'e2e':>5}"
    )
    for (size, curve), lim in limits.items():
        if size == costs.params_m:
            print(
                f"{'on' if curve else 'off':>5} | {1e3 / lim.zmq_mbs:>5.2f} {lim.zmq_cpu_ns:>5.2f} "
                f"{1e3 / lim.hmac_mbs:>5.2f} | {costs.ratio(lim, False):>27.2f} "
                f"{costs.ratio(lim, True):>5.2f}"
            )


# -- real rounds --------------------------------------------------------------------------------
@dataclass(frozen=True)
class RoundRow:
    """Seconds computing vs seconds in pull + push over the rounds of one real training run."""

    preset: str
    params_m: float
    codec: str
    rounds: int
    compute_s: float
    comm_s: float

    @property
    def share(self) -> float:
        """Fraction of the round's wall-clock spent communicating (0-1)."""
        return self.comm_s / (self.comm_s + self.compute_s)


def bench_round(preset: str, codec: str, inner_steps: int, rounds: int) -> RoundRow:
    """Real training rounds over loopback: seconds computing vs seconds in pull + push."""
    cfg = parse_sim_config(
        {
            "method": "async-nesterov",
            "workers": 1,
            "inner_steps": inner_steps,
            "model": preset,
            "token_budget": rounds * inner_steps * 2 * 128,
            "eval_windows": 1,
            "eval_batch_size": 8,
            "data": {"synthetic_chars_per_language": 20_000, "val_chars_per_language": 2000},
            "inner": {"batch_size": 2, "seq_len": 128, "total_steps": 1000},
        }
    )
    secret = auth.new_secret()
    with tempfile.TemporaryDirectory() as tmp:
        session = Session(cfg, secret, EndpointConfig(drain_s=1.0), out_dir=Path(tmp))
        server, address = session.serve_in_thread(timeout_s=60)
        report = NetWorker(
            ClientConfig(address, timeout_s=120, deadline_s=300),
            secret,
            WorkerOptions(worker=0, codec=compress.check_codec(codec)),
        ).run()
        server.join(60)
    n = sum(p.numel() for p in session.side.model.parameters()) / 1e6
    return RoundRow(preset, n, codec, report.rounds, report.compute_s, report.comm_s)


# -- report -------------------------------------------------------------------------------------
def load() -> str:
    """The load averages (as ``uptime`` prints them) and the core count, for the record."""
    one, five, fifteen = os.getloadavg()
    return f"load average {one:.2f}, {five:.2f}, {fifteen:.2f} on {os.cpu_count()} cores"


SETTING_HEADER = f"{'params':>6} {'curve':>5} {'shards':>6} {'codec':>5} |"
ROW_HEADER = (
    f"{SETTING_HEADER} {'pull MB/s':>9} {'xlim':>5} "
    f"| {'push MB':>7} {'push MB/s':>9} {'xlim':>5} | {'upd/s':>5}"
)
QUEUED_HEADER = f"{SETTING_HEADER} {'push MB':>7} {'MB/s':>9} {'xlim':>5} | {'upd/s':>5}"


def setting(r: Row) -> str:
    """The row's setting, in the columns of :data:`SETTING_HEADER`."""
    return f"{r.params_m:>5}M {'on' if r.curve else 'off':>5} {r.shards:>6} {r.codec:>5} |"


def print_rows(rows: list[Row], limits: dict[tuple[int, bool], Limit]) -> None:
    """One line per setting and codec: MB/s and the ratio to the limit of the same setting,
    end to end, then the server's capacity with pushes queued."""
    print(ROW_HEADER)
    for r in rows:
        lim = limits[(r.params_m, r.curve)].mbs
        print(
            f"{setting(r)} {r.pull_mbs:>9.1f} {r.pull_mbs / lim:>5.2f} | {r.push_mb:>7.1f} "
            f"{r.push_mbs:>9.1f} {r.push_mbs / lim:>5.2f} | {r.updates_per_s:>5.2f}"
        )
    print(f"server capacity: {rows[0].workers} workers' pushes signed ahead, sent back to back")
    print(QUEUED_HEADER)
    for r in rows:
        lim = limits[(r.params_m, r.curve)].mbs
        print(
            f"{setting(r)} {r.queued_mb:>7.1f} {r.queued_mbs:>9.1f} {r.queued_mbs / lim:>5.2f} | "
            f"{r.queued_updates_per_s:>5.2f}",
            flush=True,
        )


def ceiling(ratio: float, cores_busy: float) -> float:
    """The most a measured ratio could reach with the same CPU work better overlapped: the
    numerator's setting, which kept ``cores_busy`` cores busy on average, cannot take less
    wall time than its CPU seconds over the machine's cores (the work law T_P >= T_1 / P,
    Cormen et al., "Introduction to Algorithms", 3rd ed., §27.1)."""
    return ratio * (os.cpu_count() or 1) / cores_busy


def print_checks(rows: list[Row], limits: dict[tuple[int, bool], Limit]) -> None:
    """The issue's targets, read off the rows above (one shard unless stated): end to end
    ("e2e", one worker's push) and server capacity ("queued"); after each ratio, in
    parentheses, its :func:`ceiling` on this machine's cores."""
    by = {(r.params_m, r.curve, r.shards, r.codec): r for r in rows}
    print("\ntargets: fp32 pull and push >= 0.5x limit, int8 push >= 0.8x fp32 push (MB/s),")
    print("2 shards >= 1.5x the updates/s of 1 shard (fp32 push); e2e = one worker's push end")
    print("to end, queued = the server's capacity with pushes queued up; (x): the most the")
    print(f"same CPU work could reach on {os.cpu_count()} cores (its CPU seconds / cores)")
    print(
        f"{'params':>6} {'curve':>5} | {'pull':>4} {'push':>4} | {'int8/fp32':>11} "
        f"{'queued':>11} | {'2sh/1sh':>11} {'queued':>11}"
    )

    def cell(num: Row | None, den: Row | None, queued: bool, per_update: bool) -> str:
        if num is None or den is None:
            return f"{'-':>11}"
        if queued:
            a, b = num.queued_mbs, den.queued_mbs
            if per_update:
                a, b = num.queued_updates_per_s, den.queued_updates_per_s
            busy = num.queued_cores
        else:
            a, b = num.push_mbs, den.push_mbs
            if per_update:
                a, b = num.updates_per_s, den.updates_per_s
            busy = num.push_cores
        return f"{a / b:>4.2f} ({ceiling(a / b, busy):>4.2f})"

    for (size, curve), limit in limits.items():
        fp32, int8 = by.get((size, curve, 1, "fp32")), by.get((size, curve, 1, "int8"))
        two = by.get((size, curve, 2, "fp32"))
        if fp32 is None:
            continue
        print(
            f"{size:>5}M {'on' if curve else 'off':>5} | {fp32.pull_mbs / limit.mbs:>4.2f} "
            f"{fp32.push_mbs / limit.mbs:>4.2f} | {cell(int8, fp32, False, False)} "
            f"{cell(int8, fp32, True, False)} | {cell(two, fp32, False, True)} "
            f"{cell(two, fp32, True, True)}"
        )


def print_cpu(rows: list[Row]) -> None:
    """Cores kept busy on average (CPU seconds of both processes / wall seconds) by the best
    push and the best queued window of each setting."""
    print(f"\ncores busy on average ({os.cpu_count()} cores; CPU seconds of both processes / wall)")
    print(f"{SETTING_HEADER} {'push':>5} {'queued':>6}")
    for r in rows:
        print(f"{setting(r)} {r.push_cores:>5.2f} {r.queued_cores:>6.2f}")


MAX_REPS = 10


def reps_at(size: int, largest: int, reps: int) -> int:
    """Repetitions at ``size``: ``reps`` at the largest size, proportionally more at smaller
    ones (a 10M push lasts tens of ms, so one scheduling hiccup spoils it), at most
    :data:`MAX_REPS`."""
    return max(reps, min(MAX_REPS, reps * largest // size))


def main() -> None:
    """Print the limit, the transport's rates and their ratios, and the targets."""
    parser = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    parser.add_argument("--sizes", default="10,100", help="millions of parameters, comma-separated")
    parser.add_argument("--codecs", default="fp32,bf16,int8")
    parser.add_argument("--curve", default="off,on", help="off, on or off,on")
    parser.add_argument("--shards", default="1,2", help="shard counts, comma-separated")
    parser.add_argument(
        "--reps",
        type=positive_int,
        default=3,
        help="repetitions at the largest size (more when smaller)",
    )
    parser.add_argument("--threads", type=positive_int, default=1, help="torch threads per process")
    parser.add_argument(
        "--workers", type=positive_int, default=4, help="worker slots whose pushes queue"
    )
    parser.add_argument("--rounds", action="store_true", help="also time real training rounds")
    parser.add_argument("--round-presets", default="tiny,small")
    parser.add_argument("--inner-steps", type=positive_int, default=20)
    parser.add_argument(
        "--payload",
        action="append",
        help="instead of the loopback: a compressed payload's (or fp32/bf16/int8's) encode and "
        "decode against a round's compute at --payload-size M parameters, H = 100 "
        "(benchmarks/payload_cost.py; repeat the flag)",
    )
    parser.add_argument("--payload-size", type=positive_int, default=100)
    args = parser.parse_args()
    if args.payload:
        from payload_cost import run as payload_cost

        payload_cost(args.payload_size, args.payload, 100, args.reps, args.threads)
        return
    torch.set_num_threads(args.threads)
    codecs = args.codecs.split(",")
    curves = [c == "on" for c in args.curve.split(",")]
    sizes = [int(s) for s in args.sizes.split(",")]
    shard_counts = [int(s) for s in args.shards.split(",")]
    print(f"torch {torch.__version__}, {args.threads} thread(s) per process, loopback 127.0.0.1")
    print(f"start: {load()}\n")
    limits: dict[tuple[int, bool], Limit] = {}
    rows: list[Row] = []
    for size in sizes:
        for curve in curves:
            n = size * 1_000_000
            probe = LimitProbe(n, curve)
            try:
                got = bench(
                    n,
                    curve,
                    shard_counts,
                    codecs,
                    reps_at(size, max(sizes), args.reps),
                    args.threads,
                    args.workers,
                    probe,
                )
                lim = limits[(size, curve)] = probe.limit()
            finally:
                probe.close()
            print(
                f"{size}M parameters, CURVE {'on' if curve else 'off'}: limit {lim.mbs:.1f} MB/s "
                f"(ZeroMQ {lim.zmq_mbs:.1f} MB/s, HMAC-SHA256 {lim.hmac_mbs:.1f} MB/s)"
            )
            print_rows(got, limits)
            print(flush=True)
            rows += got
    print_cpu(rows)
    print_checks(rows, limits)
    print_costs(unit_costs(max(sizes) * 1_000_000, args.reps), limits)
    print(f"\nend: {load()}")
    if args.rounds:
        print(
            f"\nreal rounds (H={args.inner_steps}, batch 2x128, CPU): share of a round spent "
            "communicating"
        )
        print(
            f"{'preset':>6} {'params':>7} {'codec':>5} {'rounds':>6} | {'compute s':>9} "
            f"{'comm s':>7} | {'comm share':>10}"
        )
        for preset in args.round_presets.split(","):
            for codec in ("fp32", "int8"):
                rr = bench_round(preset, codec, args.inner_steps, 3)
                print(
                    f"{rr.preset:>6} {rr.params_m:>6.2f}M {rr.codec:>5} {rr.rounds:>6} | "
                    f"{rr.compute_s:>9.2f} {rr.comm_s:>7.2f} | {100 * rr.share:>9.1f}%",
                    flush=True,
                )


if __name__ == "__main__":
    main()
