"""Topology: islands (each a cluster with its own plan) joined by WAN links, plus run settings.

Loaded from TOML (see `src/shardmeter/data/topologies/` and docs/islands.md). Units, as users
quote them: WAN bandwidth in Gbit/s (1e9 bits/s, per direction), WAN latency in ms of
round-trip time, egress in USD per GB (1e9 bytes); island links as in `specs/hardware.py`
(GB/s per GPU per direction, µs).
"""

from __future__ import annotations

import math
import sys
from collections.abc import Sequence
from pathlib import Path
from typing import Any, Literal

import numpy as np
from pydantic import BaseModel, ConfigDict, Field, ValidationError

from shardmeter.errors import UserInputError, from_pydantic
from shardmeter.estimate.outer import FloatArray, WanPaths, best_ring, effective_wan_Bps
from shardmeter.specs.hardware import Accelerator, Cluster, Link
from shardmeter.specs.model import TransformerSpec
from shardmeter.specs.plan import Plan

if sys.version_info >= (3, 11):
    import tomllib
else:  # pragma: no cover
    import tomli as tomllib

TOPOLOGY_DIR = Path(__file__).resolve().parents[1] / "data" / "topologies"
GBIT = 1e9 / 8.0  # bytes/s per Gbit/s


class WanLinkParams(BaseModel):
    """What one WAN link (or star spoke) offers. Bandwidth in Gbit/s, latency = RTT in ms."""

    model_config = ConfigDict(frozen=True, extra="forbid", populate_by_name=True)

    bandwidth_gbit: float = Field(gt=0)  # Gbit/s per direction, as providers quote it
    latency_ms: float = Field(default=50.0, ge=0)  # round-trip time
    egress_usd_per_gb: float = Field(default=0.0, ge=0)  # charged on every GB sent over it
    efficiency: float = Field(default=1.0, gt=0, le=1)  # achieved / nominal bandwidth
    streams: int | None = Field(default=None, gt=0)  # parallel TCP streams (with window_mb)
    window_mb: float | None = Field(default=None, gt=0)  # TCP window per stream, MB

    def bytes_per_s(self) -> float:
        """Effective bytes/s: efficiency × link, capped by streams·window/RTT (design doc C.4)."""
        link = self.bandwidth_gbit * GBIT * self.efficiency
        window = None if self.window_mb is None else self.window_mb * 1e6
        return float(effective_wan_Bps(link, self.latency_ms * 1e-3, self.streams, window))


class WanLink(WanLinkParams):
    """A WAN link between two named islands (undirected; both directions have its bandwidth)."""

    from_: str = Field(alias="from")
    to: str


class WanMatrix(BaseModel):
    """The WAN as full I × I matrices in island order (row = from, column = to; the diagonal
    is ignored). Bandwidth in Gbit/s, RTT in ms, egress in USD per GB."""

    model_config = ConfigDict(frozen=True, extra="forbid")

    bandwidth_gbit: list[list[float]]
    latency_ms: list[list[float]]
    egress_usd_per_gb: list[list[float]] | None = None
    efficiency: float = Field(default=1.0, gt=0, le=1)


class WanSpec(BaseModel):
    """WAN between islands: a mesh of links, a full matrix, or a star around a hub."""

    model_config = ConfigDict(frozen=True, extra="forbid")

    kind: Literal["mesh", "star", "matrix"] = "mesh"
    hub: str | None = None  # star centre (an island name)
    default: WanLinkParams | None = None  # for pairs (mesh) or spokes (star) not listed
    links: list[WanLink] = Field(default_factory=list)
    matrix: WanMatrix | None = None  # kind = "matrix"
    server_bandwidth_gbit: float | None = Field(default=None, gt=0)  # parameter-server cap
    host_copy_gbps: float | None = Field(default=None, gt=0)  # GB/s device↔host (Gloo on CPU)


