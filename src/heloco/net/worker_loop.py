"""A networked worker (an island): hello, then pull → H inner steps → push, until ``done``.

The inner loop is the simulator's own :class:`heloco.worker.Worker`. Pushes are retried by the
client until the server answers (it may be restarting); the server's revision log makes a
retried push count once. Under ``torchrun`` an island is data parallel: only rank 0 talks to
the server; it broadcasts each dispatch to the other ranks, and either every inner step's
gradients are averaged with ``all_reduce`` (``island_mode="grads"``, plain DDP semantics) or the
ranks train independently and their deltas are averaged (``"deltas"``).
"""

from __future__ import annotations

import json
import os
import threading
import time
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Any, Literal

import torch
import torch.distributed as dist

from heloco.data.seeding import derive_seed
from heloco.net import compress
from heloco.net.client import Client, ClientConfig, ServerUnreachable
from heloco.net.compress import Codec
from heloco.net.wire import Message
from heloco.sim import build_run, parse_sim_config
from heloco.types import Params, RoundResult
from heloco.worker import Worker, check_device
from shardmeter.errors import UserInputError

IslandMode = Literal["grads", "deltas"]
ISLAND_KEY = 20  # derive_seed key of the data streams of ranks > 0 inside an island
_DISPATCH, _DONE = 0, 1


class Replaced(RuntimeError):
    """The server handed this worker's slot to a newer process."""


@dataclass(frozen=True)
class WorkerOptions:
    """How this worker trains and talks.

    Pacing emulates a slower machine (:class:`Pacer`): each inner step of ``t`` seconds is
    followed by a sleep of ``t·(pace − 1)``, or, with ``seconds_per_step``, lasts that long.
    """

    worker: int
    codec: Codec = "fp32"
    block: int = compress.DEFAULT_BLOCK
    pace: float = 1.0
    seconds_per_step: float | None = None
    device: str = "cpu"
    island_mode: IslandMode = "grads"
    report: Path | None = None

    def __post_init__(self) -> None:
        if self.worker < 0:
            raise UserInputError("worker", self.worker, "an integer >= 0")
        if not self.pace >= 1.0:
            raise UserInputError("pace", self.pace, "a slowdown factor >= 1")
        if self.seconds_per_step is not None and not self.seconds_per_step > 0:
            raise UserInputError("seconds_per_step", self.seconds_per_step, "a number > 0")
        if self.block < 1:
            raise UserInputError("block", self.block, "an integer >= 1 (elements per int8 block)")
        compress.check_codec(self.codec)
        check_device(self.device)
        if self.island_mode not in ("grads", "deltas"):
            raise UserInputError("island_mode", self.island_mode, "'grads' or 'deltas'")


@dataclass
class WorkerReport:
    """What one worker process did (written as JSON with ``--report``)."""

    worker: int
    rank: int = 0
    world: int = 1
    rounds: int = 0
    acked: list[list[int]] = field(default_factory=list)  # [round_id, revision after]
    rejected: dict[str, int] = field(default_factory=dict)
    duplicates: int = 0
    compute_s: float = 0.0
    comm_s: float = 0.0
    sent_bytes: int = 0
    recv_bytes: int = 0
    retries: int = 0
    wall_s: float = 0.0
    delta_checksums: list[float] = field(default_factory=list)
    losses: list[float] = field(default_factory=list)


class Heartbeat:
    """A background thread with its own socket that tells the server this worker is alive."""

    def __init__(
        self, cfg: ClientConfig, secret: bytes, body: dict[str, Any], period_s: float
    ) -> None:
        short = ClientConfig(
            cfg.address, timeout_s=period_s, deadline_s=period_s, max_bytes=cfg.max_bytes
        )
        self.client = Client(short, secret)
        self.body = body
        self.period_s = period_s
        self.stop = threading.Event()
        self.thread = threading.Thread(target=self._run, name="heloco-heartbeat", daemon=True)

    def _run(self) -> None:
        while not self.stop.wait(self.period_s):
            try:
                self.client.request("heartbeat", self.body)
            except ServerUnreachable:
                continue
        self.client.close()

    def __enter__(self) -> Heartbeat:
        self.thread.start()
        return self

    def __exit__(self, *exc: object) -> None:
        self.stop.set()
        self.thread.join(timeout=self.period_s + 1)


# -- island (torch.distributed) helpers --------------------------------------------------------
def _world() -> tuple[int, int]:
    if dist.is_available() and dist.is_initialized():
        return dist.get_rank(), dist.get_world_size()
    return 0, 1


def init_island(device: str) -> tuple[int, int]:
    """Join the island's process group when run under torchrun (gloo on CPU, NCCL on GPU)."""
    if int(os.environ.get("WORLD_SIZE", "1")) > 1 and not dist.is_initialized():
        dist.init_process_group("nccl" if device.startswith("cuda") else "gloo")
    return _world()


