"""The run file: its schema, one table per component, read from TOML presets, user files and
``key=value`` overrides, and written back.

A leaf: it parses and validates, and imports no other part of heloco. Each component's table
is defined here and used by its component (``[model]``: :class:`ModelConfig` or a
:data:`ModelChoice`, ``[data]``: :class:`DataConfig`, ``[inner]``: :class:`InnerConfig`,
``[outer]``: :class:`OuterConfig`, the ``payload`` key: :func:`parse_payload`); the method
names and how the server drives each (:data:`METHOD_POLICIES`) are checked here, their
optimizers live in :mod:`heloco.outer`. :class:`RunConfig` is the whole file; the components'
configs with ``build()`` are taken from it by the layers that build (``heloco.sim.build``).

A config file has the shape of :class:`RunConfig` (top-level keys plus ``[data]``,
``[inner]``, ``[outer]`` and ``[outer.correction]`` tables). Two extra top-level keys are
stripped before validation: ``preset = "name"`` starts from a shipped preset, and
``description`` is free text. TOML has no null, so the string ``"null"`` stands for None.
Every failure is a one-line :class:`UserInputError`.
"""

from __future__ import annotations

import copy
import json
import math
import sys
from collections.abc import Mapping
from dataclasses import dataclass
from pathlib import Path
from typing import Annotated, Any, Literal

from pydantic import (
    BaseModel,
    ConfigDict,
    Discriminator,
    Field,
    Tag,
    ValidationError,
    field_validator,
    model_validator,
)

from shardmeter.errors import UserInputError, check_input, from_pydantic
from shardmeter.io import write_atomic
from shardmeter.specs.topology import PayloadSpec, parse_settings

if sys.version_info >= (3, 11):
    import tomllib
else:  # pragma: no cover - exercised on Python 3.10 only
    import tomli as tomllib

# -- methods: names and how the server drives each ------------------------------------------
AB_SUFFIX = "+ab"


@dataclass(frozen=True)
class MethodPolicy:
    """How the server drives an outer method, what a run file is checked against (the
    method's optimizer and default rates: ``heloco.outer.registry.METHODS``, one entry per
    name here)."""

    synchronous: bool = False  # the server waits for every worker each round
    dylu: bool = False  # DyLU inner steps unless the run file sets ``dylu``
    quorum: bool = False  # Decoupled DiLoCo: buffered rounds merged once a quorum has one


METHOD_POLICIES: dict[str, MethodPolicy] = {
    "sync": MethodPolicy(synchronous=True),
    "async-nesterov": MethodPolicy(),
    "dn": MethodPolicy(),
    "dn-dylu": MethodPolicy(dylu=True),
    "mla": MethodPolicy(),
    "heloco": MethodPolicy(),
    "decoupled": MethodPolicy(quorum=True),
    "heloco-uncorrected": MethodPolicy(),
}


def method_names() -> list[str]:
    """Every accepted method name (base methods, then the balanced variants)."""
    base = list(METHOD_POLICIES)
    return base + [n + AB_SUFFIX for n, s in METHOD_POLICIES.items() if not s.synchronous]


def method_policy(name: str) -> MethodPolicy:
    """The policy of a method name (``<async method>+ab``, arrival balancing: its base's);
    an unknown name is a one-line error listing :func:`method_names`."""
    balanced = name.endswith(AB_SUFFIX)
    base = name[: -len(AB_SUFFIX)] if balanced else name
    policy = METHOD_POLICIES.get(base)
    if policy is None or (balanced and policy.synchronous):
        raise UserInputError("method", name, "one of " + ", ".join(method_names()))
    return policy


