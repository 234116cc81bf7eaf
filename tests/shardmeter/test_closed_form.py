"""Hand-derived closed forms: one plan per mechanism, step time and memory worked out here.

The worlds are chosen so every term is a short formula: matmul efficiency 1 (no half-size),
latency 0 (except where a test is about latency), HBM so fast that element-wise traffic is
negligible (except in the tests about it), and links of round bandwidths. Each test spells out
its arithmetic from the papers' formulas, independently of the estimator's helpers, so a wrong
count, factor or window in `estimate/step.py`, `comm.py`, `compute.py` or `memory.py` fails a
named test here (see benchmarks/mutation_check.py, which applies such bugs and lists the
failing tests).
"""

from __future__ import annotations

import math

import pytest

from shardmeter.estimate.memory import in_flight_layers
from shardmeter.estimate.plan_arrays import PlanArrays
from shardmeter.estimate.step import estimate_step
from shardmeter.specs.hardware import Accelerator, Cluster, Efficiency, Link
from shardmeter.specs.model import MLASpec, MoESpec, TransformerSpec
from shardmeter.specs.plan import Plan

H, HEADS, FFN, VOCAB, SEQ, LAYERS = 1024, 8, 4096, 8192, 1024, 8
MODEL = TransformerSpec(
    name="closed-form", n_layers=LAYERS, hidden=H, n_heads=HEADS, ffn=FFN, mlp="gelu",
    vocab=VOCAB, seq_len=SEQ,
)  # fmt: skip
PEAK = 1000e12  # FLOP/s bf16
W_NV, W_IB = 100e9, 10e9  # bytes/s per GPU per direction, efficiency 1
U = 0.2  # overlap slowdown: hidden communication costs U/(1-U) = 1/4 of itself in compute
K = U / (1.0 - U)
OVERHEAD = 1e9
REL = 1e-5  # element-wise traffic (1e18 B/s HBM) and float noise stay far below this


def accelerator(hbm_bytes_per_s: float = 1e18, launch_us: float = 0.0) -> Accelerator:
    return Accelerator(
        name="closed-form-gpu",
        peak_tflops={"bf16": PEAK / 1e12, "fp8": 2 * PEAK / 1e12},
        hbm_gb=80,
        hbm_gbps=hbm_bytes_per_s / 1e9,
        efficiency=Efficiency(
            matmul_max=1.0, matmul_half_gflop=0.0, memory=1.0, attention=1.0, fp8_speedup=2.0,
            kernel_launch_us=launch_us,
        ),
    )  # fmt: skip


def cluster(domain: int = 4, latency_us: float = 0.0, **acc: float) -> Cluster:
    return Cluster(
        name="closed-form",
        accelerator=accelerator(**acc),
        gpus_per_node=domain,
        nvlink_domain=domain,
        intra=Link(name="nvlink", bandwidth_gbps=W_NV / 1e9, latency_us=latency_us, efficiency=1),
        inter=Link(name="ib", bandwidth_gbps=W_IB / 1e9, latency_us=latency_us, efficiency=1),
        overlap_slowdown=U,
        memory_overhead_gb=OVERHEAD / 1e9,
    )


CLUSTER = cluster()

# --- per-layer work of MODEL at tp = 1 (Megatron shapes, causal flash attention) -----------
LAYER_PARAMS = 4 * H * H + 2 * H * FFN  # Q, K, V, O + MLP up and down
TABLE_PARAMS = VOCAB * H  # embedding or output head


def gemm_s(tokens: float, tp: int = 1) -> float:
    """QKV (3h wide), output projection and the 2-matrix MLP of one layer, forward."""
    return 2 * tokens * H * (4 * H + 2 * FFN) / tp / PEAK


def attn_s(tokens: float, tp: int = 1) -> float:
    """Causal flash attention: 4·T·s·h/2 FLOPs forward."""
    return 4 * tokens * SEQ * H / 2 / tp / PEAK


def head_s(tokens: float, tp: int = 1) -> float:
    return 2 * tokens * H * VOCAB / tp / PEAK


def layer_fwd_bwd(tokens: float, tp: int = 1) -> float:
    """Forward G + A, backward 2G (data + weight gradients) + 2.5A (FlashAttention-2)."""
    return 3 * gemm_s(tokens, tp) + 3.5 * attn_s(tokens, tp)


def layer_bwd(tokens: float, tp: int = 1) -> float:
    return 2 * gemm_s(tokens, tp) + 2.5 * attn_s(tokens, tp)


def activations(tokens: float, tp: int = 1, sp: bool = False) -> float:
    """Saved bytes of one layer (flash, no dropout, GELU): 2 B × (two norm inputs, QKV and MLP
    inputs: 4h, /tp with SP; q, k, v, attention output, MLP input and output: 4h + 2F, /tp)."""
    norm = 4 * H * tokens / (tp if sp else 1)
    return 2 * (norm + tokens * (4 * H + 2 * FFN) / tp)


def overlap(comm: float, window: float) -> float:
    """Exposed part plus the slowdown of the hidden part: max(0, c − W) + K·min(c, W)."""
    return max(comm - window, 0.0) + K * min(comm, window)


def ring(n: int, nbytes: float, w: float) -> float:
    """Ring all-gather / reduce-scatter of an n-rank group: (n−1)/n · M / W."""
    return (n - 1) / n * nbytes / w


def states(params: float, shard: int, stage: int) -> float:
    """ZeRO: 2 B weights, 2 B grads, 12 B optimizer; stage 1 shards the 12, 2 the grads, 3 all."""
    return (
        2 * params / (shard if stage >= 3 else 1)
        + 2 * params / (shard if stage >= 2 else 1)
        + 12 * params / shard
    )


def check(est_value: float, expected: float) -> None:
    assert est_value == pytest.approx(expected, rel=REL)


# --- ZeRO / DDP ------------------------------------------------------------------------------
def _zero_plan(stage: str, overlap_on: bool) -> Plan:
    return Plan(
        dp=4, sharding=stage, micro_batch=1, global_batch=8, overlap_dp=overlap_on,
        overlap_param_gather=overlap_on,
    )  # fmt: skip


T1 = 1024.0  # tokens of one micro-batch (b = 1, s = 1024)
STAGE_PARAMS = LAYERS * LAYER_PARAMS + 2 * TABLE_PARAMS
STAGE_WORK = LAYERS * layer_fwd_bwd(T1) + 3 * head_s(T1)  # + embedding (memory traffic only)
STAGE_FWD = LAYERS * (gemm_s(T1) + attn_s(T1)) + head_s(T1)
STAGE_BWD = LAYERS * layer_bwd(T1) + 2 * head_s(T1)
LOGITS = T1 * VOCAB * 6  # at the loss backward: saved log-softmax + two gradients
SINGLE_STAGE_ACT = LAYERS * activations(T1)


def test_zero1_without_overlap() -> None:
    """ZeRO-1 over 4 GPUs of one NVLink domain, m = 2: once per step the gradients
    reduce-scatter and the parameters all-gather, both fully exposed."""
    est = estimate_step(MODEL, CLUSTER, _zero_plan("zero1", False))
    rs = ring(4, 2 * STAGE_PARAMS, W_NV)
    ag = ring(4, 2 * STAGE_PARAMS, W_NV)
    check(est.step_time_s, 2 * STAGE_WORK + rs + ag)
    check(est.time_breakdown["fsdp_comm"], ag)
    check(est.time_breakdown["dp_comm"], rs)
    memory = states(STAGE_PARAMS, 4, 1) + SINGLE_STAGE_ACT + LOGITS + OVERHEAD
    check(est.memory_bytes, memory)
    # 16-bit master-weight remainders: 10 optimizer bytes per parameter instead of 12.
    plan = _zero_plan("zero1", False).model_copy(update={"master_weights": "remainder"})
    slim = estimate_step(MODEL, CLUSTER, plan)
    check(est.memory_bytes - slim.memory_bytes, 2 * STAGE_PARAMS / 4)


def test_zero1_with_overlap() -> None:
    """Overlapped: the reduce-scatter hides behind the last micro-batch's backward only, the
    all-gather behind the next forward; each pays U/(1−U) of what it hides."""
    est = estimate_step(MODEL, CLUSTER, _zero_plan("zero1", True))
    rs = ring(4, 2 * STAGE_PARAMS, W_NV)
    ag = ring(4, 2 * STAGE_PARAMS, W_NV)
    check(est.time_breakdown["dp_comm"], overlap(rs, STAGE_BWD))
    check(est.time_breakdown["fsdp_comm"], overlap(ag, STAGE_FWD))
    check(est.step_time_s, 2 * STAGE_WORK + overlap(rs, STAGE_BWD) + overlap(ag, STAGE_FWD))


