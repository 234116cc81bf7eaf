"""Training frameworks as configuration: what each stack turns on when a plan leaves it blank.

A framework is a closed identifier (`FRAMEWORKS`) for one software stack and era. Each entry
lists, with its source, the defaults its documentation or reference recipes use: the
distributed optimizer (ZeRO stage), recomputation, TP/DP/parameter-gather overlap, fused or
unfused attention, fused cross-entropy, interleaving when PP > 1, expert dispatch and whether
kernels are replayed from CUDA graphs or an XLA executable. These are *configuration*: a plan
field the user states always wins, and there are no per-framework efficiency factors.
Unknown names are an error (`resolve_framework`), never a substring guess.
"""

from __future__ import annotations

import re
from typing import Any, Literal

from pydantic import BaseModel, ConfigDict

from shardmeter.errors import UserInputError

Sharding = Literal["none", "zero1", "zero2", "zero3"]
Recompute = Literal["none", "selective", "full"]
Attention = Literal["flash", "cudnn", "unfused"]
GatherUnit = Literal["layer", "matrix"]
MasterWeights = Literal["fp32", "remainder", "none"]
Dispatch = Literal["bf16", "fp8"]
ParamDtype = Literal["bf16", "fp32"]


class Framework(BaseModel):
    """Defaults one training stack applies to plan fields a run does not state."""

    model_config = ConfigDict(frozen=True, extra="forbid")

    name: str
    era: str  # release or years the defaults describe
    sharding: Sharding  # ZeRO stage of its optimizer (zero1 = distributed optimizer)
    recompute: Recompute
    overlap_dp: bool  # gradient reduce overlapped with backward
    overlap_param_gather: bool  # ZeRO/FSDP parameter all-gathers prefetched under compute
    overlap_tp: bool  # TP collectives overlapped with GEMMs (applies when tp > 1)
    tp_async: bool = False  # async TP: each collective decomposed with its own GEMM (tp > 1)
    sp: bool  # sequence parallelism with TP (applies when tp > 1)
    # flash (FlashAttention-2 kernels), cudnn (cuDNN fused attention / FlashAttention-3: the
    # chip's native tensor-core instructions) or unfused (scores through HBM)
    attention: Attention
    fused_ce: bool  # cross-entropy fused with the softmax (no fp32 logits copy)
    vpp: int = 1  # virtual pipeline chunks per rank when pp > 1 (1 = plain 1F1B)
    gather_unit: GatherUnit = "layer"  # what one ZeRO-3 all-gather fetches
    overlap_ep: bool = False  # expert all-to-all overlapped with compute (DualPipe)
    ep_dispatch: Dispatch = "bf16"  # token dispatch precision (combine stays bf16)
    ep_dedup: bool = False  # one copy per token and destination node (node-level dispatch)
    graphs: bool = False  # kernels replayed from CUDA graphs / an XLA executable
    compiled: bool = False  # the whole step is one compiled graph (dead code eliminated)
    master_weights: MasterWeights = "fp32"  # fp32 master copy, or its 16-bit remainder
    fused_elementwise: bool = True  # norms, activation and RoPE one kernel each (else eager)
    eager_squared_relu: bool = False  # squared ReLU as eager relu then pow, outside the fused set
    compile_with_fp8: bool = False  # its FP8 recipe compiles the model (fused element-wise)
    param_dtype: ParamDtype = "bf16"  # weights the layers hold (fp32: autocast casts per use)
    pp_end_chunks: bool = False  # lighter end stages lose their end chunks' layers (PP > 1)
    recompute_act: bool = False  # activation-function output recomputed, not kept
    recompute_norm: bool = False  # norm outputs (GEMM inputs) recomputed, not kept
    recompute_qkv: bool = False  # Q, K, V re-projected (MLA: from the latents), not kept
    # with PP, FSDP keeps each stage's gathered weights between micro-batches
    # (reshard_after_forward = False) and accumulates unsharded gradients until the last one
    pp_keeps_gathered: bool = False
    # with SP, the QKV and MLP GEMMs save their all-gathered full-sequence input (DTensor SP)
    sp_gathered_inputs: bool = False
    # with PP, each stage keeps its output per micro-batch in flight until its backward
    pp_keeps_outputs: bool = False
    # FP8 training library: Transformer Engine keeps the GEMM inputs it saves as 1-byte FP8
    # casts; torchao's float8 keeps them in bf16 and casts again in backward
    fp8_recipe: Literal["te", "torchao"] = "te"
    # FP8 scaling granularity its FP8 recipe uses unless the run names another: one scale per
    # tensor (Transformer Engine's delayed and current scaling; torchao's default recipe)
    fp8_scaling: Literal["tensorwise", "rowwise"] = "tensorwise"
    # what its `selective` recompute keeps, and how its loss treats the logits (Plan fields
    # selective_policy and ce_upcast)
    selective_policy: Literal["megatron", "torchtitan_op"] = "megatron"
    ce_upcast: Literal["none", "eager", "compiled"] = "none"
    source: str


