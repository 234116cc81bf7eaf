"""The output head stays BF16 on FP8 plans, worked out by hand.

FP8 recipes quantize the decoder layers' linear layers, not the output head (Megatron-Core's
head is a Megatron ColumnParallelLinear that Transformer Engine's fp8_autocast does not reach;
torchtitan's Float8 conversion filters out "output"; MaxText does not quantize the logits
matmul; DeepSeek-V3 §3.3.1 keeps "the embedding module, the output head" in BF16 or FP32).
The world: matmul efficiency 1, FP8 peak and `fp8_speedup` 2, HBM so fast (1e18 B/s) that
element-wise traffic and the FP8 casts vanish, one GPU, one micro-batch.
"""

from __future__ import annotations

import pytest

from shardmeter.estimate.step import estimate_step
from shardmeter.specs.hardware import Accelerator, Cluster, Efficiency, Link
from shardmeter.specs.model import TransformerSpec
from shardmeter.specs.plan import Plan

H, HEADS, FFN, VOCAB, SEQ, LAYERS = 1024, 8, 4096, 32768, 1024, 4
MODEL = TransformerSpec(
    name="head", n_layers=LAYERS, hidden=H, n_heads=HEADS, ffn=FFN, mlp="gelu", vocab=VOCAB,
    seq_len=SEQ,
)  # fmt: skip
PEAK = 1000e12  # BF16 FLOP/s; FP8 twice that
T = 1024.0  # tokens of one micro-batch


def _world() -> Cluster:
    acc = Accelerator(
        name="head-gpu", peak_tflops={"bf16": PEAK / 1e12, "fp8": 2 * PEAK / 1e12}, hbm_gb=80,
        hbm_gbps=1e9,
        efficiency=Efficiency(matmul_max=1.0, matmul_half_gflop=0.0, memory=1.0,
                              attention=1.0, fp8_speedup=2.0, kernel_launch_us=0.0),
    )  # fmt: skip
    link = Link(bandwidth_gbps=100.0, latency_us=0.0, efficiency=1.0)
    return Cluster(
        accelerator=acc, gpus_per_node=4, nvlink_domain=4, intra=link, inter=link,
        memory_overhead_gb=1.0,
    )  # fmt: skip


def _compute(precision: str) -> float:
    plan = Plan(micro_batch=1, global_batch=1, precision=precision)
    return estimate_step(MODEL, _world(), plan).time_breakdown["compute"]


def test_fp8_halves_the_layer_gemms_but_not_the_head() -> None:
    """FP8 at twice the BF16 rate saves half of each layer's GEMM time, forward and backward
    (3 × G/2 per layer, G = 2·T·h·(4h + 2F)/peak), and nothing on the head (2·T·h·V/peak
    forward, twice that backward): the BF16 and FP8 steps differ by exactly the layers'
    half, and the FP8 step still pays the head's full 3·2·T·h·V/peak."""
    layer_gemm = 2 * T * H * (4 * H + 2 * FFN) / PEAK
    head = 2 * T * H * VOCAB / PEAK
    saved = _compute("bf16") - _compute("fp8")
    assert saved == pytest.approx(LAYERS * 3 * layer_gemm / 2, rel=1e-5)
    attention = 4 * T * SEQ * H / 2 / PEAK  # causal flash forward; backward 2.5×
    fp8_step = LAYERS * (3 * layer_gemm / 2 + 3.5 * attention) + 3 * head
    assert _compute("fp8") == pytest.approx(fp8_step, rel=1e-5)