# -- [model] ----------------------------------------------------------------------------------
class ModelConfig(BaseModel):
    """Shape of a TinyGPT. ``seq_len`` is the longest context (size of the position table)."""

    model_config = ConfigDict(frozen=True, extra="forbid", allow_inf_nan=False)

    vocab_size: int = Field(ge=2, le=1_000_000)
    seq_len: int = Field(ge=1, le=1_000_000)
    n_layer: int = Field(ge=1, le=1024)
    n_head: int = Field(ge=1, le=1024)
    d_model: int = Field(ge=1, le=65_536)

    @model_validator(mode="after")
    def _heads_divide_width(self) -> ModelConfig:
        if self.d_model % self.n_head:
            raise UserInputError("d_model", self.d_model, f"a multiple of n_head ({self.n_head})")
        return self

    def param_count(self) -> int:
        """Number of parameters (elements), embeddings and head included.

        Per block (nanoGPT layout): 2 LayerNorms (4d) + QKV (3d²+3d) + attention output
        (d²+d) + MLP (4d²+4d, 4d²+d) = 12d² + 13d. Total = V·d (tokens) + T·d (positions)
        + L·(12d² + 13d) + 2d (final LayerNorm) + d·V (untied head, no bias).
        """
        d, v = self.d_model, self.vocab_size
        per_block = 12 * d * d + 13 * d
        return v * d + self.seq_len * d + self.n_layer * per_block + 2 * d + d * v


class HFModel(BaseModel):
    """A Hugging Face causal LM from a local folder holding ``config.json``."""

    model_config = ConfigDict(frozen=True, extra="forbid")

    hf: Path = Field(description="local folder with config.json (as save_pretrained writes)")
    weights: Path | None = Field(
        None, description="local .safetensors file, or a folder of them; None: seeded init"
    )


class FactoryModel(BaseModel):
    """Any module: ``factory = "package.module:callable"`` called with ``kwargs``."""

    model_config = ConfigDict(frozen=True, extra="forbid")

    factory: str = Field(description="package.module:callable returning an nn.Module")
    kwargs: dict[str, Any] = Field(default_factory=dict)


def _model_kind(value: Any) -> str:
    """The union branch of a ``model`` value, chosen by its keys (so errors name the branch
    the user meant): ``hf`` -> HFModel, ``factory`` -> FactoryModel, a name -> preset."""
    if isinstance(value, str):
        return "preset"
    if isinstance(value, BaseModel):
        return type(value).__name__
    if isinstance(value, dict) and "hf" in value:
        return "HFModel"
    if isinstance(value, dict) and "factory" in value:
        return "FactoryModel"
    return "ModelConfig"


ModelChoice = Annotated[
    Annotated[str, Tag("preset")]
    | Annotated[ModelConfig, Tag("ModelConfig")]
    | Annotated[HFModel, Tag("HFModel")]
    | Annotated[FactoryModel, Tag("FactoryModel")],
    Discriminator(_model_kind),
]
"""The ``model`` key of a run config (see :mod:`heloco.modelspec`)."""


# -- [data] -----------------------------------------------------------------------------------
Assignment = Literal["language", "dirichlet", "iid"]


class DataConfig(BaseModel):
    """Where the text comes from, how it is tokenised and how it is split across workers."""

    model_config = ConfigDict(frozen=True, extra="forbid", allow_inf_nan=False)

    data_dir: Path | None = None  # None: the built-in synthetic multilingual corpus
    tokenizer: str = Field(
        default="byte", description="byte, bpe (trained locally), or a local tokenizer.json path"
    )
    bpe_vocab_size: int = Field(default=4096, ge=257, le=1 << 20)
    cache_dir: Path | None = None  # trained BPE tokenizers and BPE ids (None: ~/.cache/heloco)
    assignment: Assignment = "language"
    dirichlet_alpha: float = Field(default=0.5, gt=0, allow_inf_nan=False)
    val_chars_per_language: int = Field(default=40_000, ge=1)  # spec §3: 40,000 chars each
    train_fraction: float = Field(default=1.0, gt=0, le=1)
    seq_len: int = Field(default=128, ge=1)
    synthetic_chars_per_language: int = Field(default=400_000, ge=1000, le=100_000_000)
    sampling: Literal["windows", "stream"] = Field(
        default="windows",
        description="windows: random stride-1 windows over the corpus in memory (the paper); "
        "stream: shards read in order, packed to seq_len, never held whole",
    )
    text_field: str = Field(default="text", min_length=1, description="JSONL key / Parquet column")
    sources: dict[str, list[str]] | None = Field(
        default=None, description="name -> glob patterns of shards (instead of data_dir)"
    )

    @model_validator(mode="after")
    def _one_place(self) -> DataConfig:
        if self.sources is not None and self.data_dir is not None:
            raise UserInputError(
                "sources", list(self.sources), "either data_dir or sources, not both"
            )
        return self

    @field_validator("tokenizer")
    @classmethod
    def _tokenizer_kind(cls, value: str) -> str:
        if value in ("byte", "bpe") or "/" in value or value.endswith(".json"):
            return value
        raise ValueError("byte, bpe, or a path to a local tokenizer.json (or its folder)")


