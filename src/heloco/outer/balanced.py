"""Arrival-balanced weighting: undo the speed skew of asynchronous arrivals (new method).

Under asynchrony a worker's share of outer updates is proportional to its speed, so with
non-IID data the fast workers' data dominate the momentum. Each arrival from worker i is
scaled by
    w_i = (1/K) / s_i ,   s_i = expected share of arrivals from worker i,
which makes every worker's expected contribution per update equal (1/K). Because Σ_i s_i = 1,
the arrival-weighted mean of w is exactly 1 (Σ_i s_i w_i = 1), so the expected effective outer
lr is unchanged. Shares come from known rates (rounds per second, e.g. 1/(H_i·pace_i)) or are
estimated online from arrival counts with a Laplace prior: s_i = (n_i + α)/(N + Kα). Weights
are capped to [1/w_max, w_max] and renormalised so the cap keeps the mean at 1.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import replace

from heloco.outer.base import Arrival, OptimizerState, OuterOptimizer, StepStats
from heloco.types import Params
from shardmeter.errors import UserInputError


def balanced_weights(shares: Sequence[float], max_weight: float) -> list[float]:
    """w_i = (1/K)/s_i, capped to [1/max_weight, max_weight], with Σ s_i w_i = 1."""
    total = sum(shares)
    if total <= 0 or any(s <= 0 for s in shares):
        raise UserInputError("shares", list(shares), "positive expected arrival shares")
    k = len(shares)
    norm = [s / total for s in shares]
    raw = [min(max((1.0 / k) / s, 1.0 / max_weight), max_weight) for s in norm]
    mean = sum(s * w for s, w in zip(norm, raw, strict=True))
    return [w / mean for w in raw]


class ArrivalBalanced:
    """Wrap any single-arrival outer optimizer (HeLoCo, MLA, ...) with arrival balancing."""

    def __init__(
        self,
        inner: OuterOptimizer,
        *,
        n_workers: int,
        rates: Sequence[float] | None = None,
        prior: float = 1.0,
        max_weight: float = 10.0,
    ) -> None:
        if max_weight < 1.0:
            raise UserInputError("ab_max_weight", max_weight, "a number >= 1")
        if prior <= 0:
            raise UserInputError("ab_prior", prior, "a number > 0")
        self.inner = inner
        self.name = f"{inner.name}+ab"
        self.n_workers = n_workers
        self.prior = prior
        self.max_weight = max_weight
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
        """Current per-worker arrival weights w_i (dimensionless, arrival-weighted mean 1)."""
        return balanced_weights(self.shares(), self.max_weight)

    def step(self, params: Params, arrivals: Sequence[Arrival]) -> StepStats:
        """Scale each arrival by its worker's weight, count it, and step the wrapped optimizer."""
        weights = self.weights()
        scaled = [replace(a, weight=a.weight * weights[a.worker]) for a in arrivals]
        for a in arrivals:
            self.counts[a.worker] += 1
        return self.inner.step(params, scaled)

    def dispatch_params(self, params: Params) -> Params:
        """The wrapped optimizer's dispatch point."""
        return self.inner.dispatch_params(params)

    def state_dict(self) -> OptimizerState:
        inner = self.inner.state_dict()
        meta = {"counts": list(self.counts), "rates": self.rates, "inner": inner.meta}
        return OptimizerState(dict(inner.tensors), meta)

    def load_state_dict(self, state: OptimizerState) -> None:
        self.counts = [int(c) for c in state.meta["counts"]]
        rates = state.meta["rates"]
        self.rates = None if rates is None else [float(r) for r in rates]
        self.inner.load_state_dict(OptimizerState(state.tensors, state.meta["inner"]))
