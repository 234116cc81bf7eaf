"""Closed forms of the FP8 scaling granularity and of async tensor parallelism.

The world is the closed-form tests' (tests/shardmeter/test_closed_form.py): matmul efficiency 1,
latency 0, NVLink 100 GB/s per direction, fp8 twice the bf16 rate, HBM so fast that
element-wise traffic vanishes except where a test sets it. Each test derives its figure from
the formulas here, independently of the estimator's helpers.
"""

from __future__ import annotations

from collections.abc import Callable

import pytest

from shardmeter.estimate.step import estimate_step
from shardmeter.specs.hardware import Accelerator, Cluster, Efficiency, Link
from shardmeter.specs.model import TransformerSpec
from shardmeter.specs.plan import Plan

H, HEADS, FFN, VOCAB, SEQ, LAYERS = 1024, 8, 4096, 8192, 1024, 8
MODEL = TransformerSpec(
    name="closed-form", n_layers=LAYERS, hidden=H, n_heads=HEADS, ffn=FFN, mlp="gelu",
    vocab=VOCAB, seq_len=SEQ,
)  # fmt: skip
PEAK = 1000e12  # FLOP/s bf16; fp8 twice
W_NV = 100e9  # bytes/s per GPU per direction
U = 0.2
K = U / (1.0 - U)  # hidden communication costs K of itself in compute
T1 = 1024.0  # tokens of one micro-batch
MSG = T1 * H * 2  # one TP all-gather output / reduce-scatter input, bf16 bytes


def world(hbm_bytes_per_s: float = 1e18, half_gflop: float = 0.0) -> Cluster:
    acc = Accelerator(
        name="closed-form-gpu",
        peak_tflops={"bf16": PEAK / 1e12, "fp8": 2 * PEAK / 1e12},
        hbm_gb=80,
        hbm_gbps=hbm_bytes_per_s / 1e9,
        efficiency=Efficiency(
            matmul_max=1.0, matmul_half_gflop=half_gflop, memory=1.0, attention=1.0,
            fp8_speedup=2.0, kernel_launch_us=0.0,
        ),
    )  # fmt: skip
    return Cluster(
        name="closed-form",
        accelerator=acc,
        gpus_per_node=4,
        nvlink_domain=4,
        intra=Link(name="nvlink", bandwidth_gbps=W_NV / 1e9, latency_us=0.0, efficiency=1),
        inter=Link(name="ib", bandwidth_gbps=10.0, latency_us=0.0, efficiency=1),
        overlap_slowdown=U,
        memory_overhead_gb=1.0,
    )


def check(value: float, expected: float) -> None:
    assert value == pytest.approx(expected, rel=1e-5)


def ring(n: int, nbytes: float) -> float:
    """Ring all-gather or reduce-scatter over n NVLink ranks: (n−1)/n · M / W."""
    return (n - 1) / n * nbytes / W_NV


def tp_plan(**kw: object) -> Plan:
    return Plan(tp=2, sp=True, micro_batch=1, global_batch=1, **kw)  # type: ignore[arg-type]


def test_rowwise_scaling_casts_each_operand_once_per_gemm() -> None:
    """Rowwise scales lie along each GEMM's K axis, so no FP8 copy serves a second GEMM by
    transposition: every activation input and output gradient is cast twice (read 2 B, write
    1 B each), 6 B per element instead of the tensorwise cast-transpose's 4 B. 1 TB/s HBM,
    tp 1: forward the inputs of QKV, output projection, MLP up and down (3h + F per token),
    backward their output gradients (5h + F): 2 B × T × (8h + 2F) more per layer; and the K
    and V Linears cast the attention input again, 8 B × 2·T·h (GELU: one up Linear)."""
    cl = world(hbm_bytes_per_s=1e12)
    base = Plan(micro_batch=1, global_batch=1, precision="fp8", fp8_recipe="torchao")
    tensorwise = estimate_step(MODEL, cl, base)
    rowwise = estimate_step(MODEL, cl, base.model_copy(update={"fp8_scaling": "rowwise"}))
    delta = rowwise.time_breakdown["compute"] - tensorwise.time_breakdown["compute"]
    recast = 8 * 2 * T1 * H
    check(delta, LAYERS * (2 * T1 * ((3 * H + FFN) + (5 * H + FFN)) + recast) / 1e12)
    # bf16 plans cast nothing, whatever the scaling field says
    bf16 = Plan(micro_batch=1, global_batch=1)
    bf16_row = estimate_step(MODEL, cl, bf16.model_copy(update={"fp8_scaling": "rowwise"}))
    check(bf16_row.step_time_s, estimate_step(MODEL, cl, bf16).step_time_s)


