"""Compose per-island inner-step estimates into a whole-topology estimate.

`compose_arrays` is the one multi-island formula: an outer round per island plus failures and
checkpoints -> throughput, wall-clock to the token budget, WAN bytes and cost, broadcast over
any leading axes (the planner evaluates whole grids of GPU counts × outer settings with it).
`compose` evaluates it for one topology and adds what one estimate explains: per-island
figures, the bottleneck and the regime, and the smallest H / WAN bandwidth at which the run is
compute-bound (utilization ≥ threshold). `predict_topology` runs the single-island estimator
on each island (explicit plan, or an "auto" FSDP/HSDP plan) and then composes.
"""

from __future__ import annotations

import math
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass, replace
from typing import Any

import numpy as np
from numpy.typing import ArrayLike, NDArray
from pydantic import ValidationError

from shardmeter.errors import UserInputError
from shardmeter.estimate.churn import Churn, churn, island_mtbf_s
from shardmeter.estimate.outer import FloatArray, OuterRound, outer_opt_seconds, outer_round
from shardmeter.estimate.payload import Payload, dense_payload, resolve_payload
from shardmeter.estimate.result import StepEstimate
from shardmeter.estimate.schedule import Schedule, explicit_schedule
from shardmeter.estimate.wan import WanPaths, wan_paths
from shardmeter.specs.hardware import Cluster
from shardmeter.specs.model import TransformerSpec
from shardmeter.specs.plan import Plan, validate_plan
from shardmeter.specs.topology import (
    GBIT,
    FailureSpec,
    IslandSpec,
    OuterSpec,
    RunSpec,
    Topology,
    WanSpec,
    island_plan,
    parse_settings,
    resolve_cluster,
    resolve_model,
    validate_topology,
    validation_error,
)

PHASES: tuple[str, ...] = ("straggler wait", "WAN exchange", "outer optimizer", "failures")
STEP_SOURCES = ("predicted", "given")


@dataclass(frozen=True)
class IslandInput:
    """What composition needs from one island: its inner step, its prices and its failures."""

    name: str
    step: StepEstimate
    price_per_gpu_hour: float = 0.0
    hbm_Bps: float = math.inf  # achieved HBM bandwidth per GPU (outer-optimizer step)
    accelerator: str = ""
    plan: Plan | None = None
    buckets: int = 1  # layers per pipeline stage: gradient buckets of the backward pass
    step_source: str = "predicted"  # or "given" (measured / what-if step time)
    mtbf_hours: float | None = None  # this island's MTBF (else the run's failure settings)

    @classmethod
    def on(
        cls, name: str, cluster: Cluster, plan: Plan, step: StepEstimate, buckets: int = 1
    ) -> IslandInput:
        """The island `name` running `plan` on `cluster` (prices and HBM from the cluster)."""
        return cls(
            name=name,
            step=step,
            price_per_gpu_hour=cluster.price_per_gpu_hour,
            hbm_Bps=cluster.accelerator.hbm_bytes_per_s,
            accelerator=cluster.accelerator.name,
            plan=plan,
            buckets=buckets,
        )

    def gradient_shards(self) -> int:
        """GPUs one copy of the gradients is spread over: tp·pp, times the ZeRO-2/3 group."""
        p = self.plan
        if p is None:
            return 1
        sharded = p.shard_group if p.sharding in ("zero2", "zero3") else 1
        return p.tp * p.pp * sharded


def given_step(step: StepEstimate, seconds: float) -> StepEstimate:
    """The island's step with a given (measured or what-if) duration: every time component and
    the backward window keep their share of the step, throughput and MFU follow the new time."""
    k = seconds / step.step_time_s
    return replace(
        step,
        step_time_s=seconds,
        time_breakdown={name: t * k for name, t in step.time_breakdown.items()},
        time_hidden={name: t * k for name, t in step.time_hidden.items()},
        tokens_per_s=step.tokens_per_step / seconds,
        tokens_per_s_per_gpu=step.tokens_per_step / seconds / step.n_gpus,
        mfu=step.mfu / k,
        hfu=step.hfu / k,
        backward_window_s=step.backward_window_s * k,
    )


