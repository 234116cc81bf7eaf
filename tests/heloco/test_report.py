"""`heloco report`: two tiny runs -> comparison table, PNG + SVG plots, JSON; bad input."""

from __future__ import annotations

import json
import math
import shutil
from collections.abc import Callable
from pathlib import Path

import pytest

from heloco.cli import main
from heloco.metrics import EvalPoint
from heloco.report import common_budget, comparison_rows, load_runs, loss_at, short_labels

TINY = [
    "simulate", "--inner-steps", "2", "--token-budget", "3072", "--threads", "1", "--quiet",
    "--eval-every", "1024", "--set", "eval_windows=4", "--set", "workers=3",
    "--set", "data.synthetic_chars_per_language=30000", "--set", "data.val_chars_per_language=5000",
]  # fmt: skip


@pytest.fixture(scope="module")
def two_runs(tmp_path_factory: pytest.TempPathFactory) -> Path:
    root = tmp_path_factory.mktemp("runs")
    for method, paces in (("heloco", "1,1,2"), ("sync", "1,1,2")):
        rc = main([*TINY, "--method", method, "--paces", paces, "--out", str(root / method)])
        assert rc == 0
    return root


@pytest.mark.slow
def test_report_writes_plots_and_table(
    two_runs: Path, tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    out = tmp_path / "rep"
    assert (
        main(["report", str(two_runs / "heloco"), str(two_runs / "sync"), "--out", str(out)]) == 0
    )
    printed = capsys.readouterr().out
    assert "heloco" in printed and "sync" in printed
    for stem in ("loss_vs_tokens", "loss_vs_time", "loss_per_language"):
        assert (out / f"{stem}.png").read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"
        assert "<svg" in (out / f"{stem}.svg").read_text()[:2000]
    table = (out / "table.md").read_text()
    assert table.count("\n| ") == 3  # header + two runs
    assert "loss @ common tokens" in table


def test_report_json_and_recursive_discovery(
    two_runs: Path, tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    assert main(["report", str(two_runs), "--out", str(tmp_path), "--no-plots", "--json"]) == 0
    payload = json.loads(capsys.readouterr().out)
    assert {r["method"] for r in payload["runs"]} == {"heloco", "sync"}
    assert payload["files"] == []
    # both runs reached the common token budget, so both have a loss there
    assert all(r["loss_at_common_tokens"] is not None for r in payload["runs"])


def test_common_budget_readings(two_runs: Path) -> None:
    runs = load_runs([two_runs])
    tok = common_budget(runs, "tokens")
    rows = comparison_rows(runs)
    for run, row in zip(runs, rows, strict=True):
        assert row.loss_at_common_tokens == pytest.approx(loss_at(run.evals, tok, "tokens"))
        assert row.final_loss == run.evals[-1].loss


def test_loss_at_interpolates_and_refuses_outside() -> None:
    pts = [EvalPoint(t, 0, float(t), 0, loss, {}, loss) for t, loss in ((0, 4.0), (10, 2.0))]
    assert loss_at(pts, 5, "tokens") == pytest.approx(3.0)
    assert math.isnan(loss_at(pts, 11, "tokens"))


def test_short_labels_are_distinct() -> None:
    labels = short_labels([Path("/a/x/heloco/s0"), Path("/a/y/heloco/s0")])
    assert labels == ["x/heloco/s0", "y/heloco/s0"]


def test_bad_run_dir_is_one_line(tmp_path: Path, cli_error: Callable[..., str]) -> None:
    assert "RUN_DIR" in cli_error(main, ["report", str(tmp_path / "missing")])
    (tmp_path / "empty").mkdir()
    assert main(["report", str(tmp_path / "empty")]) == 2


def test_report_of_a_glob_twice_skips_its_own_output(
    two_runs: Path, tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    """`heloco report runs/*` writes runs/report, which the same glob picks up next time."""
    root = tmp_path / "runs"
    for name in ("heloco", "sync"):
        shutil.copytree(two_runs / name, root / name)
    for _ in range(2):
        argv = ["report", *map(str, sorted(root.iterdir())), "--no-plots", "--json"]
        assert main(argv) == 0, capsys.readouterr().err
        payload = json.loads(capsys.readouterr().out)
        assert len(payload["runs"]) == 2
    assert json.loads((root / "report" / "report.json").read_text())["runs"] == payload["runs"]
    assert main(["report", str(root / "report")]) == 2
    assert "these are reports" in capsys.readouterr().err


def test_report_table_fits_80_columns_when_piped(
    two_runs: Path,
    tmp_path: Path,
    capsys: pytest.CaptureFixture[str],
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    monkeypatch.setenv("COLUMNS", "80")
    assert main(["report", str(two_runs), "--out", str(tmp_path), "--no-plots"]) == 0
    lines = capsys.readouterr().out.splitlines()
    assert max(len(line.rstrip()) for line in lines) <= 80
    assert not any("…" in line for line in lines)
    assert sum("heloco" in line for line in lines) >= 1  # one line per run, never wrapped
    assert main(["report", str(two_runs), "--out", str(tmp_path), "--no-plots", "--wide"]) == 0
    assert "loss" in capsys.readouterr().out and "updates" in (tmp_path / "table.md").read_text()
