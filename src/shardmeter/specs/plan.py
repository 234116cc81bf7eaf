"""Plan: how one island splits the work (parallel degrees, batch, sharding, recompute, overlap).

A plan may name its `framework` (see `shardmeter.specs.framework`): fields it leaves out then
take that framework's documented defaults; fields it states always win.
"""

from __future__ import annotations

from typing import Any, Literal

from pydantic import BaseModel, ConfigDict, Field, model_validator

from shardmeter.errors import UserInputError
from shardmeter.specs.framework import (
    Attention,
    Dispatch,
    GatherUnit,
    MasterWeights,
    ParamDtype,
    framework_defaults,
    framework_id,
    resolve_framework,
)
from shardmeter.specs.model import TransformerSpec
from shardmeter.specs.rules import first_broken

Sharding = Literal["none", "zero1", "zero2", "zero3"]
Recompute = Literal["none", "selective", "full"]
Precision = Literal["bf16", "fp16", "fp8"]
# --- memory setups (optimizer, offload); bytes per parameter in estimate/memory.py ---
Optimizer = Literal[
    "adamw", "adamw8bit", "adamw4bit", "paged_adamw", "paged_adamw8bit", "adafactor", "sgd",
    "muon",
]  # fmt: skip
Offload = Literal["none", "optimizer", "grads+optimizer", "params+optimizer"]
Fp8Recipe = Literal["te", "torchao"]
Fp8Scaling = Literal["tensorwise", "rowwise"]
SelectivePolicy = Literal["megatron", "torchtitan_op"]
CeUpcast = Literal["none", "eager", "compiled"]
GradAccumDtype = Literal["bf16", "fp32"]


