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
    Geometry,
    MomentumRule,
    StepStats,
    check_names,
    chunks,
    geometry_stats,
    merge_geometry,
    weighted_geometry,
)
from heloco.types import Params


class Nesterov(MomentumRule):
    """Nesterov outer optimizer; one ``step`` averages its arrivals (sync) or applies one (async).

    ``m`` is PyTorch's ``buf`` (momentum_buffer) of the equations above.
    """

    name = "nesterov"

    @torch.no_grad()
    def step(self, params: Params, arrivals: Sequence[Arrival]) -> StepStats:
        """One outer update from the mean of ``arrivals`` (sync) or a single arrival (async)."""
        mu, lr = self.momentum, self.lr
        coefs = [self.arrival_weight(a) / len(arrivals) for a in arrivals]
        for a in arrivals:
            check_names(params, a.delta)
        seeded = self.seeded

        def block(k: str) -> Geometry:
            # θ ← θ − η(1+μ)G − ημ²·buf_old  (= θ − η(G + μ buf_new)); then buf ← μ buf + G.
            parts = []
            for deltas, (theta, buf) in chunks(
                k, [a.delta for a in arrivals], [params[k], self.m[k]]
            ):
                parts.append(weighted_geometry(deltas, coefs, buf, seeded))
                for d, c in zip(deltas, coefs, strict=True):
                    theta.add_(d, alpha=-lr * (1.0 + mu) * c)
                theta.add_(buf, alpha=-lr * mu * mu)
                buf.mul_(mu)
                for d, c in zip(deltas, coefs, strict=True):
                    buf.add_(d, alpha=c)
            return merge_geometry(parts)

        geometry = self.runner.map(block, list(params))
        self.seeded = True
        return geometry_stats(geometry, sum(coefs), seeded)
