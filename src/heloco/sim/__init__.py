"""Simulated clock: workers with paces, rounds processed in order of simulated finish time.

A worker dispatched at time t with H_w steps finishes at t + H_w·pace_w·jitter + comm_w
(spec 3, "Speed heterogeneity"); arrivals are applied in finish-time order, ties broken by
worker id. Sync methods wait for the slowest worker every round. Training is real (the
workers run their inner loops in process); only the clock is simulated, so the same config and
seed give bit-identical losses. The server and the outer optimizers are the product's own.

Modules, one job each: ``config`` (the simulator's names for the run file, whose schema is
:class:`heloco.config.RunConfig`: ``SimConfig`` is that class; random-stream keys),
``clock`` (paces, steps, schedules: the inner-loop component, :class:`InnerSetup`),
``recorder`` (trajectory bookkeeping), ``loop`` (the event loop), ``build`` (the other
components' configs, each with ``build()``, and a run's parts from them), ``run`` (runs end
to end, one or side by side), ``pool`` (the rounds of runs side by side, each distinct round
computed once), ``evalcache`` (evaluations shared by identical parameters), ``stacked`` and
``batch`` (rounds of many TinyGPT workers in one batched kernel).
"""

from __future__ import annotations

import importlib
from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:  # the names as mypy sees them; at run time each loads on first use
    from heloco.sim.build import (
        BudgetSetup,
        ClockSetup,
        DataSetup,
        ModelSetup,
        RunParts,
        ServerSetup,
        WorkerParts,
        build_run,
        build_worker_parts,
        seed_everything,
    )
    from heloco.sim.clock import (
        Clock,
        InnerSetup,
        expected_worker_steps,
        resolve_comm,
        resolve_paces,
        round_seconds,
        round_steps,
        worker_inner_configs,
    )
    from heloco.sim.config import (
        JITTER_KEY,
        MODEL_KEY,
        OUTER_ALIASES,
        PACE_KEY,
        PACE_RULE,
        PaceDistribution,
        SimConfig,
        component_of,
        fold_outer_aliases,
        parse_sim_config,
    )
    from heloco.sim.loop import RoundRunner, simulate
    from heloco.sim.recorder import Evaluator, Recorder, Trajectory
    from heloco.sim.run import (
        CONFIG_FILE,
        RunResult,
        loss_at_time_budget,
        run_simulation,
        run_simulations,
        summarize,
    )

_EXPORTS: dict[str, str] = {
    "BudgetSetup": "heloco.sim.build",
    "CONFIG_FILE": "heloco.sim.run",
    "Clock": "heloco.sim.clock",
    "ClockSetup": "heloco.sim.build",
    "DataSetup": "heloco.sim.build",
    "InnerSetup": "heloco.sim.clock",
    "ModelSetup": "heloco.sim.build",
    "ServerSetup": "heloco.sim.build",
    "Evaluator": "heloco.sim.recorder",
    "JITTER_KEY": "heloco.sim.config",
    "MODEL_KEY": "heloco.sim.config",
    "OUTER_ALIASES": "heloco.sim.config",
    "PACE_KEY": "heloco.sim.config",
    "PACE_RULE": "heloco.sim.config",
    "PaceDistribution": "heloco.sim.config",
    "Recorder": "heloco.sim.recorder",
    "RoundRunner": "heloco.sim.loop",
    "RunParts": "heloco.sim.build",
    "RunResult": "heloco.sim.run",
    "SimConfig": "heloco.sim.config",
    "Trajectory": "heloco.sim.recorder",
    "WorkerParts": "heloco.sim.build",
    "build_run": "heloco.sim.build",
    "build_worker_parts": "heloco.sim.build",
    "component_of": "heloco.sim.config",
    "expected_worker_steps": "heloco.sim.clock",
    "fold_outer_aliases": "heloco.sim.config",
    "loss_at_time_budget": "heloco.sim.run",
    "parse_sim_config": "heloco.sim.config",
    "resolve_comm": "heloco.sim.clock",
    "resolve_paces": "heloco.sim.clock",
    "round_seconds": "heloco.sim.clock",
    "round_steps": "heloco.sim.clock",
    "run_simulation": "heloco.sim.run",
    "run_simulations": "heloco.sim.run",
    "seed_everything": "heloco.sim.build",
    "simulate": "heloco.sim.loop",
    "summarize": "heloco.sim.run",
    "worker_inner_configs": "heloco.sim.clock",
}

__all__ = [
    "CONFIG_FILE",
    "JITTER_KEY",
    "MODEL_KEY",
    "OUTER_ALIASES",
    "PACE_KEY",
    "PACE_RULE",
    "BudgetSetup",
    "Clock",
    "ClockSetup",
    "DataSetup",
    "Evaluator",
    "InnerSetup",
    "ModelSetup",
    "PaceDistribution",
    "Recorder",
    "RoundRunner",
    "RunParts",
    "RunResult",
    "ServerSetup",
    "SimConfig",
    "Trajectory",
    "WorkerParts",
    "build_run",
    "build_worker_parts",
    "component_of",
    "expected_worker_steps",
    "fold_outer_aliases",
    "loss_at_time_budget",
    "parse_sim_config",
    "resolve_comm",
    "resolve_paces",
    "round_seconds",
    "round_steps",
    "run_simulation",
    "run_simulations",
    "seed_everything",
    "simulate",
    "summarize",
    "worker_inner_configs",
]


def __getattr__(name: str) -> Any:
    """Load a name's module on first use, so importing one part (``heloco.sim.config``)
    does not import the simulator."""
    module = _EXPORTS.get(name)
    if module is None:
        raise AttributeError(f"module 'heloco.sim' has no attribute {name!r}")
    value = getattr(importlib.import_module(module), name)
    globals()[name] = value
    return value
