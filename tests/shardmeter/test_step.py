"""Step composition: bubble, exposure, vectorized vs scalar, verdicts and validation."""

from __future__ import annotations

import numpy as np
import pytest

from shardmeter.errors import UserInputError
from shardmeter.estimate.plan_arrays import PlanArrays
from shardmeter.estimate.result import MEMORY_COMPONENTS, TIME_COMPONENTS
from shardmeter.estimate.step import (
    estimate_step,
    estimate_step_arrays,
    pipeline_bubble_fraction,
    plan_validity,
)
from shardmeter.specs.hardware import Accelerator, Cluster, Efficiency, Link
from shardmeter.specs.model import TransformerSpec
from shardmeter.specs.plan import Plan, validate_plan

LLAMA = TransformerSpec(
    name="llama-ish", n_layers=32, hidden=4096, n_heads=32, n_kv_heads=8, ffn=14336,
    mlp="swiglu", vocab=128256, seq_len=8192,
)  # fmt: skip
CLUSTER = Cluster(
    name="test",
    accelerator=Accelerator(
        name="g",
        peak_tflops={"bf16": 1000.0, "fp8": 2000.0},
        hbm_gb=80,
        hbm_gbps=3000,
        efficiency=Efficiency(matmul_max=0.7, matmul_half_gflop=2.0),
    ),
    gpus_per_node=8,
    nvlink_domain=8,
    intra=Link(name="nvlink", bandwidth_gbps=450, latency_us=3),
    inter=Link(name="ib", bandwidth_gbps=50, latency_us=5),
)


def test_bubble_fractions() -> None:
    assert float(pipeline_bubble_fraction(4, 1, 8)) == pytest.approx(3 / 8)
    assert float(pipeline_bubble_fraction(4, 2, 8)) == pytest.approx(3 / 16)
    assert float(pipeline_bubble_fraction(1, 1, 8)) == 0.0


def test_bubble_in_step_is_fraction_of_stage_work() -> None:
    """With no TP/DP/CP and even stages of 8 layers the bubble is (Σ_s t_s − max_s t_s)/v:
    three stages' layer work over v = 2 (the slowest, last stage also runs the logits)."""
    from shardmeter.estimate.compute import unit_costs

    plan = Plan(pp=4, vpp=2, dp=1, micro_batch=1, global_batch=16, overlap_dp=True)
    est = estimate_step(LLAMA, CLUSTER, plan)
    units = unit_costs(LLAMA, PlanArrays.scalar(plan), CLUSTER.accelerator)
    stage = 8 * units.layer_s
    assert est.time_breakdown["compute"] == pytest.approx(16 * (stage + units.head_s))
    assert est.time_breakdown["bubble"] == pytest.approx((3 * stage + units.embed_s) / 2)


def test_step_is_sum_of_components_and_rates() -> None:
    plan = Plan(dp=8, sharding="zero3", micro_batch=1, global_batch=16, recompute="selective")
    est = estimate_step(LLAMA, CLUSTER, plan)
    assert set(est.time_breakdown) == set(TIME_COMPONENTS)
    assert set(est.memory_breakdown) == set(MEMORY_COMPONENTS)
    assert est.step_time_s == pytest.approx(sum(est.time_breakdown.values()))
    assert est.tokens_per_step == 16 * 8192
    assert est.tokens_per_s_per_gpu == pytest.approx(16 * 8192 / est.step_time_s / 8)
    assert 0 < est.mfu < est.hfu <= 1
    assert est.regime in ("compute-bound", "communication-bound (nvlink)")


def test_slow_network_is_communication_bound_on_nic() -> None:
    slow = CLUSTER.model_copy(update={"inter": Link(name="tcp-1g", bandwidth_gbps=0.125)})
    plan = Plan(dp=64, sharding="zero3", micro_batch=1, global_batch=64)
    est = estimate_step(LLAMA, slow, plan)
    assert est.regime == "communication-bound (tcp-1g)"
    assert est.bottleneck in ("fsdp_comm", "dp_comm")


