"""A simulated run's configuration (pydantic, validated once), its random-stream keys, and
:func:`component_of`, which takes a component's config (:mod:`heloco.sim.build`) from it."""

from __future__ import annotations

import dataclasses
import math
from pathlib import Path
from typing import Annotated, Any, Literal, TypeVar

from pydantic import BaseModel, ConfigDict, Field, ValidationError, model_validator

from heloco.codecs import parse_payload
from heloco.data import DataConfig
from heloco.modelspec import ModelChoice
from heloco.outer import OuterConfig, resolve_method
from heloco.server import DyluReference
from heloco.worker import InnerConfig
from shardmeter.errors import UserInputError, from_pydantic

PACE_KEY = 10  # derive_seed keys of the simulator's own random streams
JITTER_KEY = 11
MODEL_KEY = 12


# Paces are checked by _check, so every bad pace reads PACE_RULE (as `--paces` does).
RawFloat = Annotated[float, Field(allow_inf_nan=True)]
PACE_RULE = "seconds per inner step: finite numbers > 0, comma-separated, e.g. 1,1,2"

# Top-level spellings accepted for three ``[outer]`` keys; ``[outer]`` is the one stored.
OUTER_ALIASES: dict[str, str] = {"outer_lr": "lr", "outer_momentum": "momentum", "rho": "rho"}


def fold_outer_aliases(values: Any) -> Any:
    """Move top-level ``outer_lr``/``outer_momentum``/``rho`` into the ``outer`` table.

    One spelling per knob: the alias and ``outer.<key>`` name the same setting, so a
    None alias is no setting and two different values are an error, never a silent winner.
    """
    if not isinstance(values, dict) or not any(k in values for k in OUTER_ALIASES):
        return values
    out = dict(values)
    outer = out.get("outer", {})
    if not isinstance(outer, dict):
        return values  # not a table: the field's own validation names it
    outer = dict(outer)
    for alias, key in OUTER_ALIASES.items():
        value = out.pop(alias, None)
        if value is None:
            continue
        if outer.get(key) is not None and outer[key] != value:
            raise UserInputError(
                alias, value, f"set outer.{key} or {alias}, not both (outer.{key} = {outer[key]!r})"
            )
        outer[key] = value
    out["outer"] = outer
    return out


class PaceDistribution(BaseModel):
    """Worker paces (seconds per inner step) drawn once per run: median·exp(σ·z)."""

    model_config = ConfigDict(extra="forbid", frozen=True, allow_inf_nan=False)

    kind: Literal["lognormal"] = "lognormal"
    median: float = Field(1.0, gt=0, allow_inf_nan=False)
    sigma: float = Field(0.5, ge=0, allow_inf_nan=False)


class Failure(BaseModel):
    """Worker ``worker`` is killed at simulated second ``at`` (its round in flight is lost, the
    server evicts it) and rejoins ``down`` seconds later (dispatched afresh)."""

    model_config = ConfigDict(extra="forbid", frozen=True, allow_inf_nan=False)

    worker: int = Field(ge=0)
    at: float = Field(ge=0)
    down: float = Field(gt=0)


