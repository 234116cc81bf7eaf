"""Per-op FLOPs and bytes of one transformer step on one GPU, and their roofline times.

Every op's time is `max(F / (C·η_c(F)), B / (W_HBM·η_m))` (Calculon roofline, Isaev et al.
SC'23), with the accelerator's size-dependent matmul efficiency η_c(F) = max·F/(F + F_half).
Shapes follow Megatron's tensor-parallel split (Shoeybi et al. 2019): column- then row-parallel
GEMMs of width /tp; sequence parallelism (Korthikanti et al. 2022) splits the norm and residual
region by tp; context parallelism splits the sequence by cp. A layer's time is the larger of
its GPU work and the host time to launch its kernels (a roofline of device vs host, per layer
and micro-batch). Units: FLOP, bytes, seconds.
"""

from __future__ import annotations

from dataclasses import dataclass

from shardmeter.estimate._xp import Num, as_float, ceil, log, logical_not, maximum, sqrt, where
from shardmeter.estimate.plan_arrays import (
    ATTENTION_CODES,
    PRECISION_CODES,
    RECOMPUTE_CODES,
    PlanArrays,
)
from shardmeter.specs.hardware import Accelerator, Efficiency
from shardmeter.specs.model import TransformerSpec

ACT_BYTES = 2.0  # bf16/fp16 activations and weights as GEMM operands
BWD_GEMM = 2.0  # backward = data-gradient + weight-gradient GEMMs (Narayanan et al. SC'21, §5.1)
BWD_ATTN = 2.5  # FlashAttention-2 backward runs 5 matmuls vs 2 forward (Dao 2023, §3.1)
BWD_ELEMENTWISE = 2.0  # backward of norms/activations reads and writes about twice the bytes
CAUSAL_FRACTION = 0.5  # causal flash kernels skip the masked half of QKᵀ and AV (C.1 item 1)
ADAM_BYTES_PER_PARAM = 28.0  # read fp32 master, m, v (12) + bf16 grad (2); write 12 + bf16 copy (2)
# Unfused attention moves every fp16 score element through HBM, forward: QKᵀ writes it (2 B),
# the fused scale-mask-softmax reads and writes it (4), dropout reads it and writes its mask
# and output (2 + 1 + 2), AV reads it (2): 13 B. Korthikanti et al. 2022 §4.1 counts the 5 B
# of it that stay stored (softmax output, mask, dropout output). Backward moves about twice.
UNFUSED_SCORE_BYTES = 13.0
# Kernels one dense decoder layer launches forward with fused norms and attention: 2 norms,
# QKV GEMM, RoPE, attention, output GEMM, 2 residual adds, MLP up GEMM, activation, MLP down
# GEMM (Megatron-Core / Transformer Engine layer); backward launches about twice as many.
KERNELS_PER_LAYER = 11.0
KERNELS_BWD = 2.0
# A dropless MoE layer copies its tokens-per-expert counts to the host (the all-to-all splits
# and grouped-GEMM sizes are host lists), which drains the GPU queue: the kernels launched
# after that sync are not hidden behind earlier GPU work. They are the token dispatcher's
# (router top-k, softmax and aux loss, token counts, permute, sort chunks by expert, unpermute:
# about 60 eager ops in Megatron-Core's TopKRouter + MoEAlltoAllTokenDispatcher, and the
# activation, which Megatron-Core's TEGroupedMLP.forward applies once over every local
# expert's rows) plus, per local expert, the fc1 and fc2 GEMMs (Transformer Engine
# grouped_linear.py: `general_grouped_gemm`, one GEMM per expert) and, under FP8, the quantize
# of each of those two GEMMs' input slices (`tex.split_quantize`, one quantizer per expert;
# BF16 slices are `torch.split` views). Kernels, dimensionless.
MOE_SYNCED_KERNELS = 60.0
KERNELS_PER_EXPERT = 2.0
FP8_CASTS_PER_EXPERT = 2.0
HEAD_KERNELS = 3.0  # output GEMM, softmax cross-entropy, loss reduction
# HBM bytes per element of the element-wise ops, fused (one kernel: read 2 B, write 2 B) and
# eager (PyTorch op by op, torchtitan's Llama code). RMSNorm `_norm(x.float()).type_as(x) *
# weight`: cast (r2 w4), pow (r4 w4), mean (r4), x·rsqrt (r4 w4), cast back (r4 w2), ·weight
# (r2 w2) = 36 B. RoPE on q and k through complex fp32 (cast r2 w4, complex multiply r4 w4,
# cast back r4 w2) = 20 B. SwiGLU silu(g)·u per intermediate element: fused reads g and u
# and writes 6 B; eager silu (r2 w2) then multiply (r4 w2) = 10 B. Residual adds (r4 w2) and
# GELU (r2 w2) are one kernel either way.
# fp32 weights under torch.autocast (FSDP MixedPrecision param_dtype=float32, Composer's
# mixed_precision DEFAULT): each GEMM casts its weight to bf16 at every use, reading 4 B and
# writing 2 B per weight (aten::_to_copy); backward casts the weight gradient back to fp32
# (r2 w4) and to the bf16 reduce dtype (r4 w2), twice the forward (PyTorch autocast docs,
# "CUDA Ops that can autocast to float16"; torch.distributed.fsdp.MixedPrecision).
AUTOCAST_CAST_BYTES = 6.0
# With fp32 weights the embedding (not an autocast op) returns fp32, and bf16 + fp32 promotes,
# so the residual stream stays fp32: each of the two residual adds reads 4 + 2 and writes 4 B
# (10 instead of 6) and each of the two norms first casts its fp32 input to bf16 (r4 w2):
# 2·4 + 2·6 = 20 B more per token and hidden element (PyTorch type promotion; llm-foundry MPT
# `SharedEmbedding`, `LPLayerNorm`).
FP32_RESIDUAL_BYTES = 2.0 * (10.0 - 6.0) + 2.0 * 6.0
# FP8 GEMM operands outside a compiled graph: Transformer Engine (and torchao's Float8Linear)
# quantizes each GEMM's bf16 activation input with one fused cast-transpose kernel, reading
# 2 B and writing the FP8 tensor and its FP8 transpose (the weight-gradient GEMM's operand on
# Hopper's TN-only FP8 tensor cores), 1 + 1 B; backward does the same for every GEMM's output
# gradient (TE transformer_engine/common/transpose/cast_transpose.cu; Micikevicius et al. 2022,
# "FP8 formats for deep learning" §4, per-tensor scaled casts). XLA fuses the cast into the
# producing op (`compiled`), so a compiled step pays none of it.
FP8_CAST_BYTES = 4.0
# Rowwise FP8 scaling (torchao Float8LinearConfig.from_recipe_name("rowwise"): axiswise scales
# for input, weight and grad_output) scales each operand along the K axis of the GEMM that reads
# it, so no FP8 copy serves a second GEMM by transposition: the bf16 activation input is cast
# along its rows for the forward GEMM and again along its columns for the weight-gradient GEMM,
# and each output gradient once per backward GEMM, 2 × (read 2 B, write 1 B) per element
# (torchao docs, "Quantized Training": to_fp8(input_bf16) @ ..., to_fp8(input_bf16.t()) @ ...).
FP8_ROWWISE_CAST_BYTES = 6.0
# Rowwise scaling casts inside each Float8Linear, after torchtitan's bf16 TP gather (its
# tensorwise TP plan instead casts once at the module input, PrepareFloat8ModuleInput), so every
# nn.Linear that reads an input casts it again: torchtitan's Llama builds `wq`, `wk`, `wv` as
# three Linears over the attention input and the SwiGLU `w1`, `w3` as two over the MLP input
# (torchtitan models/llama3/model.py). Each further cast cannot fuse into the producing op:
# read 2 B, write the FP8 rows 1 B and a bf16 transposed copy 2 B, then read 2 B and write the
# FP8 columns 1 B = 8 B per element (torchao testing/training/roofline_utils.py,
# get_tensor_memory_traffic_ovhd_s, "rowwise", fuse_with_prev=False).
ROWWISE_QKV_LINEARS = 3.0
FP8_ROWWISE_RECAST_BYTES = 8.0
NORM_BYTES = (4.0, 36.0)
# One compiled graph (XLA, `compiled`) fuses the element-wise ops into the matmuls beside them:
# the norm's scale into the next GEMM's operand, the residual add and RoPE into the epilogue of
# the GEMM that produces their input, the gated activation into the down projection's operand
# (XLA operation fusion: producer and consumer fusion into the dot, "kOutput" / "kLoop" fusions
# of the TPU and GPU backends). What stays in HBM is each norm's row statistics: one read of
# its bf16 input, 2 B per element, for each of the layer's two norms.
COMPILED_NORM_BYTES = 2.0
# Tensor-parallel comm-GEMM overlap splits a GEMM into chunks so that each chunk's collective
# hides behind the next chunk's math, and each chunk runs lower on the size-efficiency curve.
# Transformer Engine's userbuffers defaults (`initialize_ub`): the all-gather GEMMs (QKV and
# MLP up forward, output-projection and MLP-down data gradients) use "ring_exchange" with
# `num_splits = tp_size`; the reduce-scatter GEMMs (output projection and MLP down forward)
# use "pipeline" with `num_splits = 4`; the other backward GEMMs ("bulk") and the weight
# gradients run whole. XLA's collective matmul decomposes every overlapped GEMM into tp steps
# (Wang et al. ASPLOS'23, "Overlap communication with dependent computation via decomposition").
# PyTorch's async TP (`tp_async`, torch._micro_pipeline_tp) decomposes all four, forward and
# data gradient, into tp row blocks, one per shard of the collective it pairs with.
PIPELINE_SPLITS = 4.0
ROPE_BYTES = (4.0, 20.0)
SWIGLU_BYTES = (6.0, 10.0)
# Squared ReLU relu(x)² per intermediate element, (forward, backward) bytes. One fused kernel
# reads x and writes y like GELU: 4 B, backward twice that. NeMo's and Megatron-Bridge's
# `squared_relu` is eager `torch.pow(relu(x), 2)` (nemo/collections/llm/fn/activation.py keeps
# its `@torch.jit.script` commented out): relu (r2 w2) then pow (r2 w2), 8 B; autograd's pow
# backward `grad * (2 * self.pow(1))` copies, scales and multiplies (r2 w2, r2 w2, r4 w2) and
# relu's threshold_backward reads the gradient and the saved output (r4 w2), 20 B.
RELU2_FUSED_BYTES = (4.0, 8.0)
RELU2_EAGER_BYTES = (8.0, 20.0)


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


