"""Arrival balancing: undo the speed skew of asynchronous arrivals (a method of our own).

Under asynchrony a worker's share of outer updates is proportional to its speed, so with
non-IID data the fast workers' data dominate the momentum. Balancing reweights each arrival so
that the *data* the updates carry match what synchronous DiLoCo would feed (every worker an
equal say), then applies the wrapped optimizer (HeLoCo, MLA, ...).

Weights, per arrival from worker i (s = expected arrival shares, P = the workers' data mixtures,
one column per worker over the data sources, q = P·1/K = the synchronous mix):
    u = argmin_{u ∈ simplex} ‖P u − q‖² + λ‖u − s‖²          (applied-weight share per worker)
    r = TV(P s, q) / TV(s, 1/K)                                 (how skewed the data mix is)
    w_i = (u_i / s_i)^(γ r), capped to [1/w_max, w_max]        (γ tempers, 0 = no balancing)
    normalize "clip": min(1, w / Σ_j s_j w_j)   (default: over-represented workers down to
                                                 their fair share, nobody up)
    normalize "max":  w / max_j w_j             (the least represented at 1, everyone else less)
    normalize "mean": w / Σ_j s_j w_j           (expected outer lr unchanged; amplifies the slow)
With one data source per worker (P = I) the minimiser is u = q = 1/K, i.e. w_i ∝ (1/K)/s_i,
and r = 1. When the workers' mixtures overlap, the speed skew distorts the data
mix less than the arrival mix (TV = total variation distance), r < 1 and the weights move toward
1 (the plain method); identical mixtures give r = 0. Shares come from known rates
(rounds per second, e.g. 1/(H_i·pace_i)) or are estimated online from arrival counts with a
Laplace prior: s_i = (n_i + α)/(N + Kα).

Why a weight never exceeds 1 by default (measured in BENCHMARKS.md): "mean" multiplies the
step of an update that is stale by about 1/s_i revisions by up to (1/K)/s_i. When several slow
workers land together, or past the early phase of training, that overshoots (runs diverged);
"clip" and "max" only down-weight, so no step is ever larger than the plain method's. "clip"
keeps more of the outer learning rate than "max" and lost least against the plain method where
the speeds differ little.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import replace

import numpy as np

from heloco.config import Normalize
from heloco.outer.base import Arrival, BlockRunner, OptimizerState, OuterOptimizer, StepStats
from heloco.types import Params
from shardmeter.errors import UserInputError

OVERLAP_REG = 1e-6  # λ: prefers, among equally balanced data mixes, the one closest to s
QP_ITERATIONS = 500


def mixture_matrix(mixtures: Sequence[Mapping[str, float]]) -> np.ndarray:
    """P (sources × workers): worker i's data mixture in column i, each column summing to 1."""
    sources = sorted({src for mix in mixtures for src in mix})
    p = np.array([[float(mix.get(src, 0.0)) for mix in mixtures] for src in sources])
    totals = p.sum(axis=0)
    if p.size == 0 or np.any(totals <= 0) or np.any(p < 0):
        raise UserInputError(
            "mixtures", list(mixtures), "one non-negative, non-empty mix per worker"
        )
    return p / totals


def project_simplex(v: np.ndarray) -> np.ndarray:
    """Euclidean projection onto {u ≥ 0, Σu = 1} (Duchi et al. 2008, Fig. 1)."""
    srt = np.sort(v)[::-1]
    cum = np.cumsum(srt) - 1.0
    idx = np.arange(1, v.size + 1)
    k = idx[srt - cum / idx > 0][-1]
    return np.maximum(v - cum[k - 1] / k, 0.0)


def balanced_shares(shares: np.ndarray, p: np.ndarray | None) -> np.ndarray:
    """u = argmin over the simplex of ‖P u − q‖² + λ‖u − s‖², q = P·1/K (module docstring).

    One distinct source per worker (P = None, or PᵀP = I) has the unique minimiser u = 1/K
    at λ → 0, used as is. Otherwise: the equality-constrained minimiser (one linear solve);
    if it has a negative entry, projected gradient descent from its projection (convex; step
    1/L, L the Hessian's largest eigenvalue)."""
    k = shares.size
    if p is None or (p.shape[0] >= k and np.allclose(p.T @ p, np.eye(k))):
        return np.full(k, 1.0 / k)
    q = p.mean(axis=1)
    hess = p.T @ p + OVERLAP_REG * np.eye(k)
    lin = p.T @ q + OVERLAP_REG * shares
    x = np.linalg.solve(hess, np.column_stack([lin, np.ones(k)]))
    u = x[:, 0] + (1.0 - x[:, 0].sum()) / x[:, 1].sum() * x[:, 1]  # Lagrange: Σu = 1
    if np.all(u >= 0):
        return u
    step = 1.0 / float(np.linalg.eigvalsh(hess)[-1])
    u = project_simplex(u)
    for _ in range(QP_ITERATIONS):
        u = project_simplex(u - step * (hess @ u - lin))
    return u