def test_zero2_with_overlap() -> None:
    """ZeRO-2 reduce-scatters every unit's gradients every micro-batch under that unit's
    backward (layers, then the head; the embedding has nothing to hide behind), and
    all-gathers the parameters once per step."""
    est = estimate_step(MODEL, CLUSTER, _zero_plan("zero2", True))
    layer_rs = overlap(ring(4, 2 * LAYER_PARAMS, W_NV), layer_bwd(T1))
    head_rs = overlap(ring(4, 2 * TABLE_PARAMS, W_NV), 2 * head_s(T1))
    embed_rs = ring(4, 2 * TABLE_PARAMS, W_NV)
    per_mb = LAYERS * layer_rs + head_rs + embed_rs
    ag = overlap(ring(4, 2 * STAGE_PARAMS, W_NV), STAGE_FWD)
    check(est.time_breakdown["dp_comm"], 2 * per_mb)
    check(est.step_time_s, 2 * (STAGE_WORK + per_mb) + ag)
    memory = states(STAGE_PARAMS, 4, 2) + SINGLE_STAGE_ACT + LOGITS + OVERHEAD
    check(est.memory_bytes, memory)


def test_zero3_with_overlap() -> None:
    """ZeRO-3: each unit gathers its weights under its own forward and again, with its
    gradient reduce-scatter, under its backward; the first layer's gather of every
    micro-batch is exposed. Memory: all states /d and a prefetch buffer of two layers."""
    est = estimate_step(MODEL, CLUSTER, _zero_plan("zero3", True))
    ag_l, rs_l = ring(4, 2 * LAYER_PARAMS, W_NV), ring(4, 2 * LAYER_PARAMS, W_NV)
    ag_t, rs_t = ring(4, 2 * TABLE_PARAMS, W_NV), ring(4, 2 * TABLE_PARAMS, W_NV)
    layer = overlap(ag_l, gemm_s(T1) + attn_s(T1)) + overlap(ag_l + rs_l, layer_bwd(T1))
    head = overlap(ag_t, head_s(T1)) + overlap(ag_t + rs_t, 2 * head_s(T1))
    embed = ag_t + ag_t + rs_t  # no compute window
    per_mb = LAYERS * layer + head + embed + ag_l
    check(est.time_breakdown["fsdp_comm"] + est.time_breakdown["dp_comm"], 2 * per_mb)
    check(est.step_time_s, 2 * (STAGE_WORK + per_mb))
    buffer = 2 * 2 * LAYER_PARAMS * (1 - 1 / 4)
    memory = states(STAGE_PARAMS, 4, 3) + SINGLE_STAGE_ACT + LOGITS + buffer + OVERHEAD
    check(est.memory_bytes, memory)


def test_zero3_without_overlap() -> None:
    """Gathers on demand: every gather and reduce-scatter is exposed."""
    est = estimate_step(MODEL, CLUSTER, _zero_plan("zero3", False))
    ag_l, ag_t = ring(4, 2 * LAYER_PARAMS, W_NV), ring(4, 2 * TABLE_PARAMS, W_NV)
    per_mb = LAYERS * 3 * ag_l + 2 * 3 * ag_t + ag_l
    check(est.step_time_s, 2 * (STAGE_WORK + per_mb))


def test_zero3_kept_gathered_skips_the_backward_gather() -> None:
    """ZeRO-3 with reshard_after_forward false (FSDP2), no pipeline, overlap off: each unit
    gathers forward every micro-batch and keeps the weights for its backward, which only
    reduce-scatters: 2 collectives per unit and micro-batch instead of 3."""
    plan = _zero_plan("zero3", False).model_copy(update={"reshard_after_forward": False})
    est = estimate_step(MODEL, CLUSTER, plan)
    ag_l, ag_t = ring(4, 2 * LAYER_PARAMS, W_NV), ring(4, 2 * TABLE_PARAMS, W_NV)
    per_mb = LAYERS * 2 * ag_l + 2 * 2 * ag_t + ag_l
    check(est.step_time_s, 2 * (STAGE_WORK + per_mb))


def test_ddp_gradient_all_reduce_across_nodes_with_step_syncs() -> None:
    """DDP over 8 GPUs in 2 NVLink domains of 4 with 5 µs latency: the hierarchical
    all-reduce RS_nvlink(M, 4) + AR_ib(M/4, 2) + AG_nvlink(M, 4) once per step, exposed; and
    two latency-bound tree all-reduces (loss, gradient norm) of 2·log2(g)·α + 2·log2(n/g)·α."""
    alpha = 5e-6
    world = cluster(latency_us=5.0)
    plan = Plan(dp=8, micro_batch=1, global_batch=8, overlap_dp=False)
    est = estimate_step(MODEL, world, plan)
    grads = 2 * STAGE_PARAMS
    intra = 3 * (alpha + grads / (4 * W_NV))
    inter = 2 * 1 * (alpha + (grads / 4) / (2 * W_IB))
    syncs = 2 * (2 * math.log2(4) * alpha + 2 * math.log2(2) * alpha)
    check(est.time_breakdown["dp_comm"], 2 * intra + inter + syncs)
    check(est.step_time_s, STAGE_WORK + 2 * intra + inter + syncs)


def test_all_gather_is_a_flat_ring_in_latency() -> None:
    """ZeRO-1 over 8 GPUs in 2 NVLink domains with 5 µs per hop, overlap off: the gradient
    reduce-scatter and the parameter all-gather move their bytes hierarchically (3/4·M over
    NVLink, then 1/2·M/4 over the NIC) but, as NCCL's one flat ring, pay n − 1 = 7 hop
    latencies (NCCL tuning.cc: nsteps − nInterSteps intra hops, nInterSteps inter hops)."""
    alpha = 5e-6
    world = cluster(latency_us=5.0)
    plan = Plan(dp=8, sharding="zero1", micro_batch=1, global_batch=8, overlap_dp=False,
                overlap_param_gather=False)  # fmt: skip
    est = estimate_step(MODEL, world, plan)
    m = 2 * STAGE_PARAMS
    ring_time = 3 / 4 * m / W_NV + 1 / 2 * (m / 4) / W_IB + 7 * alpha
    syncs = 2 * (2 * math.log2(4) * alpha + 2 * math.log2(2) * alpha)
    check(est.time_breakdown["fsdp_comm"], ring_time)
    check(est.time_breakdown["dp_comm"], ring_time + syncs)


def test_zero3_per_matrix_gathers_copy_back_and_regather() -> None:
    """DeepSpeed-style ZeRO-3 (one all-gather per weight matrix, 6 per GELU layer), full
    recompute, nothing prefetched, 20 µs per launch: each matrix gather first builds its list
    of d = 4 shard views on the host (one op per rank, 4·20 µs, before the ring), then lands
    in them, copied back one launch per rank, so it takes 80 µs + max(ring, 4·20 µs); a
    layer gathers forward, again for its recomputed forward and again for its backward. The
    tables (not recomputed) gather twice, bandwidth-bound after their views; the first
    matrix of every micro-batch is exposed once more. Gradients reduce-scatter once per
    layer."""
    world = cluster(launch_us=20.0)
    plan = Plan(dp=4, sharding="zero3", micro_batch=1, global_batch=8, overlap_dp=False,
                overlap_param_gather=False, gather_unit="matrix", recompute="full")  # fmt: skip
    est = estimate_step(MODEL, world, plan)
    views = 4 * 20e-6
    matrix = views + max(ring(4, 2 * LAYER_PARAMS / 6, W_NV), 4 * 20e-6)
    table = views + max(ring(4, 2 * TABLE_PARAMS, W_NV), 4 * 20e-6)
    per_mb = LAYERS * 3 * 6 * matrix + 2 * 2 * table + matrix
    check(est.time_breakdown["fsdp_comm"], 2 * per_mb)
    rs = LAYERS * ring(4, 2 * LAYER_PARAMS, W_NV) + 2 * ring(4, 2 * TABLE_PARAMS, W_NV)
    check(est.time_breakdown["dp_comm"], 2 * rs)


def test_zero3_per_matrix_gathers_stream_their_bytes_through_hbm() -> None:
    """The plan above on a GPU with 100 GB/s of HBM: each list gather also zero-fills its
    buffer (DeepSpeed 0.3 `_allgather_param`, torch.zeros: 1 pass over the gathered bytes)
    and copies NCCL's flat output back into the shard views (c10d ProcessGroupNCCL::allgather:
    read + write, 2 passes) after the ring. A matrix (4.2 MB) takes 4·20 µs of host views +
    max(ring + 2 passes, 4·20 µs) + 1 pass = 80 + max(31 + 84, 80) + 42 µs; the tables
    (16.8 MB) likewise."""
    hbm = 100e9
    world = cluster(launch_us=20.0, hbm_bytes_per_s=hbm)
    plan = Plan(dp=4, sharding="zero3", micro_batch=1, global_batch=8, overlap_dp=False,
                overlap_param_gather=False, gather_unit="matrix", recompute="full")  # fmt: skip
    est = estimate_step(MODEL, world, plan)

    def gather(n_bytes: float) -> float:
        return (
            4 * 20e-6 + max(ring(4, n_bytes, W_NV) + 2 * n_bytes / hbm, 4 * 20e-6) + n_bytes / hbm
        )

    matrix, table = gather(2 * LAYER_PARAMS / 6), gather(2 * TABLE_PARAMS)
    assert matrix > ring(4, 2 * LAYER_PARAMS / 6, W_NV) + 2 * 2 * LAYER_PARAMS / 6 / hbm
    per_mb = LAYERS * 3 * 6 * matrix + 2 * 2 * table + matrix
    check(est.time_breakdown["fsdp_comm"], 2 * per_mb)
    # FSDP's flat-parameter gathers (gather_unit "layer") copy nothing back: HBM speed does
    # not change their exposed time
    flat = plan.model_copy(update={"gather_unit": "layer"})
    slow_hbm = estimate_step(MODEL, world, flat).time_breakdown["fsdp_comm"]
    fast_hbm = estimate_step(MODEL, cluster(launch_us=20.0), flat).time_breakdown["fsdp_comm"]
    check(slow_hbm, fast_hbm)