@dataclass(frozen=True)
class IslandEstimate:
    """One island inside the topology. Per-round times are seconds per outer round."""

    name: str
    accelerator: str
    n_gpus: int
    plan: Plan | None
    step: StepEstimate  # the island's inner step on its own
    step_source: str  # "predicted" by the estimator or "given"
    inner_steps: float  # per round (1 for sync DP; H_i with balance_steps)
    round_s: float
    busy_s: float
    straggler_s: float
    wan_exposed_s: float
    wan_hidden_s: float  # WAN exchange time per round that ran under compute
    outer_opt_s: float
    tokens_per_s: float  # expected, after failures
    tokens_per_s_per_gpu: float
    utilization: float  # inner-step time / wall time, failures included
    mfu: float  # inner MFU × utilization
    goodput: float  # share of wall time not lost to failures and checkpoints
    staleness: float
    wan_bytes_per_round: float
    wan_bytes_total: float
    payload_memory_bytes: float  # error-feedback / low-rank state per GPU (sync) or per island
    fits: bool  # step memory + payload state on GPU within HBM
    gpu_hours: float
    gpu_cost_usd: float
    egress_cost_usd: float
    price_per_gpu_hour: float
    mtbf_hours: float  # inf: never fails


@dataclass(frozen=True)
class Bottleneck:
    """Where the time goes: the pacing island, the slowest WAN link, the largest loss."""

    island: str
    link: str
    phase: str


@dataclass(frozen=True)
class FailureEstimate:
    """What failures and checkpoints cost the run (all zero without an MTBF)."""

    failures_per_day: float  # expected failures across all islands
    goodput: float  # GPU-weighted share of wall time that trains
    checkpoint_interval_s: float  # used (inf: never)
    optimal_interval_s: float  # Young/Daly for the group that stalls together (inf: none)
    shared_stall: bool  # a failure stalls every island (sync without quorum)
    wall_s_failure_free: float
    cost_usd_failure_free: float


@dataclass(frozen=True)
class TopologyEstimate:
    """A whole run across islands. Quality-neutral figures plus quality-adjusted time and cost."""

    name: str
    mode: str
    settings: OuterSpec
    n_params: int
    payload: str  # what crosses the WAN, e.g. "dense 8-bit"
    payload_bits_per_param: float
    islands: tuple[IslandEstimate, ...]
    n_gpus: int
    tokens_per_s: float
    tokens_per_s_per_gpu: float
    utilization: float  # GPU-weighted mean of island utilizations (failures included)
    utilization_failure_free: float
    time_shares: dict[str, float]  # GPU-weighted share of wall time: compute + PHASES
    round_s: float  # slowest island's round
    wan_comm_s: float  # WAN exchange per round (pacing island), hidden or not
    wan_hidden_s: float  # ... of which ran under compute
    wan_bytes_per_round: float
    wan_bytes_total: float
    tokens: float  # budget (quality-neutral)
    wall_s: float
    gpu_hours: float
    gpu_cost_usd: float
    egress_cost_usd: float
    cost_usd: float
    usd_per_mtok: float
    quality_factor: float
    wall_s_adjusted: float  # quality_factor × wall_s: time to the same quality as sync training
    cost_usd_adjusted: float
    usd_per_mtok_adjusted: float  # per million quality-neutral tokens of the budget
    failures: FailureEstimate
    bottleneck: Bottleneck
    regime: str
    compute_bound: bool
    threshold: float
    min_inner_steps: int | None  # smallest H with utilization ≥ threshold (None: unreachable)
    min_wan_gbit: float | None  # bottleneck-link Gbit/s with utilization ≥ threshold
    wan_gbit: float  # current bottleneck-link Gbit/s
    hide_wan_gbit: float | None  # bottleneck-link Gbit/s at which no WAN time is exposed


def schedule_of(outer: OuterSpec) -> Schedule | None:
    """The explicit fragment schedule, or None for P evenly spaced fragments."""
    if isinstance(outer.fragments, int):
        return None
    return explicit_schedule(
        [f.offset for f in outer.fragments], [f.layers for f in outer.fragments]
    )


