"""Method registry: a method is one builder and one line in ``METHODS``.

Default outer learning rates follow the HeLoCo paper's Table 3 (spec 1.8): async Nesterov 0.07,
everything else 0.7. DN also uses 0.7: with c = 0 its N pushes sum to one Nesterov step of lr ε
on their mean (Liu et al. 2024, Alg. 3), i.e. exactly the sync DiLoCo step, so the sync lr is
the equivalent choice. Any asynchronous method takes a ``+ab`` suffix (arrival balancing).
"""

from __future__ import annotations

from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass
from typing import Annotated, Literal

from pydantic import BaseModel, ConfigDict, Field

from heloco.outer.balanced import ArrivalBalanced, Normalize
from heloco.outer.base import OuterOptimizer, Rho, RhoMode
from heloco.outer.delayed import DelayedNesterov
from heloco.outer.heloco import CorrectionConfig, HeLoCo
from heloco.outer.lookahead import MomentumLookAhead
from heloco.outer.nesterov import Nesterov
from heloco.types import Params
from shardmeter.errors import UserInputError

AB_SUFFIX = "+ab"


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


Builder = Callable[[Params, OuterConfig, int, float, Rho], OuterOptimizer]


@dataclass(frozen=True)
class MethodSpec:
    """How to build a method and how the server must drive it."""

    build: Builder
    default_lr: float
    default_rho: Rho
    synchronous: bool = False
    dylu: bool = False
    description: str = ""
    quorum: bool = False  # Decoupled DiLoCo: buffered rounds merged once a quorum has one


def _nesterov(p: Params, c: OuterConfig, k: int, lr: float, rho: Rho) -> OuterOptimizer:
    return Nesterov(p, lr=lr, momentum=c.momentum, rho=rho, n_workers=k)


def _dn(p: Params, c: OuterConfig, k: int, lr: float, rho: Rho) -> OuterOptimizer:
    period = c.dn_period or k
    return DelayedNesterov(
        p, lr=lr, momentum=c.momentum, rho=rho, n_workers=k, period=period, c=c.dn_c
    )


def _mla(p: Params, c: OuterConfig, k: int, lr: float, rho: Rho) -> OuterOptimizer:
    return MomentumLookAhead(p, lr=lr, momentum=c.momentum, rho=rho, n_workers=k)


def _heloco(p: Params, c: OuterConfig, k: int, lr: float, rho: Rho) -> OuterOptimizer:
    return HeLoCo(
        p,
        lr=lr,
        momentum=c.momentum,
        rho=rho,
        n_workers=k,
        correction=c.correction,
        rho_order=c.rho_order,
    )


def _heloco_uncorrected(p: Params, c: OuterConfig, k: int, lr: float, rho: Rho) -> OuterOptimizer:
    return HeLoCo(p, lr=lr, momentum=c.momentum, rho=rho, n_workers=k, correction=None)


METHODS: dict[str, MethodSpec] = {
    "sync": MethodSpec(_nesterov, 0.7, "none", synchronous=True, description="sync DiLoCo"),
    "async-nesterov": MethodSpec(_nesterov, 0.07, "sqrt_k", description="async DiLoCo, Nesterov"),
    "dn": MethodSpec(_dn, 0.7, "none", description="delayed Nesterov"),
    "dn-dylu": MethodSpec(_dn, 0.7, "none", dylu=True, description="delayed Nesterov + DyLU"),
    "mla": MethodSpec(_mla, 0.7, "sqrt_k", description="momentum look-ahead"),
    "heloco": MethodSpec(_heloco, 0.7, "sqrt_k", description="HeLoCo"),
    "decoupled": MethodSpec(
        _nesterov,
        0.7,
        "none",
        quorum=True,
        description="Decoupled DiLoCo: asynchronous learners, minimum quorum, grace window, "
        "token-weighted merge (arXiv 2604.21428)",
    ),
    "heloco-uncorrected": MethodSpec(
        _heloco_uncorrected, 0.7, "sqrt_k", description="HeLoCo without block correction"
    ),
}


@dataclass(frozen=True)
class Method:
    """A resolved method name: its spec and whether arrival balancing wraps it."""

    name: str
    spec: MethodSpec
    balanced: bool


def method_names() -> list[str]:
    """Every accepted method name (base methods, then the balanced variants)."""
    base = list(METHODS)
    return base + [n + AB_SUFFIX for n, s in METHODS.items() if not s.synchronous]


def resolve_method(name: str) -> Method:
    """Look a method up; ``<async method>+ab`` adds arrival balancing."""
    balanced = name.endswith(AB_SUFFIX)
    base = name[: -len(AB_SUFFIX)] if balanced else name
    spec = METHODS.get(base)
    if spec is None or (balanced and spec.synchronous):
        raise UserInputError("method", name, "one of " + ", ".join(method_names()))
    return Method(name=name, spec=spec, balanced=balanced)


def build_optimizer(
    method: str,
    params: Params,
    cfg: OuterConfig,
    n_workers: int,
    rates: Sequence[float] | None = None,
    mixtures: Sequence[Mapping[str, float]] | None = None,
) -> OuterOptimizer:
    """The outer optimizer of ``method`` for a model shaped like ``params``.

    ``rates`` (expected rounds/s per worker) feed arrival balancing when ``ab_shares='paces'``;
    ``mixtures`` (each worker's data mixture over its sources, e.g. languages) when
    ``ab_data='mixtures'``.
    """
    if n_workers < 1:
        raise UserInputError("workers", n_workers, "an integer >= 1")
    m = resolve_method(method)
    lr = cfg.lr if cfg.lr is not None else m.spec.default_lr
    rho = cfg.rho if cfg.rho is not None else m.spec.default_rho
    opt = m.spec.build(params, cfg, n_workers, lr, rho)
    if not m.balanced:
        return opt
    if cfg.ab_shares == "paces" and rates is None:
        raise UserInputError("ab_shares", "paces", "needs known worker paces (rates)")
    return ArrivalBalanced(
        opt,
        n_workers=n_workers,
        rates=rates if cfg.ab_shares == "paces" else None,
        mixtures=mixtures if cfg.ab_data == "mixtures" else None,
        prior=cfg.ab_prior,
        max_weight=cfg.ab_max_weight,
        power=cfg.ab_power,
        normalize=cfg.ab_normalize,
    )
