"""Composition of hand-built island steps into a TopologyEstimate: closed forms and properties."""

from __future__ import annotations

import math
from typing import Any

import numpy as np
import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from shardmeter.estimate.islands import IslandInput, compose
from shardmeter.estimate.result import StepEstimate
from shardmeter.estimate.wan import WanPaths, ring_allreduce_s, wan_paths
from shardmeter.specs.topology import OuterSpec, topology_from_dict


def step(seconds: float, tokens: float, n_gpus: int, comm: float = 0.0) -> StepEstimate:
    """A hand-built inner step: `seconds` of which `comm` is exposed data-parallel comm."""
    return StepEstimate(
        step_time_s=seconds,
        time_breakdown={"compute": seconds - comm, "dp_comm": comm},
        memory_breakdown={},
        tokens_per_step=tokens,
        n_gpus=n_gpus,
        tokens_per_s=tokens / seconds,
        tokens_per_s_per_gpu=tokens / seconds / n_gpus,
        mfu=0.4,
        hfu=0.4,
        memory_bytes=1e9,
        hbm_bytes=80e9,
        fits=True,
        bottleneck="compute",
        regime="compute-bound",
    )


def uniform_wan(n: int, bytes_per_s: float, rtt_s: float, usd_per_gb: float = 0.0) -> WanPaths:
    bw = np.full((n, n), bytes_per_s)
    np.fill_diagonal(bw, np.inf)
    rtt = np.full((n, n), rtt_s)
    np.fill_diagonal(rtt, 0.0)
    price = np.full((n, n), usd_per_gb / 1e9)
    np.fill_diagonal(price, 0.0)
    return WanPaths(tuple(f"i{k}" for k in range(n)), bw, rtt, price, tuple(range(n)), 0)


def test_diloco_scaling_law_time_model_is_reproduced() -> None:
    """Charles et al. 2025 (arXiv 2503.09799) App. A: Total = T_comp + T_intra + T_inter with
    T_comp = 6ND/(RQ), T_intra = [(2N/W0)(1 − M/R) + ε0]·T, T_inter = [(2N/W1)(1 − 1/R) + ε1]·T/H
    (design doc B.10). Inner plan: pure DP over R/M chips per replica, no outer-optimizer cost."""
    n_params, tokens, chips, flops = 2e9, 5e10, 64, 4e14
    replicas, w0, w1, eps0, eps1, h = 4, 1e11, 2e9, 2e-4, 0.3, 50
    steps = 1000.0  # T
    per_replica = chips // replicas
    batch = tokens / steps / replicas  # tokens per replica per step
    # Inner step: compute 6N·B/(n·Q) plus a ring all-reduce of the 2N bf16 bytes inside the
    # replica. Our ring is 2(n−1)/n·M/W + 2(n−1)α, theirs (2N/W0)(1 − 1/n) + ε0: W = 2·W0,
    # α = ε0 / (2(n−1)).
    compute = 6 * n_params * batch / (per_replica * flops)
    intra = float(
        ring_allreduce_s(2 * n_params, per_replica, 2 * w0, eps0 / (2 * (per_replica - 1)))
    )
    assert intra == pytest.approx((2 * n_params / w0) * (1 - replicas / chips) + eps0)
    # Outer all-reduce over the M replicas: ours 2(M−1)/M·2N/W + 2(M−1)·RTT/2 (one-way latency
    # per step); theirs a flat ring (2N/W1)(1 − 1/R) + ε1. Same time when
    # W = 2·W1·((M−1)/M)/(1 − 1/R), RTT = ε1/(M−1).
    wan_bw = 2 * w1 * ((replicas - 1) / replicas) / (1 - 1 / chips)
    wan = uniform_wan(replicas, wan_bw, eps1 / (replicas - 1))
    inputs = [
        IslandInput(f"dc{k}", step(compute + intra, batch, per_replica, intra))
        for k in range(replicas)
    ]
    outer = OuterSpec(mode="diloco", inner_steps=h, bits=16)
    est = compose(inputs, wan, int(n_params), outer, tokens)
    t_comp = 6 * n_params * tokens / (chips * flops)
    t_intra = ((2 * n_params / w0) * (1 - replicas / chips) + eps0) * steps
    t_inter = ((2 * n_params / w1) * (1 - 1 / chips) + eps1) * steps / h
    assert est.wall_s == pytest.approx(t_comp + t_intra + t_inter, rel=1e-9)


