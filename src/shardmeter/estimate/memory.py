"""Per-GPU memory: model states under ZeRO/FSDP sharding, activations, buffers, overhead.

Model states follow the ZeRO paper (Rajbhandari et al. SC'20, §3.1 and Fig. 1): mixed-precision
Adam keeps 2 (bf16 weights) + 2 (bf16 grads) + 12 (fp32 master, m, v) bytes per parameter;
stage 1 shards the 12, stage 2 also the grads, stage 3 also the weights. Activations follow
Korthikanti et al. 2022 (Table 2), recounted for flash attention without dropout. Every
pipeline stage kind (first, fullest middle, last) is counted with its own layers, tables and
in-flight micro-batches; the fullest decides. Other optimizers, master-weight settings and
offload change the 12 (`optimizer_state_bytes`, each byte count cited there). Three answers:
allocated (the tensors), reserved (+ the caching allocator's rounding, `fragmentation_bytes`)
and the device total that decides an OOM (+ CUDA context and NCCL buffers,
`nccl_buffer_bytes`). Bytes.
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np

from shardmeter.estimate._xp import (
    Num,
    as_float,
    ceil,
    floor,
    full_like,
    logical_not,
    maximum,
    minimum,
    where,
)
from shardmeter.estimate.compute import (
    ACT_BYTES,
    StageLayers,
    local_kv_dim,
    recompute_share,
    stage_layers,
)
from shardmeter.estimate.plan_arrays import (
    ATTENTION_CODES,
    MASTER_CODES,
    OFFLOAD_CODES,
    OPTIMIZER_CODES,
    PRECISION_CODES,
    RECOMPUTE_CODES,
    SHARDING_CODES,
    PlanArrays,
)
from shardmeter.specs.hardware import Accelerator, Cluster
from shardmeter.specs.model import TransformerSpec

MIB = 2.0**20
WEIGHT_BYTES = 2.0  # bf16 weights
GRAD_BYTES = 2.0  # bf16 gradients
# fp32 gradient buffer: Megatron-LM arguments.py "bfloat16 requires gradient accumulation and
# all-reduce to be done in fp32" (accumulate_allreduce_grads_in_fp32, the main_grad buffer
# of megatron/core/distributed/param_and_grad_buffer.py in torch.float); bytes per parameter
FP32_GRAD_BYTES = 4.0
OPTIMIZER_BYTES = 12.0  # fp32 master copy + Adam m and v (ZeRO paper's K = 12)
UNSHARDED_GRAD_BYTES = 4.0  # unsharded gradient kept in the fp32 reduce dtype (FSDP2 accumulation)
REMAINDER_SAVING = 2.0  # a 16-bit remainder over the bf16 weights replaces the fp32 master
# per logit, the loss run op by op without a separate fp32 upcast: the logits GEMM output is
# saved by nothing and freed before backward, so what is live at the loss backward is the saved
# log-softmax (PyTorch F.cross_entropy on bf16 logits: derivatives.yaml `_log_softmax: result`,
# 2 B), the NLL gradient (2 B) and the log-softmax gradient (2 B); Megatron's vocab-parallel
# loss on an fp32 copy (pretrain_gpt.py `output.float()`) softmaxes that copy in place and
# saves it (4 B), then writes the gradient into it and casts it back (2 B): 6 either way
LOGITS_BYTES = 6.0
FUSED_LOGITS_BYTES = 2.0  # fused cross-entropy writes the gradient over the bf16 logits
# F.cross_entropy(pred.float()) run eagerly (torchtitan 2024): aten log_softmax saves its fp32
# output (derivatives.yaml `_log_softmax: result`), nll_loss_backward allocates a zero fp32
# gradient of the input's shape and _log_softmax_backward_data a third fp32 tensor: 4 + 4 + 4
# live at the loss backward (the bf16 logits are deleted before backward, torchtitan train.py
# `del pred`)
EAGER_FP32_LOGITS_BYTES = 12.0
# The same eager fp32 loss on vocabulary-sharded logits (tp > 1: torchtitan's loss_parallel,
# on whenever TP is, `disable_loss_parallel = false`): DTensor's loss_parallel
# (torch/distributed/tensor/parallel/loss.py) runs its own backward,
# `(grad_input + torch.exp(x)) * grad_output` with grad_input = zeros_like(x), so the saved
# fp32 log-softmax x, grad_input, exp(x) and their sum are live at once: 4 + 4 + 4 + 4
LOSS_PARALLEL_LOGITS_BYTES = 16.0
# Its reserved extra: the freed 2-B bf16 logits block is smaller than the 4-B fp32 requests
# that follow, so the caching allocator opens a new segment rather than reuse it
# (CUDACachingAllocator.cpp: a request takes a cached block only if one is at least its size;
# blocks of different segments never merge)
EAGER_FP32_CACHED_BYTES = 2.0
# The same loss compiled (torchtitan 2025, training.compile): inductor fuses the upcast,
# log-softmax and NLL, keeps the bf16 logits and a per-row LSE, and writes a bf16 gradient:
# 2 + 2 B per logit
COMPILED_LOGITS_BYTES = 4.0
# per element and norm, eager RMSNorm (the Python module upcasts): fp32 input copy 4 + bf16
# normalized 2 − bf16 input 2; eager nn.LayerNorm runs one native kernel that saves its bf16
# input and two fp32 per-row statistics (derivatives.yaml `native_layer_norm`), as fused: 0
EAGER_NORM_EXTRA = 4.0
EAGER_SWIGLU_EXTRA = 2.0  # per F element: the silu output kept by the eager multiply
UNFUSED_SCORE_STORED = (
    5.0  # per score element: softmax out 2 + dropout mask 1 + out 2 (Korthikanti §4.1)
)


def gathered_weight_bytes(plans: PlanArrays) -> Num:
    """Bytes per weight a ZeRO-3 all-gather moves and its buffer holds: bf16, or fp32 where
    the plan keeps fp32 weights under autocast (FSDP param_dtype=float32 gathers them as is)."""
    return where(plans.params_fp32, 4.0, WEIGHT_BYTES)


@dataclass(frozen=True)
class ModelStates:
    """Bytes per GPU of weights, gradients and optimizer states."""

    weights: Num
    gradients: Num
    optimizer: Num

    @property
    def total(self) -> Num:
        return self.weights + self.gradients + self.optimizer


def optimizer_step_bytes(plans: PlanArrays) -> Num:
    """HBM bytes the optimizer step moves per owned parameter: it reads the master copy (or,
    without one, the bf16 weight), the optimizer states on the allocator and the bf16
    gradient, and writes back the master, the states and the bf16 weight. AdamW with an fp32
    master: 14 + 14 = 28 (ADAM_BYTES_PER_PARAM, C.2); 16-bit remainder 24; pure bf16 AdamW
    14; pure bf16 8-bit AdamW 10. Paged states are read and written in unified memory and
    counted the same. Bytes."""
    on_gpu, paged = optimizer_state_bytes(plans)
    master = master_bytes(plans)
    states = on_gpu - master + paged
    no_master = where(plans.master == MASTER_CODES["none"], WEIGHT_BYTES, 0.0)
    read = master + states + GRAD_BYTES + no_master
    write = master + states + WEIGHT_BYTES
    return read + write


def model_state_bytes(
    params: Num, shard: Num, stage: Num, remainder: Num = False, state_bytes: Num | None = None,
    host_states: Num = False, host_params: Num = False, grad_bytes: Num = GRAD_BYTES,
) -> ModelStates:  # fmt: skip
    """ZeRO table (C.3): stage 0 16N; 1: 4N + 12N/d; 2: 2N + 14N/d; 3: 16N/d.

    `params` are the parameters this GPU holds before sharding (already /(tp·pp)), `shard`
    the sharding group d (the HSDP shard group), `stage` 0..3; `remainder`: the optimizer keeps
    a 16-bit remainder of the master weights, 10 bytes instead of 12; `state_bytes` (default
    12, or 10 with `remainder`): optimizer bytes per parameter (`optimizer_state_bytes`);
    `host_states` / `host_params`: offloaded to host memory, so 0 on the GPU; `grad_bytes`:
    bytes per gradient (GRAD_BYTES, or FP32_GRAD_BYTES with an fp32 accumulation buffer).
    """
    d = where(stage >= 1, as_float(shard), 1.0)
    if state_bytes is None:
        state_bytes = OPTIMIZER_BYTES - where(remainder, REMAINDER_SAVING, 0.0)
    on_gpu = 1.0 - as_float(host_params)
    return ModelStates(
        weights=on_gpu * WEIGHT_BYTES * params / where(stage >= 3, d, 1.0),
        gradients=on_gpu * grad_bytes * params / where(stage >= 2, d, 1.0),
        optimizer=where(host_states, 0.0, state_bytes) * params / d,
    )


# Optimizer state bytes per parameter, besides the master copy. m and v (Adam) or the momentum
# (SGD, Muon) take the master's dtype: fp32 with a master copy, else the weights' bf16
# (torch.optim.AdamW creates its states with torch.zeros_like(param)).
ADAM_8BIT_STATE = 1.0 + 4.0 / 2048.0  # bitsandbytes blockwise 8-bit: 1 B + fp32 absmax per 2048
ADAM_4BIT_STATE = 0.5 + 4.0 / 128.0  # torchao 4-bit AdamW: 4 bits + one scale per block of 128
MASTER_BYTES = {"fp32": 4.0, "remainder": 2.0, "none": 0.0}  # remainder: 16-bit (apex/TE)


def master_bytes(plans: PlanArrays) -> Num:
    """Bytes per parameter of the master copy: MASTER_BYTES of fp32, a 16-bit remainder
    (apex/TE) or none."""
    return where(
        plans.master == MASTER_CODES["fp32"], MASTER_BYTES["fp32"],
        where(plans.master == MASTER_CODES["remainder"], MASTER_BYTES["remainder"], 0.0),
    )  # fmt: skip


def state_dtype_bytes(plans: PlanArrays) -> Num:
    """Bytes per element of a full-precision optimizer state: fp32 beside a master copy, the
    weights' bf16 without one (pure bf16: torchtune's and litgpt's full fine-tunes)."""
    return where(plans.master == MASTER_CODES["none"], WEIGHT_BYTES, 4.0)


