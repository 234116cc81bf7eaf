"""Plan search: enumerate every valid plan, prune with bounds, evaluate on arrays, rank.

`plan(...)` searches one cluster or a topology of islands and returns a `PlanSearchResult`
(ranked candidates, the time-cost Pareto front, why the winner wins, or which constraint
binds). See docs/planner.md for the search space and the pruning rules.
"""

from shardmeter.search.api import plan
from shardmeter.search.options import Constraints, OuterOptions, SpaceOptions
from shardmeter.search.result import (
    Candidate,
    Explanation,
    Infeasibility,
    IslandChoice,
    OuterChoice,
    PlanSearchResult,
    SearchStats,
)

__all__ = [
    "Candidate",
    "Constraints",
    "Explanation",
    "Infeasibility",
    "IslandChoice",
    "OuterChoice",
    "OuterOptions",
    "PlanSearchResult",
    "SearchStats",
    "SpaceOptions",
    "plan",
]