def skew_ratio(shares: np.ndarray, p: np.ndarray | None) -> float:
    """r = TV(P s, q) / TV(s, 1/K) in [0, 1]: the data-mix distortion of plain asynchrony
    relative to its worst case (disjoint data); 1 without mixtures or with balanced shares."""
    k = shares.size
    worst = 0.5 * float(np.abs(shares - 1.0 / k).sum())
    if p is None or worst <= 1e-12:
        return 1.0
    return min(1.0, 0.5 * float(np.abs(p @ shares - p.mean(axis=1)).sum()) / worst)


def balanced_weights(
    shares: Sequence[float],
    max_weight: float,
    *,
    power: float = 1.0,
    normalize: Normalize = "clip",
    mixtures: np.ndarray | None = None,
) -> list[float]:
    """Per-worker arrival weights from expected arrival shares (module docstring)."""
    s = np.asarray(shares, dtype=np.float64)
    total = float(s.sum())
    if total <= 0 or np.any(s <= 0):
        raise UserInputError("shares", list(shares), "positive expected arrival shares")
    s = s / total
    u = balanced_shares(s, mixtures)
    exponent = power * skew_ratio(s, mixtures)
    raw = np.clip((np.maximum(u, 0.0) / s) ** exponent, 1.0 / max_weight, max_weight)
    if normalize == "max":
        return [float(w) for w in raw / raw.max()]
    w = raw / float(s @ raw)
    return [float(x) for x in (np.minimum(w, 1.0) if normalize == "clip" else w)]


class ArrivalBalanced:
    """Wrap any single-arrival outer optimizer (HeLoCo, MLA, ...) with arrival balancing."""

    def __init__(
        self,
        inner: OuterOptimizer,
        *,
        n_workers: int,
        rates: Sequence[float] | None = None,
        mixtures: Sequence[Mapping[str, float]] | None = None,
        prior: float = 1.0,
        max_weight: float = 10.0,
        power: float = 1.0,
        normalize: Normalize = "clip",
    ) -> None:
        if max_weight < 1.0:
            raise UserInputError("ab_max_weight", max_weight, "a number >= 1")
        if prior <= 0:
            raise UserInputError("ab_prior", prior, "a number > 0")
        if not 0.0 <= power <= 1.0:
            raise UserInputError("ab_power", power, "a number in [0, 1]")
        if mixtures is not None and len(mixtures) != n_workers:
            raise UserInputError("mixtures", len(mixtures), f"{n_workers} mixtures, one per worker")
        self.inner = inner
        self.name = f"{inner.name}+ab"
        self.n_workers = n_workers
        self.prior = prior
        self.max_weight = max_weight
        self.power = power
        self.normalize: Normalize = normalize
        self.mixtures = None if mixtures is None else mixture_matrix(mixtures)
        self.rates: list[float] | None = None
        self.counts = [0] * n_workers
        if rates is not None:
            self.set_rates(rates)

    def set_rates(self, rates: Sequence[float]) -> None:
        """Use known arrival rates (rounds/s per worker) instead of online counts."""
        if len(rates) != self.n_workers or any(r <= 0 for r in rates):
            raise UserInputError("rates", list(rates), f"{self.n_workers} positive rates")
        self.rates = [float(r) for r in rates]

    def shares(self) -> list[float]:
        """Current estimate of each worker's share of arrivals (sums to 1)."""
        if self.rates is not None:
            total = sum(self.rates)
            return [r / total for r in self.rates]
        n = sum(self.counts)
        return [(c + self.prior) / (n + self.n_workers * self.prior) for c in self.counts]

    def weights(self) -> list[float]:
        """Current per-worker arrival weights w_i (dimensionless; see the module docstring)."""
        return balanced_weights(
            self.shares(),
            self.max_weight,
            power=self.power,
            normalize=self.normalize,
            mixtures=self.mixtures,
        )

    def step(self, params: Params, arrivals: Sequence[Arrival]) -> StepStats:
        """Scale each arrival by its worker's weight, count it, and step the wrapped optimizer."""
        weights = self.weights()
        scaled = [replace(a, weight=a.weight * weights[a.worker]) for a in arrivals]
        for a in arrivals:
            self.counts[a.worker] += 1
        return self.inner.step(params, scaled)

    @property
    def runner(self) -> BlockRunner:
        """The wrapped optimizer's block runner."""
        return self.inner.runner

    @runner.setter
    def runner(self, value: BlockRunner) -> None:
        self.inner.runner = value

    def dispatch_params(self, params: Params) -> Params:
        """The wrapped optimizer's dispatch point."""
        return self.inner.dispatch_params(params)

    def dispatches_params(self) -> bool:
        """Whether the wrapped optimizer dispatches θ itself."""
        return self.inner.dispatches_params()

    def state_dict(self, copy: bool = True) -> OptimizerState:
        """The wrapped optimizer's state plus the arrival counts and known rates."""
        inner = self.inner.state_dict(copy)
        meta = {"counts": list(self.counts), "rates": self.rates, "inner": inner.meta}
        return OptimizerState(dict(inner.tensors), meta)

    def load_state_dict(self, state: OptimizerState) -> None:
        self.counts = [int(c) for c in state.meta["counts"]]
        rates = state.meta["rates"]
        self.rates = None if rates is None else [float(r) for r in rates]
        self.inner.load_state_dict(OptimizerState(state.tensors, state.meta["inner"]))
