"""Two-objective (time, cost) Pareto fronts and dominance tests, both minimised.

A point is on the front when no other point is at least as good in both objectives and better
in one (Sailor's two objectives, design doc C.10). O(n log n): sort by time, keep each point
cheaper than every faster one.
"""

from __future__ import annotations

import numpy as np
from numpy.typing import ArrayLike, NDArray

IntArray = NDArray[np.int64]
BoolArray = NDArray[np.bool_]


def pareto_front(time: ArrayLike, cost: ArrayLike) -> IntArray:
    """Indices of the non-dominated points, ordered by increasing time (decreasing cost)."""
    t = np.asarray(time, dtype=np.float64).reshape(-1)
    c = np.asarray(cost, dtype=np.float64).reshape(-1)
    if t.size == 0:
        return np.zeros(0, dtype=np.int64)
    order = np.lexsort((c, t))  # by time, ties by cost
    c_sorted = c[order]
    prev_best = np.minimum.accumulate(np.concatenate(([np.inf], c_sorted[:-1])))
    keep = c_sorted < prev_best
    return np.asarray(order[keep], dtype=np.int64)


def dominated(
    time: ArrayLike, cost: ArrayLike, front_time: ArrayLike, front_cost: ArrayLike
) -> BoolArray:
    """True where some front point has time ≤ `time` and cost ≤ `cost`.

    `front_*` must come from `pareto_front` (time ascending, cost descending): the cheapest
    front point no slower than t is the last one with front_time ≤ t.
    """
    ft = np.asarray(front_time, dtype=np.float64)
    fc = np.asarray(front_cost, dtype=np.float64)
    t = np.asarray(time, dtype=np.float64)
    c = np.asarray(cost, dtype=np.float64)
    if ft.size == 0:
        return np.zeros(np.broadcast_shapes(t.shape, c.shape), dtype=np.bool_)
    idx = np.searchsorted(ft, t, side="right") - 1
    cheapest = np.where(idx >= 0, fc[np.maximum(idx, 0)], np.inf)
    return np.asarray(cheapest <= c, dtype=np.bool_)