def test_compute_bound_thresholds_are_tight() -> None:
    inputs = [IslandInput(f"i{k}", step(2.0, 1e6, 8)) for k in range(3)]
    wan = uniform_wan(3, 1e9 / 8, 0.05)
    outer = OuterSpec(mode="diloco", inner_steps=10, bits=8)
    est = compose(inputs, wan, 1_000_000_000, outer, 1e12)
    assert not est.compute_bound and est.regime.startswith("communication-bound (WAN")
    h = est.min_inner_steps
    assert h is not None
    at = compose(inputs, wan, 1_000_000_000, outer.model_copy(update={"inner_steps": h}), 1e12)
    below = compose(
        inputs, wan, 1_000_000_000, outer.model_copy(update={"inner_steps": h - 1}), 1e12
    )
    assert at.utilization >= 0.9 > below.utilization
    assert est.min_wan_gbit is not None
    faster = compose(
        inputs, wan.scaled(est.min_wan_gbit / est.wan_gbit), 1_000_000_000, outer, 1e12
    )
    assert faster.utilization == pytest.approx(0.9, abs=1e-6)
    # four 256-fold narrowings of 18 decades leave a bracket of about 1e-8 (relative)
    slower = compose(
        inputs, wan.scaled(est.min_wan_gbit * (1 - 1e-7) / est.wan_gbit), 1_000_000_000, outer,
        1e12,
    )  # fmt: skip
    assert faster.utilization >= 0.9 > slower.utilization


@pytest.mark.parametrize(("islands", "rtt"), [(2, 0.0), (5, 0.08), (12, 0.2)])
def test_min_h_matches_the_closed_form(islands: int, rtt: float) -> None:
    """Identical islands, blocking DiLoCo: U = H·T/(H·T + AR) ≥ θ ⇔ H ≥ θ/(1 − θ)·AR/T
    (the design doc C.8 rule with the exact ring instead of its large-I bound)."""
    t, n_params, gbit, theta = 4.0, 7e9, 2.0, 0.9
    wan = uniform_wan(islands, gbit * 1e9 / 8, rtt)
    inputs = [IslandInput(f"i{k}", step(t, 1e6, 8)) for k in range(islands)]
    outer = OuterSpec(mode="diloco", inner_steps=1, bits=4, compute_bound_threshold=theta)
    est = compose(inputs, wan, int(n_params), outer, 1e12)
    ar = float(ring_allreduce_s(n_params * 4 / 8, islands, gbit * 1e9 / 8, rtt / 2))  # α = RTT/2
    assert est.min_inner_steps == math.ceil(theta / (1 - theta) * ar / t - 1e-9)


def test_straggler_bound_run_has_no_compute_bound_h() -> None:
    inputs = [IslandInput("fast", step(1.0, 1e6, 8)), IslandInput("slow", step(3.0, 1e6, 8))]
    est = compose(inputs, uniform_wan(2, 1e12, 0.0), 10**9, OuterSpec(inner_steps=100), 1e12)
    assert est.regime == "straggler-bound (waiting for slow)"
    assert est.min_inner_steps is None and est.min_wan_gbit is None
    assert est.bottleneck.island == "slow"


def test_balanced_steps_remove_straggler_wait() -> None:
    inputs = [IslandInput("fast", step(1.0, 1e6, 8)), IslandInput("slow", step(3.0, 1e6, 8))]
    wan = uniform_wan(2, 1e12, 0.0)
    plain = compose(inputs, wan, 10**9, OuterSpec(inner_steps=100), 1e12)
    balanced = compose(inputs, wan, 10**9, OuterSpec(inner_steps=100, balance_steps=True), 1e12)
    assert [i.inner_steps for i in balanced.islands] == [300, 100]
    assert balanced.islands[0].straggler_s == pytest.approx(0.0, abs=1e-9)
    assert plain.islands[0].straggler_s == pytest.approx(200.0)
    assert balanced.tokens_per_s == pytest.approx(2 * plain.tokens_per_s, rel=1e-6)
    assert balanced.compute_bound and not plain.compute_bound


def test_quality_factor_scales_time_and_cost_only_in_adjusted_figures() -> None:
    inputs = [IslandInput(f"i{k}", step(2.0, 1e6, 8), price_per_gpu_hour=2.0) for k in range(2)]
    wan = uniform_wan(2, 1e9, 0.05, usd_per_gb=0.05)
    base = compose(inputs, wan, 10**9, OuterSpec(), 1e11)
    adj = compose(inputs, wan, 10**9, OuterSpec(quality_factor=1.25), 1e11)
    assert adj.wall_s == pytest.approx(base.wall_s)
    assert adj.wall_s_adjusted == pytest.approx(1.25 * base.wall_s)
    assert adj.cost_usd_adjusted == pytest.approx(1.25 * base.cost_usd)
    assert adj.usd_per_mtok_adjusted == pytest.approx(1.25 * base.usd_per_mtok)


