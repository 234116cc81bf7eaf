"""Simulated clock: workers with paces, rounds processed in order of simulated finish time.

A worker dispatched at time t with H_w steps finishes at t + H_w·pace_w·jitter + comm_w
(spec 3, "Speed heterogeneity"); arrivals are applied in finish-time order, ties broken by
worker id. Sync methods wait for the slowest worker every round. Training is real (the
workers run their inner loops in process); only the clock is simulated, so the same config and
seed give bit-identical losses. The server and the outer optimizers are the product's own.

Modules, one job each: ``config`` (SimConfig), ``clock`` (paces, steps, schedules),
``recorder`` (trajectory bookkeeping), ``loop`` (the event loop), ``build`` (a run's parts),
``run`` (runs end to end, one or side by side), ``pool`` (the rounds of runs side by side,
each distinct round computed once), ``evalcache`` (evaluations shared by identical
parameters), ``stacked`` and ``batch`` (rounds of many TinyGPT workers in one batched kernel).
"""

from __future__ import annotations

import importlib
from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:  # the names as mypy sees them; at run time each loads on first use
    from heloco.sim.build import (
        RunParts,
        WorkerParts,
        build_run,
        build_server,
        build_worker_parts,
        initial_model,
        model_config_for,
        seed_everything,
    )
    from heloco.sim.clock import (
        Clock,
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
    "CONFIG_FILE": "heloco.sim.run",
    "Clock": "heloco.sim.clock",
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
    "build_server": "heloco.sim.build",
    "build_worker_parts": "heloco.sim.build",
    "expected_worker_steps": "heloco.sim.clock",
    "fold_outer_aliases": "heloco.sim.config",
    "initial_model": "heloco.sim.build",
    "loss_at_time_budget": "heloco.sim.run",
    "model_config_for": "heloco.sim.build",
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
    "Clock",
    "Evaluator",
    "PaceDistribution",
    "Recorder",
    "RoundRunner",
    "RunParts",
    "RunResult",
    "SimConfig",
    "Trajectory",
    "WorkerParts",
    "build_run",
    "build_server",
    "build_worker_parts",
    "expected_worker_steps",
    "fold_outer_aliases",
    "initial_model",
    "loss_at_time_budget",
    "model_config_for",
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
