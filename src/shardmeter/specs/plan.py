"""Plan: how one island splits the work (parallel degrees, batch, sharding, recompute, overlap)."""

from __future__ import annotations

from typing import Literal

from pydantic import BaseModel, ConfigDict, Field

from shardmeter.errors import UserInputError
from shardmeter.specs.model import TransformerSpec

Sharding = Literal["none", "zero1", "zero2", "zero3"]
Recompute = Literal["none", "selective", "full"]
Precision = Literal["bf16", "fp16", "fp8"]


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


def validate_plan(plan: Plan, model: TransformerSpec, n_gpus: int | None = None) -> None:
    """Raise UserInputError for combinations no framework can run."""
    if n_gpus is not None and plan.n_gpus != n_gpus:
        raise UserInputError(
            "plan",
            f"dp*tp*pp*cp = {plan.dp}*{plan.tp}*{plan.pp}*{plan.cp} = {plan.n_gpus}",
            f"must equal the GPU count {n_gpus}",
        )
    if model.n_heads % plan.tp:
        raise UserInputError("plan.tp", plan.tp, f"must divide n_heads = {model.n_heads}")
    if model.n_layers % (plan.pp * plan.vpp):
        raise UserInputError(
            "plan.pp",
            plan.pp,
            f"pp*vpp = {plan.pp * plan.vpp} must divide n_layers = {model.n_layers}",
        )
    if plan.vpp > 1 and plan.pp == 1:
        raise UserInputError("plan.vpp", plan.vpp, "interleaving needs pp > 1")
    if model.seq_len % plan.cp:
        raise UserInputError("plan.cp", plan.cp, f"must divide seq_len = {model.seq_len}")
    if plan.ep > 1 and model.moe is None:
        raise UserInputError("plan.ep", plan.ep, "expert parallelism needs an MoE model (ep = 1)")
    if model.moe is not None and model.moe.experts % plan.ep:
        raise UserInputError("plan.ep", plan.ep, f"must divide experts = {model.moe.experts}")
    if plan.dp % plan.ep:
        raise UserInputError("plan.ep", plan.ep, f"must divide dp = {plan.dp}")
    if plan.global_batch % (plan.dp * plan.micro_batch):
        raise UserInputError(
            "plan.global_batch",
            plan.global_batch,
            f"must be a multiple of dp*micro_batch = {plan.dp * plan.micro_batch}",
        )
    if plan.vpp > 1 and plan.micro_batches % plan.pp:
        raise UserInputError(
            "plan.global_batch",
            plan.global_batch,
            f"interleaved schedules need micro-batches ({plan.micro_batches}) divisible by pp = {plan.pp}",
        )
    if plan.shard_degree is not None:
        if plan.sharding == "none":
            raise UserInputError("plan.shard_degree", plan.shard_degree, "needs sharding zero1/2/3")
        if plan.dp % plan.shard_degree:
            raise UserInputError(
                "plan.shard_degree", plan.shard_degree, f"must divide dp = {plan.dp}"
            )
