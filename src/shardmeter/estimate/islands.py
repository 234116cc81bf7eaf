"""Compose per-island inner-step estimates into a whole-topology estimate.

`compose` is a pure function of per-island `StepEstimate`s, the resolved WAN and the outer
settings: per-island and total throughput, compute utilization, WAN bytes, wall-clock to the
token budget, cost, the bottleneck and the regime, and the smallest H / WAN bandwidth at which
the run is compute-bound (utilization ≥ threshold). `predict_topology` runs the single-island
estimator on each island (explicit plan, or an "auto" FSDP/HSDP plan) and then composes.
"""

from __future__ import annotations

import math
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from typing import Any

import numpy as np
from pydantic import ValidationError

from shardmeter.errors import UserInputError
from shardmeter.estimate.outer import (
    FloatArray,
    OuterRound,
    WanPaths,
    egress_usd_per_byte,
    outer_opt_seconds,
    outer_round,
)
from shardmeter.estimate.result import StepEstimate
from shardmeter.specs.hardware import Cluster
from shardmeter.specs.model import TransformerSpec
from shardmeter.specs.plan import Plan, validate_plan
from shardmeter.specs.topology import (
    GBIT,
    OuterSpec,
    RunSpec,
    Topology,
    island_plan,
    resolve_cluster,
    resolve_model,
    validate_topology,
    validation_error,
    wan_paths,
)

PHASES: tuple[str, ...] = ("straggler wait", "WAN exchange", "outer optimizer")


@dataclass(frozen=True)
class IslandInput:
    """What composition needs from one island: its inner step and its prices."""

    name: str
    step: StepEstimate
    price_per_gpu_hour: float = 0.0
    hbm_Bps: float = math.inf  # achieved HBM bandwidth per GPU (outer-optimizer step)
    accelerator: str = ""
    plan: Plan | None = None

    @classmethod
    def on(cls, name: str, cluster: Cluster, plan: Plan, step: StepEstimate) -> IslandInput:
        """The island `name` running `plan` on `cluster` (prices and HBM from the cluster)."""
        return cls(
            name=name,
            step=step,
            price_per_gpu_hour=cluster.price_per_gpu_hour,
            hbm_Bps=cluster.accelerator.hbm_bytes_per_s,
            accelerator=cluster.accelerator.name,
            plan=plan,
        )


@dataclass(frozen=True)
class IslandEstimate:
    """One island inside the topology. Per-round times are seconds per outer round."""

    name: str
    accelerator: str
    n_gpus: int
    plan: Plan | None
    step: StepEstimate  # the island's inner step on its own
    inner_steps: float  # per round (1 for sync DP; H_i with balance_steps)
    round_s: float
    busy_s: float
    straggler_s: float
    wan_exposed_s: float
    outer_opt_s: float
    tokens_per_s: float
    tokens_per_s_per_gpu: float
    utilization: float  # inner-step time / wall time
    mfu: float  # inner MFU × utilization
    staleness: float
    wan_bytes_per_round: float
    wan_bytes_total: float
    gpu_hours: float
    gpu_cost_usd: float
    egress_cost_usd: float
    price_per_gpu_hour: float


@dataclass(frozen=True)
class Bottleneck:
    """Where the time goes: the pacing island, the slowest WAN link, the largest loss."""

    island: str
    link: str
    phase: str


@dataclass(frozen=True)
class TopologyEstimate:
    """A whole run across islands. Quality-neutral figures plus quality-adjusted time and cost."""

    name: str
    mode: str
    settings: OuterSpec
    n_params: int
    islands: tuple[IslandEstimate, ...]
    n_gpus: int
    tokens_per_s: float
    tokens_per_s_per_gpu: float
    utilization: float  # GPU-weighted mean of island utilizations
    time_shares: dict[str, float]  # GPU-weighted share of wall time: compute + PHASES
    round_s: float  # slowest island's round
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
    bottleneck: Bottleneck
    regime: str
    compute_bound: bool
    threshold: float
    min_inner_steps: int | None  # smallest H with utilization ≥ threshold (None: unreachable)
    min_wan_gbit: float | None  # bottleneck-link Gbit/s with utilization ≥ threshold
    wan_gbit: float  # current bottleneck-link Gbit/s
    hide_wan_gbit: float | None  # bandwidth at which the exchange fits its overlap window


