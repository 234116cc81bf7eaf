"""HeLoCo: MLA rule + look-ahead dispatch + direction-aware block correction (spec 1.3-1.5).

Per block b, against the momentum m *before* this arrival (HeLoCo Eqs. 7-15, Algorithm 2):
    c = clamp(Δ·m / (‖Δ‖‖m‖ + ε), −1, 1) ;  conf = ‖Δ‖ / (‖Δ‖ + κ‖m‖ + ε)          (Eqs. 7-8, 15)
    keep    c ≥ c_ok :  Δ̂ = Δ                                                      (Eq. 9)
    shrink  c < 0    :  β = min(k_s(−c)conf, β_max) ;  Δ̂ = Δ − β c ‖Δ‖ m/‖m‖         (Eqs. 10-11)
    rotate  otherwise:  ũ = (1−λ)Δ/‖Δ‖ + λ m/‖m‖ ;  Δ̂ = ‖Δ‖ ũ / max(‖ũ‖, ε)          (Eqs. 12-13)
      λ published (Eq. 14):      min(k_d (1 − c) conf, 1)
      λ normalized (experiments): min(k_d (1 − t) conf, 1), t = clip((c − c_bad)/(c_ok − c_bad + ε), 0, 1)
Blocks with ‖Δ‖ < ε or ‖m‖ < ε pass through. Every case is Δ̂ = a Δ + b m, so the correction is
computed on per-block scalars only and applied by the MLA step in fused passes.
"""

from __future__ import annotations

from typing import Literal

import torch
from pydantic import BaseModel, ConfigDict, Field

from heloco.outer.base import Rho, block_dots, block_norms
from heloco.outer.lookahead import BlockGeometry, BlockUpdate, MomentumLookAhead, uncorrected
from heloco.types import Params


class CorrectionConfig(BaseModel):
    """Hyperparameters of the block correction (defaults: spec 1.8, authors' code)."""

    model_config = ConfigDict(extra="forbid", frozen=True)

    c_ok: float = Field(0.2, description="keep threshold on the cosine")
    k_s: float = Field(0.5, ge=0, description="shrink strength")
    beta_max: float = Field(0.5, ge=0, le=1, description="shrink cap")
    k_d: float = Field(1.0, ge=0, description="rotation strength")
    kappa: float = Field(3.0, ge=0, description="momentum weight in the confidence")
    c_bad: float = Field(-0.2, description="lower anchor of the normalized λ")
    eps: float = Field(1e-8, gt=0)
    lambda_form: Literal["normalized", "published"] = "normalized"
    scope: Literal["tensor", "model"] = Field(
        "tensor", description="one decision per parameter tensor, or one for the whole model"
    )
    shrink_when_negative: bool = Field(
        True, description="shrink anti-aligned blocks; if false they are rotated instead"
    )


def correction_coefficients(
    geometry: BlockGeometry, pre: float, post: float, cfg: CorrectionConfig
) -> BlockUpdate:
    """Coefficients of post·correct(pre·Δ, m) = a Δ + b m per block (Algorithm 2, branch-free).

    ``pre``/``post`` carry ρ applied before (paper experiments) or after (torchft) correcting.
    """
    nd, dots, nm = geometry.delta_norms, geometry.dots, geometry.momentum_norms
    n_blocks = nd.numel()
    if dots is None or nm is None:
        return uncorrected(pre * post, n_blocks)
    d, dot = nd * pre, dots * pre
    if cfg.scope == "model":
        d = d.square().sum().sqrt().expand(n_blocks)
        nm = nm.square().sum().sqrt().expand(n_blocks)
        dot = dot.sum().expand(n_blocks)
    eps = cfg.eps
    degenerate = (d < eps) | (nm < eps)
    c = (dot / (d * nm + eps)).clamp(-1.0, 1.0)
    conf = d / (d + cfg.kappa * nm + eps)
    keep = degenerate | (c >= cfg.c_ok)
    shrink = ~keep & (c < 0) if cfg.shrink_when_negative else torch.zeros_like(keep)
    rotate = ~keep & ~shrink

    beta = torch.clamp(cfg.k_s * (-c) * conf, max=cfg.beta_max)
    if cfg.lambda_form == "published":
        lam = torch.clamp(cfg.k_d * (1.0 - c) * conf, max=1.0)
    else:
        t = ((c - cfg.c_bad) / (cfg.c_ok - cfg.c_bad + eps)).clamp(0.0, 1.0)
        lam = torch.clamp(cfg.k_d * (1.0 - t) * conf, max=1.0)
    safe_nm = torch.where(degenerate, torch.ones_like(nm), nm)
    safe_d = torch.where(degenerate, torch.ones_like(d), d)
    true_cos = (dot / (safe_d * safe_nm)).clamp(-1.0, 1.0)
    u_norm = (
        ((1 - lam).square() + lam.square() + 2 * lam * (1 - lam) * true_cos).clamp(min=0).sqrt()
    )
    u_norm = u_norm.clamp(min=eps)

    one, zero = torch.ones_like(d), torch.zeros_like(d)
    a = torch.where(rotate, (1 - lam) / u_norm, one)
    b = torch.where(shrink, -beta * c * d / safe_nm, zero)
    b = torch.where(rotate, lam * d / (safe_nm * u_norm), b)
    return BlockUpdate(
        a=a * pre * post,
        b=b * post,
        kept=keep,
        shrunk=shrink,
        rotated=rotate,
        lam=torch.where(rotate, lam, zero),
        beta=torch.where(shrink, beta, zero),
    )


def correct(delta: Params, momentum: Params, cfg: CorrectionConfig) -> tuple[Params, BlockUpdate]:
    """Δ̂ for a whole pseudo-gradient (ρ = 1); the tensor form of :func:`correction_coefficients`."""
    names = list(delta)
    deltas, moms = [delta[k] for k in names], [momentum[k] for k in names]
    geometry = BlockGeometry(block_norms(deltas), block_dots(deltas, moms), block_norms(moms))
    upd = correction_coefficients(geometry, 1.0, 1.0, cfg)
    out = {
        k: d * a + m * b
        for k, d, m, a, b in zip(names, deltas, moms, upd.a.tolist(), upd.b.tolist(), strict=True)
    }
    return out, upd


class HeLoCo(MomentumLookAhead):
    """HeLoCo outer optimizer; ``correction=None`` gives the "HeLoCo without correction" ablation."""

    name = "heloco"

    def __init__(
        self,
        params: Params,
        *,
        lr: float,
        momentum: float,
        rho: Rho,
        n_workers: int,
        correction: CorrectionConfig | None = None,
        rho_order: Literal["before", "after"] = "before",
    ) -> None:
        super().__init__(
            params, lr=lr, momentum=momentum, rho=rho, n_workers=n_workers, lookahead_dispatch=True
        )
        self.correction = correction
        self.rho_order = rho_order

    def block_update(self, geometry: BlockGeometry, weight: float) -> BlockUpdate:
        """G per block: ρ·Δ without correction, else the corrected coefficients (Algorithm 2)."""
        if self.correction is None:
            return uncorrected(weight, geometry.delta_norms.numel())
        pre, post = (weight, 1.0) if self.rho_order == "before" else (1.0, weight)
        return correction_coefficients(geometry, pre, post, self.correction)
