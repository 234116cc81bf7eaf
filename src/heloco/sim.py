"""Simulated clock: workers with paces, rounds processed in order of simulated finish time.

A worker dispatched at time t with H_w steps finishes at t + H_w·pace_w·jitter + comm_w
(spec 3, "Speed heterogeneity"); arrivals are applied in finish-time order, ties broken by
worker id. Sync methods wait for the slowest worker every round. Training is real (the
workers run their inner loops in process); only the clock is simulated, so the same config and
seed give bit-identical losses. The server and the outer optimizers are the product's own.
"""

from __future__ import annotations

import heapq
import math
import random
import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field, replace
from pathlib import Path
from typing import Any, Literal, Protocol

import numpy as np
import torch
from pydantic import BaseModel, ConfigDict, Field, ValidationError, model_validator

from heloco.data import DataConfig, ValLoss, WorkerData, build_data, derive_seed
from heloco.metrics import (
    EvalPoint,
    MetricsWriter,
    RunStats,
    RunSummary,
    atomic_write_json,
    cycle_average,
    eval_event,
    loss_at,
    round_event,
    update_event,
)
from heloco.model import ModelConfig, TinyGPT, preset_config
from heloco.outer import OuterConfig, build_optimizer, resolve_method
from heloco.outer.base import RhoMode
from heloco.server import Dispatch, Server, ServerConfig, UpdateRecord, dylu_steps
from heloco.types import Params, RoundResult
from heloco.worker import InnerConfig, Worker, check_device
from shardmeter.errors import UserInputError, from_pydantic

PACE_KEY = 10  # derive_seed keys of the simulator's own random streams
JITTER_KEY = 11
MODEL_KEY = 12
CONFIG_FILE = "config.json"


class PaceDistribution(BaseModel):
    """Worker paces (seconds per inner step) drawn once per run: median·exp(σ·z)."""

    model_config = ConfigDict(extra="forbid", frozen=True)

    kind: Literal["lognormal"] = "lognormal"
    median: float = Field(1.0, gt=0, allow_inf_nan=False)
    sigma: float = Field(0.5, ge=0, allow_inf_nan=False)


class SimConfig(BaseModel):
    """One simulated run. ``outer_lr``/``outer_momentum``/``rho`` override ``outer``'s."""

    model_config = ConfigDict(extra="forbid", frozen=True)

    method: str = "heloco"
    workers: int = Field(5, ge=1, le=1024)
    paces: list[float] | PaceDistribution | None = Field(
        None, description="seconds per inner step per worker (None: all 1.0)"
    )
    pace_jitter: float = Field(0.0, ge=0, description="σ of a mean-1 lognormal per-round factor")
    comm_delays: list[float] | None = Field(None, description="seconds added to each round")
    inner_steps: int = Field(20, ge=1, description="H")
    outer_lr: float | None = Field(None, gt=0, description="None: Table 3 default of the method")
    outer_momentum: float = Field(0.9, ge=0, lt=1)
    rho: RhoMode | float | None = Field(None, description="None: the method's default")
    outer: OuterConfig = OuterConfig()
    dylu: bool | None = Field(None, description="None: the method's default (dn-dylu: on)")
    grace_window: float = Field(0.0, ge=0, description="seconds; 0 = fully asynchronous")
    data: DataConfig = DataConfig()
    model: str | ModelConfig = "tiny"
    inner: InnerConfig = InnerConfig()
    inner_schedule: Literal["budget", "config"] = Field(
        "config",
        description="cosine length per worker: its expected steps under the budget, or "
        "inner.total_steps",
    )
    token_budget: int | None = Field(None, ge=1)
    time_budget: float | None = Field(None, gt=0)
    eval_every: int = Field(0, ge=0, description="eval_unit between evaluations (0: start, end)")
    eval_unit: Literal["tokens", "steps"] = Field("tokens", description="unit of eval_every")
    eval_batch_size: int = Field(64, ge=1)
    eval_windows: int | None = Field(64, ge=1, description="windows per language (None: all)")
    seed: int = Field(42, ge=0)
    out_dir: Path | None = None
    device: str = "cpu"

    @model_validator(mode="after")
    def _check(self) -> SimConfig:
        resolve_method(self.method)
        if self.token_budget is None and self.time_budget is None:
            raise UserInputError("token_budget", None, "set token_budget and/or time_budget")
        for name in ("paces", "comm_delays"):
            values = getattr(self, name)
            if isinstance(values, list):
                if len(values) != self.workers:
                    need = f"{self.workers} values, one per worker (workers = {self.workers})"
                    raise UserInputError(name, values, need)
                if any(not math.isfinite(v) or v < 0 for v in values):
                    raise UserInputError(name, values, "finite values >= 0")
        if isinstance(self.paces, list) and any(p <= 0 for p in self.paces):
            raise UserInputError("paces", self.paces, "seconds per step > 0")
        return self

    def outer_config(self) -> OuterConfig:
        """The outer settings with the top-level overrides applied."""
        return self.outer.model_copy(
            update={"lr": self.outer_lr, "momentum": self.outer_momentum, "rho": self.rho}
        )

    def use_dylu(self) -> bool:
        """Whether DyLU inner steps apply: the explicit ``dylu`` field, else the method's default."""
        return self.dylu if self.dylu is not None else resolve_method(self.method).spec.dylu


