"""Planner: grid evaluation = predict, bounds are bounds, brute force finds the same optimum and
front, returned plans are valid and fit, and unmeetable constraints are named."""

from __future__ import annotations

import itertools
import math

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from shardmeter.errors import UserInputError
from shardmeter.estimate.islands import with_run
from shardmeter.estimate.step import estimate_step, estimate_step_arrays
from shardmeter.predict import predict
from shardmeter.search import Constraints, OuterOptions, SpaceOptions, plan
from shardmeter.search.evaluate import memory_lower_bound, step_time_lower_bound
from shardmeter.search.pareto import dominated, pareto_front
from shardmeter.search.space import (
    enumerate_shapes,
    grid_plans,
    grid_valid,
    make_plan,
    sync_choices,
)
from shardmeter.specs.loader import load_cluster, load_model
from shardmeter.specs.model import TransformerSpec
from shardmeter.specs.plan import Plan, validate_plan
from shardmeter.specs.topology import load_topology

SMALL = TransformerSpec(
    name="small", n_layers=8, hidden=1024, n_heads=8, ffn=4096, vocab=32000, seq_len=2048
)
# Small enough to brute-force, big enough that memory binds on 40 GB A100s.
SPACE = SpaceOptions(
    recompute=("none", "full"), micro_batches=(1, 2), max_cp=2, uneven_layers=False
)


@pytest.fixture(scope="module")
def a100_40() -> object:
    """DGX A100 40GB with a 32 GB budget per GPU, so the space holds plans that do not fit."""
    cluster = load_cluster("dgx-a100-40gb")
    small = cluster.accelerator.model_copy(update={"hbm_gb": 32.0})
    return cluster.model_copy(update={"accelerator": small})


@pytest.fixture(scope="module")
def gpt17() -> TransformerSpec:
    return load_model("gpt-1.7b")


def brute_force_plans(model: TransformerSpec, n: int, batch: int, opts: SpaceOptions) -> list[Plan]:
    """The documented space (docs/planner.md), enumerated independently with plain loops."""
    out = []
    pow2 = [1, 2, 4, 8, 16, 32, 64]
    for tp, cp, pp in itertools.product(range(1, 9), pow2, range(1, model.n_layers + 1)):
        if model.n_heads % tp or cp > opts.max_cp or model.seq_len % cp or n % (tp * cp * pp):
            continue
        dp = n // (tp * cp * pp)
        for vpp in [1] if pp == 1 else range(1, opts.max_vpp + 1):
            if model.n_layers % (pp * vpp):
                continue
            syncs: list[tuple[str, int | None]] = [("none", None)]
            groups = [None] + [g for g in pow2 if 2 <= g < dp and dp % g == 0]
            syncs += [(s, g) for s in ("zero1", "zero2", "zero3") for g in groups]
            for mb, rc, (sh, g) in itertools.product(opts.micro_batches, opts.recompute, syncs):
                p = Plan(
                    dp=dp,
                    tp=tp,
                    pp=pp,
                    cp=cp,
                    vpp=vpp,
                    sp=tp > 1,
                    sharding=sh,  # type: ignore[arg-type]
                    shard_degree=g,
                    micro_batch=mb,
                    global_batch=batch,
                    recompute=rc,  # type: ignore[arg-type]
                )
                try:
                    validate_plan(p, model, n)
                except UserInputError:
                    continue
                out.append(p)
    return out


