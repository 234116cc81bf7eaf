"""Simulated time of a run: paces, communication delays, steps per round, planned schedules.

:class:`InnerSetup` is the inner-loop component of a run config: the schedule functions here
take it (each worker's pace, steps per round and inner config are the same in the simulator,
the network server and every network worker); :class:`Clock` is the simulator's own clock."""

from __future__ import annotations

import math
from collections.abc import Sequence
from dataclasses import dataclass, replace
from typing import Literal

import numpy as np

from heloco.data import derive_seed
from heloco.outer import resolve_method
from heloco.server import DyluReference, dylu_steps, quantile_speed
from heloco.sim.config import PACE_KEY, PaceDistribution, SimConfig, component_of
from heloco.worker import InnerConfig


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
    failures: tuple[tuple[int, float, float], ...] = ()  # (worker, killed at, seconds down)

    def is_down(self, worker: int, t: float) -> bool:
        """Whether ``worker`` is killed and not yet back at time ``t``."""
        return any(w == worker and at <= t < at + d for w, at, d in self.failures)

    def killed_between(self, worker: int, t0: float, t1: float) -> bool:
        """Whether ``worker`` is killed in (t0, t1) (a round it runs then is lost)."""
        return any(w == worker and t0 < at < t1 for w, at, _ in self.failures)

    def back_at(self, worker: int, t: float) -> float:
        """When ``worker`` is up again after time ``t`` (``t`` if it is up, else the end of
        its downtime, or of a kill during the round that starts at ``t``)."""
        ends = [at + d for w, at, d in self.failures if w == worker and at + d > t]
        return min(ends) if ends else t


@dataclass(frozen=True)
class InnerSetup:
    """The inner-loop component of a run: each worker's pace, steps per round (H, or DyLU's
    H_w from the configured paces) and inner config (its cosine as configured, or as long as
    the worker's expected steps under the budget), its payload codec and the batch-order
    seed. The simulator, the network server and every network worker build the same."""

    workers: int
    seed: int
    paces: list[float] | PaceDistribution | None
    comm_delays: list[float] | None
    inner_steps: int
    dylu: bool  # resolved: the config's switch, else the method's default
    dylu_reference: DyluReference
    dylu_quantile: float
    synchronous: bool  # the method waits for every worker each round
    inner: InnerConfig
    inner_schedule: Literal["budget", "config"]
    token_budget: int | None
    time_budget: float | None
    payload: str

    @classmethod
    def of(cls, cfg: SimConfig) -> InnerSetup:
        """The inner-loop component of ``cfg``."""
        synchronous = resolve_method(cfg.method).spec.synchronous
        return component_of(cls, cfg, dylu=cfg.use_dylu(), synchronous=synchronous)


def resolve_paces(cfg: InnerSetup) -> list[float]:
    """Per-worker seconds per step: given, drawn (lognormal, seeded), or all 1."""
    if cfg.paces is None:
        return [1.0] * cfg.workers
    if isinstance(cfg.paces, list):
        return [float(p) for p in cfg.paces]
    rng = np.random.default_rng(derive_seed(cfg.seed, PACE_KEY))
    z = rng.standard_normal(cfg.workers)
    return [float(cfg.paces.median * math.exp(cfg.paces.sigma * zi)) for zi in z]


def resolve_comm(cfg: InnerSetup) -> list[float]:
    """Per-worker communication seconds added to each round (None: all 0)."""
    if cfg.comm_delays is None:
        return [0.0] * cfg.workers
    return [float(c) for c in cfg.comm_delays]


def round_seconds(
    steps: Sequence[int], paces: Sequence[float], comm: Sequence[float]
) -> list[float]:
    """Seconds of one round of each worker: H_w·pace_w + comm_w (spec 3, speed heterogeneity)."""
    return [steps[w] * paces[w] + comm[w] for w in range(len(steps))]


def round_steps(cfg: InnerSetup, paces: list[float]) -> list[int]:
    """Steps per round of each worker from the configured paces (H, or DyLU's H_w)."""
    if not cfg.dylu:
        return [cfg.inner_steps] * cfg.workers
    speeds: list[float | None] = [1.0 / p for p in paces]
    v_ref = None  # the fastest speed
    if cfg.dylu_reference == "quantile":  # the server's first pool holds exactly these speeds
        v_ref = quantile_speed([1.0 / p for p in paces], cfg.dylu_quantile)
    return [dylu_steps(speeds, w, cfg.inner_steps, v_ref) for w in range(cfg.workers)]


def worker_inner_configs(
    cfg: InnerSetup, paces: list[float], comm: list[float] | None = None
) -> list[InnerConfig]:
    """Each worker's inner config: ``cfg.inner``, or with ``inner_schedule='budget'`` a cosine
    as long as the worker's expected steps (the network runtime builds the same)."""
    if cfg.inner_schedule == "config":
        return [cfg.inner] * cfg.workers
    comm = comm if comm is not None else [0.0] * cfg.workers
    planned = expected_worker_steps(cfg, paces, comm, round_steps(cfg, paces), cfg.synchronous)
    return [replace(cfg.inner, total_steps=max(n, cfg.inner.warmup_steps, 1)) for n in planned]


def expected_worker_steps(
    cfg: InnerSetup, paces: list[float], comm: list[float], steps: list[int], synchronous: bool
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