def optimizer_state_bytes(plans: PlanArrays) -> tuple[Num, Num]:
    """(on-allocator, paged) optimizer bytes per parameter: the master copy (MASTER_BYTES) plus
    the states; paged optimizers (bitsandbytes `PagedAdamW*`) keep their states in CUDA
    unified memory, outside PyTorch's allocator, paged to the host under pressure.

    AdamW 2 states (Loshchilov & Hutter 2019); 8-bit 2 × ADAM_8BIT_STATE (Dettmers et al.
    2022, blockwise quantization, block 2048); 4-bit 2 × ADAM_4BIT_STATE (torchao
    `AdamW4bit`, block 128; Li et al. 2023); Adafactor 0 (factored second moment, O(rows +
    cols) per matrix, no first moment: Shazeer & Stern 2018 §3-4); SGD with momentum and Muon
    one state (Muon keeps only the momentum buffer: Jordan et al. 2024). Bytes.
    """
    master = master_bytes(plans)
    state_dtype = state_dtype_bytes(plans)
    code = plans.optimizer
    codes = OPTIMIZER_CODES
    adam = (code == codes["adamw"]) | (code == codes["paged_adamw"])
    eight = (code == codes["adamw8bit"]) | (code == codes["paged_adamw8bit"])
    one_state = (code == codes["sgd"]) | (code == codes["muon"])
    states = where(
        adam, 2.0 * state_dtype,
        where(eight, 2.0 * ADAM_8BIT_STATE,
              where(code == codes["adamw4bit"], 2.0 * ADAM_4BIT_STATE,
                    where(one_state, state_dtype, 0.0))),
    )  # fmt: skip
    paged = (code == codes["paged_adamw"]) | (code == codes["paged_adamw8bit"])
    return master + where(paged, 0.0, states), where(paged, states, 0.0)


def korthikanti_activation_bytes(
    s: float, b: float, h: float, a: float, t: float = 1, sp: bool = False, recompute: str = "none"
) -> float:
    """Activation bytes per layer per micro-batch of a GPT layer, Korthikanti et al. 2022 Table 2.

    None: sbh(10 + 24/t + 5as/(ht)); SP: sbh(34 + 5as/h)/t; selective: sbh(10 + 24/t), with SP
    34sbh/t; full recompute: 2sbh (/t with SP). fp16 activations with dropout, no flash.
    """
    sbh = s * b * h
    if recompute == "full":
        return 2.0 * sbh / (t if sp else 1.0)
    attn_scores = 0.0 if recompute == "selective" else 5.0 * a * s / h
    if sp:
        return sbh * (34.0 + attn_scores) / t
    return sbh * (10.0 + 24.0 / t + attn_scores / t)


@dataclass(frozen=True)
class LocalParams:
    """Parameters held by one GPU on one stage, before ZeRO/FSDP sharding."""

    dense: Num  # attention, dense MLPs, shared experts, routers, embeddings
    expert: Num  # routed experts (split over ep as well)
    layer: Num  # one layer's parameters (the FSDP unit)

    @property
    def total(self) -> Num:
        return self.dense + self.expert


def per_layer_params(model: TransformerSpec, plans: PlanArrays) -> tuple[Num, Num]:
    """(dense, routed-expert) parameters of one average layer on one GPU: /tp, experts /ep."""
    tp = as_float(plans.tp)
    moe_share = model.n_moe_layers / model.n_layers
    attn = model.attn_params_per_layer / tp
    dense_mlp = model.mlp_matrices * model.hidden * model.dense_ffn / tp
    per_layer_dense = attn + (1.0 - moe_share) * dense_mlp
    per_layer_expert = 0.0 * tp
    if model.moe is not None:
        spec = model.moe
        expert = model.expert_params / tp
        per_layer_dense = per_layer_dense + moe_share * (
            spec.shared_experts * expert + model.hidden * spec.experts
        )
        per_layer_expert = moe_share * expert * spec.experts / as_float(plans.ep)
    return per_layer_dense, per_layer_expert


def end_stage_tables(model: TransformerSpec, plans: PlanArrays) -> Num:
    """Embedding-sized (V·h/tp) tables on the first and on the last stage: the input embedding
    on the first, the output head on the last; the one stage holds both (one if tied) when
    pp = 1."""
    return where(plans.pp == 1, 1.0 if model.tied_embeddings else 2.0, 1.0)