def parse_sim_config(values: dict[str, Any]) -> SimConfig:
    """Validate user values; bad input raises a one-line UserInputError."""
    try:
        return SimConfig.model_validate(values)
    except ValidationError as exc:
        raise from_pydantic(exc, "sim") from None


class RoundRunner(Protocol):
    """What the clock needs from a worker (``heloco.worker.Worker`` satisfies it)."""

    def run_round(
        self, start: Params, steps: int, base_revision: int, round_id: int | None = None
    ) -> RoundResult: ...


Evaluator = Callable[[Params], ValLoss]


@dataclass(frozen=True)
class Clock:
    """Simulated-time settings of a run (seconds)."""

    paces: list[float]
    comm_delays: list[float]
    jitter: float
    seed: int
    token_budget: int | None
    time_budget: float | None
    eval_every: int
    eval_unit: Literal["tokens", "steps"] = "tokens"


@dataclass
class Trajectory:
    """What the clock loop produced (evals in order, totals at the stop)."""

    evals: list[EvalPoint] = field(default_factory=list)
    tokens: int = 0
    steps: int = 0
    time: float = 0.0
    eval_seconds: float = 0.0
    loop_seconds: float = 0.0
    stopped_by: Literal["", "tokens", "time"] = ""


@dataclass(frozen=True)
class RunResult:
    """Result of :func:`run_simulation`: eval curve, summary, final server parameters."""

    config: SimConfig
    evals: list[EvalPoint]
    summary: RunSummary
    params: Params
    paces: list[float]

    @property
    def losses(self) -> list[float]:
        """Validation losses (nats/token) of the evaluations, in order."""
        return [e.loss for e in self.evals]


def resolve_paces(cfg: SimConfig) -> list[float]:
    """Per-worker seconds per step: given, drawn (lognormal, seeded), or all 1."""
    if cfg.paces is None:
        return [1.0] * cfg.workers
    if isinstance(cfg.paces, list):
        return [float(p) for p in cfg.paces]
    rng = np.random.default_rng(derive_seed(cfg.seed, PACE_KEY))
    z = rng.standard_normal(cfg.workers)
    return [float(cfg.paces.median * math.exp(cfg.paces.sigma * zi)) for zi in z]


def seed_everything(seed: int) -> None:
    """Seed python, numpy and torch global RNGs (per-worker generators are seeded apart)."""
    random.seed(seed)
    np.random.seed(seed % (1 << 32))
    torch.manual_seed(seed)


