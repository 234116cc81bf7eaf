"""What a plan search returns: ranked candidates, the time-cost front, and the reasons.

`Candidate` is one full plan (one island's inner plan, or every used island's inner plan plus
the outer settings) with its wall-clock and cost for the token budget (design doc C.10).
"""

from __future__ import annotations

from dataclasses import dataclass, field

import numpy as np
from numpy.typing import NDArray

from shardmeter.estimate.islands import TopologyEstimate
from shardmeter.estimate.result import StepEstimate
from shardmeter.search.options import Constraints
from shardmeter.specs.plan import Plan

FloatArray = NDArray[np.float64]

SCHEMA_VERSION = 1
CLOUD_POINTS = 8000  # evaluated plans kept for the plot's cloud (a strided sample)


@dataclass(frozen=True)
class IslandChoice:
    """One island in a candidate: how many of its GPUs, its inner plan, and its step."""

    name: str
    accelerator: str
    n_gpus: int
    plan: Plan
    step: StepEstimate


@dataclass(frozen=True)
class OuterChoice:
    """How the used islands synchronise (design doc C.9)."""

    mode: str  # sync | diloco | streaming | async | single (one island, no outer loop)
    inner_steps: int
    bits: int
    fragments: int
    overlap_steps: int


@dataclass(frozen=True)
class Candidate:
    """One plan and what it costs for the token budget. Times in s, money in USD."""

    islands: tuple[IslandChoice, ...]
    outer: OuterChoice | None  # None for a single-cluster search
    n_gpus: int
    tokens_per_s: float
    wall_s: float
    cost_usd: float
    usd_per_mtok: float
    mfu: float  # GPU-weighted model FLOPs utilization including outer-loop losses
    utilization: float  # share of wall time in inner steps (1 for one cluster)
    meets: bool  # meets the deadline and the budget


@dataclass(frozen=True)
class TermDiff:
    """One breakdown term of the winner and the runner-up, in seconds per million tokens."""

    term: str
    winner: float
    runner_up: float

    @property
    def saved(self) -> float:
        return self.runner_up - self.winner


@dataclass(frozen=True)
class Explanation:
    """Why the top plan beats the runner-up: the terms that differ, largest first."""

    speedup: float  # runner-up wall / winner wall
    terms: tuple[TermDiff, ...]
    plan_diffs: tuple[str, ...]  # "tp: 8 → 4"
    text: str


@dataclass(frozen=True)
class Infeasibility:
    """No plan meets the constraints: which one binds, and the closest plan."""

    binding: str  # "memory", "deadline", "budget" or "deadline and budget"
    closest: Candidate | None
    text: str


@dataclass(frozen=True)
class SearchStats:
    """Counts and timings of one search (plans = grid entries, see docs/planner.md)."""

    space: int  # plans the enumeration produced (divisibility rules applied)
    pruned_memory: int
    pruned_bound: int
    evaluated: int  # passed to the vectorized estimator
    runnable: int
    fitting: int
    elapsed_s: float
    eval_cpu_s: float  # CPU seconds inside estimate_step_arrays
    outer_combinations: int = 0  # island subsets × GPU counts × outer settings composed
    jobs: int = 1

    @property
    def evals_per_cpu_s(self) -> float:
        return self.runnable / self.eval_cpu_s if self.eval_cpu_s > 0 else float("nan")


@dataclass(frozen=True)
class PlanSearchResult:
    """Everything `shardmeter plan` prints; `ranked` is sorted by wall-clock time."""

    kind: str  # "cluster" or "topology"
    model: str
    target: str  # cluster or topology name
    tokens: float
    constraints: Constraints
    ranked: tuple[Candidate, ...]
    pareto: tuple[Candidate, ...]  # time-cost front of the plans meeting the constraints
    best_cost: Candidate | None
    explanation: Explanation | None
    infeasible: Infeasibility | None
    stats: SearchStats
    top_estimate: TopologyEstimate | None = None  # the top plan composed (topology search)
    cloud_wall_s: FloatArray = field(default_factory=lambda: np.zeros(0))
    cloud_cost_usd: FloatArray = field(default_factory=lambda: np.zeros(0))
    cloud_group: NDArray[np.int64] = field(default_factory=lambda: np.zeros(0, dtype=np.int64))
    cloud_labels: tuple[str, ...] = ()  # label of each cloud_group value (outer mode, GPUs)

    @property
    def best_time(self) -> Candidate | None:
        """The fastest plan meeting the constraints (`ranked[0]`)."""
        return self.ranked[0] if self.ranked else None

    @property
    def best_usd_per_mtok(self) -> Candidate | None:
        """The plan with the lowest USD per million tokens: with one token budget for every
        plan, $/Mtok = cost / budget, so this is `best_cost`."""
        return self.best_cost