# --- properties over random topologies ------------------------------------------------------


@st.composite
def topologies(draw: st.DrawFn) -> tuple[list[IslandInput], WanPaths, int]:
    """A star WAN (server at the hub) or a uniform mesh, with heterogeneous islands."""
    n = draw(st.integers(2, 6))
    names = [f"isl{k}" for k in range(n)]
    star = draw(st.booleans())
    link = st.fixed_dictionaries(
        {
            "bandwidth_gbit": st.floats(0.1, 400.0),
            "latency_ms": st.floats(1.0, 300.0),
            "egress_usd_per_gb": st.floats(0.0, 0.12),
        }
    )
    if star:
        wan: dict[str, Any] = {
            "kind": "star",
            "hub": names[0],
            "links": [{"from": name, "to": names[0], **draw(link)} for name in names[1:]],
        }
    else:
        wan = {"kind": "mesh", "default": draw(link)}
    data = {
        "islands": [{"name": name, "cluster": "dgx-h100"} for name in names],
        "wan": wan,
    }
    paths = wan_paths(topology_from_dict(data))
    inputs = [
        IslandInput(
            name,
            step(
                draw(st.floats(0.05, 30.0)),
                draw(st.floats(1e4, 4e6)),
                draw(st.sampled_from([1, 8, 16, 64])),
            ),
            price_per_gpu_hour=draw(st.floats(0.0, 5.0)),
            hbm_Bps=draw(st.floats(1.5e12, 5e12)),
        )
        for name in names
    ]
    n_params = draw(st.integers(10**8, 7 * 10**10))
    return inputs, paths, n_params


outer_specs = st.builds(
    OuterSpec,
    mode=st.sampled_from(["sync", "diloco", "streaming", "async"]),
    inner_steps=st.sampled_from([4, 8, 16, 64, 128, 512]),
    bits=st.sampled_from([32, 16, 8, 4]),
    outer_overlap=st.booleans(),
    fragments=st.sampled_from([1, 2, 4]),
    overlap_steps=st.integers(0, 1),
    reduce=st.sampled_from(["ring", "hub"]),
    balance_steps=st.booleans(),
)

PROPS = settings(max_examples=40, deadline=None, suppress_health_check=[HealthCheck.too_slow])


@pytest.mark.slow
@PROPS
@given(topologies(), outer_specs, st.floats(1.01, 100.0), st.integers(2, 8))
def test_more_bandwidth_or_larger_h_never_lowers_utilization(
    topo: tuple[list[IslandInput], WanPaths, int], outer: OuterSpec, faster: float, more: int
) -> None:
    inputs, wan, n_params = topo
    base = compose(inputs, wan, n_params, outer, 1e12)
    wider = compose(inputs, wan.scaled(faster), n_params, outer, 1e12)
    longer = compose(
        inputs,
        wan,
        n_params,
        outer.model_copy(update={"inner_steps": outer.inner_steps * more}),
        1e12,
    )
    assert wider.utilization >= base.utilization - 1e-12
    assert longer.utilization >= base.utilization - 1e-12


@pytest.mark.slow
@PROPS
@given(topologies(), st.sampled_from([2, 4, 16, 100, 500]), st.sampled_from([16, 8, 4]))
def test_async_beats_diloco_beats_sync_dp(
    topo: tuple[list[IslandInput], WanPaths, int], h: int, bits: int
) -> None:
    """Same hardware, same WAN: async (PS at the hub) ≥ blocking DiLoCo ≥ sync DP in tokens/s,
    for H ≥ 2 and pseudo-gradients no wider than the bf16 gradients of sync DP. Async pulls θ
    in fp32 (HeLoCo's dispatch), so it is set against DiLoCo exchanging fp32 both ways."""
    inputs, wan, n_params = topo
    d32 = compose(inputs, wan, n_params, OuterSpec(mode="diloco", inner_steps=h, bits=32), 1e12)
    sync = compose(inputs, wan, n_params, OuterSpec(mode="sync"), 1e12)
    diloco = compose(
        inputs, wan, n_params, OuterSpec(mode="diloco", inner_steps=h, bits=bits), 1e12
    )
    asyn = compose(inputs, wan, n_params, OuterSpec(mode="async", inner_steps=h, bits=bits), 1e12)
    assert diloco.tokens_per_s >= sync.tokens_per_s * (1 - 1e-9)
    assert asyn.tokens_per_s >= d32.tokens_per_s * (1 - 1e-9)


