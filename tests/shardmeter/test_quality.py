"""Quality factor from HeLoCo run folders, and ranking plans by time to the target loss."""

from __future__ import annotations

import argparse
import json
import math
import subprocess
import sys
from pathlib import Path
from typing import Any

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from shardmeter.cli.quality import add_arguments, apply, rank_from_args
from shardmeter.errors import UserInputError
from shardmeter.estimate.islands import predict_topology
from shardmeter.quality import (
    MethodQuality,
    QualityFactors,
    find_runs,
    quality_factors,
    rank_by_time_to_target,
    ranked_json,
    tokens_to_loss,
)
from shardmeter.search import OuterOptions, plan
from shardmeter.search.result import Candidate, OuterChoice
from shardmeter.search.to_target import plan_to_target
from shardmeter.specs.topology import load_topology


def write_run(folder: Path, method: str, curve: list[tuple[int, float]]) -> Path:
    """A minimal HeLoCo run folder: summary.json and eval (plus one round) events."""
    folder.mkdir(parents=True)
    (folder / "summary.json").write_text(json.dumps({"method": method, "final_loss": curve[-1][1]}))
    lines = [{"type": "round", "worker": 0, "steps": 1, "tokens": 1, "time": 0.5}]
    for t, (tokens, loss) in enumerate(curve):
        lines.append({"type": "eval", "tokens": tokens, "time": float(t), "loss": loss,
                      "cycle_loss": loss + 0.1})  # fmt: skip
    (folder / "events.jsonl").write_text("\n".join(json.dumps(x) for x in lines) + "\n")
    return folder


@pytest.fixture
def runs(tmp_path: Path) -> Path:
    # sync reaches 3.0 at 200 tokens; heloco at 300 (q 1.5); async-nesterov at 400 (q 2)
    write_run(tmp_path / "a_sync", "sync", [(0, 5.0), (100, 4.0), (200, 3.0), (300, 2.5)])
    write_run(tmp_path / "b_heloco", "heloco", [(0, 5.0), (200, 3.5), (400, 2.5)])
    write_run(tmp_path / "c_nest", "async-nesterov", [(0, 5.0), (200, 4.0), (400, 3.0)])
    return tmp_path


def test_tokens_to_loss_interpolates_the_first_crossing() -> None:
    assert tokens_to_loss([0, 100, 200], [5.0, 4.0, 3.0], 3.5) == pytest.approx(150.0)
    assert tokens_to_loss([0, 100, 200, 300], [5.0, 2.0, 6.0, 1.0], 3.0) == pytest.approx(200 / 3)
    assert tokens_to_loss([0, 100], [5.0, 4.0], 3.0) == math.inf
    assert tokens_to_loss([0, 100], [2.0, 1.0], 3.0) == 0.0


def test_quality_factor_is_tokens_relative_to_sync(runs: Path) -> None:
    q = quality_factors(runs, target_loss=3.0)
    assert q.reference == "sync" and q.target_loss == 3.0
    assert q.factor("sync") == pytest.approx(1.0)
    assert q.factor("heloco") == pytest.approx(300 / 200)  # 3.5@200 -> 2.5@400 crosses 3 at 300
    assert q.factor("async-nesterov") == pytest.approx(2.0)
    assert q.for_mode("async") == pytest.approx(1.5)  # HeLoCo stands for async by default
    assert q.for_mode("async", "async-nesterov") == pytest.approx(2.0)
    assert q.for_mode("diloco", "async-nesterov") == 1.0
    assert q.for_mode("diloco") == q.for_mode("sync") == q.for_mode("single") == 1.0


def test_default_target_is_the_lowest_loss_every_run_reaches(runs: Path) -> None:
    q = quality_factors(runs)
    assert q.target_loss == pytest.approx(3.0)  # async-nesterov's best
    assert all(math.isfinite(m.tokens_to_target) for m in q.methods)


