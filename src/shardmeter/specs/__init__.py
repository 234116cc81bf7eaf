"""What the user describes: model, hardware and plan (validated, loadable from TOML/JSON)."""

from shardmeter.specs.hardware import Accelerator, Cluster, Efficiency, Link
from shardmeter.specs.model import MLASpec, MoESpec, TransformerSpec
from shardmeter.specs.plan import Plan, validate_plan

__all__ = [
    "Accelerator",
    "Cluster",
    "Efficiency",
    "Link",
    "MLASpec",
    "MoESpec",
    "Plan",
    "TransformerSpec",
    "validate_plan",
]
