"""Predicted vs measured memory per GPU: the published measurements in `data/calibration/`.

Each row of the memory CSV (schema in `data/calibration/README.md`) states a model, a GPU, a
layout and a memory setup, and either a measured peak of one kind (allocated, reserved or
device total), an out-of-memory outcome, or a fit reported without a figure.
`evaluate_memory_rows` predicts each row with the memory model (`estimate/memory.py`),
compares the prediction of the kind the row reports, and checks the OOM verdict (device total against the card's capacity) on every row that reports a
fit or an OOM. Bytes; errors as fractions.
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path

from shardmeter.calibrate import (
    ErrorSummary,
    _cell,
    _float,
    cluster_from_row,
    model_from_row,
    plan_from_row,
    read_csv_rows,
    summarize,
    validate_relaxed,
)
from shardmeter.errors import UserInputError
from shardmeter.estimate.result import StepEstimate
from shardmeter.predict import estimate_step
from shardmeter.specs.framework import FRAMEWORKS
from shardmeter.specs.hardware import Cluster
from shardmeter.specs.model import TransformerSpec
from shardmeter.specs.plan import Plan

DEFAULT_MEMORY_CSV = Path(__file__).parent / "data" / "calibration" / "memory.csv"
KINDS = ("allocated", "reserved", "total")
NORMS = ("rmsnorm", "layernorm")  # TransformerSpec.norm
UNITS = {"GiB": 2.0**30, "GB": 1e9, "MiB": 2.0**20, "MB": 1e6}
MEMORY_COLUMNS = (
    "run_id", "source_id", "model", "n_layers", "hidden", "n_heads", "ffn", "vocab", "seq_len",
    "gpu", "n_gpus", "memory", "memory_unit", "memory_kind", "outcome",
)  # fmt: skip
# Memory-setup columns passed to the Plan as stated (blank: the Plan default).
_SETUP_COLUMNS = (
    "optimizer", "master_weights", "offload", "selective_policy", "ce_upcast",
    "optimizer_in_backward", "grad_accum_dtype",
)  # fmt: skip


@dataclass(frozen=True)
class MemoryRun:
    """The inputs of one memory row."""

    run_id: str
    source_id: str
    model: TransformerSpec
    cluster: Cluster
    plan: Plan
    kind: str  # allocated | reserved | total
    measured: float | None  # bytes; None for an OOM row or a fit reported without a figure
    outcome: str  # fit | oom


@dataclass(frozen=True)
class MemoryResult:
    """One row: the prediction of its kind, the error, and the OOM verdict check."""

    run_id: str
    source_id: str
    kind: str
    measured: float | None
    predicted: float | None = None
    ape: float | None = None  # |predicted / measured − 1|
    outcome: str = "fit"
    verdict_ok: bool | None = None  # predicted fit/OOM matches the row's outcome
    skipped: str | None = None
    run: MemoryRun | None = None
    estimate: StepEstimate | None = None


def read_memory_rows(path: str | Path) -> list[dict[str, str]]:
    """Rows of a memory CSV (see :func:`shardmeter.calibrate.read_csv_rows`)."""
    return read_csv_rows(path, MEMORY_COLUMNS, "memory CSV")


def memory_run_from_row(row: Mapping[str, str]) -> MemoryRun:
    """All inputs of one memory row; UserInputError names the cell that cannot be mapped."""
    framework = _cell(row, "framework").lower()
    plan_row = dict(row)
    if framework not in FRAMEWORKS:  # litgpt, torchtune: every plan field is stated instead
        plan_row["framework"] = ""
    model = model_from_row(plan_row)
    tied = _cell(row, "tied").lower()
    if tied in ("yes", "no"):
        model = model.model_copy(update={"tied_embeddings": tied == "yes"})
    norm = _cell(row, "norm").lower()
    if norm:
        if norm not in NORMS:
            raise UserInputError("norm", norm, f"one of {', '.join(NORMS)}")
        model = model.model_copy(update={"norm": norm})
    cluster = cluster_from_row(plan_row)
    plan = plan_from_row(plan_row)
    setup = {name: _cell(row, name).lower() for name in _SETUP_COLUMNS if _cell(row, name)}
    if setup:
        try:
            plan = Plan(**{**plan.model_dump(), **setup})
        except ValueError as exc:
            errors = getattr(exc, "errors", None)
            detail = errors()[0] if callable(errors) else {"loc": ("plan",), "msg": str(exc)}
            loc = ".".join(str(x) for x in detail.get("loc", ("plan",)))
            raise UserInputError(
                f"plan.{loc}", detail.get("input"), str(detail.get("msg"))
            ) from None
    validate_relaxed(plan, model, int(_cell(row, "n_gpus") or 0))
    kind = _cell(row, "memory_kind").lower()
    outcome = _cell(row, "outcome").lower() or "fit"
    if outcome not in ("fit", "oom"):
        raise UserInputError("outcome", outcome, "fit or oom")
    measured = None
    if outcome == "fit" and _cell(row, "memory"):  # a fit without a figure checks the verdict only
        if kind not in KINDS:
            raise UserInputError("memory_kind", kind, f"one of {', '.join(KINDS)}")
        unit = _cell(row, "memory_unit")
        if unit not in UNITS:
            raise UserInputError("memory_unit", unit, f"one of {', '.join(UNITS)}")
        value = _float(row, "memory")
        if value is None or value <= 0:
            raise UserInputError("memory", value, "a positive number")
        measured = value * UNITS[unit]
    return MemoryRun(
        run_id=_cell(row, "run_id"),
        source_id=_cell(row, "source_id") or "?",
        model=model,
        cluster=cluster,
        plan=plan,
        kind=kind or "total",
        measured=measured,
        outcome=outcome,
    )


def predicted_kind(est: StepEstimate, kind: str) -> float:
    """The prediction of one kind: allocated, reserved or device total, bytes per GPU."""
    if kind == "allocated":
        return est.memory_allocated_bytes
    if kind == "reserved":
        return est.memory_reserved_bytes
    return est.memory_total_bytes


def evaluate_memory_rows(rows: Iterable[Mapping[str, str]]) -> list[MemoryResult]:
    """Predicted vs measured memory for every row, and the OOM verdict where one is reported."""
    results: list[MemoryResult] = []
    for row in rows:
        run_id, source = _cell(row, "run_id"), _cell(row, "source_id") or "?"
        kind = _cell(row, "memory_kind").lower()
        status = _cell(row, "status")
        if status.lower().startswith("excluded"):  # kept in the data with its reason
            results.append(MemoryResult(run_id, source, kind, None, skipped=status))
            continue
        try:
            run = memory_run_from_row(row)
            est = estimate_step(run.model, run.cluster, run.plan, check_layers=False)
        except UserInputError as exc:
            results.append(MemoryResult(run_id, source, kind, None, skipped=str(exc)))
            continue
        predicted = predicted_kind(est, run.kind)
        ape = None if run.measured is None else abs(predicted / run.measured - 1.0)
        results.append(
            MemoryResult(
                run_id,
                source,
                run.kind,
                run.measured,
                predicted,
                ape,
                run.outcome,
                est.fits == (run.outcome == "fit"),
                None,
                run,
                est,
            )
        )
    return results


@dataclass(frozen=True)
class MemorySummary:
    """Error distribution overall, per source and per kind, and the OOM verdicts."""

    overall: ErrorSummary
    per_source: dict[str, ErrorSummary]
    per_kind: dict[str, ErrorSummary]
    verdicts: int  # rows with a fit or OOM outcome that were predicted
    verdicts_right: int


def summarize_memory(results: Sequence[MemoryResult]) -> MemorySummary:
    """Median/mean/p90 of the APE overall, per source and per kind; OOM verdict counts."""
    done = [r for r in results if r.ape is not None]
    per_source = {
        s: summarize([r.ape for r in done if r.source_id == s and r.ape is not None])
        for s in sorted({r.source_id for r in done})
    }
    per_kind = {
        k: summarize([r.ape for r in done if r.kind == k and r.ape is not None])
        for k in KINDS
        if any(r.kind == k for r in done)
    }
    judged = [r for r in results if r.verdict_ok is not None]
    return MemorySummary(
        overall=summarize([r.ape for r in done if r.ape is not None]),
        per_source=per_source,
        per_kind=per_kind,
        verdicts=len(judged),
        verdicts_right=sum(1 for r in judged if r.verdict_ok),
    )
