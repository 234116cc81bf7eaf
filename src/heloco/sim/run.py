"""One simulated run end to end: build its parts, drive the clock, write metrics, summarise."""

from __future__ import annotations

import time
from collections.abc import Callable, Sequence
from contextlib import ExitStack
from dataclasses import dataclass
from pathlib import Path

from heloco.config import RunConfig
from heloco.data import WorkerData
from heloco.metrics import (
    EvalPoint,
    MetricsWriter,
    RunStats,
    RunSummary,
    atomic_write_json,
    loss_at,
)
from heloco.model import TinyGPT
from heloco.runfolder import CONFIG_FILE
from heloco.sim.batch import BatchEngine
from heloco.sim.build import ClockSetup, DataSetup, RunParts, build_run, torch_threads
from heloco.sim.evalcache import EvalCache
from heloco.sim.loop import DirectRounds, Loop, RoundSource, StreamRounds, simulation
from heloco.sim.pool import PooledRounds, RoundPool
from heloco.sim.recorder import Trajectory
from heloco.sim.stacked import supports
from heloco.types import Params


@dataclass(frozen=True)
class RunResult:
    """Result of :func:`run_simulation`: eval curve, summary, final server parameters."""

    config: RunConfig
    evals: list[EvalPoint]
    summary: RunSummary
    params: Params
    paces: list[float]

    @property
    def losses(self) -> list[float]:
        """Validation losses (nats/token) of the evaluations, in order."""
        return [e.loss for e in self.evals]


Progress = Callable[[EvalPoint], None]


def run_simulation(cfg: RunConfig, progress: Progress | None = None) -> RunResult:
    """Build the run's parts from ``cfg``; run on the simulated clock; write metrics; summarise.

    Runs with ``cfg.threads`` torch threads and restores the caller's count afterwards."""
    outcome = run_simulations([cfg], [progress])[0]
    if isinstance(outcome, Exception):
        raise outcome
    return outcome


def run_simulations(
    cfgs: Sequence[RunConfig], progress: Sequence[Progress | None] | None = None
) -> list[RunResult | Exception]:
    """Simulate several runs side by side in this process (e.g. the methods and seeds of one
    grid setting); a run that fails gives its exception and the others go on.

    Each run keeps its own clock, server and metrics; their rounds meet in one pool per model
    shape (:func:`round_sources`), which computes the rounds submitted so far that some run
    may still take whenever some run waits for one, identical rounds once, batched where
    that pays. Losses are the same as running each config alone. Data is built once per
    (data config, workers, seed). Wall time of the batch is shared equally among its runs in their summaries.
    """
    threads = {c.threads for c in cfgs}
    if len(threads) > 1:
        raise ValueError(f"runs simulated together need one thread count, got {sorted(threads)}")
    with torch_threads(threads.pop() if threads else 1):
        return _simulate_side_by_side(list(cfgs), list(progress or [None] * len(cfgs)))


@dataclass(eq=False)
class _Run:
    """One run in progress."""

    cfg: RunConfig
    parts: RunParts
    rounds: RoundSource
    stats: RunStats
    writer: MetricsWriter
    loop: Loop | None = None
    traj: Trajectory | None = None