class IslandSpec(BaseModel):
    """One island: a homogeneous cluster (preset or inline) and its inner plan."""

    model_config = ConfigDict(frozen=True, extra="forbid")

    name: str = Field(min_length=1)
    cluster: str | None = None  # cluster preset name or file
    accelerator: str | dict[str, Any] | None = None  # preset name or inline Accelerator table
    n_nodes: int = Field(default=1, gt=0)
    gpus_per_node: int | None = Field(default=None, gt=0)
    nvlink_domain: int | None = Field(default=None, gt=0)
    intra: Link | None = None
    inter: Link | None = None
    price_per_gpu_hour: float | None = Field(default=None, ge=0)  # USD; None = preset's
    plan: str | dict[str, Any] = "auto"  # "auto" or an inline Plan table
    global_batch: int | None = Field(default=None, gt=0)  # sequences per inner step


class OuterSpec(BaseModel):
    """How islands synchronise (design doc C.9) and what counts as compute-bound."""

    model_config = ConfigDict(frozen=True, extra="forbid")

    mode: Literal["sync", "diloco", "streaming", "async"] = "diloco"
    inner_steps: int = Field(default=100, ge=1)  # H
    bits: Literal[32, 16, 8, 4] = 16  # pseudo-gradient bits q
    grad_bits: Literal[32, 16, 8] = 16  # gradient bits in synchronous DP
    outer_overlap: bool = False  # DiLoCo: eager/delayed outer step, comm hidden by one round
    balance_steps: bool = False  # DiLoCo/Streaming: faster islands run H_i = ⌊H·T_max/T_i⌋ steps
    fragments: int = Field(default=1, ge=1)  # Streaming DiLoCo P
    overlap_steps: int = Field(default=0, ge=0)  # Streaming DiLoCo τ
    reduce: Literal["ring", "hub"] = "ring"  # outer all-reduce pattern
    server: str | None = None  # hub / parameter-server island (default: WAN hub or first)
    quality_factor: float = Field(default=1.0, gt=0, allow_inf_nan=False)  # tokens needed vs sync
    compute_bound_threshold: float = Field(default=0.9, gt=0, le=1)  # utilization ≥ this


class RunSpec(OuterSpec):
    """Global run settings: the model, the token budget, the default per-island batch."""

    model: str | dict[str, Any] = "llama-3-8b"
    tokens: float = Field(default=1e12, gt=0, allow_inf_nan=False)  # token budget
    global_batch: int | None = Field(default=None, gt=0)  # sequences per island per inner step


class Topology(BaseModel):
    """Islands, the WAN between them, and the run."""

    model_config = ConfigDict(frozen=True, extra="forbid")

    name: str = "topology"
    description: str = ""
    islands: list[IslandSpec] = Field(min_length=1)
    wan: WanSpec = WanSpec()
    run: RunSpec = RunSpec()

    @property
    def island_names(self) -> list[str]:
        return [island.name for island in self.islands]


def _field_path(loc: Sequence[Any]) -> str:
    """('wan', 'links', 2, 'to') -> 'wan.links[2].to'; drops pydantic's union-member tags."""
    out = ""
    for part in loc:
        if isinstance(part, int):
            out += f"[{part}]"
        elif isinstance(part, str) and ("[" in part or part in {"str", "int", "float", "bool"}):
            continue
        else:
            out += f".{part}" if out else str(part)
    return out.replace("from_", "from")


def validation_error(exc: ValidationError, prefix: str = "") -> UserInputError:
    """One line naming the topology field (``islands[0].plan.tp``) that failed."""
    return from_pydantic(exc, prefix, render=_field_path, whole="topology")


def topology_from_dict(data: dict[str, Any]) -> Topology:
    """Validate a topology mapping; every mistake is a one-line UserInputError naming the field."""
    try:
        topo = Topology.model_validate(data)
    except ValidationError as exc:
        raise validation_error(exc) from None
    validate_topology(topo)
    return topo


