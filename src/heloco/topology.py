"""From a ShardMeter topology to simulated worker paces and communication delays.

One simulated worker per island. ShardMeter predicts, for the planned (big) model, each island's
inner-step time T_inner,i and the time T_comm,i to push its pseudo-gradient to the parameter
server at the hub and pull the model back. The simulator runs a small model, so only the
*ratios* carry over (docs/plan-to-train.md):

    scale   = min_j T_inner,j           real seconds per simulated second
    pace_i  = T_inner,i / scale         simulated seconds per inner step (fastest island: 1)
    delay_i = T_comm,i / scale          simulated seconds added to each round

so that simulated time × scale is the predicted wall-clock of the same schedule on the real
topology. Every method in the simulator exchanges through one server, so T_comm,i is
HeLoCo's own exchange in ShardMeter's async mode: a push of N·q/8 bytes and a pull of θ in
fp32 (N·4 bytes), each RTT_i + its bytes from TCP's initial window at the path's rate (+ host
copies; ``heloco_exchange_s``),
zero for the hub island (design doc C.9); server overload is not modelled here.
"""

from __future__ import annotations

import argparse
import json
from collections.abc import Sequence
from dataclasses import asdict, dataclass
from pathlib import Path
from typing import Any

import numpy as np

from heloco.metrics import atomic_write_json
from shardmeter.errors import UserInputError
from shardmeter.estimate.islands import island_inputs, with_run
from shardmeter.estimate.outer import outer_round
from shardmeter.estimate.wan import wan_paths
from shardmeter.specs.topology import Topology, load_topology, resolve_model

PACE_FILE = "topology.json"
PACE_SCHEMA_VERSION = 1


@dataclass(frozen=True)
class IslandPace:
    """One island as a simulated worker. Real times in seconds, prices in USD."""

    name: str
    accelerator: str
    n_gpus: int
    inner_step_s: float  # predicted seconds per inner step of the planned model
    comm_s: float  # predicted seconds per round: pseudo-gradient push + model pull
    pace: float  # simulated seconds per inner step
    comm_delay: float  # simulated seconds per round
    tokens_per_step: float  # real tokens per inner step (island batch × sequence length)
    price_per_gpu_hour: float
    wan_bytes_per_round: float  # bytes up + down over the WAN per round (0 at the hub)
    egress_usd_per_byte: float  # price of those bytes on the path to the hub


@dataclass(frozen=True)
class PaceMap:
    """The topology seen by the simulator: per-island paces and the real-time scale."""

    topology: str
    planned_model: str
    n_params: int
    bits: int  # pseudo-gradient bits q used for T_comm
    scale: float  # real seconds per simulated second (= min_j T_inner,j)
    islands: tuple[IslandPace, ...]

    @property
    def paces(self) -> list[float]:
        """Simulated seconds per inner step of each island's worker."""
        return [i.pace for i in self.islands]

    @property
    def comm_delays(self) -> list[float]:
        """Simulated seconds each island spends per round on push + pull."""
        return [i.comm_delay for i in self.islands]

    @property
    def usd_per_s(self) -> float:
        """GPU rent of every island per real second: Σ n_i · price_i / 3600 (C.10)."""
        return sum(i.n_gpus * i.price_per_gpu_hour for i in self.islands) / 3600.0

    @property
    def egress_usd_per_round(self) -> list[float]:
        """WAN egress charged per round of each worker: bytes × price on its hub path."""
        return [i.wan_bytes_per_round * i.egress_usd_per_byte for i in self.islands]


def paces_from_times(
    inner_s: Sequence[float], comm_s: Sequence[float]
) -> tuple[float, list[float], list[float]]:
    """(scale, paces, delays) from real per-step and per-round times (the mapping above)."""
    inner = np.asarray(inner_s, dtype=np.float64)
    comm = np.asarray(comm_s, dtype=np.float64)
    if inner.ndim != 1 or inner.size == 0 or comm.shape != inner.shape:
        raise UserInputError("inner_s", list(inner_s), "one step time and one comm time per island")
    if not (np.all(np.isfinite(inner)) and np.all(inner > 0)):
        raise UserInputError("inner_s", list(inner_s), "finite step times > 0 seconds")
    if not (np.all(np.isfinite(comm)) and np.all(comm >= 0)):
        raise UserInputError("comm_s", list(comm_s), "finite comm times >= 0 seconds")
    scale = float(inner.min())
    return scale, [float(x) for x in inner / scale], [float(x) for x in comm / scale]


