"""PlanArrays: many Plans as parallel numpy columns, so one estimator call evaluates them all.

Categoricals are coded as small ints (see the *_CODES tables); every column broadcasts.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass, fields
from typing import Any

import numpy as np
from numpy.typing import ArrayLike, NDArray

from shardmeter.estimate._xp import maximum
from shardmeter.specs.plan import Plan

IntArray = NDArray[np.int64]
BoolArray = NDArray[np.bool_]

SHARDING_CODES: dict[str, int] = {"none": 0, "zero1": 1, "zero2": 2, "zero3": 3}
RECOMPUTE_CODES: dict[str, int] = {"none": 0, "selective": 1, "full": 2}
PRECISION_CODES: dict[str, int] = {"bf16": 0, "fp16": 1, "fp8": 2}

_BOOL_FIELDS = ("sp", "overlap_dp", "overlap_param_gather", "overlap_tp")


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

    @classmethod
    def from_columns(cls, **columns: ArrayLike) -> PlanArrays:
        """Build from keyword columns (missing ones take Plan's defaults; a missing
        shard_group is dp for sharded plans, as `Plan.shard_group`), broadcast together."""
        default = Plan()
        values: dict[str, ArrayLike] = {}
        for f in fields(cls):
            if f.name in columns:
                values[f.name] = columns.pop(f.name)
            elif f.name == "shard_group":
                values[f.name] = -1  # filled below: dp when sharded, else 1
            elif f.name == "sharding":
                values[f.name] = SHARDING_CODES[default.sharding]
            elif f.name == "recompute":
                values[f.name] = RECOMPUTE_CODES[default.recompute]
            elif f.name == "precision":
                values[f.name] = PRECISION_CODES[default.precision]
            else:
                values[f.name] = getattr(default, f.name)
        if columns:
            raise TypeError(f"unknown PlanArrays columns: {sorted(columns)}")
        arrays = np.broadcast_arrays(*(np.asarray(v) for v in values.values()))
        typed: dict[str, Any] = {
            name: arr.astype(np.bool_ if name in _BOOL_FIELDS else np.int64)
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
            for name in cols:
                if name == "sharding":
                    cols[name].append(SHARDING_CODES[plan.sharding])
                elif name == "recompute":
                    cols[name].append(RECOMPUTE_CODES[plan.recompute])
                elif name == "precision":
                    cols[name].append(PRECISION_CODES[plan.precision])
                else:
                    cols[name].append(getattr(plan, name))
        return cls.from_columns(**{k: np.asarray(v) for k, v in cols.items()})

    @classmethod
    def from_plan(cls, plan: Plan) -> PlanArrays:
        return cls.from_plans([plan])

    @classmethod
    def scalar(cls, plan: Plan) -> PlanArrays:
        """One plan as Python scalars: the same formulas, without numpy's per-call overhead."""
        codes = {
            "sharding": SHARDING_CODES[plan.sharding],
            "recompute": RECOMPUTE_CODES[plan.recompute],
            "precision": PRECISION_CODES[plan.precision],
        }
        values = {f.name: codes.get(f.name, getattr(plan, f.name)) for f in fields(cls)}
        return cls(**values)

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
