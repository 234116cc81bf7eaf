"""Metrics: budget interpolation, cycle window, shares, JSONL and atomic summary writing."""

from __future__ import annotations

import json
import math
from pathlib import Path

import pytest

from heloco.metrics import (
    EVENTS_FILE,
    SUMMARY_FILE,
    CorrectionSummary,
    EvalPoint,
    MetricsWriter,
    RunStats,
    RunSummary,
    cycle_average,
    loss_at,
    update_event,
)
from heloco.outer.base import StepStats
from heloco.server import ArrivalRecord, UpdateRecord


def point(tokens: int, time: float, loss: float) -> EvalPoint:
    return EvalPoint(tokens, tokens // 10, time, 0, loss, {"de": loss}, loss)


def record(rev: int, worker: int, staleness: int, cos: float) -> UpdateRecord:
    arrival = ArrivalRecord(worker, rev, rev - staleness, staleness, 5, 50, 1.0)
    stats = StepStats(
        rho=0.5,
        delta_norm=1.0,
        cos_delta_momentum=cos,
        frac_kept=0.5,
        frac_rotated=0.5,
        correction_size=0.1,
        mean_lambda=0.2,
    )
    return UpdateRecord(rev, (arrival,), stats)


def test_loss_at_interpolates_between_bracketing_evals() -> None:
    pts = [point(0, 0.0, 10.0), point(100, 5.0, 8.0), point(200, 10.0, 6.0)]
    assert loss_at(pts, 150, "tokens") == pytest.approx(7.0)
    assert loss_at(pts, 2.5, "time") == pytest.approx(9.0)
    assert loss_at(pts, 200, "tokens") == pytest.approx(6.0)
    assert loss_at(pts, 250, "tokens") is None


def test_cycle_average_uses_the_window() -> None:
    pts = [point(0, 0.0, 10.0), point(100, 5.0, 8.0), point(200, 9.0, 6.0)]
    assert cycle_average(pts, 10.0, 5.5, 4.0) == pytest.approx((8.0 + 6.0 + 4.0) / 3)
    assert cycle_average([], 10.0, 5.5, 4.0) == 4.0


def test_run_stats_shares_staleness_and_correction() -> None:
    stats = RunStats(2, [{"de": 1.0}, {"de": 0.5, "fr": 0.5}])
    for rec in (record(1, 0, 0, math.nan), record(2, 0, 1, 0.5), record(3, 1, 2, 0.3)):
        stats.add(rec)
    assert stats.worker_shares() == pytest.approx([2 / 3, 1 / 3])
    assert stats.weight_shares() == pytest.approx([2 / 3, 1 / 3])  # equal ρ = 0.5 each
    assert stats.language_shares() == pytest.approx({"de": 2 / 3 + 1 / 6, "fr": 1 / 6})
    assert stats.staleness_mean() == [0.5, 2.0] and stats.staleness_max == [1, 2]
    corr = stats.correction()
    assert corr.cos_delta_momentum == pytest.approx(0.4)  # the nan of the first update skipped
    assert corr.frac_rotated == pytest.approx(0.5)


def test_writer_appends_lines_and_writes_summary_atomically(tmp_path: Path) -> None:
    with MetricsWriter(tmp_path) as w:
        w.event(update_event(record(1, 0, 0, math.nan), 1.5, 50))
        w.event({"type": "eval", "loss": 3.0})
        summary = RunSummary(
            method="heloco",
            n_workers=1,
            final_loss=3.0,
            final_per_language={"de": 3.0},
            loss_at_token_budget=None,
            loss_at_time_budget=math.nan,
            cycle_loss=3.0,
            tokens=50,
            steps=5,
            time=1.5,
            updates=1,
            wall_seconds=0.1,
            train_tokens_per_second=500.0,
            worker_shares=[1.0],
            language_shares={"de": 1.0},
            staleness_mean=[0.0],
            staleness_max=[0],
            correction=CorrectionSummary(None, 1.0, 0.0, 0.0, 0.0, 0.0, 0.0, 0.0),
        )
        w.write_summary(summary)
    lines = (tmp_path / EVENTS_FILE).read_text().splitlines()
    first = json.loads(lines[0])
    assert first["type"] == "update" and first["cos_delta_momentum"] is None
    assert first["workers"] == [0] and first["staleness"] == [0]
    data = json.loads((tmp_path / SUMMARY_FILE).read_text())
    assert data["loss_at_time_budget"] is None and data["schema_version"] == 1
    assert [p.name for p in tmp_path.iterdir() if p.suffix == ".tmp"] == []
    run = first["run"]
    assert all(json.loads(x)["run"] == run for x in lines)
    with MetricsWriter(tmp_path, run_id=run, append=True) as w:  # a resumed run appends
        w.event({"type": "round"})
    assert len((tmp_path / EVENTS_FILE).read_text().splitlines()) == 3
    with MetricsWriter(tmp_path) as w:  # a new run starts the file afresh, with a new id
        w.event({"type": "round"})
    (only,) = (tmp_path / EVENTS_FILE).read_text().splitlines()
    assert json.loads(only)["run"] != run
