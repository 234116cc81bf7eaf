"""A run's trajectory bookkeeping: events, statistics and evaluations on the run's clock."""

from __future__ import annotations

import time
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Literal

from heloco.data import ValLoss
from heloco.metrics import (
    EvalPoint,
    MetricsWriter,
    RunStats,
    cycle_average,
    eval_event,
    round_event,
    update_event,
)
from heloco.server import Server, UpdateRecord
from heloco.types import Params, RoundTiming

Evaluator = Callable[[Params], ValLoss]


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
    useful_seconds: float = 0.0  # simulated compute of accepted rounds and of those in flight

    def goodput(self, workers: int) -> float | None:
        """Useful compute over the workers' capacity: Σ compute seconds of the accepted rounds
        and of the rounds still in flight when the run stops (up to the stop) / (workers ×
        simulated seconds); a killed round's compute is lost (Decoupled DiLoCo's goodput, arXiv 2604.21428 §1: the
        share of the machines' time that became training); None before any time passed or
        where no round's compute was simulated (a networked run)."""
        if self.time <= 0 or self.useful_seconds <= 0:
            return None
        return self.useful_seconds / (workers * self.time)


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
        timing: RoundTiming | None = None,
    ) -> None:
        """Count an accepted round and log it (``start``/``end`` in run seconds; ``timing``
        where the loop measured its receive, compute and send)."""
        self.traj.tokens += tokens
        self.traj.steps += steps
        self.writer.event(round_event(worker, round_id, steps, tokens, loss, start, end, timing))

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
