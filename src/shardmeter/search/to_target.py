"""A plan search ranked by time to a target loss: the search's top plans per outer mode,
re-ranked by q × wall-clock with the quality factors of :mod:`shardmeter.quality`."""

from __future__ import annotations

from dataclasses import replace
from typing import Any

from shardmeter.quality import QualityFactors, RankedPlan, rank_by_time_to_target, topology_payload
from shardmeter.search.api import plan
from shardmeter.search.options import OuterOptions


def plan_to_target(
    quality: QualityFactors, method: str | None = None, top_k: int = 20, **plan_kwargs: Any
) -> list[RankedPlan]:
    """`shardmeter.search.plan(...)` ranked by time to the target loss, best first.

    The planner keeps its top_k by raw wall-clock, where a slower-per-token mode (DiLoCo next
    to async) may not appear at all; so each allowed outer mode is searched on its own and the
    union is ranked by q × wall-clock. A single-cluster search has no outer mode (q = 1).
    """
    if plan_kwargs.get("topology") is None:
        found = plan(top_k=top_k, **plan_kwargs).ranked
        return rank_by_time_to_target(found, quality, method)[:top_k]
    payload = topology_payload(plan_kwargs["topology"])
    outer: OuterOptions = plan_kwargs.pop("outer", None) or OuterOptions()
    ranked: list[RankedPlan] = []
    for mode in outer.modes:
        found = plan(outer=replace(outer, modes=(mode,)), top_k=top_k, **plan_kwargs).ranked
        ranked += rank_by_time_to_target(found, quality, method, payload)
    ranked.sort(key=lambda r: (r.time_to_target_s, r.cost_to_target_usd))
    return ranked[:top_k]
