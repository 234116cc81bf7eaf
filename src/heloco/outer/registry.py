"""Method registry: a method is one builder and one line in ``METHODS``, beside its policy
(synchronous, DyLU, quorum: how the server drives it) in ``heloco.config.METHOD_POLICIES``,
where the run file checks method names.

Default outer learning rates follow the HeLoCo paper's Table 3 (spec 1.8): async Nesterov 0.07,
everything else 0.7. DN also uses 0.7: with c = 0 its N pushes sum to one Nesterov step of lr ε
on their mean (Liu et al. 2024, Alg. 3), i.e. exactly the sync DiLoCo step, so the sync lr is
the equivalent choice. Any asynchronous method takes a ``+ab`` suffix (arrival balancing).
"""

from __future__ import annotations

from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass

from heloco.config import AB_SUFFIX, METHOD_POLICIES, MethodPolicy, OuterConfig, method_policy
from heloco.config import method_names as method_names
from heloco.outer.balanced import ArrivalBalanced
from heloco.outer.base import OuterOptimizer, Rho
from heloco.outer.delayed import DelayedNesterov
from heloco.outer.heloco import HeLoCo
from heloco.outer.lookahead import MomentumLookAhead
from heloco.outer.nesterov import Nesterov
from heloco.types import Params
from shardmeter.errors import UserInputError

Builder = Callable[[Params, OuterConfig, int, float, Rho], OuterOptimizer]


@dataclass(frozen=True)
class MethodSpec:
    """How to build a method, and (``policy``) how the server must drive it."""

    build: Builder
    default_lr: float
    default_rho: Rho
    policy: MethodPolicy
    description: str = ""


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


_P = METHOD_POLICIES
METHODS: dict[str, MethodSpec] = {
    "sync": MethodSpec(_nesterov, 0.7, "none", _P["sync"], "sync DiLoCo"),
    "async-nesterov": MethodSpec(
        _nesterov, 0.07, "sqrt_k", _P["async-nesterov"], "async DiLoCo, Nesterov"
    ),
    "dn": MethodSpec(_dn, 0.7, "none", _P["dn"], "delayed Nesterov"),
    "dn-dylu": MethodSpec(_dn, 0.7, "none", _P["dn-dylu"], "delayed Nesterov + DyLU"),
    "mla": MethodSpec(_mla, 0.7, "sqrt_k", _P["mla"], "momentum look-ahead"),
    "heloco": MethodSpec(_heloco, 0.7, "sqrt_k", _P["heloco"], "HeLoCo"),
    "decoupled": MethodSpec(
        _nesterov,
        0.7,
        "none",
        _P["decoupled"],
        "Decoupled DiLoCo: asynchronous learners, minimum quorum, grace window, "
        "token-weighted merge (arXiv 2604.21428)",
    ),
    "heloco-uncorrected": MethodSpec(
        _heloco_uncorrected,
        0.7,
        "sqrt_k",
        _P["heloco-uncorrected"],
        "HeLoCo without block correction",
    ),
}


@dataclass(frozen=True)
class Method:
    """A resolved method name: its spec and whether arrival balancing wraps it."""

    name: str
    spec: MethodSpec
    balanced: bool


def resolve_method(name: str) -> Method:
    """Look a method up; ``<async method>+ab`` adds arrival balancing (an unknown name is
    :func:`heloco.config.method_policy`'s one-line error)."""
    method_policy(name)
    balanced = name.endswith(AB_SUFFIX)
    base = name[: -len(AB_SUFFIX)] if balanced else name
    return Method(name=name, spec=METHODS[base], balanced=balanced)


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
