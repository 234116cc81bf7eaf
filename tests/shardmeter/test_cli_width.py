"""Every table reads at 80 columns when piped, nothing cut; --wide: all."""

from __future__ import annotations

from pathlib import Path

import pytest
from rich.cells import cell_len

from shardmeter.cli import main

HOLDOUT = Path(__file__).resolve().parents[2] / "benchmarks" / "holdout_runs.csv"
COMMANDS = [
    ["predict"],
    ["predict", "--topology", "two-clouds"],
    ["predict", "--topology", "eight-heterogeneous"],
    ["plan", "--topology", "two-clouds", "--max-cp", "1", "--no-progress"],
    ["plan", "--model", "llama-3-8b", "--cluster", "dgx-h100", "--gpus", "16", "--no-progress"],
    ["sweep", "--topology", "two-clouds", "--over", "bandwidth", "--values", "0.1,1,10"],
    ["validate", str(HOLDOUT)],
    ["presets", "clusters"],
]


def printed(argv: list[str], capsys: pytest.CaptureFixture[str], tmp_path: Path) -> list[str]:
    if argv[0] == "sweep":
        argv = [*argv, "--no-plots"]
    assert main(argv) in (0, 1), capsys.readouterr().err
    return capsys.readouterr().out.splitlines()


@pytest.mark.parametrize("argv", COMMANDS, ids=lambda a: " ".join(a[:3]))
def test_piped_output_fits_80_columns(
    argv: list[str],
    capsys: pytest.CaptureFixture[str],
    monkeypatch: pytest.MonkeyPatch,
    tmp_path: Path,
) -> None:
    monkeypatch.setenv("COLUMNS", "80")
    lines = printed(argv, capsys, tmp_path)
    too_wide = [line for line in lines if cell_len(line.rstrip()) > 80]
    assert not too_wide, too_wide[:3]
    assert not [line for line in lines if "…" in line], "a number or name was cut"


def test_wide_shows_every_column(
    capsys: pytest.CaptureFixture[str], monkeypatch: pytest.MonkeyPatch, tmp_path: Path
) -> None:
    monkeypatch.setenv("COLUMNS", "80")
    narrow = "\n".join(printed(["predict", "--topology", "eight-heterogeneous"], capsys, tmp_path))
    assert "not shown at 80 columns" in narrow and "--wide" in narrow
    wide = "\n".join(
        printed(["predict", "--topology", "eight-heterogeneous", "--wide"], capsys, tmp_path)
    )
    assert "not shown" not in wide
    for header in ("plan", "MFU", "stale", "tok/s/GPU"):
        assert header in wide
