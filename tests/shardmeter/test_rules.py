"""The plan-rule table: one rule per code yields validate_plan's first error, the search's
validity masks and calibration's relaxations (chosen by code, never by message text)."""

from __future__ import annotations

import dataclasses
import itertools

import numpy as np
import pytest

from shardmeter import calibrate
from shardmeter.estimate.plan_arrays import PlanArrays
from shardmeter.estimate.step import estimate_step, plan_validity
from shardmeter.search.options import SpaceOptions
from shardmeter.search.space import enumerate_shapes, grid_valid, make_plan, sync_choices
from shardmeter.specs import rules
from shardmeter.specs.loader import load_cluster, load_model
from shardmeter.specs.model import MoESpec, TransformerSpec
from shardmeter.specs.plan import Plan, validate_plan
from shardmeter.specs.rules import RELAXABLE, RULES, PlanRuleError, first_broken, rules_hold

MODEL = TransformerSpec(
    name="rules", n_layers=12, hidden=512, n_heads=8, ffn=2048, vocab=1000, seq_len=1024
)
MOE = MODEL.model_copy(update={"moe": MoESpec(experts=4, top_k=2)})

# one plan breaking each rule (and no rule before it), with the model it runs on
BREAKS: dict[str, tuple[Plan, TransformerSpec]] = {
    "tp_divides_heads": (Plan(tp=3), MODEL),
    "stage_split": (Plan(pp=2, pp_layers=(5, 5)), MODEL),
    "layers_per_chunk": (Plan(pp=5, global_batch=5), MODEL),
    "vpp_needs_pp": (Plan(vpp=2), MODEL),
    "cp_divides_seq": (Plan(cp=3), MODEL),
    "ep_needs_moe": (Plan(dp=2, ep=2, global_batch=2), MODEL),
    "ep_divides_experts": (Plan(dp=3, ep=3, global_batch=3), MOE),
    "ep_divides_dp": (Plan(dp=2, ep=4, global_batch=2), MOE),
    "whole_micro_batches": (Plan(dp=2, global_batch=3), MODEL),
    "vpp_group": (Plan(pp=2, global_batch=8, vpp_group=2), MODEL),
    "interleave_micro_batches": (Plan(pp=2, vpp=2, global_batch=3), MODEL),
    "shard_needs_sharding": (Plan(dp=4, shard_degree=2, global_batch=4), MODEL),
    "shard_divides_dp": (Plan(dp=4, sharding="zero3", shard_degree=3, global_batch=4), MODEL),
}


def test_every_rule_has_a_plan_that_breaks_it_first() -> None:
    assert set(BREAKS) == {r.code for r in RULES}
    for code, (plan, model) in BREAKS.items():
        with pytest.raises(PlanRuleError) as info:
            validate_plan(plan, model)
        assert info.value.code == code
        assert info.value.field == rules.rule(code).field or code == "stage_split"
        assert str(info.value).startswith(f"{info.value.field}: got ")
        holds = bool(plan_validity(model, PlanArrays.from_plan(plan))[0])
        assert holds is (rules.rule(code).exact is not None and code != "stage_split"), code


def test_array_predicates_agree_with_validate_plan_on_a_grid() -> None:
    """Every combination of small degrees: the broadcast mask equals validate_plan plan by
    plan, and the first broken rule is the one the table lists first."""
    plans = [
        Plan(dp=dp, tp=tp, pp=pp, vpp=vpp, cp=cp, micro_batch=mb, global_batch=g)
        for dp, tp, pp, vpp, cp, mb, g in itertools.product(
            (1, 2, 3), (1, 2, 3), (1, 2, 5), (1, 2), (1, 2), (1, 2), (2, 6, 8)
        )
    ]
    for model in (MODEL, MOE):
        mask = plan_validity(model, PlanArrays.from_plans(plans))
        for plan, ok in zip(plans, mask, strict=True):
            broken = first_broken(plan, model)
            assert ok == (broken is None), plan
            if broken is not None:
                with pytest.raises(PlanRuleError) as info:
                    validate_plan(plan, model)
                assert info.value.code == broken.code


def test_search_grid_mask_is_the_table_with_uneven_layers_relaxed() -> None:
    model = load_model("gpt-1.7b")
    cluster = load_cluster("dgx-h100")
    opts = SpaceOptions(max_cp=2)
    shapes = enumerate_shapes(model, cluster, 8, (48, 64), opts)
    checked = 0
    for g in (48, 64):
        for dp in np.unique(shapes.dp):
            rows = shapes.take(np.flatnonzero(shapes.dp == dp))
            sync = sync_choices(int(dp), opts)
            valid = grid_valid(model, rows, sync, g)
            for k, r in itertools.product(range(len(sync)), range(len(rows))):
                plan = make_plan(rows, r, int(sync.sharding[k]), int(sync.shard_group[k]), g, False)
                broken = first_broken(plan, model, relax=("layers_per_chunk",))
                assert valid[k, r] == (broken is None)
                checked += 1
    assert checked > 100


def test_estimate_step_relaxes_only_uneven_layers() -> None:
    cluster = load_cluster("dgx-h100")
    plan, model = BREAKS["layers_per_chunk"]
    with pytest.raises(PlanRuleError, match=r"^plan\.pp: got 5; pp\*vpp = 5 must divide"):
        estimate_step(model, cluster, plan)
    assert estimate_step(model, cluster, plan, check_layers=False).step_time_s > 0
    plan, model = BREAKS["tp_divides_heads"]
    with pytest.raises(PlanRuleError):
        estimate_step(model, cluster, plan, check_layers=False)


def test_calibration_relaxes_by_code_not_by_message(monkeypatch: pytest.MonkeyPatch) -> None:
    """Rewording every message changes no relaxation; a rule marked not relaxable raises."""
    assert set(calibrate.RELAXATIONS) == set(RELAXABLE)
    plan = Plan(dp=2, pp=5, vpp=2, micro_batch=1, global_batch=7)
    expect = (
        "uneven pipeline stages",
        "global batch not a whole number of micro-batches",
        "interleaving with micro-batches not divisible by pp",
    )
    assert calibrate.validate_relaxed(plan, MODEL, 10) == expect
    reworded = tuple(dataclasses.replace(r, allowed=lambda p, m: "reworded") for r in RULES)
    monkeypatch.setattr(rules, "RULES", reworded)
    assert calibrate.validate_relaxed(plan, MODEL, 10) == expect
    strict = tuple(dataclasses.replace(r, relaxable=False) for r in reworded)
    monkeypatch.setattr(rules, "RULES", strict)
    monkeypatch.setattr(calibrate, "RELAXABLE", frozenset())
    with pytest.raises(PlanRuleError, match="reworded") as info:
        calibrate.validate_relaxed(plan, MODEL, 10)
    assert info.value.code == "layers_per_chunk"


def test_rules_hold_broadcasts_over_columns() -> None:
    cols = rules.PlanColumns(
        dp=np.array([[1, 2, 4]]),
        tp=np.array([[1], [3]]),
        pp=1,
        cp=1,
        ep=1,
        vpp=1,
        micro_batch=1,
        global_batch=4,
        sharding=0,
        shard_group=1,
    )
    ok = rules_hold(cols, MODEL)
    assert ok.shape == (2, 3)
    assert ok.tolist() == [[True, True, True], [False, False, False]]
