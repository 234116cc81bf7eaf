"""Per-op FLOPs and times: Megatron's model-FLOP formula, roofline, recompute counts."""

from __future__ import annotations

import numpy as np
import pytest

from shardmeter.estimate.compute import (
    ep_load_imbalance,
    gemm_time,
    layer_forward,
    logits_forward,
    matmul_efficiency,
    model_flops_per_token,
    pipeline_times,
    recompute_flops_per_token,
    stage_layers,
    unit_costs,
)
from shardmeter.estimate.plan_arrays import PRECISION_CODES, PlanArrays
from shardmeter.specs.hardware import Accelerator, Efficiency
from shardmeter.specs.model import MoESpec, TransformerSpec

GPT3 = TransformerSpec(
    name="gpt3-175b", n_layers=96, hidden=12288, n_heads=96, ffn=49152, vocab=51200, seq_len=2048
)
ACC = Accelerator(
    name="test-gpu",
    peak_tflops={"bf16": 1000.0, "fp8": 2000.0},
    hbm_gb=80,
    hbm_gbps=3000,
    efficiency=Efficiency(matmul_max=0.8, matmul_half_gflop=2.0, memory=0.8, attention=0.5),
)


def test_megatron_model_flops_gpt3() -> None:
    """72·B·s·L·h²·(1 + s/6h + V/12Lh) (Narayanan et al. SC'21) equals 3·forward, non-causal."""
    batch, s, layers, h, vocab = 1536, 2048, 96, 12288, 51200
    expected = 72 * batch * s * layers * h**2 * (1 + s / (6 * h) + vocab / (12 * layers * h))
    got = model_flops_per_token(GPT3, causal=False) * batch * s
    assert got == pytest.approx(expected, rel=1e-12)
    # The causal convention halves only the attention-score term.
    attn = 3 * 4 * layers * s * h
    assert model_flops_per_token(GPT3, causal=True) == pytest.approx(
        model_flops_per_token(GPT3, causal=False) - attn / 2
    )


def test_full_recompute_matches_megatron_hardware_flops() -> None:
    """With full recompute hardware FLOPs = 96·B·s·L·h²·(1 + s/6h + V/16Lh) (non-causal)."""
    batch, s, layers, h, vocab = 8, 2048, 96, 12288, 51200
    expected = 96 * batch * s * layers * h**2 * (1 + s / (6 * h) + vocab / (16 * layers * h))
    causal_attn_fwd = GPT3.attention_flops_per_token(causal=True)
    full = recompute_flops_per_token(GPT3, 2)
    # Our recompute uses the causal attention count; add back the skipped half to compare.
    got = (model_flops_per_token(GPT3, causal=False) + full + causal_attn_fwd) * batch * s
    assert got == pytest.approx(expected, rel=1e-12)
    assert recompute_flops_per_token(GPT3, 0) == 0.0
    assert recompute_flops_per_token(GPT3, 1) == pytest.approx(causal_attn_fwd)


def test_matmul_efficiency_saturates() -> None:
    eff = ACC.efficiency
    assert matmul_efficiency(2e9, eff) == pytest.approx(0.4)  # F = F_half -> half of max
    assert matmul_efficiency(1e15, eff) == pytest.approx(0.8, rel=1e-5)
    assert matmul_efficiency(1e6, eff) < 0.01


def test_gemm_roofline_compute_and_memory_bound() -> None:
    big = float(gemm_time(8192, 8192, 8192, ACC, False))
    flops = 2 * 8192**3
    eta = 0.8 * (flops / 1e9) / (flops / 1e9 + 2.0)
    assert big == pytest.approx(flops / (1e15 * eta))
    # A matrix-vector product is bound by HBM: (mk + kn + mn)·2 bytes at 0.8 × 3 TB/s.
    thin = float(gemm_time(1, 8192, 8192, ACC, False))
    assert thin == pytest.approx((8192 + 8192 * 8192 + 8192) * 2 / (3000e9 * 0.8))
    assert float(gemm_time(8192, 8192, 8192, ACC, True)) < big


def test_layer_flops_count_gqa_swiglu_and_moe() -> None:
    llama = TransformerSpec(
        n_layers=32, hidden=4096, n_heads=32, n_kv_heads=8, ffn=14336, mlp="swiglu",
        vocab=128256, seq_len=8192,
    )  # fmt: skip
    plans = PlanArrays.from_columns(tp=np.array([1, 4]), micro_batch=1)
    cost = layer_forward(llama, plans, ACC, moe=False)
    tokens = 8192
    per_token = 2 * (2 * 4096 * 4096 + 2 * 4096 * 1024) + 2 * 3 * 4096 * 14336
    np.testing.assert_allclose(cost.gemm_flops, [tokens * per_token, tokens * per_token / 4])
    np.testing.assert_allclose(cost.attention_flops[0], 4 * tokens * 8192 * 4096 / 2)

    moe = llama.model_copy(update={"moe": MoESpec(experts=8, top_k=2)})
    moe_cost = layer_forward(moe, PlanArrays.from_columns(ep=np.array([1, 8]), dp=8), ACC, moe=True)
    routed = 2 * 2 * 3 * 4096 * 14336 + 2 * 4096 * 8
    attn = 2 * (2 * 4096 * 4096 + 2 * 4096 * 1024)
    np.testing.assert_allclose(moe_cost.gemm_flops, tokens * (attn + routed))


