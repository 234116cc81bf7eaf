"""Per-op FLOPs and bytes of one transformer step on one GPU, and their roofline times.

Every op's time is `max(F / (C·η_c(F)), B / (W_HBM·η_m))` (Calculon roofline, Isaev et al.
SC'23), with the accelerator's size-dependent matmul efficiency η_c(F) = max·F/(F + F_half).
Shapes follow Megatron's tensor-parallel split (Shoeybi et al. 2019): column- then row-parallel
GEMMs of width /tp; sequence parallelism (Korthikanti et al. 2022) splits the norm and residual
region by tp; context parallelism splits the sequence by cp. Units: FLOP, bytes, seconds.
"""

from __future__ import annotations

from dataclasses import dataclass

from shardmeter.estimate._xp import Num, as_float, ceil, log, maximum, sqrt, where
from shardmeter.estimate.plan_arrays import PRECISION_CODES, RECOMPUTE_CODES, PlanArrays
from shardmeter.specs.hardware import Accelerator, Efficiency
from shardmeter.specs.model import TransformerSpec

ACT_BYTES = 2.0  # bf16/fp16 activations and weights as GEMM operands
BWD_GEMM = 2.0  # backward = data-gradient + weight-gradient GEMMs (Narayanan et al. SC'21, §5.1)
BWD_ATTN = 2.5  # FlashAttention-2 backward runs 5 matmuls vs 2 forward (Dao 2023, §3.1)
BWD_ELEMENTWISE = 2.0  # backward of norms/activations reads and writes about twice the bytes
CAUSAL_FRACTION = 0.5  # causal flash kernels skip the masked half of QKᵀ and AV (C.1 item 1)
ADAM_BYTES_PER_PARAM = 28.0  # read fp32 master, m, v (12) + bf16 grad (2); write 12 + bf16 copy (2)


def matmul_efficiency(flops: Num, eff: Efficiency) -> Num:
    """Achieved fraction of peak for a GEMM of `flops`: max·F/(F + F_half) (F in GFLOP)."""
    gflop = flops / 1e9
    return eff.matmul_max * gflop / (gflop + eff.matmul_half_gflop + 1e-30)


def memory_time(n_bytes: Num, acc: Accelerator) -> Num:
    """Time to stream `n_bytes` through HBM at the calibrated achieved bandwidth."""
    return n_bytes / acc.hbm_bytes_per_s


def gemm_time(m: Num, k: Num, n: Num, acc: Accelerator, fp8: Num) -> Num:
    """Roofline time of one (m×k)·(k×n) GEMM: 2mkn FLOPs, (mk + kn + mn)·2 bytes.

    FP8 GEMMs run `fp8_speedup` times faster than bf16, never above the fp8 peak.
    """
    eff = acc.efficiency
    flops = 2.0 * m * k * n
    eta = maximum(matmul_efficiency(flops, eff), 1e-6)
    t_math = flops / (acc.peak("bf16") * 1e12 * eta)
    if "fp8" in acc.peak_tflops:
        t_fp8 = maximum(t_math / eff.fp8_speedup, flops / (acc.peak("fp8") * 1e12 * eta))
        t_math = where(fp8, t_fp8, t_math)
    return maximum(t_math, memory_time((m * k + k * n + m * n) * ACT_BYTES, acc))


def attention_core_time(flops: Num, n_bytes: Num, acc: Accelerator) -> Num:
    """Fused (flash) attention: bf16 tensor-core work at `attention` efficiency, or HBM bound."""
    eff = acc.efficiency
    gflop = flops / 1e9
    eta = maximum(eff.attention * gflop / (gflop + eff.matmul_half_gflop + 1e-30), 1e-6)
    return maximum(flops / (acc.peak("bf16") * 1e12 * eta), memory_time(n_bytes, acc))