def _round(
    inputs: Sequence[IslandInput],
    wan: WanPaths,
    n_params: int,
    outer: OuterSpec,
    payload: Payload,
    *,
    inner_steps: Any = None,
    bandwidth_scale: Any = 1.0,
    search: bool = False,
) -> OuterRound:
    inner = np.array([isl.step.step_time_s for isl in inputs])
    gpus = np.array([isl.step.n_gpus for isl in inputs], dtype=np.float64)
    hbm = np.array([isl.hbm_Bps for isl in inputs])
    window = np.array([isl.step.backward_window_s for isl in inputs])
    opt = outer_opt_seconds(n_params, gpus, hbm)  # per round: P fragment steps of N/P each
    return outer_round(
        outer.mode,
        inner,
        wan,
        n_params,
        inner_steps=outer.inner_steps if inner_steps is None else inner_steps,
        bits=payload.bits_per_param,
        gathered=payload.gathered,
        collective_rounds=payload.rounds,
        outer_opt_s=opt,
        reduce=outer.reduce,
        overlap=outer.outer_overlap,
        fragments=outer.n_fragments,
        schedule=schedule_of(outer),
        overlap_steps=outer.overlap_steps,
        backward_s=window if outer.backward_overlap else 0.0 * window,
        buckets=np.array([isl.buckets for isl in inputs], dtype=np.float64),
        bandwidth_scale=bandwidth_scale,
        balance=outer.balance_steps,
        exchange=outer.exchange,
        link_slots=outer.link_slots,
        # the turns' schedule costs 15-50 ms a configuration: an overlapped search over H or
        # bandwidth (thousands) prices them by the mean-value analysis, the topology's own
        # configuration and every blocking one by the schedule (docs/wan.md, "Shared server
        # link: turns")
        turn_schedule=not search or outer.exchange == "blocking",
        push_overhead_bytes=payload.push_overhead_bytes,
        pull_bytes=payload.pull_bytes,
    )


def weighted_utilization(rnd: OuterRound, n_gpus: FloatArray) -> FloatArray:
    """GPU-weighted mean utilization over the island axis."""
    return (rnd.utilization * n_gpus).sum(axis=-1) / n_gpus.sum()


def _bottleneck_gbit(wan: WanPaths, outer: OuterSpec) -> tuple[float, str]:
    """The WAN path that limits this mode, as (Gbit/s, 'a↔b')."""
    if wan.n < 2:
        return math.inf, "none (one island)"
    if outer.reduce == "bucket" and outer.mode != "async" and wan.bucket is not None:
        return wan.bucket.Bps / GBIT, "island↔bucket"
    if outer.mode != "async" and outer.reduce == "ring":
        bw, _, (a, b) = wan.ring_bottleneck()
        return bw / GBIT, wan.path_name(a, b)
    c = wan.center
    col = np.where(np.arange(wan.n) == c, np.inf, wan.bandwidth_Bps[:, c])
    i = int(np.argmin(col))
    return float(col[i]) / GBIT, wan.path_name(i, c)


def _min_inner_steps(util: Callable[[Any], FloatArray], outer: OuterSpec) -> int | None:
    """Smallest H (≥ τ, past every listed offset) with utilization ≥ threshold: one
    vectorized pass over a geometric grid up to 1e7, then every H in the bracket."""
    if outer.mode == "sync":
        return None
    lo = max(1, outer.overlap_steps)
    if outer.mode == "streaming" and isinstance(outer.fragments, list):
        lo = max(lo, 1 + max(f.offset for f in outer.fragments))
    hi = 10**7
    theta = outer.compute_bound_threshold
    coarse = np.unique(np.round(np.geomspace(lo, hi, 400)).astype(np.int64))
    ok = util(coarse.astype(np.float64)) >= theta
    if not ok.any():
        return None
    k = int(np.argmax(ok))
    if k == 0:
        return int(coarse[0])
    fine = np.arange(coarse[k - 1] + 1, coarse[k] + 1, dtype=np.int64)
    fine_ok = util(fine.astype(np.float64)) >= theta
    return int(fine[int(np.argmax(fine_ok))])


def _min_scale(ok_at: Callable[[Any], NDArray[np.bool_]]) -> float | None:
    """Smallest WAN bandwidth multiplier (1e-9 .. 1e9) where `ok_at` holds (monotone in the
    bandwidth): four vectorized passes, each narrowing the bracket 256-fold (log scale)."""
    lo, hi = -9.0, 9.0
    for rep in range(4):
        grid = np.linspace(lo, hi, 257)
        ok = ok_at(10.0**grid)
        if rep == 0 and not ok[-1]:
            return None
        if rep == 0 and ok[0]:
            return float(10.0**lo)
        k = int(np.argmax(ok))
        lo, hi = float(grid[k - 1]), float(grid[k])
    return float(10.0**hi)


def _shares(rnd: OuterRound, goodput: FloatArray, gpus: FloatArray) -> dict[str, float]:
    """GPU-weighted shares of wall time: each island's round parts × its goodput, plus what
    failures and checkpoints take."""
    w = gpus / gpus.sum()

    def part(x: FloatArray) -> float:
        return float((x / rnd.round_s * goodput * w).sum())

    return {
        "compute": part(rnd.busy_s),
        "straggler wait": part(rnd.straggler_s),
        "WAN exchange": part(rnd.wan_exposed_s),
        "outer optimizer": part(rnd.outer_opt_s),
        "failures": float(((1.0 - goodput) * w).sum()),
    }


