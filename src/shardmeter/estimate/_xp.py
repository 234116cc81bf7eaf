"""Element-wise helpers that keep Python scalars scalar and arrays arrays.

The estimator's formulas run on numpy arrays (many plans) or on plain floats (one plan, where
numpy's per-call overhead would dominate). Arithmetic operators already work on both; these
cover the few functions that do not.
"""

from __future__ import annotations

import math
from typing import Any, TypeAlias

import numpy as np

Num: TypeAlias = Any  # a Python int/float/bool or a numpy array of them (broadcastable)


_ND = np.ndarray


def where(cond: Num, a: Num, b: Num) -> Num:
    """`np.where`, or a plain conditional when the condition is one value (for all plans)."""
    if not isinstance(cond, _ND) or cond.ndim == 0:
        return a if cond else b
    if isinstance(b, float) and b == 0.0 and isinstance(cond, _ND) and cond.dtype == np.bool_:
        return a * cond  # the same values for finite a, several times faster than np.where
    return np.where(cond, a, b)


def maximum(a: Num, b: Num) -> Num:
    if isinstance(a, _ND) or isinstance(b, _ND):
        return np.maximum(a, b)
    return a if a >= b else b


def minimum(a: Num, b: Num) -> Num:
    if isinstance(a, _ND) or isinstance(b, _ND):
        return np.minimum(a, b)
    return a if a <= b else b


def ceil(a: Num) -> Num:
    return np.ceil(a) if isinstance(a, _ND) else float(math.ceil(a))


def floor(a: Num) -> Num:
    return np.floor(a) if isinstance(a, _ND) else float(math.floor(a))


def sqrt(a: Num) -> Num:
    return np.sqrt(a) if isinstance(a, _ND) else math.sqrt(a)


def log(a: Num) -> Num:
    return np.log(a) if isinstance(a, _ND) else math.log(a)


def logical_not(a: Num) -> Num:
    return np.logical_not(a) if isinstance(a, _ND) else not a


def as_float(a: Num) -> Num:
    """float64 view of an int/bool column, or float() of a scalar."""
    return np.asarray(a, dtype=np.float64) if isinstance(a, _ND) else float(a)


def full_like(a: Num, value: float) -> Num:
    return np.full_like(np.asarray(a, dtype=np.float64), value) if isinstance(a, _ND) else value