def attention_core_time(flops: Num, n_bytes: Num, acc: Accelerator, ceiling: Num = 1.0) -> Num:
    """Fused (flash) attention: bf16 tensor-core work at `attention` efficiency times
    `ceiling` (the kernel's instruction class, `attention_ceiling`), or HBM bound."""
    eff = acc.efficiency
    gflop = flops / 1e9
    eta = eff.attention * ceiling * gflop / (gflop + eff.matmul_half_gflop + 1e-30)
    eta = maximum(eta, 1e-6)
    return maximum(flops / (acc.peak("bf16") * 1e12 * eta), memory_time(n_bytes, acc))


def attention_ceiling(plans: PlanArrays, acc: Accelerator) -> Num:
    """Share of the fitted fused-attention efficiency a plan's kernel reaches: 1 for cuDNN
    fused attention / FlashAttention-3 (`attention = "cudnn"`, the chip's native tensor-core
    instruction, Hopper's wgmma), the accelerator's `mma_sync_fraction` for FlashAttention-2
    (`"flash"`, built on Ampere's mma.sync: 2/3 on Hopper, Shah et al. 2024 §2.2). Dimensionless."""
    return where(plans.attention == ATTENTION_CODES["cudnn"], 1.0, acc.mma_sync_fraction)


@dataclass(frozen=True)
class LayerCost:
    """Forward cost of one layer (or the logits) for one micro-batch on one GPU.

    The forward takes max(GPU work, host launch time) plus the launches serialised behind a
    host synchronisation (`synced_launch_s`); the backward does twice the GEMM, element-wise
    and launch work (or `gemm_bwd_s`, `elementwise_bwd_s`) and `attention_bwd_s` of attention.
    """

    gemm_s: Num  # linear layers
    attention_s: Num  # attention core (QKᵀ, softmax, AV)
    elementwise_s: Num  # norms, residual adds, activation function, RoPE, routing
    gemm_flops: Num
    attention_flops: Num
    launch_s: Num = 0.0  # host time to launch the forward's kernels
    attention_bwd_s: Num | None = None  # default: BWD_ATTN × attention_s (FlashAttention-2)
    elementwise_bwd_s: Num | None = None  # default: BWD_ELEMENTWISE × elementwise_s
    synced_launch_s: Num = 0.0  # launches after a host sync (dropless MoE), not hidden
    gemm_bwd_s: Num | None = None  # backward GEMMs; default BWD_GEMM × gemm_s
    down_s: Num = 0.0  # the MLP down projection(s): the layer's last GEMM
    up_s: Num = 0.0  # the MLP up projection(s): gate and up GEMMs (SwiGLU), the first (GELU)
    qkv_s: Num = 0.0  # the Q, K, V projection: the GEMM after the attention block's gather
    out_s: Num = 0.0  # the attention output projection: the GEMM before its reduce-scatter
    cast_s: Num = 0.0  # autocast casts of fp32 weights to bf16 (params_fp32)
    quant_s: Num = 0.0  # FP8 casts of the GEMMs' activation inputs, forward
    quant_bwd_s: Num = 0.0  # FP8 casts of the GEMMs' output gradients, backward
    # the matmuls torchtitan's per-op selective checkpointing re-runs in backward: the 2nd,
    # 4th and 6th of the layer (wk, wo, and SwiGLU's w3 or GELU's w2; memory.op_sac_set)
    op_sac_s: Num = 0.0
    op_sac_gathered_s: Num = 0.0  # of those, the ones reading an SP-gathered input (wk, w3)

    @property
    def gpu_forward_s(self) -> Num:
        return self.gemm_s + self.attention_s + self.elementwise_s + self.cast_s + self.quant_s

    @property
    def forward_s(self) -> Num:
        return maximum(self.gpu_forward_s, self.launch_s) + self.synced_launch_s

    @property
    def backward_s(self) -> Num:
        attn = BWD_ATTN * self.attention_s if self.attention_bwd_s is None else self.attention_bwd_s
        gemm = BWD_GEMM * self.gemm_s if self.gemm_bwd_s is None else self.gemm_bwd_s
        elem = self.elementwise_bwd_s
        if elem is None:
            elem = BWD_ELEMENTWISE * self.elementwise_s
        gpu = gemm + attn + elem + BWD_ELEMENTWISE * self.cast_s
        gpu = gpu + self.quant_bwd_s
        return maximum(gpu, KERNELS_BWD * (self.launch_s + self.synced_launch_s))