def test_rowwise_scaling_recasts_the_input_of_every_further_linear() -> None:
    """Rowwise casts inside each Float8Linear, so the Linears that share an input each cast
    it: torchtitan's Llama has wq, wk, wv over the attention input and SwiGLU w1, w3 over the
    MLP input, three casts more than one per input, each unfused (torchao's roofline: read
    2 B, write 1 B + a 2 B transposed copy, read 2 B, write 1 B = 8 B per element). SwiGLU
    model, 1 TB/s HBM, tp 1: (2 + 1) · T · h · 8 B per layer, forward, more than the
    per-GEMM casts; none for tensorwise, none for a compiled (XLA) graph."""
    swiglu = MODEL.model_copy(update={"mlp": "swiglu"})
    cl = world(hbm_bytes_per_s=1e12)
    base = Plan(micro_batch=1, global_batch=1, precision="fp8", fp8_recipe="torchao")
    tensorwise = estimate_step(swiglu, cl, base)
    rowwise = estimate_step(swiglu, cl, base.model_copy(update={"fp8_scaling": "rowwise"}))
    delta = rowwise.time_breakdown["compute"] - tensorwise.time_breakdown["compute"]
    # the per-GEMM casts (2 B more per element): forward 3h + F, backward 5h + 2F (SwiGLU's
    # two up projections each get an output gradient of width F)
    per_gemm = 2 * T1 * ((3 * H + FFN) + (5 * H + 2 * FFN))
    check(delta, LAYERS * (per_gemm + 8 * 3 * T1 * H) / 1e12)
    compiled = base.model_copy(update={"compiled": True})
    check(
        estimate_step(
            swiglu, cl, compiled.model_copy(update={"fp8_scaling": "rowwise"})
        ).step_time_s,
        estimate_step(swiglu, cl, compiled).step_time_s,
    )


def layer_gemms(fp8: bool) -> dict[str, float]:
    """Forward seconds of the tp-2 layer's GEMMs (GELU MLP, 8 KV heads): QKV h × 3h/2, output
    projection h/2 × h, MLP up h × F/2, down F/2 × h; fp8 at twice the rate."""
    rate = PEAK * (2 if fp8 else 1)
    return {
        "qkv": 2 * T1 * H * 1.5 * H / rate,
        "out": 2 * T1 * 0.5 * H * H / rate,
        "up": 2 * T1 * H * FFN / 2 / rate,
        "down": 2 * T1 * FFN / 2 * H / rate,
    }


def overlap(comm: float, window: float) -> float:
    return max(comm - window, 0.0) + K * min(comm, window)


