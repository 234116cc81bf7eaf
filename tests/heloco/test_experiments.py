"""Grid runner: budget readings, paired improvements, resumable runs."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
from hypothesis import given
from hypothesis import strategies as st

from heloco.experiments import (
    RESULTS_CSV,
    RESULTS_JSONL,
    Cell,
    CellResult,
    GridRun,
    interpolate,
    paired_improvement,
    read_results,
    readings,
    relative_improvement,
    run_grid,
    time_budget_for,
    window_mean,
)
from heloco.metrics import EvalPoint
from shardmeter.errors import UserInputError


def test_time_budget_is_async_token_time() -> None:
    # 5 workers at pace 1 train 5 steps per second; 1000 steps of 10 tokens take 200 s
    assert time_budget_for(10_000, [1, 1, 1, 1, 1], 10) == pytest.approx(200.0)
    # one fast worker and four at 15 s/step: 1 + 4/15 steps per second
    assert time_budget_for(1900, [1, 15, 15, 15, 15], 1) == pytest.approx(1500.0)


def test_interpolate_linear_and_step() -> None:
    xs, ys = [0.0, 10.0, 20.0], [5.0, 3.0, 2.0]
    assert interpolate(xs, ys, 5) == 4.0
    assert interpolate(xs, ys, 5, step=True) == 5.0
    assert interpolate(xs, ys, 10, step=True) == 3.0
    assert interpolate(xs, ys, 30) == 2.0


def test_window_mean_exact_for_linear_and_step() -> None:
    xs, ys = [0.0, 10.0, 20.0], [5.0, 3.0, 2.0]
    assert window_mean(xs, ys, 20, 10) == pytest.approx(2.5)
    assert window_mean(xs, ys, 15, 10) == pytest.approx(
        (4.0 + 3.0) / 2 * 0.5 + (3.0 + 2.5) / 2 * 0.5
    )
    assert window_mean(xs, ys, 15, 10, step=True) == pytest.approx(4.0)


@given(
    st.lists(st.floats(0.1, 10), min_size=2, max_size=8),
    st.floats(0.0, 1.0),
    st.floats(0.01, 5.0),
)
def test_window_mean_within_curve_range(ys: list[float], frac: float, width: float) -> None:
    xs = [float(i) for i in range(len(ys))]
    end = frac * xs[-1]
    for step in (False, True):
        m = window_mean(xs, ys, end, width, step)
        assert min(ys) - 1e-9 <= m <= max(ys) + 1e-9


def points(curve: list[tuple[int, float, float]]) -> list[EvalPoint]:
    return [EvalPoint(t, 0, s, 0, loss, {"xx": loss}, loss) for t, s, loss in curve]


def test_readings_at_both_budgets() -> None:
    pts = points([(0, 0.0, 4.0), (100, 10.0, 3.0), (200, 20.0, 2.0)])
    r = readings(pts, token_budget=150, time_budget=10.0, cycle=10.0)
    assert r["loss_at_tokens"] == pytest.approx(2.5)
    assert r["loss_at_time"] == pytest.approx(3.0)
    assert r["cycle_loss_at_time"] == pytest.approx(3.5)
    assert r["per_language_at_tokens"] == {"xx": pytest.approx(2.5)}
    with pytest.raises(ValueError, match="before the budgets"):
        readings(pts, token_budget=300, time_budget=10.0, cycle=10.0)


def _row(method: str, seed: int, loss: float) -> CellResult:
    return CellResult(
        "r", [1.0], "language", method, seed, 1, 1.0, 1.0, loss, loss, loss, loss, 5.0,
        {}, {}, 1, 1.0, 1, [1.0], {}, [0.0], [0], {}, 0.0,
    )  # fmt: skip


def test_paired_improvement_over_seeds() -> None:
    rows = [_row("base", 0, 4.0), _row("new", 0, 3.0), _row("base", 1, 2.0), _row("new", 1, 2.0)]
    imp = paired_improvement(rows, "new", "base", "loss_at_tokens")
    assert imp.n == 2
    assert imp.mean == pytest.approx((0.25 + 0.0) / 2)
    assert relative_improvement(4.0, 3.0) == 0.25


TINY_CELL = {
    "inner_steps": 2,
    "token_budget": 2560,
    "eval_every": 512,
    "eval_windows": 4,
    "data.synthetic_chars_per_language": 30000,
    "data.val_chars_per_language": 5000,
}


def test_grid_runs_writes_and_resumes(tmp_path: Path) -> None:
    cells = [Cell("default", (1.0, 2.0), m, 0) for m in ("sync", "heloco")]
    grid = GridRun(out_root=tmp_path, data_dir=None, jobs=1, extra=TINY_CELL)
    seen: list[tuple[str, bool]] = []
    rows = run_grid(cells, grid, lambda c, r, cached: seen.append((c.method, cached)))
    assert [r.method for r in rows] == ["sync", "heloco"]
    assert all(not cached for _, cached in seen)
    for r in rows:
        assert r.tokens >= 2560 and r.sim_time >= r.time_budget
        assert r.loss_at_tokens < r.initial_loss
    assert len((tmp_path / RESULTS_JSONL).read_text().splitlines()) == 2
    assert (tmp_path / RESULTS_CSV).read_text().startswith("regime,paces")
    # a second invocation finds both cells done and runs nothing
    seen.clear()
    again = run_grid(cells, grid, lambda c, r, cached: seen.append((c.method, cached)))
    assert all(cached for _, cached in seen) and len(seen) == 2
    assert [a.loss_at_tokens for a in again] == [r.loss_at_tokens for r in rows]
    assert {r.method for r in read_results(tmp_path)} == {"sync", "heloco"}
    stored = json.loads((tmp_path / "runs" / cells[1].key / "cell.json").read_text())
    assert stored["method"] == "heloco"
    # the same folder with other settings: refused in one line, nothing mixed or rerun
    other = GridRun(out_root=tmp_path, data_dir=None, jobs=1, extra={**TINY_CELL, "seed": 7})
    with pytest.raises(UserInputError) as exc:
        run_grid(cells, other)
    assert "seed" in str(exc.value) and cells[0].key in str(exc.value)
    assert len((tmp_path / RESULTS_JSONL).read_text().splitlines()) == 2


def test_failed_cell_is_reported_not_fatal(tmp_path: Path) -> None:
    cells = [Cell("default", (1.0, 2.0), "heloco", 0)]
    bad = {**TINY_CELL, "data.data_dir": str(tmp_path / "absent")}
    seen: list[object] = []
    rows = run_grid(
        cells, GridRun(tmp_path, None, jobs=1, extra=bad), lambda c, r, k: seen.append(r)
    )
    assert rows == [] and isinstance(seen[0], str) and "data_dir" in str(seen[0])
