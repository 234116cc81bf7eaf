"""Momentum look-ahead (MLA) outer rule, the base of HeLoCo (spec 1.6 and 2.6).

EMA momentum and a Nesterov-style look-ahead step (HeLoCo paper Eqs. 18-19):
    m ← μ m + (1 − μ) G ;  θ ← θ − η (G + μ m)
with G = ρ·Δ for one arrival. The update is written per tensor block as G_b = A_b Δ_b + B_b m_b
(plain MLA: A_b = ρ, B_b = 0), so a correction only has to produce the two coefficient vectors
and the step is four fused passes with no temporaries:
    θ ← θ − η(1 + μ(1−μ)) A Δ − η(B + μ² + μ(1−μ)B) m_old ;  m ← (μ + (1−μ)B) m + (1−μ) A Δ
"""

from __future__ import annotations

import math
from collections.abc import Sequence
from dataclasses import dataclass

import torch

from heloco.outer.base import (
    Arrival,
    Delta,
    Geometry,
    MomentumRule,
    Rho,
    StepStats,
    check_names,
    chunks,
    merge_geometry,
    plain_dispatch,
    weighted_geometry,
    whole_cosine,
)
from heloco.types import Params


@dataclass(frozen=True)
class BlockGeometry:
    """Per-block scalars of one arrival (float64 vectors of length n_blocks).

    ``dots`` and ``momentum_norms`` are None while the momentum is still zero.
    """

    delta_norms: torch.Tensor
    dots: torch.Tensor | None
    momentum_norms: torch.Tensor | None


@dataclass(frozen=True)
class BlockUpdate:
    """G_b = a_b Δ_b + b_b m_b per block, plus the correction's case counts and strengths.

    ``size`` is each block's correction size ‖Δ̂_b − Δ_b‖/‖Δ_b‖ (0 without correction).
    """

    a: torch.Tensor
    b: torch.Tensor
    kept: torch.Tensor
    shrunk: torch.Tensor
    rotated: torch.Tensor
    lam: torch.Tensor
    beta: torch.Tensor
    size: torch.Tensor


def uncorrected(weight: float, n_blocks: int) -> BlockUpdate:
    """G = weight·Δ in every block (MLA, and HeLoCo without correction)."""
    zeros = torch.zeros(n_blocks, dtype=torch.float64)
    return BlockUpdate(
        a=torch.full((n_blocks,), weight, dtype=torch.float64),
        b=zeros,
        kept=torch.ones(n_blocks, dtype=torch.bool),
        shrunk=torch.zeros(n_blocks, dtype=torch.bool),
        rotated=torch.zeros(n_blocks, dtype=torch.bool),
        lam=zeros,
        beta=zeros,
        size=zeros,
    )


