"""Sweeps over a topology (island size, H, WAN bandwidth, island count, batch) and their knees.

A sweep re-runs the topology estimate with one knob changed. Two kinds of knee are stated in
words: the island size where marginal tokens/s per added GPU falls below half of the first
GPU's (diminishing returns, design doc C.8), and the H or bandwidth where the regime flips from
communication- to compute-bound (utilization ≥ threshold).
"""

from __future__ import annotations

import itertools
import math
from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from shardmeter.errors import UserInputError
from shardmeter.estimate.islands import (
    IslandInput,
    TopologyEstimate,
    compose_run,
    island_inputs,
    with_run,
)
from shardmeter.estimate.outer import MODES
from shardmeter.estimate.wan import wan_paths
from shardmeter.io import atomic_savefig
from shardmeter.specs.model import TransformerSpec
from shardmeter.specs.topology import Topology, resolve_cluster, resolve_model

SWEEP_PARAMS: dict[str, str] = {
    "island_size": "GPUs per island",
    "inner_steps": "inner steps H",
    "bandwidth": "WAN bandwidth of the bottleneck link (Gbit/s)",
    "islands": "number of islands",
    "batch": "sequences per island per inner step",
    "gpu_mtbf": "mean time between failures per GPU (hours)",
}
KNEE_FRACTION = 0.5  # marginal tokens/s per added GPU below this share of the first GPU's


@dataclass(frozen=True)
class SweepPoint:
    """One value of the swept knob and what the topology does there."""

    value: float
    n_gpus: int
    tokens_per_s: float
    tokens_per_s_per_gpu: float
    utilization: float
    wall_s: float
    cost_usd: float
    usd_per_mtok: float
    compute_bound: bool
    regime: str
    goodput: float = 1.0  # share of wall time not lost to failures and checkpoints


@dataclass(frozen=True)
class Knee:
    """A transition found in a sweep, with the sentence that states it."""

    kind: str  # "diminishing returns" or "regime flip"
    value: float | None
    text: str


@dataclass(frozen=True)
class SweepResult:
    """A one-knob sweep of a topology."""

    topology: str
    mode: str
    param: str
    label: str
    points: tuple[SweepPoint, ...]
    knees: tuple[Knee, ...]
    skipped: tuple[str, ...]  # values that could not run, with the reason
    threshold: float = 0.9  # utilization that counts as compute-bound


def _point(value: float, est: TopologyEstimate) -> SweepPoint:
    return SweepPoint(
        value=value,
        n_gpus=est.n_gpus,
        tokens_per_s=est.tokens_per_s,
        tokens_per_s_per_gpu=est.tokens_per_s_per_gpu,
        utilization=est.utilization,
        wall_s=est.wall_s,
        cost_usd=est.cost_usd,
        usd_per_mtok=est.usd_per_mtok,
        compute_bound=est.compute_bound,
        regime=est.regime,
        goodput=est.failures.goodput,
    )


def island_batch(topo: Topology, index: int) -> int | None:
    island = topo.islands[index]
    if island.global_batch is not None:
        return island.global_batch
    if isinstance(island.plan, dict) and "global_batch" in island.plan:
        return int(island.plan["global_batch"])
    return topo.run.global_batch