def test_zero3_list_gather_builds_its_views_on_the_host_before_the_ring() -> None:
    """DeepSpeed 0.3-0.4 `_allgather_param` synchronizes the device, then builds the list of
    d shard views in a Python loop (one op per rank) and only then launches the ring: that
    host time adds to every per-matrix gather and is not hidden in the max with the ring.
    With a 1 ms launch (host-bound: ring ≪ d·launch) each matrix gather costs 2·d·launch,
    so going from 4 to 8 ranks adds 2·4·1 ms per gather; FSDP's flat gathers (gather_unit
    "layer") build no views: their time does not depend on the launch time."""

    def fsdp(dp: int, unit: str, launch_us: float = 1000.0) -> float:
        plan = Plan(dp=dp, sharding="zero3", micro_batch=1, global_batch=dp, overlap_dp=False,
                    overlap_param_gather=False, gather_unit=unit, recompute="full")  # fmt: skip
        world = cluster(domain=8, launch_us=launch_us)
        return estimate_step(MODEL, world, plan).time_breakdown["fsdp_comm"]

    gathers = LAYERS * 3 * 6 + 2 * 2 + 1  # matrices x (forward, recompute, backward), tables
    check(fsdp(8, "matrix") - fsdp(4, "matrix"), gathers * 2 * 4 * 1e-3)
    check(fsdp(4, "layer"), fsdp(4, "layer", launch_us=0.0))


# --- pipelines ------------------------------------------------------------------------------
HALF = LAYERS // 2


def test_pipeline_1f1b() -> None:
    """pp 2, dp 4, m = 4: the last stage (4 layers + head) sets the pace; the bubble is the
    rest of the stages' work, (Σ_s t_s − max_s t_s)/1; every send is exposed: 2·m hops of
    T·h·2 bytes, over the NIC because the stage stride tp·cp·dp = 4 reaches the domain size.
    DDP gradients all-reduce once, exposed (overlap off). Memory: stage 0 holds p = 2
    micro-batches of its 4 layers."""
    plan = Plan(dp=4, pp=2, micro_batch=1, global_batch=16, overlap_dp=False)
    est = estimate_step(MODEL, CLUSTER, plan)
    last = HALF * layer_fwd_bwd(T1) + 3 * head_s(T1)
    first = HALF * layer_fwd_bwd(T1)
    sends = 2 * 4 * (T1 * H * 2 / W_IB)
    stage_params = HALF * LAYER_PARAMS + TABLE_PARAMS
    ar = 2 * ring(4, 2 * stage_params, W_NV)
    check(est.time_breakdown["pp_comm"], sends)
    check(est.time_breakdown["bubble"], first)
    check(est.step_time_s, 4 * last + first + sends + ar)
    memory = states(stage_params, 1, 0) + 2 * HALF * activations(T1) + OVERHEAD
    check(est.memory_bytes, memory)


def test_zero3_kept_gathered_under_pipeline_gathers_once_per_step() -> None:
    """pp 2, dp 4, ZeRO-3 with the weights kept gathered (reshard_after_forward false, as
    torchtitan sets under PP) and overlap off, m = 4: torch.distributed.pipelining keeps them
    through every backward but the last and syncs gradients only then, so each stage gathers
    its weights once and reduce-scatters its gradients once per step, not per micro-batch;
    both are exposed on the stage holding the most parameters (both stages hold 4 layers and
    one table)."""
    plan = Plan(dp=4, pp=2, sharding="zero3", micro_batch=1, global_batch=16, overlap_dp=False,
                overlap_param_gather=False, reshard_after_forward=False)  # fmt: skip
    est = estimate_step(MODEL, CLUSTER, plan)
    last = HALF * layer_fwd_bwd(T1) + 3 * head_s(T1)
    first = HALF * layer_fwd_bwd(T1)
    sends = 2 * 4 * (T1 * H * 2 / W_IB)
    stage_params = HALF * LAYER_PARAMS + TABLE_PARAMS
    once = ring(4, 2 * stage_params, W_NV)
    check(est.time_breakdown["fsdp_comm"], once)
    check(est.time_breakdown["dp_comm"], once)
    check(est.step_time_s, 4 * last + first + sends + 2 * once)
    check(est.comm_bytes["fsdp"], 2 * stage_params)  # one gather of bf16 weights
    check(est.comm_bytes["dp"], 2 * stage_params)  # one reduce-scatter of bf16 grads


def test_pipeline_interleaved() -> None:
    """pp 2, v 2 (chunks of 2 layers), m = 4: the bubble shrinks by v; all but the 2(p−1)
    fill/drain sends hide under compute at U/(1−U); stage 0 holds (p·v + p − 1)/v = 2.5
    micro-batches of its layers (Megatron's warm-up)."""
    plan = Plan(dp=4, pp=2, vpp=2, micro_batch=1, global_batch=16, overlap_dp=False)
    est = estimate_step(MODEL, CLUSTER, plan)
    last = HALF * layer_fwd_bwd(T1) + 3 * head_s(T1)
    first = HALF * layer_fwd_bwd(T1)
    hop = T1 * H * 2 / W_IB
    sends = 2 * 1 * hop + K * (2 * 4 * 2 - 2) * hop
    stage_params = HALF * LAYER_PARAMS + TABLE_PARAMS
    ar = 2 * ring(4, 2 * stage_params, W_NV)
    check(est.time_breakdown["bubble"], first / 2)
    check(est.time_breakdown["pp_comm"], sends)
    check(est.step_time_s, 4 * last + first / 2 + sends + ar)
    memory = states(stage_params, 1, 0) + 2.5 * HALF * activations(T1) + OVERHEAD
    check(est.memory_bytes, memory)


def test_interleaved_chunks_reduce_their_gradients_as_each_finishes() -> None:
    """Interleaved, each model chunk launches its gradient reduction when its own last
    backward ends (Megatron-Core's grad_sync_func per chunk), so the step's reduction hides
    behind the last round's backward, not the last micro-batch's alone: pp 2, v 2, m 4, a
    window of (1 + (v − 1)·pp)/v = 1.5 backwards of the slowest (last) stage, where
    plain 1F1B has one; the all-reduce pays max(0, T − W) + K·min(T, W)."""
    plan = Plan(dp=4, pp=2, vpp=2, micro_batch=1, global_batch=16, overlap_dp=True)
    est = estimate_step(MODEL, CLUSTER, plan)
    stage_params = HALF * LAYER_PARAMS + TABLE_PARAMS
    ar = 2 * ring(4, 2 * stage_params, W_NV)
    last_bwd = HALF * layer_bwd(T1) + 2 * head_s(T1)
    check(est.time_breakdown["dp_comm"], overlap(ar, 1.5 * last_bwd))
    plain = estimate_step(MODEL, CLUSTER, plan.model_copy(update={"vpp": 1}))
    check(plain.time_breakdown["dp_comm"], overlap(ar, last_bwd))
    deep = estimate_step(MODEL, CLUSTER, plan.model_copy(update={"vpp": 4}))  # (1 + 3·2)/4
    check(deep.time_breakdown["dp_comm"], overlap(ar, 1.75 * last_bwd))
    # ZeRO-1: the next step's parameter all-gathers go chunk by chunk ahead of each chunk's
    # first forward, the same 1.5 forwards.
    zero1 = plan.model_copy(update={"sharding": "zero1", "overlap_param_gather": True})
    est = estimate_step(MODEL, CLUSTER, zero1)
    ag = ring(4, 2 * stage_params, W_NV)
    last_fwd = HALF * (gemm_s(T1) + attn_s(T1)) + head_s(T1)
    check(est.time_breakdown["fsdp_comm"], overlap(ag, 1.5 * last_fwd))
    check(est.time_breakdown["dp_comm"], overlap(ag, 1.5 * last_bwd))