class MomentumLookAhead(MomentumRule):
    """MLA (Ajanthan et al., ICLR 2025 MCDC workshop, as run by the HeLoCo authors).

    ``lookahead_dispatch`` sends θ − ημm to workers (HeLoCo Eq. 5); MLA itself sends θ.
    """

    name = "mla"

    def __init__(
        self,
        params: Params,
        *,
        lr: float,
        momentum: float,
        rho: Rho,
        n_workers: int,
        lookahead_dispatch: bool = False,
    ) -> None:
        super().__init__(params, lr=lr, momentum=momentum, rho=rho, n_workers=n_workers)
        self.lookahead_dispatch = lookahead_dispatch

    def block_update(self, geometry: BlockGeometry, weight: float) -> BlockUpdate:
        """Coefficients of G per block; overridden by HeLoCo's correction."""
        return uncorrected(weight, geometry.delta_norms.numel())

    @torch.no_grad()
    def step(self, params: Params, arrivals: Sequence[Arrival]) -> StepStats:
        """One outer update from exactly one arrival (Eqs. 18-19 with G from :meth:`block_update`)."""
        if len(arrivals) != 1:
            raise ValueError(
                f"{type(self).__name__} applies one arrival per step, got {len(arrivals)}"
            )
        arrival = arrivals[0]
        check_names(params, arrival.delta)
        names = list(params)
        geometry = self._geometry(arrival.delta, names)
        weight = self.arrival_weight(arrival)
        upd = self.block_update(geometry, weight)
        self._apply(params, arrival.delta, names, upd)
        self.seeded = True
        return _stats(geometry, upd, weight)

    def _geometry(self, delta: Delta, names: list[str]) -> BlockGeometry:
        """Per-block ‖Δ_b‖ and, once the momentum is seeded, ⟨Δ_b, m_b⟩ and ‖m_b‖."""
        seeded = self.seeded

        def block(k: str) -> Geometry:
            parts = []
            for (d,), (m,) in chunks(k, [delta], [self.m[k]]):
                parts.append(weighted_geometry([d], [1.0], m, seeded))
            return merge_geometry(parts)

        found = self.runner.map(block, names)
        columns = [
            torch.tensor(c, dtype=torch.float64).reshape(-1) for c in zip(*found, strict=False)
        ]
        if not columns:
            columns = [torch.zeros(0, dtype=torch.float64)] * 3
        return BlockGeometry(
            delta_norms=columns[0],
            dots=columns[1] if seeded else None,
            momentum_norms=columns[2] if seeded else None,
        )

    def _apply(self, params: Params, delta: Delta, names: list[str], upd: BlockUpdate) -> None:
        mu, lr = self.momentum, self.lr
        coefs = dict(zip(names, zip(upd.a.tolist(), upd.b.tolist(), strict=True), strict=True))

        def block(k: str) -> None:
            a, b = coefs[k]
            for (d,), (theta, m) in chunks(k, [delta], [params[k], self.m[k]]):
                theta.add_(d, alpha=-lr * (1.0 + mu * (1.0 - mu)) * a)
                theta.add_(m, alpha=-lr * (b + mu * mu + mu * (1.0 - mu) * b))
                m.mul_(mu + (1.0 - mu) * b).add_(d, alpha=(1.0 - mu) * a)

        self.runner.map(block, names)

    def dispatches_params(self) -> bool:
        """θ is the dispatch point unless the look-ahead θ̄ is (seeded momentum)."""
        return not (self.lookahead_dispatch and self.seeded)

    @torch.no_grad()
    def dispatch_params(self, params: Params) -> Params:
        """θ̄ = θ − η μ m with look-ahead dispatch (HeLoCo Eq. 5), else θ."""
        if self.dispatches_params():
            return plain_dispatch(params)
        step = -self.lr * self.momentum
        return {k: torch.add(v, self.m[k], alpha=step) for k, v in params.items()}


def _stats(geometry: BlockGeometry, upd: BlockUpdate, weight: float) -> StepStats:
    """Whole-model diagnostics from per-block scalars (no extra passes over the tensors)."""
    nd = geometry.delta_norms
    delta_norm = float(nd.square().sum().sqrt()) * weight
    if geometry.dots is None or geometry.momentum_norms is None:
        return StepStats(rho=weight, delta_norm=delta_norm, cos_delta_momentum=math.nan)
    dots, nm = geometry.dots, geometry.momentum_norms
    da = upd.a - weight
    diff_sq = da.square() * nd.square() + upd.b.square() * nm.square() + 2.0 * da * upd.b * dots
    size = math.sqrt(max(float(diff_sq.sum()), 0.0)) / delta_norm if delta_norm > 0 else 0.0
    n = float(nd.numel())
    return StepStats(
        rho=weight,
        delta_norm=delta_norm,
        cos_delta_momentum=whole_cosine(dots, nd, nm),
        frac_kept=float(upd.kept.sum()) / n,
        frac_shrunk=float(upd.shrunk.sum()) / n,
        frac_rotated=float(upd.rotated.sum()) / n,
        correction_size=size,
        tensor_correction_size=float(upd.size.mean()),
        mean_lambda=float(upd.lam.mean()),
        mean_beta=float(upd.beta.mean()),
    )