def test_grid_evaluation_equals_predict_on_random_plans(gpt17: TransformerSpec) -> None:
    cluster = load_cluster("dgx-h100")
    opts = SpaceOptions(precisions=("bf16", "fp8"), max_cp=4, uneven_layers=False)
    shapes = enumerate_shapes(gpt17, cluster, 32, (256,), opts)
    rng = np.random.default_rng(0)
    checked = 0
    for dp in np.unique(shapes.dp):
        rows = shapes.take(np.flatnonzero(shapes.dp == dp))
        sync = sync_choices(int(dp), opts)
        grid = estimate_step_arrays(gpt17, cluster, grid_plans(rows, sync, 256, False))
        valid = grid_valid(gpt17, rows, sync, 256)
        kk, rr = np.nonzero(valid)
        for j in rng.choice(kk.size, size=min(6, kk.size), replace=False):
            k, r = int(kk[j]), int(rr[j])
            p = make_plan(rows, r, int(sync.sharding[k]), int(sync.shard_group[k]), 256, False)
            one = predict(gpt17, cluster, p)
            step = float(np.broadcast_to(grid.step_time_s, valid.shape)[k, r])
            mem = float(np.broadcast_to(grid.memory_bytes, valid.shape)[k, r])
            assert step == pytest.approx(one.step_time_s, rel=1e-9)
            assert mem == pytest.approx(one.memory_bytes, rel=1e-9)
            checked += 1
    assert checked > 20


@settings(max_examples=15, deadline=None)
@given(
    n=st.sampled_from([8, 16, 64]),
    batch=st.sampled_from([64, 128, 512]),
    headroom=st.sampled_from([0.0, 0.2]),
)
def test_bounds_are_lower_bounds(
    gpt17: TransformerSpec, n: int, batch: int, headroom: float
) -> None:
    cluster = load_cluster("dgx-a100-40gb")
    opts = SpaceOptions(max_cp=2)
    shapes = enumerate_shapes(gpt17, cluster, n, (batch,), opts)
    step = shapes.dp * shapes.micro_batch
    rows = shapes.take(np.flatnonzero(batch % step == 0))
    bound = step_time_lower_bound(gpt17, cluster, rows, batch)
    mem_bound = memory_lower_bound(gpt17, cluster, rows, batch, opts)
    for dp in np.unique(rows.dp):
        sel = np.flatnonzero(rows.dp == dp)
        sub = rows.take(sel)
        sync = sync_choices(int(dp), opts)
        est = estimate_step_arrays(gpt17, cluster, grid_plans(sub, sync, batch, False))
        shape = (len(sync), len(sub))
        valid = grid_valid(gpt17, sub, sync, batch)
        t = np.where(valid, np.broadcast_to(est.step_time_s, shape), np.inf)
        m = np.where(valid, np.broadcast_to(est.memory_bytes, shape), np.inf)
        assert np.all(bound[sel] <= t.min(axis=0) * (1 + 1e-12))
        assert np.all(mem_bound[sel] <= m.min(axis=0) * (1 + 1e-12))


def test_pareto_front_matches_quadratic_definition() -> None:
    rng = np.random.default_rng(1)
    t = rng.integers(0, 30, 400).astype(float)
    c = rng.integers(0, 30, 400).astype(float)
    front = set(pareto_front(t, c).tolist())
    for i in range(t.size):
        beaten = np.any((t <= t[i]) & (c <= c[i]) & ((t < t[i]) | (c < c[i])))
        if i in front:
            assert not beaten
        elif not beaten:  # a tie of a front point
            assert any(t[j] == t[i] and c[j] == c[i] for j in front)
    idx = pareto_front(t, c)
    assert np.all(dominated(t, c, t[idx], c[idx]))


@pytest.mark.slow
@pytest.mark.parametrize("prune", [True, False])
def test_brute_force_finds_the_same_optimum(
    gpt17: TransformerSpec, a100_40: object, prune: bool
) -> None:
    plans = brute_force_plans(gpt17, 8, 64, SPACE)
    assert len(plans) > 100
    times = []
    for p in plans:
        est = estimate_step(gpt17, a100_40, p)  # type: ignore[arg-type]
        times.append(est.step_time_s if est.fits else math.inf)
    best = min(times)
    assert math.isfinite(best) and any(not math.isfinite(t) for t in times)
    res = plan(gpt17, a100_40, gpus=8, global_batch=64, options=SPACE, top_k=5, prune=prune)  # type: ignore[arg-type]
    assert res.best_time is not None
    assert res.best_time.islands[0].step.step_time_s == pytest.approx(best, rel=1e-9)
    assert res.stats.space == len(plans)
    if prune:
        assert res.stats.pruned_bound + res.stats.pruned_memory > 0
    ranked = sorted(t for t in times if math.isfinite(t))[:5]
    got = [c.islands[0].step.step_time_s for c in res.ranked]
    assert got == pytest.approx(ranked, rel=1e-9)


