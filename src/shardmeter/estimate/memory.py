"""Per-GPU memory: model states under ZeRO/FSDP sharding, activations, buffers, overhead.

Model states follow the ZeRO paper (Rajbhandari et al. SC'20, §3.1 and Fig. 1): mixed-precision
Adam keeps 2 (bf16 weights) + 2 (bf16 grads) + 12 (fp32 master, m, v) bytes per parameter;
stage 1 shards the 12, stage 2 also the grads, stage 3 also the weights. Activations follow
Korthikanti et al. 2022 (Table 2), recounted for flash attention without dropout. Bytes.
"""

from __future__ import annotations

from dataclasses import dataclass

from shardmeter.estimate._xp import Num, as_float, full_like, maximum, minimum, where
from shardmeter.estimate.compute import ACT_BYTES, stage_layers
from shardmeter.estimate.plan_arrays import (
    PRECISION_CODES,
    RECOMPUTE_CODES,
    SHARDING_CODES,
    PlanArrays,
)
from shardmeter.specs.hardware import Cluster
from shardmeter.specs.model import TransformerSpec

WEIGHT_BYTES = 2.0  # bf16 weights
GRAD_BYTES = 2.0  # bf16 gradients
OPTIMIZER_BYTES = 12.0  # fp32 master copy + Adam m and v (ZeRO paper's K = 12)
LOGITS_BYTES = 8.0  # per logit: bf16 output + fp32 softmax copy + bf16 gradient


@dataclass(frozen=True)
class ModelStates:
    """Bytes per GPU of weights, gradients and optimizer states."""

    weights: Num
    gradients: Num
    optimizer: Num

    @property
    def total(self) -> Num:
        return self.weights + self.gradients + self.optimizer


def model_state_bytes(params: Num, shard: Num, stage: Num) -> ModelStates:
    """ZeRO table (C.3): stage 0 16N; 1: 4N + 12N/d; 2: 2N + 14N/d; 3: 16N/d.

    `params` are the parameters this GPU holds before sharding (already /(tp·pp)), `shard`
    the sharding group d (the HSDP shard group), `stage` 0..3.
    """
    d = where(stage >= 1, as_float(shard), 1.0)
    return ModelStates(
        weights=WEIGHT_BYTES * params / where(stage >= 3, d, 1.0),
        gradients=GRAD_BYTES * params / where(stage >= 2, d, 1.0),
        optimizer=OPTIMIZER_BYTES * params / d,
    )


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
    """Parameters held by one GPU on its fullest stage, before ZeRO/FSDP sharding."""

    dense: Num  # attention, dense MLPs, shared experts, routers, embeddings
    expert: Num  # routed experts (split over ep as well)
    layer: Num  # one layer's parameters (the FSDP unit)

    @property
    def total(self) -> Num:
        return self.dense + self.expert


