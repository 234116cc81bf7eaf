"""Per-op FLOPs and bytes of one transformer step on one GPU, and their roofline times.

Every op's time is `max(F / (C·η_c(F)), B / (W_HBM·η_m))` (Calculon roofline, Isaev et al.
SC'23), with the accelerator's size-dependent matmul efficiency η_c(F) = max·F/(F + F_half).
Shapes follow Megatron's tensor-parallel split (Shoeybi et al. 2019): column- then row-parallel
GEMMs of width /tp; sequence parallelism (Korthikanti et al. 2022) splits the norm and residual
region by tp; context parallelism splits the sequence by cp. Units: FLOP, bytes, seconds.
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np
from numpy.typing import ArrayLike, NDArray

from shardmeter.estimate.plan_arrays import PRECISION_CODES, RECOMPUTE_CODES, PlanArrays
from shardmeter.specs.hardware import Accelerator, Efficiency
from shardmeter.specs.model import TransformerSpec

FloatArray = NDArray[np.float64]

ACT_BYTES = 2.0  # bf16/fp16 activations and weights as GEMM operands
BWD_GEMM = 2.0  # backward = data-gradient + weight-gradient GEMMs (Narayanan et al. SC'21, §5.1)
BWD_ATTN = 2.5  # FlashAttention-2 backward runs 5 matmuls vs 2 forward (Dao 2023, §3.1)
BWD_ELEMENTWISE = 2.0  # backward of norms/activations reads and writes about twice the bytes
CAUSAL_FRACTION = 0.5  # causal flash kernels skip the masked half of QKᵀ and AV (C.1 item 1)
ADAM_BYTES_PER_PARAM = 28.0  # read fp32 master, m, v (12) + bf16 grad (2); write 12 + bf16 copy (2)


def matmul_efficiency(flops: ArrayLike, eff: Efficiency) -> FloatArray:
    """Achieved fraction of peak for a GEMM of `flops`: max·F/(F + F_half) (F in GFLOP)."""
    gflop = np.asarray(flops, dtype=np.float64) / 1e9
    return np.asarray(
        eff.matmul_max * gflop / (gflop + eff.matmul_half_gflop + 1e-30), dtype=np.float64
    )


def memory_time(n_bytes: ArrayLike, acc: Accelerator) -> FloatArray:
    """Time to stream `n_bytes` through HBM at the calibrated achieved bandwidth."""
    rate = acc.hbm_gbps * 1e9 * acc.efficiency.memory
    return np.asarray(np.asarray(n_bytes, dtype=np.float64) / rate, dtype=np.float64)


def gemm_time(
    m: ArrayLike, k: ArrayLike, n: ArrayLike, acc: Accelerator, fp8: ArrayLike
) -> FloatArray:
    """Roofline time of one (m×k)·(k×n) GEMM: 2mkn FLOPs, (mk + kn + mn)·2 bytes.

    FP8 GEMMs run `fp8_speedup` times faster than bf16, never above the fp8 peak.
    """
    eff = acc.efficiency
    flops = 2.0 * np.asarray(m, np.float64) * np.asarray(k, np.float64) * np.asarray(n, np.float64)
    eta = np.maximum(matmul_efficiency(flops, eff), 1e-6)
    peak = acc.peak("bf16") * 1e12
    t_bf16 = flops / (peak * eta)
    if "fp8" in acc.peak_tflops:
        t_fp8 = np.maximum(t_bf16 / eff.fp8_speedup, flops / (acc.peak("fp8") * 1e12 * eta))
        t_math = np.where(np.asarray(fp8, dtype=bool), t_fp8, t_bf16)
    else:
        t_math = t_bf16
    n_bytes = (np.asarray(m) * np.asarray(k) + np.asarray(k) * np.asarray(n)) * ACT_BYTES
    n_bytes = n_bytes + np.asarray(m) * np.asarray(n) * ACT_BYTES
    return np.asarray(np.maximum(t_math, memory_time(n_bytes, acc)), dtype=np.float64)


def attention_core_time(flops: ArrayLike, n_bytes: ArrayLike, acc: Accelerator) -> FloatArray:
    """Fused (flash) attention: bf16 tensor-core work at `attention` efficiency, or HBM bound."""
    eff = acc.efficiency
    flops_ = np.asarray(flops, dtype=np.float64)
    gflop = flops_ / 1e9
    eta = eff.attention * gflop / (gflop + eff.matmul_half_gflop + 1e-30)
    t_math = flops_ / (acc.peak("bf16") * 1e12 * np.maximum(eta, 1e-6))
    return np.asarray(np.maximum(t_math, memory_time(n_bytes, acc)), dtype=np.float64)


@dataclass(frozen=True)
class LayerCost:
    """Forward cost of one layer (or the logits) for one micro-batch on one GPU."""

    gemm_s: FloatArray  # linear layers
    attention_s: FloatArray  # attention core (QKᵀ, softmax, AV)
    elementwise_s: FloatArray  # norms, residual adds, activation function, RoPE, routing
    gemm_flops: FloatArray
    attention_flops: FloatArray

    @property
    def forward_s(self) -> FloatArray:
        return self.gemm_s + self.attention_s + self.elementwise_s

    @property
    def backward_s(self) -> FloatArray:
        return (
            BWD_GEMM * self.gemm_s
            + BWD_ATTN * self.attention_s
            + BWD_ELEMENTWISE * self.elementwise_s
        )


@dataclass(frozen=True)
class _Shapes:
    """Per-GPU widths and token counts of one micro-batch (arrays over plans)."""

    tokens: FloatArray  # b·s/cp rows entering each GEMM
    norm_tokens: FloatArray  # rows in the norm/residual region (/tp with SP)
    q_local: FloatArray
    kv_local: FloatArray
    fp8: NDArray[np.bool_]


def _shapes(model: TransformerSpec, plans: PlanArrays) -> _Shapes:
    tp = plans.tp.astype(np.float64)
    tokens = plans.micro_batch * model.seq_len / plans.cp.astype(np.float64)
    norm_tokens = np.where(plans.sp, tokens / tp, tokens)
    kv_local = (
        np.maximum(model.kv_heads / tp, 1.0) * model.dim_head
    )  # KV heads replicate if tp > kv
    return _Shapes(
        tokens=tokens,
        norm_tokens=norm_tokens,
        q_local=model.q_dim / tp,
        kv_local=kv_local,
        fp8=plans.precision == PRECISION_CODES["fp8"],
    )


def _mlp_cost(
    sh: _Shapes, h: int, width: FloatArray, n_mat: int, rows: FloatArray, acc: Accelerator
) -> tuple[FloatArray, FloatArray]:
    """GEMM time and FLOPs of a (gated) MLP of local width `width` applied to `rows` tokens."""
    up = gemm_time(rows, h, (n_mat - 1) * width, acc, sh.fp8)
    down = gemm_time(rows, width, h, acc, sh.fp8)
    return up + down, 2.0 * rows * h * width * n_mat


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
    h, tp = model.hidden, plans.tp.astype(np.float64)
    t = sh.tokens
    qkv = gemm_time(t, h, sh.q_local + 2.0 * sh.kv_local, acc, sh.fp8)
    out = gemm_time(t, sh.q_local, h, acc, sh.fp8)
    gemm_s = qkv + out
    gemm_flops = 2.0 * t * h * (2.0 * sh.q_local + 2.0 * sh.kv_local)

    attn_flops = 4.0 * t * model.seq_len * sh.q_local * CAUSAL_FRACTION
    attn_bytes = t * (2.0 * sh.q_local + 2.0 * sh.kv_local) * ACT_BYTES
    attention_s = attention_core_time(attn_flops, attn_bytes, acc)

    n_mat = model.mlp_matrices
    act_bytes_per_width = 3.0 if model.mlp == "swiglu" else 2.0  # read (2 or 1)·F, write F
    elem_bytes = (8.0 + 12.0) * sh.norm_tokens * h + 2.0 * t * (sh.q_local + sh.kv_local) * 2.0
    if moe and model.moe is not None:
        spec = model.moe
        width = model.expert_ffn / tp
        ep = plans.ep.astype(np.float64)
        rows_per_expert = t * spec.top_k * ep / spec.experts
        expert_s, _ = _mlp_cost(sh, h, width, n_mat, rows_per_expert, acc)
        routed_s = expert_s * spec.experts / ep
        routed_flops = 2.0 * t * spec.top_k * h * width * n_mat
        router_s = gemm_time(t, h, spec.experts, acc, False)
        gemm_s = gemm_s + routed_s + router_s
        gemm_flops = gemm_flops + routed_flops + 2.0 * t * h * spec.experts
        if spec.shared_experts:
            shared_s, shared_flops = _mlp_cost(sh, h, width * spec.shared_experts, n_mat, t, acc)
            gemm_s = gemm_s + shared_s
            gemm_flops = gemm_flops + shared_flops
        active_width = width * (spec.top_k + spec.shared_experts)
        elem_bytes = elem_bytes + 8.0 * t * spec.top_k * h  # token permute/unpermute
    else:
        width = model.dense_ffn / tp
        mlp_s, mlp_flops = _mlp_cost(sh, h, width, n_mat, t, acc)
        gemm_s = gemm_s + mlp_s
        gemm_flops = gemm_flops + mlp_flops
        active_width = width
    elem_bytes = elem_bytes + act_bytes_per_width * t * active_width * ACT_BYTES
    return LayerCost(
        gemm_s=np.asarray(gemm_s, np.float64),
        attention_s=attention_s,
        elementwise_s=memory_time(elem_bytes, acc),
        gemm_flops=np.asarray(gemm_flops, np.float64),
        attention_flops=np.asarray(attn_flops, np.float64),
    )


def logits_forward(model: TransformerSpec, plans: PlanArrays, acc: Accelerator) -> LayerCost:
    """Output head (T×h)·(h×V/tp) and the fp32 softmax cross-entropy (read bf16, write fp32)."""
    sh = _shapes(model, plans)
    v_local = model.vocab / plans.tp.astype(np.float64)
    gemm_s = gemm_time(sh.tokens, model.hidden, v_local, acc, sh.fp8)
    ce_bytes = sh.tokens * v_local * (ACT_BYTES + 4.0)
    zero = np.zeros_like(gemm_s)
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


def recompute_flops_per_token(model: TransformerSpec, recompute: ArrayLike) -> FloatArray:
    """Extra forward FLOPs per token re-run in backward: all layers (full) or attention (selective)."""
    layers = model.matmul_flops_per_token() - 2.0 * model.vocab * model.hidden
    attention = model.attention_flops_per_token(causal=True)
    code = np.asarray(recompute)
    return np.asarray(
        np.where(
            code == RECOMPUTE_CODES["full"],
            layers + attention,
            np.where(code == RECOMPUTE_CODES["selective"], attention, 0.0),
        ),
        dtype=np.float64,
    )


def optimizer_time(params_owned: ArrayLike, acc: Accelerator) -> FloatArray:
    """Adam step over the parameters this GPU owns: memory-bound, 28 B/param (C.2)."""
    return memory_time(np.asarray(params_owned, np.float64) * ADAM_BYTES_PER_PARAM, acc)


@dataclass(frozen=True)
class StageCompute:
    """Per-micro-batch compute of the slowest pipeline stage (last stage: layers + logits)."""

    layers: FloatArray  # decoder layers held by one stage (all v chunks)
    forward_s: FloatArray
    backward_s: FloatArray
    recompute_s: FloatArray
    gemm_forward_s: FloatArray  # window for overlapped TP collectives
    attention_forward_s: FloatArray  # window for ring-attention (CP) exchange
    layer_forward_s: FloatArray  # one layer's forward (unit of FSDP prefetch)


def stage_layers(model: TransformerSpec, plans: PlanArrays) -> FloatArray:
    """Layers on the fullest stage: v chunks of ceil(L/(p·v)) layers (uneven splits round up)."""
    chunks = plans.pp * plans.vpp
    per_chunk = np.ceil(model.n_layers / chunks.astype(np.float64))
    return np.asarray(per_chunk * plans.vpp, dtype=np.float64)


def stage_compute(model: TransformerSpec, plans: PlanArrays, acc: Accelerator) -> StageCompute:
    """Forward, backward and recompute seconds of one micro-batch on the slowest stage."""
    n_stage = stage_layers(model, plans)
    moe_share = model.n_moe_layers / model.n_layers
    dense = layer_forward(model, plans, acc, moe=False)
    costs = [(1.0 - moe_share, dense)]
    if moe_share > 0:
        costs.append((moe_share, layer_forward(model, plans, acc, moe=True)))

    def mix(attr: str) -> FloatArray:
        return np.asarray(sum(w * getattr(c, attr) for w, c in costs), dtype=np.float64)

    layer_fwd = mix("forward_s")
    layer_bwd = mix("backward_s")
    head = logits_forward(model, plans, acc)
    code = plans.recompute
    layer_recompute = np.where(
        code == RECOMPUTE_CODES["full"],
        layer_fwd,
        np.where(
            code == RECOMPUTE_CODES["selective"],
            mix("attention_s") + mix("elementwise_s"),
            0.0,
        ),
    )
    return StageCompute(
        layers=n_stage,
        forward_s=n_stage * layer_fwd + head.forward_s,
        backward_s=n_stage * layer_bwd + head.backward_s,
        recompute_s=n_stage * layer_recompute,
        gemm_forward_s=n_stage * mix("gemm_s"),
        attention_forward_s=n_stage * mix("attention_s"),
        layer_forward_s=layer_fwd,
    )