def test_no_overlap_exposes_more() -> None:
    base = Plan(dp=16, micro_batch=1, global_batch=16)
    over = estimate_step(LLAMA, CLUSTER, base)
    bare = estimate_step(LLAMA, CLUSTER, base.model_copy(update={"overlap_dp": False}))
    assert bare.time_breakdown["dp_comm"] > over.time_breakdown["dp_comm"]


def test_oom_verdict() -> None:
    plan = Plan(dp=1, micro_batch=4, global_batch=4)
    est = estimate_step(LLAMA, CLUSTER, plan)
    assert not est.fits
    assert est.memory_headroom_bytes < 0


def test_vectorized_matches_scalar_on_random_plans() -> None:
    rng = np.random.default_rng(0)
    plans = []
    while len(plans) < 40:
        tp, pp, cp = (int(rng.choice(c)) for c in ([1, 2, 4, 8], [1, 2, 4], [1, 2]))
        dp = int(rng.choice([1, 2, 4, 8, 16]))
        vpp = int(rng.choice([1, 2])) if pp > 1 else 1
        mb = int(rng.choice([1, 2]))
        sharding = str(rng.choice(["none", "zero1", "zero2", "zero3"]))
        plan = Plan(
            dp=dp, tp=tp, pp=pp, cp=cp, vpp=vpp, sp=bool(rng.integers(2)), sharding=sharding,
            micro_batch=mb, global_batch=dp * mb * pp * int(rng.choice([1, 2, 4])),
            recompute=str(rng.choice(["none", "selective", "full"])),
            precision=str(rng.choice(["bf16", "fp16", "fp8"])),
            overlap_dp=bool(rng.integers(2)), overlap_tp=bool(rng.integers(2)),
        )  # fmt: skip
        if bool(plan_validity(LLAMA, PlanArrays.from_plan(plan))[0]):
            plans.append(plan)
    arrays = estimate_step_arrays(LLAMA, CLUSTER, PlanArrays.from_plans(plans))
    for i, plan in enumerate(plans):
        one = estimate_step(LLAMA, CLUSTER, plan)
        assert arrays.step_time_s[i] == pytest.approx(one.step_time_s, rel=1e-12)
        assert arrays.memory_bytes[i] == pytest.approx(one.memory_bytes, rel=1e-12)
        for k in TIME_COMPONENTS:
            assert arrays.time[k][i] == pytest.approx(one.time_breakdown[k], rel=1e-12, abs=1e-15)


def test_many_plans_one_call() -> None:
    n = 100_000
    rng = np.random.default_rng(1)
    plans = PlanArrays.from_columns(
        dp=rng.choice([1, 2, 4, 8], n), tp=rng.choice([1, 2, 4, 8], n), pp=rng.choice([1, 2, 4], n),
        micro_batch=1, global_batch=64, sharding=rng.integers(0, 4, n), shard_group=1,
    )  # fmt: skip
    out = estimate_step_arrays(LLAMA, CLUSTER, plans)
    assert out.step_time_s.shape == (n,)
    assert np.all(np.isfinite(out.step_time_s)) and np.all(out.step_time_s > 0)


def test_invalid_plan_raises_user_error() -> None:
    with pytest.raises(UserInputError, match=r"plan\.tp"):
        estimate_step(LLAMA, CLUSTER, Plan(tp=3))
    uneven = Plan(pp=3, global_batch=3)
    with pytest.raises(UserInputError):
        estimate_step(LLAMA, CLUSTER, uneven)
    est = estimate_step(
        LLAMA, CLUSTER, uneven, check_layers=False
    )  # 11 layers on the fullest stage
    assert est.step_time_s > 0


