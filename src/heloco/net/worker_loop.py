"""A networked worker (an island): hello, then pull → H inner steps → push, until ``done``.

It is the library's own user-loop API driven by the reference inner loop: a
:class:`heloco.outer_loop.OuterLoop` over a :class:`heloco.net.link.NetLink`, stepping the
simulator's :class:`heloco.worker.Worker` (sampler, cosine rate, AdamW). Under ``torchrun`` an
island is data parallel (:mod:`heloco.island`): only rank 0 talks to the server; it broadcasts
each dispatch to the other ranks, and either every inner step's gradients are averaged with
``all_reduce`` (``island_mode="grads"``, plain DDP semantics) or the ranks train independently
and their deltas are averaged (``"deltas"``).
"""

from __future__ import annotations

import json
import math
import threading
import time
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Any

from heloco.config import PACE_RULE, parse_run_config
from heloco.data.seeding import derive_seed
from heloco.island import (
    Island,
    IslandMode,
    average_grads_each_step,
    init_island,
    leave_island,
)
from heloco.net import compress
from heloco.net.client import ClientConfig
from heloco.net.compress import Codec
from heloco.net.link import NetLink, Replaced
from heloco.outer_loop import OuterLoop
from heloco.overlap import EXCHANGES
from heloco.sim import build_worker_parts
from heloco.types import PushOutcome, RoundResult
from heloco.worker import Worker, check_device
from shardmeter.errors import UserInputError
from shardmeter.io import write_atomic

__all__ = ["NetWorker", "Pacer", "Replaced", "WorkerOptions", "WorkerReport"]

ISLAND_KEY = 20  # derive_seed key of the data streams of ranks > 0 inside an island


@dataclass(frozen=True)
class WorkerOptions:
    """How this worker trains and talks.

    ``pace`` emulates a slower machine (:class:`Pacer`): seconds per inner step, as in
    ``heloco simulate --paces``, enforced as a floor (a step that took less sleeps out the
    rest). None trains at full speed.
    """

    worker: int
    codec: Codec = "fp32"
    block: int = compress.DEFAULT_BLOCK
    pace: float | None = None
    device: str = "cpu"
    island_mode: IslandMode = "grads"
    report: Path | None = None
    threads: int | None = None  # None: the run config's; another count changes the losses
    state: Path | None = None  # the worker's state between restarts (heloco.worker_state)
    exchange: str | None = None  # None: the run config's; "blocking" or "overlapped"

    def __post_init__(self) -> None:
        if self.threads is not None and self.threads < 1:
            raise UserInputError("--threads", self.threads, "an integer >= 1")
        if self.worker < 0:
            raise UserInputError("worker", self.worker, "an integer >= 0")
        if self.pace is not None and not 0 < self.pace < math.inf:
            raise UserInputError("pace", self.pace, PACE_RULE)
        if self.block < 1:
            raise UserInputError("block", self.block, "an integer >= 1 (elements per int8 block)")
        compress.check_codec(self.codec)
        check_device(self.device)
        if self.island_mode not in ("grads", "deltas"):
            raise UserInputError("island_mode", self.island_mode, "'grads' or 'deltas'")
        if self.exchange is not None and self.exchange not in (*EXCHANGES, "streaming"):
            raise UserInputError(
                "--exchange", self.exchange, "'blocking', 'overlapped' or 'streaming'"
            )


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
    push_bytes: list[int] = field(default_factory=list)  # each push's bytes on the wire
    recv_bytes: int = 0
    retries: int = 0
    wall_s: float = 0.0
    delta_checksums: list[float] = field(default_factory=list)
    losses: list[float] = field(default_factory=list)
    stopped_mid_round: bool = False


# -- the loop ----------------------------------------------------------------------------------
class Pacer:
    """A worker's step hook that makes every inner step last at least ``pace`` seconds, as a
    slower machine's would. A step is timed from the previous step's end, or from
    :meth:`start_round` for a round's first step. The sleep ends early once ``over`` is set
    (the server said the run is over).
    """

    def __init__(self, pace: float, over: threading.Event | None = None) -> None:
        self.pace = pace
        self.over = over or threading.Event()
        self._start = time.perf_counter()

    def start_round(self) -> None:
        """Start timing the round's first step."""
        self._start = time.perf_counter()

    def __call__(self, step: int) -> None:
        """Sleep out step ``step`` of the round, then start timing the next one."""
        self.over.wait(max(0.0, self.pace - (time.perf_counter() - self._start)))
        self._start = time.perf_counter()