# -- [inner] ----------------------------------------------------------------------------------
@dataclass(frozen=True)
class InnerConfig:
    """Inner optimiser and batch shape. Defaults: the authors' prototype (spec §1.8, §3):
    AdamW lr 2e-4, betas (0.9, 0.999), weight decay 1e-2, cosine decay to 1e-6, batch 2 × 128.

    ``total_steps`` is the length of one worker's cosine schedule (its inner steps over the
    whole run); after it the rate stays at ``min_lr``. ``grad_clip`` None disables clipping.
    ``fused`` picks torch's fused AdamW kernel where the device has one, else foreach.
    """

    lr: float = 2e-4
    weight_decay: float = 1e-2
    betas: tuple[float, float] = (0.9, 0.999)
    eps: float = 1e-8
    warmup_steps: int = 0
    min_lr: float = 1e-6
    total_steps: int = 2000
    batch_size: int = 2
    seq_len: int = 128
    grad_clip: float | None = None
    reset_each_round: bool = True
    fused: bool = True

    def __post_init__(self) -> None:
        if not (math.isfinite(self.lr) and self.lr > 0):
            raise UserInputError("inner.lr", self.lr, "a finite number > 0")
        if not 0 <= self.min_lr <= self.lr:
            raise UserInputError("inner.min_lr", self.min_lr, f"a number in [0, lr={self.lr}]")
        if not (math.isfinite(self.weight_decay) and self.weight_decay >= 0):
            raise UserInputError("inner.weight_decay", self.weight_decay, "a finite number >= 0")
        if len(self.betas) != 2 or not all(0 <= b < 1 for b in self.betas):
            raise UserInputError("inner.betas", self.betas, "two numbers in [0, 1)")
        if not self.eps > 0:
            raise UserInputError("inner.eps", self.eps, "a number > 0")
        if self.total_steps < 1:
            raise UserInputError("inner.total_steps", self.total_steps, "an integer >= 1")
        if not 0 <= self.warmup_steps <= self.total_steps:
            raise UserInputError(
                "inner.warmup_steps",
                self.warmup_steps,
                f"an integer in [0, total_steps={self.total_steps}]",
            )
        if self.batch_size < 1:
            raise UserInputError("inner.batch_size", self.batch_size, "an integer >= 1")
        if self.seq_len < 1:
            raise UserInputError("inner.seq_len", self.seq_len, "an integer >= 1")
        if self.grad_clip is not None and not self.grad_clip > 0:
            raise UserInputError(
                "inner.grad_clip", self.grad_clip, "a number > 0, or None to disable"
            )

    @property
    def tokens_per_step(self) -> int:
        """Training tokens of one inner step: batch size × sequence length."""
        return self.batch_size * self.seq_len


# -- [outer] ----------------------------------------------------------------------------------
RhoMode = Literal["sqrt_k", "delay", "none"]
Normalize = Literal["max", "clip", "mean"]


class CorrectionConfig(BaseModel):
    """Hyperparameters of the block correction (defaults: spec 1.8, authors' code)."""

    model_config = ConfigDict(extra="forbid", frozen=True, allow_inf_nan=False)

    c_ok: float = Field(0.2, description="keep threshold on the cosine")
    k_s: float = Field(0.5, ge=0, description="shrink strength")
    beta_max: float = Field(0.5, ge=0, lt=1, description="shrink cap, in [0, 1)")
    k_d: float = Field(1.0, ge=0, description="rotation strength")
    kappa: float = Field(3.0, ge=0, description="momentum weight in the confidence")
    c_bad: float = Field(-0.2, description="lower anchor of the normalized λ (< c_ok)")
    eps: float = Field(1e-8, gt=0)
    lambda_form: Literal["normalized", "published"] = Field(
        "normalized",
        description="normalized: the paper prototype's λ and ε placement; published: Eq. 14 "
        "and the production code's",
    )
    scope: Literal["tensor", "model"] = Field(
        "tensor", description="one decision per parameter tensor, or one for the whole model"
    )
    shrink_when_negative: bool = Field(
        True, description="shrink anti-aligned blocks; if false they are rotated instead"
    )

    @model_validator(mode="after")
    def _check(self) -> CorrectionConfig:
        if not self.c_bad < self.c_ok:
            raise UserInputError(
                "correction.c_bad", self.c_bad, f"a number below c_ok = {self.c_ok}"
            )
        return self