def test_cycle_loss_and_unreached_targets(runs: Path) -> None:
    q = quality_factors(runs, target_loss=2.5)
    assert q.factor("async-nesterov") == math.inf
    assert quality_factors(runs, 3.1, loss_key="cycle_loss").factor("sync") == 1.0
    with pytest.raises(UserInputError, match="never reaches"):
        quality_factors(runs, target_loss=2.0)
    with pytest.raises(UserInputError, match="starts below"):
        quality_factors(runs, target_loss=6.0)


def test_seeds_of_one_method_are_averaged(tmp_path: Path) -> None:
    write_run(tmp_path / "s", "sync", [(0, 5.0), (100, 3.0)])
    write_run(tmp_path / "h1", "heloco", [(0, 5.0), (100, 3.0)])
    write_run(tmp_path / "h2", "heloco", [(0, 5.0), (300, 3.0)])
    q = quality_factors(tmp_path, target_loss=3.0)
    assert q.factor("heloco") == pytest.approx(2.0)
    assert [m.runs for m in q.methods if m.method == "heloco"] == [2]


def test_errors_are_one_line(tmp_path: Path, runs: Path) -> None:
    with pytest.raises(UserInputError, match="folder of HeLoCo runs"):
        quality_factors(tmp_path / "missing")
    (tmp_path / "empty").mkdir()
    with pytest.raises(UserInputError, match=r"summary\.json"):
        quality_factors(tmp_path / "empty")
    with pytest.raises(UserInputError, match="needs a 'sync' run"):
        quality_factors(runs / "b_heloco")
    with pytest.raises(UserInputError, match="runs here"):
        quality_factors(runs).factor("mla")
    assert len(find_runs(runs / "a_sync")) == 1  # a single run folder is accepted


@pytest.mark.slow
def test_shardmeter_quality_imports_neither_heloco_nor_torch() -> None:
    code = (
        "import sys, shardmeter.quality; "
        "bad = [m for m in sys.modules if m.split('.')[0] in ('heloco', 'torch')]; "
        "sys.exit(1 if bad else 0)"
    )
    assert subprocess.run([sys.executable, "-c", code], check=False).returncode == 0


def candidate(mode: str, tokens_per_s: float, tokens: float = 1e12) -> Candidate:
    wall = tokens / tokens_per_s
    return Candidate(
        islands=(),
        outer=OuterChoice(mode=mode, inner_steps=100, bits=8, fragments=1, overlap_steps=0),
        n_gpus=64,
        tokens_per_s=tokens_per_s,
        wall_s=wall,
        cost_usd=wall / 3600 * 64 * 2.0,
        usd_per_mtok=wall / 3600 * 64 * 2.0 / (tokens / 1e6),
        mfu=0.4,
        utilization=0.9,
        meets=True,
    )


def factors(q_async: float) -> QualityFactors:
    rows = (MethodQuality("heloco", 1, q_async * 100, q_async), MethodQuality("sync", 1, 100, 1.0))
    return QualityFactors(Path("runs"), "sync", 3.0, "loss", rows)


def test_quality_factor_changes_the_ranking() -> None:
    a = candidate("async", 1.3e6)  # faster in tokens/s ...
    b = candidate("diloco", 1.0e6)
    by_throughput = sorted([b, a], key=lambda c: c.wall_s)
    assert by_throughput[0] is a
    ranked = rank_by_time_to_target([a, b], factors(1.5))  # ... but needs 1.5x the tokens
    assert [r.candidate for r in ranked] == [b, a]
    assert ranked[1].time_to_target_s == pytest.approx(1.5 * a.wall_s)
    assert ranked[1].cost_to_target_usd == pytest.approx(1.5 * a.cost_usd)
    assert [r.method for r in ranked] == ["sync", "heloco"]
    # with q = 1.2 the faster plan still wins: 1.2 / 1.3 < 1
    assert rank_by_time_to_target([a, b], factors(1.2))[0].candidate is a


