"""Quality factor from HeLoCo runs: tokens to a target loss relative to a synchronous run.

ShardMeter predicts tokens/s; a method that needs more tokens to reach the same loss is slower
than its tokens/s says. This module reads HeLoCo run folders (`summary.json` + `events.jsonl`,
docs/heloco-metrics.md) as plain JSON, without importing heloco or torch, and defines

    q_m = D_m(L*) / D_ref(L*)

where D_r(L*) is the number of training tokens run r needs until its validation loss first
reaches L* (linear interpolation between the two evals that bracket the crossing, as in
heloco.metrics.loss_at), `ref` is the synchronous DiLoCo run (method "sync"), and L* is
`target_loss` or, by default, the lowest loss every run reaches (max over runs of each run's
best eval loss). Runs of the same method (seeds) are averaged in D. A plan's time and cost to
the target are then q × its wall-clock and cost for the token budget (design doc C.10).

Maths and data only (no argparse, no terminal): the `--quality-from` flags live in
`shardmeter.cli.quality`, the table in `shardmeter.report.quality`.

A run whose summary names a compressed `payload` (top-k, sign: `heloco.codecs`) counts as its
own method, `METHOD@PAYLOAD`, against the dense sync reference; a plan that sends that payload
(`--payload`, or the topology's) takes the q of those runs, so it ranks by time to the target
loss, not by bytes. A folder with no compressed runs gives every payload the dense q. A dense
run whose summary names an uplink `codec` other than fp32 (the simulator's int8 or bf16) is
listed as `METHOD@CODEC` and never stands for the dense method.
"""

from __future__ import annotations

import json
import math
from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Literal, Protocol

from shardmeter.errors import UserInputError
from shardmeter.specs.topology import PayloadSpec, parse_settings

SUMMARY_FILE = "summary.json"
EVENTS_FILE = "events.jsonl"
REFERENCE_METHOD = "sync"
DEFAULT_ASYNC_METHOD = "heloco"
LossKey = Literal["loss", "cycle_loss"]
LOSS_KEYS: tuple[str, ...] = ("loss", "cycle_loss")
CODECS = ("bf16", "int8")  # dense uplink codecs a run may name (summary.json `codec`)


@dataclass(frozen=True)
class RunCurve:
    """Validation loss against training tokens of one HeLoCo run."""

    method: str
    run_dir: Path
    tokens: tuple[float, ...]
    losses: tuple[float, ...]
    payload: str = "dense"
    codec: str = "fp32"  # a dense payload's uplink codec (fp32, bf16, int8)

    @property
    def best_loss(self) -> float:
        return min(self.losses)

    @property
    def name(self) -> str:
        """The method, `METHOD@PAYLOAD` for a compressed payload (module docstring), or
        `METHOD@CODEC` for a dense one sent as bf16 or int8 (listed, never a payload's q)."""
        if payload_spec(self.payload).kind != "dense":
            return f"{self.method}@{self.payload}"
        return self.method if self.codec == "fp32" else f"{self.method}@{self.codec}"


def payload_spec(text: str) -> PayloadSpec:
    """A payload spelled as `--payload` spells it ('topk:fraction=0.01'), as its spec."""
    kind, _, rest = text.partition(":")
    try:
        return PayloadSpec.model_validate({"kind": kind.strip(), **parse_settings(rest, "payload")})
    except ValueError as exc:
        raise UserInputError("payload", text, f"a payload as --payload spells it ({exc})") from None


@dataclass(frozen=True)
class MethodQuality:
    """One method's tokens to the target and its quality factor (inf: never reached)."""

    method: str
    runs: int
    tokens_to_target: float
    factor: float


@dataclass(frozen=True)
class QualityFactors:
    """Quality factors of the methods found under one folder, relative to `reference`."""

    source: Path
    reference: str
    target_loss: float
    loss_key: str
    methods: tuple[MethodQuality, ...]

    def names(self) -> list[str]:
        return [m.method for m in self.methods]

    def factor(self, method: str) -> float:
        """q of `method`; a method with no run here is a one-line error listing the others."""
        for m in self.methods:
            if m.method == method:
                return m.factor
        raise UserInputError("quality method", method, f"runs here: {', '.join(self.names())}")

    def method_for(
        self, mode: str, method: str | None = None, payload: PayloadSpec | None = None
    ) -> str:
        """The HeLoCo method standing for a ShardMeter outer mode: for async, `method` (default
        HeLoCo); for sync, diloco, streaming and single-cluster plans, the synchronous
        reference. With a compressed `payload` and runs of it here: `METHOD@PAYLOAD`."""
        name = (method or DEFAULT_ASYNC_METHOD) if mode == "async" else self.reference
        if payload is None or payload.kind == "dense" or "@" in name:
            return name
        compressed = [m for m in self.names() if "@" in m and m.partition("@")[2] not in CODECS]
        if not compressed:
            return name  # no compressed runs here: the dense q stands for every payload
        for m in compressed:
            base, _, text = m.partition("@")
            if base == name and payload_spec(text) == payload:
                return m
        raise UserInputError(
            "quality payload",
            f"{name} with {payload.label}",
            f"runs of it under --quality-from; compressed runs there: {', '.join(compressed)}",
        )

    def for_mode(
        self, mode: str, method: str | None = None, payload: PayloadSpec | None = None
    ) -> float:
        """q for a ShardMeter outer mode (see `method_for`); the reference's q is 1."""
        name = self.method_for(mode, method, payload)
        return 1.0 if name == self.reference else self.factor(name)