class NetWorker:
    """One worker process (rank ``rank`` of its island)."""

    def __init__(self, client_cfg: ClientConfig, secret: bytes, opts: WorkerOptions) -> None:
        self.opts = opts
        self.rank, self.world = init_island(opts.device)
        self.island = Island(self.rank, self.world, opts.island_mode, opts.device)
        self.link = (
            NetLink(client_cfg, secret, opts.worker, opts.codec, opts.block)
            if self.island.leader
            else None
        )
        self.report = WorkerReport(opts.worker, self.rank, self.world)
        self.worker: Worker | None = None
        self.pacer: Pacer | None = None
        self.exchange = "blocking"
        self.eager = 1.0
        self.fragments, self.alpha = 2, 0.5

    def _setup(self, welcome: dict[str, Any]) -> Worker:
        """Build the worker from the run config the server sent (its data, model and
        schedule; no server)."""
        cfg = parse_run_config(welcome["run"])
        self.exchange, self.eager = cfg.exchange, cfg.overlap_eager
        self.fragments, self.alpha = cfg.fragments, cfg.stream_alpha
        streaming = cfg.exchange == "streaming"
        if self.opts.exchange is not None and (self.opts.exchange == "streaming") != streaming:
            raise UserInputError(
                "--exchange",
                self.opts.exchange,
                "'streaming', as the run's config says (its server takes fragments only)"
                if streaming
                else "'blocking' or 'overlapped', as the run's config has no streaming",
            )
        if self.opts.exchange is not None:
            if self.opts.exchange == "overlapped" and cfg.exchange != "overlapped":
                raise UserInputError(
                    "--exchange",
                    self.opts.exchange,
                    "'blocking', or a run whose config has exchange = 'overlapped' (its "
                    "server accepts a push based on the dispatch before)",
                )
            self.exchange = self.opts.exchange
        if self.opts.threads is not None:
            cfg = cfg.model_copy(update={"threads": self.opts.threads})
        batch_seed = derive_seed(cfg.seed, ISLAND_KEY, self.rank) if self.rank else None
        worker = build_worker_parts(cfg, self.opts.device).worker(self.opts.worker, batch_seed)
        if self.opts.pace is not None:
            self.pacer = Pacer(self.opts.pace, self.link.over if self.link is not None else None)
        if self.world > 1 and self.opts.island_mode == "grads":
            average_grads_each_step(worker.model)
        self.worker = worker
        return worker

    def _over(self) -> bool:
        """The server said the run is over while this round ran: stop now rather than finish
        a round it would refuse. Only a lone process may: island ranks share collectives."""
        return self.world == 1 and self.link is not None and self.link.over.is_set()

    def _on_round(self, result: RoundResult, compute_s: float, _: PushOutcome | None) -> None:
        self.report.compute_s += compute_s
        self.report.rounds += 1
        self.report.losses.append(result.mean_loss)
        self.report.delta_checksums.append(
            float(sum(float(t.double().abs().sum()) for t in result.delta.values()))
        )

    def run(self) -> WorkerReport:
        """Train until the server says ``done``; returns (and optionally writes) the report."""
        wall0 = time.perf_counter()
        try:
            welcome = self.island.broadcast_json(self.link.join() if self.link else None)
            worker = self._setup(welcome)
            outer = OuterLoop(
                worker.model,
                worker.optimizer,
                self.link,
                hook=False,
                island=self.island,
                rounds=worker.boundary,
                welcome=welcome,
                on_round=self._on_round,
                state_file=self.opts.state,
                exchange=self.exchange,
                eager=self.eager,
                fragments=self.fragments,
                alpha=self.alpha,
            )
            tokens = worker.sampler.tokens_per_batch
            worker.model.train()
            with outer:
                while not outer.done:
                    if self._over():
                        self.report.stopped_mid_round = True
                        break
                    i = worker.boundary.steps_done
                    if i == 0 and self.pacer is not None:
                        self.pacer.start_round()
                    loss = worker.inner_step()
                    if self.pacer is not None:
                        self.pacer(i)
                    outer.step(loss, tokens)
            if self.world > 1:
                leave_island()
        finally:
            self._finish(wall0)
        return self.report

    def _finish(self, wall0: float) -> None:
        if self.link is not None:
            self.link.close()
            self.report.acked = self.link.acked
            self.report.rejected = self.link.rejected
            self.report.duplicates = self.link.duplicates
            self.report.push_bytes = self.link.push_bytes
            t = self.link.client.traffic
            self.report.comm_s = t.seconds
            self.report.sent_bytes, self.report.recv_bytes, self.report.retries = (
                t.sent_bytes,
                t.recv_bytes,
                t.retries,
            )
        self.report.wall_s = time.perf_counter() - wall0
        if self.opts.report is not None:
            path = self.opts.report
            if self.world > 1:
                path = path.with_name(f"{path.stem}-rank{self.rank}{path.suffix}")
            write_atomic(path, json.dumps(asdict(self.report), indent=1, allow_nan=True))