def _fw(**kw: Any) -> Framework:
    return Framework(**kw)


FRAMEWORKS: dict[str, Framework] = {
    f.name: f
    for f in (
        _fw(
            name="megatron-lm-2021",
            era="Megatron-LM v2 (2021)",
            sharding="none",
            recompute="none",
            overlap_dp=False,
            overlap_param_gather=False,
            sp=False,
            overlap_tp=False,
            attention="unfused",
            fused_ce=False,
            source="Narayanan et al. SC'21 (arXiv:2104.04473) §4 and Megatron-LM v2 arguments: "
            "local DDP all-reduces after backward, no distributed optimizer, fused "
            "scale-mask-softmax (scores in HBM), interleaving only with "
            "--num-layers-per-virtual-pipeline-stage",
        ),
        _fw(
            name="megatron-lm-2022",
            era="Megatron-LM v3 (2022)",
            sharding="none",
            recompute="none",
            overlap_dp=False,
            overlap_param_gather=False,
            sp=False,
            overlap_tp=False,
            attention="unfused",
            fused_ce=False,
            source="Korthikanti et al. 2022 (arXiv:2205.05198) §5-6: sequence parallelism and "
            "selective recompute are flags; attention still unfused (FlashAttention came to "
            "Megatron in 2023), no distributed optimizer by default",
        ),
        _fw(
            name="megatron-core",
            era="Megatron-Core 0.5+ (2024-)",
            sharding="zero1",
            recompute="none",
            overlap_dp=True,
            overlap_param_gather=True,
            sp=True,
            overlap_tp=True,
            attention="cudnn",
            fused_ce=True,
            source="Megatron-Core reference recipes: use_distributed_optimizer, "
            "overlap_grad_reduce, overlap_param_gather, tp_comm_overlap with TP+SP, "
            "Transformer Engine fused attention, cross_entropy_loss_fusion",
        ),
        _fw(
            name="nemo",
            era="NeMo 24.x (2024)",
            sharding="zero1",
            recompute="none",
            overlap_dp=True,
            overlap_param_gather=True,
            sp=True,
            overlap_tp=True,
            attention="cudnn",
            fused_ce=True,
            source="DGX Cloud benchmarking recipes for NeMo 24.09/24.11 (NVIDIA/dgxc-benchmarking "
            "nemo_megatron/gpt3_175b_hydra.yaml, llama3.1/pretrain_llama31.py): distributed "
            "optimizer (distributed_fused_adam, which keeps 16-bit remainders of the fp32 "
            "master weights), TP comm overlap (userbuffers), grad-reduce and param-gather "
            "overlap, TE fused attention, activations_checkpoint_granularity null, "
            "cross_entropy_loss_fusion; Nemotron's squared ReLU is NeMo's eager "
            "torch.pow(relu(x), 2) (nemo/collections/llm/fn/activation.py)",
            master_weights="remainder",
            eager_squared_relu=True,
        ),
        _fw(
            name="megatron-bridge",
            era="NeMo 25.x / Megatron-Bridge (2025)",
            sharding="zero1",
            recompute="none",
            overlap_dp=True,
            overlap_param_gather=True,
            sp=True,
            overlap_tp=True,
            attention="cudnn",
            fused_ce=True,
            source="Megatron-Bridge performance recipes (docs/performance-summary.md, 25.11): "
            "as NeMo 24.x; CUDA graphs off unless the table says CG; Nemotron's squared ReLU "
            "eager torch.pow(relu(x), 2) (models/nemotron/nemotron_bridge.py)",
            eager_squared_relu=True,
        ),
        _fw(
            name="torchtitan",
            era="torchtitan (2024-)",
            sharding="zero3",
            recompute="selective",
            overlap_dp=True,
            overlap_param_gather=True,
            sp=True,
            overlap_tp=False,
            attention="flash",
            fused_ce=False,
            fused_elementwise=False,
            compile_with_fp8=True,
            pp_keeps_gathered=True,
            sp_gathered_inputs=True,
            pp_keeps_outputs=True,
            fp8_recipe="torchao",
            selective_policy="torchtitan_op",
            ce_upcast="eager",
            source="torchtitan job config defaults (Liang et al. 2024, arXiv:2410.06511): FSDP2, "
            "activation_checkpoint.mode = selective, async TP off (enable_async_tensor_parallel = "
            "false), Float8 recipe tensorwise unless float8.recipe_name says rowwise, SDPA flash, pipeline "
            "schedule 1F1B, training.compile = false with norm_type = 'rmsnorm' (eager "
            "RMSNorm, RoPE and SwiGLU, op by op); its Float8 training runs with "
            "training.compile (docs/float8.md; the paper's Float8 rows are 'torch.compile + "
            "Float8'); with PP, apply_fsdp sets reshard_after_forward = False ('For PP, do "
            "not reshard after forward to avoid per-microbatch all-gathers'); "
            "selective_ac_option = 'op' (parallelize_llama.py _save_list: aten.mm except every "
            "second one, SDPA flash/efficient, aten.max); the loss "
            "cross_entropy(pred.flatten(0, 1).float(), ...) uncompiled in 2024 train.py ('TODO: "
            "compiling loss function causes CUDA errors'); 2025 releases compile it with "
            "training.compile (state ce_upcast = compiled)",
        ),
        _fw(
            name="llm-foundry",
            era="llm-foundry (2023-2024)",
            sharding="zero3",
            recompute="none",
            overlap_dp=True,
            overlap_param_gather=True,
            sp=False,
            overlap_tp=False,
            attention="flash",
            fused_ce=True,
            param_dtype="fp32",
            source="llm-foundry MPT yamls: FSDP FULL_SHARD, activation_checkpointing false, "
            "flash attention, loss_fn fused_crossentropy; precision amp_bf16 with Composer's "
            "FSDP mixed_precision DEFAULT (the benchmark table's 'MP Mode'), which Composer "
            "0.12-0.16 (2023, trainer/dist_strategy.py) maps to param_dtype float32, "
            "reduce_dtype bf16: fp32 weights gathered and cast by torch.autocast at each use",
        ),
        _fw(
            name="maxtext",
            era="MaxText (2024)",
            sharding="zero3",
            recompute="full",
            overlap_dp=True,
            overlap_param_gather=True,
            sp=True,
            overlap_tp=True,
            attention="flash",
            fused_ce=True,
            graphs=True,
            source="MaxText configs/base.yml: fsdp axis, remat_policy 'full', flash attention; "
            "XLA compiles the whole step (no per-kernel launch, dead code of the rematerialised "
            "forward removed) and overlaps TP collectives with matmuls (async collective fusion, "
            "collective matmul)",
            compiled=True,
        ),
        _fw(
            name="deepspeed-2021",
            era="DeepSpeed ZeRO-3 (2021)",
            sharding="zero3",
            recompute="none",
            overlap_dp=False,
            overlap_param_gather=False,
            sp=False,
            overlap_tp=False,
            attention="unfused",
            fused_ce=False,
            gather_unit="matrix",
            source="Narayanan et al. SC'21 Table 2 (ZeRO-3 baseline): parameters fetched on "
            "demand per module (stage3_max_live_parameters 1e9), no prefetch overlap; "
            "gradients reduced on the compute stream (DeepSpeed 0.3 zero/constants.py "
            "ZERO_OPTIMIZATION_OVERLAP_COMM_DEFAULT = False: stage3.py reduction_stream = "
            "current_stream, and every fetch ends in torch.cuda.synchronize()); "
            "unfused attention",
        ),
        _fw(
            name="megatron-deepspeed",
            era="Megatron-DeepSpeed (2022)",
            sharding="zero1",
            recompute="none",
            overlap_dp=False,
            overlap_param_gather=False,
            sp=False,
            overlap_tp=False,
            attention="unfused",
            fused_ce=False,
            source="BigScience Megatron-DeepSpeed (BLOOM, arXiv:2211.05100 §3.4): ZeRO stage 1, "
            "fused softmax kernels, no flash attention",
        ),
        _fw(
            name="metaseq",
            era="Metaseq (2022)",
            sharding="zero3",
            recompute="none",
            overlap_dp=True,
            overlap_param_gather=True,
            sp=False,
            overlap_tp=False,
            attention="unfused",
            fused_ce=False,
            source="OPT (Zhang et al. 2022, arXiv:2205.01068 §2.3): FSDP with Megatron TP, "
            "pre-FlashAttention kernels",
        ),
        _fw(
            name="meta-llama3",
            era="Meta Llama 3 stack (2024)",
            sharding="zero2",
            recompute="none",
            overlap_dp=True,
            overlap_param_gather=True,
            sp=True,
            overlap_tp=False,
            attention="flash",
            fused_ce=False,
            pp_end_chunks=True,
            recompute_act=True,
            source="Llama 3 paper (arXiv:2407.21783 §3.3.2): FSDP sharding optimizer states and "
            "gradients but not resharding weights after forward; interleaved 1F1B whose first "
            "chunk holds only the embedding and last only the head; no activation "
            "checkpointing at 8K. Assumed, not published: the MLP is xformers' fused SwiGLU "
            "(Meta's kernel library; xformers/ops/swiglu_op.py keeps x, x1, x2 and recomputes "
            "silu(x1)*x2 in backward)",
        ),
        _fw(
            name="deepseek-hai-llm",
            era="DeepSeek-V3 on HAI-LLM (2024)",
            sharding="zero1",
            recompute="selective",
            overlap_dp=True,
            overlap_param_gather=True,
            sp=False,
            overlap_tp=False,
            attention="flash",
            fused_ce=False,
            vpp=2,
            overlap_ep=True,
            ep_dispatch="fp8",
            ep_dedup=True,
            recompute_act=True,
            recompute_norm=True,
            recompute_qkv=True,
            source="DeepSeek-V3 report (arXiv:2412.19437 §3.2-3.3): ZeRO-1, DualPipe (two "
            "chunks per rank, all-to-all hidden under compute), node-level dispatch over IB "
            "then NVLink, FP8 dispatch / BF16 combine, RMSNorm and MLA up-projection recomputed "
            "(§3.2.3), SwiGLU inputs cached and its output recomputed (§3.3.2)",
        ),
    )
}