def pace_map(
    topology: Topology | str | Path, planned_model: str | None = None, bits: int | None = None
) -> PaceMap:
    """Predict every island of ``topology`` with ShardMeter and map it to simulator paces.

    ``planned_model`` overrides the topology's run.model (a ShardMeter preset or file) and
    ``bits`` its pseudo-gradient bits.
    """
    topo = topology if isinstance(topology, Topology) else load_topology(topology)
    topo = with_run(topo, model=planned_model, bits=bits)
    model = resolve_model(topo.run)
    inputs = island_inputs(topo, model)
    wan = wan_paths(topo)
    inner = np.array([isl.step.step_time_s for isl in inputs])
    exchange = outer_round(
        "async",
        inner,
        wan,
        model.params_total,
        inner_steps=1,
        bits=topo.run.bits,
        exchange="heloco",
    )
    scale, paces, delays = paces_from_times(list(inner), list(exchange.wan_comm_s))
    egress = wan.egress_usd_per_byte[:, wan.center]
    islands = tuple(
        IslandPace(
            name=isl.name,
            accelerator=isl.accelerator,
            n_gpus=int(isl.step.n_gpus),
            inner_step_s=float(inner[i]),
            comm_s=float(exchange.wan_comm_s[i]),
            pace=paces[i],
            comm_delay=delays[i],
            tokens_per_step=float(isl.step.tokens_per_step),
            price_per_gpu_hour=float(isl.price_per_gpu_hour),
            wan_bytes_per_round=float(exchange.wan_bytes[i]),
            egress_usd_per_byte=float(egress[i]),
        )
        for i, isl in enumerate(inputs)
    )
    name = topo.run.model if isinstance(topo.run.model, str) else model.name
    return PaceMap(
        topology=topo.name,
        planned_model=name,
        n_params=int(model.params_total),
        bits=int(topo.run.bits),
        scale=scale,
        islands=islands,
    )


def pace_map_to_json(pm: PaceMap) -> dict[str, Any]:
    """The pace map as a JSON-able dict (saved in the run folder)."""
    return {"schema_version": PACE_SCHEMA_VERSION, **asdict(pm)}


def pace_map_from_json(data: dict[str, Any]) -> PaceMap:
    """Inverse of :func:`pace_map_to_json`; a malformed file is a one-line error."""
    try:
        islands = tuple(IslandPace(**row) for row in data["islands"])
        fields = {k: data[k] for k in ("topology", "planned_model", "n_params", "bits", "scale")}
        return PaceMap(islands=islands, **fields)
    except (KeyError, TypeError) as exc:
        raise UserInputError(PACE_FILE, str(exc), "a pace map written by heloco") from None


def write_pace_map(pm: PaceMap, run_dir: Path) -> Path:
    """Write ``topology.json`` into a run folder (atomically)."""
    run_dir.mkdir(parents=True, exist_ok=True)
    path = run_dir / PACE_FILE
    atomic_write_json(path, pace_map_to_json(pm))
    return path


def read_pace_map(run_dir: Path) -> PaceMap | None:
    """The pace map a topology run recorded, or None for a run without one."""
    path = run_dir / PACE_FILE
    if not path.is_file():
        return None
    try:
        data = json.loads(path.read_text(encoding="utf-8"))
    except json.JSONDecodeError as exc:
        raise UserInputError(str(path), str(exc), "valid JSON") from None
    return pace_map_from_json(data)


# --- `heloco simulate --topology FILE` ----------------------------------------------------


def add_arguments(parser: argparse.ArgumentParser) -> None:
    """Flags of the topology path of `heloco simulate` (``--model`` stays the small model)."""
    group = parser.add_argument_group("topology (paces from ShardMeter)")
    group.add_argument(
        "--topology",
        metavar="FILE",
        help="ShardMeter topology TOML or shipped example: one worker per island, paces and "
        "comm delays from predicted step and exchange times",
    )
    group.add_argument(
        "--planned-model",
        metavar="PRESET",
        help="ShardMeter model preset or file the paces are predicted for (default: the "
        "topology's run.model)",
    )


def apply(args: argparse.Namespace, overrides: dict[str, Any]) -> dict[str, Any]:
    """Config overrides with workers, paces and comm delays set from ``args.topology``.

    Stores the pace map on ``args.pace_map`` for :func:`record`. Without ``--topology`` the
    overrides are returned unchanged.
    """
    if getattr(args, "topology", None) is None:
        if getattr(args, "planned_model", None) is not None:
            raise UserInputError("--planned-model", args.planned_model, "needs --topology FILE")
        return overrides
    for key in ("paces", "comm_delays"):
        if key in overrides:
            raise UserInputError(key, overrides[key], "not with --topology (it sets them)")
    pm = pace_map(args.topology, getattr(args, "planned_model", None))
    n = len(pm.islands)
    if "workers" in overrides and int(overrides["workers"]) != n:
        raise UserInputError(
            "workers", overrides["workers"], f"{n}: one per island of {pm.topology}"
        )
    args.pace_map = pm
    return {**overrides, "workers": n, "paces": pm.paces, "comm_delays": pm.comm_delays}


def record(args: argparse.Namespace, out_dir: Path | None) -> None:
    """Write the pace map of a ``--topology`` run into its run folder (no-op otherwise)."""
    pm: PaceMap | None = getattr(args, "pace_map", None)
    if pm is not None and out_dir is not None:
        write_pace_map(pm, out_dir)
