"""Topology files: shipped examples load, WAN paths resolve, bad input names its field."""

from __future__ import annotations

import copy
from pathlib import Path
from typing import Any

import numpy as np
import pytest

from shardmeter.errors import UserInputError
from shardmeter.estimate.islands import predict_topology
from shardmeter.estimate.wan import stream_Bps, wan_paths
from shardmeter.specs.topology import (
    TOPOLOGY_DIR,
    load_topology,
    topology_from_dict,
)

SHIPPED = sorted(p.stem for p in TOPOLOGY_DIR.glob("*.toml"))

BASE: dict[str, Any] = {
    "name": "t",
    "run": {"model": "llama-3-8b", "global_batch": 64, "mode": "diloco"},
    "islands": [
        {"name": "us-east", "cluster": "dgx-h100", "n_nodes": 1},
        {"name": "eu-west", "cluster": "dgx-h100", "n_nodes": 1},
    ],
    "wan": {
        "links": [
            {"from": "us-east", "to": "eu-west", "bandwidth_gbit": 10, "latency_ms": 80},
        ]
    },
}


def with_change(path: str, value: Any) -> dict[str, Any]:
    data = copy.deepcopy(BASE)
    node: Any = data
    keys = path.split("/")
    for key in keys[:-1]:
        node = node[int(key)] if key.isdigit() else node[key]
    last = keys[-1]
    node[int(last) if last.isdigit() else last] = value
    return data


def test_shipped_topologies_include_the_documented_examples() -> None:
    assert {"two-clouds", "four-regions", "eight-heterogeneous", "intellect1"} <= set(SHIPPED)


@pytest.mark.parametrize("name", SHIPPED)
def test_shipped_examples_load_and_predict(name: str) -> None:
    topo = load_topology(name)
    est = predict_topology(topo)
    assert est.tokens_per_s > 0 and 0 < est.utilization <= 1
    assert len(est.islands) == len(topo.islands)


def test_heterogeneous_example_mixes_accelerators() -> None:
    est = predict_topology(load_topology("eight-heterogeneous"))
    kinds = {isl.accelerator for isl in est.islands}
    assert {"a100-80gb", "h100-sxm", "h200", "mi300x"} <= kinds
    assert len({isl.n_gpus for isl in est.islands}) >= 3


def test_star_routes_through_hub() -> None:
    topo = load_topology("eight-heterogeneous")
    wan = wan_paths(topo)
    names = list(wan.names)
    hub, ap, eu = (
        names.index("us-central"),
        names.index("ap-south-h200"),
        names.index("eu-west-h100"),
    )
    assert wan.center == hub
    # one TCP stream per spoke by default: Linux's window per 240 ms round trip, not 5 Gbit/s
    spoke = float(stream_Bps(5e9 / 8, 0.240))
    assert spoke < 5e9 / 8
    assert wan.bandwidth_Bps[ap, hub] == pytest.approx(spoke)
    assert wan.bandwidth_Bps[ap, eu] == pytest.approx(spoke)  # the slower spoke
    assert wan.rtt_s[ap, eu] == pytest.approx(0.240 + 0.110)
    assert np.allclose(wan.bandwidth_Bps, wan.bandwidth_Bps.T)


def test_mesh_default_fills_missing_pairs() -> None:
    data = with_change("wan/default", {"bandwidth_gbit": 1.0, "latency_ms": 10})
    data["islands"].append({"name": "ap", "cluster": "dgx-h100"})
    wan = wan_paths(topology_from_dict(data))
    assert wan.bandwidth_Bps[0, 2] == pytest.approx(1e9 / 8)  # 10 ms: the window holds 1 Gbit/s
    # 80 ms: one stream's default window caps the 10 Gbit/s link
    assert wan.bandwidth_Bps[0, 1] == pytest.approx(float(stream_Bps(10e9 / 8, 0.080)))


