"""Closed forms of the attention kernel class and of the MLP up-projection recompute.

One GPU, matmul and attention efficiency 1, no size penalty, element-wise traffic negligible
(1e18 B/s HBM), so each step is a short formula of the layer's FLOPs at the bf16 peak.
"""

from __future__ import annotations

import pytest

from shardmeter.calibrate import plan_from_row
from shardmeter.estimate.step import estimate_step
from shardmeter.specs.framework import FRAMEWORKS
from shardmeter.specs.hardware import Accelerator, Cluster, Efficiency, Link
from shardmeter.specs.model import TransformerSpec
from shardmeter.specs.plan import Plan

H, HEADS, FFN, VOCAB, SEQ, LAYERS = 1024, 8, 4096, 8192, 1024, 8
PEAK = 1000e12  # FLOP/s bf16
T = 1024.0  # tokens of one micro-batch (b = 1, s = 1024)
REL = 1e-6


def model(mlp: str = "gelu") -> TransformerSpec:
    return TransformerSpec(
        name="kernel-class", n_layers=LAYERS, hidden=H, n_heads=HEADS, ffn=FFN, mlp=mlp,
        vocab=VOCAB, seq_len=SEQ,
    )  # fmt: skip


def cluster(mma_sync_fraction: float) -> Cluster:
    acc = Accelerator(
        name="kernel-class-gpu",
        peak_tflops={"bf16": PEAK / 1e12},
        hbm_gb=80,
        hbm_gbps=1e9,
        mma_sync_fraction=mma_sync_fraction,
        efficiency=Efficiency(
            matmul_max=1.0, matmul_half_gflop=0.0, memory=1.0, attention=1.0, kernel_launch_us=0.0
        ),
    )
    link = Link(name="nvlink", bandwidth_gbps=100.0, latency_us=0.0, efficiency=1)
    return Cluster(
        name="kernel-class", accelerator=acc, gpus_per_node=1, nvlink_domain=1, intra=link,
        inter=link, overlap_slowdown=0.0, memory_overhead_gb=1.0,
    )  # fmt: skip


def attention_s() -> float:
    """Causal flash attention of one layer, forward: 4·T·s·h/2 FLOPs at the peak."""
    return 4 * T * SEQ * H / 2 / PEAK


def test_flash2_runs_at_the_mma_sync_fraction_of_the_native_kernel() -> None:
    """On a chip whose mma.sync reaches 2/3 of the tensor peak (Hopper), a FlashAttention-2
    layer's attention (forward A, backward 2.5A) takes 3/2 of the native cuDNN kernel's: the
    step differs by LAYERS · 3.5A · (3/2 − 1). Where mma.sync is the native path (fraction 1)
    both kernels take the same time."""
    plan = Plan(micro_batch=1, global_batch=1)
    hopper = cluster(2.0 / 3.0)
    flash = estimate_step(model(), hopper, plan.model_copy(update={"attention": "flash"}))
    cudnn = estimate_step(model(), hopper, plan.model_copy(update={"attention": "cudnn"}))
    extra = LAYERS * 3.5 * attention_s() * (1.5 - 1.0)
    assert flash.step_time_s - cudnn.step_time_s == pytest.approx(extra, rel=REL)
    ampere = cluster(1.0)
    same = [
        estimate_step(model(), ampere, plan.model_copy(update={"attention": a})).step_time_s
        for a in ("flash", "cudnn")
    ]
    assert same[0] == pytest.approx(same[1], rel=1e-12)
    assert cudnn.step_time_s == pytest.approx(same[1], rel=1e-12)


def test_transformer_engine_stacks_default_to_cudnn_attention() -> None:
    """Transformer Engine prefers cuDNN fused attention on Hopper and newer (TE
    `get_attention_backend`), so NeMo, Megatron-Core and Megatron-Bridge default to it;
    torchtitan (PyTorch SDPA) and llm-foundry (flash-attn 2) keep FlashAttention-2."""
    kernel = {name: f.attention for name, f in FRAMEWORKS.items()}
    assert {kernel[n] for n in ("nemo", "megatron-core", "megatron-bridge")} == {"cudnn"}
    assert kernel["torchtitan"] == kernel["llm-foundry"] == "flash"


@pytest.mark.parametrize(("mlp", "up_matrices"), [("gelu", 1), ("swiglu", 2)])
def test_mlp_up_recompute_reruns_the_up_gemms_and_drops_their_outputs(
    mlp: str, up_matrices: int
) -> None:
    """Selective recompute with the MLP up projection re-run (MaxText
    `save_dot_except_mlpwi`): backward re-runs the (m − 1) up GEMMs, 2·T·h·F·(m − 1) FLOPs per
    layer, and keeps none of their outputs, 2 B · T · F · (m − 1) per layer (m = 1 in flight)."""
    plan = Plan(micro_batch=1, global_batch=1, recompute="selective")
    world = cluster(1.0)
    ref = estimate_step(model(mlp), world, plan)
    est = estimate_step(model(mlp), world, plan.model_copy(update={"recompute_mlp_up": True}))
    up_s = 2 * T * H * FFN * up_matrices / PEAK
    assert est.step_time_s - ref.step_time_s == pytest.approx(LAYERS * up_s, rel=REL)
    dropped = 2 * T * FFN * up_matrices
    assert ref.memory_bytes - est.memory_bytes == pytest.approx(LAYERS * dropped, rel=REL)
    extra_flops = LAYERS * 2 * H * FFN * up_matrices * T
    hw_flops = (est.hfu * est.step_time_s - ref.hfu * ref.step_time_s) * PEAK
    assert hw_flops == pytest.approx(extra_flops, rel=REL)


def test_maxtext_remat_policy_name_maps_to_selective_with_mlp_up() -> None:
    """A calibration row's recompute cell `save_dot_except_mlpwi` (MaxText) is selective
    recompute with `recompute_mlp_up`; `minimal` is selective alone."""
    row = {
        "n_gpus": "8", "dp": "8", "tp": "1", "pp": "1", "micro_batch": "1",
        "global_batch": "8", "framework": "maxtext", "recompute": "save_dot_except_mlpwi",
    }  # fmt: skip
    plan = plan_from_row(row)
    assert plan.recompute == "selective" and plan.recompute_mlp_up
    minimal = plan_from_row({**row, "recompute": "minimal"})
    assert minimal.recompute == "selective" and not minimal.recompute_mlp_up