def test_uneven_stages_middle_is_slowest_and_fullest() -> None:
    """pp 4 with one layer on the first and last stages: the middle stages hold 3 each. The
    slowest is a middle stage; the bubble is every other stage's work. The fullest is stage 1:
    3 layers × 3 micro-batches in flight (1F1B: p − 1) and no embedding table."""
    plan = Plan(pp=4, pp_first=1, pp_last=1, micro_batch=1, global_batch=8, overlap_dp=False)
    est = estimate_step(MODEL, CLUSTER, plan)
    mid = 3 * layer_fwd_bwd(T1)
    total = LAYERS * layer_fwd_bwd(T1) + 3 * head_s(T1)
    check(est.time_breakdown["bubble"], total - mid)
    sends = 2 * 8 * (T1 * H * 2 / W_NV)  # stride 1: stages talk over NVLink
    check(est.step_time_s, 8 * mid + (total - mid) + sends)
    memory = states(3 * LAYER_PARAMS, 1, 0) + 3 * 3 * activations(T1) + OVERHEAD
    check(est.memory_bytes, memory)


def test_uneven_stages_last_holds_the_logits() -> None:
    """pp 2 split 2 + 6 (explicit list), m = 2: the last stage has 6 layers, the head and the
    logits buffer, and is both the slowest and the fullest."""
    plan = Plan(pp=2, pp_layers=(2, 6), micro_batch=1, global_batch=2, overlap_dp=False)
    est = estimate_step(MODEL, CLUSTER, plan)
    last = 6 * layer_fwd_bwd(T1) + 3 * head_s(T1)
    first = 2 * layer_fwd_bwd(T1)
    sends = 2 * 2 * (T1 * H * 2 / W_NV)
    check(est.step_time_s, 2 * last + first + sends)
    memory = states(6 * LAYER_PARAMS + TABLE_PARAMS, 1, 0) + 6 * activations(T1) + LOGITS
    check(est.memory_bytes, memory + OVERHEAD)


# --- context and expert parallelism ------------------------------------------------------
def test_context_parallel_ring() -> None:
    """cp 2: each GPU holds 512 tokens and runs 2 flash kernels of half the work; per layer the
    ring sends (cp−1) K,V blocks forward and twice that backward, each hidden only behind the
    attention core (forward A, backward 2.5A). DDP gradients all-reduce over the 2 cp ranks."""
    plan = Plan(cp=2, micro_batch=1, global_batch=1, overlap_dp=False)
    est = estimate_step(MODEL, CLUSTER, plan)
    t = 512.0
    a = attn_s(t) * 1.0  # 4·T·s·h/2 with s = 1024 keys: cp kernels of 1/cp each, same total
    block = 2 * t * H * 2  # K and V of the local tokens, bf16
    hop = block / W_NV
    cp_layer = overlap(hop, a) + overlap(2 * hop, 2.5 * a)
    work = LAYERS * (layer_fwd_bwd(t) + cp_layer) + 3 * head_s(t)
    ar = 2 * ring(2, 2 * STAGE_PARAMS, W_NV)
    check(est.time_breakdown["cp_comm"], LAYERS * cp_layer)
    check(est.step_time_s, work + ar)
    memory = states(STAGE_PARAMS, 1, 0) + LAYERS * activations(t) + t * VOCAB * 6 + OVERHEAD
    check(est.memory_bytes, memory)


MOE = MODEL.model_copy(update={"moe": MoESpec(experts=4, top_k=2)})
EP_CLUSTER = cluster(domain=2)


def _moe_compute(tokens: float) -> float:
    """Per-layer forward+backward of the MoE model with 1 local expert of tokens·k·ep/E rows
    and a router GEMM of 2·T·h·E."""
    attn_gemm = 2 * tokens * H * 4 * H / PEAK
    expert = 2 * (tokens * 2 * 4 / 4) * H * FFN * 2 / PEAK
    router = 2 * tokens * H * 4 / PEAK
    return 3 * (attn_gemm + expert + router) + 3.5 * attn_s(tokens)


def test_expert_all_to_all() -> None:
    """ep 4 over 2 NVLink domains of 2, forced balance: each token's k = 2 copies go 1/4 to the
    domain peer and 2/4 to the other domain; the NIC and NVLink parts move at once, the slower
    sets the time. Dispatch + combine forward and backward: 4 exchanges per layer, exposed."""
    plan = Plan(dp=4, ep=4, ep_imbalance=1.0, micro_batch=1, global_batch=4, overlap_dp=False)
    est = estimate_step(MOE, EP_CLUSTER, plan)
    copy = T1 * H * 2
    exchange = max(2 * 1 / 4 * copy / W_NV, 2 * 2 / 4 * copy / W_IB)
    check(est.time_breakdown["ep_comm"], LAYERS * 4 * exchange)
    check(est.time_breakdown["compute"], LAYERS * _moe_compute(T1) + 3 * head_s(T1))


def test_expert_dedup_fp8_node_limit_and_overlap() -> None:
    """DeepSeek-style dispatch: one copy per token and destination node (2 nodes reachable,
    expected distinct N·(1 − (1 − 1/N)^k) = 1.5, the routing limit 1 node of 2 groups), fanned
    out over NVLink (k·(g−1)/g copies); FP8 dispatch (1 + 4/128 B), BF16 combine; overlapped
    with the layer's forward and backward compute."""
    limited = MOE.model_copy(update={"moe": MoESpec(experts=4, top_k=2, n_groups=2, topk_groups=1)})
    plan = Plan(
        dp=4, ep=4, ep_imbalance=1.0, ep_dedup=True, ep_dispatch="fp8", overlap_ep=True,
        micro_batch=1, global_batch=4, overlap_dp=False,
    )  # fmt: skip
    est = estimate_step(limited, EP_CLUSTER, plan)
    remote_nodes = 1 * (2 - 1) / 2  # min(1.5, limit 1) distinct nodes, half of them remote

    def exchange(value_bytes: float) -> float:
        copy = T1 * H * value_bytes
        return max(2 * 1 / 2 * copy / W_NV, remote_nodes * copy / W_IB)

    layer_comm = 2 * (exchange(1 + 4 / 128) + exchange(2))
    window = _moe_compute(T1)
    check(est.time_breakdown["ep_comm"], LAYERS * overlap(layer_comm, window))
    # Without the routing limit a token reaches 2·(1 − (1/2)²) = 1.5 nodes, 0.75 remote.
    free = estimate_step(MOE, EP_CLUSTER, plan)
    remote_nodes = 1.5 * (2 - 1) / 2
    layer_comm = 2 * (exchange(1 + 4 / 128) + exchange(2))
    check(free.time_breakdown["ep_comm"], LAYERS * overlap(layer_comm, window))


# --- recompute ---------------------------------------------------------------------------
def test_full_recompute_with_tensor_parallel() -> None:
    """tp 2, full recompute: the forward runs twice, TP all-reduces 4 + 2 per layer of T·h·2
    bytes (ring over 2 NVLink ranks: M/W), exposed without comm-GEMM overlap. Memory keeps the
    layer input per layer plus the larger of one layer's full working set and the logits (the
    loss backward frees the logits before the last layer is re-run; the stated overhead stands
    for the allocator, so nothing is cached beside)."""
    plan = Plan(tp=2, recompute="full", micro_batch=1, global_batch=1)
    est = estimate_step(MODEL, CLUSTER, plan)
    fwd = gemm_s(T1, 2) + attn_s(T1, 2)
    tp_layer = 6 * 2 * (1 / 2) * (T1 * H * 2) / W_NV
    check(est.time_breakdown["recompute"], LAYERS * fwd)
    check(est.time_breakdown["tp_comm"], LAYERS * tp_layer)
    work = LAYERS * (layer_fwd_bwd(T1, 2) + fwd + tp_layer) + 3 * head_s(T1, 2)
    check(est.step_time_s, work)
    stage_params = (LAYERS * LAYER_PARAMS + 2 * TABLE_PARAMS) / 2
    logits = T1 * VOCAB / 2 * 6
    acts = LAYERS * 2 * H * T1 + max(activations(T1, 2), logits)
    memory = states(stage_params, 1, 0) + acts + OVERHEAD
    check(est.memory_bytes, memory)
    # Compiled (XLA): the recomputed forward drops the MLP down projection, dead code there.
    compiled = estimate_step(MODEL, CLUSTER, plan.model_copy(update={"compiled": True}))
    down = 2 * T1 * (FFN / 2) * H / PEAK
    check(compiled.time_breakdown["recompute"], LAYERS * (fwd - down))


def test_selective_recompute_counts_attention_and_elementwise() -> None:
    """Selective recompute re-runs the attention core and the element-wise ops, and keeps all
    but the attention output and the activation-function output (Korthikanti et al. 2022). HBM
    at 1e13 B/s so the element-wise traffic (norms, residuals, RoPE, GELU) shows."""
    world = cluster(hbm_bytes_per_s=1e13)
    plan = Plan(recompute="selective", micro_batch=1, global_batch=1)
    est = estimate_step(MODEL, world, plan)
    t = T1
    elem_bytes = 20 * t * H + 2 * t * (H + H) * 2 + 2 * t * FFN * 2
    elem = elem_bytes / 1e13
    check(est.time_breakdown["recompute"], LAYERS * (attn_s(t) + elem))
    kept = 2 * (4 * H * t + t * (4 * H + 2 * FFN) - t * (H + FFN))
    memory = states(STAGE_PARAMS, 1, 0) + LAYERS * kept + LOGITS + OVERHEAD
    check(est.memory_bytes, memory)


