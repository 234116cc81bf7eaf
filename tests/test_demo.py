"""`make demo` (one of the README's two commands) prints about one screen per step.

Issue 11 case 12: the demo printed 205 lines, mostly a repeated table. The Makefile's demo
recipe runs here as make would run it (``make -n``, without rebuilding the environment), in a
temporary folder, piped at 80 columns.
"""

from __future__ import annotations

import os
import shutil
import subprocess
import sys
from pathlib import Path

import pytest
from rich.cells import cell_len

REPO = Path(__file__).resolve().parents[1]
SCREEN = 50  # lines: one screen of a terminal window
pytestmark = [pytest.mark.timeout(600), pytest.mark.slow]  # make demo: minutes


def test_demo_prints_a_screen_per_step(tmp_path: Path) -> None:
    if shutil.which("make") is None:
        pytest.skip("no make on PATH")
    venv = Path(sys.prefix)
    make = ["make", "-s", "-n", "-o", str(venv / ".installed"), "-C", str(REPO)]
    recipe = subprocess.run(
        [*make, "demo", f"VENV={venv}"],
        capture_output=True,
        text=True,
        check=True,
    ).stdout
    env = {**os.environ, "COLUMNS": "80", "MPLBACKEND": "Agg"}
    done = subprocess.run(
        ["bash", "-euo", "pipefail", "-c", recipe],
        cwd=tmp_path,
        env=env,
        capture_output=True,
        text=True,
        timeout=500,
    )
    assert done.returncode == 0 and "Traceback" not in done.stderr, done.stderr[-2000:]
    lines = done.stdout.splitlines()
    starts = [i for i, line in enumerate(lines) if line.startswith("== ")]
    assert len(starts) == 3, lines[:5]
    steps = [lines[a:b] for a, b in zip(starts, [*starts[1:], len(lines)], strict=True)]
    for step in steps:
        assert len(step) <= SCREEN, f"{step[0]}: {len(step)} lines"
    # (the closing hint names the environment, here a long absolute path)
    assert not [line for line in lines[:-1] if cell_len(line.rstrip()) > 80]
    assert lines[-1].startswith("Next: . ") and "activate" in lines[-1]
    assert "…" not in done.stdout, "a number or name was cut"
    assert (tmp_path / "out" / "plan-eight-heterogeneous.png").stat().st_size > 0