PLAN_KW: dict[str, Any] = {
    "topology": "eight-heterogeneous",
    "outer": OuterOptions(modes=("diloco", "async"), inner_steps=(20,)),
}


@pytest.fixture(scope="module")
def best_per_mode() -> dict[str, Candidate]:
    return {
        mode: plan(
            topology="eight-heterogeneous",
            outer=OuterOptions(modes=(mode,), inner_steps=(20,)),
            top_k=1,
        ).ranked[0]
        for mode in ("diloco", "async")
    }


def flip_and_keep(best: dict[str, Candidate]) -> tuple[Candidate, Candidate, float, float]:
    """(faster, slower, q that flips their order, q that keeps it) for HeLoCo standing for
    async: penalise the faster plan's mode just enough, then not quite enough."""
    fast, slow = sorted(best.values(), key=lambda c: c.wall_s)
    ratio = slow.wall_s / fast.wall_s
    if slow.outer is not None and slow.outer.mode == "async":
        return fast, slow, 0.9 / ratio, 1.1 / ratio
    return fast, slow, 1.1 * ratio, 0.9 * ratio


@pytest.mark.slow
def test_planner_plans_reranked_by_time_to_target(best_per_mode: dict[str, Candidate]) -> None:
    fast, slow, flip, keep = flip_and_keep(best_per_mode)
    assert rank_by_time_to_target([fast, slow], factors(flip))[0].candidate is slow
    assert rank_by_time_to_target([fast, slow], factors(keep))[0].candidate is fast


@pytest.mark.slow
def test_plan_to_target_searches_every_mode(best_per_mode: dict[str, Candidate]) -> None:
    fast, slow, flip, keep = flip_and_keep(best_per_mode)
    assert plan(top_k=1, **PLAN_KW).ranked[0].outer == fast.outer  # by tokens/s
    top = plan_to_target(factors(flip), top_k=3, **PLAN_KW)
    assert top[0].candidate.outer == slow.outer  # by time to the target loss
    assert top[0].time_to_target_s == pytest.approx(top[0].quality_factor * slow.wall_s)
    times = [r.time_to_target_s for r in top]
    assert times == sorted(times) and len(top) == 3
    assert plan_to_target(factors(keep), top_k=1, **PLAN_KW)[0].candidate.outer == fast.outer
    one = plan_to_target(factors(1.5), top_k=2, model="llama-3-8b", cluster="dgx-h100", gpus=8)
    assert [r.mode for r in one] == ["single", "single"] and one[0].quality_factor == 1.0


def parse(argv: list[str]) -> argparse.Namespace:
    parser = argparse.ArgumentParser()
    parser.add_argument("--topology")
    parser.add_argument("--mode")
    parser.add_argument("--quality-factor", type=float)
    add_arguments(parser)
    return parser.parse_args(argv)


def test_apply_sets_the_predict_quality_factor(runs: Path) -> None:
    args = parse(["--topology", "eight-heterogeneous", "--quality-from", str(runs),
                  "--target-loss", "3.0"])  # fmt: skip
    assert apply(args) is not None
    assert args.quality_factor == pytest.approx(1.5)  # the file's mode is async -> heloco
    topo = load_topology("eight-heterogeneous")
    est = predict_topology(topo, quality_factor=args.quality_factor)
    assert est.wall_s_adjusted == pytest.approx(1.5 * est.wall_s)
    args = parse(["--topology", "eight-heterogeneous", "--mode", "diloco",
                  "--quality-from", str(runs), "--target-loss", "3.0"])  # fmt: skip
    apply(args)
    assert args.quality_factor == 1.0
    args = parse(["--quality-from", str(runs), "--target-loss", "3.0",
                  "--mode", "async", "--quality-method", "async-nesterov"])  # fmt: skip
    apply(args)
    assert args.quality_factor == pytest.approx(2.0)
    args = parse(["--quality-from", str(runs), "--target-loss", "3.0",
                  "--mode", "diloco", "--quality-method", "async-nesterov"])  # fmt: skip
    apply(args)
    assert args.quality_factor == 1.0  # the method stands for async plans only