# --- new terms ------------------------------------------------------------------------------
def test_unfused_attention_scores_through_hbm() -> None:
    """Unfused attention: QKᵀ and AV as GEMMs over the full s² (4·T·s·h FLOPs), 13 B per score
    element through HBM forward, twice backward; the scores stay in memory, 5 B each
    (Korthikanti §4.1)."""
    world = cluster(hbm_bytes_per_s=1e13)
    flash = estimate_step(MODEL, world, Plan(micro_batch=1, global_batch=1))
    plan = Plan(attention="unfused", micro_batch=1, global_batch=1)
    est = estimate_step(MODEL, world, plan)
    scores = T1 * SEQ * HEADS
    unfused_fwd = 4 * T1 * SEQ * H / PEAK + 13 * scores / 1e13
    layer_delta = 3 * unfused_fwd - 3.5 * attn_s(T1)
    check(est.step_time_s - flash.step_time_s, LAYERS * layer_delta)
    check(est.memory_bytes - flash.memory_bytes, LAYERS * 5 * scores)


def test_kernel_launches_bound_tiny_layers_and_moe_sync() -> None:
    """At 10 µs per launch a tiny layer's 11 kernels outlast its GPU work (forward 110 µs,
    backward 220 µs); a dropless MoE layer adds 60 + 2 per local expert launches after its host
    sync, on top of the forward, and its backward launches twice everything."""
    tiny = TransformerSpec(n_layers=2, hidden=64, n_heads=1, ffn=256, vocab=64, seq_len=16)
    world = cluster(launch_us=10.0)
    est = estimate_step(tiny, world, Plan(micro_batch=1, global_batch=1))
    head = 3 * 10e-6 * 3  # head: 3 kernels forward, twice backward, launch-bound too
    embed = 1 * 10e-6 * 3
    check(est.step_time_s, 2 * (110e-6 + 220e-6) + head + embed)
    moe = tiny.model_copy(update={"moe": MoESpec(experts=4, top_k=1)})
    est_moe = estimate_step(moe, world, Plan(micro_batch=1, global_batch=1))
    synced = (60 + 2 * 4) * 10e-6
    layer = 110e-6 + synced + 2 * (110e-6 + synced)
    check(est_moe.step_time_s, 2 * layer + head + embed)
    graphs = estimate_step(tiny, world, Plan(micro_batch=1, global_batch=1, graphs=True))
    assert graphs.step_time_s < 1e-6


def test_moe_sync_launches_add_to_gpu_bound_forward() -> None:
    """At 2 µs per launch the MoE layer's GPU forward (45 µs) outlasts its 11 ordinary launches
    but the 60 + 2·4 launches after the host sync still add on top; the backward, with no
    sync, takes the larger of its GPU work and twice all launches."""
    world = cluster(launch_us=2.0)
    moe = MODEL.model_copy(update={"moe": MoESpec(experts=4, top_k=2)})
    est = estimate_step(moe, world, Plan(micro_batch=1, global_batch=1))
    g = (2 * T1 * H * 4 * H + 2 * T1 * 2 * H * FFN * 2 + 2 * T1 * H * 4) / PEAK
    a = attn_s(T1)
    launch, synced = 11 * 2e-6, (60 + 2 * 4) * 2e-6
    fwd = max(g + a, launch) + synced
    bwd = max(2 * g + 2.5 * a, 2 * (launch + synced))
    head = 3 * head_s(T1)  # 3 launches (6 µs) hide under the 17 µs head GEMM
    embed = 2e-6 + 4e-6  # launch-bound embedding lookup
    check(est.time_breakdown["compute"], LAYERS * (fwd + bwd) + head + embed)


def test_eager_elementwise_ops_move_more_bytes() -> None:
    """Eager PyTorch (torchtitan without compile) against fused kernels, SwiGLU model, 1 TB/s
    HBM: per token and layer, each RMSNorm moves 36 B per element instead of 4 (fp32 cast,
    pow, mean, scale, cast back, weight), RoPE 20 instead of 4 over q and k, SwiGLU 10
    instead of 6 per intermediate element; backward moves twice the forward's bytes."""
    world = cluster(hbm_bytes_per_s=1e12)
    swiglu = MODEL.model_copy(update={"mlp": "swiglu"})
    fused = estimate_step(swiglu, world, Plan(micro_batch=1, global_batch=1))
    eager = estimate_step(swiglu, world, Plan(micro_batch=1, global_batch=1,
                                              fused_elementwise=False))  # fmt: skip
    extra = 2 * (36 - 4) * H + (20 - 4) * (H + H) + (10 - 6) * FFN
    delta = eager.time_breakdown["compute"] - fused.time_breakdown["compute"]
    check(delta, LAYERS * 3 * T1 * extra / 1e12)


def test_fp8_operand_casts_outside_a_compiled_graph() -> None:
    """FP8 GEMMs (Transformer Engine / torchao) quantize each GEMM operand with a fused
    cast-transpose: read 2 B, write the FP8 tensor and its transpose, 1 + 1 B. Forward: the
    inputs of QKV (h), the output projection (q = h), the MLP up (h) and down (F) GEMMs;
    backward: their output gradients, 3h + h + F + h. 1 TB/s HBM, one micro-batch: the eager
    step pays 4 B × T × (3h + F + 5h + F) per layer more than the compiled (XLA) one, and a
    bf16 plan none. (Both also differ by the compiled graph's fused element-wise ops.)"""
    world = cluster(hbm_bytes_per_s=1e12)
    plan = Plan(micro_batch=1, global_batch=1, precision="fp8")
    eager = estimate_step(MODEL, world, plan)
    compiled = estimate_step(MODEL, world, plan.model_copy(update={"compiled": True}))
    elements = (3 * H + FFN) + (5 * H + FFN)
    delta = eager.time_breakdown["compute"] - compiled.time_breakdown["compute"]
    fusion = LAYERS * 3 * T1 * fusion_saving(MODEL) / 1e12
    check(delta, LAYERS * 4 * T1 * elements / 1e12 + fusion)
    # bf16: no casts either way; the compiled step differs only by its fused element-wise ops
    bf16 = Plan(micro_batch=1, global_batch=1)
    fused = estimate_step(MODEL, world, bf16).time_breakdown["compute"]
    fewer = estimate_step(MODEL, world, bf16.model_copy(update={"compiled": True}))
    check(fused - fewer.time_breakdown["compute"], LAYERS * 3 * T1 * fusion_saving(MODEL) / 1e12)


def fusion_saving(model: TransformerSpec) -> float:
    """Bytes per token and layer (forward) that one compiled graph does not move: the fused
    kernels' two norms (4 B), two residual adds (6 B) over h, RoPE (4 B) over q and k and the
    activation (GELU 4 B, SwiGLU 6 B) over F, less the two norms' statistics reads (2 B)."""
    act = 6 if model.mlp == "swiglu" else 4
    fused = 2 * 4 * H + 2 * 6 * H + 4 * (H + H) + act * model.ffn
    return fused - 2 * 2 * H


def test_compiled_step_fuses_elementwise_ops_into_the_matmuls() -> None:
    """One XLA graph (`compiled`) fuses the norms' scaling, the residual adds, RoPE and the
    activation into the neighbouring matmuls (a TPU fusion is at most one matmul plus its
    pointwise VPU ops, Austin et al. 2025, profiling.md); only each norm's statistics read of
    its bf16 input stays, 2 B per element. SwiGLU, 1 TB/s HBM, one micro-batch: forward and
    twice backward save T·(2·4h + 2·6h + 4·2h + 6F − 2·2h) B per layer. A MoE layer's token
    routing (permute, unpermute, router softmax) is no matmul epilogue and stays."""
    world = cluster(hbm_bytes_per_s=1e12)
    swiglu = MODEL.model_copy(update={"mlp": "swiglu"})
    plan = Plan(micro_batch=1, global_batch=1)
    compiled = plan.model_copy(update={"compiled": True})

    def compute(model: TransformerSpec, p: Plan) -> float:
        return estimate_step(model, world, p).time_breakdown["compute"]

    saved = LAYERS * 3 * T1 * fusion_saving(swiglu) / 1e12
    check(compute(swiglu, plan) - compute(swiglu, compiled), saved)
    # MoE: the routed experts' activation is over k·F per token; routing bytes cancel out
    moe = swiglu.model_copy(update={"moe": MoESpec(experts=4, top_k=2)})
    saved_moe = saved + LAYERS * 3 * T1 * 6 * FFN * (2 - 1) / 1e12
    check(compute(moe, plan) - compute(moe, compiled), saved_moe)