@dataclass(frozen=True)
class LayerCost:
    """Forward cost of one layer (or the logits) for one micro-batch on one GPU."""

    gemm_s: Num  # linear layers
    attention_s: Num  # attention core (QKᵀ, softmax, AV)
    elementwise_s: Num  # norms, residual adds, activation function, RoPE, routing
    gemm_flops: Num
    attention_flops: Num
    host_s: Num = 0.0  # un-hidden host dispatch (MoE expert loop); backward launches twice

    @property
    def forward_s(self) -> Num:
        return self.gemm_s + self.attention_s + self.elementwise_s + self.host_s

    @property
    def backward_s(self) -> Num:
        return (
            BWD_GEMM * (self.gemm_s + self.host_s)
            + BWD_ATTN * self.attention_s
            + BWD_ELEMENTWISE * self.elementwise_s
        )


@dataclass(frozen=True)
class _Shapes:
    """Per-GPU widths and token counts of one micro-batch (arrays over plans)."""

    tokens: Num  # b·s/cp rows entering each GEMM
    norm_tokens: Num  # rows in the norm/residual region (/tp with SP)
    q_local: Num
    kv_local: Num
    fp8: Num


def _shapes(model: TransformerSpec, plans: PlanArrays) -> _Shapes:
    tp = as_float(plans.tp)
    tokens = plans.micro_batch * model.seq_len / as_float(plans.cp)
    norm_tokens = where(plans.sp, tokens / tp, tokens)
    kv_local = maximum(model.kv_heads / tp, 1.0) * model.dim_head  # KV heads replicate if tp > kv
    return _Shapes(
        tokens=tokens,
        norm_tokens=norm_tokens,
        q_local=model.q_dim / tp,
        kv_local=kv_local,
        fp8=plans.precision == PRECISION_CODES["fp8"],
    )


def _mlp_cost(
    sh: _Shapes, h: int, width: Num, n_mat: int, rows: Num, acc: Accelerator
) -> tuple[Num, Num]:
    """GEMM time and FLOPs of a (gated) MLP of local width `width` applied to `rows` tokens."""
    up = gemm_time(rows, h, (n_mat - 1) * width, acc, sh.fp8)
    down = gemm_time(rows, width, h, acc, sh.fp8)
    return up + down, 2.0 * rows * h * width * n_mat


def ep_load_imbalance(tokens: Num, top_k: int, ep: Num) -> Num:
    """Tokens on the busiest of `ep` expert-parallel ranks over the mean, for uniformly
    random (ideally balanced) top-k routing of `tokens` tokens: the rank counts are
    Binomial(T·k, 1/ep), sd/mean = sqrt((ep−1)/(T·k)), and the expected maximum of ep such
    counts is ≈ mean + sqrt(2·ln ep)·sd (Gaussian extreme value). 1 when ep = 1."""
    return 1.0 + sqrt(2.0 * log(ep)) * sqrt((ep - 1.0) / (tokens * top_k))