@dataclass(frozen=True)
class _Shapes:
    """Per-GPU widths and token counts of one micro-batch (arrays over plans)."""

    tokens: Num  # b·s/cp rows entering each GEMM
    norm_tokens: Num  # rows in the norm/residual region (/tp with SP)
    q_local: Num
    kv_local: Num
    fp8: Num


def local_kv_dim(model: TransformerSpec, tp: Num) -> Num:
    """Width of K (or of V) on one tensor-parallel rank: its share of the KV heads times the
    head dimension, at least one head (KV heads are replicated when tp > kv_heads, Megatron-LM
    and torchtitan). Elements."""
    return maximum(model.kv_heads / tp, 1.0) * model.dim_head


def _shapes(model: TransformerSpec, plans: PlanArrays) -> _Shapes:
    tp = as_float(plans.tp)
    tokens = plans.micro_batch * model.seq_len / as_float(plans.cp)
    norm_tokens = where(plans.sp, tokens / tp, tokens)
    kv_local = local_kv_dim(model, tp)
    return _Shapes(
        tokens=tokens,
        norm_tokens=norm_tokens,
        q_local=model.q_dim / tp,
        kv_local=kv_local,
        fp8=plans.precision == PRECISION_CODES["fp8"],
    )


@dataclass(frozen=True)
class OverlapChunks:
    """GEMM chunks under tensor-parallel comm-GEMM overlap (arrays over plans; 1 = whole):
    `ring` for the all-gather GEMMs, `pipe` for the reduce-scatter GEMMs (PIPELINE_SPLITS),
    `bwd_gather` for the data gradients of the GEMMs after a gather (QKV, MLP up), whose
    reduce-scatter TE overlaps in bulk and async TP decomposes."""

    ring: Num
    pipe: Num
    bwd_gather: Num


def overlap_chunks(plans: PlanArrays) -> OverlapChunks:
    """Chunks of the overlapped GEMMs: tp (ring exchange) and PIPELINE_SPLITS (pipelined
    reduce-scatter; tp under XLA's collective matmul) where the plan overlaps its sequence-
    parallel collectives with the GEMMs (`overlap_tp`, `sp`, tp > 1); tp for every paired
    GEMM, forward and data gradient, under async TP (`tp_async`, tp > 1); 1 elsewhere."""
    tp = as_float(plans.tp)
    on = plans.overlap_tp & plans.sp & (plans.tp > 1)
    decomposed = plans.tp_async & (plans.tp > 1)
    pipe = where(plans.compiled, tp, PIPELINE_SPLITS)
    return OverlapChunks(
        ring=where(on | decomposed, tp, 1.0),
        pipe=where(decomposed, tp, where(on, pipe, 1.0)),
        bwd_gather=where(decomposed, tp, 1.0),
    )