class OuterConfig(BaseModel):
    """Outer-optimizer settings; ``None`` means the method's default."""

    model_config = ConfigDict(extra="forbid", frozen=True, allow_inf_nan=False)

    lr: float | None = Field(None, gt=0, description="outer lr η (None: Table 3 default)")
    momentum: float = Field(0.9, ge=0, lt=1, description="outer momentum μ")
    rho: RhoMode | Annotated[float, Field(gt=0)] | None = Field(
        None, description="'sqrt_k' (1/√K), 'delay' (1/√K/√(1+τ)), 'none', a number > 0, or None"
    )
    rho_order: Literal["before", "after"] = Field(
        "before",
        description="HeLoCo: scale by ρ before (experiments) or after (torchft) correcting",
    )
    correction: CorrectionConfig = CorrectionConfig()
    dn_period: int | None = Field(None, ge=1, description="DN period N (None: number of workers)")
    dn_c: float = Field(0.0, ge=0, description="DN c in [0, 1/N]")
    ab_shares: Literal["online", "paces"] = Field(
        "online", description="arrival balancing: shares from arrival counts or from known paces"
    )
    ab_prior: float = Field(1.0, gt=0, description="Laplace prior on online arrival counts")
    ab_max_weight: float = Field(10.0, ge=1, description="cap on a balancing weight")
    ab_power: float = Field(1.0, ge=0, le=1, description="γ: 1 balances fully, 0 not at all")
    ab_normalize: Normalize = Field(
        "clip",
        description="clip: over-represented workers down to their fair share, none up; max: "
        "the least represented at 1; mean: expected outer lr unchanged (amplifies the slow)",
    )
    ab_data: Literal["mixtures", "workers"] = Field(
        "mixtures",
        description="balance the workers' known data mixtures (overlap weakens it), or the "
        "workers themselves",
    )


# -- payload and the server's DyLU reference ------------------------------------------------
RUNTIME_KINDS = ("dense", "topk", "sign")  # planner families the runtime can send
INDEX_BITS = 32  # flat int32 index of a kept top-k value (the planner's default, topk)
FLOAT_BITS = (16, 32)  # value and scale widths the runtime sends: bf16, fp32
DyluReference = Literal["max", "quantile"]


def parse_payload(text: str | PayloadSpec) -> PayloadSpec:
    """A payload as ``shardmeter plan --payload`` spells it ('topk:fraction=0.01', 'sign',
    'sign:group=64'), validated by the planner's own model; a family the runtime cannot send
    (lowrank, dct_topk) or a value or scale width other than 16 or 32 bits is a one-line error.
    """
    if isinstance(text, PayloadSpec):
        spec = text
    else:
        kind, _, rest = str(text).partition(":")
        try:
            spec = PayloadSpec.model_validate(
                {"kind": kind.strip(), **parse_settings(rest, "payload")}
            )
        except ValidationError as exc:
            raise from_pydantic(exc, prefix="payload") from None
    if spec.kind not in RUNTIME_KINDS:
        raise UserInputError("payload", text, f"one of {', '.join(RUNTIME_KINDS)} (the runtime's)")
    if spec.kind == "topk":
        if spec.value_bits not in FLOAT_BITS:
            raise UserInputError("payload.value_bits", spec.value_bits, "16 (bf16) or 32 (fp32)")
        if spec.index_bits not in (None, INDEX_BITS):
            raise UserInputError("payload.index_bits", spec.index_bits, "32 (int32 flat indices)")
    if spec.kind == "sign" and spec.scale_bits not in FLOAT_BITS:
        raise UserInputError("payload.scale_bits", spec.scale_bits, "16 (bf16) or 32 (fp32)")
    if spec.kind != "dense" and not spec.error_feedback:
        raise UserInputError(
            "payload.error_feedback",
            False,
            "true: the runtime's compressed payloads keep a residual",
        )
    return spec