def local_params(model: TransformerSpec, plans: PlanArrays) -> LocalParams:
    """Per-GPU parameters: the stage's L/pp layers split by tp (routed experts also by ep),
    plus the embedding or output head (both when pp = 1 and untied)."""
    tp = as_float(plans.tp)
    n_stage = stage_layers(model, plans)
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
    both = 1.0 if model.tied_embeddings else 2.0
    embeddings = where(plans.pp == 1, both, 1.0) * (model.vocab * model.hidden / tp)
    return LocalParams(
        dense=n_stage * per_layer_dense + embeddings,
        expert=n_stage * per_layer_expert,
        layer=per_layer_dense + per_layer_expert,
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


def _activation_sets(model: TransformerSpec, plans: PlanArrays) -> tuple[Num, Num, Num]:
    """(all saved, saved under selective recompute, layer input) bytes of one layer."""
    tp = as_float(plans.tp)
    tokens = plans.micro_batch * model.seq_len / as_float(plans.cp)
    norm_tokens = where(plans.sp, tokens / tp, tokens)
    q_l = model.q_dim / tp
    kv_l = maximum(model.kv_heads / tp, 1.0) * model.dim_head
    moe_share = model.n_moe_layers / model.n_layers
    per_width = 3.0 if model.mlp == "swiglu" else 2.0
    mlp_width = (1.0 - moe_share) * model.dense_ffn / tp
    mlp_copies = 0.0
    if model.moe is not None:
        active = model.moe.top_k + model.moe.shared_experts
        mlp_width = mlp_width + moe_share * active * model.expert_ffn / tp
        mlp_copies = moe_share * model.moe.top_k * model.hidden
    replicated = 4.0 * model.hidden * norm_tokens  # two norm inputs, QKV and MLP inputs
    split = tokens * (q_l + 2.0 * kv_l + q_l + per_width * mlp_width + mlp_copies)
    # FP8 GEMMs save their inputs as the 1-byte FP8 casts (Transformer Engine keeps them for
    # the weight gradient): the two norm outputs and the activation-function output.
    fp8_half = where(plans.precision == PRECISION_CODES["fp8"], 0.5 * ACT_BYTES, 0.0)
    norm_out_saving = fp8_half * 2.0 * model.hidden * norm_tokens
    full_set = ACT_BYTES * (replicated + split) - norm_out_saving - fp8_half * tokens * mlp_width
    selective_set = ACT_BYTES * (replicated + split - tokens * (q_l + mlp_width)) - norm_out_saving
    return full_set, selective_set, ACT_BYTES * model.hidden * norm_tokens


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
    """The activation set each plan's recompute mode keeps (none, selective, full)."""
    code = plans.recompute
    partial = where(code == RECOMPUTE_CODES["selective"], selective_set, full_set)
    return where(code == RECOMPUTE_CODES["full"], layer_input, partial)


def in_flight_micro_batches(plans: PlanArrays) -> Num:
    """Micro-batches whose activations stage 0 holds: min(p, m) under 1F1B, times the
    interleaving factor 1 + (p−1)/(p·v) when v > 1 (Korthikanti et al. 2022, §4.2.3)."""
    p = as_float(plans.pp)
    in_flight = minimum(p, as_float(plans.micro_batches))
    return in_flight * where(plans.vpp > 1, 1.0 + (p - 1.0) / (p * plans.vpp), 1.0)


@dataclass(frozen=True)
class MemoryArrays:
    """Per-GPU bytes by MEMORY_COMPONENTS name, for the stage that needs the most."""

    weights: Num
    gradients: Num
    optimizer_states: Num
    activations: Num
    buffers: Num
    overhead: Num

    def as_dict(self) -> dict[str, Num]:
        return dict(self.__dict__)


def memory_breakdown(
    model: TransformerSpec,
    cluster: Cluster,
    plans: PlanArrays,
    params: LocalParams | None = None,
) -> MemoryArrays:
    """Weights, grads, optimizer (ZeRO), activations (in-flight micro-batches), buffers
    (FSDP all-gather of two units with prefetch, logits), and the cluster's fixed overhead.
    `params` may pass `local_params(model, plans)` when the caller has it already."""
    params = params if params is not None else local_params(model, plans)
    d_dense, d_expert = shard_divisors(plans)
    states_dense = model_state_bytes(params.dense, d_dense, plans.sharding)
    states_expert = model_state_bytes(params.expert, d_expert, plans.sharding)

    n_stage = stage_layers(model, plans)
    full_set, selective_set, layer_input = _activation_sets(model, plans)
    per_layer = _saved_per_layer(plans, full_set, selective_set, layer_input)
    # Under full recompute one layer's activations are rebuilt at a time during backward.
    working = where(plans.recompute == RECOMPUTE_CODES["full"], full_set, 0.0)
    stage0 = per_layer * n_stage * in_flight_micro_batches(plans) + working

    tokens = plans.micro_batch * model.seq_len / as_float(plans.cp)
    logits = tokens * model.vocab / as_float(plans.tp) * LOGITS_BYTES
    last_stage = per_layer * n_stage + working + logits
    logits_extra = where(plans.pp == 1, logits, maximum(last_stage - stage0, 0.0))

    zero3 = plans.sharding == SHARDING_CODES["zero3"]
    unit_bytes = WEIGHT_BYTES * minimum(2.0 * params.layer, params.total)
    # The gathered unit lacks (1 - 1/d) of each part: dense weights shard over d_dense,
    # routed experts over d_expert (ZeRO paper, Rajbhandari et al. 2020, Sec. 5.3).
    expert_share = params.expert / params.total
    missing = (1.0 - expert_share) * (1.0 - 1.0 / d_dense) + expert_share * (1.0 - 1.0 / d_expert)
    gather = where(zero3, unit_bytes * missing, 0.0)
    return MemoryArrays(
        weights=states_dense.weights + states_expert.weights,
        gradients=states_dense.gradients + states_expert.gradients,
        optimizer_states=states_dense.optimizer + states_expert.optimizer,
        activations=stage0,
        buffers=gather + logits_extra,
        overhead=full_like(stage0, cluster.memory_overhead_gb * 1e9),
    )