def _wan_phrase(comm: float, hidden: float) -> str:
    """'2.1 s exposed of 12.0 s per round (83% hidden)'."""
    exposed = max(0.0, comm - hidden)
    share = hidden / comm if comm > 0 else 1.0
    return f"{exposed:.3g} s exposed of {comm:.3g} s per round ({share:.0%} hidden)"


def _regime(
    inputs: Sequence[IslandInput],
    shares: dict[str, float],
    compute_bound: bool,
    pace: int,
    link: str,
    comm: float,
    hidden: float,
) -> tuple[str, str]:
    """(regime, bottleneck phase), with the WAN time split into hidden and exposed."""
    loss = max(PHASES, key=lambda k: shares[k])
    wan = _wan_phrase(comm, hidden)
    if compute_bound:
        phase = f"inner step: {inputs[pace].step.bottleneck}"
        if comm > 0:
            phase += f"; WAN exchange {wan}"
        return "compute-bound", phase
    if loss == "straggler wait":
        return f"straggler-bound (waiting for {inputs[pace].name})", loss
    if loss == "WAN exchange":
        return f"communication-bound (WAN {link})", f"WAN exchange: {wan}"
    if loss == "failures":
        return "failure-bound (restarts, rework and checkpoints)", loss
    return "outer-optimizer-bound", loss


@dataclass(frozen=True)
class Composition:
    """A run's throughput, wall-clock and cost after failures, for one topology or a whole
    grid of them: per-island arrays have the island axis last, totals the leading axes only.
    Units: tokens/s, seconds, GPU-hours, bytes, USD."""

    round: OuterRound
    loss: Churn
    ideal_tps: FloatArray  # (..., I) tokens/s per island without failures
    island_tps: FloatArray  # (..., I) ... after failures (× goodput)
    tokens_per_s: FloatArray  # (...) whole run, after failures
    wall_s: FloatArray  # (...) to the token budget
    gpu_hours: FloatArray  # (..., I)
    gpu_cost_usd: FloatArray  # (..., I)
    useful_rounds: FloatArray  # (..., I) rounds that count: lost rounds move no WAN bytes
    wan_bytes_total: FloatArray  # (..., I)
    egress_cost_usd: FloatArray  # (..., I)
    utilization: FloatArray  # (..., I) inner-step time / wall time, failures included
    total_utilization: FloatArray  # (...) GPU-weighted
    cost_usd: FloatArray  # (...) GPU cost + egress


def compose_arrays(
    rnd: OuterRound,
    tokens_per_step: ArrayLike,
    gpus: ArrayLike,
    price_per_gpu_hour: ArrayLike,
    mtbf_s: ArrayLike,
    failures: FailureSpec,
    tokens: float,
    *,
    asynchronous: bool,
) -> Composition:
    """The one multi-island formula: an outer round per island plus failures -> throughput,
    wall-clock and cost (design doc C.9, C.10; failures: Young 1974, Daly 2006). Every argument
    broadcasts with the island axis last, so the same call prices one topology (`compose`) or
    every GPU combination × outer setting of a search block."""
    gpus = np.asarray(gpus, dtype=np.float64)
    loss = churn(
        failures, np.asarray(mtbf_s, dtype=np.float64), rnd.round_s, asynchronous=asynchronous
    )
    ideal_tps = rnd.tokens_per_s(tokens_per_step)
    island_tps = ideal_tps * loss.goodput
    total_tps = island_tps.sum(axis=-1)
    wall = tokens / total_tps  # T_wall = D / throughput (design doc C.10)
    gpu_hours = gpus * wall[..., None] / 3600.0
    useful_rounds = wall[..., None] * loss.goodput / rnd.round_s
    gpu_cost = gpu_hours * np.asarray(price_per_gpu_hour, dtype=np.float64)
    egress_cost = rnd.egress_usd * useful_rounds  # Cost = Σ n_i·price_i·T_wall + egress (C.10)
    util = rnd.utilization * loss.goodput
    return Composition(
        round=rnd,
        loss=loss,
        ideal_tps=ideal_tps,
        island_tps=island_tps,
        tokens_per_s=total_tps,
        wall_s=wall,
        gpu_hours=gpu_hours,
        gpu_cost_usd=gpu_cost,
        useful_rounds=useful_rounds,
        wan_bytes_total=rnd.wan_bytes * useful_rounds,
        egress_cost_usd=egress_cost,
        utilization=util,
        total_utilization=(util * gpus).sum(axis=-1) / gpus.sum(axis=-1),
        cost_usd=gpu_cost.sum(axis=-1) + egress_cost.sum(axis=-1),
    )


