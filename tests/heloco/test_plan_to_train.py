"""Time and cost to a target loss from simulated curves on a topology's predicted clock."""

from __future__ import annotations

import json
import math
from pathlib import Path
from typing import Any

import pytest

from heloco.config import load_config
from heloco.plan_to_train import (
    crossing,
    curve_from_events,
    load_curve,
    loss_within,
    outcome,
    plan_to_train,
    plot,
    result_json,
    write_result,
)
from heloco.sim import run_simulation
from heloco.topology import IslandPace, PaceMap, pace_map, write_pace_map
from shardmeter.errors import UserInputError
from shardmeter.quality import quality_factors
from shardmeter.specs.topology import topology_from_dict


def island(
    name: str, pace: float, gpus: int, price: float, tokens: float, egress: float
) -> IslandPace:
    return IslandPace(
        name=name,
        accelerator="x",
        n_gpus=gpus,
        inner_step_s=10.0 * pace,
        comm_s=0.0,
        pace=pace,
        comm_delay=0.0,
        tokens_per_step=tokens,
        price_per_gpu_hour=price,
        wan_bytes_per_round=1e9 if egress else 0.0,
        egress_usd_per_byte=egress,
    )


# 10 real seconds per simulated second; $36/h + $72/h = $0.03/s of rent; worker 1 pays $0.5
# egress per round; worker 0 trains 1000 real tokens per step, worker 1 500.
PM = PaceMap(
    topology="t",
    planned_model="m",
    n_params=1,
    bits=8,
    scale=10.0,
    islands=(island("a", 1.0, 8, 4.5, 1000.0, 0.0), island("b", 2.0, 8, 9.0, 500.0, 0.5e-9)),
)


def events() -> list[dict[str, Any]]:
    return [
        {"type": "eval", "time": 0.0, "tokens": 0, "loss": 5.0},
        {"type": "round", "worker": 0, "steps": 4, "time": 4.0},
        {"type": "eval", "time": 4.0, "tokens": 100, "loss": 4.0},
        {"type": "round", "worker": 0, "steps": 4, "time": 8.0},
        {"type": "round", "worker": 1, "steps": 4, "time": 8.0},
        {"type": "eval", "time": 8.0, "tokens": 300, "loss": 3.0},
    ]


def test_curve_points_on_the_predicted_clock_and_bill() -> None:
    curve = curve_from_events("heloco", Path("r"), events(), PM)
    assert [p.wall_s for p in curve.points] == [0.0, 40.0, 80.0]  # sim time × scale
    assert [p.real_tokens for p in curve.points] == [0.0, 4000.0, 4000.0 + 4000.0 + 2000.0]
    assert PM.usd_per_s == pytest.approx(0.03)
    assert [p.usd for p in curve.points] == pytest.approx([0.0, 1.2, 2.4 + 0.5])
    assert [p.sim_tokens for p in curve.points] == [0, 100, 300]


def test_target_crossing_is_interpolated() -> None:
    curve = curve_from_events("heloco", Path("r"), events(), PM)
    hit = crossing(curve, 3.5)
    assert hit is not None
    assert hit.wall_s == pytest.approx(60.0) and hit.real_tokens == pytest.approx(7000.0)
    assert hit.usd == pytest.approx((1.2 + 2.9) / 2)
    o = outcome(curve, 3.5)
    assert o.reached and o.hours == pytest.approx(60.0 / 3600)
    assert o.tokens_per_s == pytest.approx(7000.0 / 60.0)
    assert o.run_tokens_per_s == pytest.approx(10000.0 / 80.0)
    miss = outcome(curve, 2.0)
    assert not miss.reached and miss.wall_s == math.inf and miss.final_loss == 3.0


def test_loss_within_a_time_or_dollar_budget() -> None:
    curve = curve_from_events("heloco", Path("r"), events(), PM)
    assert loss_within(curve, wall_s=20.0) == pytest.approx(4.5)
    assert loss_within(curve, usd=2.05) == pytest.approx(3.5)
    assert loss_within(curve, wall_s=1000.0) is None  # the run stopped before
    with pytest.raises(UserInputError, match="exactly one"):
        loss_within(curve, wall_s=1.0, usd=1.0)