def test_step_waits_for_the_slowest_gpu() -> None:
    """GPU-to-GPU speed spread cv = 2%: a synchronous step of n GPUs waits for the slowest,
    whose GPU work takes 1 + cv·sqrt(2 ln n) times the mean (Gaussian extreme value). ZeRO-1
    on 4 GPUs without overlap: compute, recompute, optimizer and bubble stretch by
    1 + 0.02·sqrt(2 ln 4); the exposed communication does not. One GPU: no wait."""
    spread = cluster()
    spread = spread.model_copy(update={"accelerator": spread.accelerator.model_copy(
        update={"efficiency": spread.accelerator.efficiency.model_copy(
            update={"speed_cv": 0.02})})})  # fmt: skip
    plan = _zero_plan("zero1", False)
    even = estimate_step(MODEL, CLUSTER, plan)
    slow = estimate_step(MODEL, spread, plan)
    factor = 1 + 0.02 * math.sqrt(2 * math.log(4))
    for part in ("compute", "optimizer"):
        check(slow.time_breakdown[part], even.time_breakdown[part] * factor)
    check(slow.time_breakdown["dp_comm"], even.time_breakdown["dp_comm"])
    one = Plan(micro_batch=1, global_batch=1)
    check(
        estimate_step(MODEL, spread, one).step_time_s,
        estimate_step(MODEL, CLUSTER, one).step_time_s,
    )


def test_fp32_weights_under_autocast_cast_and_gather_fp32() -> None:
    """FSDP with fp32 weights under autocast (Composer's mixed_precision DEFAULT), 1 TB/s HBM,
    gathers on demand: every GEMM casts its weight to bf16 each micro-batch (read 4 B, write
    2 B) and backward moves twice that (the gradient cast back to fp32 and to bf16), so each
    layer and the head pay 18 B per weight per micro-batch; the residual stream is fp32 (an
    fp32 embedding plus bf16 block outputs), 20 B more per token and hidden element forward
    (two adds 10 B instead of 6, two norm input casts 6 B), twice that backward; the
    all-gathers move fp32, twice the bytes, and the two-unit prefetch buffer holds fp32."""
    world = cluster(hbm_bytes_per_s=1e12)
    bf16 = estimate_step(MODEL, world, _zero_plan("zero3", False))
    fp32 = estimate_step(MODEL, world, _zero_plan("zero3", False).model_copy(
        update={"param_dtype": "fp32"}))  # fmt: skip
    casts = 2 * 18 * (LAYERS * LAYER_PARAMS + TABLE_PARAMS) / 1e12
    casts += 2 * 3 * 20 * LAYERS * T1 * H / 1e12  # fp32 residual stream, m = 2
    check(fp32.time_breakdown["compute"] - bf16.time_breakdown["compute"], casts)
    ag_l, ag_t = ring(4, 4 * LAYER_PARAMS, W_NV), ring(4, 4 * TABLE_PARAMS, W_NV)
    gathers = 2 * (LAYERS * 2 * ag_l + 2 * 2 * ag_t + ag_l)  # forward and backward, m = 2
    check(fp32.time_breakdown["fsdp_comm"], gathers)
    check(fp32.memory_bytes - bf16.memory_bytes, 2 * 2 * LAYER_PARAMS * (1 - 1 / 4))


def test_tpu_torus_axes() -> None:
    """A 16-chip slice of a 2D torus is 4 x 4: TP 4 spans one axis and gets half the ICI
    bandwidth, so its 4 all-reduces of T·h·2 bytes per layer cost 2·(3/4)·M/(W/2) each."""
    tpu = cluster(domain=16).model_copy(update={"ici_axes": 2})
    gpu = cluster(domain=16)
    plan = Plan(tp=4, dp=4, micro_batch=1, global_batch=4, overlap_dp=False)
    m = T1 * H * 2
    on_tpu = estimate_step(MODEL, tpu, plan).time_breakdown["tp_comm"]
    on_gpu = estimate_step(MODEL, gpu, plan).time_breakdown["tp_comm"]
    check(on_tpu, LAYERS * 4 * 2 * ring(4, m, W_NV / 2))
    check(on_gpu, LAYERS * 4 * 2 * ring(4, m, W_NV))


def test_tpu_multislice_gradient_all_reduce_stalls_in_host_hand_offs() -> None:
    """Four 16-chip TPU slices (dp 64, FSDP 16 in a slice, HSDP replicas across the DCN), a
    compiled step (no kernel launches), host round trip 10 µs. The cross-slice gradient
    all-reduce of every weight matrix (6 per GELU layer: Q, K, V, O, up, down) and of the two
    tables runs a ring over the 4 slices: 2·(4 − 1) steps, each a send, send-done, recv and
    recv-done that stall the TPU one round trip each (XProf Megascale Stats), exposed:
    (6·8 + 2)·6·4·10 µs = 12 ms. With FSDP 8 two replicas share each slice: the ring over the
    DCN still spans 4 slices. No stall inside one slice or on GPUs."""
    tpu = cluster(domain=16, launch_us=10.0).model_copy(update={"ici_axes": 2})
    tpu0 = cluster(domain=16).model_copy(update={"ici_axes": 2})
    gpu = cluster(domain=16, launch_us=10.0)
    gpu0 = cluster(domain=16)
    plan = Plan(dp=64, sharding="zero3", shard_degree=16, micro_batch=1, global_batch=64,
                graphs=True, compiled=True)  # fmt: skip

    def stall(plan: Plan, slow: Cluster, fast: Cluster) -> float:
        parts = [estimate_step(MODEL, c, plan).time_breakdown for c in (slow, fast)]
        check(parts[0]["compute"], parts[1]["compute"])
        return parts[0]["dp_comm"] - parts[1]["dp_comm"]

    check(stall(plan, tpu, tpu0), (6 * LAYERS + 2) * 2 * (4 - 1) * 4 * 10e-6)
    two_per_slice = plan.model_copy(update={"shard_degree": 8})
    check(stall(two_per_slice, tpu, tpu0), (6 * LAYERS + 2) * 2 * (4 - 1) * 4 * 10e-6)
    one_slice = plan.model_copy(update={"dp": 16, "global_batch": 16})
    assert stall(one_slice, tpu, tpu0) == pytest.approx(0.0, abs=1e-12)
    assert stall(plan, gpu, gpu0) == pytest.approx(0.0, abs=1e-12)


# --- saved-set knobs and the interleaved in-flight count (Llama 3 405B) ---------------------
def test_activation_and_norm_outputs_recomputed() -> None:
    """tp 2 with SP. Recomputing the activation-function output from its kept input (xformers'
    fused SwiGLU, DeepSeek-V3 §3.3.2) drops 2 B × F/tp per token and layer; recomputing the two
    norm outputs, the QKV and MLP GEMM inputs, from the kept norm inputs (Megatron-Core
    "layernorm", DeepSeek-V3 §3.2.3) drops 2 B × 2h/tp. Selective recompute already drops the
    former; it still keeps the norm outputs unless they are recomputed too."""
    base = Plan(tp=2, sp=True, micro_batch=1, global_batch=1)
    ref = estimate_step(MODEL, CLUSTER, base)
    fixed = states(STAGE_PARAMS / 2, 1, 0) + LOGITS / 2 + OVERHEAD
    check(ref.memory_bytes, fixed + LAYERS * activations(T1, 2, sp=True))
    act_out, norm_out = 2 * T1 * FFN / 2, 2 * 2 * H * T1 / 2
    act = estimate_step(MODEL, CLUSTER, base.model_copy(update={"recompute_act": True}))
    check(act.memory_bytes, fixed + LAYERS * (activations(T1, 2, sp=True) - act_out))
    check(act.step_time_s, ref.step_time_s)
    norm = estimate_step(MODEL, CLUSTER, base.model_copy(update={"recompute_norm": True}))
    check(norm.memory_bytes, fixed + LAYERS * (activations(T1, 2, sp=True) - norm_out))
    selective = base.model_copy(update={"recompute": "selective", "recompute_norm": True})
    kept = activations(T1, 2, sp=True) - 2 * T1 * (H + FFN) / 2 - norm_out
    check(estimate_step(MODEL, CLUSTER, selective).memory_bytes, fixed + LAYERS * kept)


