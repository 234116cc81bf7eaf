"""Topology -> simulated paces: ratios of predicted step times, comm delays, CLI helpers."""

from __future__ import annotations

import argparse
from pathlib import Path
from typing import Any

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from heloco.config import load_config
from heloco.topology import (
    PACE_FILE,
    add_arguments,
    apply,
    pace_map,
    paces_from_times,
    read_pace_map,
    record,
    write_pace_map,
)
from shardmeter.errors import UserInputError
from shardmeter.estimate.islands import predict_topology
from shardmeter.estimate.wan import DEFAULT_WINDOW_BYTES, slow_start_s
from shardmeter.specs.topology import topology_from_dict


def two_islands(**wan: Any) -> dict[str, Any]:
    """Hub A (two DGX H100 nodes) and spoke B (one node, same batch: about half as fast)."""
    link = {"bandwidth_gbit": 10.0, "latency_ms": 40.0, "egress_usd_per_gb": 0.05, **wan}
    return {
        "name": "a-and-b",
        "run": {"model": "llama-3-8b", "mode": "async", "bits": 8, "global_batch": 64},
        "islands": [
            {"name": "A", "cluster": "dgx-h100", "n_nodes": 2},
            {"name": "B", "cluster": "dgx-h100", "n_nodes": 1},
        ],
        "wan": {"kind": "star", "hub": "A", "default": link},
    }


def test_island_twice_as_fast_gives_pace_ratio_one_to_two() -> None:
    scale, paces, delays = paces_from_times([3.0, 6.0], [0.0, 1.5])
    assert scale == 3.0
    assert paces == [1.0, 2.0]
    assert delays == [0.0, 0.5]


@settings(max_examples=60, deadline=None)
@given(st.lists(st.tuples(st.floats(1e-3, 1e3), st.floats(0.0, 1e3)), min_size=1, max_size=12))
def test_paces_preserve_ratios_and_scale_back_to_real_time(
    times: list[tuple[float, float]],
) -> None:
    inner = [t for t, _ in times]
    comm = [c for _, c in times]
    scale, paces, delays = paces_from_times(inner, comm)
    assert min(paces) == pytest.approx(1.0)
    assert scale == min(inner)
    for t, c, p, d in zip(inner, comm, paces, delays, strict=True):
        assert p * scale == pytest.approx(t, rel=1e-12)
        assert d * scale == pytest.approx(c, rel=1e-12, abs=1e-12)
    for i in range(len(inner)):
        for j in range(len(inner)):
            assert paces[i] / paces[j] == pytest.approx(inner[i] / inner[j], rel=1e-12)


def test_bad_times_are_one_line_errors() -> None:
    with pytest.raises(UserInputError, match="finite step times"):
        paces_from_times([1.0, 0.0], [0.0, 0.0])
    with pytest.raises(UserInputError, match="comm times"):
        paces_from_times([1.0], [-1.0])
    with pytest.raises(UserInputError, match="one step time"):
        paces_from_times([1.0, 2.0], [0.0])


def test_paces_follow_shardmeter_step_times() -> None:
    topo = topology_from_dict(two_islands())
    pm = pace_map(topo)
    est = predict_topology(topo)
    t_a, t_b = (isl.step.step_time_s for isl in est.islands)
    assert [i.inner_step_s for i in pm.islands] == pytest.approx([t_a, t_b])
    assert pm.scale == pytest.approx(min(t_a, t_b))
    assert pm.islands[1].pace / pm.islands[0].pace == pytest.approx(t_b / t_a)
    assert 1.6 < t_b / t_a < 2.4  # half the GPUs for the same batch: about twice as slow
    assert pm.paces[0] == 1.0