def test_cycle_loss_and_bad_runs(tmp_path: Path) -> None:
    evs = [dict(e, cycle_loss=e["loss"] + 1) if e["type"] == "eval" else e for e in events()]
    curve = curve_from_events("x", Path("r"), evs, PM, loss_key="cycle_loss")
    assert [p.loss for p in curve.points] == [6.0, 5.0, 4.0]
    with pytest.raises(UserInputError, match="pace map has 2"):
        curve_from_events("x", Path("r"), [{"type": "round", "worker": 5, "steps": 1, "time": 0.0},
                                          {"type": "eval", "time": 1.0, "tokens": 0, "loss": 1.0}],
                          PM)  # fmt: skip
    with pytest.raises(UserInputError, match=r"summary\.json"):
        load_curve(tmp_path, PM)
    with pytest.raises(UserInputError, match="at least one"):
        plan_to_train([])
    (tmp_path / "summary.json").write_text('{"method": "sync"}')
    (tmp_path / "events.jsonl").write_text('{"type": "eval"\n')
    with pytest.raises(UserInputError, match="one JSON object per line"):
        load_curve(tmp_path, PM)
    with pytest.raises(UserInputError, match=r"topology\.json"):
        load_curve(tmp_path)


def two_islands() -> dict[str, Any]:
    link = {"bandwidth_gbit": 10.0, "latency_ms": 40.0, "egress_usd_per_gb": 0.05}
    return {
        "name": "a-and-b",
        "run": {"model": "llama-3-8b", "mode": "async", "bits": 8, "global_batch": 64},
        "islands": [
            {"name": "A", "cluster": "dgx-h100", "n_nodes": 2},
            {"name": "B", "cluster": "dgx-h100", "n_nodes": 1},
        ],
        "wan": {"kind": "star", "hub": "A", "default": link},
    }


def simulate(method: str, pm: PaceMap, out: Path, rounds: int = 3, h: int = 2) -> Path:
    k = len(pm.islands)
    cfg = load_config(
        None,
        "default",
        {
            "method": method,
            "workers": k,
            "paces": pm.paces,
            "comm_delays": pm.comm_delays,
            "inner_steps": h,
            "token_budget": k * h * 256 * rounds,
            "eval_every": k * h * 256,
            "eval_windows": 4,
            "data.synthetic_chars_per_language": 20_000,
            "data.val_chars_per_language": 2_000,
            "out_dir": str(out),
        },
    )
    write_pace_map(pm, out)
    run_simulation(cfg)
    return out


@pytest.fixture(scope="module")
def runs(tmp_path_factory: pytest.TempPathFactory) -> tuple[PaceMap, Path]:
    pm = pace_map(topology_from_dict(two_islands()))
    root = tmp_path_factory.mktemp("p2t")
    for method in ("sync", "heloco"):
        simulate(method, pm, root / method)
    return pm, root


def test_simulated_sync_rounds_take_the_predicted_wall_clock(runs: tuple[PaceMap, Path]) -> None:
    pm, root = runs
    curve = load_curve(root / "sync")  # the pace map comes from the run's topology.json
    h = 2
    round_s = max(h * i.inner_step_s + i.comm_s for i in pm.islands)  # real seconds
    assert [p.wall_s for p in curve.points] == pytest.approx([k * round_s for k in range(4)])
    rent = round_s * sum(i.n_gpus * i.price_per_gpu_hour for i in pm.islands) / 3600
    egress = pm.islands[1].wan_bytes_per_round * pm.islands[1].egress_usd_per_byte
    assert curve.final.usd == pytest.approx(3 * (rent + egress))
    tokens_per_round = h * sum(i.tokens_per_step for i in pm.islands)
    assert curve.final.real_tokens == pytest.approx(3 * tokens_per_round)


def test_plan_to_train_end_to_end(runs: tuple[PaceMap, Path], tmp_path: Path) -> None:
    pm, root = runs
    result = plan_to_train([root / "sync", root / "heloco"])
    assert result.scale == pm.scale and result.topology == "a-and-b"
    assert {o.method for o in result.outcomes} == {"sync", "heloco"}
    assert all(o.reached for o in result.outcomes)  # default target: every run reaches it
    walls = [o.wall_s for o in result.outcomes]
    assert walls == sorted(walls)
    for o in result.outcomes:
        assert o.tokens_per_s == pytest.approx(o.real_tokens / o.wall_s)
    doc = json.loads(write_result(result, tmp_path).read_text())
    assert doc["target_loss"] == result.target_loss and len(doc["curves"]) == 2
    assert result_json(result)["outcomes"][0]["method"] == result.outcomes[0].method
    paths = plot(result, tmp_path)
    assert [p.suffix for p in paths] == [".png", ".svg"] and all(
        p.stat().st_size > 0 for p in paths
    )
    # the same folders give ShardMeter's quality factor without heloco
    q = quality_factors(root, result.target_loss)
    assert q.factor("sync") == 1.0 and q.factor("heloco") > 0
