"""HeLoCo: MLA rule + look-ahead dispatch + direction-aware block correction (spec 1.3-1.5).

Per block b, against the momentum m *before* this arrival (HeLoCo Eqs. 7-15, Algorithm 2):
    c = Δ·m / (‖Δ‖‖m‖) ;  conf = ‖Δ‖ / (‖Δ‖ + κ‖m‖ + ε)                           (Eqs. 7-8, 15)
    keep    c ≥ c_ok :  Δ̂ = Δ                                                      (Eq. 9)
    shrink  c < 0    :  β = min(k_s(−c)conf, β_max) ;  Δ̂ = Δ − β (Δ·m̂) m̂            (Eqs. 10-11)
    rotate  otherwise:  ũ = (1−λ)Δ̂ᵤ + λ m̂ ;  Δ̂ = ‖Δ‖ ũ / ‖ũ‖                       (Eqs. 12-13)
      λ published (Eq. 14):      min(k_d (1 − c) conf, 1)
      λ normalized (experiments): min(k_d (1 − t) conf, 1), t = clip((c − c_bad)/(c_ok − c_bad + ε), 0, 1)
Blocks with ‖Δ‖ < ε or ‖m‖ < ε pass through. Every case is Δ̂ = a Δ + b m, so the correction is
computed on per-block scalars only and applied by the MLA step in fused passes.

ε sits where the authors' code puts it, so both agree to float rounding:
  normalized = the paper prototype (``SmartDCMLA_v2``, aaasif-isu/panofabric-engine):
      c = clamp(Δ·m / (‖Δ‖‖m‖ + ε), −1, 1); shrink Δ − β (Δ·m)/(‖m‖+ε)² m; rotation with the unit
      vectors Δ/(‖Δ‖+ε), m/(‖m‖+ε) and ‖Δ‖ ũ/(‖ũ‖+ε) (Δ itself if ‖ũ‖ < ε);
  published  = the production ``block_correct`` (PanocularAI torchft / panofabric-engine):
      c = Δ·m / (max(‖Δ‖,ε) max(‖m‖,ε)), no ε added and no clamp; shrink Δ − β c ‖Δ‖ m/‖m‖;
      rotation with exact unit vectors and ‖Δ‖ ũ/‖ũ‖ (Δ itself unless ‖ũ‖ > ε).
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Literal

import torch

from heloco.config import CorrectionConfig
from heloco.outer.base import Rho, block_dots, block_norms
from heloco.outer.lookahead import BlockGeometry, BlockUpdate, MomentumLookAhead, uncorrected
from heloco.types import Params


@dataclass(frozen=True)
class _Cases:
    """Per-block core coefficients Δ̂ = a·Δ_in + b·m (Δ_in = pre·Δ) and the case masks."""

    a: torch.Tensor
    b: torch.Tensor
    keep: torch.Tensor
    shrink: torch.Tensor
    rotate: torch.Tensor
    lam: torch.Tensor
    beta: torch.Tensor


def _prototype_cases(
    d: torch.Tensor, dot: torch.Tensor, nm: torch.Tensor, cfg: CorrectionConfig
) -> _Cases:
    """The paper prototype's arithmetic (``SmartDCMLA_v2``; normalized λ)."""
    eps = cfg.eps
    degenerate = (d < eps) | (nm < eps)
    c = (dot / (d * nm + eps)).clamp(-1.0, 1.0)
    conf = d / (d + cfg.kappa * nm + eps)
    keep = degenerate | (c >= cfg.c_ok)
    shrink = ~keep & (c < 0) if cfg.shrink_when_negative else torch.zeros_like(keep)
    rotate = ~keep & ~shrink
    beta = torch.clamp(cfg.k_s * (-c) * conf, max=cfg.beta_max)
    t = ((c - cfg.c_bad) / (cfg.c_ok - cfg.c_bad + eps)).clamp(0.0, 1.0)
    lam = torch.clamp(cfg.k_d * (1.0 - t) * conf, max=1.0)
    # ũ = (1−λ) Δ/(‖Δ‖+ε) + λ m/(‖m‖+ε) = p Δ + q m
    p, q = (1 - lam) / (d + eps), lam / (nm + eps)
    u_norm = (p.square() * d.square() + q.square() * nm.square() + 2 * p * q * dot).clamp(min=0)
    u_norm = u_norm.sqrt()
    rotate_ok = u_norm >= eps
    one, zero = torch.ones_like(d), torch.zeros_like(d)
    a = torch.where(rotate & rotate_ok, p * d / (u_norm + eps), one)
    b = torch.where(shrink, -beta * dot / (nm + eps).square(), zero)
    b = torch.where(rotate & rotate_ok, q * d / (u_norm + eps), b)
    return _Cases(a, b, keep, shrink, rotate, lam, beta)


def _production_cases(
    d: torch.Tensor, dot: torch.Tensor, nm: torch.Tensor, cfg: CorrectionConfig
) -> _Cases:
    """The production code's arithmetic (``block_correct``; published λ, Eq. 14)."""
    eps = cfg.eps
    degenerate = (d < eps) | (nm < eps)
    safe_d, safe_m = d.clamp(min=eps), nm.clamp(min=eps)
    c = dot / (safe_d * safe_m)
    conf = d / (d + cfg.kappa * nm + eps)
    keep = degenerate | (c >= cfg.c_ok)
    shrink = ~keep & (c < 0) if cfg.shrink_when_negative else torch.zeros_like(keep)
    rotate = ~keep & ~shrink
    beta = torch.clamp(cfg.k_s * (-c) * conf, max=cfg.beta_max)
    lam = torch.clamp(cfg.k_d * (1.0 - c) * conf, max=1.0)
    # ũ = (1−λ) Δ/max(‖Δ‖,ε) + λ m/max(‖m‖,ε) = p Δ + q m
    p, q = (1 - lam) / safe_d, lam / safe_m
    u_norm = (p.square() * d.square() + q.square() * nm.square() + 2 * p * q * dot).clamp(min=0)
    u_norm = u_norm.sqrt()
    rotate_ok = u_norm > eps
    safe_u = u_norm.clamp(min=eps)
    one, zero = torch.ones_like(d), torch.zeros_like(d)
    a = torch.where(rotate & rotate_ok, p * d / safe_u, one)
    b = torch.where(shrink, -beta * c * d / safe_m, zero)
    b = torch.where(rotate & rotate_ok, q * d / safe_u, b)
    return _Cases(a, b, keep, shrink, rotate, lam, beta)


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
    rule = _prototype_cases if cfg.lambda_form == "normalized" else _production_cases
    k = rule(d, dot, nm, cfg)
    zero = torch.zeros_like(d)
    # Correction size per block, ‖Δ̂ − Δ_in‖ / (‖Δ_in‖ + ε), 0 for ‖Δ_in‖ < ε (the notebook's).
    da = k.a - 1.0
    diff = (da.square() * d.square() + k.b.square() * nm.square() + 2 * da * k.b * dot).clamp(min=0)
    size = torch.where(d >= cfg.eps, diff.sqrt() / (d + cfg.eps), zero)
    return BlockUpdate(
        a=k.a * pre * post,
        b=k.b * post,
        kept=k.keep,
        shrunk=k.shrink,
        rotated=k.rotate,
        lam=torch.where(k.rotate, k.lam, zero),
        beta=torch.where(k.shrink, k.beta, zero),
        size=size,
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