def test_comm_delay_is_the_push_pull_time_over_the_spoke() -> None:
    pm = pace_map(topology_from_dict(two_islands()))
    hub, spoke = pm.islands
    assert hub.comm_s == 0.0 and hub.comm_delay == 0.0 and hub.wan_bytes_per_round == 0.0
    nbytes = pm.n_params * 8 / 8  # 8-bit pseudo-gradient
    pull = pm.n_params * 4  # θ comes back in fp32 (the runtime's dispatch)
    # HeLoCo's exchange: a push and a pull, each RTT + its bytes from TCP's initial window, at
    # one stream's rate: Linux's default window per 40 ms round trip, below the 10 Gbit/s link
    rate = min(10e9 / 8, DEFAULT_WINDOW_BYTES / 0.040)
    assert rate < 10e9 / 8
    push_s, pull_s = (float(slow_start_s(m, rate, 0.040)) for m in (nbytes, pull))
    assert spoke.comm_s == pytest.approx(2 * 0.040 + push_s + pull_s)
    assert spoke.comm_delay == pytest.approx(spoke.comm_s / pm.scale)
    assert spoke.wan_bytes_per_round == pytest.approx(nbytes + pull)  # push + pull
    assert pm.egress_usd_per_round[1] == pytest.approx((nbytes + pull) * 0.05 / 1e9)
    slower = pace_map(topology_from_dict(two_islands(bandwidth_gbit=0.2)))  # below the window
    assert slower.islands[1].comm_s > spoke.comm_s
    assert pace_map(topology_from_dict(two_islands()), bits=16).islands[1].comm_s > spoke.comm_s


def test_eight_island_topology_paces() -> None:
    pm = pace_map("eight-heterogeneous")
    assert len(pm.islands) == 8 and min(pm.paces) == 1.0
    by_name = {i.name: i for i in pm.islands}
    assert by_name["us-central"].comm_delay == 0.0  # the hub
    assert by_name["us-east-a100"].pace > 2.0 * by_name["eu-north-h200"].pace
    assert by_name["ap-south-h200"].comm_s > by_name["eu-north-h200"].comm_s  # 5 vs 10 Gbit/s
    assert pm.usd_per_s == pytest.approx(
        sum(i.n_gpus * i.price_per_gpu_hour for i in pm.islands) / 3600
    )


def test_pace_map_round_trips_through_the_run_folder(tmp_path: Path) -> None:
    pm = pace_map(topology_from_dict(two_islands()))
    path = write_pace_map(pm, tmp_path / "run")
    assert path.name == PACE_FILE
    assert read_pace_map(tmp_path / "run") == pm
    assert read_pace_map(tmp_path) is None
    (tmp_path / "bad").mkdir()
    (tmp_path / "bad" / PACE_FILE).write_text('{"islands": []}')
    with pytest.raises(UserInputError, match="pace map"):
        read_pace_map(tmp_path / "bad")


def parse(argv: list[str]) -> argparse.Namespace:
    parser = argparse.ArgumentParser()
    parser.add_argument("--model")  # the simulate CLI's small-model flag stays separate
    add_arguments(parser)
    return parser.parse_args(argv)


def test_apply_sets_workers_paces_and_delays(tmp_path: Path) -> None:
    args = parse(["--topology", "eight-heterogeneous", "--model", "tiny"])
    overrides = apply(args, {"method": "sync", "token_budget": 1000})
    cfg = load_config(None, "default", overrides)
    pm = args.pace_map
    assert cfg.workers == 8 and cfg.paces == pm.paces and cfg.comm_delays == pm.comm_delays
    assert cfg.model == "tiny" and cfg.method == "sync"
    record(args, tmp_path)
    assert read_pace_map(tmp_path) == pm


def test_apply_without_topology_and_conflicts() -> None:
    assert apply(parse([]), {"workers": 3}) == {"workers": 3}
    with pytest.raises(UserInputError, match="needs --topology"):
        apply(parse(["--planned-model", "llama-2-13b"]), {})
    args = parse(["--topology", "eight-heterogeneous"])
    with pytest.raises(UserInputError, match="not with --topology"):
        apply(args, {"paces": [1.0] * 8})
    with pytest.raises(UserInputError, match="one per island"):
        apply(args, {"workers": 5})
    big = parse(["--topology", "eight-heterogeneous", "--planned-model", "llama-2-13b"])
    apply(big, {})
    assert big.pace_map.planned_model == "llama-2-13b"
    assert big.pace_map.n_params > 1.2e10  # predicted for the 13B model, not the file's 8B


def test_cli_simulate_takes_paces_from_a_topology(tmp_path: Path) -> None:
    from heloco.cli import main
    from heloco.topology import pace_map, read_pace_map

    out = tmp_path / "run"
    argv = ["simulate", "--topology", "two-clouds", "--token-budget", "2048", "--eval-every",
            "1024", "--out", str(out), "--quiet", "--json"]  # fmt: skip
    assert main(argv) == 0
    recorded = read_pace_map(out)
    assert recorded is not None and recorded.paces == pace_map("two-clouds").paces
    assert main([*argv[:3], "--paces", "1,2", *argv[3:]]) == 2  # --topology sets the paces