class Plan(BaseModel):
    """Parallel layout inside one island. Degrees multiply to the island's GPU count.

    Conventions follow the calibration schema: experts are folded into data parallelism
    (tp·pp·cp·dp = GPUs and ep divides dp), `shard_degree` is the HSDP sharding-group size.
    """

    model_config = ConfigDict(frozen=True, extra="forbid", allow_inf_nan=False)

    dp: int = Field(default=1, ge=1)
    tp: int = Field(default=1, ge=1)
    pp: int = Field(default=1, ge=1)
    cp: int = Field(default=1, ge=1)
    ep: int = Field(default=1, ge=1)
    vpp: int = Field(default=1, ge=1)  # virtual pipeline chunks per rank (1 = plain 1F1B)
    sp: bool = False  # Megatron sequence parallelism (needs tp > 1 to matter)
    sharding: Sharding = "none"
    shard_degree: int | None = Field(default=None, ge=1)  # HSDP group; None = all of dp
    micro_batch: int = Field(default=1, ge=1)  # sequences per micro-batch per model replica
    global_batch: int = Field(default=1, ge=1)  # sequences per optimizer step
    recompute: Recompute = "none"
    precision: Precision = "bf16"
    overlap_dp: bool = True  # overlap gradient reduce with backward
    overlap_param_gather: bool = True  # prefetch FSDP/ZeRO parameter all-gathers
    overlap_tp: bool = False  # overlap TP collectives with GEMMs (comm-GEMM overlap)
    # async TP (torch _micro_pipeline_tp, torchtitan enable_async_tensor_parallel): each TP
    # collective decomposed with the one GEMM that reads its output or writes its input, and
    # hidden behind that GEMM only (the decomposed GEMMs run as tp row blocks)
    tp_async: bool = False
    # fused FlashAttention-2 kernels ("flash"), cuDNN fused attention or FlashAttention-3 with
    # the chip's native tensor-core instructions ("cudnn"), or "unfused": scores and softmax
    # through HBM
    attention: Attention = "flash"
    fused_ce: bool = False  # cross-entropy fused with the softmax: no fp32 copy of the logits
    gather_unit: GatherUnit = "layer"  # ZeRO-3 fetches one layer (FSDP) or one weight matrix
    overlap_ep: bool = False  # expert all-to-alls overlapped with compute (DualPipe-style)
    ep_dispatch: Dispatch = "bf16"  # token dispatch precision; the combine is always bf16
    ep_dedup: bool = False  # one copy per token and destination node, fanned out over NVLink
    # busiest expert-parallel rank's tokens over the mean (1 = forced balance); None = the
    # expected maximum under uniform routing
    ep_imbalance: float | None = Field(default=None, ge=1)
    graphs: bool = False  # kernels replayed from CUDA graphs / XLA: no per-kernel host launch
    compiled: bool = False  # one compiled graph (XLA): recompute drops what backward never uses
    # Adam's fp32 master copy (4 B/param), or its 16-bit remainder over the bf16 weights (2 B;
    # apex DistributedFusedAdam / TE FusedAdam store_param_remainders)
    master_weights: MasterWeights = "fp32"
    # norms, activation function and RoPE as one kernel each (fused kernels, torch.compile,
    # XLA); False: eager PyTorch, op by op through HBM (e.g. RMSNorm in fp32 in 7 kernels)
    fused_elementwise: bool = True
    # squared ReLU (mlp = "relu2") as eager relu then pow even where the rest is fused (NeMo's
    # and Megatron-Bridge's `squared_relu`)
    eager_squared_relu: bool = False
    # dtype of the weights the layers hold between optimizer steps: bf16 (the optimizer writes
    # a 16-bit copy), or fp32 under torch.autocast, which casts every weight to bf16 at each
    # use and gathers fp32 under ZeRO-3 (FSDP MixedPrecision param_dtype=float32)
    param_dtype: ParamDtype = "bf16"
    pp_first: int | None = Field(default=None, ge=0)  # layers on the first stage (None: even)
    pp_last: int | None = Field(default=None, ge=0)  # layers on the last stage (None: even)
    pp_layers: tuple[int, ...] | None = None  # explicit layers per stage (overrides the two)
    # A lighter first/last stage loses its layers from its end chunks: the first chunk holds
    # only the embedding, the last only the head (Llama 3 paper §3.3.2; Megatron-Core
    # account_for_embedding/loss_in_pipeline_split). False: spread over the stage's v chunks
    # (Megatron-Core decoder_first/last_pipeline_num_layers).
    pp_end_chunks: bool = False
    # N, micro-batches run back to back per chunk in the interleaved schedule (Megatron-Core
    # microbatch_group_size_per_vp_stage, the Llama 3 schedule's tunable N); None = pp
    vpp_group: int | None = Field(default=None, ge=1)
    # the activation-function output (SwiGLU/GELU) is recomputed from its saved input in
    # backward (xformers' fused SwiGLU; DeepSeek-V3 §3.3.2), not kept
    recompute_act: bool = False
    # the norm outputs (the GEMM inputs) are recomputed from the saved norm inputs in backward
    # (Megatron-Core recompute_modules "layernorm"; DeepSeek-V3 §3.2.3), not kept
    recompute_norm: bool = False
    # Q, K and V are re-projected in backward from the projection's input, not kept: with MLA
    # from the compressed latents, which are kept instead (DeepSeek-V3 §3.2.3 "MLA
    # up-projections"; Megatron-Core recompute_modules "mla_up_proj"); otherwise from the QKV
    # GEMM input, which is kept anyway
    recompute_qkv: bool = False
    # the MLP up projection (gate and up GEMMs of SwiGLU, the first GEMM of GELU) is re-run in
    # backward from its kept input, and its outputs are not kept (MaxText remat policy
    # "save_dot_except_mlpwi": every dot saved but `mlpwi`); with `selective` recompute
    recompute_mlp_up: bool = False
    # the activations the recompute mode keeps are moved to host memory in forward and back
    # in backward over the host link (MaxText remat_policy "minimal_offloaded": JAX
    # save_and_offload_only_these_names with offload_dst "pinned_host")
    offload_activations: bool = False
    framework: str | None = None  # identifier whose defaults filled the unstated fields
    # --- memory setups: what the optimizer keeps and where (estimate/memory.py cites each
    # byte count). `master_weights = "none"` (pure bf16) keeps the states in the weights' dtype.
    optimizer: Optimizer = "adamw"
    # optimizer states on the host; "grads+optimizer" also the gradients (DeepSpeed ZeRO-Offload);
    # "params+optimizer" also the weights and gradients (FSDP CPUOffload, ZeRO-Infinity)
    offload: Offload = "none"
    # ZeRO-3/FSDP frees each unit's gathered weights after its forward (FSDP2 argument of the
    # same name); False keeps them until backward, and with PP micro-batches also keeps
    # unsharded gradients until the last one (torch.distributed.pipelining skips the gradient
    # reduce-scatter before the last backward)
    reshard_after_forward: bool = True
    # which tensors FP8 runs save: "te" (Transformer Engine) the GEMM inputs as 1-byte FP8
    # casts; "torchao" (torchao.float8, torchtitan) bf16 as without FP8
    fp8_recipe: Fp8Recipe = "te"
    # FP8 scaling granularity (torchao Float8LinearConfig.from_recipe_name): one scale per
    # tensor ("tensorwise"), or one per row along each GEMM's K axis ("rowwise"), which casts
    # every operand once per GEMM that reads it and, in torchtitan, gathers TP inputs in bf16
    fp8_scaling: Fp8Scaling = "tensorwise"
    # with recompute = "full": checkpoint only every N-th layer (torchtitan
    # activation_checkpoint.selective_ac_option = "N"); the others keep all they save
    recompute_every: int | None = Field(default=None, ge=1)
    # what recompute = "selective" keeps (estimate/memory.py lists each set): "megatron"
    # (Korthikanti et al. 2022: everything but the attention core and the activation output)
    # or "torchtitan_op" (torchtitan's per-op policy: the outputs of every other matmul and of
    # SDPA, the rest recomputed from the layer input)
    selective_policy: SelectivePolicy = "megatron"
    # the loss upcasts the logits to fp32 before F.cross_entropy (`pred.float()`): "eager"
    # (log-softmax and NLL op by op, fp32 tensors the size of the logits) or "compiled" (one
    # inductor kernel from the bf16 logits); "none": the framework's own mixed-precision loss
    ce_upcast: CeUpcast = "none"
    # dtype of the gradient buffer backward accumulates into: "fp32" is Megatron's main_grad
    # buffer (--accumulate-allreduce-grads-in-fp32, forced on with --bf16), 4 B per parameter,
    # which ZeRO-1's distributed optimizer does not shard; "bf16" the parameters' dtype
    grad_accum_dtype: GradAccumDtype = "bf16"
    # with sp: the column-parallel GEMMs save their all-gathered, full-sequence input (DTensor
    # sequence parallelism, torchtitan: the Shard(1) -> Replicate redistribute feeds the
    # matmul, which saves it) instead of the sequence shard Megatron saves and gathers again
    # in backward (Korthikanti et al. 2022 §4.2.2)
    sp_gathered_inputs: bool = False
    # with PP: each stage keeps its output of every micro-batch in flight until that
    # micro-batch's backward (torch.distributed.pipelining stage.py forward_one_chunk:
    # `fwd_cache[chunk] = (output_tuple, inputs)`, torchtitan), where Megatron-LM frees the
    # output's data once sent (schedules.py deallocate_output_tensor; arguments.py sets
    # deallocate_pipeline_outputs = True)
    pp_keeps_outputs: bool = False
    # the optimizer step runs inside backward, parameter by parameter, and frees each
    # gradient once applied (torchtune optimizer_in_bwd; PyTorch's
    # register_post_accumulate_grad_hook recipe): at most one parameter's gradient is live
    optimizer_in_backward: bool = False

    @model_validator(mode="before")
    @classmethod
    def _framework_defaults(cls, data: Any) -> Any:
        """Fill fields the input leaves out from its framework's documented defaults."""
        if not isinstance(data, dict) or data.get("framework") in (None, ""):
            return data
        framework = resolve_framework(str(data["framework"]))
        filled = {**data, "framework": framework_id(str(data["framework"]))}
        filled.update(framework_defaults(framework, data))
        return filled

    @model_validator(mode="after")
    def _memory_setup_rules(self) -> Plan:
        """recompute_every only qualifies full recompute (which layers are checkpointed)."""
        if self.recompute_every is not None and self.recompute != "full":
            raise ValueError(f"recompute_every needs recompute = 'full', not '{self.recompute}'")
        return self

    @property
    def n_gpus(self) -> int:
        return self.dp * self.tp * self.pp * self.cp

    @property
    def shard_group(self) -> int:
        """GPUs a sharded state is split over (ZeRO/FSDP), = dp unless HSDP limits it."""
        if self.sharding == "none":
            return 1
        return self.shard_degree if self.shard_degree is not None else self.dp

    @property
    def micro_batches(self) -> int:
        """Micro-batches per step per pipeline (gradient accumulation steps × pipeline fill)."""
        return self.global_batch // (self.dp * self.micro_batch)

    @property
    def stage_layer_counts(self) -> tuple[int, int, int]:
        """(first, fullest middle, last) stage layer counts as stated; -1 where the split is
        even (resolved against the model by the estimator)."""
        if self.pp_layers is not None:
            middle = self.pp_layers[1:-1]
            return self.pp_layers[0], max(middle) if middle else -1, self.pp_layers[-1]
        first = -1 if self.pp_first is None else self.pp_first
        last = -1 if self.pp_last is None else self.pp_last
        return first, -1, last


def validate_plan(plan: Plan, model: TransformerSpec, n_gpus: int | None = None) -> None:
    """Raise UserInputError for combinations no framework can run: the GPU count, then the
    first rule of `shardmeter.specs.rules.RULES` the plan breaks (a `PlanRuleError`)."""
    if n_gpus is not None and plan.n_gpus != n_gpus:
        raise UserInputError(
            "plan",
            f"dp*tp*pp*cp = {plan.dp}*{plan.tp}*{plan.pp}*{plan.cp} = {plan.n_gpus}",
            f"must equal the GPU count {n_gpus}",
        )
    broken = first_broken(plan, model)
    if broken is not None:
        raise broken