def _simulate_side_by_side(
    cfgs: list[RunConfig], progress: list[Progress | None]
) -> list[RunResult | Exception]:
    wall0 = time.perf_counter()
    outcomes: list[RunResult | Exception | _Run] = []
    data: dict[tuple[str, int, int], WorkerData] = {}
    built: list[RunParts | Exception] = []
    for cfg in cfgs:
        try:
            key = DataSetup.of(cfg).key()
            parts = build_run(cfg, data=data.get(key))
            data[key] = parts.data
            built.append(parts)
        except Exception as exc:  # this run fails, the others go on
            built.append(exc)
    sources = round_sources(built)
    evals = EvalCache()
    with ExitStack() as stack:
        for cfg, item, source, prog in zip(cfgs, built, sources, progress, strict=True):
            if isinstance(item, Exception):
                outcomes.append(item)
                continue
            assert source is not None
            writer = stack.enter_context(MetricsWriter(_prepare_out(cfg)))
            stats = RunStats(cfg.workers, item.data.worker_languages)
            run = _Run(cfg, item, source, stats, writer)
            evaluate = item.evaluate if cfg.batch == "off" else evals.evaluator(item)
            clock = ClockSetup.of(cfg).build(item.paces, item.comm, item.links)
            run.loop = simulation(item.server, source, clock, evaluate, writer, stats, prog)
            outcomes.append(run)
        loop0 = time.perf_counter()
        _drive([o for o in outcomes if isinstance(o, _Run)], outcomes)
        loop_wall = time.perf_counter() - loop0
        finished = [o for o in outcomes if isinstance(o, _Run)]
        eval_wall = sum(r.traj.eval_seconds for r in finished if r.traj is not None)
        share = (loop_wall - eval_wall) / max(1, len(finished))
        wall = (time.perf_counter() - wall0) / max(1, len(finished))
        for i, o in enumerate(outcomes):
            if isinstance(o, _Run):
                outcomes[i] = _finish(o, share, wall)
    return [o for o in outcomes if not isinstance(o, _Run)]


def round_sources(built: Sequence[RunParts | Exception]) -> list[RoundSource | None]:
    """Each run's round source. TinyGPT runs of one model shape and device share a pool
    (unless ``batch = "off"``): a batched :class:`BatchEngine` with ``batch = "on"``, or
    ``"auto"`` where :func:`batching_pays`, and two or more workers in the group; else, for
    two or more runs, a :class:`RoundPool` that computes their rounds one at a time (each
    distinct round once). Any other run computes its workers' rounds one at a time on its
    own model (``DirectRounds``)."""
    groups: dict[tuple[str, str, bool], list[tuple[int, RunParts, TinyGPT]]] = {}
    for i, parts in enumerate(built):
        if isinstance(parts, Exception) or parts.cfg.batch == "off" or parts.cfg.failures:
            continue
        if parts.cfg.exchange == "streaming":  # sub-rounds go through each worker's Stream
            continue
        model = parts.model
        if isinstance(model, TinyGPT) and supports(model):
            batched = parts.cfg.batch == "on" or batching_pays(parts)
            key = (model.cfg.model_dump_json(), str(model.positions.device), batched)
            groups.setdefault(key, []).append((i, parts, model))
    out: list[RoundSource | None] = [None] * len(built)
    for (_, _, batched), members in groups.items():
        slots = sum(parts.cfg.workers for _, parts, _ in members)
        if (batched and slots < 2) or (not batched and len(members) < 2):
            continue
        first = members[0][2]
        engine = BatchEngine(first.cfg, slots, first.positions.device) if batched else None
        pool = engine if engine is not None else RoundPool(slots)
        offset = 0
        for i, parts, model in members:
            for w in range(parts.cfg.workers):
                on = engine.models[offset + w] if engine is not None else None
                worker = parts.worker(w, model=on)
                identity = (
                    id(parts.data.streams[w]),
                    w,
                    worker.cfg,
                    model.cfg,
                    str(first.positions.device),
                )
                pool.bind(offset + w, worker, identity)
            out[i] = PooledRounds(
                pool,
                offset,
                parts.cfg.workers,
                parts.cfg.token_budget,
                parts.cfg.time_budget,
            )
            offset += parts.cfg.workers
    for i, parts in enumerate(built):
        if out[i] is None and isinstance(parts, RunParts):
            # One model object serves every worker and the evaluator: each round loads its start.
            workers = [parts.worker(w) for w in range(parts.cfg.workers)]
            if parts.cfg.exchange == "streaming":
                server = parts.server
                out[i] = StreamRounds(workers, server.fragments, parts.cfg.stream_alpha)
            else:
                out[i] = DirectRounds(workers)
    return out


