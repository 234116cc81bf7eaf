"""docs/planner.md quotes `benchmarks/published_plans.py`: its first rows must be today's output.

When the estimator changes, the page's table can go stale (an estimator change once moved the
median gap from 4.1% to 9.8% and the out-of-memory count from 14 to 0 while the page kept the
old table); this catches the drift for a few runs.
"""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

import pytest

from shardmeter.paths import missing_shared_reason, shared_path

REPO = Path(__file__).resolve().parents[2]
ROWS = 6  # enough to see a changed estimate, a few seconds of search


def rows(text: str) -> list[list[str]]:
    """The table's run rows, without the last column (seconds of search, which vary)."""
    out = []
    for line in text.splitlines():
        parts = line.split()
        if len(parts) > 4 and parts[0].isdigit() and parts[1].isdigit() and parts[2][:2] == "tp":
            out.append(parts[:-1])
    return out


@pytest.mark.slow
def test_planner_page_quotes_the_benchmark() -> None:
    if shared_path("calibration", "runs.csv") is None:
        pytest.skip(missing_shared_reason("calibration", "runs.csv"))
    done = subprocess.run(
        [sys.executable, str(REPO / "benchmarks" / "published_plans.py"), "--limit", str(ROWS)],
        capture_output=True,
        text=True,
        timeout=240,
        check=True,
    )
    page = (REPO / "docs" / "planner.md").read_text(encoding="utf-8")
    quoted = page.split("benchmarks/published_plans.py", 1)[1]
    assert rows(quoted)[:ROWS] == rows(done.stdout), "rerun it and paste the table in planner.md"