BAD: list[tuple[str, Any, str]] = [
    ("wan/links/0/to", "mars", "wan.links[0].to: got 'mars'; known islands: us-east, eu-west"),
    ("wan/links/0/bandwidth_gbit", -5, "wan.links[0].bandwidth_gbit: got -5"),
    ("islands/1/n_nodes", 0, "islands[1].n_nodes: got 0"),
    ("islands/0/gpus_per_node", 0, "islands[0].gpus_per_node: got 0"),
    ("islands/1/name", "us-east", "islands[1].name: got 'us-east'; island names must be unique"),
    ("run/mode", "telepathy", "run.mode: got 'telepathy'"),
    ("run/bits", 3, "run.bits: got 3"),
    ("wan/hub", "us-east", "wan.hub: got 'us-east'; only a star WAN has a hub"),
    ("run/server", "moon", "run.server: got 'moon'; known islands"),
    ("run/tokens", float("inf"), "run.tokens: got inf; Input should be a finite number"),
    ("run/quality_factor", float("inf"), "run.quality_factor: got inf"),
]


@pytest.mark.parametrize(("path", "value", "message"), BAD)
def test_bad_topology_is_one_line_naming_the_field(path: str, value: Any, message: str) -> None:
    with pytest.raises(UserInputError) as info:
        topology_from_dict(with_change(path, value))
    text = str(info.value)
    assert text.startswith(message), text
    assert "\n" not in text


def test_missing_link_is_reported() -> None:
    data = copy.deepcopy(BASE)
    data["islands"].append({"name": "ap", "cluster": "dgx-h100"})
    with pytest.raises(UserInputError, match=r"^wan\.links: got 'us-east-ap'"):
        wan_paths(topology_from_dict(data))


def test_plan_that_does_not_match_gpu_count() -> None:
    data = with_change("islands/0/plan", {"dp": 4, "global_batch": 64, "sharding": "zero3"})
    with pytest.raises(
        UserInputError, match=r"^islands\[0\]\.plan: got .*must equal the GPU count 8"
    ):
        predict_topology(topology_from_dict(data))


def test_plan_that_does_not_fit_memory() -> None:
    data = with_change("islands/1/plan", {"dp": 8, "global_batch": 64, "micro_batch": 8})
    with pytest.raises(UserInputError, match=r"^islands\[1\]\.plan: got 'out of memory'"):
        predict_topology(topology_from_dict(data))


def test_auto_plan_that_cannot_fit() -> None:
    data = with_change("run/model", "llama-3-70b")
    with pytest.raises(UserInputError, match=r"^islands\[0\]\.plan: got 'auto'; no FSDP/HSDP"):
        predict_topology(topology_from_dict(data))


def test_cross_field_island_error_names_the_field_not_the_table() -> None:
    data = with_change("islands/0/nvlink_domain", 3)
    message = "islands[0].nvlink_domain: got 3; a divisor or multiple of gpus_per_node (8)"
    with pytest.raises(UserInputError) as err:
        predict_topology(topology_from_dict(data))
    assert str(err.value) == message


def test_streaming_schedule_need_not_divide_h_but_tau_fits_a_round() -> None:
    data = with_change("run/mode", "streaming")
    data["run"].update(inner_steps=100, fragments=8, overlap_steps=100)
    assert topology_from_dict(data).run.n_fragments == 8
    data["run"].update(overlap_steps=101)
    with pytest.raises(UserInputError, match=r"^run\.overlap_steps: got 101; must be ≤ inner"):
        topology_from_dict(data)


def test_unknown_topology_lists_examples() -> None:
    with pytest.raises(UserInputError, match=r"shipped examples: .*two-clouds"):
        load_topology("atlantis")


def test_directory_or_binary_topology_is_a_user_input_error(tmp_path: Path) -> None:
    with pytest.raises(UserInputError, match=r"^topology: got .*; not a file"):
        load_topology(tmp_path)
    binary = tmp_path / "t.toml"
    binary.write_bytes(b"\xff\xfe\x00name")
    with pytest.raises(UserInputError, match=r"^topology: got .*; is not valid TOML"):
        load_topology(binary)


@pytest.mark.parametrize(
    ("path", "value", "message"),
    [
        ("islands/0/cluster", "dgx-h900", "islands[0].cluster: got 'dgx-h900'; unknown cluster"),
        ("run/model", "gpt-99", "run.model: got 'gpt-99'; unknown model"),
    ],
)
def test_unknown_presets_name_the_topology_field(path: str, value: Any, message: str) -> None:
    with pytest.raises(UserInputError) as info:
        predict_topology(topology_from_dict(with_change(path, value)))
    assert str(info.value).startswith(message)


