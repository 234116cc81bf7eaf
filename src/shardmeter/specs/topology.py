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

from pydantic import BaseModel, ConfigDict, Field, ValidationError, field_validator, model_validator

from shardmeter.errors import UserInputError, check_input, from_pydantic
from shardmeter.specs.hardware import Accelerator, Cluster, Link
from shardmeter.specs.model import TransformerSpec
from shardmeter.specs.plan import Plan
from shardmeter.specs.validation import reject_non_finite

if sys.version_info >= (3, 11):
    import tomllib
else:  # pragma: no cover
    import tomli as tomllib

TOPOLOGY_DIR = Path(__file__).resolve().parents[1] / "data" / "topologies"
GBIT = 1e9 / 8.0  # bytes/s per Gbit/s


class WanLinkParams(BaseModel):
    """What one WAN link (or star spoke) offers. Bandwidth in Gbit/s, latency = RTT in ms."""

    model_config = ConfigDict(
        frozen=True, extra="forbid", populate_by_name=True, allow_inf_nan=False
    )

    bandwidth_gbit: float = Field(gt=0)  # Gbit/s per direction, as providers quote it
    latency_ms: float = Field(default=50.0, ge=0)  # round-trip time
    egress_usd_per_gb: float = Field(default=0.0, ge=0)  # charged on every GB sent over it
    efficiency: float = Field(default=1.0, gt=0, le=1)  # achieved / nominal bandwidth
    streams: int | None = Field(default=None, gt=0)  # parallel TCP streams (with window_mb)
    window_mb: float | None = Field(default=None, gt=0)  # TCP window per stream, MB


class WanLink(WanLinkParams):
    """A WAN link between two named islands (undirected; both directions have its bandwidth)."""

    from_: str = Field(alias="from")
    to: str


class WanMatrix(BaseModel):
    """The WAN as full I × I matrices in island order (row = from, column = to; the diagonal
    is ignored). Bandwidth in Gbit/s, RTT in ms, egress in USD per GB."""

    model_config = ConfigDict(frozen=True, extra="forbid", allow_inf_nan=False)

    bandwidth_gbit: list[list[float]]
    latency_ms: list[list[float]]
    egress_usd_per_gb: list[list[float]] | None = None
    efficiency: float = Field(default=1.0, gt=0, le=1)


def parse_settings(text: str, field: str) -> dict[str, Any]:
    """'a=1,b=x,c=true' -> {'a': 1, 'b': 'x', 'c': True}: the one-line form of a settings
    table, accepted wherever the table is (file, CLI flag, Python)."""
    out: dict[str, Any] = {}
    for item in (part.strip() for part in text.split(",")):
        if not item:
            continue
        key, sep, raw = item.partition("=")
        if not sep or not key.strip():
            raise UserInputError(field, text, "key=value pairs separated by commas")
        out[key.strip()] = _scalar(raw.strip())
    return out


def _scalar(raw: str) -> Any:
    """A settings value as TOML would read it: bool, int, float, else the string."""
    if raw.lower() in ("true", "false"):
        return raw.lower() == "true"
    for kind in (int, float):
        try:
            return kind(raw)
        except ValueError:
            continue
    return raw


class BucketSpec(BaseModel):
    """Object storage every island uploads its payload to once and downloads the others' from
    (permissionless runs): per-island path to the bucket and the cloud's egress price."""

    model_config = ConfigDict(frozen=True, extra="forbid", allow_inf_nan=False)

    bandwidth_gbit: float = Field(gt=0)  # each island ↔ bucket, Gbit/s per direction
    latency_ms: float = Field(default=50.0, ge=0)  # round-trip time of one request
    egress_usd_per_gb: float = Field(default=0.0, ge=0)  # charged per GB downloaded
    aggregate_gbit: float | None = Field(default=None, gt=0)  # the bucket's total throughput