def chunked_gemm_time(m: Num, k: Num, n: Num, acc: Accelerator, fp8: Num, chunks: Num) -> Num:
    """A (m×k)·(k×n) GEMM run as `chunks` GEMMs of m/chunks rows each (same FLOPs, each on
    the size-efficiency curve at its own size), seconds."""
    return chunks * gemm_time(m / chunks, k, n, acc, fp8)


def _mlp_cost(
    sh: _Shapes, h: int, width: Num, n_mat: int, rows: Num, acc: Accelerator
) -> tuple[Num, Num, Num]:
    """GEMM time, FLOPs and down-projection time of a (gated) MLP of local width `width`
    applied to `rows` tokens."""
    up = gemm_time(rows, h, (n_mat - 1) * width, acc, sh.fp8)
    down = gemm_time(rows, width, h, acc, sh.fp8)
    return up + down, 2.0 * rows * h * width * n_mat, down


def launch_time(kernels: Num, plans: PlanArrays, acc: Accelerator) -> Num:
    """Host seconds to launch `kernels` kernels: kernel_launch_us each, none when the step is
    replayed from CUDA graphs or an XLA executable."""
    return where(plans.graphs, 0.0, kernels * acc.efficiency.kernel_launch_us * 1e-6)


def cast_time(weights: Num, plans: PlanArrays, acc: Accelerator) -> Num:
    """Forward seconds to cast `weights` fp32 weights to bf16 (AUTOCAST_CAST_BYTES each) where
    the plan keeps fp32 weights under autocast; none otherwise."""
    return where(plans.params_fp32, memory_time(AUTOCAST_CAST_BYTES * weights, acc), 0.0)


def fp8_cast_time(elements: Num, plans: PlanArrays, acc: Accelerator, fp8: Num) -> Num:
    """Seconds to quantize `elements` bf16 GEMM operand elements to FP8 with their transposes
    (FP8_CAST_BYTES each; FP8_ROWWISE_CAST_BYTES, one cast per GEMM axis, with rowwise scales)
    on an FP8 plan that is not one compiled graph; none otherwise."""
    per_element = where(plans.fp8_rowwise, FP8_ROWWISE_CAST_BYTES, FP8_CAST_BYTES)
    cast = where(fp8, memory_time(per_element * elements, acc), 0.0)
    return where(plans.compiled, 0.0, cast)


def attention_time(
    model: TransformerSpec, plans: PlanArrays, acc: Accelerator, sh: _Shapes
) -> tuple[Num, Num, Num]:
    """(forward s, backward s, FLOPs) of the attention core of one layer.

    Flash (Dao 2023): causal kernels skip the masked half; with ring attention (cp > 1) one
    kernel per K/V block, cp kernels of 1/cp of the work re-reading Q and the output (Liu et al.
    2023, Alg. 1); backward 2.5× (five matmuls vs two). Unfused: QKᵀ and AV as batched GEMMs
    over the full (masked) s², plus UNFUSED_SCORE_BYTES per score element through HBM forward
    and twice that backward (Korthikanti et al. 2022 §4.1).
    """
    t = sh.tokens
    cp = as_float(plans.cp)
    flops_causal = 4.0 * t * model.seq_len * sh.q_local * CAUSAL_FRACTION
    block_bytes = t * (2.0 * sh.q_local + 2.0 * sh.kv_local / cp) * ACT_BYTES
    ceiling = attention_ceiling(plans, acc)
    flash = cp * attention_core_time(flops_causal / cp, block_bytes, acc, ceiling)
    unfused_flops = 2.0 * flops_causal
    heads_local = model.n_heads / as_float(plans.tp)
    scores = t * model.seq_len * heads_local
    eff = acc.efficiency
    bmm_eta = maximum(matmul_efficiency(unfused_flops / 2.0, eff), 1e-6)
    bmm = unfused_flops / (acc.peak("bf16") * 1e12 * bmm_eta)
    traffic = memory_time(UNFUSED_SCORE_BYTES * scores, acc)
    unfused = plans.attention == ATTENTION_CODES["unfused"]
    forward = where(unfused, bmm + traffic, flash)
    backward = where(unfused, BWD_GEMM * bmm + BWD_ELEMENTWISE * traffic, BWD_ATTN * flash)
    return forward, backward, where(unfused, unfused_flops, flops_causal)


def ep_load_imbalance(tokens: Num, top_k: int, ep: Num) -> Num:
    """Tokens on the busiest of `ep` expert-parallel ranks over the mean, for uniformly
    random (ideally balanced) top-k routing of `tokens` tokens: the rank counts are
    Binomial(T·k, 1/ep), sd/mean = sqrt((ep−1)/(T·k)), and the expected maximum of ep such
    counts is ≈ mean + sqrt(2·ln ep)·sd (Gaussian extreme value). 1 when ep = 1."""
    return 1.0 + sqrt(2.0 * log(ep)) * sqrt((ep - 1.0) / (tokens * top_k))


