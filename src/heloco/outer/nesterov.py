"""Outer Nesterov SGD: sync DiLoCo (mean of K) and plain async DiLoCo (ρ-scaled, one arrival).

PyTorch convention (SGD nesterov=True, dampening 0):
    G = (1/n) Σ_i ρ_i w_i Δ_i ;  buf ← μ·buf + G ;  θ ← θ − η (G + μ·buf)
(DiLoCo, Douillard et al. 2023, Alg. 1; async: Liu et al. 2024; spec 2.1-2.2.)
"""

from __future__ import annotations

from collections.abc import Sequence

import torch

from heloco.outer.base import (
    Arrival,
    OptimizerState,
    Rho,
    StepStats,
    check_names,
    copy_into,
    plain_dispatch,
    prefixed,
    rho_weight,
    unprefixed,
    weighted_stats,
    zero_momentum,
)
from heloco.types import Params


class Nesterov:
    """Nesterov outer optimizer; one ``step`` averages its arrivals (sync) or applies one (async)."""

    name = "nesterov"

    def __init__(
        self, params: Params, *, lr: float, momentum: float, rho: Rho, n_workers: int
    ) -> None:
        self.lr = lr
        self.momentum = momentum
        self.rho = rho
        self.n_workers = n_workers
        self.buf = zero_momentum(params)
        self.seeded = False

    @torch.no_grad()
    def step(self, params: Params, arrivals: Sequence[Arrival]) -> StepStats:
        mu, lr = self.momentum, self.lr
        coefs = [
            rho_weight(self.rho, self.n_workers, a.staleness) * a.weight / len(arrivals)
            for a in arrivals
        ]
        for a in arrivals:
            check_names(params, a.delta)
        names = list(params)
        stats = weighted_stats(names, arrivals, coefs, self.buf, self.seeded)
        # θ ← θ − η(1+μ)G − ημ²·buf_old  (same as θ − η(G + μ buf_new)); then buf ← μ buf + G.
        for k in names:
            theta, buf = params[k], self.buf[k]
            for a, c in zip(arrivals, coefs, strict=True):
                theta.add_(a.delta[k], alpha=-lr * (1.0 + mu) * c)
            theta.add_(buf, alpha=-lr * mu * mu)
            buf.mul_(mu)
            for a, c in zip(arrivals, coefs, strict=True):
                buf.add_(a.delta[k], alpha=c)
        self.seeded = True
        return stats

    def dispatch_params(self, params: Params) -> Params:
        return plain_dispatch(params)

    def state_dict(self) -> OptimizerState:
        return OptimizerState(prefixed("momentum", self.buf), {"seeded": self.seeded})

    def load_state_dict(self, state: OptimizerState) -> None:
        copy_into(self.buf, unprefixed("momentum", state.tensors))
        self.seeded = bool(state.meta["seeded"])
