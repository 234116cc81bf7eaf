"""Closed forms of the GEMM chunks that tensor-parallel comm-GEMM overlap runs.

Matmul efficiency max·F/(F + F_half) with max 1 makes a GEMM of F FLOPs take (F + F_half)/P
at peak P, so one split into c chunks of F/c takes (F + c·F_half)/P: each chunk beyond the
first costs F_half/P. Element-wise traffic is negligible (1e18 B/s HBM) and the links are
free, so the differences below are exactly those chunk costs.
"""

from __future__ import annotations

import pytest

from shardmeter.estimate.compute import PIPELINE_SPLITS, layer_forward
from shardmeter.estimate.plan_arrays import PlanArrays
from shardmeter.estimate.step import estimate_step
from shardmeter.specs.hardware import Accelerator, Cluster, Efficiency, Link
from shardmeter.specs.model import TransformerSpec
from shardmeter.specs.plan import Plan

H, HEADS, FFN, VOCAB, SEQ, LAYERS = 1024, 8, 4096, 8192, 1024, 8
PEAK = 1000e12  # FLOP/s bf16
F_HALF_GFLOP = 2.0  # GEMM size at half efficiency
CHUNK_S = F_HALF_GFLOP * 1e9 / PEAK  # seconds one more chunk costs
REL = 1e-9


def model() -> TransformerSpec:
    return TransformerSpec(
        name="chunks", n_layers=LAYERS, hidden=H, n_heads=HEADS, ffn=FFN, mlp="gelu",
        vocab=VOCAB, seq_len=SEQ,
    )  # fmt: skip


def cluster() -> Cluster:
    acc = Accelerator(
        name="chunks-gpu",
        peak_tflops={"bf16": PEAK / 1e12},
        hbm_gb=80,
        hbm_gbps=1e9,
        efficiency=Efficiency(
            matmul_max=1.0, matmul_half_gflop=F_HALF_GFLOP, memory=1.0, attention=1.0,
            kernel_launch_us=0.0,
        ),
    )  # fmt: skip
    link = Link(name="nvlink", bandwidth_gbps=1e12, latency_us=0.0, efficiency=1)
    return Cluster(
        name="chunks", accelerator=acc, gpus_per_node=8, nvlink_domain=8, intra=link,
        inter=link, overlap_slowdown=0.0, memory_overhead_gb=1.0,
    )  # fmt: skip


def plan(tp: int, overlap: bool, compiled: bool = False) -> Plan:
    return Plan(
        tp=tp, sp=True, overlap_tp=overlap, compiled=compiled, micro_batch=1, global_batch=1,
    )  # fmt: skip


@pytest.mark.parametrize(("tp", "compiled"), [(2, False), (4, False), (8, False), (2, True)])
def test_overlapped_gemms_run_in_chunks(tp: int, compiled: bool) -> None:
    """Forward: QKV and MLP up in tp ring-exchange chunks, output projection and MLP down in
    PIPELINE_SPLITS pipelined chunks (tp under XLA's collective matmul), 2·(tp − 1) + 2·(pipe
    − 1) more chunks; backward: the output projection's and MLP down's data gradients in tp
    chunks, 2·(tp − 1) more; the other GEMMs whole."""
    acc = cluster().accelerator
    off = layer_forward(model(), PlanArrays.scalar(plan(tp, False)), acc, moe=False)
    on = layer_forward(model(), PlanArrays.scalar(plan(tp, True, compiled)), acc, moe=False)
    pipe = tp if compiled else PIPELINE_SPLITS
    fwd_chunks = 2 * (tp - 1) + 2 * (pipe - 1)
    assert on.gemm_s - off.gemm_s == pytest.approx(fwd_chunks * CHUNK_S, rel=REL)
    assert off.gemm_bwd_s == pytest.approx(2.0 * off.gemm_s, rel=REL)
    bwd_chunks = 2 * (tp - 1)
    assert on.gemm_bwd_s - off.gemm_bwd_s == pytest.approx(bwd_chunks * CHUNK_S, rel=REL)


def test_step_pays_the_chunks_per_layer_and_micro_batch() -> None:
    """tp 4, two micro-batches: the step grows by layers · m · (12 + 6) chunks (forward:
    QKV, up 3 each, output, down 3 each; backward: two data gradients 3 each)."""
    world = cluster()
    base = plan(4, False).model_copy(update={"global_batch": 2})
    ref = estimate_step(model(), world, base)
    est = estimate_step(model(), world, base.model_copy(update={"overlap_tp": True}))
    extra = LAYERS * 2 * (12 + 6) * CHUNK_S
    assert est.step_time_s - ref.step_time_s == pytest.approx(extra, rel=1e-6)


@pytest.mark.parametrize("update", [{"overlap_tp": False}, {"sp": False}, {"tp": 1}])
def test_no_chunks_without_sequence_parallel_overlap(update: dict[str, object]) -> None:
    """Whole GEMMs without comm-GEMM overlap, without sequence parallelism (TE's userbuffers
    overlap needs it) or at tp 1."""
    acc = cluster().accelerator
    p = plan(4, True).model_copy(update=update)
    cost = layer_forward(model(), PlanArrays.scalar(p), acc, moe=False)
    whole = layer_forward(model(), PlanArrays.scalar(plan(4, False)), acc, moe=False)
    assert cost.gemm_bwd_s == pytest.approx(2.0 * cost.gemm_s, rel=REL)
    if update != {"tp": 1}:
        assert cost.gemm_s == pytest.approx(whole.gemm_s, rel=REL)
