"""PlanArrays: many Plans as parallel numpy columns, so one estimator call evaluates them all.

Categoricals are coded as small ints (see the *_CODES tables); every column broadcasts.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass, fields
from typing import Any

import numpy as np
from numpy.typing import ArrayLike, NDArray

from shardmeter.estimate._xp import Num, maximum, where
from shardmeter.specs.plan import Plan

IntArray = NDArray[np.int64]
BoolArray = NDArray[np.bool_]

SHARDING_CODES: dict[str, int] = {"none": 0, "zero1": 1, "zero2": 2, "zero3": 3}
RECOMPUTE_CODES: dict[str, int] = {"none": 0, "selective": 1, "full": 2}
PRECISION_CODES: dict[str, int] = {"bf16": 0, "fp16": 1, "fp8": 2}
ATTENTION_CODES: dict[str, int] = {"flash": 0, "unfused": 1, "cudnn": 2}
OPTIMIZER_CODES: dict[str, int] = {
    "adamw": 0, "adamw8bit": 1, "adamw4bit": 2, "paged_adamw": 3, "paged_adamw8bit": 4,
    "adafactor": 5, "sgd": 6, "muon": 7,
}  # fmt: skip
MASTER_CODES: dict[str, int] = {"fp32": 0, "remainder": 1, "none": 2}
# every code >= "optimizer" keeps the optimizer states on the host (step.py, memory.py)
OFFLOAD_CODES: dict[str, int] = {
    "none": 0, "optimizer": 1, "params+optimizer": 2, "grads+optimizer": 3,
}  # fmt: skip

_BOOL_FIELDS = (
    "sp", "overlap_dp", "overlap_param_gather", "overlap_tp", "fused_ce", "gather_matrix",
    "overlap_ep", "ep_fp8", "ep_dedup", "graphs", "master_remainder", "compiled",
    "fused_elementwise", "params_fp32", "pp_end_chunks", "recompute_act", "recompute_norm",
    "recompute_qkv", "reshard_after_forward", "fp8_te", "op_sac", "ce_eager", "ce_compiled",
    "grad_fp32", "optimizer_in_backward", "sp_gathered_inputs", "pp_keeps_outputs",
    "offload_activations", "recompute_mlp_up", "fp8_rowwise", "tp_async", "eager_squared_relu",
)  # fmt: skip


_DTYPES: dict[str, Any] = {**{name: np.bool_ for name in _BOOL_FIELDS}, "ep_imbalance": np.float64}


def plan_columns(plan: Plan) -> dict[str, Any]:
    """Every column's entry for one Plan: categoricals as codes, derived flags and stage layer
    counts (-1 where the split is even), else the Plan attribute of that name."""
    first, mid, last = plan.stage_layer_counts
    derived: dict[str, Any] = {
        "sharding": SHARDING_CODES[plan.sharding],
        "recompute": RECOMPUTE_CODES[plan.recompute],
        "precision": PRECISION_CODES[plan.precision],
        "attention": ATTENTION_CODES[plan.attention],
        "gather_matrix": plan.gather_unit == "matrix",
        "ep_fp8": plan.ep_dispatch == "fp8",
        "pp_first": first,
        "pp_mid": mid,
        "pp_last": last,
        "ep_imbalance": plan.ep_imbalance or 0.0,
        "master_remainder": plan.master_weights == "remainder",
        "params_fp32": plan.param_dtype == "fp32",
        "vpp_group": plan.vpp_group or 0,
        "optimizer": OPTIMIZER_CODES[plan.optimizer],
        "master": MASTER_CODES[plan.master_weights],
        "offload": OFFLOAD_CODES[plan.offload],
        "fp8_te": plan.fp8_recipe == "te",
        "fp8_rowwise": plan.fp8_scaling == "rowwise",
        "op_sac": plan.selective_policy == "torchtitan_op",
        "ce_eager": plan.ce_upcast == "eager",
        "ce_compiled": plan.ce_upcast == "compiled",
        "grad_fp32": plan.grad_accum_dtype == "fp32",
        "recompute_every": plan.recompute_every or 0,
    }
    return {
        f.name: derived[f.name] if f.name in derived else getattr(plan, f.name)
        for f in fields(PlanArrays)
    }


@dataclass(frozen=True)
class PlanArrays:
    """Columns of plans. `shard_group` is the ZeRO/FSDP group (1 when sharding is none)."""

    dp: IntArray
    tp: IntArray
    pp: IntArray
    cp: IntArray
    ep: IntArray
    vpp: IntArray
    sp: BoolArray
    sharding: IntArray  # 0 none, 1 zero1, 2 zero2, 3 zero3
    shard_group: IntArray
    micro_batch: IntArray
    global_batch: IntArray
    recompute: IntArray  # 0 none, 1 selective, 2 full
    precision: IntArray  # 0 bf16, 1 fp16, 2 fp8
    overlap_dp: BoolArray
    overlap_param_gather: BoolArray
    overlap_tp: BoolArray
    attention: Any = 0  # 0 flash (FlashAttention-2), 1 unfused (scores through HBM), 2 cudnn
    fused_ce: Any = False  # fused cross-entropy (no fp32 logits copy)
    gather_matrix: Any = False  # ZeRO-3 gathers one weight matrix at a time (not a layer)
    overlap_ep: Any = False  # expert all-to-alls hidden under compute
    ep_fp8: Any = False  # FP8 token dispatch (combine bf16)
    ep_dedup: Any = False  # one copy per token and destination node
    graphs: Any = False  # no per-kernel host launch (CUDA graphs / XLA)
    pp_first: Any = -1  # layers on the first stage (-1: even split)
    pp_mid: Any = -1  # layers on the fullest middle stage (-1: even split of the rest)
    pp_last: Any = -1  # layers on the last stage (-1: even split)
    ep_imbalance: Any = 0.0  # busiest EP rank / mean (0: uniform-routing statistics)
    master_remainder: Any = False  # 16-bit remainders instead of an fp32 master copy
    compiled: Any = False  # the step is one compiled graph: recompute skips dead work
    fused_elementwise: Any = True  # norms, activation, RoPE fused (else eager op by op)
    eager_squared_relu: Any = False  # squared ReLU as eager relu then pow (NeMo, Megatron-Bridge)
    params_fp32: Any = False  # fp32 weights cast to bf16 at each use (autocast), gathered fp32
    pp_end_chunks: Any = False  # lighter end stages lose their end chunks' layers
    vpp_group: Any = 0  # micro-batches per chunk group N of the interleaved schedule (0: pp)
    recompute_act: Any = False  # activation-function output recomputed in backward
    recompute_norm: Any = False  # norm outputs (GEMM inputs) recomputed in backward
    recompute_qkv: Any = False  # Q, K, V re-projected in backward (MLA: from the latents)
    recompute_mlp_up: Any = False  # MLP up projection re-run in backward, its outputs not kept
    optimizer: Any = 0  # OPTIMIZER_CODES
    master: Any = 0  # MASTER_CODES: fp32 master copy, 16-bit remainder, none (pure bf16)
    offload: Any = 0  # OFFLOAD_CODES: none, optimizer, params+optimizer, grads+optimizer
    reshard_after_forward: Any = True  # False: gathered weights kept between micro-batches
    fp8_te: Any = True  # FP8 saves its GEMM inputs as 1-byte casts (Transformer Engine)
    recompute_every: Any = 0  # full recompute of every N-th layer only (0: every layer)
    op_sac: Any = False  # selective = torchtitan's per-op policy (else Megatron's set)
    ce_eager: Any = False  # loss upcasts the logits to fp32, eager log-softmax and NLL
    ce_compiled: Any = False  # loss upcasts the logits to fp32 in one compiled kernel
    grad_fp32: Any = False  # gradients accumulate in an fp32 buffer (Megatron main_grad)
    optimizer_in_backward: Any = False  # step fused into backward: one gradient live at a time
    sp_gathered_inputs: Any = False  # with sp: the GEMMs save their all-gathered input
    pp_keeps_outputs: Any = False  # each stage keeps its output per micro-batch in flight
    offload_activations: Any = False  # kept activations moved to host memory and back
    fp8_rowwise: Any = False  # FP8 scales per row along each GEMM's K axis (else per tensor)
    tp_async: Any = False  # async TP: each TP collective hidden behind its own decomposed GEMM

    @property
    def chunk_group(self) -> Num:
        """N, micro-batches per chunk group of the interleaved schedule: `vpp_group`, else pp."""
        return where(self.vpp_group > 0, self.vpp_group, self.pp)

    @classmethod
    def from_columns(cls, **columns: ArrayLike) -> PlanArrays:
        """Build from keyword columns (missing ones take Plan's defaults; a missing
        shard_group is dp for sharded plans, as `Plan.shard_group`), broadcast together."""
        default = plan_columns(Plan())
        values: dict[str, ArrayLike] = {}
        for f in fields(cls):
            if f.name in columns:
                values[f.name] = columns.pop(f.name)
            elif f.name == "shard_group":
                values[f.name] = -1  # filled below: dp when sharded, else 1
            else:
                values[f.name] = default[f.name]
        if columns:
            raise TypeError(f"unknown PlanArrays columns: {sorted(columns)}")
        arrays = np.broadcast_arrays(*(np.asarray(v) for v in values.values()))
        typed: dict[str, Any] = {
            name: arr.astype(_DTYPES.get(name, np.int64))
            for name, arr in zip(values, arrays, strict=True)
        }
        if np.any(typed["shard_group"] < 0):
            full = np.where(typed["sharding"] > 0, typed["dp"], 1)
            typed["shard_group"] = np.where(typed["shard_group"] < 0, full, typed["shard_group"])
        return cls(**typed)

    @classmethod
    def from_plans(cls, plans: Sequence[Plan]) -> PlanArrays:
        """One column entry per Plan, in order."""
        cols: dict[str, list[int | bool]] = {f.name: [] for f in fields(cls)}
        for plan in plans:
            for name, value in plan_columns(plan).items():
                cols[name].append(value)
        return cls.from_columns(**{k: np.asarray(v) for k, v in cols.items()})

    @classmethod
    def from_plan(cls, plan: Plan) -> PlanArrays:
        return cls.from_plans([plan])

    @classmethod
    def scalar(cls, plan: Plan) -> PlanArrays:
        """One plan as Python scalars: the same formulas, without numpy's per-call overhead."""
        return cls(**plan_columns(plan))

    @property
    def shape(self) -> tuple[int, ...]:
        """Broadcast shape of all columns (a column may be a scalar or a (1, R) row)."""
        return tuple(np.broadcast_shapes(*(np.shape(getattr(self, f.name)) for f in fields(self))))

    @property
    def n_gpus(self) -> IntArray:
        return self.dp * self.tp * self.pp * self.cp

    @property
    def micro_batches(self) -> IntArray:
        """Micro-batches per pipeline per step (gradient-accumulation steps), at least 1."""
        return maximum(self.global_batch // (self.dp * self.micro_batch), 1)

    def take(self, index: int) -> PlanArrays:
        """The plan at flat position `index`, as a one-element PlanArrays."""
        shape = self.shape
        return PlanArrays(
            **{
                f.name: np.broadcast_to(getattr(self, f.name), shape).reshape(-1)[index : index + 1]
                for f in fields(self)
            }
        )