def expert_imbalance(plans: PlanArrays, tokens: Num, top_k: int) -> Num:
    """Busiest expert-parallel rank over the mean: the plan's stated `ep_imbalance`, else the
    statistical imbalance of uniform routing (`ep_load_imbalance`)."""
    stated = plans.ep_imbalance
    return where(stated > 0, stated, ep_load_imbalance(tokens, top_k, as_float(plans.ep)))


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
    k_proj = gemm_time(t, h, sh.kv_local, acc, sh.fp8)
    gemm_s = qkv + out
    # Comm-GEMM overlap (OverlapChunks): forward QKV in ring chunks, output projection in
    # pipeline chunks; backward the output projection's data gradient in ring chunks.
    ch = overlap_chunks(plans)
    fwd_extra = chunked_gemm_time(t, h, sh.q_local + 2.0 * sh.kv_local, acc, sh.fp8, ch.ring)
    fwd_extra = fwd_extra + chunked_gemm_time(t, sh.q_local, h, acc, sh.fp8, ch.pipe) - gemm_s
    bwd_extra = chunked_gemm_time(t, sh.q_local, h, acc, sh.fp8, ch.ring) - out
    qkv_chunked = chunked_gemm_time(
        t, h, sh.q_local + 2.0 * sh.kv_local, acc, sh.fp8, ch.bwd_gather
    )
    bwd_extra = bwd_extra + qkv_chunked - qkv
    gemm_flops = 2.0 * t * h * (2.0 * sh.q_local + 2.0 * sh.kv_local)
    weights = h * (2.0 * sh.q_local + 2.0 * sh.kv_local)  # the GEMMs' weights on this GPU
    attention_s, attention_bwd_s, attn_flops = attention_time(model, plans, acc, sh)

    n_mat = model.mlp_matrices
    fused = plans.fused_elementwise

    def per_element(pair: tuple[float, float]) -> Num:
        return where(fused, pair[0], pair[1])

    # bytes per intermediate element, forward: SwiGLU (SWIGLU_BYTES), GELU read F and write F,
    # squared ReLU (RELU2_FUSED_BYTES, RELU2_EAGER_BYTES); the backward moves BWD_ELEMENTWISE
    # times that, and eager squared ReLU `act_bwd_extra` more
    act_bwd_extra: Num = 0.0
    if model.mlp == "swiglu":
        act_bytes_per_width = per_element(SWIGLU_BYTES)
    elif model.mlp == "relu2":
        eager = plans.eager_squared_relu | logical_not(fused)
        act_bytes_per_width = where(eager, RELU2_EAGER_BYTES[0], RELU2_FUSED_BYTES[0])
        act_bwd = where(eager, RELU2_EAGER_BYTES[1], RELU2_FUSED_BYTES[1])
        act_bwd_extra = act_bwd - BWD_ELEMENTWISE * act_bytes_per_width
    else:
        act_bytes_per_width = 4.0
    # Two norms and two residual adds (2 reads + 1 write, 6 B) over h, then RoPE on q and k.
    elem_bytes = (2.0 * per_element(NORM_BYTES) + 12.0) * sh.norm_tokens * h
    residual_fp32 = where(plans.params_fp32, FP32_RESIDUAL_BYTES, 0.0)
    elem_bytes = elem_bytes + residual_fp32 * sh.norm_tokens * h
    elem_bytes = elem_bytes + per_element(ROPE_BYTES) * t * (sh.q_local + sh.kv_local)
    routing_bytes: Num = 0.0
    synced: Num = 0.0
    if moe and model.moe is not None:
        spec = model.moe
        width = model.expert_ffn / tp
        ep = as_float(plans.ep)
        # Each local expert's grouped-GEMM slice sees T·k·ep/E rows, so small experts run low
        # on the size-dependent curve; the busiest EP rank sets the pace.
        rows_per_expert = t * spec.top_k * ep / spec.experts
        expert_s, _, expert_down = _mlp_cost(sh, h, width, n_mat, rows_per_expert, acc)
        local_experts = spec.experts / ep
        busiest = local_experts * expert_imbalance(plans, t, spec.top_k)
        routed_s = expert_s * busiest
        down_s = expert_down * busiest
        routed_flops = 2.0 * t * spec.top_k * h * width * n_mat
        router_s = gemm_time(t, h, spec.experts, acc, False)
        gemm_s = gemm_s + routed_s + router_s
        gemm_flops = gemm_flops + routed_flops + 2.0 * t * h * spec.experts
        weights = weights + (local_experts + spec.shared_experts) * n_mat * h * width
        weights = weights + h * spec.experts
        if spec.shared_experts:
            shared_s, shared_flops, shared_down = _mlp_cost(
                sh, h, width * spec.shared_experts, n_mat, t, acc
            )
            gemm_s = gemm_s + shared_s
            down_s = down_s + shared_down
            gemm_flops = gemm_flops + shared_flops
        up_s = routed_s + (shared_s if spec.shared_experts else 0.0) - down_s
        sac_mm = 0.5 * up_s if n_mat == 3 else down_s
        active_width = width * (spec.top_k + spec.shared_experts)
        mlp_rows = t * (spec.top_k + spec.shared_experts)
        # Router softmax + top-k over fp32 logits (write, read, write T·E·4 B); token permute
        # (read T·h, write T·k·h) and unpermute (read T·k·h, write T·h), bf16 (Megatron-Core
        # moe_utils.permute/unpermute).
        routing_bytes = 12.0 * t * spec.experts + 4.0 * t * h * (1.0 + spec.top_k)
        per_expert = KERNELS_PER_EXPERT + where(sh.fp8, FP8_CASTS_PER_EXPERT, 0.0)
        synced = launch_time(MOE_SYNCED_KERNELS + per_expert * local_experts, plans, acc)
    else:
        width = model.dense_ffn / tp
        mlp_whole, mlp_flops, down_whole = _mlp_cost(sh, h, width, n_mat, t, acc)
        gemm_s = gemm_s + mlp_whole
        # Comm-GEMM overlap: MLP up forward in ring chunks, down in pipeline chunks; backward
        # the down projection's data gradient in ring chunks.
        down_s = chunked_gemm_time(t, width, h, acc, sh.fp8, ch.pipe)
        mlp_s = chunked_gemm_time(t, h, (n_mat - 1) * width, acc, sh.fp8, ch.ring) + down_s
        fwd_extra = fwd_extra + mlp_s - mlp_whole
        bwd_extra = bwd_extra + chunked_gemm_time(t, width, h, acc, sh.fp8, ch.ring) - down_whole
        up_whole = mlp_whole - down_whole
        up_chunked = chunked_gemm_time(t, h, (n_mat - 1) * width, acc, sh.fp8, ch.bwd_gather)
        bwd_extra = bwd_extra + up_chunked - up_whole
        up_s = mlp_s - down_s
        sac_mm = gemm_time(t, h, width, acc, sh.fp8) if n_mat == 3 else down_whole
        gemm_flops = gemm_flops + mlp_flops
        weights = weights + n_mat * h * width
        active_width = width
        mlp_rows = t
    elem_bytes = elem_bytes + act_bytes_per_width * t * active_width
    # Compiled: only the two norms' statistics passes stay (COMPILED_NORM_BYTES); routing
    # (gathers and scatters of whole token rows) is not fused into a matmul either way.
    compiled_bytes = 2.0 * COMPILED_NORM_BYTES * sh.norm_tokens * h
    elem_bytes = where(plans.compiled, compiled_bytes, elem_bytes) + routing_bytes
    act_bwd_bytes = where(plans.compiled, 0.0, act_bwd_extra * t * active_width)
    elem_bwd_bytes = BWD_ELEMENTWISE * elem_bytes + act_bwd_bytes
    # FP8 operands: forward the inputs of QKV, output projection, MLP up and down; backward
    # the output gradients of the same four GEMMs.
    quant_fwd = t * (h + sh.q_local) + mlp_rows * h + t * active_width
    quant_bwd = t * (sh.q_local + 2.0 * sh.kv_local + h) + (n_mat - 1) * t * active_width
    quant_bwd = quant_bwd + mlp_rows * h
    # Rowwise: the further Linears over the same input cast it again (ROWWISE_QKV_LINEARS; the
    # dense MLP's n_mat − 1 up projections), FP8_ROWWISE_RECAST_BYTES per element.
    up_linears = 0.0 if moe and model.moe is not None else n_mat - 1.0
    recast = (ROWWISE_QKV_LINEARS - 1.0 + max(up_linears - 1.0, 0.0)) * t * h
    recast_on = sh.fp8 & plans.fp8_rowwise & logical_not(plans.compiled)
    recast_s = where(recast_on, memory_time(FP8_ROWWISE_RECAST_BYTES * recast, acc), 0.0)
    return LayerCost(
        gemm_s=gemm_s + fwd_extra,
        gemm_bwd_s=BWD_GEMM * gemm_s + bwd_extra,
        attention_s=attention_s,
        elementwise_s=memory_time(elem_bytes, acc),
        elementwise_bwd_s=memory_time(elem_bwd_bytes, acc),
        gemm_flops=gemm_flops,
        attention_flops=attn_flops,
        launch_s=launch_time(KERNELS_PER_LAYER, plans, acc),
        attention_bwd_s=attention_bwd_s,
        synced_launch_s=synced,
        down_s=down_s,
        up_s=up_s,
        qkv_s=qkv,
        out_s=out,
        cast_s=cast_time(weights, plans, acc),
        quant_s=fp8_cast_time(quant_fwd, plans, acc, sh.fp8) + recast_s,
        quant_bwd_s=fp8_cast_time(quant_bwd, plans, acc, sh.fp8),
        op_sac_s=k_proj + out + sac_mm,
        op_sac_gathered_s=k_proj + (sac_mm if n_mat == 3 else 0.0),
    )