def test_apply_without_the_flag_and_conflicts(runs: Path) -> None:
    args = parse(["--topology", "eight-heterogeneous"])
    assert apply(args) is None and args.quality_factor is None
    with pytest.raises(UserInputError, match="needs --quality-from"):
        apply(parse(["--quality-method", "heloco"]))
    with pytest.raises(UserInputError, match="not with --quality-from"):
        apply(parse(["--quality-from", str(runs), "--quality-factor", "1.2"]))
    with pytest.raises(UserInputError, match="never reaches"):
        apply(parse(["--quality-from", str(runs), "--target-loss", "2.5", "--mode", "async",
                     "--quality-method", "async-nesterov"]))  # fmt: skip


@pytest.mark.slow
def test_rank_from_args_and_json(runs: Path) -> None:
    args = parse(["--quality-from", str(runs), "--target-loss", "3.0"])
    ranked = rank_from_args(args, top_k=2, **PLAN_KW)
    assert len(ranked) == 2 and args.quality.factor("heloco") == pytest.approx(1.5)
    doc = ranked_json(ranked, args.quality)
    assert [r["rank"] for r in doc["ranked"]] == [1, 2]
    assert doc["ranked"][0]["time_to_target_s"] <= doc["ranked"][1]["time_to_target_s"]
    assert len(doc["ranked"][0]["islands"]) >= 1
    assert {m["method"] for m in doc["methods"]} == {"sync", "heloco", "async-nesterov"}
    json.dumps(doc, allow_nan=False)
    assert rank_from_args(parse([]), **PLAN_KW) == []


def decreasing_curve(drops: list[float]) -> list[tuple[int, float]]:
    losses = [6.0]
    for d in drops:
        losses.append(losses[-1] - d)
    return [(100 * k, loss) for k, loss in enumerate(losses)]


@settings(
    max_examples=25, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture]
)
@given(
    st.lists(st.floats(0.01, 0.5), min_size=2, max_size=8),
    st.lists(st.floats(0.01, 0.5), min_size=2, max_size=8),
    st.integers(2, 5),
)
def test_default_target_is_reached_and_q_scales_with_tokens(
    tmp_path_factory: pytest.TempPathFactory, sync: list[float], other: list[float], c: int
) -> None:
    root = tmp_path_factory.mktemp("q")
    curve = decreasing_curve(other)
    write_run(root / "s", "sync", decreasing_curve(sync))
    write_run(root / "h", "heloco", curve)
    write_run(root / "n", "async-nesterov", [(t * c, loss) for t, loss in curve])
    q = quality_factors(root)
    assert q.factor("sync") == 1.0
    assert all(math.isfinite(m.factor) for m in q.methods)
    # the same curve stretched c times along tokens needs c times the tokens
    assert q.factor("async-nesterov") == pytest.approx(c * q.factor("heloco"))