def _round(
    inputs: Sequence[IslandInput],
    wan: WanPaths,
    n_params: int,
    outer: OuterSpec,
    *,
    inner_steps: Any = None,
    bandwidth_scale: Any = 1.0,
) -> OuterRound:
    inner = np.array([isl.step.step_time_s for isl in inputs])
    gpus = np.array([isl.step.n_gpus for isl in inputs], dtype=np.float64)
    hbm = np.array([isl.hbm_Bps for isl in inputs])
    opt = outer_opt_seconds(n_params, gpus, hbm)  # per round: P fragment steps of N/P each
    return outer_round(
        outer.mode,
        inner,
        wan,
        n_params,
        inner_steps=outer.inner_steps if inner_steps is None else inner_steps,
        bits=outer.bits,
        grad_bits=outer.grad_bits,
        outer_opt_s=opt,
        reduce=outer.reduce,
        overlap=outer.outer_overlap,
        fragments=outer.fragments,
        overlap_steps=outer.overlap_steps,
        bandwidth_scale=bandwidth_scale,
        balance=outer.balance_steps,
    )


def weighted_utilization(rnd: OuterRound, n_gpus: FloatArray) -> FloatArray:
    """GPU-weighted mean utilization over the island axis."""
    return (rnd.utilization * n_gpus).sum(axis=-1) / n_gpus.sum()


def _bottleneck_gbit(wan: WanPaths, outer: OuterSpec) -> tuple[float, str]:
    """The WAN path that limits this mode, as (Gbit/s, 'a↔b')."""
    if wan.n < 2:
        return math.inf, "none (one island)"
    if outer.mode != "async" and outer.reduce == "ring":
        bw, _, (a, b) = wan.ring_bottleneck()
        return bw / GBIT, wan.path_name(a, b)
    c = wan.center
    col = np.where(np.arange(wan.n) == c, np.inf, wan.bandwidth_Bps[:, c])
    i = int(np.argmin(col))
    return float(col[i]) / GBIT, wan.path_name(i, c)


def _min_inner_steps(util: Callable[[Any], FloatArray], outer: OuterSpec) -> int | None:
    """Smallest H (a multiple of P, ≥ P·τ for Streaming) with utilization ≥ threshold: one
    vectorized pass over a geometric grid up to 1e7, then every multiple in the bracket."""
    if outer.mode == "sync":
        return None
    step = outer.fragments if outer.mode == "streaming" else 1
    lo = max(1, math.ceil(max(1, outer.overlap_steps * step) / step))
    hi = 10**7 // step
    theta = outer.compute_bound_threshold
    coarse = np.unique(np.round(np.geomspace(lo, hi, 400)).astype(np.int64))
    ok = util((coarse * step).astype(np.float64)) >= theta
    if not ok.any():
        return None
    k = int(np.argmax(ok))
    if k == 0:
        return int(coarse[0]) * step
    fine = np.arange(coarse[k - 1] + 1, coarse[k] + 1, dtype=np.int64)
    fine_ok = util((fine * step).astype(np.float64)) >= theta
    return int(fine[int(np.argmax(fine_ok))]) * step


def _min_scale(util: Callable[[Any], FloatArray], theta: float) -> float | None:
    """Smallest WAN bandwidth multiplier (1e-9 .. 1e9) with utilization ≥ theta: four
    vectorized passes, each narrowing the bracket 256-fold (log scale)."""
    lo, hi = -9.0, 9.0
    for rep in range(4):
        grid = np.linspace(lo, hi, 257)
        ok = util(10.0**grid) >= theta
        if rep == 0 and not ok[-1]:
            return None
        if rep == 0 and ok[0]:
            return float(10.0**lo)
        k = int(np.argmax(ok))
        lo, hi = float(grid[k - 1]), float(grid[k])
    return float(10.0**hi)