def local_params(
    model: TransformerSpec,
    plans: PlanArrays,
    layers: Num | None = None,
    tables: Num | None = None,
    per_layer: tuple[Num, Num] | None = None,
) -> LocalParams:
    """Per-GPU parameters of a stage of `layers` layers and `tables` embedding tables
    (default: the stage holding the most: the fullest stage kind with its tables);
    `per_layer` may pass `per_layer_params(model, plans)` when the caller has it."""
    dense, expert = per_layer if per_layer is not None else per_layer_params(model, plans)
    if layers is None or tables is None:
        counts = stage_layers(model, plans)
        layers = maximum(maximum(counts.first, counts.mid), counts.last)
        tables = end_stage_tables(model, plans)
    embeddings = tables * (model.vocab * model.hidden / as_float(plans.tp))
    return LocalParams(
        dense=layers * dense + embeddings, expert=layers * expert, layer=dense + expert
    )


def shard_divisors(plans: PlanArrays) -> tuple[Num, Num]:
    """Sharding group sizes (dense, expert): shard_group·cp, and that over ep for experts.

    Context-parallel ranks hold the same weights, so Megatron's distributed optimizer and
    torchtitan's FSDP shard over dp·cp (Megatron-Core `data_parallel_group_with_cp`).
    """
    sharded = plans.sharding >= SHARDING_CODES["zero1"]
    dense = as_float(where(sharded, plans.shard_group * plans.cp, 1))
    expert = maximum(dense / as_float(plans.ep), 1.0)
    return dense, expert


@dataclass(frozen=True)
class LayerShape:
    """Token counts and per-GPU widths of the tensors one layer saves, one micro-batch."""

    tokens: Num  # micro_batch · seq_len / cp
    norm_tokens: Num  # tokens of the tensors replicated over tp: tokens / tp under SP
    gemm_tokens: Num  # tokens of the saved QKV and MLP GEMM inputs
    q: Num  # width of Q and of the attention output, q_dim / tp (elements per token)
    kv: Num  # width of K and of V (`local_kv_dim`)


def layer_shape(model: TransformerSpec, plans: PlanArrays) -> LayerShape:
    """The token counts and widths `saved_tensors` sizes one layer's tensors by."""
    tp = as_float(plans.tp)
    tokens = plans.micro_batch * model.seq_len / as_float(plans.cp)
    norm_tokens = where(plans.sp, tokens / tp, tokens)
    # with DTensor SP (`sp_gathered_inputs`) the QKV and MLP GEMMs save the all-gathered
    # full-sequence input, Megatron the shard (Korthikanti et al. 2022 §4.2.2: it all-gathers
    # the input again in backward)
    gemm_tokens = where(plans.sp_gathered_inputs, tokens, norm_tokens)
    return LayerShape(tokens, norm_tokens, gemm_tokens, model.q_dim / tp, local_kv_dim(model, tp))


@dataclass(frozen=True)
class SavedTensor:
    """One tensor a layer saves for backward: bytes on one GPU for one micro-batch, and whether
    selective recompute keeps it."""

    nbytes: Num
    selective: bool = True


def saved_tensors(
    model: TransformerSpec, shape: LayerShape, mlp_width: Num, routed: Num = 0.0
) -> list[SavedTensor]:
    """The tensors one layer saves for backward, before FP8 casts, eager extras and per-op
    recompute flags: the one list `_activation_sets` sums and `fragmentation_bytes` rounds
    tensor by tensor, so what a recompute mode keeps is written here only.

    Korthikanti et al. 2022 (Table 2), recounted for flash attention (no s² scores), no
    dropout, GQA and gated MLPs, 2 B per element (ACT_BYTES), in call order: the two norm
    inputs (replicated over tp unless SP; the first is the layer input, all that full
    recompute keeps), the QKV and MLP GEMM inputs, Q, K, V, the attention output, the MLP
    intermediates of `mlp_width` elements per token each (SwiGLU: gate, up, product = 3;
    GELU: input, output = 2; the last is the activation-function output) and the routed
    token copies entering the experts (`routed` elements per token). Selective recompute
    drops the attention output and the activation-function output. Bytes."""
    tokens = shape.tokens
    row = ACT_BYTES * model.hidden * shape.norm_tokens
    gemm = ACT_BYTES * model.hidden * shape.gemm_tokens
    mlp = ACT_BYTES * tokens * mlp_width
    per_width = 3 if model.mlp == "swiglu" else 2
    return [
        SavedTensor(row),  # attention norm input: the layer input
        SavedTensor(row),  # MLP norm input
        SavedTensor(gemm),  # QKV GEMM input (the attention norm's output)
        SavedTensor(gemm),  # MLP GEMM input (the MLP norm's output)
        SavedTensor(ACT_BYTES * tokens * shape.q),  # Q
        SavedTensor(ACT_BYTES * tokens * shape.kv),  # K
        SavedTensor(ACT_BYTES * tokens * shape.kv),  # V
        SavedTensor(ACT_BYTES * tokens * shape.q, selective=False),  # attention output
        *[SavedTensor(mlp)] * (per_width - 1),  # SwiGLU gate and up; GELU input
        SavedTensor(mlp, selective=False),  # activation-function output
        SavedTensor(ACT_BYTES * tokens * routed),  # routed token copies (MoE)
    ]


def recompute_sets(sizes: list[Num], saved: list[SavedTensor]) -> tuple[Num, Num, Num]:
    """(all, selective, layer input) of `sizes`, one per tensor of `saved` (its bytes, or
    what the allocator wastes on it): all of them, those selective recompute keeps, the
    first (what full recompute keeps). `_saved_per_layer` picks one by recompute mode."""
    every = sum(sizes, 0.0 * sizes[0])
    selective = every
    for size, tensor in zip(sizes, saved, strict=True):
        if not tensor.selective:
            selective = selective - size
    return every, selective, sizes[0]


def _mlp_widths(model: TransformerSpec, tp: Num) -> tuple[Num, Num]:
    """Elements per token on one GPU, averaged over the layers: (each MLP intermediate's
    width: the dense FFN's, or under MoE the top-k routed and the shared experts' together,
    /tp; the routed token copies entering the experts, h per routed expert)."""
    moe_share = model.n_moe_layers / model.n_layers
    width = (1.0 - moe_share) * model.dense_ffn / tp
    copies = 0.0
    if model.moe is not None:
        active = model.moe.top_k + model.moe.shared_experts
        width = width + moe_share * active * model.expert_ffn / tp
        copies = moe_share * model.moe.top_k * model.hidden
    return width, copies