def compose(
    inputs: Sequence[IslandInput],
    wan: WanPaths,
    n_params: int,
    outer: OuterSpec,
    tokens: float,
    *,
    name: str = "topology",
    payload: Payload | None = None,
) -> TopologyEstimate:
    """Per-island inner steps + WAN + outer mode -> the whole run (design doc C.9, C.10).

    `payload` is what crosses the WAN (`resolve_payload`); the default is the dense payload of
    `outer` (bits, or grad_bits in sync DP)."""
    if len(inputs) != wan.n:
        raise ValueError(f"{len(inputs)} islands but a WAN of {wan.n}")
    if payload is None:
        if outer.payload.kind != "dense":
            raise ValueError("a compressed payload needs resolve_payload(spec, bits, model)")
        payload = dense_payload(outer.dense_bits)
    rnd = _round(inputs, wan, n_params, outer, payload)
    gpus = np.array([isl.step.n_gpus for isl in inputs], dtype=np.float64)
    h = rnd.inner_steps
    overrides = np.array([math.inf if isl.mtbf_hours is None else isl.mtbf_hours for isl in inputs])
    mtbf = island_mtbf_s(outer.failures, gpus, overrides)
    price = np.array([isl.price_per_gpu_hour for isl in inputs])
    run = compose_arrays(
        rnd,
        [isl.step.tokens_per_step for isl in inputs],
        gpus,
        price,
        mtbf,
        outer.failures,
        tokens,
        asynchronous=outer.mode == "async",
    )
    loss = run.loss
    ideal_tps, island_tps = run.ideal_tps, run.island_tps
    total_tps, wall = float(run.tokens_per_s), float(run.wall_s)
    gpu_hours, gpu_cost, egress_cost = run.gpu_hours, run.gpu_cost_usd, run.egress_cost_usd
    wan_total = run.wan_bytes_total
    util_free = rnd.utilization
    util = run.utilization
    u_total = float(run.total_utilization)
    shares = _shares(rnd, loss.goodput, gpus)
    theta = outer.compute_bound_threshold
    compute_bound = u_total >= theta
    link_gbit, link = _bottleneck_gbit(wan, outer)
    inner = np.array([isl.step.step_time_s for isl in inputs])
    if outer.mode == "async":
        pace = int(np.argmin(util)) if not compute_bound else int(np.argmin(island_tps / gpus))
    else:
        pace = int(np.argmax(inner))
    comm, hidden = float(rnd.wan_comm_s[pace]), float(rnd.wan_hidden_s[pace])
    regime, phase = _regime(inputs, shares, compute_bound, pace, link, comm, hidden)

    def util_h(h_val: Any) -> FloatArray:
        r = _round(inputs, wan, n_params, outer, payload, inner_steps=h_val, search=True)
        return weighted_utilization(r, gpus) * _goodput_weight(loss, gpus)

    def util_bw(scale: Any) -> FloatArray:
        r = _round(inputs, wan, n_params, outer, payload, bandwidth_scale=scale, search=True)
        return weighted_utilization(r, gpus) * _goodput_weight(loss, gpus)

    def hidden_bw(scale: Any) -> NDArray[np.bool_]:
        r = _round(inputs, wan, n_params, outer, payload, bandwidth_scale=scale, search=True)
        return np.asarray((r.wan_exposed_s <= 1e-9 * r.round_s).all(axis=-1))

    min_h = _min_inner_steps(util_h, outer)
    multi = wan.n > 1 and math.isfinite(link_gbit)
    scale = _min_scale(lambda x: util_bw(x) >= theta) if multi else None
    hide = _min_scale(hidden_bw) if multi else None
    free_cost = float(
        (gpus * price).sum() * tokens / ideal_tps.sum() / 3600.0
        + (rnd.egress_usd * tokens / ideal_tps.sum() / rnd.round_s).sum()
    )
    extra = payload.extra_bytes_per_param * n_params
    on_gpu = outer.mode == "sync"  # DiLoCo keeps it beside the outer state, in host memory
    islands = tuple(
        IslandEstimate(
            name=isl.name,
            accelerator=isl.accelerator,
            n_gpus=int(isl.step.n_gpus),
            plan=isl.plan,
            step=isl.step,
            step_source=isl.step_source,
            inner_steps=float(h[i]),
            round_s=float(rnd.round_s[i]),
            busy_s=float(rnd.busy_s[i]),
            straggler_s=float(rnd.straggler_s[i]),
            wan_exposed_s=float(rnd.wan_exposed_s[i]),
            wan_hidden_s=float(rnd.wan_hidden_s[i]),
            outer_opt_s=float(rnd.outer_opt_s[i]),
            tokens_per_s=float(island_tps[i]),
            tokens_per_s_per_gpu=float(island_tps[i] / gpus[i]),
            utilization=float(util[i]),
            mfu=float(isl.step.mfu * util[i]),
            goodput=float(loss.goodput[i]),
            staleness=float(rnd.staleness[i]),
            wan_bytes_per_round=float(rnd.wan_bytes[i]),
            wan_bytes_total=float(wan_total[i]),
            payload_memory_bytes=extra / isl.gradient_shards() if on_gpu else extra,
            fits=not on_gpu
            or isl.step.memory_bytes + extra / isl.gradient_shards() <= isl.step.hbm_bytes,
            gpu_hours=float(gpu_hours[i]),
            gpu_cost_usd=float(gpu_cost[i]),
            egress_cost_usd=float(egress_cost[i]),
            price_per_gpu_hour=float(price[i]),
            mtbf_hours=float(mtbf[i] / 3600.0),
        )
        for i, isl in enumerate(inputs)
    )
    cost = float(run.cost_usd)
    qf = outer.quality_factor
    failures = FailureEstimate(
        failures_per_day=float(loss.failures_per_s.sum() * 86400.0),
        goodput=float((loss.goodput * gpus).sum() / gpus.sum()),
        checkpoint_interval_s=float(loss.checkpoint_interval_s),
        optimal_interval_s=float(loss.optimal_interval_s),
        shared_stall=loss.shared_stall,
        wall_s_failure_free=tokens / float(ideal_tps.sum()),
        cost_usd_failure_free=free_cost,
    )
    return TopologyEstimate(
        name=name,
        mode=outer.mode,
        settings=outer,
        n_params=int(n_params),
        payload=payload.label,
        payload_bits_per_param=payload.bits_per_param,
        islands=islands,
        n_gpus=int(gpus.sum()),
        tokens_per_s=total_tps,
        tokens_per_s_per_gpu=total_tps / float(gpus.sum()),
        utilization=u_total,
        utilization_failure_free=float((util_free * gpus).sum() / gpus.sum()),
        time_shares=shares,
        round_s=float(rnd.round_s.max()),
        wan_comm_s=comm,
        wan_hidden_s=hidden,
        wan_bytes_per_round=float(rnd.wan_bytes.sum()),
        wan_bytes_total=float(wan_total.sum()),
        tokens=tokens,
        wall_s=wall,
        gpu_hours=float(gpu_hours.sum()),
        gpu_cost_usd=float(gpu_cost.sum()),
        egress_cost_usd=float(egress_cost.sum()),
        cost_usd=cost,
        usd_per_mtok=cost / (tokens / 1e6),
        quality_factor=qf,
        wall_s_adjusted=qf * wall,
        cost_usd_adjusted=qf * cost,
        usd_per_mtok_adjusted=qf * cost / (tokens / 1e6),
        failures=failures,
        bottleneck=Bottleneck(island=inputs[pace].name, link=link, phase=phase),
        regime=regime,
        compute_bound=compute_bound,
        threshold=theta,
        min_inner_steps=min_h,
        min_wan_gbit=None if scale is None else scale * link_gbit,
        wan_gbit=link_gbit,
        hide_wan_gbit=None if hide is None else hide * link_gbit,
    )