def _read_json(path: Path) -> Any:
    try:
        return json.loads(path.read_text(encoding="utf-8"))
    except (OSError, UnicodeDecodeError, json.JSONDecodeError) as exc:
        raise UserInputError(str(path), type(exc).__name__, "a readable JSON file") from None


def read_run(run_dir: Path, loss_key: LossKey = "loss") -> RunCurve:
    """The eval curve of one run folder (method from summary.json, evals from events.jsonl)."""
    if loss_key not in LOSS_KEYS:
        raise UserInputError("loss key", loss_key, f"one of {', '.join(LOSS_KEYS)}")
    summary = _read_json(run_dir / SUMMARY_FILE)
    method = summary.get("method") if isinstance(summary, dict) else None
    if not isinstance(method, str):
        raise UserInputError(str(run_dir / SUMMARY_FILE), method, "a HeLoCo summary with 'method'")
    payload = summary.get("payload", "dense")
    if not isinstance(payload, str):
        raise UserInputError(str(run_dir / SUMMARY_FILE), payload, "a payload name (text)")
    payload_spec(payload)
    codec = summary.get("codec", "fp32")
    if codec not in ("fp32", *CODECS):
        raise UserInputError(str(run_dir / SUMMARY_FILE), codec, "codec fp32, bf16 or int8")
    tokens: list[float] = []
    losses: list[float] = []
    try:
        lines = (run_dir / EVENTS_FILE).read_text(encoding="utf-8").splitlines()
    except OSError:
        raise UserInputError(str(run_dir), "no events.jsonl", "a HeLoCo run folder") from None
    for n, line in enumerate(lines, 1):
        if not line.strip():
            continue
        try:
            event = json.loads(line)
        except json.JSONDecodeError:
            raise UserInputError(f"{run_dir / EVENTS_FILE}:{n}", line[:40], "JSON") from None
        if event.get("type") != "eval" or event.get(loss_key) is None:
            continue
        tokens.append(float(event["tokens"]))
        losses.append(float(event[loss_key]))
    if not losses:
        raise UserInputError(str(run_dir), "no eval events", "a run with evaluations")
    return RunCurve(method, run_dir, tuple(tokens), tuple(losses), payload, codec)


def find_runs(run_dir: str | Path, loss_key: LossKey = "loss") -> list[RunCurve]:
    """`run_dir` itself if it is a run, else every immediate subfolder that is one."""
    root = Path(run_dir)
    if not root.is_dir():
        raise UserInputError("--quality-from", str(root), "a folder of HeLoCo runs")
    if (root / SUMMARY_FILE).is_file():
        return [read_run(root, loss_key)]
    runs = [read_run(d, loss_key) for d in sorted(root.iterdir()) if (d / SUMMARY_FILE).is_file()]
    if not runs:
        raise UserInputError(
            "--quality-from", str(root), "a run folder or a folder of run folders (summary.json)"
        )
    return runs


def tokens_to_loss(tokens: Sequence[float], losses: Sequence[float], target: float) -> float:
    """Tokens at the first eval crossing of `target`, interpolated linearly (inf: never)."""
    if losses and losses[0] <= target:
        return float(tokens[0])
    for i in range(1, len(losses)):
        if losses[i] <= target:
            a, b = losses[i - 1], losses[i]
            frac = (a - target) / (a - b) if a != b else 1.0
            return float(tokens[i - 1] + frac * (tokens[i] - tokens[i - 1]))
    return math.inf


def default_target(runs: Sequence[RunCurve]) -> float:
    """The lowest loss every run reaches: max over runs of each run's best eval loss."""
    return max(r.best_loss for r in runs)