def find_topology(name_or_path: str | Path) -> Path:
    """A topology file: an existing path, or a shipped example by name."""
    path = Path(name_or_path)
    if path.is_file():
        return path
    shipped = TOPOLOGY_DIR / f"{name_or_path}.toml"
    if shipped.exists():
        return shipped
    known = ", ".join(sorted(p.stem for p in TOPOLOGY_DIR.glob("*.toml")))
    raise UserInputError("topology", str(name_or_path), f"not a file; shipped examples: {known}")


def load_topology(name_or_path: str | Path) -> Topology:
    """Read a topology TOML file (or a shipped example by name) and validate it."""
    path = find_topology(name_or_path)
    try:
        data = tomllib.loads(path.read_text(encoding="utf-8"))
    except (tomllib.TOMLDecodeError, UnicodeDecodeError) as exc:
        raise UserInputError("topology", str(path), f"is not valid TOML ({exc})") from None
    return topology_from_dict(data)


def validate_topology(topo: Topology) -> None:
    """Cross-field checks: unique names, links between known islands, hub and server known."""
    names = topo.island_names
    known = f"known islands: {', '.join(names)}"
    seen: set[str] = set()
    for i, name in enumerate(names):
        if name in seen:
            raise UserInputError(f"islands[{i}].name", name, "island names must be unique")
        seen.add(name)
    for i, island in enumerate(topo.islands):
        if island.cluster is None and island.accelerator is None:
            raise UserInputError(
                f"islands[{i}].cluster", None, "give a cluster preset or an accelerator"
            )
        if island.cluster is None and island.gpus_per_node is None:
            raise UserInputError(
                f"islands[{i}].gpus_per_node", None, "required without a cluster preset"
            )
        if island.cluster is None and island.intra is None:
            raise UserInputError(f"islands[{i}].intra", None, "required without a cluster preset")
        if island.cluster is None and island.inter is None and island.n_nodes > 1:
            raise UserInputError(
                f"islands[{i}].inter", None, "required for several nodes without a cluster preset"
            )
        if isinstance(island.plan, str) and island.plan != "auto":
            raise UserInputError(f"islands[{i}].plan", island.plan, "'auto' or a plan table")
    wan = topo.wan
    if wan.kind == "star":
        if wan.hub is None:
            raise UserInputError("wan.hub", None, "a star WAN needs a hub island")
        if wan.hub not in names:
            raise UserInputError("wan.hub", wan.hub, known)
    elif wan.hub is not None:
        raise UserInputError("wan.hub", wan.hub, "only a star WAN has a hub (kind = 'star')")
    if wan.kind == "matrix":
        _check_matrix(wan, len(names))
    elif wan.matrix is not None:
        raise UserInputError("wan.matrix", "given", "set kind = 'matrix' to use it")
    pairs: set[frozenset[str]] = set()
    for k, link in enumerate(wan.links):
        for end, value in (("from", link.from_), ("to", link.to)):
            if value not in names:
                raise UserInputError(f"wan.links[{k}].{end}", value, known)
        if link.from_ == link.to:
            raise UserInputError(f"wan.links[{k}].to", link.to, "a link joins two islands")
        pair = frozenset((link.from_, link.to))
        if pair in pairs:
            raise UserInputError(f"wan.links[{k}]", sorted(pair), "this pair is given twice")
        pairs.add(pair)
        if wan.kind == "star" and wan.hub not in pair:
            raise UserInputError(
                f"wan.links[{k}]", sorted(pair), f"star links must touch the hub {wan.hub!r}"
            )
    if topo.run.server is not None and topo.run.server not in names:
        raise UserInputError("run.server", topo.run.server, known)
    run = topo.run
    if run.mode == "streaming" and run.inner_steps % run.fragments:
        raise UserInputError(
            "run.fragments", run.fragments, f"must divide inner_steps = {run.inner_steps}"
        )
    if run.mode == "streaming" and run.overlap_steps > run.inner_steps // run.fragments:
        raise UserInputError(
            "run.overlap_steps",
            run.overlap_steps,
            f"must be ≤ inner_steps/fragments = {run.inner_steps // run.fragments}",
        )