def logits_forward(model: TransformerSpec, plans: PlanArrays, acc: Accelerator) -> LayerCost:
    """Output head (T×h)·(h×V/tp) and the softmax cross-entropy: unfused reads the bf16
    logits and writes an fp32 softmax (6 B per logit), fused reads them and writes the
    gradient in place (4 B)."""
    sh = _shapes(model, plans)
    v_local = model.vocab / as_float(plans.tp)
    gemm_s = gemm_time(sh.tokens, model.hidden, v_local, acc, sh.fp8)
    ce_bytes = sh.tokens * v_local * (ACT_BYTES + where(plans.fused_ce, ACT_BYTES, 4.0))
    zero = 0.0 * gemm_s
    return LayerCost(
        gemm_s=gemm_s,
        attention_s=zero,
        elementwise_s=memory_time(ce_bytes, acc),
        gemm_flops=2.0 * sh.tokens * model.hidden * v_local,
        attention_flops=zero,
        launch_s=launch_time(HEAD_KERNELS, plans, acc),
        cast_s=cast_time(model.hidden * v_local, plans, acc),
    )


def embedding_forward(model: TransformerSpec, plans: PlanArrays, acc: Accelerator) -> LayerCost:
    """Input embedding lookup: read and write T·h bf16 (backward scatter-adds twice that)."""
    sh = _shapes(model, plans)
    zero = 0.0 * sh.tokens
    return LayerCost(
        gemm_s=zero,
        attention_s=zero,
        elementwise_s=memory_time(2.0 * sh.tokens * model.hidden * ACT_BYTES, acc),
        gemm_flops=zero,
        attention_flops=zero,
        launch_s=launch_time(1.0, plans, acc),
    )


def model_flops_per_token(model: TransformerSpec, causal: bool = True) -> float:
    """Training model FLOPs per token: 3·(2·N_active_matmul + 2·h·V + 4·L·s·q·[½ if causal]).

    Kaplan et al. 2020 Table 1 with backward = 2× forward; `causal=False` is Megatron's count,
    which equals 72·B·s·L·h²·(1 + s/6h + V/12Lh) per step for GPT-style models
    (Narayanan et al. SC'21, Eq. 3 without recompute).
    """
    return model.training_flops_per_token(causal=causal)


