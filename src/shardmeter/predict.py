"""`predict(...)`: one island's step estimate from specs, preset names or files.

This is the Python face of `shardmeter predict`: it resolves names to specs, fills a default
plan when none is given, resolves `recompute="auto"` to the lightest mode that fits in HBM,
validates, and calls the estimator.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from shardmeter.errors import UserInputError
from shardmeter.estimate.result import StepEstimate
from shardmeter.estimate.step import estimate_step
from shardmeter.specs.hardware import Cluster
from shardmeter.specs.loader import (
    list_presets,
    load_accelerator,
    load_cluster,
    load_model,
    load_plan,
    preset_data,
)
from shardmeter.specs.model import TransformerSpec
from shardmeter.specs.plan import Plan, validate_plan

DEFAULT_MODEL = "llama-3.1-8b"
DEFAULT_CLUSTER = "dgx-h100"
DEFAULT_GPUS = 8
RECOMPUTE_ORDER: tuple[str, ...] = ("none", "selective", "full")

# Reference cluster for each accelerator preset: its NVLink domain and NICs (`--gpu NAME`).
REFERENCE_CLUSTERS: dict[str, str] = {
    "a100-40gb": "dgx-a100-40gb",
    "a100-80gb": "dgx-a100",
    "h100-sxm": "dgx-h100",
    "h100-sxm-96gb-500w": "grand-teton-h100",
    "h200": "hgx-h200",
    "h800": "hgx-h800",
    "b200": "dgx-b200",
    "gb200": "gb200-nvl72",
    "gb300": "gb300-nvl72",
    "tpu-v4": "tpu-v4-pod",
    "tpu-v5p": "tpu-v5p-pod",
    "tpu-v5e": "tpu-v5e-pod",
    "mi300x": "mi300x-node",
}

ModelRef = TransformerSpec | str | Path
ClusterRef = Cluster | str | Path | Mapping[str, Any]
PlanRef = Plan | str | Path | Mapping[str, Any]


def default_plan(n_gpus: int, **fields: Any) -> Plan:
    """FSDP over every GPU unless the fields say otherwise.

    dp fills the GPUs left by tp·pp·cp; the global batch defaults to dp·micro_batch sequences,
    times 4·pp micro-batches when pipelining (so the 1F1B bubble is (p−1)/(4p)); sharding
    defaults to zero3 without model parallelism and to zero1 (distributed optimizer) with it,
    unless a `framework` field brings its documented defaults (`shardmeter.specs.framework`).
    """
    values: dict[str, Any] = {k: v for k, v in fields.items() if v is not None}
    for name in ("dp", "tp", "pp", "cp", "micro_batch"):  # 0 is a mistake, never "default"
        if name in values and not (isinstance(values[name], int) and values[name] >= 1):
            raise UserInputError(f"plan.{name}", values[name], "an integer >= 1")
    tp, pp, cp = (int(values.get(k, 1)) for k in ("tp", "pp", "cp"))
    if n_gpus % (tp * pp * cp):
        raise UserInputError("gpus", n_gpus, f"must be a multiple of tp*pp*cp = {tp * pp * cp}")
    dp = int(values.get("dp", n_gpus // (tp * pp * cp)))
    micro = int(values.get("micro_batch", 1))
    if not values.get("framework"):  # a named framework brings its own sharding default
        values.setdefault("sharding", "zero3" if tp * pp == 1 else "zero1")
    values.setdefault("global_batch", dp * micro * (4 * pp if pp > 1 else 1))
    values.update(dp=dp, tp=tp, pp=pp, cp=cp, micro_batch=micro)
    return load_plan(values)


def resolve_recompute(model: TransformerSpec, cluster: Cluster, plan: Plan) -> Plan:
    """The plan with the lightest recompute mode that fits in HBM (full if none fits)."""
    for mode in RECOMPUTE_ORDER:
        candidate = plan.model_copy(update={"recompute": mode})
        if estimate_step(model, cluster, candidate, check_layers=False).fits:
            return candidate
    return plan.model_copy(update={"recompute": "full"})


def reference_cluster(gpu: str) -> str:
    """The cluster preset whose links describe machines built from accelerator `gpu`."""
    if gpu in REFERENCE_CLUSTERS:
        return REFERENCE_CLUSTERS[gpu]
    for info in list_presets("clusters"):
        if preset_data("clusters", info.name).get("accelerator") == gpu:
            return info.name
    raise UserInputError(
        "gpu", gpu, f"no cluster preset uses it; known: {', '.join(REFERENCE_CLUSTERS)}"
    )


def cluster_for_gpu(gpu: str, cluster: ClusterRef | None = None) -> Cluster:
    """`gpu`'s reference cluster, or `cluster` (default: an 8-GPU DGX-style node) with its
    accelerator replaced by `gpu` when no cluster preset is built from that accelerator."""
    if cluster is None:
        try:
            return load_cluster(reference_cluster(gpu))
        except UserInputError:
            load_accelerator(gpu)  # unknown accelerators fail here, naming the known ones
            cluster = DEFAULT_CLUSTER
    return load_cluster(resolve_cluster(cluster), accelerator=gpu, name=f"{gpu}-node")


def resolve_model(model: ModelRef | None) -> TransformerSpec:
    """A spec, preset name or file as a TransformerSpec (None: the default model)."""
    return load_model(model if model is not None else DEFAULT_MODEL)


def resolve_cluster(cluster: ClusterRef | None) -> Cluster:
    """A spec, preset name, file or table as a Cluster (None: the default cluster)."""
    return load_cluster(cluster if cluster is not None else DEFAULT_CLUSTER)


@dataclass(frozen=True)
class PredictInputs:
    """Resolved, validated inputs of one prediction."""

    model: TransformerSpec
    cluster: Cluster
    plan: Plan


def prepare(
    model: ModelRef | None = None,
    cluster: ClusterRef | None = None,
    plan: PlanRef | None = None,
    *,
    n_gpus: int | None = None,
    recompute_auto: bool = False,
) -> PredictInputs:
    """Resolve names and files to specs, fill the default plan, validate, pick recompute."""
    if n_gpus is not None and n_gpus < 1:
        raise UserInputError("n_gpus", n_gpus, "must be a positive integer")
    spec = resolve_model(model)
    island = resolve_cluster(cluster)
    if plan is None:
        chosen = default_plan(n_gpus or DEFAULT_GPUS)
        recompute_auto = True
    else:
        chosen = load_plan(plan)
    validate_plan(chosen, spec, n_gpus)
    if island.n_gpus is not None and chosen.n_gpus > island.n_gpus:
        raise UserInputError(
            "plan", f"{chosen.n_gpus} GPUs", f"the cluster {island.name} has {island.n_gpus}"
        )
    if recompute_auto:
        chosen = resolve_recompute(spec, island, chosen)
    return PredictInputs(spec, island, chosen)


def predict(
    model: ModelRef | None = None,
    cluster: ClusterRef | None = None,
    plan: PlanRef | None = None,
    *,
    n_gpus: int | None = None,
    recompute_auto: bool = False,
) -> StepEstimate:
    """Estimate one training step. Names are presets, paths are TOML/JSON files.

    With no plan, `default_plan(n_gpus or 8)` with the lightest recompute that fits
    (`recompute_auto=True` does the same for a given plan). With `n_gpus`, the plan's
    dp·tp·pp·cp must equal it. Bad input raises UserInputError.
    """
    inputs = prepare(model, cluster, plan, n_gpus=n_gpus, recompute_auto=recompute_auto)
    return estimate_step(inputs.model, inputs.cluster, inputs.plan)
