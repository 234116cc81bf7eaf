"""A simulated run's configuration (pydantic, validated once) and its random-stream keys."""

from __future__ import annotations

import math
from pathlib import Path
from typing import Any, Literal

from pydantic import BaseModel, ConfigDict, Field, ValidationError, model_validator

from heloco.data import DataConfig
from heloco.model import ModelConfig
from heloco.outer import OuterConfig, resolve_method
from heloco.outer.base import RhoMode
from heloco.worker import InnerConfig
from shardmeter.errors import UserInputError, from_pydantic

PACE_KEY = 10  # derive_seed keys of the simulator's own random streams
JITTER_KEY = 11
MODEL_KEY = 12


class PaceDistribution(BaseModel):
    """Worker paces (seconds per inner step) drawn once per run: median·exp(σ·z)."""

    model_config = ConfigDict(extra="forbid", frozen=True)

    kind: Literal["lognormal"] = "lognormal"
    median: float = Field(1.0, gt=0, allow_inf_nan=False)
    sigma: float = Field(0.5, ge=0, allow_inf_nan=False)


class SimConfig(BaseModel):
    """One simulated run. ``outer_lr``/``outer_momentum``/``rho`` override ``outer``'s."""

    model_config = ConfigDict(extra="forbid", frozen=True)

    method: str = "heloco"
    workers: int = Field(5, ge=1, le=1024)
    paces: list[float] | PaceDistribution | None = Field(
        None, description="seconds per inner step per worker (None: all 1.0)"
    )
    pace_jitter: float = Field(0.0, ge=0, description="σ of a mean-1 lognormal per-round factor")
    comm_delays: list[float] | None = Field(None, description="seconds added to each round")
    inner_steps: int = Field(20, ge=1, description="H")
    outer_lr: float | None = Field(None, gt=0, description="None: Table 3 default of the method")
    outer_momentum: float = Field(0.9, ge=0, lt=1)
    rho: RhoMode | float | None = Field(None, description="None: the method's default")
    outer: OuterConfig = OuterConfig()
    dylu: bool | None = Field(None, description="None: the method's default (dn-dylu: on)")
    grace_window: float = Field(0.0, ge=0, description="seconds; 0 = fully asynchronous")
    data: DataConfig = DataConfig()
    model: str | ModelConfig = "tiny"
    inner: InnerConfig = InnerConfig()
    inner_schedule: Literal["budget", "config"] = Field(
        "config",
        description="cosine length per worker: its expected steps under the budget, or "
        "inner.total_steps",
    )
    token_budget: int | None = Field(None, ge=1)
    time_budget: float | None = Field(None, gt=0)
    eval_every: int = Field(0, ge=0, description="eval_unit between evaluations (0: start, end)")
    eval_unit: Literal["tokens", "steps"] = Field("tokens", description="unit of eval_every")
    eval_batch_size: int = Field(64, ge=1)
    eval_windows: int | None = Field(64, ge=1, description="windows per language (None: all)")
    seed: int = Field(42, ge=0)
    out_dir: Path | None = None
    device: str = "cpu"

    @model_validator(mode="after")
    def _check(self) -> SimConfig:
        resolve_method(self.method)
        if self.token_budget is None and self.time_budget is None:
            raise UserInputError("token_budget", None, "set token_budget and/or time_budget")
        for name in ("paces", "comm_delays"):
            values = getattr(self, name)
            if isinstance(values, list):
                if len(values) != self.workers:
                    need = f"{self.workers} values, one per worker (workers = {self.workers})"
                    raise UserInputError(name, values, need)
                if any(not math.isfinite(v) or v < 0 for v in values):
                    raise UserInputError(name, values, "finite values >= 0")
        if isinstance(self.paces, list) and any(p <= 0 for p in self.paces):
            raise UserInputError("paces", self.paces, "seconds per step > 0")
        return self

    def outer_config(self) -> OuterConfig:
        """The outer settings with the top-level overrides applied."""
        return self.outer.model_copy(
            update={"lr": self.outer_lr, "momentum": self.outer_momentum, "rho": self.rho}
        )

    def use_dylu(self) -> bool:
        """Whether DyLU inner steps apply: the explicit ``dylu`` field, else the method's default."""
        return self.dylu if self.dylu is not None else resolve_method(self.method).spec.dylu


def parse_sim_config(values: dict[str, Any]) -> SimConfig:
    """Validate user values; bad input raises a one-line UserInputError."""
    try:
        return SimConfig.model_validate(values)
    except ValidationError as exc:
        raise from_pydantic(exc, "sim") from None