def layer_forward(
    model: TransformerSpec, plans: PlanArrays, acc: Accelerator, moe: bool
) -> LayerCost:
    """Forward of one decoder layer on one GPU for one micro-batch.

    Attention: QKV projection (q + 2·kv wide, GQA), causal flash attention 4·T·s·q/2 FLOPs,
    output projection. MLP: 2 (GELU) or 3 (SwiGLU) matrices; MoE layers route each token to
    top-k experts (E/ep local experts, each seeing T·k·ep/E tokens), plus shared experts and a
    router of 2·h·E FLOPs per token (C.1 item 3).
    """
    sh = _shapes(model, plans)
    h, tp = model.hidden, as_float(plans.tp)
    t = sh.tokens
    qkv = gemm_time(t, h, sh.q_local + 2.0 * sh.kv_local, acc, sh.fp8)
    out = gemm_time(t, sh.q_local, h, acc, sh.fp8)
    gemm_s = qkv + out
    gemm_flops = 2.0 * t * h * (2.0 * sh.q_local + 2.0 * sh.kv_local)

    attn_flops = 4.0 * t * model.seq_len * sh.q_local * CAUSAL_FRACTION
    # Ring attention (cp > 1) runs one flash kernel per K/V block: cp kernels of 1/cp of the
    # work, each re-reading Q and the output (Liu et al. 2023, Ring Attention, Alg. 1).
    cp = as_float(plans.cp)
    block_bytes = t * (2.0 * sh.q_local + 2.0 * sh.kv_local / cp) * ACT_BYTES
    attention_s = cp * attention_core_time(attn_flops / cp, block_bytes, acc)

    n_mat = model.mlp_matrices
    act_bytes_per_width = 3.0 if model.mlp == "swiglu" else 2.0  # read (2 or 1)·F, write F
    # Two norms (read + write h, 2 B each) and two residual adds (2 reads + 1 write), then RoPE
    # on q and k (read + write).
    elem_bytes = (8.0 + 12.0) * sh.norm_tokens * h + 2.0 * t * (sh.q_local + sh.kv_local) * 2.0
    host_s = 0.0
    if moe and model.moe is not None:
        spec = model.moe
        width = model.expert_ffn / tp
        ep = as_float(plans.ep)
        # Each local expert's grouped-GEMM slice sees T·k·ep/E rows, so small experts run low
        # on the size-dependent curve; the busiest EP rank sets the pace.
        rows_per_expert = t * spec.top_k * ep / spec.experts
        expert_s, _ = _mlp_cost(sh, h, width, n_mat, rows_per_expert, acc)
        local_experts = spec.experts / ep
        routed_s = expert_s * local_experts * ep_load_imbalance(t, spec.top_k, ep)
        routed_flops = 2.0 * t * spec.top_k * h * width * n_mat
        router_s = gemm_time(t, h, spec.experts, acc, False)
        gemm_s = gemm_s + routed_s + router_s
        gemm_flops = gemm_flops + routed_flops + 2.0 * t * h * spec.experts
        if spec.shared_experts:
            shared_s, shared_flops = _mlp_cost(sh, h, width * spec.shared_experts, n_mat, t, acc)
            gemm_s = gemm_s + shared_s
            gemm_flops = gemm_flops + shared_flops
        active_width = width * (spec.top_k + spec.shared_experts)
        # Router softmax + top-k over fp32 logits (write, read, write T·E·4 B); token permute
        # (read T·h, write T·k·h) and unpermute (read T·k·h, write T·h), bf16 (Megatron-Core
        # moe_utils.permute/unpermute).
        elem_bytes = elem_bytes + 12.0 * t * spec.experts + 4.0 * t * h * (1.0 + spec.top_k)
        host_s = acc.efficiency.moe_expert_overhead_us * 1e-6 * local_experts
    else:
        width = model.dense_ffn / tp
        mlp_s, mlp_flops = _mlp_cost(sh, h, width, n_mat, t, acc)
        gemm_s = gemm_s + mlp_s
        gemm_flops = gemm_flops + mlp_flops
        active_width = width
    elem_bytes = elem_bytes + act_bytes_per_width * t * active_width * ACT_BYTES
    return LayerCost(
        gemm_s=gemm_s,
        attention_s=attention_s,
        elementwise_s=memory_time(elem_bytes, acc),
        gemm_flops=gemm_flops,
        attention_flops=attn_flops,
        host_s=host_s,
    )


def logits_forward(model: TransformerSpec, plans: PlanArrays, acc: Accelerator) -> LayerCost:
    """Output head (T×h)·(h×V/tp) and the fp32 softmax cross-entropy (read bf16, write fp32)."""
    sh = _shapes(model, plans)
    v_local = model.vocab / as_float(plans.tp)
    gemm_s = gemm_time(sh.tokens, model.hidden, v_local, acc, sh.fp8)
    ce_bytes = sh.tokens * v_local * (ACT_BYTES + 4.0)
    zero = 0.0 * gemm_s
    return LayerCost(
        gemm_s=gemm_s,
        attention_s=zero,
        elementwise_s=memory_time(ce_bytes, acc),
        gemm_flops=2.0 * sh.tokens * model.hidden * v_local,
        attention_flops=zero,
    )


