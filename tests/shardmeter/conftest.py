"""Fixtures shared by the ShardMeter tests: a tiny model, one plan as the estimator's scalar
columns, the memory measurements read and evaluated once, the calibration runs (and their
plans) with their published corrections, and `shardmeter predict --json` run in-process."""

from __future__ import annotations

import json
from collections.abc import Callable
from pathlib import Path
from typing import Any

import pytest

from shardmeter.calibrate import apply_corrections, read_corrections, read_rows, run_from_row
from shardmeter.cli import main
from shardmeter.estimate.plan_arrays import PlanArrays
from shardmeter.memcheck import (
    DEFAULT_MEMORY_CSV,
    MemoryResult,
    evaluate_memory_rows,
    read_memory_rows,
)
from shardmeter.paths import missing_shared_reason, shared_path
from shardmeter.specs.model import TransformerSpec
from shardmeter.specs.plan import Plan

ScalarPlan = Callable[..., PlanArrays]
PredictJson = Callable[[list[str]], dict[str, Any]]
CorrectedPlans = Callable[[str], dict[str, Plan]]
CORRECTIONS = Path(__file__).resolve().parents[2] / "benchmarks" / "runs_corrections.csv"


@pytest.fixture(scope="session")
def tiny() -> TransformerSpec:
    """Four layers of h = 1024 (8 heads, F = 4096), V = 1000, s = 512: closed forms stay small."""
    return TransformerSpec(n_layers=4, hidden=1024, n_heads=8, ffn=4096, vocab=1000, seq_len=512)


@pytest.fixture(scope="session")
def scalar_plan() -> ScalarPlan:
    """`scalar_plan(**fields)`: one `Plan` (validated, with its framework's defaults) as the
    Python-scalar columns the estimator's formulas take."""

    def build(**fields: Any) -> PlanArrays:
        return PlanArrays.scalar(Plan(**fields))

    return build


@pytest.fixture(scope="session")
def memory_rows() -> list[dict[str, str]]:
    """The shipped memory measurements (`DEFAULT_MEMORY_CSV`), read once; copy a row to edit it."""
    return read_memory_rows(DEFAULT_MEMORY_CSV)


@pytest.fixture(scope="session")
def memory_results(memory_rows: list[dict[str, str]]) -> list[MemoryResult]:
    """Predicted against measured memory for every shipped row, evaluated once per session."""
    return evaluate_memory_rows(memory_rows)


@pytest.fixture(scope="session")
def corrected_rows() -> list[dict[str, str]]:
    """The shared calibration CSV's rows with benchmarks/runs_corrections.csv applied (skips
    where ../shared is absent); copy a row to edit it."""
    path = shared_path("calibration", "runs.csv")
    if path is None:
        pytest.skip(missing_shared_reason("calibration", "runs.csv"))
    return apply_corrections(read_rows(path), read_corrections(CORRECTIONS))[0]


@pytest.fixture(scope="session")
def corrected_plans(corrected_rows: list[dict[str, str]]) -> CorrectedPlans:
    """`corrected_plans(source)`: the plans of one source's corrected calibration runs, by run
    id."""

    def plans(source: str) -> dict[str, Plan]:
        return {
            r["run_id"]: run_from_row(r).plan for r in corrected_rows if r["source_id"] == source
        }

    return plans


@pytest.fixture
def predict_json(capsys: pytest.CaptureFixture[str]) -> PredictJson:
    """`predict_json(args)`: run `shardmeter <args>` (a `predict ... --json` line) in-process,
    check it exits 0, and return the JSON document it printed."""

    def run(args: list[str]) -> dict[str, Any]:
        assert main(args) == 0
        doc: dict[str, Any] = json.loads(capsys.readouterr().out)
        return doc

    return run