def qkv_flops_per_token(model: TransformerSpec) -> float:
    """Forward FLOPs per token of the projections to Q, K, V over all layers, 2 per weight:
    with MLA the up-projections from the latents, 2·(q_lora·n·(nope + rope) + kv_lora·n·(nope
    + v)) (DeepSeek-V2 Eqs. 12, 13, 16), else the QKV GEMM 2·h·(q + 2·kv)."""
    if model.mla is not None:
        per_layer = model.mla.up_params(model.n_heads, model.hidden)
    else:
        per_layer = model.hidden * (model.q_dim + 2 * model.kv_dim)
    return 2.0 * model.n_layers * per_layer


def recompute_share(plans: PlanArrays) -> Num:
    """Share of the layers full recompute re-runs: 1/N with `recompute_every = N` (torchtitan
    checkpoints every N-th TransformerBlock), else 1."""
    every = as_float(plans.recompute_every)
    return where(every > 0, 1.0 / maximum(every, 1.0), 1.0)


def mlp_up_flops_per_token(model: TransformerSpec) -> float:
    """Forward FLOPs per token of the MLP up projections over all layers, 2 per weight: the
    gate and up matrices of SwiGLU (the first matrix of GELU), dense width on dense layers,
    the top-k routed and the shared experts' on MoE layers."""
    up = (model.mlp_matrices - 1) * model.hidden
    dense = (model.n_layers - model.n_moe_layers) * up * model.dense_ffn
    moe = 0.0
    if model.moe is not None:
        active = model.moe.top_k + model.moe.shared_experts
        moe = model.n_moe_layers * up * model.expert_ffn * active
    return 2.0 * (dense + moe)


def recompute_flops_per_token(
    model: TransformerSpec,
    recompute: Num,
    recompute_qkv: Num = False,
    recompute_mlp_up: Num = False,
) -> Num:
    """Extra forward FLOPs per token re-run in backward: all layers (full) or attention
    (selective), plus the Q, K, V projections when `recompute_qkv` and the MLP up projections
    when `recompute_mlp_up` (full already has both)."""
    layers = model.matmul_flops_per_token() - 2.0 * model.vocab * model.hidden
    attention = model.attention_flops_per_token(causal=True)
    projections = where(recompute_qkv, qkv_flops_per_token(model), 0.0) + where(
        recompute_mlp_up, mlp_up_flops_per_token(model), 0.0
    )
    selective = where(recompute == RECOMPUTE_CODES["selective"], attention, 0.0) + projections
    return where(recompute == RECOMPUTE_CODES["full"], layers + attention, selective)


def qkv_recompute_time(model: TransformerSpec, plans: PlanArrays, acc: Accelerator) -> Num:
    """Seconds per micro-batch of re-running one layer's Q, K, V projections in backward
    (`recompute_qkv`): the MLA up-projection GEMMs from the latents (heads split over tp), or
    the QKV GEMM."""
    sh = _shapes(model, plans)
    tp = as_float(plans.tp)
    mla = model.mla
    if mla is None:
        return gemm_time(sh.tokens, model.hidden, sh.q_local + 2.0 * sh.kv_local, acc, sh.fp8)
    n = model.n_heads / tp
    kv_width = n * (mla.qk_nope_head_dim + mla.v_head_dim)
    q_width = n * (mla.qk_nope_head_dim + mla.qk_rope_head_dim)
    kv = gemm_time(sh.tokens, mla.kv_lora_rank, kv_width, acc, sh.fp8)
    return kv + gemm_time(sh.tokens, mla.q_input(model.hidden), q_width, acc, sh.fp8)


def optimizer_time(
    params_owned: Num, acc: Accelerator, remainder: Num = False, per_param: Num | None = None
) -> Num:
    """Adam step over the parameters this GPU owns: memory-bound, 28 B/param (C.2); 24 when
    the master weights are 16-bit remainders (read and write 2 B less each); `per_param`
    (memory.optimizer_step_bytes) for other optimizers and master settings."""
    if per_param is None:
        per_param = ADAM_BYTES_PER_PARAM - where(remainder, 4.0, 0.0)
    return memory_time(params_owned * per_param, acc)


@dataclass(frozen=True)
class UnitCosts:
    """Per-micro-batch seconds of the units a pipeline stage is built from: one decoder layer
    (the dense/MoE mix of the model), the output head with its loss, the input embedding."""

    layer_forward_s: Num
    layer_backward_s: Num
    layer_recompute_s: Num
    layer_gemm_s: Num  # the layer's GEMMs
    # the GEMM each overlapped TP collective is decomposed with: the attention gather's (QKV),
    # the attention reduce-scatter's (output projection), the MLP gather's (up), the MLP
    # reduce-scatter's (down)
    layer_qkv_s: Num
    layer_out_s: Num
    layer_up_s: Num
    layer_down_s: Num
    layer_attention_s: Num  # window for the ring-attention (CP) exchange
    # the per-op SAC re-run matmuls whose inputs are re-gathered under SP (wk, w3)
    layer_sac_gathered_s: Num
    head_forward_s: Num
    head_backward_s: Num
    embed_forward_s: Num
    embed_backward_s: Num

    @property
    def layer_s(self) -> Num:
        return self.layer_forward_s + self.layer_backward_s + self.layer_recompute_s

    @property
    def head_s(self) -> Num:
        return self.head_forward_s + self.head_backward_s

    @property
    def embed_s(self) -> Num:
        return self.embed_forward_s + self.embed_backward_s