@pytest.mark.slow
def test_front_over_gpu_counts_matches_brute_force(a100_40: object) -> None:
    tokens = 1e9
    brute: list[tuple[float, float]] = []
    price = a100_40.price_per_gpu_hour  # type: ignore[attr-defined]
    for n in (8, 16):
        for p in brute_force_plans(SMALL, n, 64, SPACE):
            est = estimate_step(SMALL, a100_40, p)  # type: ignore[arg-type]
            if est.fits:
                wall = tokens / est.tokens_per_s
                brute.append((wall, n * price * wall / 3600))
    t = np.array([b[0] for b in brute])
    c = np.array([b[1] for b in brute])
    expect = sorted(zip(t[pareto_front(t, c)], c[pareto_front(t, c)], strict=True))
    res = plan(SMALL, a100_40, gpus=(8, 16), global_batch=64, tokens=tokens, options=SPACE)  # type: ignore[arg-type]
    got = sorted((x.wall_s, x.cost_usd) for x in res.pareto)
    assert len(got) == len(expect) >= 2
    for (gw, gc), (ew, ec) in zip(got, expect, strict=True):
        assert gw == pytest.approx(ew, rel=1e-9) and gc == pytest.approx(ec, rel=1e-9)
    assert res.best_cost is not None and res.best_cost.cost_usd == pytest.approx(c.min(), rel=1e-9)


def test_returned_plans_are_valid_and_fit(gpt17: TransformerSpec, a100_40: object) -> None:
    con = Constraints(memory_headroom=0.25)
    res = plan(gpt17, a100_40, gpus=(8, 16), global_batch=(64, 128), options=SPACE, constraints=con)  # type: ignore[arg-type]
    assert res.ranked
    for cand in (*res.ranked, *res.pareto):
        isl = cand.islands[0]
        validate_plan(isl.plan, gpt17, isl.n_gpus)
        assert isl.step.memory_bytes <= 0.75 * isl.step.hbm_bytes
        assert cand.meets


def test_uneven_layers_only_when_allowed() -> None:
    model = load_model("llama-3.1-405b")
    cluster = load_cluster("dgx-h100")
    even = enumerate_shapes(model, cluster, 1024, (512,), SpaceOptions(uneven_layers=False))
    uneven = enumerate_shapes(model, cluster, 1024, (512,), SpaceOptions())
    assert np.all(model.n_layers % (even.pp * even.vpp) == 0)
    assert np.any(model.n_layers % uneven.pp != 0)
    assert np.all((uneven.vpp == 1) | (model.n_layers % (uneven.pp * uneven.vpp) == 0))


def test_deadline_that_no_plan_meets_is_named(gpt17: TransformerSpec, a100_40: object) -> None:
    free = plan(gpt17, a100_40, gpus=8, global_batch=64, tokens=1e10, options=SPACE)  # type: ignore[arg-type]
    assert free.best_time is not None
    fastest = free.best_time.wall_s
    res = plan(
        gpt17,
        a100_40,
        gpus=8,
        global_batch=64,
        tokens=1e10,
        options=SPACE,  # type: ignore[arg-type]
        constraints=Constraints(deadline_s=fastest / 2),
    )
    assert not res.ranked and res.infeasible is not None
    assert res.infeasible.binding == "deadline"
    assert res.infeasible.closest is not None
    assert res.infeasible.closest.wall_s == pytest.approx(fastest)
    assert "100% over" in res.infeasible.text


