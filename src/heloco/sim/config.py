"""The simulator's names for the run file (:class:`heloco.config.RunConfig`, which the
simulator runs as it is: :data:`SimConfig`), its random-stream keys, and
:func:`component_of`, which takes a component's config (:mod:`heloco.sim.build`) from it."""

from __future__ import annotations

import dataclasses
from typing import Any, TypeVar

from heloco.config import (
    OUTER_ALIASES,
    PACE_RULE,
    PaceDistribution,
    RunConfig,
    fold_outer_aliases,
)
from heloco.config import parse_run_config as parse_sim_config

__all__ = [
    "JITTER_KEY",
    "MODEL_KEY",
    "OUTER_ALIASES",
    "PACE_KEY",
    "PACE_RULE",
    "PaceDistribution",
    "SimConfig",
    "component_of",
    "fold_outer_aliases",
    "parse_sim_config",
]

PACE_KEY = 10  # derive_seed keys of the simulator's own random streams
JITTER_KEY = 11
MODEL_KEY = 12

SimConfig = RunConfig
"""One simulated run: the run file as :func:`heloco.config.load_config` returns it."""

S = TypeVar("S")


def component_of(setup: type[S], cfg: RunConfig, **derived: Any) -> S:
    """The component config ``setup`` (a dataclass) of the run ``cfg``: each field is the run
    config's field of the same name, except those given in ``derived`` (values the component
    takes resolved, e.g. the method's defaults). A component gains a setting by naming a
    run-config field among its own fields, in one place."""
    names = [f.name for f in dataclasses.fields(setup)]  # type: ignore[arg-type]
    values = {n: getattr(cfg, n) for n in names if n not in derived}
    return setup(**values, **derived)