# Spellings seen in published tables (lower case, parentheticals removed) -> identifier.
# A full match is required; anything else is an error naming the identifiers.
SPELLINGS: tuple[tuple[str, str], ...] = (
    (r"megatron-lm", "megatron-lm-2021"),  # unversioned: the 2021 paper's stack
    (r"megatron-lm (v2\S*|2021)", "megatron-lm-2021"),
    (r"megatron-lm (v3\S*|2022)", "megatron-lm-2022"),
    (r"megatron-core( \S+)?", "megatron-core"),
    (r"nemo 2[34]\.\d+", "nemo"),
    (r"nemo 2[5-9]\.\d+", "megatron-bridge"),
    (r"megatron-bridge( \S+)?", "megatron-bridge"),
    (r"torchtitan( \S+)?", "torchtitan"),
    (r"llm-foundry( \S+)?", "llm-foundry"),
    (r"maxtext( \S+)?", "maxtext"),
    (r"deepspeed zero-3", "deepspeed-2021"),
    (r"megatron-deepspeed", "megatron-deepspeed"),
    (r"metaseq", "metaseq"),
)


def framework_id(text: str) -> str:
    """The identifier of a framework name as published (e.g. 'NeMo 24.09' -> 'nemo')."""
    low = re.sub(r"\s*\([^)]*\)", "", text.strip().lower()).strip()
    if low in FRAMEWORKS:
        return low
    for pattern, ident in SPELLINGS:
        if re.fullmatch(pattern, low):
            return ident
    raise UserInputError("framework", text, f"one of {', '.join(FRAMEWORKS)}")


