"""Property tests over valid plans: monotone in bandwidth, MFU ≤ 1, sharding never costs
memory, and any bad input is a UserInputError."""

from __future__ import annotations

import itertools
from typing import Any

import hypothesis.strategies as st
import numpy as np
from hypothesis import HealthCheck, given, settings

from shardmeter.errors import UserInputError
from shardmeter.estimate.plan_arrays import PlanArrays
from shardmeter.estimate.step import estimate_step, estimate_step_arrays
from shardmeter.specs.hardware import Accelerator, Cluster, Efficiency, Link
from shardmeter.specs.model import MoESpec, TransformerSpec
from shardmeter.specs.plan import Plan

MODELS = [
    TransformerSpec(
        n_layers=16, hidden=2048, n_heads=16, n_kv_heads=4, ffn=5632, mlp="swiglu",
        vocab=32000, seq_len=4096,
    ),
    TransformerSpec(n_layers=24, hidden=3072, n_heads=24, ffn=12288, vocab=50257, seq_len=2048),
    TransformerSpec(
        n_layers=8, hidden=1024, n_heads=16, ffn=2048, mlp="swiglu", vocab=32000, seq_len=2048,
        moe=MoESpec(experts=8, top_k=2, shared_experts=1, dense_layers=2),
    ),
]  # fmt: skip


def _cluster(intra_gbps: float = 450.0, inter_gbps: float = 50.0, domain: int = 8) -> Cluster:
    return Cluster(
        accelerator=Accelerator(
            name="g",
            peak_tflops={"bf16": 1000.0, "fp8": 2000.0},
            hbm_gb=80,
            hbm_gbps=3000,
            efficiency=Efficiency(matmul_max=0.95, matmul_half_gflop=0.5, fp8_speedup=1.9),
        ),
        gpus_per_node=8,
        nvlink_domain=domain,
        intra=Link(name="nvlink", bandwidth_gbps=intra_gbps),
        inter=Link(name="ib", bandwidth_gbps=inter_gbps),
    )


@st.composite
def valid_case(draw: Any) -> tuple[TransformerSpec, Plan]:
    model = draw(st.sampled_from(MODELS))
    tp = draw(st.sampled_from([t for t in (1, 2, 4, 8) if model.n_heads % t == 0]))
    pp = draw(st.sampled_from([p for p in (1, 2, 4) if model.n_layers % p == 0]))
    vpps = [v for v in (1, 2) if model.n_layers % (pp * v) == 0 and (v == 1 or pp > 1)]
    vpp = draw(st.sampled_from(vpps))
    cp = draw(st.sampled_from([1, 2]))
    dp = draw(st.sampled_from([1, 2, 4, 8, 16]))
    ep = draw(st.sampled_from([e for e in (1, 2, 8) if dp % e == 0])) if model.moe else 1
    mb = draw(st.integers(1, 4))
    accum = draw(st.integers(1, 4)) * (pp if vpp > 1 else 1)
    sharding = draw(st.sampled_from(["none", "zero1", "zero2", "zero3"]))
    return model, Plan(
        dp=dp, tp=tp, pp=pp, cp=cp, ep=ep, vpp=vpp, sp=draw(st.booleans()), sharding=sharding,
        micro_batch=mb, global_batch=dp * mb * accum,
        recompute=draw(st.sampled_from(["none", "selective", "full"])),
        precision=draw(st.sampled_from(["bf16", "fp16", "fp8"])),
        overlap_dp=draw(st.booleans()), overlap_param_gather=draw(st.booleans()),
        overlap_tp=draw(st.booleans()),
    )  # fmt: skip


FAST = settings(max_examples=60, deadline=None, suppress_health_check=[HealthCheck.too_slow])


@FAST
@given(valid_case(), st.floats(1.0, 16.0), st.sampled_from(["intra", "inter"]))
def test_more_bandwidth_is_never_slower(
    case: tuple[TransformerSpec, Plan], k: float, which: str
) -> None:
    model, plan = case
    base = _cluster()
    faster = _cluster(450.0 * k, 50.0) if which == "intra" else _cluster(450.0, 50.0 * k)
    assert estimate_step(model, faster, plan).step_time_s <= estimate_step(
        model, base, plan
    ).step_time_s * (1 + 1e-12)


@FAST
@given(valid_case(), st.sampled_from([1, 8, 72]))
def test_mfu_never_exceeds_one(case: tuple[TransformerSpec, Plan], domain: int) -> None:
    model, plan = case
    est = estimate_step(model, _cluster(intra_gbps=1e6, inter_gbps=1e6, domain=domain), plan)
    assert 0 < est.mfu <= est.hfu <= 1.0
    assert est.tokens_per_s_per_gpu > 0


@FAST
@given(valid_case())
def test_higher_sharding_stage_never_uses_more_memory(case: tuple[TransformerSpec, Plan]) -> None:
    model, plan = case
    stages = ["none", "zero1", "zero2", "zero3"]
    memory = [
        estimate_step(
            model, _cluster(), plan.model_copy(update={"sharding": s, "shard_degree": None})
        ).memory_bytes
        for s in stages
    ]
    assert all(b <= a * (1 + 1e-12) for a, b in itertools.pairwise(memory))


@FAST
@given(
    st.integers(1, 9), st.integers(1, 9), st.integers(1, 5), st.integers(1, 3), st.integers(1, 4),
    st.integers(1, 3), st.integers(1, 40), st.integers(1, 3), st.one_of(st.none(), st.integers(1, 9)),
    st.sampled_from(["none", "zero1", "zero2", "zero3"]),
)  # fmt: skip
def test_any_plan_is_estimated_or_rejected_cleanly(
    dp: int, tp: int, pp: int, cp: int, ep: int, vpp: int, gb: int, mb: int,
    shard: int | None, sharding: str,
) -> None:  # fmt: skip
    model = MODELS[2]
    try:
        plan = Plan(
            dp=dp, tp=tp, pp=pp, cp=cp, ep=ep, vpp=vpp, global_batch=gb, micro_batch=mb,
            shard_degree=shard, sharding=sharding,
        )  # fmt: skip
        est = estimate_step(model, _cluster(), plan)
    except UserInputError as exc:
        assert str(exc).count("\n") == 0
        return
    assert np.isfinite(est.step_time_s) and est.step_time_s > 0


def test_arrays_accept_broadcast_columns() -> None:
    plans = PlanArrays.from_columns(dp=np.array([1, 2, 4, 8]), micro_batch=1, global_batch=8)
    out = estimate_step_arrays(MODELS[0], _cluster(), plans)
    assert out.step_time_s.shape == (4,)
