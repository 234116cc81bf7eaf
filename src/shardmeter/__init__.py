"""ShardMeter: an analytical performance model and planner for transformer training.

Specs -> estimate -> report. The public API:

- specs: `TransformerSpec`, `Accelerator`, `Cluster`, `Link`, `Plan`, `Topology` and their
  loaders (`load_model`, `load_accelerator`, `load_cluster`, `load_plan`, `load_topology`,
  `model_from_hf_config`, `list_presets`);
- one island: `predict(model, cluster, plan)` -> `StepEstimate`;
  vectorized `estimate_step_arrays(model, cluster, PlanArrays)` -> `StepArrays`;
- many islands: `predict_topology(topology)` -> `TopologyEstimate`; `sweep(...)` -> `SweepResult`;
- search: `plan(...)` -> `PlanSearchResult`; `plan_to_target(quality_factors(run_dir), ...)`
  ranks plans by predicted time to a target loss measured in HeLoCo runs;
- validation: `evaluate_rows(read_rows(path))` against published measurements.

`import shardmeter` needs numpy and pydantic only (the CLI adds rich for tables and matplotlib
for plots); it never imports torch or heloco.
"""

from shardmeter.analysis import SweepResult, plot_sweep, sweep
from shardmeter.calibrate import evaluate_rows, read_rows
from shardmeter.errors import UserInputError
from shardmeter.estimate.islands import (
    IslandEstimate,
    IslandInput,
    TopologyEstimate,
    compose,
    predict_topology,
)
from shardmeter.estimate.outer import OuterRound, outer_round
from shardmeter.estimate.plan_arrays import PlanArrays
from shardmeter.estimate.result import StepArrays, StepEstimate
from shardmeter.estimate.step import estimate_step, estimate_step_arrays
from shardmeter.estimate.wan import WanPaths, wan_paths
from shardmeter.predict import predict
from shardmeter.quality import quality_factors
from shardmeter.search import Constraints, PlanSearchResult, plan
from shardmeter.search.to_target import plan_to_target
from shardmeter.specs import Accelerator, Cluster, Efficiency, Link, MoESpec, Plan, TransformerSpec
from shardmeter.specs.hf import model_from_hf_config
from shardmeter.specs.loader import (
    list_presets,
    load_accelerator,
    load_cluster,
    load_model,
    load_plan,
)
from shardmeter.specs.topology import Topology, load_topology
from shardmeter.version import __version__

__all__ = [
    "Accelerator",
    "Cluster",
    "Constraints",
    "Efficiency",
    "IslandEstimate",
    "IslandInput",
    "Link",
    "MoESpec",
    "OuterRound",
    "Plan",
    "PlanArrays",
    "PlanSearchResult",
    "StepArrays",
    "StepEstimate",
    "SweepResult",
    "Topology",
    "TopologyEstimate",
    "TransformerSpec",
    "UserInputError",
    "WanPaths",
    "__version__",
    "compose",
    "estimate_step",
    "estimate_step_arrays",
    "evaluate_rows",
    "list_presets",
    "load_accelerator",
    "load_cluster",
    "load_model",
    "load_plan",
    "load_topology",
    "model_from_hf_config",
    "outer_round",
    "plan",
    "plan_to_target",
    "plot_sweep",
    "predict",
    "predict_topology",
    "quality_factors",
    "read_rows",
    "sweep",
    "wan_paths",
]