def test_async_tp_hides_each_collective_behind_its_own_gemm() -> None:
    """Async TP decomposes the attention gather with the QKV GEMM, its reduce-scatter with the
    output projection, the MLP gather with the up and its reduce-scatter with the down
    projection, forward and (same-sized data-gradient GEMMs) backward, plus the recomputed
    forward under full recompute: tp_comm = passes × Σ_c [max(0, T_c − W_c) + K·min(T_c, W_c)]
    with T_c = M/2W per gather or reduce-scatter at tp 2."""
    cl = world()
    gemms = layer_gemms(fp8=False)
    one = ring(2, MSG)
    per_pass = sum(overlap(one, gemms[g]) for g in ("qkv", "out", "up", "down"))
    est = estimate_step(MODEL, cl, tp_plan(tp_async=True))
    check(est.time_breakdown["tp_comm"], LAYERS * 2 * per_pass)
    hidden = sum(min(one, gemms[g]) for g in ("qkv", "out", "up", "down"))
    check(est.time_hidden["tp_comm"], LAYERS * 2 * hidden)
    full = estimate_step(MODEL, cl, tp_plan(tp_async=True, recompute="full"))
    check(full.time_breakdown["tp_comm"], LAYERS * 3 * per_pass)


def test_async_tp_leaves_rowwise_gathers_exposed() -> None:
    """Rowwise FP8 casts the gathered bf16 tensor before its scaled GEMM, so its two gathers
    per pass have no GEMM to be decomposed with: exposed whole; its reduce-scatters hide
    behind the FP8 output and down projections."""
    cl = world()
    gemms = layer_gemms(fp8=True)
    one = ring(2, MSG)
    plan = tp_plan(tp_async=True, precision="fp8", fp8_recipe="torchao", fp8_scaling="rowwise")
    per_pass = 2 * one + overlap(one, gemms["out"]) + overlap(one, gemms["down"])
    check(estimate_step(MODEL, cl, plan).time_breakdown["tp_comm"], LAYERS * 2 * per_pass)


def test_async_tp_runs_each_decomposed_gemm_as_tp_row_blocks() -> None:
    """With a GEMM size at half efficiency F0 (η = F/(F + F0)), a GEMM of F FLOPs takes
    (F + F0)/C; run as tp blocks of F/tp it takes (F + tp·F0)/C: (tp − 1)·F0/C more for each
    of the layer's 4 decomposed GEMMs, forward and once more for the data-gradient GEMMs,
    against the same plan with its TP collectives not overlapped (GEMMs whole)."""
    f0 = 10.0  # GFLOP
    cl = world(half_gflop=f0)
    plain = estimate_step(MODEL, cl, tp_plan(overlap_tp=False))
    split = estimate_step(MODEL, cl, tp_plan(tp_async=True))
    delta = split.time_breakdown["compute"] - plain.time_breakdown["compute"]
    check(delta, LAYERS * 2 * 4 * (2 - 1) * f0 * 1e9 / PEAK)


def test_a_scaling_the_model_does_not_know_is_a_one_line_error() -> None:
    """`fp8_scaling` takes tensorwise or rowwise; anything else names the field and the
    values allowed."""
    from shardmeter.errors import UserInputError
    from shardmeter.specs.loader import load_plan

    with pytest.raises(UserInputError) as err:
        load_plan({"tp": 2, "precision": "fp8", "fp8_scaling": "blockwise"})
    text = str(err.value)
    assert "fp8_scaling" in text and "tensorwise" in text and "\n" not in text


def test_torchtitan_asynctp_rows_carry_their_published_recipe(
    corrected_plans: Callable[[str], dict[str, Plan]],
) -> None:
    """benchmarks/runs_corrections.csv sets the asyncTP benchmark's float8 rowwise runs (185,
    186, 191, 192) to rowwise scaling and its Async TP runs (184, 186, 190, 192) to async TP;
    the bf16 and tensorwise vanilla runs keep torchtitan's defaults (tensorwise, async TP off)."""
    plans = {k: p for k, p in corrected_plans("S7").items() if 181 <= int(k) <= 192}
    assert {k for k, p in plans.items() if p.fp8_scaling == "rowwise"} == {
        "185",
        "186",
        "191",
        "192",
    }
    assert {k for k, p in plans.items() if p.tp_async} == {"184", "186", "190", "192"}
    assert not any(p.overlap_tp for p in plans.values())
