"""What the planner may choose (search dimensions) and what a plan must meet (constraints).

`SpaceOptions` bounds the inner plan of one island (design doc C.11); `OuterOptions` the
choices across islands; `Constraints` the deadline, the dollar budget and the memory headroom.
Every check raises a one-line `UserInputError` naming the field.
"""

from __future__ import annotations

from dataclasses import dataclass

from shardmeter.errors import UserInputError
from shardmeter.estimate.outer import MODES
from shardmeter.specs.framework import framework_id

PRECISIONS: tuple[str, ...] = ("bf16", "fp16", "fp8")
RECOMPUTES: tuple[str, ...] = ("none", "selective", "full")
SHARDINGS: tuple[str, ...] = ("none", "zero1", "zero2", "zero3")
BITS: tuple[int, ...] = (32, 16, 8, 4)


def _subset(field: str, values: tuple[str, ...], allowed: tuple[str, ...]) -> None:
    if not values:
        raise UserInputError(field, values, f"give at least one of {', '.join(allowed)}")
    for v in values:
        if v not in allowed:
            raise UserInputError(field, v, f"allowed: {', '.join(allowed)}")


def _positive(field: str, values: tuple[int, ...]) -> None:
    if not values or any(int(v) != v or v < 1 for v in values):
        raise UserInputError(field, values, "a non-empty list of positive integers")


@dataclass(frozen=True)
class SpaceOptions:
    """Inner-plan dimensions. `None` limits default to the hardware and the model.

    max_tp defaults to the NVLink domain (TP over NICs is never faster in the model: its
    per-layer collectives sit on the critical path); max_pp to n_layers. SP is on whenever
    tp > 1 because it never costs time or memory in the estimator (same TP bytes, norm and
    pipeline work split by tp); the DP/FSDP overlap flags are on for the same reason.
    """

    precisions: tuple[str, ...] = ("bf16",)
    recompute: tuple[str, ...] = RECOMPUTES
    sharding: tuple[str, ...] = SHARDINGS
    micro_batches: tuple[int, ...] = (1, 2, 4, 8, 16)
    max_tp: int | None = None
    max_pp: int | None = None
    max_vpp: int = 8
    max_cp: int = 16
    max_ep: int = 64
    hsdp: bool = True  # also try shard groups smaller than dp (powers of two)
    uneven_layers: bool = True  # pp need not divide n_layers (vpp = 1 only)
    overlap_tp: bool = False  # the framework overlaps TP collectives with GEMMs
    # plan for this framework: its defaults set the features the search does not vary
    # (attention kernel, fused cross-entropy, launches, DP overlap, expert dispatch, ...)
    framework: str | None = None

    def __post_init__(self) -> None:
        if self.framework is not None:
            object.__setattr__(self, "framework", framework_id(self.framework))
        _subset("precision", self.precisions, PRECISIONS)
        _subset("recompute", self.recompute, RECOMPUTES)
        _subset("sharding", self.sharding, SHARDINGS)
        _positive("micro_batch", self.micro_batches)
        for name in ("max_tp", "max_pp", "max_vpp", "max_cp", "max_ep"):
            value = getattr(self, name)
            if value is not None and value < 1:
                raise UserInputError(name, value, "must be a positive integer")


@dataclass(frozen=True)
class OuterOptions:
    """Choices across islands. Empty tuples mean "the topology file's value"."""

    modes: tuple[str, ...] = MODES
    inner_steps: tuple[int, ...] = ()  # H
    bits: tuple[int, ...] = ()  # pseudo-gradient bits q
    fragments: tuple[int, ...] = (1, 2, 4, 8)  # Streaming DiLoCo P (offsets round(k·H/P))
    overlap_steps: tuple[int, ...] = ()  # Streaming DiLoCo τ (default: the file's, at least 1)
    batch_per_gpu: tuple[int, ...] = ()  # sequences per GPU per inner step (default: the file's)

    def __post_init__(self) -> None:
        _subset("modes", self.modes, MODES)
        for name in ("inner_steps", "fragments", "batch_per_gpu"):
            values = getattr(self, name)
            if values:
                _positive(name, values)
        for q in self.bits:
            if q not in BITS:
                raise UserInputError("bits", q, f"allowed: {', '.join(map(str, BITS))}")
        if any(t < 0 for t in self.overlap_steps):
            raise UserInputError("overlap_steps", self.overlap_steps, "non-negative integers")


@dataclass(frozen=True)
class Constraints:
    """What a returned plan must meet. Times in seconds, money in USD.

    `memory_headroom` is the fraction of HBM that must stay free (0.1 keeps 10% spare).
    """

    deadline_s: float | None = None
    budget_usd: float | None = None
    memory_headroom: float = 0.0
    max_gpus_per_island: int | None = None

    def __post_init__(self) -> None:
        if self.deadline_s is not None and not self.deadline_s > 0:
            raise UserInputError("deadline", self.deadline_s, "must be a positive duration")
        if self.budget_usd is not None and not self.budget_usd > 0:
            raise UserInputError("budget", self.budget_usd, "must be a positive amount of USD")
        if not 0.0 <= self.memory_headroom < 1.0:
            raise UserInputError("headroom", self.memory_headroom, "a fraction in [0, 1)")
        if self.max_gpus_per_island is not None and self.max_gpus_per_island < 1:
            raise UserInputError("max_gpus_per_island", self.max_gpus_per_island, "must be ≥ 1")

    def memory_budget(self, hbm_bytes: float) -> float:
        """Bytes a plan may use per GPU."""
        return hbm_bytes * (1.0 - self.memory_headroom)