def test_budget_and_memory_that_no_plan_meets_are_named(a100_40: object) -> None:
    res = plan(
        SMALL,
        a100_40,
        gpus=(8, 16),
        global_batch=64,
        tokens=1e9,
        options=SPACE,  # type: ignore[arg-type]
        constraints=Constraints(budget_usd=1e-3),
    )
    assert res.infeasible is not None and res.infeasible.binding == "budget"
    cheapest = min(
        c.cost_usd
        for c in plan(
            SMALL, a100_40, gpus=(8, 16), global_batch=64, tokens=1e9, options=SPACE
        ).pareto
    )  # type: ignore[arg-type]
    assert res.infeasible.closest is not None
    assert res.infeasible.closest.cost_usd == pytest.approx(cheapest)
    huge = plan("llama-3.1-405b", "dgx-a100-40gb", gpus=8, global_batch=8)
    assert huge.infeasible is not None and huge.infeasible.binding == "memory"
    assert huge.infeasible.closest is None and "fits in memory" in huge.infeasible.text


def test_explanation_names_differing_terms(gpt17: TransformerSpec) -> None:
    res = plan(gpt17, "dgx-h100", gpus=64, global_batch=256, options=SpaceOptions(max_cp=2))
    exp = res.explanation
    assert exp is not None and exp.speedup >= 1.0
    assert exp.plan_diffs and "faster than the runner-up" in exp.text
    w = res.ranked[0].islands[0].step
    assert (
        sum(t.winner for t in exp.terms)
        <= sum(w.time_breakdown.values()) * 1e6 / w.tokens_per_step + 1e-9
    )


def test_topology_search_agrees_with_compose() -> None:
    res = plan(
        topology="two-clouds",
        tokens=1e11,
        options=SpaceOptions(recompute=("none", "full"), micro_batches=(1, 2), max_cp=2),
        outer=OuterOptions(inner_steps=(50, 200), bits=(16, 4)),
    )
    top = res.best_time
    est = res.top_estimate
    assert top is not None and est is not None and top.outer is not None
    assert top.wall_s == pytest.approx(est.wall_s, rel=1e-9)
    assert top.cost_usd == pytest.approx(est.cost_usd, rel=1e-9)
    assert top.tokens_per_s == pytest.approx(est.tokens_per_s, rel=1e-9)
    assert [i.name for i in top.islands] == [i.name for i in est.islands]
    assert res.pareto[0].wall_s == pytest.approx(top.wall_s)
    walls = [c.wall_s for c in res.ranked]
    assert walls == sorted(walls)
    for cand in res.ranked:
        for isl in cand.islands:
            assert isl.step.fits
            assert isl.n_gpus % 8 == 0


def test_failures_change_the_best_plan_and_every_candidate_equals_compose() -> None:
    """DiLoCo on two-clouds, H = 200 or 2000: without failures the longer round hides more WAN
    time and wins; with a GPU MTBF of 500 h and hour-long restarts every failure stalls both
    islands and redoes half a round, so the search, which now ranks with failures, picks
    H = 200. Ranking without failures and recomposing the winner would have kept H = 2000."""
    small = SpaceOptions(
        recompute=("none",), micro_batches=(1,), max_cp=1, sharding=("zero3",), max_pp=1
    )
    outer = OuterOptions(modes=("diloco",), inner_steps=(200, 2000))
    topo = load_topology("two-clouds")
    failing = with_run(topo, failures="gpu_mtbf_hours=500,restart_s=3600")
    free = plan(topology=topo, tokens=1e10, options=small, outer=outer, top_k=50)
    hit = plan(topology=failing, tokens=1e10, options=small, outer=outer, top_k=50)
    assert free.best_time is not None and free.best_time.outer is not None
    assert hit.best_time is not None and hit.best_time.outer is not None
    assert free.best_time.outer.inner_steps == 2000
    assert hit.best_time.outer.inner_steps == 200
    est = hit.top_estimate
    assert est is not None and est.failures.goodput < 1.0
    assert hit.best_time.wall_s == pytest.approx(est.wall_s, rel=1e-12)
    assert hit.best_time.cost_usd == pytest.approx(est.cost_usd, rel=1e-12)
    assert hit.best_time.utilization == pytest.approx(est.utilization, rel=1e-12)
    # the failure-free winner, priced with failures, is slower than the new winner
    old = [
        c
        for c in hit.ranked
        if c.outer is not None
        and c.outer.inner_steps == 2000
        and [i.n_gpus for i in c.islands] == [i.n_gpus for i in free.best_time.islands]
    ]
    assert old and old[0].wall_s > hit.best_time.wall_s