class Recorder:
    """A run's trajectory bookkeeping, shared by the simulated clock and the network session.

    Accepted rounds and applied updates go to the event log and the run statistics;
    evaluations happen every ``eval_every`` ``eval_unit`` (tokens or inner steps), each with
    the loss averaged over the last ``cycle`` seconds (the slowest worker's round).
    """

    def __init__(
        self,
        server: Server,
        evaluate: Evaluator,
        writer: MetricsWriter,
        stats: RunStats,
        cycle: float,
        eval_every: int,
        eval_unit: Literal["tokens", "steps"],
        progress: Callable[[EvalPoint], None] | None = None,
    ) -> None:
        self.server, self.evaluate, self.writer, self.stats = server, evaluate, writer, stats
        self.cycle, self.eval_every, self.eval_unit = cycle, eval_every, eval_unit
        self.progress = progress
        self.traj = Trajectory()
        self.next_eval = eval_every

    def record_round(
        self,
        worker: int,
        round_id: int,
        steps: int,
        tokens: int,
        loss: float,
        start: float,
        end: float,
    ) -> None:
        """Count an accepted round and log it (``start``/``end`` in run seconds)."""
        self.traj.tokens += tokens
        self.traj.steps += steps
        self.writer.event(round_event(worker, round_id, steps, tokens, loss, start, end))

    def record_update(self, record: UpdateRecord, now: float, tokens: int) -> None:
        """Count an applied update and log it with the time and tokens it happened at."""
        self.stats.add(record)
        self.writer.event(update_event(record, now, tokens))

    def eval_now(self, now: float) -> EvalPoint:
        """Evaluate the server's current parameters at run time ``now`` (seconds)."""
        t0 = time.perf_counter()
        val = self.evaluate(self.server.params)
        self.traj.eval_seconds += time.perf_counter() - t0
        point = EvalPoint(
            tokens=self.traj.tokens,
            steps=self.traj.steps,
            time=now,
            revision=self.server.revision,
            loss=val.overall,
            per_language=dict(val.per_language),
            cycle_loss=cycle_average(self.traj.evals, now, self.cycle, val.overall),
        )
        self.traj.evals.append(point)
        self.writer.event(eval_event(point, self.stats))
        if self.progress is not None:
            self.progress(point)
        return point

    def maybe_eval(self, now: float) -> None:
        """Evaluate once if the tokens (or steps) done have passed the next eval point."""
        every = self.eval_every
        done = self.traj.tokens if self.eval_unit == "tokens" else self.traj.steps
        if every <= 0 or done < self.next_eval:
            return
        while self.next_eval <= done:
            self.next_eval += every
        self.eval_now(now)

    def finish(self, now: float) -> bool:
        """Evaluate the final model unless the last eval saw it; returns whether it did."""
        last = self.traj.evals[-1] if self.traj.evals else None
        if last is not None and (last.revision, last.tokens) == (
            self.server.revision,
            self.traj.tokens,
        ):
            return False
        self.eval_now(now)
        return True


