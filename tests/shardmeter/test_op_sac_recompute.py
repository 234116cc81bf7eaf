"""Closed forms of torchtitan's per-op selective checkpointing (`selective_policy =
"torchtitan_op"`) in step time.

The policy (torchtitan parallelize_llama.py `_op_sac_save_list` and `_custom_policy`) keeps
the outputs of SDPA, of reduce-scatters and of every odd matmul of a TransformerBlock; the
backward re-runs the rest: the element-wise ops, the 2nd, 4th and 6th matmul (wk, wo, and
SwiGLU's w3 or GELU's w2) and, under sequence parallelism, the two all-gathers that feed wk
and w3. Megatron's selective policy re-runs the attention core instead.

The world: matmul efficiency 1, latency 0, NVLink 100 GB/s per direction, HBM so fast that
element-wise traffic vanishes. Each figure is derived here from those rates.
"""

from __future__ import annotations

import pytest

from shardmeter.estimate.step import estimate_step
from shardmeter.specs.hardware import Accelerator, Cluster, Efficiency, Link
from shardmeter.specs.model import TransformerSpec
from shardmeter.specs.plan import Plan

H, HEADS, KV_HEADS, FFN, VOCAB, SEQ, LAYERS = 1024, 8, 2, 4096, 8192, 1024, 4
KV = H // HEADS * KV_HEADS  # width of K (and of V)
PEAK = 1000e12  # FLOP/s bf16
W_NV = 100e9  # bytes/s per GPU per direction
U = 0.2
K = U / (1.0 - U)  # hidden communication costs K of itself in compute
T1 = 1024.0  # tokens of one micro-batch


def model(mlp: str) -> TransformerSpec:
    return TransformerSpec(
        name="closed-form", n_layers=LAYERS, hidden=H, n_heads=HEADS, n_kv_heads=KV_HEADS,
        ffn=FFN, mlp=mlp, vocab=VOCAB, seq_len=SEQ,
    )  # fmt: skip


WORLD = Cluster(
    name="closed-form",
    accelerator=Accelerator(
        name="closed-form-gpu",
        peak_tflops={"bf16": PEAK / 1e12},
        hbm_gb=80,
        hbm_gbps=1e12,
        efficiency=Efficiency(
            matmul_max=1.0,
            matmul_half_gflop=0.0,
            memory=1.0,
            attention=1.0,
            kernel_launch_us=0.0,
        ),
    ),
    gpus_per_node=4,
    nvlink_domain=4,
    intra=Link(name="nvlink", bandwidth_gbps=W_NV / 1e9, latency_us=0.0, efficiency=1),
    inter=Link(name="ib", bandwidth_gbps=10.0, latency_us=0.0, efficiency=1),
    overlap_slowdown=U,
    memory_overhead_gb=1.0,
)


def check(value: float, expected: float) -> None:
    assert value == pytest.approx(expected, rel=1e-5)


def plan(policy: str, tp: int = 1, **kw: object) -> Plan:
    return Plan(
        tp=tp, sp=tp > 1, recompute="selective", selective_policy=policy, micro_batch=1,
        global_batch=1, **kw,  # type: ignore[arg-type]
    )  # fmt: skip


def matmul(n_in: float, n_out: float, tp: int = 1) -> float:
    """Forward seconds of one T1-token matmul n_in → n_out, split over tp ranks."""
    return 2 * T1 * n_in * n_out / tp / PEAK


def attention_core(tp: int = 1) -> float:
    """Causal flash attention forward: 4·T·s·h/2 FLOPs."""
    return 4 * T1 * SEQ * H / 2 / tp / PEAK


@pytest.mark.parametrize("mlp", ["swiglu", "gelu"])
def test_per_op_policy_reruns_every_second_matmul_not_the_attention_core(mlp: str) -> None:
    """tp 1: the recompute is wk (h → kv), wo (h → h) and the sixth matmul, SwiGLU's w3
    (h → F) or GELU's w2 (F → h), where Megatron's selective policy re-runs the attention
    core (element-wise traffic is zero in this world)."""
    sixth = matmul(H, FFN) if mlp == "swiglu" else matmul(FFN, H)
    op = estimate_step(model(mlp), WORLD, plan("torchtitan_op"))
    check(op.time_breakdown["recompute"], LAYERS * (matmul(H, KV) + matmul(H, H) + sixth))
    megatron = estimate_step(model(mlp), WORLD, plan("megatron"))
    check(megatron.time_breakdown["recompute"], LAYERS * attention_core())


def test_per_op_policy_gathers_the_sequence_again_for_the_rerun_matmuls() -> None:
    """tp 2 with SP, collectives not overlapped: the Megatron policy's tensor-parallel traffic
    is 2 passes × (2 all-gathers + 2 reduce-scatters) of T·h bf16 per layer; the per-op
    policy keeps the reduce-scatters' outputs but not the gathers', so the re-run wk and w3
    gather the attention and MLP inputs again: 2 ring all-gathers more per layer."""
    swiglu = model("swiglu")
    one = (2 - 1) / 2 * T1 * H * 2 / W_NV  # one ring all-gather or reduce-scatter at tp 2
    megatron = estimate_step(swiglu, WORLD, plan("megatron", tp=2))
    check(megatron.time_breakdown["tp_comm"], LAYERS * 2 * 4 * one)
    op = estimate_step(swiglu, WORLD, plan("torchtitan_op", tp=2))
    check(op.time_breakdown["tp_comm"], LAYERS * (2 * 4 + 2) * one)


@pytest.mark.parametrize("mlp", ["swiglu", "gelu"])
def test_async_tp_hides_the_regathers_behind_the_rerun_matmuls_that_read_them(mlp: str) -> None:
    """Async TP: the two extra gathers of the per-op policy pair with the re-run matmuls that
    read a gathered input, wk and SwiGLU's w3 (GELU's re-run w2 reads the activation, not a
    gather), at tp 2; exposed max(0, T − W) plus K·min(T, W) on top of what the same plan
    pays under the Megatron policy."""
    one = (2 - 1) / 2 * T1 * H * 2 / W_NV
    window = matmul(H, KV, tp=2) + (matmul(H, FFN, tp=2) if mlp == "swiglu" else 0.0)
    extra = max(2 * one - window, 0.0) + K * min(2 * one, window)
    megatron = estimate_step(model(mlp), WORLD, plan("megatron", tp=2, tp_async=True))
    op = estimate_step(model(mlp), WORLD, plan("torchtitan_op", tp=2, tp_async=True))
    delta = op.time_breakdown["tp_comm"] - megatron.time_breakdown["tp_comm"]
    check(delta, LAYERS * extra)