def _activation_sets(model: TransformerSpec, plans: PlanArrays) -> tuple[Num, Num, Num]:
    """(all saved, saved under selective recompute, layer input) bytes of one layer."""
    tp = as_float(plans.tp)
    shape = layer_shape(model, plans)
    tokens, norm_tokens, gemm_tokens = shape.tokens, shape.norm_tokens, shape.gemm_tokens
    q_l, kv_l = shape.q, shape.kv
    mlp_width, mlp_copies = _mlp_widths(model, tp)
    saved = saved_tensors(model, shape, mlp_width, mlp_copies)
    every, selective, layer_input = recompute_sets([t.nbytes for t in saved], saved)
    # FP8 GEMMs save their inputs as the 1-byte FP8 casts (Transformer Engine keeps them for
    # the weight gradient): the two norm outputs, the routed token copies entering the experts
    # and the activation-function output.
    # torchao's float8 (fp8_recipe "torchao") saves them in bf16, as without FP8.
    fp8_saved = (plans.precision == PRECISION_CODES["fp8"]) & plans.fp8_te
    fp8_half = where(fp8_saved, 0.5 * ACT_BYTES, 0.0)
    gemm_inputs = fp8_half * (2.0 * model.hidden * gemm_tokens + tokens * mlp_copies)
    full_set = every - gemm_inputs - fp8_half * tokens * mlp_width
    selective_set = selective - gemm_inputs
    # Recomputed in backward from what is kept, so not saved: the activation-function output
    # from its input (xformers' fused SwiGLU; DeepSeek-V3 §3.3.2), and the two norm outputs,
    # the QKV and MLP GEMM inputs, from the norm inputs (Megatron-Core recompute_modules
    # "layernorm"; DeepSeek-V3 §3.2.3). Selective recompute already drops the former.
    act_out = (ACT_BYTES - fp8_half) * tokens * mlp_width
    norm_out = (ACT_BYTES - fp8_half) * 2.0 * model.hidden * gemm_tokens
    dropped_norm = where(plans.recompute_norm, norm_out, 0.0)
    full_set = full_set - where(plans.recompute_act, act_out, 0.0) - dropped_norm
    selective_set = selective_set - dropped_norm
    # Q, K, V re-projected in backward (DeepSeek-V3 §3.2.3, MLA up-projections): not kept;
    # with MLA the latents they are projected from are kept instead (q_lora + kv_lora + RoPE
    # key per token, replicated over tp like the norm inputs, 2 B each)
    latents = 0.0 if model.mla is None else ACT_BYTES * model.mla.latent_dim * norm_tokens
    dropped_qkv = where(plans.recompute_qkv, ACT_BYTES * tokens * (q_l + 2.0 * kv_l) - latents, 0.0)
    full_set = full_set - dropped_qkv
    selective_set = selective_set - dropped_qkv
    # The MLP up projection re-run in backward from its kept input (MaxText
    # "save_dot_except_mlpwi"): its outputs, (m − 1)·F per token, are not kept either.
    up_out = ACT_BYTES * (model.mlp_matrices - 1.0) * tokens * mlp_width
    selective_set = selective_set - where(plans.recompute_mlp_up, up_out, 0.0)
    # Eager element-wise ops (fused_elementwise = False: torchtitan without compile, HF
    # Transformers, litgpt) save more than fused kernels, from PyTorch autograd's saved
    # tensors: RMSNorm upcasts its input and saves the fp32 copy (pow and mul) and the bf16
    # normalized tensor (the weight multiply) where a fused norm saves its bf16 input: + 4 B
    # per element per norm (torchtitan models/norms.py, HF LlamaRMSNorm); SwiGLU's silu(x1) * x2
    # saves the silu output besides x1 and x2: + 2 B per F element. Kept when nothing is
    # recomputed, and in the layer full recompute re-runs.
    eager = logical_not(plans.fused_elementwise)
    gated_width = mlp_width if model.mlp == "swiglu" else 0.0
    norm_extra = EAGER_NORM_EXTRA if model.norm == "rmsnorm" else 0.0
    eager_extra = norm_extra * 2.0 * model.hidden * norm_tokens + (
        EAGER_SWIGLU_EXTRA * tokens * gated_width
    )
    full_set = full_set + where(eager, eager_extra, 0.0)
    # Unfused attention also keeps its score tensors (5·a·s²·b / tp, Korthikanti §4.1); selective
    # recompute exists to drop exactly these.
    scores = tokens * model.seq_len * model.n_heads / tp * UNFUSED_SCORE_STORED
    full_set = full_set + where(plans.attention == ATTENTION_CODES["unfused"], scores, 0.0)
    selective_set = where(
        plans.op_sac, op_sac_set(model, plans, tokens, layer_input), selective_set
    )
    return full_set, selective_set, layer_input


def op_sac_set(model: TransformerSpec, plans: PlanArrays, tokens: Num, layer_input: Num) -> Num:
    """Bytes one layer keeps under torchtitan's per-op selective checkpointing
    (`selective_ac_option = "op"`, torchtitan parallelize_llama.py `_save_list` and
    `_custom_policy`): the outputs of aten.mm except every second one counted in the layer, of
    SDPA (flash/efficient) and of aten.max; everything else is recomputed from the layer
    input, which the checkpoint keeps. In call order the matmuls are wq (1st, kept), wk, wv
    (3rd, kept), wo, w1 (5th, kept), then SwiGLU's w3 and w2 (7th, kept: the row-parallel
    local partial sum, tokens × h before any reduce-scatter), GELU's w2 (6th, not kept).
    bf16, 2 B per element; the softmax LSE (fp32 per head and token) is left out. Bytes."""
    tp = as_float(plans.tp)
    q_l = model.q_dim / tp
    kv_l = local_kv_dim(model, tp)
    width = model.expert_ffn if model.moe is not None else model.dense_ffn
    w2_out = model.hidden if model.mlp == "swiglu" else 0.0
    kept = tokens * (q_l + kv_l + q_l + width / tp + w2_out)
    return layer_input + ACT_BYTES * kept


def activation_bytes_per_layer(model: TransformerSpec, plans: PlanArrays) -> Num:
    """Saved activations of one layer for one micro-batch on one GPU, by recompute mode.

    Recounted from Korthikanti's list for flash attention (no s² scores), no dropout, GQA and
    gated MLPs: replicated unless SP: two norm inputs, QKV and MLP inputs (4h per token);
    split by tp: Q, K, V, attention output, MLP intermediates (SwiGLU: gate, up, product = 3F;
    GELU: input, output = 2F), MoE per routed copy. Selective recompute drops the attention
    output and the activation-function output; full recompute keeps only the layer input.
    """
    return _saved_per_layer(plans, *_activation_sets(model, plans))


def _saved_per_layer(plans: PlanArrays, full_set: Num, selective_set: Num, layer_input: Num) -> Num:
    """The activation set each plan's recompute mode keeps (none, selective, full), per
    average layer: with `recompute_every = N` a share 1/N of the layers keeps its input, the
    rest everything (`recompute_share`)."""
    code = plans.recompute
    partial = where(code == RECOMPUTE_CODES["selective"], selective_set, full_set)
    share = recompute_share(plans)
    checkpointed = share * layer_input + (1.0 - share) * full_set
    return where(code == RECOMPUTE_CODES["full"], checkpointed, partial)


def _max_chunks(plans: PlanArrays) -> int:
    return int(np.max(plans.vpp))


def chunk_layers(layers: Num, q: Num, index: Num, v: Num) -> Num:
    """Layers of chunk `index` (0-based, counted from the light end) of a stage of `layers`
    layers in chunks of at most `q`: full chunks, the deficit at the light end."""
    return where(index < v, minimum(maximum(layers - (v - 1.0 - index) * q, 0.0), q), 0.0)