def _check_matrix(wan: WanSpec, n: int) -> None:
    """Shapes I × I and valid off-diagonal values, errors naming the entry."""
    if wan.matrix is None:
        raise UserInputError("wan.matrix", None, "kind = 'matrix' needs a [wan.matrix] table")
    if wan.links:
        raise UserInputError("wan.links", len(wan.links), "a matrix WAN takes no link list")
    m = wan.matrix
    for key, rows, positive in (
        ("bandwidth_gbit", m.bandwidth_gbit, True),
        ("latency_ms", m.latency_ms, False),
        ("egress_usd_per_gb", m.egress_usd_per_gb, False),
    ):
        if rows is None:
            continue
        if len(rows) != n or any(len(row) != n for row in rows):
            shape = f"{len(rows)} rows of {sorted({len(r) for r in rows})}"
            raise UserInputError(f"wan.matrix.{key}", shape, f"must be {n} × {n} (one per island)")
        for i, row in enumerate(rows):
            for j, value in enumerate(row):
                bad = value <= 0 if positive else value < 0
                if i != j and (bad or not math.isfinite(value)):
                    need = "> 0" if positive else "≥ 0"
                    raise UserInputError(f"wan.matrix.{key}[{i}][{j}]", value, f"must be {need}")


def _link_between(topo: Topology, a: str, b: str) -> WanLinkParams | None:
    for link in topo.wan.links:
        if {link.from_, link.to} == {a, b}:
            return link
    return topo.wan.default


def _matrix_paths(m: WanMatrix, n: int) -> tuple[FloatArray, FloatArray, FloatArray]:
    """(bytes/s, RTT s, USD/byte) matrices from a [wan.matrix] table."""
    off = ~np.eye(n, dtype=bool)
    gbit = np.asarray(m.bandwidth_gbit, dtype=np.float64)
    bw = np.where(off, gbit * GBIT * m.efficiency, np.inf)
    rtt = np.where(off, np.asarray(m.latency_ms, dtype=np.float64) * 1e-3, 0.0)
    usd = np.zeros((n, n)) if m.egress_usd_per_gb is None else np.asarray(m.egress_usd_per_gb)
    price = np.where(off, usd / 1e9, 0.0)
    return bw, rtt, price


def wan_paths(topo: Topology) -> WanPaths:
    """Resolve the WAN into island-to-island path matrices (a star routes through its hub)."""
    names = topo.island_names
    n = len(names)
    bw = np.full((n, n), np.inf)
    rtt = np.zeros((n, n))
    price = np.zeros((n, n))
    wan = topo.wan
    if wan.kind == "star" and n > 1:
        hub = names.index(str(wan.hub))
        spokes: dict[int, WanLinkParams] = {}
        for i, name in enumerate(names):
            if i == hub:
                continue
            spoke = _link_between(topo, name, names[hub])
            if spoke is None:
                raise UserInputError(
                    "wan.links", name, f"no spoke from {name!r} to the hub; add it or wan.default"
                )
            spokes[i] = spoke
        for i in range(n):
            for j in range(n):
                if i == j:
                    continue
                hops = [spokes[k] for k in (i, j) if k != hub]
                bw[i, j] = min(h.bytes_per_s() for h in hops)
                rtt[i, j] = sum(h.latency_ms for h in hops) * 1e-3
                price[i, j] = sum(h.egress_usd_per_gb for h in hops) / 1e9
        center = hub
        star_hub: int | None = hub
    elif wan.kind == "matrix" and wan.matrix is not None:
        star_hub, center = None, 0
        bw, rtt, price = _matrix_paths(wan.matrix, n)
    else:
        star_hub = None
        for i in range(n):
            for j in range(i + 1, n):
                link = _link_between(topo, names[i], names[j])
                if link is None:
                    raise UserInputError(
                        "wan.links",
                        f"{names[i]}-{names[j]}",
                        "no link between these islands; add it or set wan.default",
                    )
                bw[i, j] = bw[j, i] = link.bytes_per_s()
                rtt[i, j] = rtt[j, i] = link.latency_ms * 1e-3
                price[i, j] = price[j, i] = link.egress_usd_per_gb / 1e9
        center = 0
    if topo.run.server is not None:
        center = names.index(topo.run.server)
    server = wan.server_bandwidth_gbit
    host = wan.host_copy_gbps
    return WanPaths(
        names=tuple(names),
        bandwidth_Bps=bw,
        rtt_s=rtt,
        egress_usd_per_byte=price,
        ring=best_ring(bw),
        center=center,
        server_Bps=float("inf") if server is None else server * GBIT,
        host_copy_Bps=float("inf") if host is None else host * 1e9,
        hub=star_hub,
    )