class _Sim:
    """The event loop shared by async and sync methods."""

    def __init__(
        self,
        server: Server,
        workers: Sequence[RoundRunner],
        clock: Clock,
        recorder: Recorder,
    ) -> None:
        self.server, self.workers, self.clock, self.rec = server, workers, clock, recorder
        self.traj = recorder.traj
        self.jitter_rngs = [
            np.random.default_rng(derive_seed(clock.seed, JITTER_KEY, w))
            for w in range(len(workers))
        ]

    # -- helpers ----------------------------------------------------------------------------
    def compute_seconds(self, worker: int, steps: int) -> float:
        """Simulated compute time of a round in seconds: steps · pace · e^(σz − σ²/2), z ~ N(0, 1).

        The factor has mean 1 because a lognormal's mean is E[e^(σz)] = e^(σ²/2).
        """
        sigma = self.clock.jitter
        factor = 1.0
        if sigma > 0:
            z = float(self.jitter_rngs[worker].standard_normal())
            factor = math.exp(sigma * z - 0.5 * sigma * sigma)
        return steps * self.clock.paces[worker] * factor

    def budget_reached(self) -> bool:
        tb = self.clock.token_budget
        return tb is not None and self.traj.tokens >= tb

    def record_round(self, result: RoundResult, start: float, end: float) -> None:
        rid = -1 if result.round_id is None else result.round_id
        self.rec.record_round(
            result.worker, rid, result.steps, result.tokens, result.mean_loss, start, end
        )

    def record_update(self, record: UpdateRecord) -> None:
        self.rec.record_update(record, self.traj.time, self.traj.tokens)

    def eval_now(self) -> None:
        self.rec.eval_now(self.traj.time)

    def maybe_eval(self) -> None:
        self.rec.maybe_eval(self.traj.time)

    def finish(self) -> Trajectory:
        self.rec.finish(self.traj.time)
        return self.traj

    # -- async ------------------------------------------------------------------------------
    def run_async(self) -> Trajectory:
        heap: list[tuple[float, int]] = []
        inflight: dict[int, tuple[Dispatch, float, float]] = {}
        grace = self.server.cfg.grace_window
        tbud = self.clock.time_budget

        def start(w: int, t: float) -> None:
            d = self.server.dispatch(w)
            compute = self.compute_seconds(w, d.steps)
            inflight[w] = (d, t, compute)
            heapq.heappush(heap, (t + compute + self.clock.comm_delays[w], w))

        for w in range(len(self.workers)):
            start(w, 0.0)
        self.eval_now()
        window_end: float | None = None
        waiting: list[int] = []
        while True:
            if window_end is not None and (not heap or heap[0][0] > window_end):
                if tbud is not None and window_end > tbud:
                    self.traj.stopped_by = "time"
                    break
                self.traj.time = window_end
                for rec in self.server.flush():
                    self.record_update(rec)
                for w in waiting:
                    start(w, window_end)
                window_end, waiting = None, []
                self.maybe_eval()
                continue
            if not heap or (tbud is not None and heap[0][0] > tbud):
                self.traj.stopped_by = "time"
                break
            t, w = heapq.heappop(heap)
            self.traj.time = t
            d, t0, compute = inflight.pop(w)
            result = self.workers[w].run_round(d.params, d.steps, d.revision, d.round_id)
            if d.steps > 0 and compute > 0:
                self.server.observe_speed(w, d.steps / compute)
            self.record_round(result, t0, t)
            applied = self.server.submit(result)
            if applied is not None:
                self.record_update(applied)
                start(w, t)
            else:
                window_end = t + grace if window_end is None else window_end
                waiting.append(w)
            self.maybe_eval()
            if self.budget_reached():
                for rec in self.server.flush():
                    self.record_update(rec)
                self.traj.stopped_by = "tokens"
                break
        return self.finish()

    # -- sync -------------------------------------------------------------------------------
    def run_sync(self) -> Trajectory:
        k = len(self.workers)
        tbud = self.clock.time_budget
        self.eval_now()
        while not self.budget_reached():
            now = self.traj.time
            dispatches = [self.server.dispatch(w) for w in range(k)]
            computes = [self.compute_seconds(w, d.steps) for w, d in enumerate(dispatches)]
            ends = [now + c + self.clock.comm_delays[w] for w, c in enumerate(computes)]
            round_end = max(ends)
            if tbud is not None and round_end > tbud:
                self.traj.stopped_by = "time"
                break
            record = None
            for w in sorted(range(k), key=lambda i: (ends[i], i)):
                d = dispatches[w]
                result = self.workers[w].run_round(d.params, d.steps, d.revision, d.round_id)
                if d.steps > 0 and computes[w] > 0:
                    self.server.observe_speed(w, d.steps / computes[w])
                self.record_round(result, now, ends[w])
                record = self.server.submit(result) or record
            self.traj.time = round_end
            if record is None:
                raise RuntimeError("sync round ended without an update")
            self.record_update(record)
            self.maybe_eval()
        if self.budget_reached():
            self.traj.stopped_by = "tokens"
        return self.finish()


