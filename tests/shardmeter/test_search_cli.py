"""`shardmeter plan` CLI: JSON schema, plot file, one-line errors with exit code 2."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from shardmeter.cli import main
from shardmeter.cli.plan import parse_duration


def test_plan_json_schema(capsys: pytest.CaptureFixture[str]) -> None:
    argv = ["plan", "--model", "llama-3-8b", "--cluster", "dgx-h100", "--gpus", "16:32"]
    argv += ["--global-batch", "128", "--max-cp", "2", "--recompute", "none,full", "--json"]
    assert main(argv) == 0
    doc = json.loads(capsys.readouterr().out)
    assert doc["schema"] == "shardmeter.plan/1" and doc["kind"] == "cluster"
    assert set(doc["best"]) == {"time", "cost", "usd_per_mtok"}
    ranked = doc["ranked"]
    assert [r["rank"] for r in ranked] == list(range(1, len(ranked) + 1))
    walls = [r["wall_s"] for r in ranked]
    assert walls == sorted(walls)
    assert {r["n_gpus"] for r in doc["pareto"]} <= {16, 32}
    isl = ranked[0]["islands"][0]
    assert isl["plan"]["global_batch"] == 128 and isl["memory_bytes"] <= isl["hbm_bytes"]
    assert doc["stats"]["evaluated"] > 0 and doc["explanation"]["text"]


def test_plan_topology_plot(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    out = tmp_path / "front.svg"
    argv = ["plan", "--topology", "two-clouds", "--plot", str(out), "--max-cp", "2"]
    argv += ["--max-gpus-per-island", "16"]
    argv += ["--recompute", "none", "--micro-batches", "1,2", "--modes", "diloco,async"]
    assert main(argv) == 0
    text = capsys.readouterr().out
    assert "Pareto front" in text and "Why #1 wins" in text
    assert out.read_text().startswith("<?xml")


def test_plot_formats_are_the_sweeps(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    """`plan --plot x.pdf` is accepted wherever `sweep --formats pdf` is: one list of plot formats."""
    out = tmp_path / "front.pdf"
    argv = ["plan", "--model", "llama-3-8b", "--cluster", "dgx-h100", "--gpus", "8"]
    argv += ["--global-batch", "64", "--max-cp", "1", "--top", "3", "--plot", str(out)]
    assert main(argv) == 0, capsys.readouterr().err
    assert out.read_bytes().startswith(b"%PDF")


@pytest.mark.parametrize(
    "where",
    [
        ["--model", "llama-3-8b", "--cluster", "dgx-h100", "--gpus", "16", "--global-batch", "64"],
        ["--topology", "two-clouds", "--max-gpus-per-island", "16", "--modes", "diloco"],
    ],
    ids=["cluster", "topology"],
)
def test_plan_for_a_framework_as_predict_does(
    where: list[str], capsys: pytest.CaptureFixture[str]
) -> None:
    """`plan --framework` takes predict's names, and the plans it returns are that stack's
    (one vocabulary of framework names across commands)."""
    argv = ["plan", *where, "--max-cp", "1", "--recompute", "none", "--top", "2", "--json"]
    assert main([*argv, "--framework", "maxtext"]) == 0, capsys.readouterr().err
    doc = json.loads(capsys.readouterr().out)
    plans = [isl["plan"] for r in doc["ranked"] for isl in r["islands"]]
    assert plans and all(p["framework"] == "maxtext" and p["compiled"] for p in plans)
    assert main(argv) == 0
    plain = json.loads(capsys.readouterr().out)
    assert all(isl["plan"]["framework"] is None for r in plain["ranked"] for isl in r["islands"])
    assert main([*argv, "--framework", "maxtxt"]) == 2
    err = capsys.readouterr().err.strip()
    assert "--framework" in err and "maxtext" in err and "\n" not in err


def test_unmet_deadline_exits_1_with_reason(capsys: pytest.CaptureFixture[str]) -> None:
    argv = ["plan", "--model", "llama-3-8b", "--cluster", "dgx-h100", "--gpus", "8"]
    argv += ["--global-batch", "64", "--deadline", "1h", "--max-cp", "1"]
    assert main(argv) == 1
    assert "No plan meets the deadline" in capsys.readouterr().out


@pytest.mark.parametrize(
    "extra",
    [
        ["--deadline", "soon"],
        ["--precision", "int4"],
        ["--gpus", "32:8"],
        ["--plot", "front.bmp"],
        ["--topology", "two-clouds"],
        ["--tokens", "-1"],
        ["--tokens", "nan"],
    ],
)
def test_bad_input_is_one_line_exit_2(extra: list[str], capsys: pytest.CaptureFixture[str]) -> None:
    argv = ["plan", "--model", "llama-3-8b", "--cluster", "dgx-h100", "--gpus", "8", *extra]
    assert main(argv) == 2
    err = capsys.readouterr().err.strip()
    assert err.startswith("shardmeter: error:") and "\n" not in err


def test_parse_duration() -> None:
    assert parse_duration("30d") == 30 * 86400
    assert parse_duration("2.5h") == 9000
    assert parse_duration("90") == 90