@pytest.mark.slow
def test_cli_predict_and_plan_take_quality_from(
    runs: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    from shardmeter.cli import main

    flags = ["--quality-from", str(runs), "--target-loss", "3.0", "--json"]
    assert main(["predict", "--topology", "eight-heterogeneous", *flags]) == 0
    assert json.loads(capsys.readouterr().out)["quality_factor"] == pytest.approx(1.5)
    assert main(["plan", "--topology", "two-clouds", "--top", "3", "--no-progress", *flags]) == 0
    doc = json.loads(capsys.readouterr().out)
    times = [r["time_to_target_s"] for r in doc["quality"]["ranked"]]
    assert times == sorted(times) and len(times) >= 1


def _with_payload(folder: Path, payload: str) -> Path:
    summary = json.loads((folder / "summary.json").read_text())
    (folder / "summary.json").write_text(json.dumps(summary | {"payload": payload}))
    return folder


def test_a_compressed_payload_is_its_own_method_and_ranks_its_plans(tmp_path: Path) -> None:
    """Sync runs with top-1% need 1.5× the dense sync run's tokens: a plan sending top-1% takes
    q = 1.5 in every synchronous mode; a dense plan keeps q = 1; a payload without runs is an
    error naming the ones there are."""
    write_run(tmp_path / "a", "sync", [(0, 5.0), (100, 4.0), (200, 3.0)])
    _with_payload(write_run(tmp_path / "b", "sync", [(0, 5.0), (300, 3.0)]), "topk:fraction=0.01")
    _with_payload(write_run(tmp_path / "c", "sync", [(0, 5.0), (400, 3.0)]), "sign")
    q = quality_factors(tmp_path, target_loss=3.0)
    assert q.names() == ["sync", "sync@sign", "sync@topk:fraction=0.01"]
    topk = load_topology("two-clouds").run.payload.model_validate(
        {"kind": "topk", "fraction": 0.01}
    )
    assert q.for_mode("diloco", None, topk) == pytest.approx(1.5)
    assert q.method_for("sync", None, topk) == "sync@topk:fraction=0.01"
    assert q.for_mode("diloco") == 1.0
    lowrank = topk.model_validate({"kind": "lowrank", "rank": 4})
    with pytest.raises(UserInputError, match="sync@sign"):
        q.for_mode("diloco", None, lowrank)
    # a folder without compressed runs: every payload gets the dense q, as before
    dense_only = quality_factors(tmp_path / "a", target_loss=3.0)
    assert dense_only.for_mode("diloco", None, topk) == 1.0


def test_an_int8_run_is_listed_but_never_stands_for_the_dense_method(tmp_path: Path) -> None:
    """A dense run sent as int8 (summary `codec`) is `sync@int8`: it does not join the dense
    sync runs' mean nor answer for a compressed payload."""
    write_run(tmp_path / "a", "sync", [(0, 5.0), (100, 4.0), (200, 3.0)])
    int8 = write_run(tmp_path / "b", "sync", [(0, 5.0), (400, 3.0)])
    summary = json.loads((int8 / "summary.json").read_text())
    (int8 / "summary.json").write_text(json.dumps(summary | {"codec": "int8"}))
    _with_payload(write_run(tmp_path / "c", "sync", [(0, 5.0), (300, 3.0)]), "sign")
    q = quality_factors(tmp_path, target_loss=3.0)
    assert q.names() == ["sync", "sync@int8", "sync@sign"]
    assert q.factor("sync@int8") == pytest.approx(2.0)
    sign = load_topology("two-clouds").run.payload.model_validate({"kind": "sign"})
    assert q.for_mode("diloco", None, sign) == pytest.approx(1.5)
    bad = write_run(tmp_path / "d", "sync", [(0, 5.0), (300, 3.0)])
    (bad / "summary.json").write_text(json.dumps(summary | {"codec": "int4"}))
    with pytest.raises(UserInputError, match="int4"):
        quality_factors(tmp_path, target_loss=3.0)


def test_plan_with_a_payload_ranks_by_its_quality(tmp_path: Path) -> None:
    write_run(tmp_path / "a", "sync", [(0, 5.0), (100, 4.0), (200, 3.0)])
    _with_payload(write_run(tmp_path / "b", "sync", [(0, 5.0), (300, 3.0)]), "topk:fraction=0.01")
    q = quality_factors(tmp_path, target_loss=3.0)
    topo = load_topology("two-clouds")
    from shardmeter.estimate.islands import with_run

    ranked = plan_to_target(
        q,
        top_k=2,
        topology=with_run(topo, payload="topk:fraction=0.01"),
        outer=OuterOptions(modes=("diloco",)),
    )
    assert ranked and all(r.quality_factor == pytest.approx(1.5) for r in ranked)
    assert all(r.method == "sync@topk:fraction=0.01" for r in ranked)
