"""Nonsense is refused with one line (exit 2), in both commands.

Each case is the command line a user typed (or the file cell they wrote) and what the one
line must name. Before the fix these exited 0 with a silent substitute, a NaN result, or a
traceback.
"""

from __future__ import annotations

import csv
import io
import json
from collections.abc import Callable
from pathlib import Path

import pytest

from heloco.cli import main as heloco_main
from shardmeter.cli import main as shardmeter_main

REPO = Path(__file__).resolve().parents[1]
HOLDOUT = REPO / "benchmarks" / "holdout_runs.csv"
TOPOLOGY = REPO / "src" / "shardmeter" / "data" / "topologies" / "two-clouds.toml"
QUICK = ["simulate", "--quiet", "--print-config"]  # validation only, nothing trains


@pytest.mark.parametrize("flag", ["--tp", "--pp", "--cp", "--micro-batch", "--dp", "--gpus"])
def test_predict_zero_degree(flag: str, cli_error: Callable[..., str]) -> None:
    err = cli_error(shardmeter_main, ["predict", flag, "0"])
    assert flag in err and "got '0'" in err


@pytest.mark.parametrize(
    ("argv", "field"),
    [
        (["--outer-lr", "inf"], "--outer-lr"),
        (["--set", "outer.lr=inf"], "outer.lr"),
        (["--set", "rho=inf"], "outer.rho"),
        (["--set", "pace_jitter=inf"], "pace_jitter"),
        (["--set", "pace_jitter=1e308"], "pace_jitter"),
        (["--set", "seed=99999999999999999999999"], "seed"),
        (["--seed", "99999999999999999999999"], "seed"),
        (["--set", "time_budget=inf"], "time_budget"),
        (["--set", "grace_window=nan"], "grace_window"),
        (["--set", "workers=true"], "workers"),
        (["--set", "dylu=maybe"], "dylu"),
        (["--set", "dylu=1"], "dylu"),
        (["--set", "paces=[1, 1, 1, inf, 2]"], "paces"),
        (["--set", "comm_delays=[0, 0, 0, 0, nan]"], "comm_delays"),
    ],
)
def test_simulate_nonsense(argv: list[str], field: str, cli_error: Callable[..., str]) -> None:
    assert field in cli_error(heloco_main, [*QUICK, *argv])


def csv_with(tmp_path: Path, **cells: str) -> Path:
    """The first holdout row with ``cells`` replaced, as a one-row calibration CSV."""
    rows = list(csv.DictReader(HOLDOUT.open(encoding="utf-8")))
    row = rows[0] | cells
    buf = io.StringIO()
    writer = csv.DictWriter(buf, fieldnames=list(rows[0]))
    writer.writeheader()
    writer.writerow(row)
    path = tmp_path / "runs.csv"
    path.write_text(buf.getvalue(), encoding="utf-8")
    return path


@pytest.mark.parametrize(
    "cells",
    [
        {"n_gpus": "nan"},
        {"n_gpus": "inf"},
        {"hidden": "nan"},
        {"hidden": "-inf"},
        {"head_dim": "nan"},
        {"shard_degree": "inf"},
        {"tokens_per_sec_per_gpu": "nan"},
        {"tokens_per_sec_per_gpu": "inf"},
        {"sp": "maybe"},
    ],
)
def test_calibration_csv_cells(
    cells: dict[str, str], tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    """A bad cell skips its row with the reason; the summary never turns into null."""
    path = csv_with(tmp_path, **cells)
    assert shardmeter_main(["validate", str(path), "--json"]) == 0
    doc = json.loads(capsys.readouterr().out)
    (name,) = cells
    assert doc["rows"] == [] and len(doc["skipped"]) == 1
    assert name in json.dumps(doc["skipped"][0])
    assert doc["summary"]["n"] == 0


def test_calibration_csv_good_row_still_predicts(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    path = csv_with(tmp_path, sp="yes")
    assert shardmeter_main(["validate", str(path), "--json"]) == 0
    doc = json.loads(capsys.readouterr().out)
    assert len(doc["rows"]) == 1 and doc["summary"]["median_ape"] is not None


@pytest.mark.parametrize(
    ("old", "new", "field"),
    [
        ("latency_ms = 80.0", "latency_ms = inf", "latency_ms"),
        ("bandwidth_gbit = 25.0", "bandwidth_gbit = nan", "bandwidth_gbit"),
        ("n_nodes = 4\nprice", "n_nodes = true\nprice", "n_nodes"),
        ("outer_overlap = false", 'outer_overlap = "no"', "outer_overlap"),
        ("inner_steps = 100", "inner_stepz = 100", "did you mean run.inner_steps"),
    ],
)
def test_topology_nonsense(
    old: str, new: str, field: str, tmp_path: Path, cli_error: Callable[..., str]
) -> None:
    text = TOPOLOGY.read_text(encoding="utf-8")
    assert old in text
    path = tmp_path / "topo.toml"
    path.write_text(text.replace(old, new, 1), encoding="utf-8")
    assert field in cli_error(shardmeter_main, ["predict", "--topology", str(path)])
