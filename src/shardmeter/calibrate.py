"""Predictions against published measured runs (calibration CSV schema) and the error table.

A CSV row becomes a TransformerSpec (architecture columns), a Cluster (the accelerator preset
named by `gpu` on its reference cluster, with the row's node shape and NIC speed) and a Plan
(parallel columns). Blank cells take the documented framework defaults in `FRAMEWORK_DEFAULTS`.
"""

from __future__ import annotations

import csv
import re
from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass, field
from pathlib import Path

import numpy as np

from shardmeter.errors import UserInputError
from shardmeter.estimate.result import StepEstimate
from shardmeter.estimate.step import estimate_step
from shardmeter.predict import reference_cluster
from shardmeter.specs.hardware import Cluster
from shardmeter.specs.loader import load_cluster
from shardmeter.specs.model import MoESpec, TransformerSpec
from shardmeter.specs.plan import Plan, validate_plan

REQUIRED_COLUMNS: tuple[str, ...] = (
    "run_id",
    "n_layers",
    "hidden",
    "n_heads",
    "ffn",
    "vocab",
    "seq_len",
    "gpu",
    "n_gpus",
    "tp",
    "pp",
    "dp",
    "global_batch",
    "tokens_per_sec_per_gpu",
)


@dataclass(frozen=True)
class FrameworkDefaults:
    """What a framework does when the source leaves a plan column blank."""

    sharding: str  # Megatron/NeMo: distributed optimizer (zero1); FSDP stacks: zero3
    recompute: str
    overlap_tp: bool  # NeMo recipes enable TP comm-GEMM overlap (userbuffers) with TP+SP


FRAMEWORK_DEFAULTS: dict[str, FrameworkDefaults] = {
    "nemo": FrameworkDefaults("zero1", "none", True),
    "megatron": FrameworkDefaults("none", "none", False),
    "torchtitan": FrameworkDefaults("zero3", "selective", False),
    "llm-foundry": FrameworkDefaults("zero3", "none", False),
    "maxtext": FrameworkDefaults("zero3", "none", False),
    "deepspeed": FrameworkDefaults("zero3", "none", False),
}
GENERIC_DEFAULTS = FrameworkDefaults("none", "none", False)


def framework_key(framework: str) -> str:
    """Normalise a `framework` cell (e.g. 'NeMo 24.09', 'DeepSpeed ZeRO-3') to a defaults key."""
    low = framework.lower()
    for key in FRAMEWORK_DEFAULTS:
        if key in low:
            return key
    return "generic"


@dataclass(frozen=True)
class RunSpec:
    """One measured run as ShardMeter inputs."""

    run_id: str
    source_id: str
    framework: str
    model: TransformerSpec
    cluster: Cluster
    plan: Plan
    measured: float  # tokens/s per GPU
    uneven_layers: bool  # pp·vpp does not divide n_layers (framework splits unevenly)


@dataclass(frozen=True)
class RowResult:
    """Prediction for one row, or why it could not be predicted."""

    run_id: str
    source_id: str
    measured: float | None
    predicted: float | None = None
    ape: float | None = None  # |predicted − measured| / measured
    skipped: str | None = None
    run: RunSpec | None = field(default=None, compare=False, repr=False)
    estimate: StepEstimate | None = field(default=None, compare=False, repr=False)


@dataclass(frozen=True)
class ErrorSummary:
    """Absolute percentage error statistics (fractions, not percent)."""

    n: int
    median_ape: float
    mean_ape: float
    p90_ape: float


def _cell(row: Mapping[str, str], name: str) -> str:
    return (row.get(name) or "").strip()


def _int(row: Mapping[str, str], name: str, default: int | None = None) -> int:
    text = _cell(row, name)
    if not text:
        if default is None:
            raise UserInputError(name, text, "a value is required")
        return default
    try:
        value = float(text)
    except ValueError:
        raise UserInputError(name, text, "must be a number") from None
    if value != int(value):
        raise UserInputError(name, text, "must be an integer")
    return int(value)


def _float(row: Mapping[str, str], name: str) -> float | None:
    text = _cell(row, name)
    if not text:
        return None
    try:
        return float(text)
    except ValueError:
        raise UserInputError(name, text, "must be a number") from None


_DENSE_LAYERS = re.compile(r"(?:first\s+)?(\d+)\s+(?:leading\s+)?dense(?:\s+\w+)?\s+layers?", re.I)
_DENSE_LAYERS_ALT = re.compile(r"dense\s+layers?\s*(?:=|:)?\s*(\d+)\b(?!\d)", re.I)
_DENSE_FFN = re.compile(r"dense[^;,.]*?(\d{4,6})", re.I)