# -- the whole run file -----------------------------------------------------------------------
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


class RunConfig(BaseModel):
    """One run, the whole run file: what the simulator runs and what ``heloco serve``, ``work``
    and ``launch`` read. ``outer_lr``, ``outer_momentum`` and ``rho`` are accepted as
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
    def _check(self) -> RunConfig:
        method = method_policy(self.method)
        if parse_payload(self.payload).kind != "dense" and self.codec != "fp32":
            raise UserInputError("codec", self.codec, "fp32 with a compressed payload")
        if self.quorum is not None and not method.quorum:
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
        self._check_exchange(method.synchronous, method.quorum)
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
        if not method_policy(self.method).quorum:
            return 0
        return self.quorum if self.quorum is not None else -(-self.workers // 2)

    def use_dylu(self) -> bool:
        """Whether DyLU inner steps apply: the explicit ``dylu`` field, else the method's default."""
        return self.dylu if self.dylu is not None else method_policy(self.method).dylu


def parse_run_config(values: dict[str, Any]) -> RunConfig:
    """Validate user values; bad input raises a one-line UserInputError."""
    try:
        return RunConfig.model_validate(values)
    except ValidationError as exc:
        raise from_pydantic(exc, whole="config") from None


# -- reading ------------------------------------------------------------------------------------
PRESETS_DIR = Path(__file__).resolve().parent / "configs"
DEFAULT_PRESET = "default"
META_KEYS = ("preset", "description")
NULL = "null"  # TOML spelling of None


def preset_names() -> list[str]:
    """Names of the shipped presets (``configs/<name>.toml``), sorted."""
    return sorted(p.stem for p in PRESETS_DIR.glob("*.toml"))


def read_toml(path: Path, field: str = "config") -> dict[str, Any]:
    """Parse one TOML file; a missing or malformed file is a one-line error."""
    if not path.is_file():
        raise UserInputError(field, str(path), "an existing TOML file")
    try:
        return tomllib.loads(path.read_text(encoding="utf-8"))
    except (tomllib.TOMLDecodeError, UnicodeDecodeError) as exc:
        raise UserInputError(field, str(path), f"valid TOML ({exc})") from None


def preset_data(name: str) -> dict[str, Any]:
    """The raw table of a shipped preset (metadata keys included)."""
    path = PRESETS_DIR / f"{name}.toml"
    if not path.is_file():
        raise UserInputError("preset", name, "one of " + ", ".join(preset_names()))
    return read_toml(path, "preset")


def resolve_inheritance(data: Mapping[str, Any], depth: int = 0) -> dict[str, Any]:
    """Merge ``data`` over the preset it names (recursively), metadata keys removed."""
    if depth > 8:
        raise UserInputError("preset", data.get("preset"), "a preset chain without cycles")
    out = fold_outer_aliases({k: copy.deepcopy(v) for k, v in data.items() if k not in META_KEYS})
    parent = data.get("preset")
    if parent is None:
        return out
    if not isinstance(parent, str):
        raise UserInputError("preset", parent, "a preset name: " + ", ".join(preset_names()))
    return deep_merge(resolve_inheritance(preset_data(parent), depth + 1), out)


def deep_merge(base: Mapping[str, Any], top: Mapping[str, Any]) -> dict[str, Any]:
    """``top`` over ``base``; nested tables merge key by key, anything else is replaced."""
    out = dict(base)
    for key, value in top.items():
        if isinstance(value, Mapping) and isinstance(out.get(key), Mapping):
            out[key] = deep_merge(out[key], value)
        else:
            out[key] = copy.deepcopy(value)
    return out


def set_dotted(data: dict[str, Any], key: str, value: Any) -> None:
    """Set ``data["a"]["b"] = value`` for ``key = "a.b"``, creating tables on the way."""
    parts = key.split(".")
    if not all(parts):
        raise UserInputError("--set", key, "a dotted key such as inner.lr or data.seq_len")
    node = data
    for part in parts[:-1]:
        child = node.get(part)
        if not isinstance(child, dict):
            child = {}
            node[part] = child
        node = child
    node[parts[-1]] = value


def parse_value(text: str) -> Any:
    """A ``--set`` value: any TOML value (``3``, ``2e-4``, ``true``, ``[1, 2]``), else a string."""
    try:
        return tomllib.loads(f"v = {text}")["v"]
    except tomllib.TOMLDecodeError:
        return text


