"""A misspelt key gets "did you mean", in both commands and every input form.

Flags that take KEY=VALUE lists (`--failures`, `--bucket`, `--payload`), the files the flags
read (topology, plan, model; heloco configs) and `--set` keys, including keys of a table
chosen by its shape (heloco's `model`). Before, the flag forms and heloco's model table said
only "Extra inputs are not permitted" (or, for `--bucket`, that the right key was missing).
"""

from __future__ import annotations

from collections.abc import Callable
from pathlib import Path

import pytest

from heloco.cli import main as heloco_main
from shardmeter.cli import main as shardmeter_main

TOPOLOGY = Path(__file__).resolve().parents[1] / "src/shardmeter/data/topologies/two-clouds.toml"


FLAGS = [
    (
        ["--failures", "gpu_mtbf_hour=5"],
        "run.failures.gpu_mtbf_hour",
        "run.failures.gpu_mtbf_hours",
    ),
    (["--bucket", "bandwith_gbit=5"], "wan.bucket.bandwith_gbit", "wan.bucket.bandwidth_gbit"),
    (["--payload", "topk:fracton=0.1"], "run.payload.fracton", "run.payload.fraction"),
]


@pytest.mark.parametrize("command", ["predict", "sweep"])
@pytest.mark.parametrize(("flag", "typo", "meant"), FLAGS, ids=[f[0][0] for f in FLAGS])
def test_shardmeter_flag_keys(
    command: str, flag: list[str], typo: str, meant: str, cli_error: Callable[..., str]
) -> None:
    argv = [command, "--topology", "two-clouds", *flag]
    err = cli_error(shardmeter_main, [*argv, "--no-plots"] if command == "sweep" else argv)
    assert f"{typo}: " in err and "unknown key" in err and meant in err, err


def test_plan_payload_key(cli_error: Callable[..., str]) -> None:
    argv = ["plan", "--topology", "two-clouds", "--payload", "topk:fracton=0.1", "--no-progress"]
    assert "did you mean run.payload.fraction?" in cli_error(shardmeter_main, argv)


@pytest.mark.parametrize(
    ("edit", "meant"),
    [
        (("mode = ", "mdoe = "), "run.mode"),
        (("n_nodes = 4\nprice", "n_node = 4\nprice"), "islands[0].n_nodes"),
        (("latency_ms", "latency"), "wan.links[0].latency_ms"),
        (('kind = "mesh"', 'knid = "mesh"'), "wan.kind"),
        (("bits = 8 ", 'failures = "gpu_mtbf_hour=5"\nbits = 8 '), "run.failures.gpu_mtbf_hours"),
    ],
)
def test_topology_file_keys(
    edit: tuple[str, str], meant: str, tmp_path: Path, cli_error: Callable[..., str]
) -> None:
    text = TOPOLOGY.read_text(encoding="utf-8")
    assert edit[0] in text
    path = tmp_path / "topo.toml"
    path.write_text(text.replace(edit[0], edit[1], 1), encoding="utf-8")
    err = cli_error(shardmeter_main, ["predict", "--topology", str(path)])
    assert "did you mean" in err and meant in err, err


@pytest.mark.parametrize(
    ("flag", "text", "meant"),
    [
        ("--plan", 'tp = 2\nshardng = "zero1"\n', "sharding"),
        ("--model", 'name = "x"\nn_layrs = 2\n', "n_layers"),
    ],
)
def test_shardmeter_spec_file_keys(
    flag: str, text: str, meant: str, tmp_path: Path, cli_error: Callable[..., str]
) -> None:
    path = tmp_path / "spec.toml"
    path.write_text(text, encoding="utf-8")
    err = cli_error(shardmeter_main, ["predict", flag, str(path)])
    assert "did you mean" in err and meant in err, err


@pytest.mark.parametrize(
    ("assignment", "typo", "meant"),
    [
        ("outer.lrr=1", "outer.lrr", "outer.lr"),
        ("inner.bacth_size=2", "inner.bacth_size", "inner.batch_size"),
        ("model.n_layr=2", "model.n_layr", "model.n_layer"),  # a table chosen by its shape
        ("data.sourcs=[]", "data.sourcs", "data.sources"),
        ("momentun=0.5", "momentun", "outer.momentum"),
    ],
)
def test_heloco_set_keys(
    assignment: str, typo: str, meant: str, cli_error: Callable[..., str]
) -> None:
    argv = ["simulate", "--set", assignment, "--print-config"]
    err = cli_error(heloco_main, argv)
    # the suggestion is itself a key --set takes (no internal prefix)
    assert err.startswith(f"heloco: error: {typo}: ") and "did you mean" in err, err
    assert f" {meant}" in err.split("did you mean", 1)[1], err


def test_heloco_config_file_keys(tmp_path: Path, cli_error: Callable[..., str]) -> None:
    path = tmp_path / "run.toml"
    path.write_text("[outer]\nmomentun = 0.5\n[model]\nvocab_size = 64\nn_layr = 2\n")
    err = cli_error(heloco_main, ["simulate", "--config", str(path), "--print-config"])
    assert "outer.momentun" in err and "did you mean outer.momentum" in err, err
