"""HeLoCo: asynchronous low-communication training under device and data heterogeneity.

data -> worker -> server -> metrics. One server logic (`server.py` + `outer/`) is driven by a
deterministic simulated clock (`sim/`) or by real processes over ZeroMQ (`net/`).

The public API (imported lazily, so `heloco --help` does not pay for torch):

- `load_config(path, preset, overrides)` -> `RunConfig` (the run file; `SimConfig` is the
  same class), `run_simulation(cfg)` -> `RunResult`;
- `Server`, `build_optimizer(method, ...)`, `method_names()`;
- `Worker`, `InnerConfig`, `TinyGPT`, `ModelConfig`, `DataConfig`, `build_data(...)`;
- your own training loop: `OuterLoop(model, optimizer, link)` around it, with
  `connect(address, worker)` (a `heloco serve`) or `LocalLink(server, worker)`; `Rounds`,
  the round boundary every worker loop shares; inside a `torchrun` island, `full_tensor(p)`
  (a sharded parameter's whole value) and `leave_island()` (the island's safe last call);
- `load_runs(dirs)`, `plot_runs(runs, out_dir)`: the report of `heloco report`;
- `pace_map(topology)` (ShardMeter topology -> worker paces), `plan_to_train(run_dirs, ...)`.
"""

from __future__ import annotations

import importlib
from typing import Any

_EXPORTS: dict[str, str] = {
    "SimConfig": "heloco.sim",
    "RunResult": "heloco.sim",
    "run_simulation": "heloco.sim",
    "load_config": "heloco.config",
    "RunConfig": "heloco.config",
    "Server": "heloco.server",
    "ServerConfig": "heloco.server",
    "build_optimizer": "heloco.outer.registry",
    "method_names": "heloco.outer.registry",
    "Worker": "heloco.worker",
    "InnerConfig": "heloco.worker",
    "OuterLoop": "heloco.outer_loop",
    "LocalLink": "heloco.outer_loop",
    "Rounds": "heloco.rounds",
    "full_tensor": "heloco.rounds",
    "leave_island": "heloco.island",
    "connect": "heloco.net.link",
    "TinyGPT": "heloco.model",
    "ModelConfig": "heloco.model",
    "DataConfig": "heloco.data",
    "build_data": "heloco.data",
    "pace_map": "heloco.topology",
    "PaceMap": "heloco.topology",
    "plan_to_train": "heloco.plan_to_train",
    "PlanToTrain": "heloco.plan_to_train",
    "load_runs": "heloco.report",
    "plot_runs": "heloco.report",
}

__all__ = sorted(_EXPORTS)
__version__ = "0.1.0"


def __getattr__(name: str) -> Any:
    module = _EXPORTS.get(name)
    if module is None:
        raise AttributeError(f"module 'heloco' has no attribute {name!r}")
    return getattr(importlib.import_module(module), name)