class WanSpec(BaseModel):
    """WAN between islands: a mesh of links, a full matrix, or a star around a hub."""

    model_config = ConfigDict(frozen=True, extra="forbid", allow_inf_nan=False)

    kind: Literal["mesh", "star", "matrix"] = "mesh"
    hub: str | None = None  # star centre (an island name)
    default: WanLinkParams | None = None  # for pairs (mesh) or spokes (star) not listed
    links: list[WanLink] = Field(default_factory=list)
    matrix: WanMatrix | None = None  # kind = "matrix"
    server_bandwidth_gbit: float | None = Field(default=None, gt=0)  # parameter-server cap
    host_copy_gbps: float | None = Field(default=None, gt=0)  # GB/s device↔host (Gloo on CPU)
    bucket: BucketSpec | None = None  # object storage for reduce = "bucket"

    @field_validator("bucket", mode="before")
    @classmethod
    def _bucket_text(cls, value: Any) -> Any:
        return parse_settings(value, "wan.bucket") if isinstance(value, str) else value


class IslandSpec(BaseModel):
    """One island: a homogeneous cluster (preset or inline) and its inner plan."""

    model_config = ConfigDict(frozen=True, extra="forbid", allow_inf_nan=False)

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
    step_time_s: float | None = Field(default=None, gt=0, allow_inf_nan=False)  # given, s
    mtbf_hours: float | None = Field(default=None, gt=0)  # this island's MTBF (wins over run's)


class FragmentSpec(BaseModel):
    """One fragment of a Streaming DiLoCo schedule: `layers` transformer layers synced at
    inner step `offset` of every round (0 ≤ offset < H)."""

    model_config = ConfigDict(frozen=True, extra="forbid", allow_inf_nan=False)

    offset: int = Field(ge=0)
    layers: int = Field(ge=1)


def parse_fragments(value: Any) -> Any:
    """The fragment schedule in any of its spellings: P (int, or its digits as text), or an
    explicit list of {offset, layers} tables, or its text form 'offset:layers,...'."""
    if not isinstance(value, str):
        return value
    text = value.strip()
    if text.isdigit():
        return int(text)
    out = []
    for item in (part.strip() for part in text.split(",") if part.strip()):
        offset, sep, layers = item.partition(":")
        if not (sep and offset.strip().isdigit() and layers.strip().isdigit()):
            raise UserInputError(
                "fragments", value, "P, or offset:layers pairs separated by commas"
            )
        out.append({"offset": int(offset), "layers": int(layers)})
    return out


PAYLOAD_KINDS: tuple[str, ...] = ("dense", "topk", "sign", "lowrank", "dct_topk")


class PayloadSpec(BaseModel):
    """What crosses the WAN per exchange (design doc C.9 q, generalised). `dense` sends q-bit
    values (`bits`, or `grad_bits` in sync DP); the compressed families send fewer bits per
    parameter, indices and scales included, and may keep an error-feedback buffer:

    - topk: the `fraction` largest values + their indices (Lin et al. 2018, DGC);
    - sign: 1 bit per value + one scale per `group` (Bernstein et al. 2018, signSGD);
    - lowrank: rank-`rank` factors P, Q of every matrix (Vogels et al. 2019, PowerSGD);
    - dct_topk: DCT of `chunk`-element chunks, `fraction` of coefficients kept with their
      in-chunk index (Peng et al. 2024, DeMo).
    """

    model_config = ConfigDict(frozen=True, extra="forbid", allow_inf_nan=False)

    kind: Literal["dense", "topk", "sign", "lowrank", "dct_topk"] = "dense"
    fraction: float | None = Field(default=None, gt=0, le=1)  # topk, dct_topk: kept share
    value_bits: int = Field(default=16, ge=1, le=32)  # bits per kept value / factor entry
    index_bits: int | None = Field(default=None, ge=1, le=64)  # topk 32, dct_topk 16
    rank: int = Field(default=4, ge=1)  # lowrank
    chunk: int = Field(default=64, ge=2)  # dct_topk: elements per DCT chunk
    group: int = Field(default=128, ge=1)  # sign: values per scale
    scale_bits: int = Field(default=16, ge=1, le=32)  # sign: bits per scale
    error_feedback: bool = True  # compressed kinds keep an fp32 residual per parameter

    @model_validator(mode="after")
    def _needs_fraction(self) -> PayloadSpec:
        if self.kind in ("topk", "dct_topk") and self.fraction is None:
            raise UserInputError("fraction", None, f"{self.kind} needs a kept fraction in (0, 1]")
        return self

    @property
    def label(self) -> str:
        """Short text: 'top-1% + idx32', 'sign/128', 'rank-4', 'DCT 64 top-10%'."""
        if self.kind == "topk":
            return f"top-{100 * (self.fraction or 1):.3g}% + {self.index_bits or 32}-bit indices"
        if self.kind == "sign":
            return f"sign, a {self.scale_bits}-bit scale per {self.group}"
        if self.kind == "lowrank":
            return f"rank-{self.rank} factors"
        if self.kind == "dct_topk":
            return f"DCT chunks of {self.chunk}, top-{100 * (self.fraction or 1):.3g}%"
        return "dense"


