"""Simulated time of a run: paces, communication delays, steps per round, planned schedules.

:class:`InnerSetup` is the inner-loop component of a run config: the schedule functions here
take it (each worker's pace, steps per round and inner config are the same in the simulator,
the network server and every network worker); :class:`Clock` is the simulator's own clock."""

from __future__ import annotations

import math
from collections.abc import Sequence
from dataclasses import dataclass, field, replace
from typing import Literal

import numpy as np

from heloco.codecs import expected_nbytes, parse_payload
from heloco.config import PaceDistribution, RunConfig, method_policy
from heloco.data import derive_seed
from heloco.server import DyluReference, dylu_steps, quantile_speed
from heloco.sim.config import PACE_KEY, component_of
from heloco.types import RoundTiming
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
    # The pull leg of comm_delays (seconds each dispatch takes to reach the worker): empty
    # means 0 (fixed comm_delays charge the whole exchange to the push).
    down_delays: list[float] = field(default_factory=list)
    exchange: Literal["blocking", "overlapped", "streaming"] = "blocking"
    eager: float = 1.0  # overlapped: λ of start = θ − λ·Δ (heloco.overlap)
    push_bytes: list[int] = field(default_factory=list)  # wire bytes of each worker's push
    pull_bytes: int = 0  # wire bytes of one dispatch
    stream_alpha: float = 0.5  # streaming: α of the fragment merge (heloco.streaming)
    link_mbit: list[float] = field(default_factory=list)  # link clock: Mbit/s per worker
    link_latency: list[float] = field(default_factory=list)  # link clock: one-way seconds

    def leg(self, worker: int, nbytes: int, whole: int) -> float:
        """Seconds one streaming leg of ``nbytes`` takes over ``worker``'s link: a request and
        its reply, 2·latency + nbytes / rate on the link clock (:func:`request_seconds`); with
        fixed ``comm_delays`` the push's share of them, comm_w · nbytes / ``whole`` (the
        model's fp32 bytes)."""
        if self.link_mbit:
            return request_seconds(nbytes, self.link_mbit[worker], self.link_latency[worker])
        return self.comm_delays[worker] * nbytes / whole if whole > 0 else 0.0

    def down(self, worker: int) -> float:
        """Seconds a dispatch takes to reach ``worker`` (0 without a link clock)."""
        return self.down_delays[worker] if self.down_delays else 0.0

    def up(self, worker: int) -> float:
        """Seconds ``worker``'s push takes to reach the server."""
        return self.comm_delays[worker] - self.down(worker)

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
    the worker's expected steps under the budget), its payload codec, its link and exchange
    mode, and the batch-order seed. The simulator, the network server and every network worker build the same."""

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
    exchange: Literal["blocking", "overlapped", "streaming"]
    link_mbit: list[float] | None
    link_latency: list[float] | None
    server_link_mbit: float | None

    @classmethod
    def of(cls, cfg: RunConfig) -> InnerSetup:
        """The inner-loop component of ``cfg``."""
        synchronous = method_policy(cfg.method).synchronous
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


MBIT = 1e6 / 8  # bytes per second in one Mbit/s


@dataclass(frozen=True)
class LinkTimes:
    """Per-worker seconds of each leg of an exchange over its link, and the bytes it moves."""

    up: list[float]  # push: pseudo-gradient payload to the server
    down: list[float]  # pull: the dispatch to the worker
    push_bytes: list[int]
    pull_bytes: int
    mbit: list[float] = field(default_factory=list)  # each worker's rate, Mbit/s
    latency: list[float] = field(default_factory=list)  # each worker's one-way seconds

    @property
    def comm(self) -> list[float]:
        """Seconds of a whole (blocking) exchange per worker: push then pull."""
        return [u + d for u, d in zip(self.up, self.down, strict=True)]


def payload_bytes(payload: str, numels: Sequence[int]) -> int:
    """Wire bytes of one pseudo-gradient of tensors of ``numels`` elements in ``payload``
    (dense: fp32, 4 bytes per element; top-k and sign: :func:`heloco.codecs.expected_nbytes`)."""
    spec = parse_payload(payload)
    return sum(expected_nbytes(spec, n) for n in numels)


def link_seconds(nbytes: int, mbit: float, latency: float) -> float:
    """Seconds to move ``nbytes`` bytes one way over a link of ``mbit`` Mbit/s and ``latency``
    one-way seconds: T = L + B / W (Hockney 1994, "The communication challenge for MPP",
    Eq. 1, t(n) = t0 + n / r∞), B in bytes, W = mbit · 10⁶ / 8 bytes/s, T and L in seconds."""
    return latency + nbytes / (mbit * MBIT)


def request_seconds(nbytes: int, mbit: float, latency: float) -> float:
    """Seconds of one leg of the runtime's exchange: a request of ``nbytes`` bytes and its
    small reply (the push: Δ, then the server's ack), or a small request and its reply of
    ``nbytes`` (the pull: a request, then the dispatch); heloco/net/link.py ``NetLink.push``
    and ``NetLink.pull`` each wait for a reply (heloco/net/client.py ``Client.call``). Two
    messages, so Hockney's t0 twice: T = 2·L + B / W (Hockney 1994, Eq. 1, per message),
    one round trip per leg, two per exchange, as ShardMeter's ``heloco_exchange_s`` charges.
    B bytes, W = mbit · 10⁶ / 8 bytes/s, T and L (one-way) in seconds."""
    return link_seconds(nbytes, mbit, latency) + latency


def resolve_links(cfg: InnerSetup, numels: Sequence[int]) -> LinkTimes | None:
    """Each worker's push and pull seconds from ``link_mbit`` (None when it is unset), each
    leg a request and its reply (:func:`request_seconds`): the push until its ack, the pull
    from its request until the dispatch is in.

    A worker's rate is its own link's, or its fair share of a shared server link when that
    is slower: W_w = min(link_w, server / K) (every one of the K workers sending at once; an
    approximation that overstates the wait when fewer do). Push: the payload's bytes; pull:
    the dispatch's (fp32 parameters)."""
    if cfg.link_mbit is None:
        return None
    k = cfg.workers
    latency = cfg.link_latency if cfg.link_latency is not None else [0.0] * k
    rates = [
        min(float(b), cfg.server_link_mbit / k) if cfg.server_link_mbit else float(b)
        for b in cfg.link_mbit
    ]
    push = payload_bytes(cfg.payload, numels)
    pull = 4 * sum(numels)
    up = [request_seconds(push, rates[w], float(latency[w])) for w in range(k)]
    down = [request_seconds(pull, rates[w], float(latency[w])) for w in range(k)]
    lat = [float(x) for x in latency]
    return LinkTimes(up, down, [push] * k, pull, rates, lat)


def round_seconds(
    steps: Sequence[int], paces: Sequence[float], comm: Sequence[float], overlapped: bool = False
) -> list[float]:
    """Seconds of one round of each worker: H_w·pace_w + comm_w (spec 3, speed heterogeneity);
    with the overlapped exchange max(H_w·pace_w, comm_w), the exchange hidden behind the next
    round (heloco.overlap; after the first round)."""
    if overlapped:
        return [max(steps[w] * paces[w], comm[w]) for w in range(len(steps))]
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
    round_s = round_seconds(steps, paces, comm, cfg.exchange != "blocking")
    limits: list[list[float]] = []
    if cfg.token_budget is not None:
        total = math.ceil(cfg.token_budget / cfg.inner.tokens_per_step)
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


def lump_timing(
    start: float, end: float, compute_s: float, bytes_received: int, bytes_sent: int
) -> RoundTiming:
    """A simulated round laid out as receive → compute → send on the simulated clock.

    The clock charges a round compute_s + comm_w with comm_w one lump (:func:`round_seconds`;
    comm = end − start − compute_s here). The lump is split by the bytes each way, as one link
    at one rate in both directions would carry them: receive = comm · B_recv / (B_recv +
    B_sent), send = the rest (seconds; B in bytes: the fp32 dispatch and the push as sent).
    Only the record is split: no simulated time or loss depends on it.
    """
    comm = max(0.0, end - start - compute_s)
    total = bytes_received + bytes_sent
    recv = comm * bytes_received / total if total > 0 else 0.5 * comm
    compute_start = start + recv
    compute_end = min(end, compute_start + compute_s)
    return RoundTiming(
        recv_start=start,
        recv_end=compute_start,
        compute_start=compute_start,
        compute_end=compute_end,
        send_start=compute_end,
        send_end=end,
        bytes_sent=bytes_sent,
        bytes_received=bytes_received,
    )