def in_flight_layers(plans: PlanArrays, stage: Num, layers: Num, q: Num, last: bool) -> Num:
    """Layer-micro-batches of activations stage `stage` holds at its peak (`q`: its largest
    chunk, used where `pp_end_chunks` makes the end chunks lighter).

    1F1B: min(p − i, m) micro-batches of all its layers (Narayanan et al. SC'21 §2.2.1).
    Interleaved, v chunks of at most q layers: the warm-up runs W = 2(p − 1 − i) + (v − 1)·N
    forwards, chunk c taking N micro-batches in turn (Megatron-Core get_pp_rank_microbatches,
    microbatch_group_size_per_vp_stage = N, default p; torch ScheduleInterleaved1F1B); the peak
    is W + 1 chunk-micro-batches, or all m·v when W + 1 ≥ m·v. On the first and middle stages
    it is reached there. On the last stage, whose light chunks are backwarded first, it can
    come later: each steady block of N steps runs forwards of chunk b − 1 and backwards of
    chunk v − 1 − b, gaining N·(w_{b−1} − w_{v−1−b}) layers (checked against the schedule
    itself in tests/shardmeter/test_memory.py).
    """
    p, v, n = as_float(plans.pp), as_float(plans.vpp), as_float(plans.chunk_group)
    m = as_float(plans.micro_batches)
    plain = minimum(p - stage, m) * layers
    if _max_chunks(plans) == 1:
        return plain
    peak = minimum(2.0 * (p - 1.0 - stage) + (v - 1.0) * n + 1.0, m * v)
    if not np.any(plans.pp_end_chunks):  # layers/v on every chunk (`q` unused): the count
        return where(plans.vpp > 1, peak * layers / v, plain)
    if last:
        return where(plans.vpp > 1, _last_stage_peak(plans, layers, q, n, m), plain)
    rounds = floor(peak / (n * v))
    rest = peak - rounds * n * v
    held = 0.0 * peak
    for c in range(_max_chunks(plans)):
        # chunk c (the light first chunks lead) ran `rounds` full groups and part of this one
        count = rounds * n + minimum(maximum(rest - c * n, 0.0), n)
        held = held + count * chunk_layers(layers, q, float(c), v)
    return where(plans.vpp > 1, held, plain)


def _last_stage_peak(plans: PlanArrays, layers: Num, q: Num, n: Num, m: Num) -> Num:
    """Peak layer-micro-batches of the last stage (light chunks last), by steady block."""
    v = as_float(plans.vpp)

    def w(chunk: Num) -> Num:  # layers of chunk `chunk`, counted from the front
        return chunk_layers(layers, q, v - 1.0 - chunk, v)

    warm = layers - w(v - 1.0)  # chunks 0..v−2 ran N micro-batches each in the warm-up
    level = n * warm
    peak = level + w(v - 1.0)  # block 0: forward and backward of the last chunk
    several = m >= 2.0 * n  # a second round of forwards exists
    for b in range(1, _max_chunks(plans)):
        gain = w(b - 1.0) - w(v - 1.0 - b)
        top = level + maximum(gain, 0.0) * (n - 1.0) + w(b - 1.0)
        peak = where(several & (b < v), maximum(peak, top), peak)
        level = level + n * gain
    return peak


MEMORY_NAMES = ("weights", "gradients", "optimizer_states", "activations", "buffers", "overhead")


@dataclass(frozen=True)
class MemoryArrays:
    """Per-GPU bytes by MEMORY_COMPONENTS name, for the stage that needs the most, and the
    terms `overhead` sums (allocator fragmentation, CUDA context, NCCL buffers), plus host
    bytes (offloaded or paged states) that are not on the GPU."""

    weights: Num
    gradients: Num
    optimizer_states: Num
    activations: Num
    buffers: Num
    overhead: Num  # fragmentation + cuda_context + nccl_buffers
    fragmentation: Num = 0.0  # reserved − allocated: block rounding and segment slack
    cuda_context: Num = 0.0
    nccl_buffers: Num = 0.0
    host: Num = 0.0  # on the host (offload) or in paged unified memory, not counted on the GPU

    def as_dict(self) -> dict[str, Num]:
        """The six MEMORY_COMPONENTS (they sum to the device total)."""
        return {name: getattr(self, name) for name in MEMORY_NAMES}

    @property
    def allocated(self) -> Num:
        """`torch.cuda.max_memory_allocated`: the live tensors at the peak."""
        return (
            self.weights + self.gradients + self.optimizer_states + self.activations + self.buffers
        )

    @property
    def reserved(self) -> Num:
        """`torch.cuda.max_memory_reserved`: the caching allocator's segments."""
        return self.allocated + self.fragmentation

    @property
    def total(self) -> Num:
        """Device total that decides an OOM: reserved + CUDA context + NCCL buffers, i.e. the
        allocated tensors + `overhead` (fragmentation, CUDA context, NCCL buffers), so the tensor
        kinds are summed in one place (`allocated`)."""
        return self.allocated + self.overhead


# PyTorch's CUDA caching allocator (c10/cuda/CUDACachingAllocator.cpp, kMinBlockSize,
# kSmallSize, kMinLargeAlloc, kRoundLarge): requests up to kSmallSize = 1 MiB are packed into
# 2 MiB segments, those from 1 to 10 MiB (kMinLargeAlloc) are carved from shared 20 MiB
# segments, both rounded only to 512 B; a request of at least 10 MiB gets a segment of its
# size rounded up to kRoundLarge = 2 MiB, the rest of which it keeps or leaves as a sliver.
ROUND_LARGE = 2.0 * MIB
MIN_LARGE_ALLOC = 10.0 * MIB


def rounding_waste(nbytes: Num) -> Num:
    """Bytes the caching allocator reserves beyond one live tensor of `nbytes`: the round-up
    of a request of at least MIN_LARGE_ALLOC to ROUND_LARGE (the 512-B rounding of smaller
    requests, packed into shared segments, is left out). Bytes."""
    rounded = ceil(nbytes / ROUND_LARGE) * ROUND_LARGE
    return where(nbytes >= MIN_LARGE_ALLOC, rounded - nbytes, 0.0 * nbytes)


# CUDA context and the kernels of the loaded modules: 1,343 MB measured on a V100 by
# nvidia-smi after one tiny tensor (Hugging Face Transformers docs, "Model training
# anatomy": "the kernels alone take up 1.3GB of GPU memory").
CUDA_CONTEXT_BYTES = 1343.0 * MIB
# NCCL: each communicator holds, per channel and per peer it sends to or receives from, one
# buffer of NCCL_BUFFSIZE = 4 MiB for the Simple protocol (NCCL docs, Environment Variables:
# NCCL_BUFFSIZE default 4194304); a ring has two peers (previous and next).
NCCL_BUFFSIZE = 4.0 * MIB
NCCL_CHANNELS = 8.0  # channels per communicator (NCCL picks 2..32 by topology; assumed)
NCCL_RING_PEERS = 2.0


def nccl_buffer_bytes(plans: PlanArrays) -> Num:
    """NCCL buffers per GPU: one communicator per parallel group larger than one (the
    data-parallel/sharding group, tp, cp, ep; pp's send/recv pair) × channels × ring peers ×
    NCCL_BUFFSIZE. Bytes."""
    groups = 0.0 * as_float(plans.dp)
    for degree in (plans.dp * plans.cp, plans.tp, plans.cp, plans.ep, plans.pp):
        groups = groups + where(degree > 1, 1.0, 0.0)
    return groups * NCCL_CHANNELS * NCCL_RING_PEERS * NCCL_BUFFSIZE


