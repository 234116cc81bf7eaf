"""One island's training step: compute, recompute, bubble, exposed communication, optimizer.

A pipeline stage is built from units: decoder layers, the input embedding (first stage) and the
output head (last stage). Each unit's per-micro-batch time is its compute plus the part of its
communication that its overlap window cannot hide, `exposed = max(0, T_comm − W)`; while
communication overlaps, compute runs slower by u/(1−u) of the hidden time
(u = `Cluster.overlap_slowdown`, Calculon's processor_usage). The step is
m·max_s(t_s) + (Σ_s t_s − max_s t_s)/v for the stages s (Sailor/Metis uneven-stage form, which
is Narayanan et al. SC'21 §2.2's (p−1)/(v·m) bubble for even stages), plus once-per-step
DP/ZeRO communication, pipeline sends, the step's synchronisations and the optimizer (C.7).
`estimate_step_arrays` evaluates any number of plans at once; `estimate_step` is its view.
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np
from numpy.typing import NDArray

from shardmeter.estimate import comm
from shardmeter.estimate._xp import (
    Num,
    as_float,
    log,
    logical_not,
    maximum,
    minimum,
    sqrt,
    where,
)
from shardmeter.estimate.compute import (
    ACT_BYTES,
    BWD_ATTN,
    PipelineTimes,
    UnitCosts,
    critical_layers,
    expert_imbalance,
    launch_time,
    local_kv_dim,
    memory_time,
    model_flops_per_token,
    optimizer_time,
    pipeline_times,
    recompute_flops_per_token,
    recompute_share,
    stage_layers,
    unit_costs,
)
from shardmeter.estimate.memory import (
    GRAD_BYTES,
    LocalParams,
    end_stage_tables,
    gathered_weight_bytes,
    host_link_bytes_per_s,
    local_params,
    memory_breakdown,
    offload_transfer_time,
    offloaded_activation_bytes,
    optimizer_step_bytes,
    per_layer_params,
    shard_divisors,
)
from shardmeter.estimate.plan_arrays import (
    OFFLOAD_CODES,
    PRECISION_CODES,
    RECOMPUTE_CODES,
    SHARDING_CODES,
    PlanArrays,
)
from shardmeter.estimate.result import (
    MEMORY_COMPONENTS,
    MEMORY_KINDS,
    TIME_COMPONENTS,
    StepArrays,
    StepEstimate,
)
from shardmeter.specs.hardware import Cluster
from shardmeter.specs.model import TransformerSpec
from shardmeter.specs.plan import Plan, validate_plan
from shardmeter.specs.rules import first_broken, rules_hold

FloatArray = NDArray[np.float64]

COMM_COMPONENTS: tuple[str, ...] = tuple(c for c in TIME_COMPONENTS if c.endswith("_comm"))
BOTTLENECK_MIN_SHARE = 0.05  # an overhead below 5% of the step is not called the bottleneck
COMM_BOUND_SHARE = 0.10  # exposed communication above 10% of the step => communication-bound
STEP_SYNCS = 2.0  # small all-reduces over every GPU each step: loss and gradient norm (clipping)
# TPU ops of one DCN transfer that hand control to the host: `send` interrupts the host to start
# the DMA, `send-done` and `recv-done` signal it, `recv` hands it the buffer to fill; the TPU
# stalls in each (XProf Megascale Stats tool, openxla/xprof docs/megascale_stats.md, "Stall
# duration"). Ops per ring step.
DCN_HOST_OPS = 4.0
FP8_DISPATCH_BYTES = 1.0 + 4.0 / 128.0  # e4m3 value + one fp32 scale per 128 (DeepSeek-V3 §3.3)
# HBM passes over the bytes of one DeepSpeed (per-matrix, list) ZeRO-3 gather, beside NCCL's own
# write: c10d ProcessGroupNCCL::allgather (PyTorch 1.8) copies its flat output back into the d
# shard views (read + write), and DeepSpeed 0.3 `_allgather_param` allocates the buffer with
# torch.zeros (one write) and synchronizes the device before the gather. Dimensionless.
COPY_BACK_PASSES = 2.0
ZERO_FILL_PASSES = 1.0
# Host ops per rank before that gather starts: after its device synchronize, DeepSpeed 0.3-0.4
# `_allgather_param` builds the list of d shard views in a Python loop, one `flat_tensor.narrow`
# (with `torch.distributed.get_rank(group)`) per rank, and only then launches the ring, so
# these ops are serial with it and with compute. Ops per rank, dimensionless.
VIEW_OPS_PER_RANK = 1.0
# Time components that scale with the stage's layers and tables, per micro-batch.
STAGE_COMPONENTS: tuple[str, ...] = (
    "compute", "recompute", "tp_comm", "cp_comm", "ep_comm", "fsdp_comm", "dp_comm",
)  # fmt: skip
# Overlap windows of the once-per-step collectives, per micro-batch of a stage.
STAGE_WINDOWS: tuple[str, ...] = ("forward", "backward")
# Seconds of each per-layer collective hidden under compute, per micro-batch of a stage.
STAGE_HIDDEN: tuple[str, ...] = ("tp_hidden", "cp_hidden", "ep_hidden", "fsdp_hidden", "dp_hidden")


@dataclass(frozen=True)
class _Overlap:
    """Exposed part of a communication and the compute slowdown it causes while hidden."""

    exposed: Num
    interference: Num
    hidden: Num = 0.0  # the part that runs under compute, min(T_comm, W)

    @property
    def cost(self) -> Num:
        return self.exposed + self.interference


def _overlap(comm_s: Num, window_s: Num, slowdown: float) -> _Overlap:
    """exposed = max(0, T_comm − W); interference = u/(1−u)·min(T_comm, W) (C.7)."""
    hidden = minimum(comm_s, window_s)
    return _Overlap(
        exposed=maximum(comm_s - window_s, 0.0),
        interference=hidden * slowdown / (1.0 - slowdown),
        hidden=hidden,
    )


def _share(part: Num, whole: Num) -> Num:
    return where(whole > 0, part / maximum(whole, 1e-300), 0.0)


def _finish(value: Num, zeros: FloatArray) -> FloatArray:
    """A float64 array of the plans' shape (`zeros` has it; scalars become 0-d arrays).

    Adding to zeros broadcasts into a fresh writable array in one ufunc call."""
    if isinstance(value, np.ndarray) and value.shape == zeros.shape:
        return value if value.dtype == np.float64 else value.astype(np.float64)
    return np.add(value, zeros)


def straggler_share(n_gpus: Num, speed_cv: float) -> Num:
    """Extra share of GPU time a synchronous step of `n_gpus` spends waiting for its slowest
    GPU: the expected maximum of n Gaussian speed factors of spread `speed_cv` is about
    1 + cv·sqrt(2·ln n) (Cramér's extreme-value asymptote; Sinha et al. SC'22 measure the
    GPU-to-GPU spread). 0 for one GPU or cv = 0; dimensionless."""
    return speed_cv * sqrt(2.0 * log(maximum(n_gpus, 1.0)))


def pipeline_bubble_fraction(p: Num, v: Num, m: Num) -> Num:
    """Idle share of ideal stage time for even stages: (p−1)/m for 1F1B, (p−1)/(v·m)
    interleaved (Narayanan et al. SC'21, §2.2.1-2.2.2)."""
    return (as_float(p) - 1.0) / (as_float(v) * as_float(m))


def expert_exchange_time(
    model: TransformerSpec, cluster: Cluster, plans: PlanArrays, bytes_per_value: Num
) -> Num:
    """One token dispatch (or combine) of one MoE layer and micro-batch over the ep group.

    Each of the T·k routed copies of an h-wide token goes to its expert's rank: (g−1)/ep of
    them to peers in the NVLink domain, (ep−g)/ep over the NIC. With node-level
    deduplication (DeepSeek-V3 §3.2.2) a token crosses the NIC once per distinct remote node,
    E[nodes] = N·(1 − (1 − 1/N)^k) for N nodes in the group, at most the group-limited
    routing's node count, and is fanned out to its experts over NVLink. The busiest rank
    (uniform-routing load imbalance) sets the time.
    """
    moe = model.moe
    if moe is None:
        return 0.0
    tokens = plans.micro_batch * model.seq_len / as_float(plans.cp)
    ep = as_float(plans.ep)
    stride = as_float(plans.tp * plans.cp)
    k = float(moe.top_k)
    g = comm.domain_members(ep, stride, cluster.nvlink_domain)
    nodes = ep / g
    reached = nodes * (1.0 - (1.0 - 1.0 / nodes) ** k)
    if moe.n_groups is not None and moe.topk_groups is not None:
        limit = minimum(nodes, moe.topk_groups * maximum(1.0, nodes / moe.n_groups))
        reached = minimum(reached, limit)
    inter = where(plans.ep_dedup, reached * (nodes - 1.0) / nodes, k * (ep - g) / ep)
    intra = where(plans.ep_dedup, k * (g - 1.0) / g, k * (g - 1.0) / ep)
    per_copy = tokens * model.hidden * bytes_per_value * expert_imbalance(plans, tokens, moe.top_k)
    return comm.split_exchange_time(intra * per_copy, inter * per_copy, ep, stride, cluster)


def dcn_stall_time(
    model: TransformerSpec, cluster: Cluster, plans: PlanArrays, shards: tuple[Num, Num],
    layers: Num, tables: Num,
) -> Num:  # fmt: skip
    """Seconds the TensorCores stall per step in the host hand-offs of the cross-slice gradient
    all-reduce (dense weights): (4 + mlp_matrices)·layers + tables all-reduces, each
    `comm.dcn_ring_steps` ring steps of DCN_HOST_OPS host round trips of kernel_launch_us (XProf
    Megascale Stats tool: send, send-done, recv, recv-done stall the TPU). 0 within one slice
    and on GPUs."""
    d_dense = shards[0]
    replicas = maximum(as_float(plans.dp) * as_float(plans.cp) / d_dense, 1.0)
    steps = comm.dcn_ring_steps(replicas, as_float(plans.tp) * d_dense, cluster)
    collectives = (4.0 + model.mlp_matrices) * layers + tables
    host_s = cluster.accelerator.efficiency.kernel_launch_us * 1e-6
    return collectives * steps * DCN_HOST_OPS * host_s


@dataclass(frozen=True)
class _Sync:
    """Data-parallel collectives over one set of parameters: gradient reduce-scatter over the
    shard group, parameter all-gather, and the replica all-reduce of the 1/d shard (HSDP)."""

    rs: Num
    ag: Num
    ar: Num


def _sync(
    model: TransformerSpec, params: LocalParams, cluster: Cluster, plans: PlanArrays,
    shards: tuple[Num, Num], units: Num = 1.0,
) -> _Sync:  # fmt: skip
    """DP/ZeRO collectives of `params` over the (dense, expert) shard groups `shards`,
    gathered in `units` pieces (each paying latency). Gradients reduce over dp·cp; routed
    experts over their own (dp·cp/ep) groups (C.5).

    A per-matrix gather (DeepSpeed ZeRO-3, `gather_matrix`) is torch.distributed.all_gather
    into a list of d shard views, which c10d's ProcessGroupNCCL runs through a flat buffer and
    copies back one `copy_` per rank: d host launches per gather, issued while NCCL runs, so
    the gather takes max(T_AG, d·launch) (DeepSpeed 0.3-0.5 partition_parameters.py
    `_allgather_param`; PyTorch 1.8 ProcessGroupNCCL::allgather). Before it, DeepSpeed builds
    the d shard views in a Python loop after a device synchronize: d·launch more, serial."""
    dp, tp, cp, ep = (as_float(x) for x in (plans.dp, plans.tp, plans.cp, plans.ep))
    d_dense, d_expert = shards
    acc = cluster.accelerator

    weight_bytes = gathered_weight_bytes(plans)

    def one(p_count: Num, d: Num, rep: Num, stride: Num) -> tuple[Num, Num, Num]:
        grads = p_count * GRAD_BYTES
        rs = comm.reduce_scatter_time(grads, d, stride, cluster)
        piece = p_count * weight_bytes / units  # bytes one gather assembles on each GPU
        gather = comm.all_gather_time(piece, d, stride, cluster)
        copies = where(plans.gather_matrix, launch_time(d, plans, acc), 0.0)
        # DeepSpeed's list gather also streams the gathered bytes through HBM: c10d copies the
        # flat output back to the shard views after NCCL (read + write) and, before its device
        # synchronize, `_allgather_param` zero-fills the buffer (torch.zeros, one write).
        back = where(plans.gather_matrix, memory_time(COPY_BACK_PASSES * piece, acc), 0.0)
        fill = where(plans.gather_matrix, memory_time(ZERO_FILL_PASSES * piece, acc), 0.0)
        # Before the ring, `_allgather_param` builds the d shard views on the host (Python loop
        # after its device synchronize): one eager op per rank that nothing runs beside.
        views = where(plans.gather_matrix, launch_time(VIEW_OPS_PER_RANK * d, plans, acc), 0.0)
        ag = units * (views + maximum(gather + back, copies) + fill)
        ar = comm.all_reduce_time(grads / d, rep, stride * d, cluster)
        return rs, ag, ar

    rs, ag, ar = one(params.dense, d_dense, maximum(dp * cp / d_dense, 1.0), tp)
    if model.moe is not None:
        rs_e, ag_e, ar_e = one(
            params.expert, d_expert, maximum(dp * cp / ep / d_expert, 1.0), tp * cp * ep
        )
        rs, ag, ar = rs + rs_e, ag + ag_e, ar + ar_e
    return _Sync(rs, ag, ar)


def _per_micro_batch(sync: _Sync, once_per_step: Num) -> _Sync:
    """The collectives a unit runs every micro-batch: none of its gather and reduce-scatter
    where they run once per step instead (the replica all-reduce is per step anyway)."""
    return _Sync(where(once_per_step, 0.0, sync.rs), where(once_per_step, 0.0, sync.ag), sync.ar)


def _unit_sharded_comm(
    sync: _Sync, fwd_window: Num, bwd_window: Num, plans: PlanArrays, u: float,
    backward_gathers: Num = 1.0,
) -> tuple[Num, Num, Num, Num]:  # fmt: skip
    """(fsdp, dp) exposed then (fsdp, dp) hidden seconds of one unit per micro-batch: ZeRO-2/3
    reduce-scatter the gradients in backward, ZeRO-3 also gathers the weights forward and
    `backward_gathers` times in backward, each hidden under the unit's own compute when its
    overlap is on (FSDP prefetch, Zhao et al. 2023); the backward window's hidden seconds are
    shared in proportion to the overlapped gathers and reduce-scatters."""
    stage = plans.sharding
    rs = where(stage >= SHARDING_CODES["zero2"], sync.rs, 0.0)
    ag = where(stage == SHARDING_CODES["zero3"], sync.ag, 0.0)
    ag_bwd = ag * backward_gathers
    opg, odp = plans.overlap_param_gather, plans.overlap_dp
    fwd = _overlap(ag, where(opg, fwd_window, 0.0), u)
    bwd = _overlap(ag_bwd * opg + rs * odp, bwd_window, u)
    bwd_exposed = ag_bwd * logical_not(opg) + rs * logical_not(odp) + bwd.cost
    ag_share = _share(ag_bwd, ag_bwd + rs)
    hidden_ag = _share(ag_bwd * opg, ag_bwd * opg + rs * odp)
    return (
        fwd.cost + bwd_exposed * ag_share,
        bwd_exposed * (1.0 - ag_share),
        fwd.hidden + bwd.hidden * hidden_ag,
        bwd.hidden * (1.0 - hidden_ag),
    )


def _stage_components(
    layers: Num, tables: dict[str, Num], per_layer: dict[str, Num], per_table: dict[str, dict[str, Num]],
    const: dict[str, Num],
) -> dict[str, Num]:  # fmt: skip
    """Per-micro-batch seconds of one stage by component: its layers, its tables (embedding,
    head: 0 or 1 each) and a per-stage constant."""
    out: dict[str, Num] = {}
    for name in STAGE_COMPONENTS + STAGE_WINDOWS + STAGE_HIDDEN:
        value = layers * per_layer.get(name, 0.0) + const.get(name, 0.0)
        for table, count in tables.items():
            value = value + count * per_table[table].get(name, 0.0)
        out[name] = value
    return out


def estimate_step_arrays(
    model: TransformerSpec, cluster: Cluster, plans: PlanArrays, with_memory: bool = True
) -> StepArrays:
    """Vectorized step estimate: every PlanArrays column may be an array; one formula.
    `with_memory=False` leaves the memory terms at 0 (the calibration fit needs only time)."""
    acc = cluster.accelerator
    u = cluster.overlap_slowdown
    dp, tp, pp, cp, ep, vpp = (
        as_float(x) for x in (plans.dp, plans.tp, plans.pp, plans.cp, plans.ep, plans.vpp)
    )
    m = as_float(plans.micro_batches)
    full = plans.recompute == RECOMPUTE_CODES["full"]
    units: UnitCosts = unit_costs(model, plans, acc)
    counts = stage_layers(model, plans)
    tokens_mb = plans.micro_batch * model.seq_len / cp  # tokens per micro-batch per GPU
    moe_share = model.n_moe_layers / model.n_layers

    # Tensor parallel, per layer: 2 all-reduces forward + 2 backward (+2 when the forward is
    # recomputed), each b·s·h bytes; SP's all-gather + reduce-scatter pair costs the same
    # (Korthikanti et al. 2022, §4.2.2). Overlap window: the layer GEMMs (comm-GEMM overlap).
    tp_msg = tokens_mb * model.hidden * ACT_BYTES
    tp_count = 4.0 + 2.0 * full
    # Each all-reduce's worth is one all-gather and one reduce-scatter of the message.
    fp8 = plans.precision == PRECISION_CODES["fp8"]
    pair = comm.all_reduce_time(tp_msg, tp, 1, cluster)
    ag_one = 0.5 * pair
    rs_one = 0.5 * pair
    # torchtitan's per-op selective checkpointing saves reduce-scatter outputs but not
    # all-gathers (parallelize_llama.py `_op_sac_save_list`), so the re-run wk and w3 gather
    # the attention and MLP inputs again under SP: two more all-gathers per layer.
    selective = plans.recompute == RECOMPUTE_CODES["selective"]
    sac_gathers = where(plans.op_sac & selective & plans.sp, 2.0, 0.0)
    # Comm-GEMM overlap (`overlap_tp`: Transformer Engine userbuffers, XLA collective matmul)
    # hides the layer's TP collectives behind its GEMMs as one window.
    pooled = _overlap(
        tp_count * (ag_one + rs_one) + sac_gathers * ag_one,
        where(plans.overlap_tp, units.layer_gemm_s * (3.0 + full), 0.0),
        u,
    )
    # Async TP (`tp_async`) decomposes each collective with the one GEMM that reads its output
    # or writes its input (Wang et al. ASPLOS'23 §3; torch _micro_pipeline_tp matches
    # all_gather -> mm and mm -> reduce_scatter): the attention gather with the QKV GEMM, its
    # reduce-scatter with the output projection, the MLP gather with the up and its
    # reduce-scatter with the down projection, in forward, in recompute and, transposed, with
    # the same-sized data-gradient GEMMs in backward. Each hides behind its own GEMM only:
    # exposed max(0, T_c − W_c), interference u/(1−u)·min(T_c, W_c) per collective (C.7).
    # Rowwise FP8 casts the gathered bf16 tensor before its scaled GEMM, so its gathers have no
    # GEMM to pair with and stay exposed.
    ag_paired = logical_not(fp8 & plans.fp8_rowwise)
    passes = 2.0 + full  # forward, backward, recompute
    async_cost: Num = passes * 2.0 * where(ag_paired, 0.0, ag_one)
    async_hidden: Num = 0.0
    for c_s, gemm_s in (
        (ag_one * ag_paired, units.layer_qkv_s),
        (rs_one, units.layer_out_s),
        (ag_one * ag_paired, units.layer_up_s),
        (rs_one, units.layer_down_s),
    ):
        one = _overlap(c_s, gemm_s, u)
        async_cost = async_cost + passes * one.cost
        async_hidden = async_hidden + passes * one.hidden
    # The re-run gathers pair with the re-run matmuls that read them (wk, w3).
    regathered = _overlap(sac_gathers * ag_one * ag_paired, units.layer_sac_gathered_s, u)
    async_cost = async_cost + regathered.cost + sac_gathers * where(ag_paired, 0.0, ag_one)
    async_hidden = async_hidden + regathered.hidden
    tp_layer = _Overlap(
        exposed=where(plans.tp_async, async_cost, pooled.cost),
        interference=0.0,
        hidden=where(plans.tp_async, async_hidden, pooled.hidden),
    )

    # Context parallel (ring attention), per layer: c−1 K,V blocks forward, twice that backward
    # (K,V and their gradients), hidden only behind the attention core of the same layer
    # (C.5); the ring runs over the NIC once tp·cp spans NVLink domains.
    kv_local = local_kv_dim(model, tp)
    kv_block = 2.0 * tokens_mb * kv_local * ACT_BYTES
    hop = comm.ring_hop_time(kv_block, cp, tp, cluster) * (cp - 1.0)
    cp_fwd = _overlap(hop * (1.0 + full), units.layer_attention_s * (1.0 + full), u)
    cp_bwd = _overlap(hop * 2.0, units.layer_attention_s * BWD_ATTN, u)

    # Expert parallel, per MoE layer: dispatch + combine forward, their transposes backward
    # (+1 each when the forward is recomputed); FP8 dispatch where used, the combine in bf16.
    # Overlap window (DualPipe): the layer's own forward and backward compute.
    dispatch_bytes = where(plans.ep_fp8, FP8_DISPATCH_BYTES, ACT_BYTES)
    dispatch = expert_exchange_time(model, cluster, plans, dispatch_bytes)
    combine = expert_exchange_time(model, cluster, plans, ACT_BYTES)
    ep_moe = (2.0 + full) * (dispatch + combine)
    ep_layer = _overlap(ep_moe, where(plans.overlap_ep, units.layer_s, 0.0), u)

    # Data parallel / ZeRO, per unit and micro-batch (ZeRO-2 reduce-scatter, ZeRO-3 gathers);
    # DeepSpeed-style ZeRO-3 gathers one weight matrix at a time.
    shards = shard_divisors(plans)
    layer_params = per_layer_params(model, plans)
    one_layer = local_params(model, plans, 1.0, 0.0, layer_params)
    matrices = where(plans.gather_matrix, 4.0 + model.mlp_matrices, 1.0)
    layer_sync = _sync(model, one_layer, cluster, plans, shards, matrices)
    # Module hooks (per-matrix gathers) fetch a layer's weights again for its recomputed
    # forward: the pre-forward hook gathers, the post-forward hook releases, then the backward
    # hook gathers (DeepSpeed stage3 PartitionedParameterCoordinator); FSDP units keep them.
    regather = plans.gather_matrix & full
    # Weights kept gathered (reshard_after_forward = False): the backward gathers nothing.
    # With PP as well, torch.distributed.pipelining also keeps them through every backward but
    # the last and skips the gradient sync until it (set_reshard_after_backward(False),
    # set_requires_gradient_sync(False): stage.py backward_maybe_with_nosync), so each unit
    # gathers once and reduce-scatters once per step, charged below with the per-step syncs.
    kept = logical_not(plans.reshard_after_forward)
    once_per_step = kept & (pp > 1) & (plans.sharding == SHARDING_CODES["zero3"])
    layer_sync = _per_micro_batch(layer_sync, once_per_step)
    layer_fsdp, layer_dp, layer_fsdp_hidden, layer_dp_hidden = _unit_sharded_comm(
        layer_sync,
        units.layer_forward_s,
        units.layer_backward_s + units.layer_recompute_s,
        plans,
        u,
        where(kept, 0.0, where(regather, 2.0, 1.0)),
    )
    one_table = local_params(model, plans, 0.0, 1.0, layer_params)
    table_sync = _per_micro_batch(_sync(model, one_table, cluster, plans, shards), once_per_step)
    table_bwd_gathers = where(kept, 0.0, 1.0)
    head_fsdp, head_dp, head_fsdp_hidden, head_dp_hidden = _unit_sharded_comm(
        table_sync, units.head_forward_s, units.head_backward_s, plans, u, table_bwd_gathers
    )
    embed_fsdp, embed_dp, embed_fsdp_hidden, embed_dp_hidden = _unit_sharded_comm(
        table_sync, units.embed_forward_s, units.embed_backward_s, plans, u, table_bwd_gathers
    )
    # Activations offloaded to host memory (`offload_activations`, MaxText "minimal_offloaded"):
    # each layer's kept activations go down the host link during its forward and come back
    # for its backward, each transfer hidden behind that pass as any overlapped transfer
    # (exposed max(0, T − W), interference u/(1−u)·min(T, W)); booked with the recompute it
    # replaces. T = bytes / host link bytes/s (memory.offloaded_activation_bytes).
    host_s = offloaded_activation_bytes(model, plans) / host_link_bytes_per_s(acc)
    offload_fwd = _overlap(host_s, units.layer_forward_s, u)
    offload_bwd = _overlap(host_s, units.layer_backward_s + units.layer_recompute_s, u)

    # The first unit's gather of every micro-batch has nothing to hide behind.
    first_gather = where(plans.sharding == SHARDING_CODES["zero3"], layer_sync.ag / matrices, 0.0)

    per_layer = {
        "compute": units.layer_forward_s + units.layer_backward_s,
        "recompute": units.layer_recompute_s + offload_fwd.cost + offload_bwd.cost,
        "tp_comm": tp_layer.cost,
        "cp_comm": cp_fwd.cost + cp_bwd.cost,
        "ep_comm": moe_share * ep_layer.cost,
        "fsdp_comm": layer_fsdp,
        "dp_comm": layer_dp,
        "forward": units.layer_forward_s,
        "backward": units.layer_backward_s + units.layer_recompute_s,
        "tp_hidden": tp_layer.hidden,
        "cp_hidden": cp_fwd.hidden + cp_bwd.hidden,
        "ep_hidden": moe_share * ep_layer.hidden,
        "fsdp_hidden": layer_fsdp_hidden,
        "dp_hidden": layer_dp_hidden,
    }
    per_table = {
        "embed": {
            "compute": units.embed_s, "fsdp_comm": embed_fsdp, "dp_comm": embed_dp,
            "forward": units.embed_forward_s, "backward": units.embed_backward_s,
            "fsdp_hidden": embed_fsdp_hidden, "dp_hidden": embed_dp_hidden,
        },
        "head": {
            "compute": units.head_s, "fsdp_comm": head_fsdp, "dp_comm": head_dp,
            "forward": units.head_forward_s, "backward": units.head_backward_s,
            "fsdp_hidden": head_fsdp_hidden, "dp_hidden": head_dp_hidden,
        },
    }  # fmt: skip
    const = {"fsdp_comm": first_gather}
    single = pp == 1
    kinds = {
        "first": _stage_components(
            counts.first,
            {"embed": 1.0, "head": where(single, 1.0, 0.0)},
            per_layer,
            per_table,
            const,
        ),
        "mid": _stage_components(counts.mid, {}, per_layer, per_table, const),
        "last": _stage_components(counts.last, {"head": 1.0}, per_layer, per_table, const),
    }

    def time_of(parts: dict[str, Num]) -> Num:
        return sum(parts.get(name, 0.0) for name in STAGE_COMPONENTS)

    times: PipelineTimes = pipeline_times(
        model,
        plans,
        counts,
        time_of(per_layer),
        time_of(per_table["head"]),
        time_of(per_table["embed"]),
        first_gather,
    )
    critical = times.critical_s
    pick_first = times.first_s >= critical
    pick_mid = logical_not(pick_first) & (times.mid_s >= critical)

    def on_critical(name: str) -> Num:
        first, mid, last = (kinds[k][name] for k in ("first", "mid", "last"))
        return where(pick_first, first, where(pick_mid, mid, last))

    # Once per step, on the stage holding the most parameters: the gradient reduce of the last
    # micro-batch (all-reduce for DDP, RS for ZeRO-1, the replica all-reduce for all stages)
    # hidden behind its backward, then ZeRO-1/2's parameter all-gather behind the next
    # forward, then the optimizer over the parameters this GPU owns.
    tables = end_stage_tables(model, plans)
    most_layers = maximum(maximum(counts.first, counts.mid), counts.last)
    heaviest = local_params(model, plans, most_layers, tables, layer_params)
    stage_sync = _sync(model, heaviest, cluster, plans, shards)
    stage = plans.sharding
    zero3 = stage == SHARDING_CODES["zero3"]
    # ZeRO-3 kept gathered under PP: one reduce-scatter and one all-gather per step as well
    zero3_once = once_per_step
    grad_once = (
        where((stage == SHARDING_CODES["zero1"]) | zero3_once, stage_sync.rs, 0.0) + stage_sync.ar
    )
    # The last micro-batch's backward (+ recompute); interleaved, each of the v model chunks
    # launches its reduction when its own last backward ends (Megatron-Core
    # forward_backward_pipelining_with_interleaving: grad_sync_func per model chunk at
    # is_last_microbatch_for_model_chunk), so the chunks of the last round, pp micro-batches
    # per chunk, finish one after another: the window is (1 + (v − 1)·pp)/v micro-batch
    # backwards (v = 1: one).
    chunk_stagger = (1.0 + (vpp - 1.0) * pp) / vpp
    bwd_window = on_critical("backward") * chunk_stagger
    dp_once_ov = _overlap(grad_once, where(plans.overlap_dp, bwd_window, 0.0), u)
    dp_once = dp_once_ov.cost
    ag_once = where(
        (stage >= SHARDING_CODES["zero1"]) & (logical_not(zero3) | zero3_once), stage_sync.ag, 0.0
    )
    # likewise the next step's parameter gathers, chunk by chunk ahead of each chunk's first
    # forward (param_sync_func of the next model chunk)
    fwd_window = where(plans.overlap_param_gather, on_critical("forward") * chunk_stagger, 0.0)
    fsdp_once_ov = _overlap(ag_once, fwd_window, u)
    fsdp_once = fsdp_once_ov.cost
    steps_sync = STEP_SYNCS * comm.sync_time(as_float(plans.n_gpus), cluster)
    # Cross-slice gradient all-reduce on a TPU multislice: XLA pipelines its bytes under the
    # backward, but each ring step over the DCN is a send and a receive whose four host
    # hand-offs stall the TensorCore (DCN_HOST_OPS), one host round trip each (kernel_launch_us,
    # the model's host µs per dispatched op; an XLA executable has no launches, but these ops
    # still go through the host). One all-reduce per weight matrix of every layer, as the
    # scanned layer loop emits them, and per embedding table: exposed, once per step.
    dcn_stall = dcn_stall_time(model, cluster, plans, shards, most_layers, tables)

    # Pipeline point-to-point: activation forward and gradient backward per micro-batch and
    # chunk; interleaved schedules overlap it with compute except at fill and drain (Megatron's
    # overlap_p2p_comm), plain 1F1B keeps it on the critical path.
    pp_msg = tokens_mb * model.hidden * ACT_BYTES / where(plans.sp, tp, 1.0)
    pp_hop = comm.send_recv_time(pp_msg, tp * cp * dp, cluster)
    pp_sends = where(pp > 1, 2.0 * m * vpp, 0.0)
    pp_exposed = where(vpp > 1, 2.0 * (pp - 1.0), pp_sends) * pp_hop
    pp_hidden = (pp_sends * pp_hop - pp_exposed) * u / (1.0 - u)
    pp_total = where(pp > 1, pp_exposed + maximum(pp_hidden, 0.0), 0.0)

    d_dense, d_expert = shards
    d_opt_dense = where(stage >= SHARDING_CODES["zero1"], d_dense, 1.0)
    d_opt_expert = where(stage >= SHARDING_CODES["zero1"], d_expert, 1.0)
    owned = heaviest.dense / d_opt_dense + heaviest.expert / d_opt_expert
    opt = optimizer_time(owned, acc, plans.master_remainder, optimizer_step_bytes(plans))
    # offloaded states: the CPU steps them, the GPU pays the PCIe transfers (memory.py)
    offloaded = plans.offload >= OFFLOAD_CODES["optimizer"]
    opt = where(offloaded, offload_transfer_time(owned, plans), opt)

    # The step waits for its slowest GPU: the GPU-bound parts stretch by the expected maximum of
    # n per-GPU speed factors, 1 + cv·sqrt(2 ln n) (Gaussian extreme value, as the MoE rank load).
    slowest = 1.0 + straggler_share(as_float(plans.n_gpus), acc.efficiency.speed_cv)
    time = {
        "compute": m * on_critical("compute") * slowest,
        "recompute": m * on_critical("recompute") * slowest,
        "optimizer": opt * slowest,
        "bubble": times.bubble_s(vpp) * slowest,
        "tp_comm": m * on_critical("tp_comm"),
        "pp_comm": pp_total,
        "dp_comm": m * on_critical("dp_comm") + dp_once + steps_sync + dcn_stall,
        "fsdp_comm": m * on_critical("fsdp_comm") + fsdp_once,
        "cp_comm": m * on_critical("cp_comm"),
        "ep_comm": m * on_critical("ep_comm"),
    }
    shape = plans.shape
    zeros = np.zeros(shape)
    time = {k: _finish(v, zeros) for k, v in time.items()}
    step = sum(time.values(), start=zeros)
    # Each collective's seconds under compute: not in the step, but on the wire (C.7's
    # min(T_comm, W) of every overlap above; pipeline sends but the fill and drain ones).
    hidden = {
        "tp_comm": m * on_critical("tp_hidden"),
        "pp_comm": where(pp > 1, maximum(pp_sends * pp_hop - pp_exposed, 0.0), 0.0),
        "dp_comm": m * on_critical("dp_hidden") + dp_once_ov.hidden,
        "fsdp_comm": m * on_critical("fsdp_hidden") + fsdp_once_ov.hidden,
        "cp_comm": m * on_critical("cp_hidden"),
        "ep_comm": m * on_critical("ep_hidden"),
    }
    hidden = {k: _finish(v, zeros) for k, v in hidden.items()}

    grad_bytes = heaviest.total * GRAD_BYTES
    layers_crit = critical_layers(counts, times)
    ep_count = layers_crit * moe_share * (4.0 + 2.0 * full)
    top_k = model.moe.top_k if model.moe is not None else 0
    comm_bytes = {
        "tp": m * layers_crit * tp_count * tp_msg * 2.0 * (tp - 1.0) / tp,
        "pp": pp_sends * pp_msg,
        "dp": where((stage >= SHARDING_CODES["zero2"]) & logical_not(zero3_once), m, 1.0)
        * grad_bytes,
        "fsdp": where(
            zero3, where(zero3_once, 1.0, where(kept, 1.0, 2.0) * m), where(stage >= 1, 1.0, 0.0)
        )
        * heaviest.total
        * gathered_weight_bytes(plans),
        "cp": m * layers_crit * 3.0 * kv_block * (cp - 1.0),
        "ep": m * ep_count * tokens_mb * top_k * model.hidden * ACT_BYTES * (ep - 1.0) / ep,
    }
    comm_bytes = {k: _finish(v, zeros) for k, v in comm_bytes.items()}

    tokens_step = as_float(plans.global_batch) * model.seq_len
    model_flops = model_flops_per_token(model, causal=True) * tokens_step
    hw_flops = (
        model_flops
        + recompute_flops_per_token(
            model, plans.recompute, plans.recompute_qkv, plans.recompute_mlp_up
        )
        * where(plans.recompute == RECOMPUTE_CODES["full"], recompute_share(plans), 1.0)
        * tokens_step
    )
    fp8 = plans.precision == PRECISION_CODES["fp8"]
    fp16 = plans.precision == PRECISION_CODES["fp16"]
    peak = where(fp8, acc.peak("fp8"), where(fp16, acc.peak("fp16"), acc.peak("bf16")))
    memory: dict[str, Num] = {k: 0.0 for k in MEMORY_COMPONENTS}
    detail: dict[str, Num] = {k: 0.0 for k in MEMORY_KINDS}
    if with_memory:
        mem = memory_breakdown(model, cluster, plans, counts)
        memory = mem.as_dict()
        detail = {
            "allocated": mem.allocated, "reserved": mem.reserved,
            "fragmentation": mem.fragmentation, "cuda_context": mem.cuda_context,
            "nccl_buffers": mem.nccl_buffers, "host": mem.host,
        }  # fmt: skip
    return StepArrays(
        memory_detail={k: _finish(v, zeros) for k, v in detail.items()},
        time=time,
        memory={k: _finish(memory[k], zeros) for k in MEMORY_COMPONENTS},
        step_time_s=step,
        tokens_per_step=_finish(tokens_step, zeros),
        n_gpus=_finish(as_float(plans.n_gpus), zeros),
        model_flops_per_step=_finish(model_flops, zeros),
        hardware_flops_per_step=_finish(hw_flops, zeros),
        peak_flops_per_gpu=_finish(peak * 1e12, zeros),
        hbm_bytes=np.full(shape, acc.hbm_bytes),
        comm_bytes=comm_bytes,
        backward_window_s=_finish(bwd_window, zeros),
        hidden=hidden,
    )


def component_links(cluster: Cluster, plan: Plan) -> dict[str, str]:
    """Name of the link that carries each communication component's cross-domain part."""
    inter, intra = cluster.inter.name, cluster.intra.name

    def link(n: int, stride: int) -> str:
        return inter if bool(comm.crosses_domain(n, stride, cluster)) else intra

    shard = plan.shard_group * plan.cp if plan.sharding != "none" else plan.dp * plan.cp
    dp_group = plan.dp * plan.cp
    return {
        "tp_comm": link(plan.tp, 1),
        "pp_comm": inter if plan.tp * plan.cp * plan.dp >= cluster.nvlink_domain else intra,
        "dp_comm": link(dp_group, plan.tp),
        "fsdp_comm": link(shard, plan.tp),
        "cp_comm": inter if plan.tp >= cluster.nvlink_domain else intra,
        "ep_comm": link(plan.ep, plan.tp * plan.cp),
    }


def classify(time: dict[str, float], step_s: float, links: dict[str, str]) -> tuple[str, str]:
    """(bottleneck, regime): the largest overhead above 5% of the step (else "compute"), and
    "communication-bound (<link>)" when exposed communication exceeds 10% of the step."""
    overheads = {k: v for k, v in time.items() if k != "compute"}
    worst = max(overheads, key=lambda k: overheads[k])
    bottleneck = worst if overheads[worst] >= BOTTLENECK_MIN_SHARE * step_s else "compute"
    comms = {k: time[k] for k in COMM_COMPONENTS}
    if sum(comms.values()) > COMM_BOUND_SHARE * step_s:
        top = max(comms, key=lambda k: comms[k])
        return bottleneck, f"communication-bound ({links[top]})"
    return bottleneck, "compute-bound"


def view(arrays: StepArrays, index: int, cluster: Cluster, plan: Plan) -> StepEstimate:
    """One plan's StepEstimate from a vectorized result."""

    def at(a: FloatArray) -> float:
        return float(np.asarray(a).reshape(-1)[index])

    time = {k: at(arrays.time[k]) for k in TIME_COMPONENTS}
    memory = {k: at(arrays.memory[k]) for k in MEMORY_COMPONENTS}
    step_s = at(arrays.step_time_s)
    bottleneck, regime = classify(time, step_s, component_links(cluster, plan))
    return StepEstimate(
        step_time_s=step_s,
        time_breakdown=time,
        memory_breakdown=memory,
        tokens_per_step=at(arrays.tokens_per_step),
        n_gpus=int(at(arrays.n_gpus)),
        tokens_per_s=at(arrays.tokens_per_s),
        tokens_per_s_per_gpu=at(arrays.tokens_per_s_per_gpu),
        mfu=at(arrays.mfu),
        hfu=at(arrays.hfu),
        memory_bytes=at(arrays.memory_bytes),
        hbm_bytes=at(arrays.hbm_bytes),
        fits=bool(np.asarray(arrays.fits).reshape(-1)[index]),
        bottleneck=bottleneck,
        regime=regime,
        comm_bytes={k: at(v) for k, v in arrays.comm_bytes.items()},
        backward_window_s=0.0 if arrays.backward_window_s is None else at(arrays.backward_window_s),
        memory_detail={k: at(v) for k, v in arrays.memory_detail.items()},
        time_hidden={k: at(v) for k, v in arrays.hidden.items()},
    )


def estimate_step(
    model: TransformerSpec, cluster: Cluster, plan: Plan, *, check_layers: bool = True
) -> StepEstimate:
    """Validate the plan, evaluate it as a one-element PlanArrays, and return its view.

    `check_layers=False` accepts pp·vpp that does not divide n_layers (uneven stages are
    modelled by their fullest stage, ceil(L/(p·v)) layers per chunk).
    """
    if check_layers:
        validate_plan(plan, model)
    else:
        broken = first_broken(plan, model, relax=("layers_per_chunk",))
        if broken is not None:
            raise broken
    arrays = estimate_step_arrays(model, cluster, PlanArrays.scalar(plan))
    return view(arrays, 0, cluster, plan)


def plan_validity(model: TransformerSpec, plans: PlanArrays) -> NDArray[np.bool_]:
    """Vectorized `validate_plan` (without the GPU-count check): True where every rule of
    `specs.rules.RULES` holds."""
    return rules_hold(plans, model)