def _rename(exc: UserInputError, kind: str, field: str) -> UserInputError:
    """A loader error re-addressed to the topology field that named the preset."""
    if exc.field == kind:
        return UserInputError(field, exc.value, exc.allowed)
    return UserInputError(f"{field} ({exc.field})", exc.value, exc.allowed)


def resolve_model(run: RunSpec) -> TransformerSpec:
    """The run's model: a preset name or file (via the presets loader), or an inline table."""
    if isinstance(run.model, dict):
        try:
            return TransformerSpec.model_validate(run.model)
        except ValidationError as exc:
            raise validation_error(exc, "run.model") from None
    from shardmeter.specs.loader import load_model

    try:
        return load_model(run.model)
    except UserInputError as exc:
        raise _rename(exc, "model", "run.model") from None


def resolve_cluster(island: IslandSpec, index: int) -> Cluster:
    """The island's Cluster: a preset with this island's overrides, or built from its fields."""
    prefix = f"islands[{index}]"
    accelerator: Accelerator | None = None
    if isinstance(island.accelerator, dict):
        try:
            accelerator = Accelerator.model_validate(island.accelerator)
        except ValidationError as exc:
            raise validation_error(exc, f"{prefix}.accelerator") from None
    elif isinstance(island.accelerator, str):
        from shardmeter.specs.loader import load_accelerator

        try:
            accelerator = load_accelerator(island.accelerator)
        except UserInputError as exc:
            raise _rename(exc, "accelerator", f"{prefix}.accelerator") from None
    update: dict[str, Any] = {"name": island.name, "n_nodes": island.n_nodes}
    if accelerator is not None:
        update["accelerator"] = accelerator
    for key in ("gpus_per_node", "nvlink_domain", "intra", "inter", "price_per_gpu_hour"):
        value = getattr(island, key)
        if value is not None:
            update[key] = value
    if island.cluster is not None:
        from shardmeter.specs.loader import load_cluster

        try:
            base = load_cluster(island.cluster)
        except UserInputError as exc:
            raise _rename(exc, "cluster", f"{prefix}.cluster") from None
        data = {**base.model_dump(), **{k: v for k, v in update.items() if k != "accelerator"}}
        data["accelerator"] = update.get("accelerator", base.accelerator)
    else:
        gpn = int(update["gpus_per_node"])
        data = {
            "inter": update.get("intra"),
            "nvlink_domain": gpn,
            **update,
        }
    try:
        return Cluster.model_validate(data)
    except ValidationError as exc:
        raise validation_error(exc, prefix) from None


def island_plan(island: IslandSpec, index: int) -> Plan | None:
    """The island's explicit Plan, or None for "auto"."""
    if isinstance(island.plan, str):
        return None
    try:
        return Plan.model_validate(island.plan)
    except ValidationError as exc:
        raise validation_error(exc, f"islands[{index}].plan") from None