def test_plan_validity_agrees_with_validate_plan() -> None:
    plans = [Plan(tp=3), Plan(pp=3), Plan(vpp=2), Plan(dp=2, global_batch=3), Plan(cp=2)]
    mask = plan_validity(LLAMA, PlanArrays.from_plans(plans))
    assert mask.tolist() == [False, False, False, False, True]
    grouped = [
        Plan(pp=2, vpp=2, global_batch=8, vpp_group=4),  # N = 4 divides m = 8
        Plan(pp=2, vpp=2, global_batch=6, vpp_group=4),  # m = 6 is not whole groups
        Plan(pp=2, vpp=2, global_batch=8, vpp_group=1),  # N < p stalls the pipeline
        Plan(pp=2, global_batch=8, vpp_group=2),  # N without interleaving
    ]
    mask = plan_validity(LLAMA, PlanArrays.from_plans(grouped))
    assert mask.tolist() == [True, False, False, False]
    for plan, field in zip(grouped[1:], ("global_batch", "vpp_group", "vpp_group"), strict=True):
        with pytest.raises(UserInputError, match=rf"plan\.{field}"):
            validate_plan(plan, LLAMA)


def test_plan_arrays_default_shard_group_is_dp_when_sharded() -> None:
    cols = PlanArrays.from_columns(dp=np.array([4, 4, 8]), sharding=np.array([0, 3, 1]))
    assert cols.shard_group.tolist() == [1, 4, 8]
    plans = [Plan(dp=4), Plan(dp=4, sharding="zero3"), Plan(dp=8, sharding="zero1")]
    assert PlanArrays.from_plans(plans).shard_group.tolist() == [1, 4, 8]


def _llama405_short() -> TransformerSpec:
    return TransformerSpec(
        name="llama-405b-2k", n_layers=126, hidden=16384, n_heads=128, n_kv_heads=8,
        ffn=53248, mlp="swiglu", vocab=128256, seq_len=2048,
    )  # fmt: skip


def test_context_parallel_does_not_pay_at_short_sequences() -> None:
    """405B at seq 2048 on 16k H100s: with the other degrees fixed (tp 8, pp 9, global batch
    constant), moving GPUs from dp into cp does not pay: ring attention runs cp tiny block
    kernels per layer and its K/V ring crosses nodes (tp·cp > 8)."""
    from shardmeter.specs.loader import load_cluster

    model, cluster = _llama405_short(), load_cluster("dgx-h100")
    rates = {}
    for cp in (1, 2, 4, 16):
        plan = Plan(
            dp=16128 // (8 * 9 * cp), tp=8, pp=9, cp=cp, sp=True, sharding="zero1",
            global_batch=224 * 64, overlap_tp=True,
        )  # fmt: skip
        rates[cp] = estimate_step(model, cluster, plan).tokens_per_s_per_gpu
    # cp 2 doubles the micro-batches per pipeline (dp halves), which shrinks the 1F1B bubble
    # enough to break even; beyond that the tiny kernels and the ring lose.
    assert rates[2] < 1.03 * rates[1]
    assert rates[1] > rates[4] > rates[16]
    assert rates[16] < 0.5 * rates[1]


def test_context_parallel_ring_crosses_nodes_when_tp_cp_exceeds_domain() -> None:
    """tp 4 · cp 4 = 16 > 8 GPUs per NVLink domain: the K/V ring pays the NIC, so the same
    plan's cp communication is slower than with tp 2 · cp 4 = 8 inside one node."""
    from shardmeter.estimate.comm import ring_hop_time
    from shardmeter.specs.loader import load_cluster

    cluster = load_cluster("dgx-h100")
    inside = ring_hop_time(1e6, 4, 2, cluster)
    across = ring_hop_time(1e6, 4, 4, cluster)
    assert across > 3.0 * inside


def test_plan_arrays_shape_is_broadcast_of_all_columns() -> None:
    """A (K, 1) column with (1, R) columns gives a (K, R) grid; take() indexes that grid."""
    base = PlanArrays.from_columns(dp=np.array([8]), tp=np.array([1]), global_batch=64)
    grid = PlanArrays(**{**base.__dict__, "dp": np.array([[8], [16]]), "tp": np.array([[1, 2, 4]])})
    assert grid.shape == (2, 3)
    one = grid.take(5)
    assert (int(one.dp[0]), int(one.tp[0])) == (16, 4)