def _layer_matrices(model: TransformerSpec, plans: PlanArrays) -> list[Num]:
    """Elements of each weight matrix of one layer on one GPU before sharding: Q, K, V, O and
    the MLP's (one expert's under MoE)."""
    tp = as_float(plans.tp)
    q_l = model.q_dim / tp
    kv_l = local_kv_dim(model, tp)
    width = model.expert_ffn if model.moe is not None else model.dense_ffn
    h = model.hidden
    return [h * q_l, h * kv_l, h * kv_l, q_l * h] + [h * width / tp] * model.mlp_matrices


def fragmentation_bytes(
    model: TransformerSpec, plans: PlanArrays, held_layers: Num, local_layers: Num
) -> Num:
    """reserved − allocated from rounding: `rounding_waste` of every live tensor, i.e. of each
    saved activation of the `held_layers` layer-micro-batches (all of them without recompute;
    selective drops the attention output and the activation-function output; full recompute
    keeps the layer input; `recompute_every` mixes the two), and of each weight matrix's
    weight, gradient, master copy and optimizer states on the GPU for the `local_layers`
    layers, each sharded over the sharding group where its ZeRO stage shards it. Bytes."""
    # each saved tensor of one MLP (the dense one's, or one expert's) is one allocation
    width = model.expert_ffn if model.moe is not None else model.dense_ffn
    saved = saved_tensors(model, layer_shape(model, plans), width / as_float(plans.tp))
    waste = [rounding_waste(t.nbytes) for t in saved]
    per_layer = _saved_per_layer(plans, *recompute_sets(waste, saved))
    # per matrix: w, g, master, m, v, each only where it lives on the GPU (offload moves the
    # states, ZeRO-Offload also the gradients, params+optimizer all of them to the host),
    # each /d where its stage shards it (ZeRO stage 1 the states, 2 the gradients, 3 weights)
    host_states = plans.offload >= OFFLOAD_CODES["optimizer"]
    host_params = plans.offload == OFFLOAD_CODES["params+optimizer"]
    host_grads = host_params | (plans.offload == OFFLOAD_CODES["grads+optimizer"])
    d, _ = shard_divisors(plans)
    stage = plans.sharding
    state_dtype = state_dtype_bytes(plans)
    master = master_bytes(plans)
    weight = gathered_weight_bytes(plans)
    grad = where(plans.grad_fp32, FP32_GRAD_BYTES, GRAD_BYTES)
    # state tensors on the allocator and bytes per element (`optimizer_state_bytes`; paged
    # states live in unified memory, Adafactor's factored moments are small)
    code_opt, codes = plans.optimizer, OPTIMIZER_CODES
    one_state = (code_opt == codes["sgd"]) | (code_opt == codes["muon"])
    each = where(
        code_opt == codes["adamw"], state_dtype,
        where(code_opt == codes["adamw8bit"], 1.0,
              where(code_opt == codes["adamw4bit"], 0.5, where(one_state, 1.0, 0.0) * state_dtype)),
    )  # fmt: skip
    n_states = where(one_state, 1.0, 2.0)
    states = 0.0 * as_float(plans.tp)
    for elements in _layer_matrices(model, plans):
        w_el = elements / where(stage >= 3, d, 1.0)
        g_el = elements / where(stage >= 2, d, 1.0)
        o_el = elements / where(stage >= 1, d, 1.0)
        on_gpu = where(host_params, 0.0, rounding_waste(weight * w_el))
        on_gpu = on_gpu + where(host_grads, 0.0, rounding_waste(grad * g_el))
        optimizer = rounding_waste(master * o_el) + n_states * rounding_waste(each * o_el)
        states = states + on_gpu + where(host_states, 0.0, optimizer)
    return per_layer * held_layers + states * local_layers


def _gather_unit_params(model: TransformerSpec, plans: PlanArrays, layer: Num) -> Num:
    """Parameters one ZeRO-3 all-gather fetches: a whole layer (FSDP unit), or its largest
    weight matrix (DeepSpeed ZeRO-3 fetches module by module)."""
    tp = as_float(plans.tp)
    h = model.hidden
    width = model.expert_ffn if model.moe is not None else model.dense_ffn
    matrix = maximum(h * (model.q_dim + 2.0 * model.kv_dim), (model.mlp_matrices - 1.0) * h * width)
    return where(plans.gather_matrix, minimum(matrix / tp, layer), layer)


@dataclass(frozen=True)
class _Shared:
    """What every stage kind shares: saved bytes per layer, the full-recompute working set,
    model-state bytes per dense and per routed-expert parameter, and the ZeRO-3 gather."""

    per_layer: Num
    working: Num
    dense: ModelStates  # bytes per dense parameter
    expert: ModelStates  # bytes per routed-expert parameter
    unit: Num  # parameters one ZeRO-3 all-gather fetches
    unit_weight_bytes: Num  # bytes per gathered weight (gathered_weight_bytes)
    missing_dense: Num  # share of a gathered dense unit this GPU does not hold, 1 − 1/d
    missing_expert: Num
    zero3: Num
    host_params: Num = False
    host_grads: Num = False  # ZeRO-Offload: gradients streamed to the host during backward
    grad_bytes: Num = GRAD_BYTES  # bytes per gradient element (GRAD_BYTES or FP32_GRAD_BYTES)
    host_dense: Num = 0.0  # host bytes per dense parameter (offloaded or paged states)
    host_expert: Num = 0.0
    fused_step_grads: Num = 0.0  # gradient bytes live with optimizer_in_backward
    layer_input: Num = 0.0  # bytes of one layer's input (= a stage's output) per micro-batch
    host_activations: Num = 0.0  # bytes per layer-micro-batch offloaded (offload_activations)


def largest_parameter(model: TransformerSpec, plans: PlanArrays) -> Num:
    """Elements of the largest single weight tensor on one GPU: the embedding or output table
    (V·h), an MLP matrix (h·F, experts h·F_expert) or the query projection (h·q), /tp."""
    width = model.expert_ffn if model.moe is not None else model.dense_ffn
    biggest = max(model.vocab * model.hidden, model.hidden * width, model.hidden * model.q_dim)
    return biggest / as_float(plans.tp)