def resolve_framework(text: str) -> Framework:
    """The Framework of an identifier or a published spelling (UserInputError if unknown)."""
    return FRAMEWORKS[framework_id(text)]


def framework_defaults(framework: Framework, given: dict[str, Any]) -> dict[str, Any]:
    """Plan fields the framework sets, for those `given` leaves out (TP overlap only with
    tp > 1, interleaving only with pp > 1, compiled element-wise kernels with FP8 where its
    FP8 recipe compiles)."""
    tp = int(given.get("tp") or 1)
    pp = int(given.get("pp") or 1)
    compiled_fp8 = framework.compile_with_fp8 and given.get("precision") == "fp8"
    defaults: dict[str, Any] = {
        "sharding": framework.sharding,
        "recompute": framework.recompute,
        "overlap_dp": framework.overlap_dp,
        "overlap_param_gather": framework.overlap_param_gather,
        "overlap_tp": framework.overlap_tp and tp > 1,
        "tp_async": framework.tp_async and tp > 1,
        "sp": framework.sp and tp > 1,
        "attention": framework.attention,
        "fused_ce": framework.fused_ce,
        "gather_unit": framework.gather_unit,
        "overlap_ep": framework.overlap_ep,
        "ep_dispatch": framework.ep_dispatch,
        "ep_dedup": framework.ep_dedup,
        "graphs": framework.graphs,
        "compiled": framework.compiled,
        "master_weights": framework.master_weights,
        "fused_elementwise": framework.fused_elementwise or compiled_fp8,
        "eager_squared_relu": framework.eager_squared_relu,
        "param_dtype": framework.param_dtype,
        "recompute_act": framework.recompute_act,
        "recompute_norm": framework.recompute_norm,
        "recompute_qkv": framework.recompute_qkv,
        "fp8_recipe": framework.fp8_recipe,
        "fp8_scaling": framework.fp8_scaling,
        "selective_policy": framework.selective_policy,
        "ce_upcast": framework.ce_upcast,
        "sp_gathered_inputs": framework.sp_gathered_inputs and tp > 1,
    }
    if pp > 1:
        defaults["vpp"] = framework.vpp
        defaults["pp_end_chunks"] = framework.pp_end_chunks
        defaults["reshard_after_forward"] = not framework.pp_keeps_gathered
        defaults["pp_keeps_outputs"] = framework.pp_keeps_outputs
    return {k: v for k, v in defaults.items() if given.get(k) is None}
