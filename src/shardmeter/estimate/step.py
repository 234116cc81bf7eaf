"""One island's training step: compute, recompute, bubble, exposed communication, optimizer.

T_step = m·(t_f + t_b + t_recompute + exposed per-micro-batch comms) + bubble + exposed
DP/ZeRO comms + optimizer (C.7, Calculon structure). Each communication is hidden up to its
overlap window, `exposed = max(0, T_comm − W)`, and while it overlaps compute runs slower by
u/(1−u) of the hidden time (u = `Cluster.overlap_slowdown`, Calculon's processor_usage).
The pipeline bubble is (p−1)/(v·m) of the per-step stage time (Narayanan et al. SC'21, §2.2).
`estimate_step_arrays` evaluates any number of plans at once; `estimate_step` is its view.
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np
from numpy.typing import NDArray

from shardmeter.errors import UserInputError
from shardmeter.estimate import comm
from shardmeter.estimate._xp import Num, as_float, logical_not, maximum, minimum, where
from shardmeter.estimate.compute import (
    ACT_BYTES,
    BWD_ATTN,
    ep_load_imbalance,
    model_flops_per_token,
    optimizer_time,
    recompute_flops_per_token,
    stage_compute,
)
from shardmeter.estimate.memory import (
    GRAD_BYTES,
    WEIGHT_BYTES,
    local_params,
    memory_breakdown,
    shard_divisors,
)
from shardmeter.estimate.plan_arrays import (
    PRECISION_CODES,
    RECOMPUTE_CODES,
    SHARDING_CODES,
    PlanArrays,
)
from shardmeter.estimate.result import (
    MEMORY_COMPONENTS,
    TIME_COMPONENTS,
    StepArrays,
    StepEstimate,
)
from shardmeter.specs.hardware import Cluster
from shardmeter.specs.model import TransformerSpec
from shardmeter.specs.plan import Plan, validate_plan

FloatArray = NDArray[np.float64]

COMM_COMPONENTS: tuple[str, ...] = tuple(c for c in TIME_COMPONENTS if c.endswith("_comm"))
BOTTLENECK_MIN_SHARE = 0.05  # an overhead below 5% of the step is not called the bottleneck
COMM_BOUND_SHARE = 0.10  # exposed communication above 10% of the step => communication-bound


@dataclass(frozen=True)
class _Overlap:
    """Exposed part of a communication and the compute slowdown it causes while hidden."""

    exposed: Num
    interference: Num

    @property
    def cost(self) -> Num:
        return self.exposed + self.interference


def _overlap(comm_s: Num, window_s: Num, slowdown: float) -> _Overlap:
    """exposed = max(0, T_comm − W); interference = u/(1−u)·min(T_comm, W) (C.7)."""
    hidden = minimum(comm_s, window_s)
    return _Overlap(
        exposed=maximum(comm_s - window_s, 0.0),
        interference=hidden * slowdown / (1.0 - slowdown),
    )


def _share(part: Num, whole: Num) -> Num:
    return where(whole > 0, part / maximum(whole, 1e-300), 0.0)


def _finish(value: Num, zeros: FloatArray) -> FloatArray:
    """A float64 array of the plans' shape (`zeros` has it; scalars become 0-d arrays).

    Adding to zeros broadcasts into a fresh writable array in one ufunc call."""
    if isinstance(value, np.ndarray) and value.shape == zeros.shape:
        return value if value.dtype == np.float64 else value.astype(np.float64)
    return np.add(value, zeros)


def pipeline_bubble_fraction(p: Num, v: Num, m: Num) -> Num:
    """Idle share of ideal stage time: (p−1)/m for 1F1B, (p−1)/(v·m) interleaved
    (Narayanan et al. SC'21, §2.2.1-2.2.2)."""
    return (as_float(p) - 1.0) / (as_float(v) * as_float(m))


def estimate_step_arrays(model: TransformerSpec, cluster: Cluster, plans: PlanArrays) -> StepArrays:
    """Vectorized step estimate: every PlanArrays column may be an array; one formula."""
    acc = cluster.accelerator
    u = cluster.overlap_slowdown
    dp, tp, pp, cp, ep, vpp = (
        as_float(x) for x in (plans.dp, plans.tp, plans.pp, plans.cp, plans.ep, plans.vpp)
    )
    m = as_float(plans.micro_batches)
    full = plans.recompute == RECOMPUTE_CODES["full"]
    sc = stage_compute(model, plans, acc)
    tokens_mb = plans.micro_batch * model.seq_len / cp  # tokens per micro-batch per GPU
    moe_layers = sc.layers * (model.n_moe_layers / model.n_layers)

    # Tensor parallel: 2 all-reduces forward + 2 backward per layer (+2 when the forward is
    # recomputed), each b·s·h bytes; SP's all-gather + reduce-scatter pair costs the same
    # (Korthikanti et al. 2022, §4.2.2). Overlap window: the layer GEMMs (comm-GEMM overlap).
    tp_msg = tokens_mb * model.hidden * ACT_BYTES
    tp_count = sc.layers * (4.0 + 2.0 * full)
    tp_total = tp_count * comm.all_reduce_time(tp_msg, tp, 1, cluster)
    tp_window = where(plans.overlap_tp, sc.gemm_forward_s * (3.0 + full), 0.0)
    tp_mb = _overlap(tp_total, tp_window, u)

    # Context parallel (ring attention): c−1 K,V blocks per layer forward, twice that backward
    # (K,V and their gradients), hidden only behind the attention core of the same layer
    # (C.5); the ring runs over the NIC once tp·cp spans NVLink domains.
    kv_local = maximum(model.kv_heads / tp, 1.0) * model.dim_head
    kv_block = 2.0 * tokens_mb * kv_local * ACT_BYTES
    hop = comm.ring_hop_time(kv_block, cp, tp, cluster) * (cp - 1.0)
    cp_fwd = _overlap(sc.layers * hop * (1.0 + full), sc.attention_forward_s * (1.0 + full), u)
    cp_bwd = _overlap(sc.layers * hop * 2.0, sc.attention_forward_s * BWD_ATTN, u)
    cp_mb = cp_fwd.cost + cp_bwd.cost

    # Expert parallel: dispatch + combine all-to-all of T·k·h bytes, forward and backward; the
    # busiest rank (routing load imbalance) sets the time.
    top_k = model.moe.top_k if model.moe is not None else 0
    a2a_msg = tokens_mb * top_k * model.hidden * ACT_BYTES
    if top_k:
        a2a_msg = a2a_msg * ep_load_imbalance(tokens_mb, top_k, ep)
    ep_count = moe_layers * (4.0 + 2.0 * full)
    ep_mb = ep_count * comm.all_to_all_time(a2a_msg, ep, tp * cp, cluster)

    # Data parallel / ZeRO / FSDP. Gradients reduce over dp·cp; a shard group of d ranks
    # reduce-scatters and all-gathers, replicas all-reduce the 1/d shard (HSDP, C.5).
    params = local_params(model, plans)
    d_dense, d_expert = shard_divisors(plans)
    rep_dense = maximum(dp * cp / d_dense, 1.0)
    rep_expert = maximum(dp * cp / ep / d_expert, 1.0)
    stride_exp = tp * cp * ep

    def sync(p_count: Num, d: Num, rep: Num, stride: Num) -> tuple[Num, Num, Num]:
        grads = p_count * GRAD_BYTES
        rs = comm.reduce_scatter_time(grads, d, stride, cluster)
        ag = comm.all_gather_time(p_count * WEIGHT_BYTES, d, stride, cluster)
        ar = comm.all_reduce_time(grads / d, rep, stride * d, cluster)
        return rs, ag, ar

    rs, ag, ar = sync(params.dense, d_dense, rep_dense, tp)
    if model.moe is not None:  # routed experts sync over their own (dp·cp/ep) groups
        rs_e, ag_e, ar_e = sync(params.expert, d_expert, rep_expert, stride_exp)
        rs, ag, ar = rs + rs_e, ag + ag_e, ar + ar_e

    stage = plans.sharding
    zero2_up = stage >= SHARDING_CODES["zero2"]
    zero3 = stage == SHARDING_CODES["zero3"]
    odp = plans.overlap_dp
    opg = plans.overlap_param_gather
    bwd_window = sc.backward_s + sc.recompute_s
    fwd_window = sc.forward_s

    # Per micro-batch: ZeRO-2 reduce-scatters grads, ZeRO-3 also gathers params fwd and bwd.
    rs_mb = where(zero2_up, rs, 0.0)
    ag_mb = where(zero3, ag, 0.0)
    first_unit = ag_mb / maximum(sc.layers, 1.0)  # the first unit's gather cannot prefetch
    fwd_ag = _overlap(ag_mb - first_unit, where(opg, fwd_window, 0.0), u)
    bwd_hideable = ag_mb * opg + rs_mb * odp
    bwd = _overlap(bwd_hideable, bwd_window, u)
    bwd_exposed = ag_mb * logical_not(opg) + rs_mb * logical_not(odp) + bwd.cost
    ag_share = _share(ag_mb, ag_mb + rs_mb)
    fsdp_mb = fwd_ag.cost + first_unit + bwd_exposed * ag_share
    dp_mb = bwd_exposed * (1.0 - ag_share)

    # Once per step: the gradient reduce of the last micro-batch (all-reduce for DDP, RS for
    # ZeRO-1, the replica all-reduce for all stages), then ZeRO-1/2's parameter all-gather.
    grad_once = where(stage == SHARDING_CODES["zero1"], rs, 0.0) + ar
    dp_once = _overlap(grad_once, where(odp, bwd_window, 0.0), u).cost
    ag_once = where((stage >= SHARDING_CODES["zero1"]) & logical_not(zero3), ag, 0.0)
    fsdp_once = _overlap(ag_once, where(opg, fwd_window, 0.0), u).cost

    # Pipeline point-to-point: activation forward and gradient backward per micro-batch and
    # chunk; interleaved schedules overlap it with compute except at fill and drain (Megatron's
    # overlap_p2p_comm), plain 1F1B keeps it on the critical path.
    pp_msg = tokens_mb * model.hidden * ACT_BYTES / where(plans.sp, tp, 1.0)
    pp_hop = comm.send_recv_time(pp_msg, tp * cp * dp, cluster)
    pp_sends = where(pp > 1, 2.0 * m * vpp, 0.0)
    pp_exposed = where(vpp > 1, 2.0 * (pp - 1.0), pp_sends) * pp_hop
    pp_hidden = (pp_sends * pp_hop - pp_exposed) * u / (1.0 - u)
    pp_total = where(pp > 1, pp_exposed + maximum(pp_hidden, 0.0), 0.0)

    per_mb = sc.forward_s + sc.backward_s + sc.recompute_s + tp_mb.cost + cp_mb + ep_mb
    per_mb = per_mb + fsdp_mb + dp_mb
    bubble = pipeline_bubble_fraction(pp, vpp, m) * m * per_mb

    d_opt_dense = where(stage >= SHARDING_CODES["zero1"], d_dense, 1.0)
    d_opt_expert = where(stage >= SHARDING_CODES["zero1"], d_expert, 1.0)
    opt = optimizer_time(params.dense / d_opt_dense + params.expert / d_opt_expert, acc)

    time = {
        "compute": m * (sc.forward_s + sc.backward_s),
        "recompute": m * sc.recompute_s,
        "optimizer": opt,
        "bubble": bubble,
        "tp_comm": m * tp_mb.cost,
        "pp_comm": pp_total,
        "dp_comm": m * dp_mb + dp_once,
        "fsdp_comm": m * fsdp_mb + fsdp_once,
        "cp_comm": m * cp_mb,
        "ep_comm": m * ep_mb,
    }
    shape = plans.shape
    zeros = np.zeros(shape)
    time = {k: _finish(v, zeros) for k, v in time.items()}
    step = sum(time.values(), start=zeros)

    grad_bytes = params.total * GRAD_BYTES
    comm_bytes = {
        "tp": m * tp_count * tp_msg * 2.0 * (tp - 1.0) / tp,
        "pp": pp_sends * pp_msg,
        "dp": where(zero2_up, m, 1.0) * grad_bytes,
        "fsdp": where(zero3, 2.0 * m, where(stage >= 1, 1.0, 0.0)) * params.total * 2.0,
        "cp": m * sc.layers * 3.0 * kv_block * (cp - 1.0),
        "ep": m * ep_count * a2a_msg * (ep - 1.0) / ep,
    }
    comm_bytes = {k: _finish(v, zeros) for k, v in comm_bytes.items()}

    tokens_step = as_float(plans.global_batch) * model.seq_len
    model_flops = model_flops_per_token(model, causal=True) * tokens_step
    hw_flops = model_flops + recompute_flops_per_token(model, plans.recompute) * tokens_step
    fp8 = plans.precision == PRECISION_CODES["fp8"]
    fp16 = plans.precision == PRECISION_CODES["fp16"]
    peak = where(fp8, acc.peak("fp8"), where(fp16, acc.peak("fp16"), acc.peak("bf16")))
    memory = memory_breakdown(model, cluster, plans, params).as_dict()
    return StepArrays(
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
    )


def estimate_step(
    model: TransformerSpec, cluster: Cluster, plan: Plan, *, check_layers: bool = True
) -> StepEstimate:
    """Validate the plan, evaluate it as a one-element PlanArrays, and return its view.

    `check_layers=False` accepts pp·vpp that does not divide n_layers (uneven stages are
    modelled by their fullest stage, ceil(L/(p·v)) layers per chunk).
    """
    try:
        validate_plan(plan, model)
    except UserInputError as exc:
        uneven = exc.field == "plan.pp" and "divide n_layers" in exc.allowed
        if check_layers or not uneven:
            raise
    arrays = estimate_step_arrays(model, cluster, PlanArrays.scalar(plan))
    return view(arrays, 0, cluster, plan)


def plan_validity(model: TransformerSpec, plans: PlanArrays) -> NDArray[np.bool_]:
    """Vectorized `validate_plan` (without the GPU-count check): True where a plan is runnable."""
    ok = (model.n_heads % plans.tp == 0) & (model.n_layers % (plans.pp * plans.vpp) == 0)
    ok &= (plans.vpp == 1) | (plans.pp > 1)
    ok &= model.seq_len % plans.cp == 0
    experts = model.moe.experts if model.moe is not None else 1
    ok &= (plans.ep == 1) | ((model.moe is not None) & (experts % plans.ep == 0))
    ok &= plans.dp % plans.ep == 0
    ok &= plans.global_batch % (plans.dp * plans.micro_batch) == 0
    ok &= (plans.vpp == 1) | (plans.micro_batches % plans.pp == 0)
    ok &= (plans.sharding > 0) | (plans.shard_group == 1)
    ok &= plans.dp % plans.shard_group == 0
    return np.asarray(ok, dtype=np.bool_)