def test_inline_accelerator_island_and_bad_inline_table() -> None:
    inline = {
        "name": "lab",
        "accelerator": {
            "name": "my-gpu",
            "peak_tflops": {"bf16": 500.0},
            "hbm_gb": 96,
            "hbm_gbps": 2000,
        },
        "gpus_per_node": 8,
        "intra": {"bandwidth_gbps": 200.0},
    }
    data = copy.deepcopy(BASE)
    data["islands"][1] = inline
    data["wan"]["links"][0]["to"] = "lab"
    est = predict_topology(topology_from_dict(data))
    assert [i.accelerator for i in est.islands] == ["h100-sxm", "my-gpu"]
    assert est.islands[1].step.step_time_s > est.islands[0].step.step_time_s  # half the peak
    inline["accelerator"]["hbm_gb"] = -1
    with pytest.raises(UserInputError, match=r"^islands\[1\]\.accelerator\.hbm_gb: got -1"):
        predict_topology(topology_from_dict(data))


def test_single_island_has_no_wan() -> None:
    data = copy.deepcopy(BASE)
    data["islands"] = data["islands"][:1]
    data["wan"] = {}
    est = predict_topology(topology_from_dict(data))
    assert est.utilization == pytest.approx(1.0, abs=1e-3)
    assert est.wan_bytes_total == 0 and est.min_wan_gbit is None
    assert est.bottleneck.link == "none (one island)"


def test_hub_reduce_and_async_server_follow_run_server() -> None:
    data = copy.deepcopy(BASE)
    data["islands"].append({"name": "ap", "cluster": "dgx-h100"})
    data["wan"]["default"] = {"bandwidth_gbit": 1.0, "latency_ms": 150}
    data["run"].update(server="eu-west", reduce="hub")
    topo = topology_from_dict(data)
    assert wan_paths(topo).center == 1
    hub = predict_topology(topo)
    assert hub.islands[1].wan_bytes_per_round == 0  # the hub moves nothing on its own behalf
    assert hub.bottleneck.link == "ap↔eu-west"  # its 1 Gbit/s spoke is slower than us-east's 10
    asyn = predict_topology(topo, mode="async")
    assert asyn.islands[1].wan_exposed_s == 0 and asyn.islands[1].staleness > 0


def matrix_topology(bw: list[list[float]]) -> dict[str, Any]:
    data = copy.deepcopy(BASE)
    data["islands"].append({"name": "ap", "cluster": "dgx-h100"})
    rtt = [[0.0 if i == j else 100.0 for j in range(3)] for i in range(3)]
    data["wan"] = {"kind": "matrix", "matrix": {"bandwidth_gbit": bw, "latency_ms": rtt}}
    return data


def test_matrix_wan_equals_the_same_links_listed() -> None:
    bw = [[0, 10, 5], [10, 0, 20], [5, 20, 0]]
    from_matrix = wan_paths(topology_from_dict(matrix_topology(bw)))
    listed = copy.deepcopy(BASE)
    listed["islands"].append({"name": "ap", "cluster": "dgx-h100"})
    pairs = [("us-east", "eu-west", 10), ("us-east", "ap", 5), ("eu-west", "ap", 20)]
    listed["wan"] = {
        "links": [{"from": a, "to": b, "bandwidth_gbit": g, "latency_ms": 100} for a, b, g in pairs]
    }
    from_links = wan_paths(topology_from_dict(listed))
    np.testing.assert_allclose(from_matrix.bandwidth_Bps, from_links.bandwidth_Bps)
    np.testing.assert_allclose(from_matrix.rtt_s, from_links.rtt_s)
    assert topology_from_dict(matrix_topology(bw)).wan.kind == "matrix"


@pytest.mark.parametrize(
    ("bw", "message"),
    [
        (
            [[0, 10, 5], [10, 0, -3], [5, 20, 0]],
            "wan.matrix.bandwidth_gbit[1][2]: got -3.0; must be > 0",
        ),
        ([[0, 10], [10, 0]], "wan.matrix.bandwidth_gbit: got '2 rows of [2]'; must be 3 × 3"),
    ],
)
def test_bad_matrix_names_the_entry(bw: list[list[float]], message: str) -> None:
    with pytest.raises(UserInputError) as info:
        topology_from_dict(matrix_topology(bw))
    assert str(info.value).startswith(message)