def test_qkv_recomputed_from_mla_latents() -> None:
    """tp 2 with SP, m = 1. Re-projecting Q, K, V in backward (DeepSeek-V3 §3.2.3, MLA
    up-projections) drops 2 B × (q + 2·kv)/tp = 2 B × 3h/2 per token and layer. With MLA
    (q_lora 256, kv_lora 128, RoPE key 32; 8 heads of nope 64, v 128) the latents are kept:
    2 B × 416 per token, /tp with SP; backward re-runs the up-projections, 2·T·(256·4·96 +
    128·4·192) FLOPs per layer (4 heads per GPU). Without MLA it re-runs the QKV GEMM,
    2·T·h·3h/2, and keeps nothing in their place (its input is saved anyway)."""
    mla = MLASpec(
        q_lora_rank=256, kv_lora_rank=128, qk_nope_head_dim=64, qk_rope_head_dim=32,
        v_head_dim=128,
    )  # fmt: skip
    latent_model = MODEL.model_copy(update={"mla": mla})
    base = Plan(tp=2, sp=True, micro_batch=1, global_batch=1)
    qkv = base.model_copy(update={"recompute_qkv": True})
    fixed = states(STAGE_PARAMS / 2, 1, 0) + LOGITS / 2 + OVERHEAD
    kept = activations(T1, 2, sp=True) - 2 * T1 * 3 * H / 2
    ref = estimate_step(latent_model, CLUSTER, base)
    check(ref.memory_bytes, fixed + LAYERS * activations(T1, 2, sp=True))
    est = estimate_step(latent_model, CLUSTER, qkv)
    check(est.memory_bytes, fixed + LAYERS * (kept + 2 * 416 * T1 / 2))
    up = 2 * T1 * (256 * 4 * 96 + 128 * 4 * 192) / PEAK
    check(est.step_time_s - ref.step_time_s, LAYERS * up)
    plain = estimate_step(MODEL, CLUSTER, qkv)
    check(plain.memory_bytes, fixed + LAYERS * kept)
    check(plain.step_time_s - ref.step_time_s, LAYERS * 2 * T1 * H * 3 * H / 2 / PEAK)


def test_interleaved_chunk_group_widens_the_warm_up() -> None:
    """pp 2, v 2 (chunks of 2 layers), m = 8 with N = 4 micro-batches per chunk group (Llama 3's
    tunable N): stage 0 runs 2(p − 1) + (v − 1)·N = 6 warm-up forwards and holds 7
    chunk-micro-batches, 14 layer-micro-batches (N = p: 5 and 10). The step time does not
    change."""
    plan = Plan(dp=4, pp=2, vpp=2, micro_batch=1, global_batch=32, overlap_dp=False)
    grouped = plan.model_copy(update={"vpp_group": 4})
    est, wide = estimate_step(MODEL, CLUSTER, plan), estimate_step(MODEL, CLUSTER, grouped)
    stage = states(HALF * LAYER_PARAMS + TABLE_PARAMS, 1, 0) + OVERHEAD
    check(est.memory_bytes, stage + 10 * activations(T1))
    check(wide.memory_bytes, stage + 14 * activations(T1))
    check(wide.step_time_s, est.step_time_s)


BIG_VOCAB = 131072  # a table and logits heavy enough that the last stage is the fullest


def test_interleaved_end_chunks_last_stage_fullest() -> None:
    """pp 3, v 2, layers 1 + 6 + 1, m = 6, N = 3, with Llama 3's end chunks: the last stage's
    second chunk holds only the head, its first the one layer. Its warm-up is (v − 1)·N = 3
    forwards of that layer; the head chunk's forwards and backwards then alternate (3 held);
    in the second round a forward of the layer chunk comes before the backward that frees one:
    4 layer-micro-batches. Spread over the chunks instead (half a layer each) it holds
    ((v − 1)·N + 1)/2 = 2. With a 131K vocabulary the last stage (table, logits) is fullest."""
    model = MODEL.model_copy(update={"vocab": BIG_VOCAB})
    plan = Plan(pp=3, vpp=2, pp_layers=(1, 6, 1), micro_batch=1, global_batch=6)
    last = states(LAYER_PARAMS + BIG_VOCAB * H, 1, 0) + T1 * BIG_VOCAB * 6 + OVERHEAD
    spread = estimate_step(model, CLUSTER, plan)
    check(spread.memory_bytes, last + 2 * activations(T1))
    ends = estimate_step(model, CLUSTER, plan.model_copy(update={"pp_end_chunks": True}))
    check(ends.memory_bytes, last + 4 * activations(T1))


def test_interleaved_in_flight_by_rank_hand_counted() -> None:
    """The same pipeline rank by rank, in layer-micro-batches. Rank 0 (embedding-only first
    chunk, one-layer second): W = 2·2 + 3 = 7 warm-up forwards plus one, in the order chunk 0
    ×3, chunk 1 ×3, chunk 0 ×2, so 3 of the one-layer chunk; spread, 8 × ½ = 4. Rank 1 (two
    3-layer chunks): 2 + 3 + 1 = 6 chunk-micro-batches, 18. Rank 2: 4 (above)."""
    plan = Plan(pp=3, vpp=2, pp_layers=(1, 6, 1), global_batch=6, pp_end_chunks=True)
    ends = PlanArrays.scalar(plan)
    spread = PlanArrays.scalar(plan.model_copy(update={"pp_end_chunks": False}))
    assert in_flight_layers(ends, 0.0, 1.0, 3.0, last=False) == pytest.approx(3.0)
    assert in_flight_layers(spread, 0.0, 1.0, 0.5, last=False) == pytest.approx(4.0)
    assert in_flight_layers(ends, 1.0, 6.0, 3.0, last=False) == pytest.approx(18.0)
    assert in_flight_layers(ends, 2.0, 1.0, 3.0, last=True) == pytest.approx(4.0)
    assert in_flight_layers(spread, 2.0, 1.0, 0.5, last=True) == pytest.approx(2.0)


# --- key/value heads below tp, bytes per GPU, uneven interleaved stages --------------------
GQA = MODEL.model_copy(update={"n_kv_heads": 2})  # 2 K,V heads of 128, 8 query heads


def test_kv_heads_below_tp_replicate_one_head_per_gpu() -> None:
    """tp 4 > 2 K,V heads: each GPU keeps one whole K,V head (Megatron replicates them), so
    the K,V projection, the saved K and V and the cp ring's K,V blocks all hold max(kv/tp, 1)
    = 1 head of 128, not half a head: the same as a model with one K,V head, and more than
    kv/tp would give. Closed form of the cp block: 2 (K and V) × 512 tokens × 128 × 2 B."""
    plan = Plan(tp=4, cp=2, sp=True, micro_batch=1, global_batch=1, overlap_dp=False)
    gqa = estimate_step(GQA, cluster(domain=8), plan)
    mqa = estimate_step(GQA.model_copy(update={"n_kv_heads": 1}), cluster(domain=8), plan)
    assert gqa.time_breakdown["compute"] == mqa.time_breakdown["compute"]
    assert gqa.memory_breakdown["activations"] == mqa.memory_breakdown["activations"]
    assert gqa.time_breakdown["cp_comm"] == mqa.time_breakdown["cp_comm"]
    block = 2 * 512 * 128 * 2
    check(gqa.comm_bytes["cp"], LAYERS * 3 * block * (2 - 1))
    four = estimate_step(GQA.model_copy(update={"n_kv_heads": 4}), cluster(domain=8), plan)
    assert four.comm_bytes["cp"] == pytest.approx(gqa.comm_bytes["cp"])  # 4/4 = 1 head too
    eight = estimate_step(GQA.model_copy(update={"n_kv_heads": 8}), cluster(domain=8), plan)
    check(eight.comm_bytes["cp"], 2 * gqa.comm_bytes["cp"])  # 8/4 = 2 heads per GPU


def test_kv_heads_below_tp_in_torchtitans_saved_set() -> None:
    """torchtitan's per-op set keeps wv's output: tp 4 > 2 K,V heads keeps one whole head of
    128 per GPU, as one K,V head does. Closed form per layer (memory.op_sac_set): the layer
    input plus 2 B × tokens × (q + kv + q + ffn/tp), GELU (no w2 output kept), with q = 1024/4
    and kv = max(2/4, 1) × 128."""
    from shardmeter.estimate.memory import op_sac_set

    plans = PlanArrays.scalar(Plan(tp=4, micro_batch=1, global_batch=1))
    tokens, layer_input = 512.0, 7.0
    gqa = float(op_sac_set(GQA, plans, tokens, layer_input))
    mqa = float(op_sac_set(GQA.model_copy(update={"n_kv_heads": 1}), plans, tokens, layer_input))
    q = GQA.q_dim / 4
    assert gqa == mqa == pytest.approx(layer_input + 2 * tokens * (q + 128 + q + FFN / 4))


def test_comm_bytes_per_gpu_closed_forms() -> None:
    """Bytes each GPU sends per step. TP: 4 all-reduces per layer of the micro-batch's
    activations (T·h·2 B), each a ring of 2(n−1)/n times the message (Patarasuk & Yuan 2009);
    DP (DDP): one all-reduce of the bf16 gradients; PP: 2 sends per micro-batch per chunk."""
    plan = Plan(dp=2, tp=4, micro_batch=1, global_batch=2, overlap_dp=False)
    est = estimate_step(MODEL, cluster(domain=8), plan)
    msg = T1 * H * 2
    check(est.comm_bytes["tp"], LAYERS * 4 * msg * 2 * (4 - 1) / 4)
    check(est.comm_bytes["dp"], 2 * STAGE_PARAMS / 4)
    assert est.comm_bytes["pp"] == est.comm_bytes["cp"] == est.comm_bytes["ep"] == 0.0
    two = estimate_step(MODEL, cluster(domain=8), plan.model_copy(update={"tp": 2}))
    check(two.comm_bytes["tp"], LAYERS * 4 * msg * 2 * (2 - 1) / 2)