def _payload(value: Any) -> Any:
    if not isinstance(value, str):
        return value
    kind, _, rest = value.partition(":")
    return {"kind": kind.strip(), **parse_settings(rest, "payload")}


class FailureSpec(BaseModel):
    """Failures and churn (first-order model, Young 1974 / Daly 2006): how often an island
    fails, what a restart and a checkpoint cost, and the quorum that lets sync DiLoCo go on
    without a failed island. No MTBF means no failures."""

    model_config = ConfigDict(frozen=True, extra="forbid", allow_inf_nan=False)

    gpu_mtbf_hours: float | None = Field(default=None, gt=0)  # island MTBF = this / its GPUs
    island_mtbf_hours: float | None = Field(default=None, gt=0)  # per island (wins over GPU)
    restart_s: float = Field(default=600.0, ge=0, allow_inf_nan=False)  # detect + rejoin
    checkpoint_s: float = Field(default=0.0, ge=0, allow_inf_nan=False)  # one checkpoint write
    checkpoint_interval_s: float | Literal["auto"] = "auto"  # "auto": Young/Daly optimum
    quorum: int | None = Field(default=None, ge=1)  # sync DiLoCo/Streaming: go on with K of M
    grace_s: float = Field(default=0.0, ge=0, allow_inf_nan=False)  # wait before going on

    @field_validator("checkpoint_interval_s")
    @classmethod
    def _positive_interval(cls, value: float | str) -> float | str:
        if isinstance(value, float | int) and not (value > 0 and math.isfinite(value)):
            raise ValueError("must be 'auto' or a positive number of seconds")
        return value

    @property
    def enabled(self) -> bool:
        return self.gpu_mtbf_hours is not None or self.island_mtbf_hours is not None


def _failures(value: Any) -> Any:
    return parse_settings(value, "failures") if isinstance(value, str) else value