def test_bad_inputs_raise_user_input_errors() -> None:
    with pytest.raises(UserInputError, match="precision"):
        SpaceOptions(precisions=("int4",))
    with pytest.raises(UserInputError, match="deadline"):
        Constraints(deadline_s=-1)
    with pytest.raises(UserInputError, match="gpus"):
        plan("llama-3-8b", "dgx-h100", gpus=0)
    with pytest.raises(UserInputError, match=r"^tokens: got -1\.0"):
        plan(topology="two-clouds", tokens=-1.0)
    with pytest.raises(UserInputError, match="modes"):
        OuterOptions(modes=("gossip",))


def test_parallel_jobs_find_the_same_plans(gpt17: TransformerSpec, a100_40: object) -> None:
    one = plan(gpt17, a100_40, gpus=(8, 16), global_batch=64, options=SPACE, top_k=3)  # type: ignore[arg-type]
    two = plan(gpt17, a100_40, gpus=(8, 16), global_batch=64, options=SPACE, top_k=3, jobs=2)  # type: ignore[arg-type]
    assert [c.wall_s for c in two.ranked] == pytest.approx([c.wall_s for c in one.ranked])
    assert [c.cost_usd for c in two.pareto] == pytest.approx([c.cost_usd for c in one.pareto])


def test_pruning_keeps_the_runner_up_layout(gpt17: TransformerSpec) -> None:
    kwargs = dict(gpus=(32, 64), global_batch=256, options=SpaceOptions(max_cp=2), top_k=2)
    pruned = plan(gpt17, "dgx-h100", **kwargs)  # type: ignore[arg-type]
    full = plan(gpt17, "dgx-h100", prune=False, **kwargs)  # type: ignore[arg-type]
    assert pruned.stats.pruned_bound > 0
    assert pruned.explanation is not None and full.explanation is not None
    assert pruned.explanation.text == full.explanation.text
    assert pruned.explanation.plan_diffs


def test_pruning_spares_rows_that_could_become_the_runner_up() -> None:
    """One node: the fastest plans all share the winner's layout, so the runner-up layout is
    slower than the top-k threshold. Pruning by the threshold alone would drop it; the guard
    keeps every row that could still beat the current runner-up, so the explanation matches
    the unpruned search's."""
    kwargs = dict(gpus=(8,), global_batch=256, options=SpaceOptions(max_cp=2), top_k=2)
    pruned = plan("gpt-1.7b", "dgx-h100", **kwargs)  # type: ignore[arg-type]
    full = plan("gpt-1.7b", "dgx-h100", prune=False, **kwargs)  # type: ignore[arg-type]
    assert pruned.stats.pruned_bound > 0
    assert pruned.explanation is not None and full.explanation is not None
    assert pruned.explanation.text == full.explanation.text


def test_topology_constraints_no_plan_meets_are_named() -> None:
    small = SpaceOptions(recompute=("none",), micro_batches=(1,), max_cp=1)
    outer = OuterOptions(modes=("diloco",))
    free = plan(topology="two-clouds", tokens=1e10, options=small, outer=outer)
    assert free.best_time is not None
    tight = Constraints(deadline_s=free.best_time.wall_s * 0.5)
    res = plan(topology="two-clouds", tokens=1e10, options=small, outer=outer, constraints=tight)
    assert res.infeasible is not None and res.infeasible.binding == "deadline"
    assert res.infeasible.closest is not None
    assert res.infeasible.closest.wall_s == pytest.approx(free.best_time.wall_s)
    huge = plan("llama-3.1-405b", topology="two-clouds", options=small, outer=outer)
    assert huge.infeasible is not None and huge.infeasible.binding == "memory"