def unit_costs(model: TransformerSpec, plans: PlanArrays, acc: Accelerator) -> UnitCosts:
    """Forward, backward and recompute of one layer, the head and the embedding.

    Full recompute re-runs the layer forward (without its MLP down projection when the step is
    compiled); selective re-runs the element-wise ops and the attention core (Korthikanti et
    al. 2022 §5), or under torchtitan's per-op policy every second matmul instead of the
    attention core."""
    moe_share = model.n_moe_layers / model.n_layers
    costs = [(1.0 - moe_share, layer_forward(model, plans, acc, moe=False))]
    if moe_share > 0:
        costs.append((moe_share, layer_forward(model, plans, acc, moe=True)))

    def mix(attr: str) -> Num:
        return sum(w * getattr(c, attr) for w, c in costs)

    layer_fwd = mix("forward_s")
    code = plans.recompute
    # torchtitan's per-op policy keeps SDPA's output and re-runs every second matmul instead
    # (LayerCost.op_sac_s); Megatron's re-runs the attention core.
    rerun_gpu = where(plans.op_sac, mix("op_sac_s"), mix("attention_s"))
    selective = where(
        code == RECOMPUTE_CODES["selective"], rerun_gpu + mix("elementwise_s"), 0.0
    ) + where(plans.recompute_qkv, qkv_recompute_time(model, plans, acc), 0.0)
    selective = selective + where(plans.recompute_mlp_up, mix("up_s"), 0.0)
    # A compiled step (XLA, torch.compile) recomputes only what the backward needs: the layer's
    # last GEMM (MLP down projection) feeds just the residual stream and is dead code there.
    full = layer_fwd - where(plans.compiled, mix("down_s"), 0.0)
    head = logits_forward(model, plans, acc)
    embed = embedding_forward(model, plans, acc)
    return UnitCosts(
        layer_forward_s=layer_fwd,
        layer_backward_s=mix("backward_s"),
        layer_recompute_s=where(
            code == RECOMPUTE_CODES["full"], full * recompute_share(plans), selective
        ),
        layer_gemm_s=mix("gemm_s"),
        layer_qkv_s=mix("qkv_s"),
        layer_out_s=mix("out_s"),
        layer_up_s=mix("up_s"),
        layer_down_s=mix("down_s"),
        layer_attention_s=mix("attention_s"),
        layer_sac_gathered_s=mix("op_sac_gathered_s"),
        head_forward_s=head.forward_s,
        head_backward_s=head.backward_s,
        embed_forward_s=embed.forward_s,
        embed_backward_s=embed.backward_s,
    )


@dataclass(frozen=True)
class StageLayers:
    """Decoder layers (all v chunks) on the first stage, the fullest middle stage and the
    last stage. With pp = 1 all three are the one stage."""

    first: Num
    mid: Num
    last: Num


def stage_layers(model: TransformerSpec, plans: PlanArrays) -> StageLayers:
    """Stated first/middle/last counts, the rest split evenly: each unstated stage holds v
    chunks of ceil(rest/(stages·v)) layers (a split that does not divide rounds up; Megatron-Core
    decoder_first/last_pipeline_num_layers)."""
    first_set, last_set = plans.pp_first >= 0, plans.pp_last >= 0
    first_n, last_n = maximum(plans.pp_first, 0), maximum(plans.pp_last, 0)
    v = as_float(plans.vpp)
    stages = as_float(plans.pp) - as_float(first_set) - as_float(last_set)
    rest = model.n_layers - as_float(first_n * first_set + last_n * last_set)
    even = ceil(rest / maximum(stages * v, 1.0)) * v
    return StageLayers(
        first=where(first_set, as_float(first_n), even),
        mid=where(plans.pp_mid >= 0, as_float(plans.pp_mid), even),
        last=where(last_set, as_float(last_n), even),
    )


@dataclass(frozen=True)
class PipelineTimes:
    """Per-micro-batch seconds of each stage kind and what the schedule makes of them."""

    first_s: Num
    mid_s: Num  # 0 where there is no middle stage (pp ≤ 2)
    last_s: Num
    total_s: Num  # sum over all pp stages

    @property
    def critical_s(self) -> Num:
        """The slowest stage: it sets the steady-state pace."""
        return maximum(maximum(self.first_s, self.mid_s), self.last_s)

    def bubble_s(self, v: Num) -> Num:
        """Fill and drain: (Σ_s t_s − max_s t_s)/v (Sailor/Metis uneven-stage form; equals
        (p−1)/v of a stage for even stages, Narayanan et al. SC'21 §2.2)."""
        return (self.total_s - self.critical_s) / as_float(v)


def pipeline_times(
    model: TransformerSpec, plans: PlanArrays, layers: StageLayers, layer_s: Num, head_s: Num,
    embed_s: Num, stage_s: Num = 0.0,
) -> PipelineTimes:  # fmt: skip
    """Stage times from a per-layer time, the head and embedding times and a per-stage
    constant: the first stage holds the embedding, the last the head (both on the one stage
    when pp = 1)."""
    single = plans.pp == 1
    first = layers.first * layer_s + embed_s + where(single, head_s, 0.0) + stage_s
    last = where(single, first, layers.last * layer_s + head_s + stage_s)
    mid = where(plans.pp > 2, layers.mid * layer_s + stage_s, 0.0)
    total = model.n_layers * layer_s + head_s + embed_s + as_float(plans.pp) * stage_s
    return PipelineTimes(first_s=first, mid_s=mid, last_s=last, total_s=total)


def critical_layers(layers: StageLayers, times: PipelineTimes) -> Num:
    """Layers on the stage kind the schedule waits on (the slowest)."""
    critical = times.critical_s
    return where(
        times.first_s >= critical,
        layers.first,
        where(times.mid_s >= critical, layers.mid, layers.last),
    )


def compute_lower_bound(model: TransformerSpec, plans: PlanArrays, acc: Accelerator) -> Num:
    """m·max_s(c_s) + (Σ_s c_s − max_s c_s)/v of the compute alone: every step spends it;
    communication, the optimizer and overlap interference only add to it (C.6, C.7)."""
    units = unit_costs(model, plans, acc)
    times = pipeline_times(
        model, plans, stage_layers(model, plans), units.layer_s, units.head_s, units.embed_s
    )
    m = as_float(plans.micro_batches)
    return m * times.critical_s + times.bubble_s(plans.vpp)