class OuterSpec(BaseModel):
    """How islands synchronise (design doc C.9) and what counts as compute-bound."""

    model_config = ConfigDict(frozen=True, extra="forbid", allow_inf_nan=False)

    mode: Literal["sync", "diloco", "streaming", "async"] = "diloco"
    inner_steps: int = Field(default=100, ge=1)  # H
    bits: Literal[32, 16, 8, 4] = 16  # pseudo-gradient bits q (dense payload)
    grad_bits: Literal[32, 16, 8] = 16  # gradient bits in synchronous DP (dense payload)
    payload: PayloadSpec = PayloadSpec()  # what crosses the WAN (dense: bits / grad_bits)
    outer_overlap: bool = False  # DiLoCo: eager/delayed outer step, comm hidden by one round
    # async: "duplex" (delta up and model down at once, hidden behind the next round), or
    # HeLoCo's push-then-pull "blocking" (between rounds) / "overlapped" (behind the next round)
    # / "streaming" (P = `fragments` fragment exchanges, each behind the next H/P steps)
    exchange: Literal["duplex", "blocking", "overlapped", "streaming"] = "duplex"
    # async, a shared server link: the workers take turns on it, one push at a time, first
    # come first served (HeLoCo's --link-slots), instead of sharing its FIFO at random
    link_slots: bool = False
    backward_overlap: bool = True  # the exchange starts during the backward, layer by layer
    balance_steps: bool = False  # DiLoCo/Streaming: faster islands run H_i = ⌊H·T_max/T_i⌋ steps
    fragments: int | list[FragmentSpec] = 1  # Streaming DiLoCo: P, or an explicit schedule
    overlap_steps: int = Field(default=0, ge=0)  # Streaming DiLoCo τ (≤ H: a whole round)
    reduce: Literal["ring", "hub", "bucket"] = "ring"  # outer collective pattern
    server: str | None = None  # hub / parameter-server island (default: WAN hub or first)
    failures: FailureSpec = FailureSpec()
    quality_factor: float = Field(default=1.0, gt=0, allow_inf_nan=False)  # tokens needed vs sync
    compute_bound_threshold: float = Field(default=0.9, gt=0, le=1)  # utilization ≥ this

    _fragments_text = field_validator("fragments", mode="before")(parse_fragments)
    _payload_text = field_validator("payload", mode="before")(_payload)
    _failures_text = field_validator("failures", mode="before")(_failures)

    @field_validator("fragments")
    @classmethod
    def _fragments_positive(cls, value: int | list[FragmentSpec]) -> int | list[FragmentSpec]:
        if isinstance(value, int) and value < 1:
            raise ValueError("P must be at least 1")
        if isinstance(value, list) and not value:
            raise ValueError("an explicit schedule needs at least one fragment")
        return value

    @property
    def n_fragments(self) -> int:
        """P: the number of fragments of the schedule."""
        return self.fragments if isinstance(self.fragments, int) else len(self.fragments)

    @property
    def dense_bits(self) -> int:
        """Bits per value of a dense payload in this mode."""
        return int(self.grad_bits if self.mode == "sync" else self.bits)


class RunSpec(OuterSpec):
    """Global run settings: the model, the token budget, the default per-island batch."""

    model: str | dict[str, Any] = "llama-3-8b"
    tokens: float = Field(default=1e12, gt=0, allow_inf_nan=False)  # token budget
    global_batch: int | None = Field(default=None, gt=0)  # sequences per island per inner step
    step_time_s: float | None = Field(default=None, gt=0, allow_inf_nan=False)  # given, all


class Topology(BaseModel):
    """Islands, the WAN between them, and the run."""

    model_config = ConfigDict(frozen=True, extra="forbid", allow_inf_nan=False)

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
    check_input(data, Topology)  # unknown keys with suggestions, strict booleans
    try:
        topo = Topology.model_validate(data)
    except ValidationError as exc:
        raise validation_error(exc) from None
    reject_non_finite(data, "")  # numbers beyond 1e18 and integers beyond 2**53
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
    validate_run(topo.run, topo)


def validate_run(run: OuterSpec, topo: Topology) -> None:
    """Cross-field checks of the run settings: the fragment schedule fits one round, τ at
    most a round, a bucket for reduce = "bucket", a quorum no larger than the islands."""
    h = run.inner_steps
    if run.overlap_steps > h:
        raise UserInputError(
            "run.overlap_steps", run.overlap_steps, f"must be ≤ inner_steps = {h} (a whole round)"
        )
    if isinstance(run.fragments, list):
        for k, frag in enumerate(run.fragments):
            if frag.offset >= h:
                raise UserInputError(
                    f"run.fragments[{k}].offset", frag.offset, f"must be < inner_steps = {h}"
                )
    if run.reduce == "bucket" and topo.wan.bucket is None:
        raise UserInputError("run.reduce", "bucket", "needs a [wan.bucket] table")
    quorum = run.failures.quorum
    if quorum is not None and quorum > len(topo.islands):
        raise UserInputError(
            "run.failures.quorum", quorum, f"at most the {len(topo.islands)} islands"
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