def _shared(model: TransformerSpec, plans: PlanArrays, layer: Num) -> _Shared:
    full_set, selective_set, layer_input = _activation_sets(model, plans)
    d_dense, d_expert = shard_divisors(plans)
    remainder = plans.master_remainder
    state, paged = optimizer_state_bytes(plans)
    host_states = plans.offload >= OFFLOAD_CODES["optimizer"]
    host_params = plans.offload == OFFLOAD_CODES["params+optimizer"]
    host_grads = plans.offload == OFFLOAD_CODES["grads+optimizer"]
    grad_bytes = where(plans.grad_fp32, FP32_GRAD_BYTES, GRAD_BYTES)
    # host bytes per parameter before sharding: offloaded states (fp32 master + states), with
    # ZeRO-Offload the gradients, and,
    # with the parameters, the weights and gradients; paged states wherever they are
    host_each = (
        where(host_states, state, 0.0)
        + where(host_params, WEIGHT_BYTES + GRAD_BYTES, 0.0)
        + paged
        + where(host_grads, grad_bytes, 0.0)
    )
    sharded = plans.sharding >= SHARDING_CODES["zero1"]
    # Activations offloaded to host memory (offload_activations): the chip keeps each layer's
    # input (the scan carry, saved by the checkpointed layer), the host the offloaded set, and
    # the layer whose backward runs holds its fetched and recomputed tensors, the full set
    offload = plans.offload_activations
    kept = _saved_per_layer(plans, full_set, selective_set, layer_input)
    return _Shared(
        per_layer=where(offload, layer_input, kept),
        layer_input=layer_input,
        host_activations=offloaded_activation_bytes(model, plans),
        # Under recompute one layer's recomputed tensors are rebuilt at a time during its
        # backward, beside what it kept: the whole layer under full recompute, what the
        # selective set leaves out under selective (torch.utils.checkpoint re-runs the forward
        # of the layer whose backward is next)
        working=where(
            (plans.recompute == RECOMPUTE_CODES["full"]) | offload,
            full_set,
            where(plans.recompute == RECOMPUTE_CODES["selective"], full_set - selective_set, 0.0),
        ),
        dense=model_state_bytes(
            1.0, d_dense, plans.sharding, remainder, state, host_states, host_params, grad_bytes
        ),
        expert=model_state_bytes(
            1.0, d_expert, plans.sharding, remainder, state, host_states, host_params, grad_bytes
        ),
        unit=_gather_unit_params(model, plans, layer),
        unit_weight_bytes=gathered_weight_bytes(plans),
        # The gathered unit lacks (1 - 1/d) of each part: dense weights shard over d_dense,
        # routed experts over d_expert (ZeRO paper, Rajbhandari et al. 2020, Sec. 5.3).
        missing_dense=1.0 - 1.0 / d_dense,
        missing_expert=1.0 - 1.0 / d_expert,
        # with the parameters offloaded every unit is fetched from the host before use (FSDP
        # CPUOffload, ZeRO-Infinity), so the two-unit buffer applies without ZeRO-3 too
        zero3=(plans.sharding == SHARDING_CODES["zero3"]) | host_params,
        host_params=host_params,
        host_grads=host_grads,
        grad_bytes=grad_bytes,
        host_dense=host_each / where(sharded, d_dense, 1.0),
        host_expert=host_each / where(sharded, d_expert, 1.0),
        # optimizer_in_backward: each gradient is applied and freed as soon as it is
        # accumulated, so the largest one (sharded under ZeRO-2/3) bounds what is live
        fused_step_grads=grad_bytes
        * largest_parameter(model, plans)
        / where(plans.sharding >= SHARDING_CODES["zero2"], d_dense, 1.0),
    )


def _stage_memory(
    cluster: Cluster, shared: _Shared, params: LocalParams, in_flight: Num, logits: Num,
    plans: PlanArrays, layers: Num, model: TransformerSpec, cached: Num = 0.0,
    outputs: Num = 0.0,
) -> MemoryArrays:  # fmt: skip
    """Memory of one stage kind: its states, `in_flight` layer-micro-batches of activations,
    the full-recompute working layer, the ZeRO-3 prefetch buffer and `logits`; then the
    allocator's fragmentation, the CUDA context and NCCL buffers (`memory_overhead_gb`, when
    the cluster states it, replaces all three, e.g. 0.5 GB on TPU pods, where XLA plans its
    buffers at compile time)."""
    dense, expert = params.dense, params.expert
    # The full-recompute working layer is rebuilt only after the loss backward has freed the
    # logits (autograd runs the loss backward first), so the two never coexist: the working set
    # counts only where it exceeds the logits
    activations = shared.per_layer * in_flight + maximum(shared.working - logits, 0.0)
    activations = activations + outputs  # stage outputs kept for backward (pp_keeps_outputs)
    unit_bytes = shared.unit_weight_bytes * minimum(2.0 * shared.unit, params.total)
    missing = (dense * shared.missing_dense + expert * shared.missing_expert) / maximum(
        params.total, 1e-30
    )
    missing = where(shared.host_params, 1.0, missing)
    buffers = where(shared.zero3, unit_bytes * missing, 0.0) + logits
    # reshard_after_forward = False: the gathered bf16 weights of every local unit stay until
    # backward (2 B per parameter not held locally); with PP the unsharded gradients of the
    # micro-batches accumulate in the fp32 reduce dtype (4 B per parameter) until the last
    # one (torchtitan apply_fsdp; FSDP2 set_requires_gradient_sync(False))
    kept = logical_not(plans.reshard_after_forward) & (plans.sharding == SHARDING_CODES["zero3"])
    gathered = shared.unit_weight_bytes * params.total * missing
    accumulated = where(plans.pp > 1, UNSHARDED_GRAD_BYTES * params.total, 0.0)
    buffers = buffers + where(kept, gathered + accumulated, 0.0)
    weights = dense * shared.dense.weights + expert * shared.expert.weights
    gradients = dense * shared.dense.gradients + expert * shared.expert.gradients
    gradients = where(plans.optimizer_in_backward, shared.fused_step_grads, gradients)
    # ZeRO-Offload: each gradient is copied to the host as its bucket is reduced, so the GPU
    # holds one reduce bucket, not the gradients
    bucket = shared.grad_bytes * minimum(ZERO_REDUCE_BUCKET, params.total)
    gradients = where(shared.host_grads, bucket, gradients)
    optimizer = dense * shared.dense.optimizer + expert * shared.expert.optimizer
    # Reserved: the logits' freed segments stay cached for the next step's logits, and the
    # working layer's tensors come from other segments, so the reserved side keeps both
    logits_cached = minimum(shared.working, logits)
    if cluster.memory_overhead_gb is not None:  # one stated figure replaces all three
        fragmentation = 0.0 * activations
        context = full_like(activations, cluster.memory_overhead_gb * 1e9)
        nccl = 0.0 * activations
    else:
        fragmentation = (
            fragmentation_bytes(model, plans, in_flight, layers) + cached + logits_cached
        )  # `cached`: the eager fp32 loss's unusable bf16 block (memory_breakdown)
        context = full_like(activations, CUDA_CONTEXT_BYTES)
        nccl = nccl_buffer_bytes(plans) + 0.0 * activations
    host = dense * shared.host_dense + expert * shared.host_expert
    host = host + shared.host_activations * in_flight
    return MemoryArrays(
        weights=weights,
        gradients=gradients,
        optimizer_states=optimizer,
        activations=activations,
        buffers=buffers,
        overhead=fragmentation + context + nccl,
        fragmentation=fragmentation,
        cuda_context=context,
        nccl_buffers=nccl,
        host=host,
    )