def model_flops_per_token(model: TransformerSpec, causal: bool = True) -> float:
    """Training model FLOPs per token: 3·(2·N_active_matmul + 2·h·V + 4·L·s·q·[½ if causal]).

    Kaplan et al. 2020 Table 1 with backward = 2× forward; `causal=False` is Megatron's count,
    which equals 72·B·s·L·h²·(1 + s/6h + V/12Lh) per step for GPT-style models
    (Narayanan et al. SC'21, Eq. 3 without recompute).
    """
    return model.training_flops_per_token(causal=causal)


def recompute_flops_per_token(model: TransformerSpec, recompute: Num) -> Num:
    """Extra forward FLOPs per token re-run in backward: all layers (full) or attention (selective)."""
    layers = model.matmul_flops_per_token() - 2.0 * model.vocab * model.hidden
    attention = model.attention_flops_per_token(causal=True)
    selective = where(recompute == RECOMPUTE_CODES["selective"], attention, 0.0)
    return where(recompute == RECOMPUTE_CODES["full"], layers + attention, selective)


def optimizer_time(params_owned: Num, acc: Accelerator) -> Num:
    """Adam step over the parameters this GPU owns: memory-bound, 28 B/param (C.2)."""
    return memory_time(params_owned * ADAM_BYTES_PER_PARAM, acc)


@dataclass(frozen=True)
class StageCompute:
    """Per-micro-batch compute of the slowest pipeline stage (last stage: layers + logits)."""

    layers: Num  # decoder layers held by one stage (all v chunks)
    forward_s: Num
    backward_s: Num
    recompute_s: Num
    gemm_forward_s: Num  # window for overlapped TP collectives
    attention_forward_s: Num  # window for ring-attention (CP) exchange
    layer_forward_s: Num  # one layer's forward (unit of FSDP prefetch)


def stage_layers(model: TransformerSpec, plans: PlanArrays) -> Num:
    """Layers on the fullest stage: v chunks of ceil(L/(p·v)) layers (uneven splits round up)."""
    chunks = plans.pp * plans.vpp
    return ceil(model.n_layers / as_float(chunks)) * plans.vpp


def stage_compute(model: TransformerSpec, plans: PlanArrays, acc: Accelerator) -> StageCompute:
    """Forward, backward and recompute seconds of one micro-batch on the slowest stage."""
    n_stage = stage_layers(model, plans)
    moe_share = model.n_moe_layers / model.n_layers
    dense = layer_forward(model, plans, acc, moe=False)
    costs = [(1.0 - moe_share, dense)]
    if moe_share > 0:
        costs.append((moe_share, layer_forward(model, plans, acc, moe=True)))

    def mix(attr: str) -> Num:
        return sum(w * getattr(c, attr) for w, c in costs)

    layer_fwd = mix("forward_s")
    layer_bwd = mix("backward_s")
    head = logits_forward(model, plans, acc)
    code = plans.recompute
    selective = where(
        code == RECOMPUTE_CODES["selective"], mix("attention_s") + mix("elementwise_s"), 0.0
    )
    layer_recompute = where(code == RECOMPUTE_CODES["full"], layer_fwd, selective)
    return StageCompute(
        layers=n_stage,
        forward_s=n_stage * layer_fwd + head.forward_s,
        backward_s=n_stage * layer_bwd + head.backward_s,
        recompute_s=n_stage * layer_recompute,
        gemm_forward_s=n_stage * mix("gemm_s"),
        attention_forward_s=n_stage * mix("attention_s"),
        layer_forward_s=layer_fwd,
    )
