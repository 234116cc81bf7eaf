"""A measured curve's value at x, written once: loss at a token or time budget, linearly
interpolated between the two evaluations that bracket it.

`value_at(xs, ys, x, outside=...)` on ascending `xs` (repeats allowed):
- inside [xs[0], xs[-1]]: the first bracket xs[i-1] ≤ x ≤ xs[i] gives
  y[i-1] + (y[i] − y[i-1]) · (x − xs[i-1]) / (xs[i] − xs[i-1]); so at an x where two evals
  sit, the first of them counts, except at the very first x, whose zero-width bracket
  (xs[1] = xs[0]) gives y[1];
- outside the range (the run stopped before x, or x precedes the first eval), and for no
  points at all: `outside="none"` returns None, `"nan"` returns nan, `"clamp"` returns the
  nearest end's y (no points: ValueError);
- x at an eval's x gives that eval's y exactly (a nan or inf at the next eval does not leak
  in); between two evals a nan or inf y propagates as the arithmetic gives it.
"""

from __future__ import annotations

import math
from collections.abc import Sequence
from typing import Literal, overload

Outside = Literal["none", "nan", "clamp"]


@overload
def value_at(
    xs: Sequence[float], ys: Sequence[float], x: float, outside: Literal["nan", "clamp"]
) -> float: ...
@overload
def value_at(
    xs: Sequence[float], ys: Sequence[float], x: float, outside: Literal["none"]
) -> float | None: ...
def value_at(xs: Sequence[float], ys: Sequence[float], x: float, outside: Outside) -> float | None:
    """y at `x` on the piecewise-linear curve (xs, ys); see the module docstring for the ends."""
    if not xs or x < xs[0] or x > xs[-1]:
        if outside == "clamp":
            if not xs:
                raise ValueError("value_at: a curve without points has no value to clamp to")
            return ys[0] if x < xs[0] else ys[-1]
        return None if outside == "none" else math.nan
    for i in range(1, len(xs)):
        if x <= xs[i]:
            x0, x1 = xs[i - 1], xs[i]
            if x1 == x0:
                return ys[i]
            if x == x0:
                return ys[i - 1]  # exactly, even when the next y is nan or inf
            return ys[i - 1] + (ys[i] - ys[i - 1]) * (x - x0) / (x1 - x0)
    return ys[-1]