def simulate(
    server: Server,
    workers: Sequence[RoundRunner],
    clock: Clock,
    evaluate: Evaluator,
    writer: MetricsWriter | None = None,
    stats: RunStats | None = None,
    progress: Callable[[EvalPoint], None] | None = None,
) -> Trajectory:
    """Drive ``server`` and ``workers`` on the simulated clock until a budget is reached.

    The server is told each worker's configured speed (1/pace) before the first dispatch, so
    DyLU applies from the first round; afterwards it sees the measured (jittered) speed.
    """
    k = len(workers)
    if len(clock.paces) != k or len(clock.comm_delays) != k:
        raise ValueError("clock needs one pace and one comm delay per worker")
    for w, pace in enumerate(clock.paces):
        server.observe_speed(w, 1.0 / pace)
    t0 = time.perf_counter()
    steps = [server.steps_for(w) for w in range(k)]
    recorder = Recorder(
        server,
        evaluate,
        writer or MetricsWriter(None),
        stats or RunStats(k),
        max(round_seconds(steps, clock.paces, clock.comm_delays)),
        clock.eval_every,
        clock.eval_unit,
        progress,
    )
    sim = _Sim(server, workers, clock, recorder)
    traj = sim.run_sync() if server.cfg.synchronous else sim.run_async()
    traj.loop_seconds = time.perf_counter() - t0
    return traj


def model_config_for(cfg: SimConfig, vocab_size: int) -> ModelConfig:
    """The model shape: a preset sized to the data's vocabulary and window, or as given."""
    seq = max(cfg.inner.seq_len, cfg.data.seq_len)
    if isinstance(cfg.model, str):
        return preset_config(cfg.model, vocab_size=vocab_size, seq_len=seq)
    if cfg.model.vocab_size < vocab_size:
        raise UserInputError("model.vocab_size", cfg.model.vocab_size, f">= {vocab_size}")
    if cfg.model.seq_len < seq:
        raise UserInputError("model.seq_len", cfg.model.seq_len, f">= {seq}")
    return cfg.model


def resolve_comm(cfg: SimConfig) -> list[float]:
    """Per-worker communication seconds added to each round (None: all 0)."""
    if cfg.comm_delays is None:
        return [0.0] * cfg.workers
    return [float(c) for c in cfg.comm_delays]


def round_seconds(
    steps: Sequence[int], paces: Sequence[float], comm: Sequence[float]
) -> list[float]:
    """Seconds of one round of each worker: H_w·pace_w + comm_w (spec 3, speed heterogeneity)."""
    return [steps[w] * paces[w] + comm[w] for w in range(len(steps))]


def initial_model(
    cfg: SimConfig, data: WorkerData, device: torch.device | str | None = None
) -> TinyGPT:
    """The run's initial model, seeded by the run seed (identical in every process)."""
    target = cfg.device if device is None else device
    if isinstance(target, str):
        check_device(target)
    model = TinyGPT(model_config_for(cfg, data.vocab_size), seed=derive_seed(cfg.seed, MODEL_KEY))
    return model.to(torch.device(target))


@dataclass(eq=False)
class RunParts:
    """Everything a run of ``cfg`` is built from, identical in the simulator, the network
    server and every network worker (same seeds, data split, initial model, optimizer)."""

    cfg: SimConfig
    data: WorkerData
    model: TinyGPT  # initial model; the simulator's workers and evaluator share it
    paces: list[float]  # configured seconds per inner step
    comm: list[float]  # configured seconds added to each round
    steps: list[int]  # steps per round from the configured paces (H or DyLU's H_w)
    inner: list[InnerConfig]  # each worker's inner config (its cosine length)
    server: Server

    def worker(self, w: int, batch_seed: int | None = None) -> Worker:
        """Worker ``w`` on :attr:`model`; ``batch_seed`` replaces the run seed for its batch
        order only (island ranks > 0 draw other batches from the same stream)."""
        seed = self.cfg.seed if batch_seed is None else batch_seed
        return Worker(w, self.model, self.data.streams[w], self.inner[w], seed)

    @torch.no_grad()
    def evaluate(self, params: Params) -> ValLoss:
        """Validation loss of ``params``, loaded into :attr:`model`."""
        for name, p in self.model.named_parameters():
            p.copy_(params[name])
        return self.data.validation.evaluate(
            self.model, self.cfg.eval_batch_size, self.cfg.eval_windows
        )