def _broadcast_json(payload: dict[str, Any] | None, device: str) -> dict[str, Any]:
    """Rank 0's JSON object on every rank (length, then UTF-8 bytes; no pickle)."""
    rank, _ = _world()
    raw = json.dumps(payload).encode() if rank == 0 else b""
    size = torch.tensor([len(raw)], dtype=torch.int64, device=device)
    dist.broadcast(size, 0)
    buf = torch.zeros(int(size.item()), dtype=torch.uint8, device=device)
    if rank == 0:
        buf.copy_(torch.frombuffer(bytearray(raw), dtype=torch.uint8))
    dist.broadcast(buf, 0)
    return dict(json.loads(bytes(buf.cpu().tolist())))


def _broadcast_params(params: Params | None, like: Params, device: str) -> Params:
    """Rank 0's parameters on every rank, as one flat fp32 broadcast."""
    rank, _ = _world()
    names = list(like)
    flat = (
        torch.cat([params[n].reshape(-1).to(device, torch.float32) for n in names])
        if rank == 0 and params is not None
        else torch.empty(sum(like[n].numel() for n in names), dtype=torch.float32, device=device)
    )
    dist.broadcast(flat, 0)
    out: Params = {}
    offset = 0
    for n in names:
        numel = like[n].numel()
        out[n] = flat[offset : offset + numel].view_as(like[n]).cpu()
        offset += numel
    return out


def average_grads_each_step(worker: Worker) -> None:
    """DDP semantics inside the island: all_reduce-average every gradient as it is accumulated."""
    _, world = _world()

    def hook(p: torch.Tensor) -> None:
        assert p.grad is not None
        dist.all_reduce(p.grad)
        p.grad.div_(world)

    for p in worker.model.parameters():
        if p.requires_grad:
            p.register_post_accumulate_grad_hook(hook)


def _average_result(result: RoundResult, mode: IslandMode, device: str) -> RoundResult:
    """Island totals: tokens × world, mean loss averaged, deltas averaged in ``deltas`` mode.

    Collectives run on ``device`` (NCCL needs GPU tensors); the result stays fp32 on the CPU.
    """
    _, world = _world()
    if world == 1:
        return result
    loss = torch.tensor([result.mean_loss], dtype=torch.float64, device=device)
    dist.all_reduce(loss)
    delta = result.delta
    if mode == "deltas":
        summed = {}
        for name, t in delta.items():
            buf = t.to(device)
            dist.all_reduce(buf)
            summed[name] = buf.div_(world).cpu()
        delta = summed
    return RoundResult(
        result.worker,
        delta,
        result.steps,
        result.tokens * world,
        float(loss.item()) / world,
        result.base_revision,
        result.round_id,
    )


# -- the loop ----------------------------------------------------------------------------------
class Pacer:
    """A worker's ``on_step`` hook that makes every inner step last as long as a slower
    machine's: after a step of ``t`` seconds it sleeps ``t·(pace − 1)``, or until the step
    took ``seconds_per_step``. A step is timed from the previous step's end, or from
    :meth:`start_round` for a round's first step.
    """

    def __init__(self, pace: float, seconds_per_step: float | None) -> None:
        self.pace = pace
        self.seconds_per_step = seconds_per_step
        self._start = time.perf_counter()

    def start_round(self) -> None:
        """Start timing the round's first step."""
        self._start = time.perf_counter()

    def __call__(self, step: int) -> None:
        """Sleep out step ``step`` of the round, then start timing the next one."""
        took = time.perf_counter() - self._start
        target = self.seconds_per_step if self.seconds_per_step is not None else took * self.pace
        time.sleep(max(0.0, target - took))
        self._start = time.perf_counter()