# Measured on the 2-core CPU (BENCHMARKS.md, "simulator throughput"), one seed's 9 methods at
# [1,6,6,6,6] in a pool: batching saved 9% of the paper regime's CPU time (6·N·tokens = 2.0
# GFLOP per inner step; it cost 9% while the batch still computed rounds no run took) and
# more in the converged regime's (0.21 GFLOP). Larger steps were not measured.
BATCH_FLOP_LIMIT = 2.5e9


def batching_pays(parts: RunParts) -> bool:
    """``batch = "auto"``: batch on accelerators, and on the CPU only models whose inner step
    is small enough (6·N·tokens FLOPs, Kaplan et al. 2020 Eq. 2.1 with N the parameter count)
    that per-call overhead, not arithmetic, dominates."""
    if parts.cfg.device != "cpu" and not parts.cfg.device.startswith("cpu:"):
        return True
    n = sum(p.numel() for p in parts.model.parameters())
    return 6 * n * parts.cfg.inner.tokens_per_step < BATCH_FLOP_LIMIT


def _drive(runs: list[_Run], outcomes: list[RunResult | Exception | _Run]) -> None:
    """Advance every run until it waits for a round; then have their pools compute the rounds
    waited for and those any run may still take; drop the rounds of a run that ended; repeat
    until every run has finished or failed."""
    live = list(runs)
    while live:
        waiting = []
        for run in live:
            assert run.loop is not None
            try:
                next(run.loop)
                waiting.append(run)
            except StopIteration as stop:
                run.traj = stop.value
            except Exception as exc:  # this run fails, the others go on
                outcomes[outcomes.index(run)] = exc
            if run not in waiting and isinstance(run.rounds, PooledRounds):
                run.rounds.cancel()  # its rounds in flight will never be taken
        pools = {
            id(r.rounds.pool): r.rounds.pool for r in waiting if isinstance(r.rounds, PooledRounds)
        }
        if waiting and sum(p.run() for p in pools.values()) == 0:
            raise RuntimeError("simulated runs wait for rounds that nothing computes")
        live = waiting


def _prepare_out(cfg: RunConfig) -> Path | None:
    """Create the run folder and write its config.json (None: nothing is written)."""
    if cfg.out_dir is not None:
        cfg.out_dir.mkdir(parents=True, exist_ok=True)
        atomic_write_json(cfg.out_dir / CONFIG_FILE, cfg.model_dump(mode="json"))
    return cfg.out_dir


def _finish(run: _Run, train_share: float, wall: float) -> RunResult:
    """Summary of a finished run; ``train_share`` is its part of the batch's training time."""
    traj = run.traj
    assert traj is not None
    traj.loop_seconds = traj.eval_seconds + train_share
    summary = summarize(run.cfg, traj, run.stats, run.parts.paces, wall)
    run.writer.write_summary(summary)
    server = run.parts.server
    return RunResult(run.cfg, traj.evals, summary, server.params, run.parts.paces)


def loss_at_time_budget(time_budget: float | None, traj: Trajectory) -> float | None:
    """Loss at the time budget (seconds; None: no time budget, no reading): interpolated
    between evals, or the final loss when the run stopped because the next event fell past
    the budget (the model is then unchanged from the last arrival up to the budget)."""
    if time_budget is None or not traj.evals:
        return None
    at = loss_at(traj.evals, time_budget, "time")
    if at is None and traj.stopped_by == "time":
        return traj.evals[-1].loss
    return at


def summarize(
    cfg: RunConfig, traj: Trajectory, stats: RunStats, paces: list[float], wall: float
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
        loss_at_time_budget=loss_at_time_budget(cfg.time_budget, traj),
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
        goodput=traj.goodput(cfg.workers),
        payload=cfg.payload,
        codec=cfg.codec,
    )
