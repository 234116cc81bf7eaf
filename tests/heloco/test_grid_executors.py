"""Grid executors: cells batched side by side, and grids on a local Ray cluster.

A grid writes the same rows whichever executor ran a cell and however many cells a task
simulated together, so a grid started on one executor resumes on another.
"""

from __future__ import annotations

import json
import subprocess
import sys
from dataclasses import asdict
from pathlib import Path
from typing import Any

import pytest

from heloco.executors import run_tasks
from heloco.experiments import Cell, CellResult, GridRun, Split, grid_tasks, run_grid
from shardmeter.errors import UserInputError

EXTRA: dict[str, Any] = {
    "inner_steps": 2,
    "token_budget": 1536,
    "eval_every": 512,
    "eval_windows": 4,
    "data.synthetic_chars_per_language": 30000,
    "data.val_chars_per_language": 5000,
}
CELLS = [Cell("default", (1.0, 2.0), m, 0) for m in ("heloco", "sync", "dn-dylu")]
VOLATILE = ("wall_seconds", "run_dir")


def rows(results: list[CellResult]) -> list[dict[str, Any]]:
    return [{k: v for k, v in asdict(r).items() if k not in VOLATILE} for r in results]


def eval_losses(root: Path, cell: Cell) -> list[float]:
    lines = (root / "runs" / cell.key / "events.jsonl").read_text(encoding="utf-8").splitlines()
    return [e["loss"] for e in map(json.loads, lines) if e["type"] == "eval"]


def test_tasks_batch_one_setting_in_grid_order(tmp_path: Path) -> None:
    cells = [
        Cell("r", paces, m, seed, split)
        for seed in (0, 1)
        for paces, split in (((1.0, 2.0), Split()), ((1.0, 3.0), Split("dirichlet", 0.1)))
        for m in ("a", "b", "c")
    ]
    tasks = grid_tasks(cells, GridRun(tmp_path, None, batch_cells=2))
    firsts = [cells.index(t[0][0]) for t in tasks]
    assert firsts == sorted(firsts)
    assert [len(t[0]) for t in tasks] == [2] * 6
    for task_cells, *_ in tasks:
        assert len({(c.regime, c.paces, c.split) for c in task_cells}) == 1
    by_seed = grid_tasks(cells, GridRun(tmp_path, None, batch_cells=3))
    assert [{c.seed for c in t[0]} for t in by_seed] == [{0}, {0}, {1}, {1}]  # seed-major
    assert sorted(c.key for t in tasks for c in t[0]) == sorted(c.key for c in cells)


def test_cells_side_by_side_equal_cells_alone(tmp_path: Path) -> None:
    alone = run_grid(CELLS, GridRun(tmp_path / "alone", None, jobs=1, extra=EXTRA))
    together = run_grid(
        CELLS, GridRun(tmp_path / "together", None, jobs=1, extra=EXTRA, batch_cells=3)
    )
    assert rows(together) == rows(alone)
    for cell in CELLS:
        assert eval_losses(tmp_path / "together", cell) == eval_losses(tmp_path / "alone", cell)


def test_unknown_executor_is_one_line() -> None:
    with pytest.raises(UserInputError, match="executor"):
        list(run_tasks(str, [1], executor="slurm"))  # type: ignore[arg-type]


@pytest.mark.slow
def test_ray_stays_unimported() -> None:
    code = (
        "import sys, heloco.experiments, heloco.sim, heloco.executors; print('ray' in sys.modules)"
    )
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True)
    assert out.stdout.strip() == "False"


@pytest.mark.slow
@pytest.mark.timeout(300)
def test_grid_on_local_ray_equals_local_and_resumes_across_executors(tmp_path: Path) -> None:
    pytest.importorskip("ray")
    local = run_grid(CELLS, GridRun(tmp_path / "local", None, jobs=1, extra=EXTRA))
    root = tmp_path / "mixed"
    on_ray = run_grid(
        CELLS[:2], GridRun(root, None, jobs=2, extra=EXTRA, batch_cells=2, executor="ray")
    )
    assert rows(on_ray) == rows(local[:2])
    seen: list[tuple[str, bool]] = []
    resumed = run_grid(
        CELLS,
        GridRun(root, None, jobs=1, extra=EXTRA),
        lambda c, r, cached: seen.append((c.method, cached)),
    )
    assert seen == [("heloco", True), ("sync", True), ("dn-dylu", False)]
    assert rows(resumed) == rows(local)
    for cell in CELLS:
        assert eval_losses(root, cell) == eval_losses(tmp_path / "local", cell)
    assert (root / "results.csv").read_text().count("\n") == 4
