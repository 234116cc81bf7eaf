"""Delayed Nesterov (DN), Liu et al. 2024 ("Asynchronous Local-SGD"), Algorithm 3; spec 2.3.

Per push g_t (after ρ and arrival weight), period N, momentum β, lr ε, c ∈ [0, 1/N]:
    Δ_buf += g_t
    every N-th push:  m ← β m + Δ_buf / N ;  θ ← θ − ε((1 − cN + c) β m + g_t / N) ;  Δ_buf ← 0
    otherwise:        θ ← θ − ε(c β m + g_t / N)
With c = 0, N pushes together equal one Nesterov step of lr ε on their mean, so DN uses the
sync outer lr (0.7) rather than the async one; the /N plays the role of ρ (default ρ = 1).
"""

from __future__ import annotations

from collections.abc import Sequence

import torch

from heloco.outer.base import (
    Arrival,
    Geometry,
    MomentumRule,
    OptimizerState,
    Rho,
    StepStats,
    check_names,
    chunks,
    copy_into,
    geometry_stats,
    merge_geometry,
    prefixed,
    unprefixed,
    weighted_geometry,
    zero_momentum,
)
from heloco.types import Params
from shardmeter.errors import UserInputError


class DelayedNesterov(MomentumRule):
    """DN: momentum refreshed every ``period`` pushes; plain −ε g/N in between."""

    name = "dn"

    def __init__(
        self,
        params: Params,
        *,
        lr: float,
        momentum: float,
        rho: Rho,
        n_workers: int,
        period: int,
        c: float = 0.0,
    ) -> None:
        if period < 1:
            raise UserInputError("dn_period", period, "an integer >= 1")
        if not 0.0 <= c <= 1.0 / period:
            raise UserInputError("dn_c", c, f"a number in [0, 1/N] = [0, {1.0 / period:.4g}]")
        super().__init__(params, lr=lr, momentum=momentum, rho=rho, n_workers=n_workers)
        self.period = period
        self.c = c
        self.buf = zero_momentum(params)
        self.pushes = 0

    @torch.no_grad()
    def step(self, params: Params, arrivals: Sequence[Arrival]) -> StepStats:
        """Apply the arrivals one push at a time (a step normally carries exactly one)."""
        stats: StepStats | None = None
        for a in arrivals:
            stats = self._push(params, a)
        if stats is None:
            raise ValueError("DelayedNesterov.step needs at least one arrival")
        return stats

    def _push(self, params: Params, arrival: Arrival) -> StepStats:
        check_names(params, arrival.delta)
        w = self.arrival_weight(arrival)
        seeded = self.pushes > 0
        n, beta, eps, c = self.period, self.momentum, self.lr, self.c
        milestone = (self.pushes + 1) % n == 0

        def block(k: str) -> Geometry:
            parts = []
            state = [params[k], self.m[k], self.buf[k]]
            for (g,), (theta, m, buf) in chunks(k, [arrival.delta], state):
                parts.append(weighted_geometry([g], [w], m, seeded))
                buf.add_(g, alpha=w)
                if milestone:
                    m.mul_(beta).add_(buf, alpha=1.0 / n)
                    theta.add_(m, alpha=-eps * (1.0 - c * n + c) * beta)
                    buf.zero_()
                elif c != 0.0:
                    theta.add_(m, alpha=-eps * c * beta)
                theta.add_(g, alpha=-eps * w / n)
            return merge_geometry(parts)

        geometry = self.runner.map(block, list(params))
        self.pushes += 1
        return geometry_stats(geometry, w, seeded)

    def state_dict(self, copy: bool = True) -> OptimizerState:
        """Momentum and push buffer as tensors, the push count as meta (``seeded`` is unused)."""
        tensors = {**prefixed("momentum", self.m, copy), **prefixed("buffer", self.buf, copy)}
        return OptimizerState(tensors, {"pushes": self.pushes})

    def load_state_dict(self, state: OptimizerState) -> None:
        """Inverse of :meth:`state_dict`."""
        copy_into(self.m, unprefixed("momentum", state.tensors))
        copy_into(self.buf, unprefixed("buffer", state.tensors))
        self.pushes = int(state.meta["pushes"])
