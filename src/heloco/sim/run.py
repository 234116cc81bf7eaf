"""One simulated run end to end: build its parts, drive the clock, write metrics, summarise."""

from __future__ import annotations

import time
from collections.abc import Callable
from dataclasses import dataclass

from heloco.metrics import (
    EvalPoint,
    MetricsWriter,
    RunStats,
    RunSummary,
    atomic_write_json,
    loss_at,
)
from heloco.sim.build import build_run, torch_threads
from heloco.sim.clock import Clock
from heloco.sim.config import SimConfig
from heloco.sim.loop import simulate
from heloco.sim.recorder import Trajectory
from heloco.types import Params

CONFIG_FILE = "config.json"


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


def run_simulation(
    cfg: SimConfig, progress: Callable[[EvalPoint], None] | None = None
) -> RunResult:
    """Build the run's parts from ``cfg``; run on the simulated clock; write metrics; summarise.

    Runs with ``cfg.threads`` torch threads and restores the caller's count afterwards."""
    with torch_threads(cfg.threads):
        return _run(cfg, progress)


def _run(cfg: SimConfig, progress: Callable[[EvalPoint], None] | None) -> RunResult:
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