def build_server(cfg: SimConfig, init: Params, rates: list[float]) -> Server:
    """The method's outer optimizer (``rates``: expected rounds per second of each worker)
    behind a server with the method's policy (sync barrier, DyLU, grace window)."""
    optimizer = build_optimizer(cfg.method, init, cfg.outer_config(), cfg.workers, rates)
    server_cfg = ServerConfig(
        n_workers=cfg.workers,
        inner_steps=cfg.inner_steps,
        synchronous=resolve_method(cfg.method).spec.synchronous,
        dylu=cfg.use_dylu(),
        grace_window=cfg.grace_window,
    )
    return Server(init, optimizer, server_cfg)


def build_run(cfg: SimConfig, device: torch.device | str | None = None) -> RunParts:
    """Seed, build data, initial model (on ``device``, default ``cfg.device``), per-worker
    schedules and the server of ``cfg``."""
    seed_everything(cfg.seed)
    data = build_data(cfg.data, cfg.workers, cfg.seed)
    model = initial_model(cfg, data, device)
    init = {k: v.detach().to("cpu", torch.float32).clone() for k, v in model.named_parameters()}
    paces, comm = resolve_paces(cfg), resolve_comm(cfg)
    steps = round_steps(cfg, paces)
    rates = [1.0 / s for s in round_seconds(steps, paces, comm)]
    inner = worker_inner_configs(cfg, paces, comm)
    return RunParts(cfg, data, model, paces, comm, steps, inner, build_server(cfg, init, rates))


def run_simulation(
    cfg: SimConfig, progress: Callable[[EvalPoint], None] | None = None
) -> RunResult:
    """Build the run's parts from ``cfg``; run on the simulated clock; write metrics; summarise."""
    wall0 = time.perf_counter()
    parts = build_run(cfg)
    # One model object serves every worker and the evaluator: each round loads its start first.
    workers = [parts.worker(w) for w in range(cfg.workers)]
    clock = Clock(
        paces=parts.paces,
        comm_delays=parts.comm,
        jitter=cfg.pace_jitter,
        seed=cfg.seed,
        token_budget=cfg.token_budget,
        time_budget=cfg.time_budget,
        eval_every=cfg.eval_every,
        eval_unit=cfg.eval_unit,
    )
    stats = RunStats(cfg.workers, parts.data.worker_languages)
    if cfg.out_dir is not None:
        cfg.out_dir.mkdir(parents=True, exist_ok=True)
        atomic_write_json(cfg.out_dir / CONFIG_FILE, cfg.model_dump(mode="json"))
    with MetricsWriter(cfg.out_dir) as writer:
        traj = simulate(parts.server, workers, clock, parts.evaluate, writer, stats, progress)
        wall = time.perf_counter() - wall0
        summary = summarize(cfg, traj, stats, parts.paces, wall)
        writer.write_summary(summary)
    return RunResult(cfg, traj.evals, summary, parts.server.params, parts.paces)


def round_steps(cfg: SimConfig, paces: list[float]) -> list[int]:
    """Steps per round of each worker from the configured paces (H, or DyLU's H_w)."""
    if not cfg.use_dylu():
        return [cfg.inner_steps] * cfg.workers
    speeds: list[float | None] = [1.0 / p for p in paces]
    return [dylu_steps(speeds, w, cfg.inner_steps) for w in range(cfg.workers)]


