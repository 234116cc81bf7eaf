"""Outer optimizers: what the server does with a pseudo-gradient (pure tensor math, no I/O)."""

from heloco.outer.base import Arrival, OptimizerState, OuterOptimizer, StepStats
from heloco.outer.registry import (
    METHODS,
    OuterConfig,
    build_optimizer,
    method_names,
    resolve_method,
)

__all__ = [
    "METHODS",
    "Arrival",
    "OptimizerState",
    "OuterConfig",
    "OuterOptimizer",
    "StepStats",
    "build_optimizer",
    "method_names",
    "resolve_method",
]