def memory_breakdown(
    model: TransformerSpec,
    cluster: Cluster,
    plans: PlanArrays,
    counts: StageLayers | None = None,
) -> MemoryArrays:
    """Weights, grads, optimizer (ZeRO), activations (in-flight micro-batches), buffers
    (ZeRO-3 all-gather of two units with prefetch, logits), and the overhead (allocator
    fragmentation, CUDA context, NCCL buffers), for the fullest of the first, fullest middle
    and last pipeline stages (chosen by device total)."""
    counts = counts if counts is not None else stage_layers(model, plans)
    tables = end_stage_tables(model, plans)
    tokens = plans.micro_batch * model.seq_len / as_float(plans.cp)
    per_logit = where(
        plans.fused_ce, FUSED_LOGITS_BYTES,
        where(plans.ce_compiled, COMPILED_LOGITS_BYTES,
              where(plans.ce_eager, where(plans.tp > 1, LOSS_PARALLEL_LOGITS_BYTES,
                                          EAGER_FP32_LOGITS_BYTES), LOGITS_BYTES)),
    )  # fmt: skip
    local_logits = tokens * model.vocab / as_float(plans.tp)
    logits = local_logits * per_logit
    cached = where(
        plans.ce_eager & logical_not(plans.fused_ce | plans.ce_compiled),
        EAGER_FP32_CACHED_BYTES * local_logits, 0.0,
    )  # fmt: skip
    single = plans.pp == 1
    per_layer = per_layer_params(model, plans)
    shared = _shared(model, plans, per_layer[0] + per_layer[1])

    def params_of(layers: Num, tables_on: Num) -> LocalParams:
        return local_params(model, plans, layers, tables_on, per_layer)

    v = as_float(plans.vpp)
    fullest = maximum(maximum(counts.first, counts.mid), counts.last)

    def chunk(layers: Num) -> Num:
        """Largest chunk of a stage: a full one where a lighter end stage lost its end
        chunks' layers (`pp_end_chunks`), else the stage's layers spread over v chunks."""
        return where(plans.pp_end_chunks & (layers < fullest), fullest / v, layers / v)

    def outputs_of(in_flight: Num, layers: Num) -> Num:
        """Stage outputs kept until their backward (`pp_keeps_outputs`): one layer input per
        chunk-micro-batch in flight, in_flight / (layers / v) of them; on a stage that is not
        the last (the last stage's output is the logits). Bytes."""
        held = in_flight * v / maximum(layers, 1.0)
        return where(plans.pp_keeps_outputs & (plans.pp > 1), shared.layer_input * held, 0.0)

    in_first = in_flight_layers(plans, 0.0, counts.first, chunk(counts.first), last=False)
    in_mid = in_flight_layers(plans, 1.0, counts.mid, counts.mid / v, last=False)
    first = _stage_memory(
        cluster, shared, params_of(counts.first, tables), in_first,
        where(single, logits, 0.0), plans, counts.first, model, where(single, cached, 0.0),
        outputs_of(in_first, counts.first),
    )  # fmt: skip
    last = _stage_memory(
        cluster, shared, params_of(counts.last, tables),
        in_flight_layers(plans, as_float(plans.pp) - 1.0, counts.last, chunk(counts.last),
                         last=True),
        logits, plans, counts.last, model, cached,
    )  # fmt: skip
    mid = _stage_memory(
        cluster, shared, params_of(counts.mid, 0.0), in_mid, 0.0, plans, counts.mid, model,
        0.0, outputs_of(in_mid, counts.mid),
    )  # fmt: skip
    totals = [first.total, where(plans.pp > 2, mid.total, 0.0), where(single, 0.0, last.total)]
    pick_mid = (totals[1] > totals[0]) & (totals[1] >= totals[2])
    pick_last = (totals[2] > totals[0]) & logical_not(pick_mid)
    return MemoryArrays(
        **{
            name: where(pick_last, last_get, where(pick_mid, mid_get, first_get))
            for name, first_get, mid_get, last_get in (
                (n, getattr(first, n), getattr(mid, n), getattr(last, n))
                for n in MemoryArrays.__dataclass_fields__
            )
        }
    )


# ZeRO-Offload (`offload = "grads+optimizer"`, DeepSpeed stage 1/2 `offload_optimizer`): the
# gradients, optimizer states and the fp32 master go to the host, the fp16/bf16 weights stay
# (Ren et al. 2021, ZeRO-Offload, §4.1 and Fig. 2: "fp16 gradients" moved to CPU during
# backward); each gradient passes through the reduce bucket on its way out, DeepSpeed's
# `reduce_bucket_size`, default 5e8 elements (DeepSpeed config docs, zero_optimization).
ZERO_REDUCE_BUCKET = 5e8  # elements

# Host link of an offloading GPU: PCIe Gen4 x16, 32 GB/s per direction nominal (PCI-SIG
# PCIe 4.0 base specification: 16 GT/s × 16 lanes, 128b/130b); 25 GB/s of payload through
# the host bridge, as the l40s-pcie cluster preset takes it. Bytes/s.
PCIE_BYTES_PER_S = 25e9


def host_link_bytes_per_s(acc: Accelerator) -> float:
    """Bytes/s per direction of one chip's host link: the accelerator's stated `host_gbps`
    (TPU v5e/v5p: about 1.5e10 B/s per chip, Austin et al. 2025, "How to Scale Your Model",
    tpus.md), else PCIE_BYTES_PER_S."""
    return PCIE_BYTES_PER_S if acc.host_gbps is None else acc.host_gbps * 1e9


def offloaded_activation_bytes(model: TransformerSpec, plans: PlanArrays) -> Num:
    """Bytes of one layer's activations that a plan with `offload_activations` moves to host
    memory per micro-batch on one chip (and back for the backward): the outputs of the
    layer's weight matmuls, which MaxText's remat_policy "minimal_offloaded" offloads (its
    decoders.py: jax.checkpoint_policies.save_and_offload_only_these_names over query_proj,
    key_proj, value_proj, out_proj, mlpwi_0, mlpwi_1, mlpwo; offload_dst "pinned_host"):
    Q, K, V (q + 2·kv per token, /tp), the gated MLP's up projections ((m − 1)·F per token,
    /tp; MoE: per routed and shared expert copy), and the attention and MLP output
    projections (h per token each, /tp with SP: MaxText shards the activations' embed axis
    over the tensor axis). 2 B each (bf16); 0 without `offload_activations`."""
    shape = layer_shape(model, plans)
    tokens, norm_tokens = shape.tokens, shape.norm_tokens
    up = (model.mlp_matrices - 1) * _mlp_widths(model, as_float(plans.tp))[0]
    per_token = shape.q + 2.0 * shape.kv + up
    elements = tokens * per_token + 2.0 * model.hidden * norm_tokens
    return where(plans.offload_activations, ACT_BYTES * elements, 0.0)


OFFLOAD_STEP_BYTES = 4.0  # per owned parameter and step: bf16 gradient down, bf16 weight up
OFFLOAD_FETCH_BYTES = 4.0  # per owned parameter and micro-batch: the shard up for fwd and bwd


def offload_transfer_time(owned: Num, plans: PlanArrays) -> Num:
    """PCIe seconds per step of an offloading plan, charged exposed (0 without offload).

    Optimizer offload (ZeRO-Offload, Ren et al. 2021 §4; torchao CPUOffloadOptimizer), with or
    without the gradients kept on the host (`grads+optimizer` moves them during backward
    instead of after it): the gradients go down and the updated weights come up once per step,
    OFFLOAD_STEP_BYTES per parameter this GPU owns; the CPU step itself overlaps the next
    step's GPU work (ZeRO-Offload §5, one-step delayed update) and is not charged. With the
    parameters offloaded too (FSDP CPUOffload, ZeRO-Infinity) each micro-batch also fetches the
    shard for its forward and its backward, OFFLOAD_FETCH_BYTES per owned parameter."""
    step_bytes = where(plans.offload >= OFFLOAD_CODES["optimizer"], OFFLOAD_STEP_BYTES, 0.0)
    fetch = where(plans.offload == OFFLOAD_CODES["params+optimizer"], OFFLOAD_FETCH_BYTES, 0.0)
    per_param = step_bytes + fetch * as_float(plans.micro_batches)
    return owned * per_param / PCIE_BYTES_PER_S