def test_uneven_interleaved_split_rounds_each_chunk_up() -> None:
    """7 layers over pp 2 × v 2 = 4 chunks: each chunk holds ceil(7/4) = 2 layers, so every
    stage holds v·2 = 4 layers (Megatron-Core rounds a chunk up); splitting per stage instead
    would give ceil(7/2) = 4 too, so 10 layers (ceil(10/4)·2 = 6, not ceil(10/2) = 5) tells
    the two apart."""
    from shardmeter.estimate.compute import stage_layers

    for layers, per_stage in ((7, 4.0), (10, 6.0), (8, 4.0)):
        model = MODEL.model_copy(update={"n_layers": layers})
        plans = PlanArrays.scalar(Plan(pp=2, vpp=2, micro_batch=1, global_batch=4))
        split = stage_layers(model, plans)
        assert (float(split.first), float(split.mid), float(split.last)) == (per_stage,) * 3


# --- hidden collective time: min(T_comm, W) of each overlap, not in the step -----------------
def test_hidden_seconds_of_zero1_and_zero2() -> None:
    """ZeRO-1 overlapped hides min(RS, last backward) and min(AG, next forward); ZeRO-2 hides
    each unit's reduce-scatter under its own backward every micro-batch (the embedding's has
    no window). Without overlap nothing is hidden."""
    rs = ag = ring(4, 2 * STAGE_PARAMS, W_NV)
    est = estimate_step(MODEL, CLUSTER, _zero_plan("zero1", True))
    check(est.time_hidden["dp_comm"], min(rs, STAGE_BWD))
    check(est.time_hidden["fsdp_comm"], min(ag, STAGE_FWD))
    assert estimate_step(MODEL, CLUSTER, _zero_plan("zero1", False)).time_hidden["dp_comm"] == 0
    est = estimate_step(MODEL, CLUSTER, _zero_plan("zero2", True))
    layer = min(ring(4, 2 * LAYER_PARAMS, W_NV), layer_bwd(T1))
    head = min(ring(4, 2 * TABLE_PARAMS, W_NV), 2 * head_s(T1))
    check(est.time_hidden["dp_comm"], 2 * (LAYERS * layer + head))
    check(est.time_hidden["fsdp_comm"], min(ag, STAGE_FWD))
    assert est.time_hidden["tp_comm"] == est.time_hidden["pp_comm"] == 0


def test_hidden_seconds_of_zero3_split_between_gathers_and_reduce_scatters() -> None:
    """ZeRO-3: a unit's forward hides its gather; its backward window hides the gather and
    the reduce-scatter together, shared between them in proportion (equal sizes: half each)."""
    est = estimate_step(MODEL, CLUSTER, _zero_plan("zero3", True))
    ag_l = rs_l = ring(4, 2 * LAYER_PARAMS, W_NV)
    ag_t = rs_t = ring(4, 2 * TABLE_PARAMS, W_NV)
    bwd_l, bwd_t = min(ag_l + rs_l, layer_bwd(T1)), min(ag_t + rs_t, 2 * head_s(T1))
    fwd = LAYERS * min(ag_l, gemm_s(T1) + attn_s(T1)) + min(ag_t, head_s(T1))
    check(est.time_hidden["fsdp_comm"], 2 * (fwd + (LAYERS * bwd_l + bwd_t) / 2))
    check(est.time_hidden["dp_comm"], 2 * (LAYERS * bwd_l + bwd_t) / 2)


def test_hidden_seconds_of_interleaved_pipeline_sends() -> None:
    """Interleaved 1F1B: all 2·m·v sends but the 2(p−1) of fill and drain run under compute."""
    plan = Plan(dp=4, pp=2, vpp=2, micro_batch=1, global_batch=16, overlap_dp=False)
    est = estimate_step(MODEL, CLUSTER, plan)
    check(est.time_hidden["pp_comm"], (2 * 4 * 2 - 2) * T1 * H * 2 / W_IB)
    plan = Plan(dp=4, pp=2, micro_batch=1, global_batch=16, overlap_dp=False)
    assert estimate_step(MODEL, CLUSTER, plan).time_hidden["pp_comm"] == 0  # 1F1B: all exposed


def test_hidden_seconds_of_context_ring_and_expert_exchange() -> None:
    """The ring's K,V blocks hide under the attention core (forward A, backward 2.5A); the
    overlapped expert dispatch/combine under the MoE layer's own compute."""
    est = estimate_step(MODEL, CLUSTER, Plan(cp=2, micro_batch=1, global_batch=1, overlap_dp=False))
    a, hop = attn_s(512.0), 2 * 512.0 * H * 2 / W_NV
    check(est.time_hidden["cp_comm"], LAYERS * (min(hop, a) + min(2 * hop, 2.5 * a)))
    plan = Plan(
        dp=4, ep=4, ep_imbalance=1.0, overlap_ep=True, micro_batch=1, global_batch=4,
        overlap_dp=False,
    )  # fmt: skip
    est = estimate_step(MOE, EP_CLUSTER, plan)
    copy = T1 * H * 2
    exchange = max(2 * 1 / 4 * copy / W_NV, 2 * 2 / 4 * copy / W_IB)
    check(est.time_hidden["ep_comm"], LAYERS * min(4 * exchange, _moe_compute(T1)))


def test_hidden_seconds_of_tensor_parallel_under_the_layer_gemms() -> None:
    """tp 2 with comm-GEMM overlap: the 4 all-reduces of a layer (M/W each over 2 ranks) hide
    under its forward and backward GEMMs (3G)."""
    est = estimate_step(MODEL, CLUSTER, Plan(tp=2, overlap_tp=True, micro_batch=1, global_batch=1))
    check(est.time_hidden["tp_comm"], LAYERS * min(4 * T1 * H * 2 / W_NV, 3 * gemm_s(T1, 2)))


def test_activations_offloaded_to_host_and_back() -> None:
    """MaxText "minimal_offloaded": each layer's weight-matmul outputs go to host memory in
    forward and come back for backward over the host link. GELU MLP, tp = 1: Q, K, V (3h),
    the MLP up output (F), the attention and MLP output projections (2h), 2 B per element per
    token. Each transfer hides behind its pass (forward: the layer's forward; backward: its
    backward and selective recompute), exposed beyond it and costing K of what it hides,
    booked as recompute. Host link 0.5 TB/s: the forward transfer sticks out, the backward
    one hides. With tp = 2 and SP the split widths halve and the two projections' outputs
    are sequence-sharded; without `host_gbps` the host link is 25 GB/s PCIe. The chip keeps
    only each layer's input; the offloaded bytes are host memory."""
    plan = Plan(recompute="selective", micro_batch=1, global_batch=1)
    offload = plan.model_copy(update={"offload_activations": True})

    def extra(world: Cluster, p: Plan, per_token: float, tp: int) -> None:
        link = world.accelerator.host_gbps or 25.0
        t_host = 2 * T1 * per_token / (link * 1e9)
        fwd = gemm_s(T1, tp) + attn_s(T1, tp)
        bwd = layer_bwd(T1, tp) + attn_s(T1, tp)  # backward + selective recompute
        base = estimate_step(MODEL, world, p).time_breakdown["recompute"]
        off = estimate_step(MODEL, world, p.model_copy(update={"offload_activations": True}))
        check(off.time_breakdown["recompute"] - base, LAYERS * (overlap(t_host, fwd)
              + overlap(t_host, bwd)))  # fmt: skip

    fast = CLUSTER.model_copy(update={"accelerator": CLUSTER.accelerator.model_copy(
        update={"host_gbps": 500.0})})  # fmt: skip
    per_token = 3 * H + FFN + 2 * H
    t_host = 2 * T1 * per_token / 500e9
    assert gemm_s(T1) + attn_s(T1) < t_host < layer_bwd(T1) + attn_s(T1)
    extra(fast, plan, per_token, 1)
    extra(fast, plan.model_copy(update={"tp": 2, "sp": True}), (3 * H + FFN) / 2 + H, 2)
    extra(CLUSTER, plan, per_token, 1)  # PCIe default
    # Memory: the chip keeps each layer's input (2 B × h per token), the host the offloaded set
    # of every layer; the layer in backward holds its whole set, under the logits here.
    kept = estimate_step(MODEL, fast, offload)
    check(kept.memory_detail["host"], LAYERS * 2 * T1 * per_token)
    assert activations(T1) < LOGITS
    check(kept.memory_breakdown["activations"], LAYERS * 2 * H * T1)
    # fused cross-entropy keeps 2 B per logit, less than the working layer's whole set
    fused = estimate_step(MODEL, fast, offload.model_copy(update={"fused_ce": True}))
    working = activations(T1) - 2 * T1 * VOCAB
    check(fused.memory_breakdown["activations"], LAYERS * 2 * H * T1 + working)
    # the plan without the flag moves nothing
    check(estimate_step(MODEL, fast, plan).step_time_s,
          estimate_step(MODEL, fast, offload.model_copy(
              update={"offload_activations": False})).step_time_s)  # fmt: skip