def worker_inner_configs(
    cfg: SimConfig, paces: list[float], comm: list[float] | None = None
) -> list[InnerConfig]:
    """Each worker's inner config: ``cfg.inner``, or with ``inner_schedule='budget'`` a cosine
    as long as the worker's expected steps (the network runtime builds the same)."""
    if cfg.inner_schedule == "config":
        return [cfg.inner] * cfg.workers
    comm = comm if comm is not None else [0.0] * cfg.workers
    sync = resolve_method(cfg.method).spec.synchronous
    planned = expected_worker_steps(cfg, paces, comm, round_steps(cfg, paces), sync)
    return [replace(cfg.inner, total_steps=max(n, cfg.inner.warmup_steps, 1)) for n in planned]


def expected_worker_steps(
    cfg: SimConfig, paces: list[float], comm: list[float], steps: list[int], synchronous: bool
) -> list[int]:
    """Inner steps each worker is expected to take before the first budget stops the run.

    A worker with H_w steps per round of H_w·pace_w + comm_w seconds runs H_w/(H_w·pace_w +
    comm_w) steps per second; async workers share the token budget in proportion to that
    rate, sync workers advance one round of max_w(round time) together. Used as the length of
    each worker's cosine schedule, so no worker sits at min_lr for most of the run.
    """
    k = len(paces)
    round_s = round_seconds(steps, paces, comm)
    tokens_per_step = cfg.inner.batch_size * cfg.inner.seq_len
    limits: list[list[float]] = []
    if cfg.token_budget is not None:
        total = math.ceil(cfg.token_budget / tokens_per_step)
        if synchronous:
            limits.append([total * steps[w] / sum(steps) for w in range(k)])
        else:
            speed = [steps[w] / round_s[w] for w in range(k)]
            limits.append([total * v / sum(speed) for v in speed])
    if cfg.time_budget is not None:
        if synchronous:
            rounds = math.floor(cfg.time_budget / max(round_s))
            limits.append([float(rounds * steps[w]) for w in range(k)])
        else:
            limits.append([cfg.time_budget * steps[w] / round_s[w] for w in range(k)])
    return [max(1, math.ceil(min(lim[w] for lim in limits))) for w in range(k)]


def loss_at_time_budget(cfg: SimConfig, traj: Trajectory) -> float | None:
    """Loss at the time budget: interpolated between evals, or the final loss when the run
    stopped because the next event fell past the budget (the model is then unchanged from the
    last arrival up to the budget)."""
    if cfg.time_budget is None or not traj.evals:
        return None
    at = loss_at(traj.evals, cfg.time_budget, "time")
    if at is None and traj.stopped_by == "time":
        return traj.evals[-1].loss
    return at


def summarize(
    cfg: SimConfig, traj: Trajectory, stats: RunStats, paces: list[float], wall: float
) -> RunSummary:
    """The summary.json of a finished run."""
    last = traj.evals[-1] if traj.evals else None
    train_wall = max((traj.loop_seconds or wall) - traj.eval_seconds, 1e-9)
    return RunSummary(
        method=cfg.method,
        n_workers=cfg.workers,
        final_loss=None if last is None else last.loss,
        final_per_language={} if last is None else dict(last.per_language),
        loss_at_token_budget=(
            None if cfg.token_budget is None else loss_at(traj.evals, cfg.token_budget, "tokens")
        ),
        loss_at_time_budget=loss_at_time_budget(cfg, traj),
        cycle_loss=None if last is None else last.cycle_loss,
        tokens=traj.tokens,
        steps=traj.steps,
        time=traj.time,
        updates=stats.updates,
        wall_seconds=wall,
        train_tokens_per_second=traj.tokens / train_wall,
        worker_shares=stats.worker_shares(),
        language_shares=stats.language_shares(),
        staleness_mean=stats.staleness_mean(),
        staleness_max=list(stats.staleness_max),
        correction=stats.correction(),
        paces=paces,
        weight_shares=stats.weight_shares(),
    )