def quality_factors(
    run_dir: str | Path,
    target_loss: float | None = None,
    reference: str = REFERENCE_METHOD,
    loss_key: LossKey = "loss",
) -> QualityFactors:
    """q_m = D_m(L*) / D_ref(L*) for every method found under `run_dir` (module docstring)."""
    runs = find_runs(run_dir, loss_key)
    methods = sorted({r.name for r in runs})
    if reference not in methods:
        raise UserInputError(
            "quality reference", reference, f"needs a {reference!r} run; found {', '.join(methods)}"
        )
    if target_loss is not None and not (math.isfinite(target_loss) and target_loss > 0):
        raise UserInputError("--target-loss", target_loss, "a finite loss > 0 (nats/token)")
    target = default_target(runs) if target_loss is None else float(target_loss)
    need: dict[str, list[float]] = {m: [] for m in methods}
    for r in runs:
        need[r.name].append(tokens_to_loss(r.tokens, r.losses, target))
    mean = {m: sum(v) / len(v) for m, v in need.items()}
    ref = mean[reference]
    if not math.isfinite(ref):
        raise UserInputError(
            "--target-loss", target, f"the {reference!r} run never reaches it; pick a higher loss"
        )
    if ref <= 0:
        raise UserInputError(
            "--target-loss", target, f"the {reference!r} run starts below it; pick a lower loss"
        )
    rows = tuple(
        MethodQuality(method=m, runs=len(need[m]), tokens_to_target=mean[m], factor=mean[m] / ref)
        for m in methods
    )
    return QualityFactors(Path(run_dir), reference, target, loss_key, rows)


# --- ranking plans by time to the target loss -----------------------------------------------


class PlanLike(Protocol):
    """What ranking needs from a planner candidate (shardmeter.search.Candidate has it)."""

    @property
    def wall_s(self) -> float: ...
    @property
    def cost_usd(self) -> float: ...
    @property
    def tokens_per_s(self) -> float: ...
    @property
    def n_gpus(self) -> int: ...


@dataclass(frozen=True)
class RankedPlan:
    """A plan with its quality factor: time and cost to the target loss."""

    candidate: PlanLike
    mode: str
    method: str  # HeLoCo method whose q was applied
    quality_factor: float
    time_to_target_s: float  # q × wall-clock for the token budget
    cost_to_target_usd: float  # q × cost for the token budget


def candidate_mode(candidate: PlanLike) -> str:
    """The outer mode of a planner candidate ("single" for a one-cluster plan)."""
    outer = getattr(candidate, "outer", None)
    return "single" if outer is None else str(outer.mode)


def rank_by_time_to_target(
    candidates: Sequence[PlanLike],
    quality: QualityFactors,
    method: str | None = None,
    payload: PayloadSpec | None = None,
) -> list[RankedPlan]:
    """Candidates re-ranked by q × wall-clock (ties: cost), q from their outer mode (and the
    plan's compressed payload, see the module docstring)."""
    ranked = []
    for c in candidates:
        mode = candidate_mode(c)
        sends = payload if mode != "single" else None
        name = quality.method_for(mode, method, sends)
        q = quality.for_mode(mode, method, sends)
        ranked.append(RankedPlan(c, mode, name, q, q * c.wall_s, q * c.cost_usd))
    return sorted(ranked, key=lambda r: (r.time_to_target_s, r.cost_to_target_usd))


def topology_payload(topology: Any) -> PayloadSpec:
    """The payload a topology's run sends (a name or path is loaded first)."""
    from shardmeter.specs.topology import load_topology

    topo = load_topology(topology) if isinstance(topology, str | Path) else topology
    return topo.run.payload


def ranked_json(ranked: Sequence[RankedPlan], quality: QualityFactors) -> dict[str, Any]:
    """JSON view: the factors used and the plans in time-to-target order."""
    return {
        "source": str(quality.source),
        "reference": quality.reference,
        "target_loss": quality.target_loss,
        "loss_key": quality.loss_key,
        "methods": [
            {
                "method": m.method,
                "runs": m.runs,
                "tokens_to_target": _finite(m.tokens_to_target),
                "quality_factor": _finite(m.factor),
            }
            for m in quality.methods
        ],
        "ranked": [
            {
                "rank": k + 1,
                "mode": r.mode,
                "method": r.method,
                "islands": [i.name for i in getattr(r.candidate, "islands", ())],
                "n_gpus": r.candidate.n_gpus,
                "quality_factor": _finite(r.quality_factor),
                "tokens_per_s": r.candidate.tokens_per_s,
                "wall_s": r.candidate.wall_s,
                "time_to_target_s": _finite(r.time_to_target_s),
                "cost_to_target_usd": _finite(r.cost_to_target_usd),
            }
            for k, r in enumerate(ranked)
        ],
    }


def _finite(x: float) -> float | None:
    return x if math.isfinite(x) else None
