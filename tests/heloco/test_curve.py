"""value_at: the one loss-at-budget helper (metrics, report and experiments read through it)."""

from __future__ import annotations

import math

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from heloco.curve import value_at

XS, YS = [0.0, 10.0, 10.0, 30.0], [4.0, 3.0, 2.5, 1.5]


def test_inside_interpolates_the_first_bracket() -> None:
    assert value_at(XS, YS, 5.0, "none") == 3.5
    assert value_at(XS, YS, 0.0, "nan") == 4.0  # the first eval exactly
    assert value_at(XS, YS, 10.0, "clamp") == 3.0  # two evals at 10: the first bracket ends
    assert value_at([5.0, 5.0, 9.0], [2.0, 1.0, 0.0], 5.0, "none") == 1.0  # zero-width first
    assert value_at(XS, YS, 20.0, "none") == 2.5 + (1.5 - 2.5) * 10.0 / 20.0
    assert value_at(XS, YS, 30.0, "none") == 1.5
    assert value_at([7.0], [2.0], 7.0, "none") == 2.0  # one eval, at x


def test_outside_the_range_none_nan_or_clamp() -> None:
    for x in (-1.0, 31.0):
        assert value_at(XS, YS, x, "none") is None
        assert math.isnan(value_at(XS, YS, x, "nan"))
    assert value_at(XS, YS, -1.0, "clamp") == 4.0
    assert value_at(XS, YS, 31.0, "clamp") == 1.5
    assert value_at([], [], 1.0, "none") is None
    assert math.isnan(value_at([], [], 1.0, "nan"))
    with pytest.raises(ValueError, match="without points"):
        value_at([], [], 1.0, "clamp")


def test_a_nan_loss_propagates_between_evals_not_onto_an_eval() -> None:
    assert math.isnan(value_at([0.0, 1.0], [math.nan, 1.0], 0.5, "none") or 0.0)
    assert value_at([0.0, 1.0], [2.0, math.nan], 0.0, "clamp") == 2.0  # a diverged next eval


@settings(max_examples=50, deadline=None, derandomize=True)
@given(
    st.lists(st.floats(0, 1e6), min_size=2, max_size=8, unique=True),
    st.data(),
)
def test_agrees_with_numpy_interp_on_distinct_points(xs: list[float], data: st.DataObject) -> None:
    xs = sorted(xs)
    ys = data.draw(st.lists(st.floats(0, 10), min_size=len(xs), max_size=len(xs)))
    x = data.draw(st.floats(xs[0], xs[-1]))
    assert value_at(xs, ys, x, "none") == pytest.approx(float(np.interp(x, xs, ys)), abs=1e-9)