class NetWorker:
    """One worker process (rank ``rank`` of its island)."""

    def __init__(self, client_cfg: ClientConfig, secret: bytes, opts: WorkerOptions) -> None:
        self.client_cfg = client_cfg
        self.opts = opts
        self.rank, self.world = init_island(opts.device)
        self.client = Client(client_cfg, secret) if self.rank == 0 else None
        self.secret = secret
        # Ordered by process start, so the server can tell a replacement from a stale process.
        self.incarnation = f"{time.time_ns():020d}-{os.urandom(4).hex()}"
        self.report = WorkerReport(opts.worker, self.rank, self.world)
        self.worker: Worker | None = None
        self.heartbeat: Heartbeat | None = None
        self.pacer: Pacer | None = None

    @property
    def ident(self) -> dict[str, Any]:
        """The worker slot and incarnation every request carries."""
        return {"worker": self.opts.worker, "incarnation": self.incarnation}

    def _call(
        self, type_: str, body: dict[str, Any] | None = None, result: RoundResult | None = None
    ) -> Message:
        assert self.client is not None
        params = result.delta if result is not None else None
        return self.client.request(
            type_, self.ident | (body or {}), params, self.opts.codec, self.opts.block
        )

    def _hello(self) -> dict[str, Any]:
        """Rank 0 says hello (and starts heartbeats at once); every rank gets the welcome."""
        welcome: dict[str, Any] | None = None
        if self.client is not None:
            reply = self._call("hello")
            if reply.type != "welcome":
                raise UserInputError("worker", self.opts.worker, f"server refused: {reply.body}")
            welcome = reply.body
            period = float(welcome.get("heartbeat_s", 2.0))
            self.heartbeat = Heartbeat(self.client_cfg, self.secret, self.ident, period)
            self.heartbeat.__enter__()
        if self.world > 1:
            welcome = _broadcast_json(welcome, self.opts.device)
        assert welcome is not None
        return welcome

    def _setup(self, welcome: dict[str, Any]) -> None:
        """Build the worker from the run config the server sent."""
        cfg = parse_sim_config(welcome["run"])
        batch_seed = derive_seed(cfg.seed, ISLAND_KEY, self.rank) if self.rank else None
        self.worker = build_run(cfg, self.opts.device).worker(self.opts.worker, batch_seed)
        # A (re)joining worker continues its slot's learning-rate schedule.
        self.worker.step = int(welcome.get("worker_steps", 0))
        # Pay torch.optim's one-off lazy imports now rather than inside the first round.
        self.worker.new_optimizer()
        if self.opts.pace != 1.0 or self.opts.seconds_per_step is not None:
            self.pacer = Pacer(self.opts.pace, self.opts.seconds_per_step)
            self.worker.on_step = self.pacer
        if self.world > 1 and self.opts.island_mode == "grads":
            average_grads_each_step(self.worker)

    def _next(self) -> tuple[int, Params | None, int, int, int]:
        """Rank 0 pulls (waiting while the server says so); the island learns the outcome."""
        head = torch.zeros(4, dtype=torch.int64)
        params: Params | None = None
        if self.client is not None:
            while True:
                reply = self._call("pull")
                if reply.type == "wait":
                    time.sleep(float(reply.body.get("retry_s", 0.05)))
                    continue
                if reply.type == "dispatch":
                    params = reply.params(self.opts.device)
                    b = reply.body
                    head = torch.tensor([_DISPATCH, b["revision"], b["steps"], b["round_id"]])
                elif reply.type == "done":
                    head[0] = _DONE
                elif reply.body.get("reason") == "replaced":
                    raise Replaced(f"worker {self.opts.worker}: {reply.body.get('detail')}")
                else:
                    raise RuntimeError(f"unexpected reply to pull: {reply.type} {reply.body}")
                break
        if self.world > 1:
            head = head.to(self.opts.device)
            dist.broadcast(head, 0)
            if head[0] == _DISPATCH:
                assert self.worker is not None
                like = dict(self.worker.model.named_parameters())
                params = _broadcast_params(
                    params, {k: v.detach() for k, v in like.items()}, self.opts.device
                )
        kind, rev, steps, rid = (int(x) for x in head.tolist())
        return kind, params, rev, steps, rid

    def _push(self, result: RoundResult, compute_s: float) -> None:
        body = {
            "round_id": result.round_id,
            "base_revision": result.base_revision,
            "steps": result.steps,
            "tokens": result.tokens,
            "mean_loss": result.mean_loss if result.mean_loss == result.mean_loss else None,
            "compute_s": compute_s,
        }
        reply = self._call("push", body, result)
        if reply.type == "ack":
            self.report.acked.append([int(result.round_id or 0), int(reply.body["revision"])])
            self.report.duplicates += int(bool(reply.body.get("duplicate")))
        else:
            reason = str(reply.body.get("reason", reply.type))
            self.report.rejected[reason] = self.report.rejected.get(reason, 0) + 1

    def run(self) -> WorkerReport:
        """Train until the server says ``done``; returns (and optionally writes) the report."""
        wall0 = time.perf_counter()
        try:
            self._setup(self._hello())
            assert self.worker is not None
            while True:
                kind, params, rev, steps, rid = self._next()
                if kind == _DONE:
                    break
                assert params is not None
                t0 = time.perf_counter()
                if self.pacer is not None:
                    self.pacer.start_round()
                result = self.worker.run_round(params, steps, rev, rid)
                result = _average_result(result, self.opts.island_mode, self.opts.device)
                compute_total = time.perf_counter() - t0
                self.report.compute_s += compute_total
                self.report.rounds += 1
                self.report.losses.append(result.mean_loss)
                self.report.delta_checksums.append(
                    float(sum(float(t.double().abs().sum()) for t in result.delta.values()))
                )
                if self.client is not None:
                    self._push(result, compute_total)
            if self.client is not None:
                self._call("bye")
        finally:
            if self.heartbeat is not None:
                self.heartbeat.__exit__()
            self._finish(wall0)
        return self.report

    def _finish(self, wall0: float) -> None:
        if self.client is not None:
            t = self.client.traffic
            self.report.comm_s = t.seconds
            self.report.sent_bytes, self.report.recv_bytes, self.report.retries = (
                t.sent_bytes,
                t.recv_bytes,
                t.retries,
            )
            self.client.close()
        self.report.wall_s = time.perf_counter() - wall0
        if self.opts.report is not None:
            path = self.opts.report
            if self.world > 1:
                path = path.with_name(f"{path.stem}-rank{self.rank}{path.suffix}")
            path.parent.mkdir(parents=True, exist_ok=True)
            tmp = path.with_name(f".{path.name}.tmp")
            tmp.write_text(json.dumps(asdict(self.report), indent=1, allow_nan=True))
            os.replace(tmp, path)