@pytest.mark.slow
@PROPS
@given(topologies(), outer_specs)
def test_cost_is_gpu_hours_times_price_plus_egress_and_time_adds_up(
    topo: tuple[list[IslandInput], WanPaths, int], outer: OuterSpec
) -> None:
    inputs, wan, n_params = topo
    est = compose(inputs, wan, n_params, outer, 1e12)
    gpu = sum(i.step.n_gpus * i.price_per_gpu_hour * est.wall_s / 3600 for i in inputs)
    egress = 0.0
    for isl in est.islands:
        rounds = est.wall_s / isl.round_s
        k = wan.names.index(isl.name)
        if outer.mode != "async" and outer.reduce == "ring":
            peer = wan.ring[(wan.ring.index(k) + 1) % wan.n]
        else:
            peer = wan.center
        egress += isl.wan_bytes_per_round * rounds * wan.egress_usd_per_byte[k, peer]
    assert est.gpu_hours == pytest.approx(sum(i.step.n_gpus for i in inputs) * est.wall_s / 3600)
    assert est.cost_usd == pytest.approx(gpu + egress, rel=1e-9)
    assert est.wall_s == pytest.approx(1e12 / est.tokens_per_s)
    assert sum(est.time_shares.values()) == pytest.approx(1.0)
    for isl in est.islands:
        parts = isl.busy_s + isl.straggler_s + isl.wan_exposed_s + isl.outer_opt_s
        assert parts == pytest.approx(isl.round_s, rel=1e-9)


@pytest.mark.slow
@PROPS
@given(topologies(), outer_specs)
def test_stragglers_wait_in_sync_modes_and_never_in_async(
    topo: tuple[list[IslandInput], WanPaths, int], outer: OuterSpec
) -> None:
    inputs, wan, n_params = topo
    est = compose(inputs, wan, n_params, outer, 1e12)
    times = [i.step.step_time_s for i in inputs]
    if outer.mode == "async":
        assert all(isl.straggler_s == 0.0 for isl in est.islands)
        return
    slowest = max(times)
    if outer.balance_steps and outer.mode != "sync":
        # faster islands fill the slowest island's H steps: less than one of their steps idles
        opt_max = max(isl.outer_opt_s for isl in est.islands)
        for isl, t in zip(est.islands, times, strict=True):
            slack = opt_max - isl.outer_opt_s + est.round_s * 1e-9
            assert isl.straggler_s <= t * (1 + 1e-9) + slack
        return
    for isl, t in zip(est.islands, times, strict=True):
        if t < slowest * (1 - 1e-9):
            assert isl.straggler_s > 0
    if len(set(times)) > 1:
        assert est.time_shares["straggler wait"] > 0


def test_step_estimate_reports_the_backward_window() -> None:
    """The window a bucketed gradient exchange can hide behind: the last micro-batch's backward
    (about twice its forward), so less than the step and more than half its compute."""
    from shardmeter.estimate.step import estimate_step
    from shardmeter.predict import resolve_cluster, resolve_model
    from shardmeter.specs.plan import Plan

    model, cluster = resolve_model("llama-3.1-8b"), resolve_cluster("dgx-h100")
    one = estimate_step(model, cluster, Plan(dp=8, sharding="zero3", global_batch=8))
    four = estimate_step(model, cluster, Plan(dp=8, sharding="zero3", global_batch=32))
    assert 0.5 * one.time_breakdown["compute"] < one.backward_window_s < one.step_time_s
    assert four.backward_window_s == pytest.approx(one.backward_window_s, rel=1e-9)


@settings(max_examples=200, deadline=None)
@given(n=st.integers(1, 600), first=st.integers(0, 599))
def test_first_true_bisects_to_the_first_point_of_a_monotone_predicate(n: int, first: int) -> None:
    """`_first_true` finds what a pass over the whole grid finds, in at most ⌈log2 n⌉ + 1 calls
    of one point each."""
    from shardmeter.estimate.islands import _first_true

    first = min(first, n - 1)
    grid = np.arange(n, dtype=np.float64)
    calls: list[int] = []

    def ok_at(x: Any) -> np.ndarray:
        calls.append(len(x))
        return np.asarray(x >= first)

    assert _first_true(grid, ok_at) == int(np.argmax(grid >= first)) == first
    assert set(calls) <= {1} and len(calls) <= math.ceil(math.log2(n)) + 1