def _goodput_weight(loss: Churn, gpus: FloatArray) -> float:
    """GPU-weighted goodput (threshold searches keep the failure losses of the estimate)."""
    return float((loss.goodput * gpus).sum() / gpus.sum())


# --- from a topology file to estimates ----------------------------------------------------


def _estimator() -> tuple[Any, Any, Any]:
    from shardmeter.estimate.plan_arrays import PlanArrays
    from shardmeter.estimate.step import estimate_step, estimate_step_arrays

    return estimate_step, estimate_step_arrays, PlanArrays


def auto_plan_candidates(cluster: Cluster, n_gpus: int, global_batch: int) -> list[Plan]:
    """FSDP (ZeRO-3 over the whole island) and HSDP (sharded within a node, replicated across
    nodes), each with every power-of-two micro-batch dividing the per-GPU batch and each
    recompute level."""
    per_gpu = global_batch // n_gpus
    micro = [m for m in (1, 2, 4, 8, 16, 32, 64, 128) if m <= per_gpu and per_gpu % m == 0]
    groups: list[int | None] = [None]
    gpn = cluster.gpus_per_node
    if n_gpus > gpn and n_gpus % gpn == 0:
        groups.append(gpn)
    return [
        Plan(
            dp=n_gpus,
            sharding="zero3",
            shard_degree=g,
            micro_batch=m,
            global_batch=global_batch,
            recompute=r,
        )
        for g in groups
        for m in micro
        for r in ("none", "selective", "full")
    ]


