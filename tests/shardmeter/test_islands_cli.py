"""The multi-island CLI: `predict --topology` hooks and `shardmeter sweep`."""

from __future__ import annotations

import argparse
import json
import re
from pathlib import Path

import pytest

from shardmeter.cli import main
from shardmeter.cli.topology_predict import add_arguments, overrides_from, run_topology


def parse(argv: list[str]) -> argparse.Namespace:
    parser = argparse.ArgumentParser()
    add_arguments(parser)
    return parser.parse_args(argv)


def test_predict_topology_json(capsys: pytest.CaptureFixture[str]) -> None:
    args = parse(["--topology", "four-regions", "--mode", "streaming", "--fragments", "4"])
    args.json = True
    assert run_topology(args) == 0
    doc = json.loads(capsys.readouterr().out)
    assert doc["mode"] == "streaming" and doc["settings"]["fragments"] == 4
    assert len(doc["islands"]) == 4
    assert doc["cost_usd"] == pytest.approx(doc["gpu_cost_usd"] + doc["egress_cost_usd"])


def test_predict_topology_tables(capsys: pytest.CaptureFixture[str]) -> None:
    assert run_topology(parse(["--topology", "eight-heterogeneous"])) == 0
    out = capsys.readouterr().out
    assert "asynchronous parameter server" in out and "eu-central-mi300x" in out


def test_flags_shared_with_the_predict_parser_are_reused() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--model", default="llama-3-8b")
    parser.add_argument("--json", action="store_true")
    add_arguments(parser)
    args = parser.parse_args(["--topology", "two-clouds", "-H", "50"])
    assert overrides_from(args) == {"inner_steps": 50}  # --model at its default is not forced
    args = parser.parse_args(["--topology", "two-clouds", "--model", "llama-2-7b"])
    assert overrides_from(args) == {"model": "llama-2-7b"}


def test_sweep_cli_states_the_knee(capsys: pytest.CaptureFixture[str]) -> None:
    argv = ["sweep", "--topology", "two-clouds", "--over", "inner_steps", "--values", "10,100,1000"]
    assert main([*argv, "--no-plots"]) == 0
    out = " ".join(capsys.readouterr().out.split())  # the knee text wraps at the width
    assert "flips from communication-bound" in out
    assert re.search(
        r"between inner steps H (10 and 100|100 and 1000)\. The exact threshold is H = \d+", out
    )


def test_sweep_cli_rejects_unknown_plot_format(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    argv = ["sweep", "--topology", "two-clouds", "--over", "islands", "--out", str(tmp_path)]
    assert main([*argv, "--formats", "gif"]) == 2
    assert "--formats: got 'gif'" in capsys.readouterr().err
    assert not list(tmp_path.iterdir())


def test_sweep_cli_json(capsys: pytest.CaptureFixture[str]) -> None:
    argv = ["sweep", "--topology", "two-clouds", "--over", "islands", "--json", "--no-plots"]
    assert main(argv) == 0
    doc = json.loads(capsys.readouterr().out)
    assert doc["sweeps"][0]["param"] == "islands" and len(doc["sweeps"][0]["points"]) == 2


@pytest.mark.parametrize(
    ("argv", "message"),
    [
        (["sweep", "--topology", "two-clouds", "--over", "colour"], "--over: got 'colour'"),
        (["sweep", "--topology", "nowhere"], "topology: got 'nowhere'"),
        (
            ["sweep", "--topology", "two-clouds", "--mode", "sync", "--tokens", "-1"],
            "--tokens: got '-1'",
        ),
    ],
)
def test_sweep_cli_bad_input_is_one_line_exit_2(
    argv: list[str], message: str, capsys: pytest.CaptureFixture[str]
) -> None:
    assert main(argv) == 2
    err = capsys.readouterr().err.strip()
    assert message in err and "\n" not in err


def test_sweep_cli_writes_plots_by_default(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    monkeypatch.chdir(tmp_path)
    argv = ["sweep", "--topology", "two-clouds", "--over", "islands", "--formats", "png"]
    assert main(argv) == 0
    assert [p.name for p in (tmp_path / "sweep-plots").iterdir()] == [
        "two-clouds-diloco-islands.png"
    ]
    assert "wrote sweep-plots/two-clouds-diloco-islands.png" in capsys.readouterr().out


def test_sweep_cli_out_that_is_a_file_is_one_line_exit_2(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    out = tmp_path / "taken"
    out.write_text("")
    argv = ["sweep", "--topology", "two-clouds", "--over", "inner_steps", "--values", "10"]
    assert main([*argv, "--formats", "png", "--out", str(out)]) == 2
    err = capsys.readouterr().err.strip()
    assert err.startswith("shardmeter: error: output: got ") and "\n" not in err