def _dense_layers(notes: str, model_name: str) -> tuple[int, int | None]:
    """(leading dense layers, their FFN width) of an MoE model, read from the notes column.

    DeepSeek-V3's report (arXiv:2412.19437, §4.2) has 3 leading dense layers of width 18432;
    that is used when the notes do not state the split.
    """
    ffn_match = _DENSE_FFN.search(notes)
    dense_ffn = int(ffn_match.group(1)) if ffn_match else None
    for pattern in (_DENSE_LAYERS, _DENSE_LAYERS_ALT):
        match = pattern.search(notes)
        if match and int(match.group(1)) < 1000:
            return int(match.group(1)), dense_ffn
    if "deepseek-v3" in model_name.lower().replace(" ", "-"):
        return 3, dense_ffn or 18432
    return 0, dense_ffn


def model_from_row(row: Mapping[str, str]) -> TransformerSpec:
    """TransformerSpec from the architecture columns; embeddings tied when that matches
    `params_b_arch` better (MPT ties its embeddings)."""
    mlp = _cell(row, "mlp") or "gelu"
    if mlp not in ("gelu", "swiglu"):
        raise UserInputError("mlp", mlp, "allowed: gelu, swiglu")
    moe = None
    experts = _cell(row, "moe_experts")
    if experts:
        dense_layers, dense_ffn = _dense_layers(_cell(row, "notes"), _cell(row, "model"))
        moe = MoESpec(
            experts=_int(row, "moe_experts"),
            top_k=_int(row, "moe_topk", 1),
            shared_experts=_int(row, "moe_shared_experts", 0),
            dense_layers=dense_layers,
            dense_ffn=dense_ffn,
        )
    head_dim = _cell(row, "head_dim")
    kwargs = {
        "name": _cell(row, "model") or "custom",
        "n_layers": _int(row, "n_layers"),
        "hidden": _int(row, "hidden"),
        "n_heads": _int(row, "n_heads"),
        "n_kv_heads": _int(row, "n_kv_heads", _int(row, "n_heads")),
        "head_dim": int(float(head_dim)) if head_dim else None,
        "ffn": _int(row, "ffn"),
        "mlp": mlp,
        "vocab": _int(row, "vocab"),
        "seq_len": _int(row, "seq_len"),
        "moe": moe,
    }
    try:
        untied = TransformerSpec(**kwargs)
    except ValueError as exc:
        raise UserInputError("model", kwargs["name"], str(exc).splitlines()[-1]) from None
    arch = _float(row, "params_b_arch")
    if arch and moe is None:
        tied = untied.model_copy(update={"tied_embeddings": True})
        if abs(tied.params_total / 1e9 - arch) < abs(untied.params_total / 1e9 - arch):
            return tied
    return untied


def cluster_from_row(row: Mapping[str, str]) -> Cluster:
    """Reference cluster of the row's `gpu`, with its node shape and per-GPU NIC speed."""
    gpu = _cell(row, "gpu")
    base = load_cluster(reference_cluster(gpu))
    overrides: dict[str, object] = {}
    gpn = _int(row, "gpus_per_node", 0)
    domain = _int(row, "nvlink_domain", 0)
    if gpn:
        overrides["gpus_per_node"] = gpn
    if domain:
        overrides["nvlink_domain"] = domain
    nic = _float(row, "inter_node_gbps_per_gpu")
    if nic:
        overrides["inter"] = {"bandwidth_gbps": nic / 8.0}  # Gbit/s -> GB/s
    return load_cluster(base, **overrides) if overrides else base