class SimConfig(BaseModel):
    """One simulated run. ``outer_lr``, ``outer_momentum`` and ``rho`` are accepted as
    spellings of ``outer.lr``, ``outer.momentum`` and ``outer.rho`` (see fold_outer_aliases)."""

    model_config = ConfigDict(extra="forbid", frozen=True, allow_inf_nan=False)

    method: str = "heloco"
    workers: int = Field(5, ge=1, le=1024)
    paces: list[RawFloat] | PaceDistribution | None = Field(
        None, description="seconds per inner step per worker (None: all 1.0)"
    )
    pace_jitter: float = Field(
        0.0,
        ge=0,
        le=4,
        description="σ of a mean-1 lognormal per-round factor, at most 4 (the median round "
        "then already takes e^(−σ²/2) = e^−8 of its pace)",
    )
    comm_delays: list[float] | None = Field(None, description="seconds added to each round")
    link_mbit: list[RawFloat] | None = Field(
        None,
        description="Mbit/s (1e6 bit/s) of each worker's link to the server, both directions: "
        "each exchange then costs bytes / bandwidth + latency per direction instead of "
        "comm_delays (heloco.sim.clock.link_seconds)",
    )
    link_latency: list[RawFloat] | None = Field(
        None, description="one-way seconds of each worker's link (needs link_mbit; None: 0)"
    )
    server_link_mbit: float | None = Field(
        None,
        gt=0,
        allow_inf_nan=False,
        description="Mbit/s of the server's own link, shared by every worker (needs link_mbit)",
    )
    exchange: Literal["blocking", "overlapped", "streaming"] = Field(
        "blocking",
        description="blocking: push, pull, then train; overlapped: push and pull in the "
        "background while the next round trains (heloco.overlap); streaming: one of "
        "`fragments` fragments every H/P steps, in the background (heloco.streaming)",
    )
    fragments: int = Field(
        2,
        ge=2,
        le=1024,
        description="streaming: P fragments of the model, one pushed every H/P inner steps "
        "(inner_steps must be a multiple of it)",
    )
    stream_alpha: float = Field(
        0.5,
        ge=0,
        le=1,
        allow_inf_nan=False,
        description="streaming: merge weight α of the worker's own fragment, θ ← α·θ_local + "
        "(1 − α)·θ_global (Streaming DiLoCo; 0: take the global value)",
    )
    overlap_eager: float = Field(
        1.0,
        ge=0,
        le=1,
        allow_inf_nan=False,
        description="overlapped: weight λ of the worker's own last Δ applied to the arriving "
        "dispatch, start = θ − λ·Δ (1: eager, 0: one-step delayed)",
    )
    inner_steps: int = Field(20, ge=1, description="H")
    outer: OuterConfig = OuterConfig()
    dylu: bool | None = Field(None, description="None: the method's default (dn-dylu: on)")
    dylu_reference: DyluReference = Field(
        "max", description="DyLU v_ref: fastest latest speed, or a quantile of recent speeds"
    )
    dylu_quantile: float = Field(0.9, gt=0, le=1, description="quantile for dylu_reference")
    grace_window: float = Field(0.0, ge=0, description="seconds; 0 = fully asynchronous")
    quorum: int | None = Field(
        None,
        ge=1,
        description="decoupled: distinct workers an outer step merges at least (None: half "
        "the workers, rounded up)",
    )
    failures: list[Failure] = Field(
        default_factory=list,
        description="workers killed at a simulated time and back after `down` seconds",
    )
    payload: str = Field(
        "dense",
        description="what a worker sends, as shardmeter plan --payload spells it: dense, "
        "topk:fraction=0.01, sign (heloco.codecs; error feedback per worker)",
    )
    codec: Literal["fp32", "bf16", "int8"] = Field(
        "fp32",
        description="the dense payload's uplink wire codec (heloco work --codec): Δ encoded and "
        "decoded as a push is, no residual; fp32 with a compressed payload",
    )
    data: DataConfig = DataConfig()
    model: ModelChoice = Field(
        "tiny", description="TinyGPT preset or table, {hf = DIR}, or {factory = 'pkg.mod:fn'}"
    )
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
    seed: int = Field(42, ge=0, le=2**63 - 1, description="torch's seeds are signed 64-bit")
    out_dir: Path | None = None
    device: str = "cpu"
    threads: int = Field(
        1,
        ge=1,
        le=1024,
        description="torch intra-op threads, set before any work: the reduction order and so "
        "the losses depend on it",
    )
    batch: Literal["auto", "on", "off"] = Field(
        "auto",
        description="compute rounds in flight at the same time in one batched kernel (on: "
        "for TinyGPT models; auto: where it pays, on a GPU or for small models on the CPU) or "
        "one at a time (off); the losses are the same either way",
    )

    @model_validator(mode="before")
    @classmethod
    def _aliases(cls, values: Any) -> Any:
        return fold_outer_aliases(values)

    @model_validator(mode="after")
    def _check(self) -> SimConfig:
        method = resolve_method(self.method)
        if parse_payload(self.payload).kind != "dense" and self.codec != "fp32":
            raise UserInputError("codec", self.codec, "fp32 with a compressed payload")
        if self.quorum is not None and not method.spec.quorum:
            raise UserInputError("quorum", self.quorum, "unset unless method is decoupled")
        if self.quorum is not None and self.quorum > self.workers:
            raise UserInputError("quorum", self.quorum, f"at most workers = {self.workers}")
        for f in self.failures:
            if f.worker >= self.workers:
                raise UserInputError("failures.worker", f.worker, f"below workers = {self.workers}")
        if self.token_budget is None and self.time_budget is None:
            raise UserInputError("token_budget", None, "set token_budget and/or time_budget")
        for name in ("paces", "comm_delays"):
            values = getattr(self, name)
            if isinstance(values, list) and len(values) != self.workers:
                need = f"{self.workers} values, one per worker (workers = {self.workers})"
                raise UserInputError(name, values, need)
        if isinstance(self.paces, list) and not all(math.isfinite(p) and p > 0 for p in self.paces):
            raise UserInputError("paces", self.paces, PACE_RULE)
        if isinstance(self.comm_delays, list) and not all(
            math.isfinite(d) and d >= 0 for d in self.comm_delays
        ):
            raise UserInputError("comm_delays", self.comm_delays, "finite seconds >= 0")
        self._check_links()
        self._check_exchange(method.spec.synchronous, method.spec.quorum)
        return self

    def _check_links(self) -> None:
        need = f"{self.workers} values, one per worker (workers = {self.workers})"
        if self.link_mbit is None:
            for name in ("link_latency", "server_link_mbit"):
                if getattr(self, name) is not None:
                    raise UserInputError(name, getattr(self, name), "unset unless link_mbit is set")
            return
        if self.comm_delays is not None:
            raise UserInputError(
                "link_mbit", self.link_mbit, "unset when comm_delays is set (one or the other)"
            )
        if len(self.link_mbit) != self.workers:
            raise UserInputError("link_mbit", self.link_mbit, need)
        if not all(math.isfinite(b) and b > 0 for b in self.link_mbit):
            raise UserInputError("link_mbit", self.link_mbit, "finite Mbit/s > 0 per worker")
        if self.link_latency is not None:
            if len(self.link_latency) != self.workers:
                raise UserInputError("link_latency", self.link_latency, need)
            if not all(math.isfinite(x) and x >= 0 for x in self.link_latency):
                raise UserInputError("link_latency", self.link_latency, "finite seconds >= 0")

    def _check_exchange(self, synchronous: bool, quorum: bool) -> None:
        if self.exchange == "streaming":
            self._check_streaming(synchronous, quorum)
            return
        if self.exchange != "overlapped":
            return
        if synchronous:
            raise UserInputError(
                "exchange", self.exchange, f"'blocking' for the synchronous method {self.method!r}"
            )
        if self.grace_window > 0 and not quorum:
            raise UserInputError(
                "exchange",
                self.exchange,
                "'blocking' with grace_window > 0 (the window holds the worker; overlap cannot)",
            )

    def _check_streaming(self, synchronous: bool, quorum: bool) -> None:
        """Streaming runs on the plain asynchronous server: one arrival per outer step, the
        outer rule's state per tensor, a dense payload (heloco.streaming)."""
        base = self.method.removesuffix("+ab")
        if synchronous or quorum or base in ("dn", "dn-dylu"):
            raise UserInputError(
                "exchange",
                self.exchange,
                f"'blocking' or 'overlapped' for method {self.method!r} (streaming needs an "
                "asynchronous method with per-tensor state: async-nesterov, mla, heloco, "
                "heloco-uncorrected)",
            )
        if self.grace_window > 0:
            raise UserInputError(
                "exchange", self.exchange, "'blocking' or 'overlapped' with grace_window > 0"
            )
        if parse_payload(self.payload).kind != "dense":
            raise UserInputError("payload", self.payload, "dense with exchange = 'streaming'")
        if self.inner_steps % self.fragments != 0:
            raise UserInputError(
                "fragments",
                self.fragments,
                f"a divisor of inner_steps = {self.inner_steps} (H/P steps per fragment)",
            )

    def server_quorum(self) -> int:
        """The server's quorum: 0 unless the method merges by quorum (then ``quorum``, or half
        the workers rounded up)."""
        if not resolve_method(self.method).spec.quorum:
            return 0
        return self.quorum if self.quorum is not None else -(-self.workers // 2)

    def use_dylu(self) -> bool:
        """Whether DyLU inner steps apply: the explicit ``dylu`` field, else the method's default."""
        return self.dylu if self.dylu is not None else resolve_method(self.method).spec.dylu


S = TypeVar("S")


def component_of(setup: type[S], cfg: SimConfig, **derived: Any) -> S:
    """The component config ``setup`` (a dataclass) of the run ``cfg``: each field is the run
    config's field of the same name, except those given in ``derived`` (values the component
    takes resolved, e.g. the method's defaults). A component gains a setting by naming a
    run-config field among its own fields, in one place."""
    names = [f.name for f in dataclasses.fields(setup)]  # type: ignore[arg-type]
    values = {n: getattr(cfg, n) for n in names if n not in derived}
    return setup(**values, **derived)


def parse_sim_config(values: dict[str, Any]) -> SimConfig:
    """Validate user values; bad input raises a one-line UserInputError."""
    try:
        return SimConfig.model_validate(values)
    except ValidationError as exc:
        raise from_pydantic(exc, whole="config") from None