def parse_assignment(item: str) -> tuple[str, Any]:
    """``"inner.lr=1e-3"`` -> ``("inner.lr", 0.001)``."""
    key, sep, value = item.partition("=")
    if not sep or not key.strip():
        raise UserInputError("--set", item, "KEY=VALUE, e.g. inner.lr=1e-3")
    return key.strip(), parse_value(value.strip())


def _nulls_to_none(x: Any) -> Any:
    if isinstance(x, str) and x == NULL:
        return None
    if isinstance(x, dict):
        return {k: _nulls_to_none(v) for k, v in x.items()}
    if isinstance(x, list):
        return [_nulls_to_none(v) for v in x]
    return x


def canonical_key(key: str) -> str:
    """The stored spelling of a dotted key (``rho`` -> ``outer.rho``), so each layer's value
    of one knob replaces the one below whichever spelling either used."""
    return f"outer.{OUTER_ALIASES[key]}" if key in OUTER_ALIASES else key


def config_values(
    path: Path | None = None,
    preset: str | None = None,
    overrides: Mapping[str, Any] | None = None,
) -> dict[str, Any]:
    """The merged raw values: preset (or file, which may name its own preset), then overrides.

    Precedence, lowest first: preset < file < overrides (``--set`` and flags).

    With neither a file nor a preset, the ``default`` preset is the base.
    """
    if path is not None and preset is not None:
        raise UserInputError("preset", preset, "either a config file or --preset, not both")
    raw = read_toml(path) if path is not None else {"preset": preset or DEFAULT_PRESET}
    data = resolve_inheritance(raw)
    for key, value in (overrides or {}).items():
        set_dotted(data, canonical_key(key), copy.deepcopy(value))  # never the caller's dict
    return _nulls_to_none(data)


def load_config(
    path: Path | None = None,
    preset: str | None = None,
    overrides: Mapping[str, Any] | None = None,
) -> RunConfig:
    """A validated :class:`RunConfig` from a preset or file plus dotted-key overrides.

    A misspelt key is a one-line error with the close matches (``inner.lrr`` -> ``inner.lr``).
    """
    values = config_values(path, preset, overrides)
    check_input(values, RunConfig)
    return parse_run_config(values)


# -- writing ------------------------------------------------------------------------------------
def _toml_scalar(value: Any, key: str) -> str:
    if value is None:
        return json.dumps(NULL)
    if isinstance(value, bool):
        return "true" if value else "false"
    if isinstance(value, int):
        return str(value)
    if isinstance(value, float):
        if not math.isfinite(value):
            raise UserInputError(key, value, "a finite number")
        return repr(value)
    if isinstance(value, str):
        return json.dumps(value)
    if isinstance(value, list | tuple):
        return "[" + ", ".join(_toml_scalar(v, key) for v in value) + "]"
    raise UserInputError(key, value, "a TOML scalar, array or table")


def _toml_table(data: Mapping[str, Any], prefix: str, lines: list[str]) -> None:
    tables = {k: v for k, v in data.items() if isinstance(v, Mapping)}
    for key, value in data.items():
        if key not in tables:
            lines.append(f"{key} = {_toml_scalar(value, prefix + key)}")
    for key, value in tables.items():
        lines.extend(["", f"[{prefix}{key}]"])
        _toml_table(value, f"{prefix}{key}.", lines)


def dumps_toml(data: Mapping[str, Any]) -> str:
    """TOML text of nested tables of scalars and arrays (None written as ``"null"``)."""
    lines: list[str] = []
    _toml_table(data, "", lines)
    return "\n".join(lines).lstrip("\n") + "\n"


def config_to_toml(cfg: RunConfig) -> str:
    """The full config as TOML; :func:`load_config` reads it back to an equal config."""
    return dumps_toml(cfg.model_dump(mode="json"))


def save_config(cfg: RunConfig, path: Path) -> None:
    """Write :func:`config_to_toml` atomically."""
    atomic_write_text(path, config_to_toml(cfg))


def atomic_write_text(path: Path, text: str) -> None:
    """Write ``text`` atomically (``shardmeter.io.write_atomic``: temp file + os.replace)."""
    write_atomic(path, text)