def compose(
    inputs: Sequence[IslandInput],
    wan: WanPaths,
    n_params: int,
    outer: OuterSpec,
    tokens: float,
    *,
    name: str = "topology",
) -> TopologyEstimate:
    """Per-island inner steps + WAN + outer mode -> the whole run (design doc C.9, C.10)."""
    if len(inputs) != wan.n:
        raise ValueError(f"{len(inputs)} islands but a WAN of {wan.n}")
    rnd = _round(inputs, wan, n_params, outer)
    gpus = np.array([isl.step.n_gpus for isl in inputs], dtype=np.float64)
    tokens_step = np.array([isl.step.tokens_per_step for isl in inputs])
    h = rnd.inner_steps
    island_tps = rnd.tokens_per_s(tokens_step)
    total_tps = float(island_tps.sum())
    wall = tokens / total_tps  # T_wall = D / throughput (design doc C.10)
    price = np.array([isl.price_per_gpu_hour for isl in inputs])
    gpu_hours = gpus * wall / 3600.0
    egress_rate = egress_usd_per_byte(wan, outer.mode, outer.reduce)
    wan_total = rnd.wan_bytes * wall / rnd.round_s
    gpu_cost = gpu_hours * price  # Cost = Σ n_i·price_i·T_wall + egress·WAN bytes (C.10)
    egress_cost = wan_total * egress_rate
    util = rnd.utilization
    u_total = float((util * gpus).sum() / gpus.sum())
    shares = {
        "compute": u_total,
        "straggler wait": float((rnd.straggler_s / rnd.round_s * gpus).sum() / gpus.sum()),
        "WAN exchange": float((rnd.wan_exposed_s / rnd.round_s * gpus).sum() / gpus.sum()),
        "outer optimizer": float((rnd.outer_opt_s / rnd.round_s * gpus).sum() / gpus.sum()),
    }
    theta = outer.compute_bound_threshold
    compute_bound = u_total >= theta
    link_gbit, link = _bottleneck_gbit(wan, outer)
    inner = np.array([isl.step.step_time_s for isl in inputs])
    if outer.mode == "async":
        pace = int(np.argmin(util)) if not compute_bound else int(np.argmin(island_tps / gpus))
    else:
        pace = int(np.argmax(inner))
    loss = max(PHASES, key=lambda k: shares[k])
    phase = f"inner step: {inputs[pace].step.bottleneck}" if compute_bound else loss
    if compute_bound:
        regime = "compute-bound"
    elif loss == "straggler wait":
        regime = f"straggler-bound (waiting for {inputs[pace].name})"
    elif loss == "WAN exchange":
        regime = f"communication-bound (WAN {link})"
    else:
        regime = "outer-optimizer-bound"

    def util_h(h_val: Any) -> FloatArray:
        return weighted_utilization(_round(inputs, wan, n_params, outer, inner_steps=h_val), gpus)

    def util_bw(scale: Any) -> FloatArray:
        r = _round(inputs, wan, n_params, outer, bandwidth_scale=scale)
        return weighted_utilization(r, gpus)

    min_h = _min_inner_steps(util_h, outer)
    scale = _min_scale(util_bw, theta) if wan.n > 1 else None
    min_gbit = None if scale is None or not math.isfinite(link_gbit) else scale * link_gbit
    finite_hide = rnd.hide_Bps[np.isfinite(rnd.hide_Bps) & (rnd.hide_Bps > 0)]
    hide = float(finite_hide.max()) / GBIT if finite_hide.size else None
    islands = tuple(
        IslandEstimate(
            name=isl.name,
            accelerator=isl.accelerator,
            n_gpus=int(isl.step.n_gpus),
            plan=isl.plan,
            step=isl.step,
            inner_steps=float(h[i]),
            round_s=float(rnd.round_s[i]),
            busy_s=float(rnd.busy_s[i]),
            straggler_s=float(rnd.straggler_s[i]),
            wan_exposed_s=float(rnd.wan_exposed_s[i]),
            outer_opt_s=float(rnd.outer_opt_s[i]),
            tokens_per_s=float(island_tps[i]),
            tokens_per_s_per_gpu=float(island_tps[i] / gpus[i]),
            utilization=float(util[i]),
            mfu=float(isl.step.mfu * util[i]),
            staleness=float(rnd.staleness[i]),
            wan_bytes_per_round=float(rnd.wan_bytes[i]),
            wan_bytes_total=float(wan_total[i]),
            gpu_hours=float(gpu_hours[i]),
            gpu_cost_usd=float(gpu_cost[i]),
            egress_cost_usd=float(egress_cost[i]),
            price_per_gpu_hour=float(price[i]),
        )
        for i, isl in enumerate(inputs)
    )
    cost = float(gpu_cost.sum() + egress_cost.sum())
    qf = outer.quality_factor
    return TopologyEstimate(
        name=name,
        mode=outer.mode,
        settings=outer,
        n_params=int(n_params),
        islands=islands,
        n_gpus=int(gpus.sum()),
        tokens_per_s=total_tps,
        tokens_per_s_per_gpu=total_tps / float(gpus.sum()),
        utilization=u_total,
        time_shares=shares,
        round_s=float(rnd.round_s.max()),
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
        bottleneck=Bottleneck(island=inputs[pace].name, link=link, phase=phase),
        regime=regime,
        compute_bound=compute_bound,
        threshold=theta,
        min_inner_steps=min_h,
        min_wan_gbit=min_gbit,
        wan_gbit=link_gbit,
        hide_wan_gbit=hide,
    )


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
    """Resolve every island's cluster and plan and run the single-island estimator on it."""
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
        out.append(IslandInput.on(island.name, cluster, plan, step))
    return out


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


def predict_topology(topology: Topology, **overrides: Any) -> TopologyEstimate:
    """Predict a whole geo-distributed run. `overrides` replace run settings (mode,
    inner_steps, bits, tokens, quality_factor, ...), e.g. `predict_topology(t, mode="async")`."""
    topo = with_run(topology, **overrides)
    model = resolve_model(topo.run)
    inputs = island_inputs(topo, model)
    return compose(
        inputs, wan_paths(topo), model.params_total, topo.run, topo.run.tokens, name=topo.name
    )