def plan_from_row(row: Mapping[str, str]) -> Plan:
    """Plan from the parallel columns; blanks take `FRAMEWORK_DEFAULTS` (vpp 1, micro-batch 1,
    SP on whenever tp > 1 unless stated)."""
    defaults = FRAMEWORK_DEFAULTS.get(framework_key(_cell(row, "framework")), GENERIC_DEFAULTS)
    tp = _int(row, "tp", 1)
    sp_cell = _cell(row, "sp").lower()
    sp = sp_cell == "yes" if sp_cell else tp > 1
    shard_degree = _cell(row, "shard_degree")
    try:
        return Plan(
            dp=_int(row, "dp", 1),
            tp=tp,
            pp=_int(row, "pp", 1),
            cp=_int(row, "cp", 1),
            ep=_int(row, "ep", 1),
            vpp=_int(row, "vpp", 1),
            sp=sp,
            sharding=_cell(row, "sharding") or defaults.sharding,
            shard_degree=int(float(shard_degree)) if shard_degree else None,
            micro_batch=_int(row, "micro_batch", 1),
            global_batch=_int(row, "global_batch"),
            recompute=_cell(row, "recompute") or defaults.recompute,
            precision=_cell(row, "precision") or "bf16",
            overlap_tp=defaults.overlap_tp and tp > 1,
        )
    except ValueError as exc:
        errors = getattr(exc, "errors", None)
        detail = errors()[0] if callable(errors) else {"loc": ("plan",), "msg": str(exc)}
        loc = ".".join(str(x) for x in detail.get("loc", ("plan",)))
        raise UserInputError(f"plan.{loc}", detail.get("input"), str(detail.get("msg"))) from None


def run_from_row(row: Mapping[str, str]) -> RunSpec:
    """All inputs of one CSV row; raises UserInputError naming what cannot be mapped."""
    model = model_from_row(row)
    cluster = cluster_from_row(row)
    plan = plan_from_row(row)
    uneven = False
    try:
        validate_plan(plan, model, _int(row, "n_gpus"))
    except UserInputError as exc:
        if not (exc.field == "plan.pp" and "divide n_layers" in exc.allowed):
            raise
        uneven = True
    measured = _float(row, "tokens_per_sec_per_gpu")
    if measured is None or measured <= 0:
        raise UserInputError("tokens_per_sec_per_gpu", measured, "must be a positive number")
    return RunSpec(
        run_id=_cell(row, "run_id"),
        source_id=_cell(row, "source_id") or "?",
        framework=_cell(row, "framework"),
        model=model,
        cluster=cluster,
        plan=plan,
        measured=measured,
        uneven_layers=uneven,
    )


def read_rows(path: str | Path) -> list[dict[str, str]]:
    """Rows of a CSV in the calibration schema (UserInputError if required columns are missing)."""
    with open(path, newline="", encoding="utf-8") as fh:
        reader = csv.DictReader(fh)
        missing = [c for c in REQUIRED_COLUMNS if c not in (reader.fieldnames or [])]
        if missing:
            raise UserInputError("csv", str(path), f"missing columns: {', '.join(missing)}")
        return [dict(r) for r in reader]


def predict_run(run: RunSpec, cluster: Cluster | None = None) -> StepEstimate:
    """Estimate one run (optionally on a cluster with other efficiencies, for fitting)."""
    return estimate_step(run.model, cluster or run.cluster, run.plan, check_layers=False)


def evaluate_rows(rows: Iterable[Mapping[str, str]]) -> list[RowResult]:
    """Predicted vs measured tokens/s per GPU for every row; unmappable rows carry the reason."""
    results: list[RowResult] = []
    for row in rows:
        run_id = _cell(row, "run_id")
        source = _cell(row, "source_id") or "?"
        measured = _float(row, "tokens_per_sec_per_gpu") if _cell(row, "run_id") else None
        try:
            run = run_from_row(row)
            est = predict_run(run)
        except UserInputError as exc:
            results.append(RowResult(run_id, source, measured, skipped=str(exc)))
            continue
        pred = est.tokens_per_s_per_gpu
        results.append(
            RowResult(
                run_id, source, run.measured, pred, abs(pred / run.measured - 1.0), None, run, est
            )
        )
    return results


def summarize(apes: Sequence[float]) -> ErrorSummary:
    """Median, mean and 90th-percentile APE (numpy's linear percentile)."""
    if not apes:
        return ErrorSummary(0, float("nan"), float("nan"), float("nan"))
    arr = np.asarray(apes, dtype=np.float64)
    return ErrorSummary(
        n=len(arr),
        median_ape=float(np.median(arr)),
        mean_ape=float(np.mean(arr)),
        p90_ape=float(np.percentile(arr, 90)),
    )


def summarize_results(results: Sequence[RowResult]) -> tuple[ErrorSummary, dict[str, ErrorSummary]]:
    """Overall and per-source summaries over the predicted rows."""
    done = [r for r in results if r.ape is not None]
    overall = summarize([r.ape for r in done if r.ape is not None])
    per_source: dict[str, ErrorSummary] = {}
    for source in sorted({r.source_id for r in done}):
        per_source[source] = summarize(
            [r.ape for r in done if r.source_id == source and r.ape is not None]
        )
    return overall, per_source