def test_stages_split_layers_and_the_last_adds_the_logits() -> None:
    one, four = PlanArrays.from_columns(pp=1), PlanArrays.from_columns(pp=4)
    assert float(stage_layers(GPT3, four).mid) == 24
    units = unit_costs(GPT3, four, ACC)
    times = pipeline_times(
        GPT3, four, stage_layers(GPT3, four), units.layer_s, units.head_s, units.embed_s
    )
    assert float(times.critical_s) == pytest.approx(float(times.last_s))
    assert float(times.last_s) == pytest.approx(24 * float(units.layer_s) + float(units.head_s))
    whole = pipeline_times(
        GPT3, one, stage_layers(GPT3, one), units.layer_s, units.head_s, units.embed_s
    )
    assert float(whole.critical_s) == pytest.approx(float(times.total_s))  # one stage holds all
    full = unit_costs(GPT3, PlanArrays.from_columns(recompute=2), ACC)
    assert float(full.layer_recompute_s) == pytest.approx(float(full.layer_forward_s))


def test_ep_load_imbalance_is_one_without_ep_and_shrinks_with_tokens() -> None:
    assert ep_load_imbalance(4096.0, 8, 1.0) == pytest.approx(1.0)
    few, many = ep_load_imbalance(1024.0, 8, 8.0), ep_load_imbalance(65536.0, 8, 8.0)
    assert 1.0 < many < few
    # Monte Carlo of uniform top-k routing: mean max/mean tokens per rank over 8 ranks.
    rng = np.random.default_rng(0)
    counts = rng.multinomial(1024 * 8, [1 / 8] * 8, size=2000)
    simulated = float(np.mean(counts.max(axis=1) / (1024 * 8 / 8)))
    assert few == pytest.approx(simulated, rel=0.03)


def test_moe_small_experts_pay_size_curve_and_synced_launches_dense_layers_do_not() -> None:
    """Same active FLOPs split over many small experts run slower (smaller per-expert GEMMs
    and, behind the dropless routing's host sync, 2 GEMM launches per local expert, 4 under
    FP8 with each GEMM input's quantize); the dense layer's launches hide behind its GPU work;
    CUDA graphs remove every launch."""
    base = TransformerSpec(
        n_layers=8, hidden=2048, n_heads=16, ffn=6144, mlp="swiglu", vocab=32000, seq_len=4096
    )
    eff = ACC.efficiency.model_copy(update={"kernel_launch_us": 10.0})
    acc = ACC.model_copy(update={"efficiency": eff})
    plans = PlanArrays.from_columns(ep=1, micro_batch=1)
    coarse = base.model_copy(update={"moe": MoESpec(experts=8, top_k=1)})
    fine = base.model_copy(update={"ffn": 768, "moe": MoESpec(experts=64, top_k=8)})
    c, f = layer_forward(coarse, plans, acc, True), layer_forward(fine, plans, acc, True)
    assert float(f.synced_launch_s) == pytest.approx((60 + 2 * 64) * 10e-6)
    assert float(c.synced_launch_s) == pytest.approx((60 + 2 * 8) * 10e-6)
    fp8 = PlanArrays.from_columns(ep=1, micro_batch=1, precision=PRECISION_CODES["fp8"])
    assert float(layer_forward(fine, fp8, acc, True).synced_launch_s) == pytest.approx(
        (60 + 4 * 64) * 10e-6
    )
    assert float(f.forward_s) > float(c.forward_s)
    dense = layer_forward(base, plans, acc, False)
    assert float(dense.synced_launch_s) == 0.0
    assert float(dense.forward_s) == pytest.approx(float(dense.gpu_forward_s))
    graphs = PlanArrays.from_columns(ep=1, micro_batch=1, graphs=True)
    assert float(layer_forward(fine, graphs, acc, True).synced_launch_s) == 0.0


def test_tiny_layers_are_host_bound() -> None:
    """A layer whose GPU work is shorter than launching its 11 kernels takes the launch time."""
    tiny = TransformerSpec(n_layers=2, hidden=64, n_heads=1, ffn=256, vocab=100, seq_len=16)
    eff = ACC.efficiency.model_copy(update={"kernel_launch_us": 10.0})
    cost = layer_forward(
        tiny, PlanArrays.from_columns(), ACC.model_copy(update={"efficiency": eff}), False
    )
    assert float(cost.gpu_forward_s) < 110e-6
    assert float(cost.forward_s) == pytest.approx(11 * 10e-6)
    assert float(cost.backward_s) == pytest.approx(2 * 11 * 10e-6)


def test_backward_moves_twice_the_forwards_elementwise_bytes_unless_told_otherwise() -> None:
    """The output head's cross-entropy (no `elementwise_bwd_s`): backward = 2 × forward bytes;
    a layer states its own backward (here GELU's, which is also 2 × its forward)."""
    fast = Accelerator(
        name="fast-gemm",
        peak_tflops={"bf16": 1e9},
        hbm_gb=80,
        hbm_gbps=1000,
        efficiency=Efficiency(
            matmul_max=1.0, matmul_half_gflop=0.0, memory=1.0, attention=1.0, kernel_launch_us=0.0
        ),
    )
    head = logits_forward(GPT3, PlanArrays.from_columns(), fast)
    ce_s = float(head.elementwise_s)
    bwd_elementwise = float(head.backward_s - 2 * head.gemm_s)  # BWD_GEMM x its (HBM-bound) GEMM
    assert ce_s > 0 and bwd_elementwise == pytest.approx(2 * ce_s, rel=1e-9)
    layer = layer_forward(GPT3, PlanArrays.from_columns(), fast, False)
    assert float(layer.elementwise_bwd_s) == pytest.approx(2 * float(layer.elementwise_s))