def auto_plan(
    model: TransformerSpec, cluster: Cluster, global_batch: int, field: str = "plan"
) -> Plan:
    """The default inner plan: among FSDP/HSDP candidates (`auto_plan_candidates`), the one
    that fits memory with the shortest estimated step time (which is usually the largest
    micro-batch without recompute). The planner searches wider."""
    n_gpus = int(cluster.n_gpus or cluster.gpus_per_node)
    if global_batch % n_gpus:
        raise UserInputError(
            field, global_batch, f"the auto plan needs a batch that is a multiple of {n_gpus} GPUs"
        )
    _, estimate_arrays, plan_arrays = _estimator()
    plans = auto_plan_candidates(cluster, n_gpus, global_batch)
    arrays = estimate_arrays(model, cluster, plan_arrays.from_plans(plans))
    fits = np.asarray(arrays.fits, dtype=bool).reshape(-1)
    times = np.where(fits, np.asarray(arrays.step_time_s).reshape(-1), np.inf)
    if not fits.any():
        need = float(np.min(np.asarray(arrays.memory_bytes))) / 1e9
        raise UserInputError(
            field,
            "auto",
            f"no FSDP/HSDP plan fits: needs ≥ {need:.1f} GB per GPU, "
            f"HBM is {cluster.accelerator.hbm_gb:g} GB; add GPUs or use a smaller model",
        )
    return plans[int(np.argmin(times))]