def resize_islands(topo: Topology, gpus: int) -> Topology:
    """Every island with `gpus` GPUs (whole nodes, or part of one node) and an auto plan,
    keeping its batch."""
    islands = []
    for i, island in enumerate(topo.islands):
        gpn = resolve_cluster(island, i).gpus_per_node
        if gpus < gpn:
            shape: dict[str, Any] = {"n_nodes": 1, "gpus_per_node": gpus, "nvlink_domain": gpus}
        elif gpus % gpn == 0:
            shape = {"n_nodes": gpus // gpn}
        else:
            raise UserInputError("island_size", gpus, f"must divide or be a multiple of {gpn}")
        update = {**shape, "plan": "auto", "global_batch": island_batch(topo, i)}
        islands.append(island.model_copy(update=update))
    return topo.model_copy(update={"islands": islands})


def rebatch_islands(topo: Topology, batch: int) -> Topology:
    """Every island with `batch` sequences per inner step and an auto plan."""
    islands = [i.model_copy(update={"plan": "auto", "global_batch": batch}) for i in topo.islands]
    return topo.model_copy(update={"islands": islands})


def default_values(topo: Topology, param: str, base: TopologyEstimate) -> list[float]:
    """A sensible grid for each knob around the topology's own setting."""
    if param == "island_size":
        batches = [island_batch(topo, i) or 1 for i in range(len(topo.islands))]
        limit = min(batches)
        return [float(2**k) for k in range(0, 11) if 2**k <= limit]
    if param == "inner_steps":
        return [1, 2, 5, 10, 20, 50, 100, 200, 500, 1000, 2000, 5000]
    if param == "bandwidth":
        return [0.1, 0.2, 0.5, 1, 2, 5, 10, 20, 50, 100, 200, 500, 1000]
    if param == "islands":
        return [float(k) for k in range(1, len(topo.islands) + 1)]
    if param == "batch":
        gpus = max(isl.n_gpus for isl in base.islands)
        return [float(gpus * 2**k) for k in range(0, 7)]
    if param == "gpu_mtbf":
        return [1e3, 3e3, 1e4, 3e4, 1e5, 3e5, 1e6]
    raise UserInputError("sweep", param, f"choose from {', '.join(SWEEP_PARAMS)}")


def _whole(param: str, value: float) -> int:
    """A sweep value that counts something (steps, GPUs, islands, sequences) as an int."""
    if not (float(value).is_integer() and value >= 1):
        raise UserInputError(param, value, "a positive whole number")
    return int(value)


def sweep(
    topology: Topology,
    param: str,
    values: Sequence[float] | None = None,
    **overrides: Any,
) -> SweepResult:
    """Evaluate `topology` at each value of one knob (see SWEEP_PARAMS); run-setting
    `overrides` (mode, bits, ...) apply to every point."""
    if param not in SWEEP_PARAMS:
        raise UserInputError("sweep", param, f"choose from {', '.join(SWEEP_PARAMS)}")
    topo = with_run(topology, **overrides)
    model = resolve_model(topo.run)
    inputs = island_inputs(topo, model)
    base = compose_run(topo, inputs, model)
    grid = list(values) if values is not None else default_values(topo, param, base)
    points: list[SweepPoint] = []
    skipped: list[str] = []
    for value in grid:
        try:
            est = _sweep_point(topo, model, inputs, base, param, value)
        except UserInputError as exc:
            skipped.append(f"{value:g}: {exc}")
            continue
        points.append(_point(float(value), est))
    knees = find_knees(param, points, base)
    return SweepResult(
        topology=topo.name,
        mode=topo.run.mode,
        param=param,
        label=SWEEP_PARAMS[param],
        points=tuple(points),
        knees=knees,
        skipped=tuple(skipped),
        threshold=base.threshold,
    )


def compare_modes(
    topology: Topology, modes: Sequence[str] = MODES, **overrides: Any
) -> list[TopologyEstimate]:
    """The same topology under each outer mode (other run settings kept), for one table of
    tokens/s, utilization, goodput, expected wall-clock and dollars per mode."""
    topo = with_run(topology, **overrides)
    model = resolve_model(topo.run)
    inputs = island_inputs(topo, model)
    out = []
    for mode in modes:
        run = with_run(topo, mode=mode).run
        out.append(compose_run(topo, inputs, model, run=run))
    return out


def _sweep_point(
    topo: Topology,
    model: TransformerSpec,
    inputs: Sequence[IslandInput],
    base: TopologyEstimate,
    param: str,
    value: float,
) -> TopologyEstimate:
    """The topology with knob `param` at `value`."""
    if param == "inner_steps":
        return compose_run(
            topo, inputs, model, run=with_run(topo, inner_steps=_whole(param, value)).run
        )
    if param == "bandwidth":
        if not value > 0:
            raise UserInputError(param, value, "a positive bandwidth in Gbit/s")
        scale = value / base.wan_gbit if math.isfinite(base.wan_gbit) else 1.0
        return compose_run(topo, inputs, model, wan=wan_paths(topo).scaled(scale))
    if param == "islands":
        k = _whole(param, value)
        if k > len(inputs):
            raise UserInputError(param, value, f"at most the {len(inputs)} islands")
        return compose_run(topo, inputs[:k], model, wan=wan_paths(topo).subset(list(range(k))))
    if param == "gpu_mtbf":
        if not value > 0:
            raise UserInputError(param, value, "a positive number of hours")
        failures = topo.run.failures.model_copy(update={"gpu_mtbf_hours": float(value)})
        return compose_run(topo, inputs, model, run=with_run(topo, failures=failures).run)
    if param == "island_size":
        sized = resize_islands(topo, _whole(param, value))
        return compose_run(sized, island_inputs(sized, model), model)
    batched = rebatch_islands(topo, _whole(param, value))
    return compose_run(batched, island_inputs(batched, model), model)


def diminishing_returns_knee(points: Sequence[SweepPoint]) -> Knee:
    """First island size where marginal tokens/s per added GPU < half the first GPU's."""
    if len(points) < 2:
        return Knee("diminishing returns", None, "too few island sizes to find a knee")
    first = points[0]
    per_first = first.tokens_per_s / first.n_gpus
    for prev, cur in itertools.pairwise(points):
        marginal = (cur.tokens_per_s - prev.tokens_per_s) / (cur.n_gpus - prev.n_gpus)
        if marginal < KNEE_FRACTION * per_first:
            return Knee(
                "diminishing returns",
                cur.value,
                f"Diminishing returns from {cur.value:g} GPUs per island: going from "
                f"{prev.value:g} to {cur.value:g} adds {marginal:,.0f} tokens/s per added GPU, "
                f"below half of the first configuration's {per_first:,.0f} tokens/s per GPU "
                f"(at {first.value:g} GPUs per island).",
            )
    return Knee(
        "diminishing returns",
        None,
        f"No knee up to {points[-1].value:g} GPUs per island: every added GPU still brings at "
        f"least half of the first configuration's {per_first:,.0f} tokens/s per GPU.",
    )


def regime_flip(param: str, points: Sequence[SweepPoint], base: TopologyEstimate) -> Knee:
    """Where the sweep turns compute-bound (utilization ≥ threshold) or stops being so, read
    off the same points the table shows, with the exact value from the estimate's threshold
    search for H and bandwidth."""
    label = SWEEP_PARAMS[param]
    theta = f"utilization ≥ {base.threshold:.0%}"
    exact = ""
    at: float | None = None
    if param == "inner_steps" and base.min_inner_steps is not None:
        exact = f" The exact threshold is H = {base.min_inner_steps}."
        at = float(base.min_inner_steps)
    if param == "bandwidth" and base.min_wan_gbit is not None:
        exact = f" The exact threshold is {base.min_wan_gbit:.3g} Gbit/s on {base.bottleneck.link}."
        at = base.min_wan_gbit
    if not points:
        return Knee("regime flip", None, "No feasible point.")
    bound = [p.value for p in points if p.compute_bound]
    if len(bound) == len(points):
        return Knee(
            "regime flip", None, f"Compute-bound ({theta}) over the whole range of {label}.{exact}"
        )
    if not bound:
        return Knee(
            "regime flip",
            None,
            f"Never compute-bound ({theta}) over this range of {label}: {points[-1].regime}.{exact}",
        )
    prev, cur = next(
        (a, b) for a, b in itertools.pairwise(points) if a.compute_bound != b.compute_bound
    )
    where = ", ".join(f"{v:g}" for v in bound)
    if cur.compute_bound:
        value = at if at is not None and prev.value < at <= cur.value else cur.value
        text = (
            f"The run flips from {prev.regime} to compute-bound ({theta}) between {label} "
            f"{prev.value:g} and {cur.value:g}.{exact}"
        )
    else:
        value = cur.value
        text = (
            f"The run stops being compute-bound ({theta}) between {label} {prev.value:g} "
            f"and {cur.value:g}: {cur.regime}. Compute-bound at {where}."
        )
    return Knee("regime flip", value, text)


def find_knees(
    param: str, points: Sequence[SweepPoint], base: TopologyEstimate
) -> tuple[Knee, ...]:
    """The knees this kind of sweep can show."""
    if param == "island_size":
        return (diminishing_returns_knee(points), regime_flip(param, points, base))
    return (regime_flip(param, points, base),)


def plot_compare(
    results: Sequence[tuple[str, SweepResult]],
    path: Path,
    *,
    title: str,
    metrics: Sequence[str] = ("utilization", "cost_usd"),
    dpi: int = 72,
) -> Path:
    """Several sweeps of the same knob on one figure, one line per labelled configuration and
    one panel per metric (a SweepPoint field: utilization, tokens_per_s, wall_s, cost_usd)."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    names = {
        "utilization": "compute utilization",
        "tokens_per_s": "tokens/s (total)",
        "wall_s": "wall-clock to budget (days)",
        "cost_usd": "cost (USD)",
    }
    scale = {"wall_s": 1 / 86400.0}
    fig, axes = plt.subplots(1, len(metrics), figsize=(4.2 * len(metrics), 3.4), squeeze=False)
    first = results[0][1]
    for ax, metric in zip(axes.flat, metrics, strict=True):
        for label, res in results:
            xs = [p.value for p in res.points]
            ys = [getattr(p, metric) * scale.get(metric, 1.0) for p in res.points]
            ax.plot(xs, ys, marker="o", markersize=3, label=label)
        ax.set_title(names.get(metric, metric), fontsize=9)
        ax.set_xlabel(first.label, fontsize=8)
        ax.tick_params(labelsize=7)
        if first.param != "islands":
            ax.set_xscale("log")
        if metric in ("cost_usd", "wall_s"):
            ax.set_yscale("log")
        if metric == "utilization":
            ax.axhline(first.threshold, color="tab:gray", linestyle=":", linewidth=0.8)
        ax.grid(alpha=0.3)
    axes.flat[0].legend(fontsize=7)
    fig.suptitle(title, fontsize=10)
    fig.tight_layout()
    atomic_savefig(fig, path, format=path.suffix[1:], dpi=dpi)
    plt.close(fig)
    return path


def plot_sweep(
    result: SweepResult, out_dir: Path, dpi: int = 72, formats: Sequence[str] = ("png", "svg")
) -> list[Path]:
    """Four panels (throughput, utilization, time, cost) against the knob, written as
    `<topology>-<mode>-<knob>.<format>` for each format (PNG and SVG by default)."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    xs = [p.value for p in result.points]
    panels = (
        ("tokens/s (total)", [p.tokens_per_s for p in result.points]),
        ("compute utilization", [p.utilization for p in result.points]),
        ("wall-clock to budget (days)", [p.wall_s / 86400 for p in result.points]),
        ("cost (USD)", [p.cost_usd for p in result.points]),
    )
    fig, axes = plt.subplots(2, 2, figsize=(8, 5.5))
    for ax, (title, ys) in zip(axes.flat, panels, strict=True):
        ax.plot(xs, ys, marker="o", markersize=3)
        ax.set_title(title, fontsize=9)
        ax.set_xlabel(result.label, fontsize=8)
        ax.tick_params(labelsize=7)
        if result.param in ("inner_steps", "bandwidth", "island_size", "batch", "gpu_mtbf"):
            ax.set_xscale("log")
        ax.grid(alpha=0.3)
        if title == "compute utilization":
            ax.axhline(result.threshold, color="tab:gray", linestyle=":", linewidth=0.8)
        for knee in result.knees:
            if knee.value is not None:
                ax.axvline(knee.value, color="tab:red", linestyle="--", linewidth=0.8)
    fig.suptitle(f"{result.topology} ({result.mode}): sweep over {result.label}", fontsize=10)
    fig.subplots_adjust(left=0.08, right=0.98, bottom=0.09, top=0.9, hspace=0.5, wspace=0.25)
    stem = f"{result.topology}-{result.mode}-{result.param}"
    paths = [out_dir / f"{stem}.{fmt}" for fmt in formats]
    for path, fmt in zip(paths, formats, strict=True):
        atomic_savefig(fig, path, format=fmt, dpi=dpi)
    plt.close(fig)
    return paths