def island_inputs(topo: Topology, model: TransformerSpec) -> list[IslandInput]:
    """Resolve every island's cluster and plan and run the single-island estimator on it; a
    given step time (the island's `step_time_s`, else the run's) replaces the predicted one."""
    estimate_step, _, _ = _estimator()
    out: list[IslandInput] = []
    for i, island in enumerate(topo.islands):
        cluster = resolve_cluster(island, i)
        n_gpus = int(cluster.n_gpus or cluster.gpus_per_node)
        plan = island_plan(island, i)
        batch = island.global_batch or topo.run.global_batch
        if plan is None:
            if batch is None:
                raise UserInputError(
                    f"islands[{i}].global_batch", None, "give it or run.global_batch"
                )
            plan = auto_plan(model, cluster, batch, f"islands[{i}].plan")
        else:
            if island.global_batch is not None and island.global_batch != plan.global_batch:
                raise UserInputError(
                    f"islands[{i}].global_batch",
                    island.global_batch,
                    f"differs from plan.global_batch = {plan.global_batch}",
                )
            try:
                validate_plan(plan, model, n_gpus)
            except UserInputError as exc:
                raise UserInputError(f"islands[{i}].{exc.field}", exc.value, exc.allowed) from None
        step: StepEstimate = estimate_step(model, cluster, plan)
        if not step.fits:
            raise UserInputError(
                f"islands[{i}].plan",
                "out of memory",
                f"needs {step.memory_bytes / 1e9:.1f} GB per GPU, "
                f"HBM is {step.hbm_bytes / 1e9:.1f} GB",
            )
        given = island.step_time_s if island.step_time_s is not None else topo.run.step_time_s
        layers = max(1, model.n_layers // plan.pp)
        base = IslandInput.on(island.name, cluster, plan, step, buckets=layers)
        out.append(
            replace(
                base,
                step=step if given is None else given_step(step, given),
                step_source="predicted" if given is None else "given",
                mtbf_hours=island.mtbf_hours,
            )
        )
    return out


def check_schedule(outer: OuterSpec, model: TransformerSpec) -> None:
    """The fragment schedule covers the model: P at most its layers, or a listed schedule whose
    fragments add up to exactly its layers."""
    layers = model.n_layers
    if isinstance(outer.fragments, int):
        if outer.mode == "streaming" and outer.fragments > layers:
            raise UserInputError(
                "run.fragments", outer.fragments, f"at most the model's {layers} layers"
            )
        return
    total = sum(f.layers for f in outer.fragments)
    if total != layers:
        raise UserInputError(
            "run.fragments",
            f"{len(outer.fragments)} fragment{'s' if len(outer.fragments) > 1 else ''} of "
            f"{total} layers",
            f"must cover the model's {layers} layers exactly",
        )


def run_payload(outer: OuterSpec, model: TransformerSpec) -> Payload:
    """What crosses the WAN in this run (dense bits, or the payload family for this model)."""
    return resolve_payload(outer.payload, outer.dense_bits, model)


def with_run(topo: Topology, **overrides: Any) -> Topology:
    """The topology with run settings replaced (None values are ignored), re-validated."""
    given = {k: v for k, v in overrides.items() if v is not None}
    if not given:
        return topo
    try:
        run = RunSpec.model_validate({**topo.run.model_dump(), **given})
    except ValidationError as exc:
        raise validation_error(exc, "run") from None
    new = topo.model_copy(update={"run": run})
    validate_topology(new)
    return new


def with_step_times(topo: Topology, given: float | str | Mapping[str, float] | None) -> Topology:
    """The topology with given inner step times: one number for every island (the run's
    `step_time_s`), or island name -> seconds, or its text form 'name=seconds,...'."""
    if given is None:
        return topo
    if isinstance(given, str) and "=" not in given:
        try:
            given = float(given)
        except ValueError:
            raise UserInputError("step_time_s", given, "seconds, or name=seconds,...") from None
    if isinstance(given, int | float):
        return with_run(topo, step_time_s=float(given))
    table = parse_settings(given, "step_time_s") if isinstance(given, str) else dict(given)
    names = topo.island_names
    islands = list(topo.islands)
    for name, seconds in table.items():
        if name not in names:
            raise UserInputError("step_time_s", name, f"known islands: {', '.join(names)}")
        k = names.index(name)
        data = {**islands[k].model_dump(exclude_unset=True), "step_time_s": seconds}
        try:
            islands[k] = IslandSpec.model_validate(data)
        except ValidationError as exc:
            raise validation_error(exc, f"islands[{k}]") from None
    return topo.model_copy(update={"islands": islands})


def with_wan(topo: Topology, **overrides: Any) -> Topology:
    """The topology with WAN settings replaced (e.g. `bucket="bandwidth_gbit=10"`), re-validated."""
    given = {k: v for k, v in overrides.items() if v is not None}
    if not given:
        return topo
    try:
        wan = WanSpec.model_validate({**topo.wan.model_dump(by_alias=True), **given})
    except ValidationError as exc:
        raise validation_error(exc, "wan") from None
    new = topo.model_copy(update={"wan": wan})
    validate_topology(new)
    return new


def predict_topology(topology: Topology, **overrides: Any) -> TopologyEstimate:
    """Predict a whole geo-distributed run. `overrides` replace run settings (mode,
    inner_steps, bits, payload, fragments, failures, step_time_s, tokens, ...), e.g.
    `predict_topology(t, mode="async")`; they accept what the topology file accepts."""
    topo = with_run(topology, **overrides)
    model = resolve_model(topo.run)
    est = compose_run(topo, island_inputs(topo, model), model)
    check_payload_memory(est)
    return est


def compose_run(
    topo: Topology,
    inputs: Sequence[IslandInput],
    model: TransformerSpec,
    *,
    run: OuterSpec | None = None,
    wan: WanPaths | None = None,
) -> TopologyEstimate:
    """`compose` with the topology's WAN, run settings and payload (`run`/`wan` replace them:
    sweeps); the fragment schedule is checked against the model first."""
    settings = topo.run if run is None else run
    check_schedule(settings, model)
    return compose(
        inputs,
        wan_paths(topo) if wan is None else wan,
        model.params_total,
        settings,
        topo.run.tokens,
        name=topo.name,
        payload=run_payload(settings, model),
    )


def check_payload_memory(est: TopologyEstimate) -> None:
    """The payload's state (error-feedback residual) must fit next to the step on each GPU."""
    for i, isl in enumerate(est.islands):
        if not isl.fits:
            need = (isl.step.memory_bytes + isl.payload_memory_bytes) / 1e9
            raise UserInputError(
                f"islands[{i}].plan",
                "out of memory",
                f"the step and the {est.payload} error-feedback state need {need:.1f} GB per "
                f"GPU, HBM is {isl.step.hbm_bytes / 1e9:.1f} GB",
            )
