"""Frameworks as configuration: closed identifiers, documented defaults, stated fields win."""

from __future__ import annotations

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from shardmeter.calibrate import global_batch_from_row, plan_from_row, run_from_row
from shardmeter.errors import UserInputError
from shardmeter.specs.framework import FRAMEWORKS, framework_id
from shardmeter.specs.model import TransformerSpec
from shardmeter.specs.plan import Plan, validate_plan

BASE = {
    "run_id": "1", "source_id": "SX", "model": "m", "n_layers": "32", "hidden": "4096",
    "n_heads": "32", "n_kv_heads": "8", "head_dim": "128", "ffn": "14336", "vocab": "128256",
    "seq_len": "8192", "mlp": "swiglu", "gpu": "h100-sxm", "n_gpus": "16", "gpus_per_node": "8",
    "nvlink_domain": "8", "tp": "2", "pp": "1", "dp": "8", "cp": "1", "ep": "1",
    "global_batch": "16", "precision": "bf16", "framework": "NeMo 24.09",
    "tokens_per_sec_per_gpu": "5000",
}  # fmt: skip
MODEL = TransformerSpec(n_layers=126, hidden=1024, n_heads=8, ffn=4096, vocab=1000, seq_len=256)


@pytest.mark.parametrize(
    ("published", "ident"),
    [
        ("NeMo 24.09", "nemo"), ("NeMo 24.11", "nemo"),
        ("NeMo 25.11 (Megatron-Bridge)", "megatron-bridge"), ("Megatron-LM", "megatron-lm-2021"),
        ("Megatron-LM 2022", "megatron-lm-2022"), ("DeepSpeed ZeRO-3", "deepspeed-2021"),
        ("MaxText 2024.12 (GPU)", "maxtext"), ("MaxText (TPU, JAX/XLA)", "maxtext"),
        ("torchtitan", "torchtitan"), ("llm-foundry", "llm-foundry"),
        ("Megatron-DeepSpeed (BLOOM)", "megatron-deepspeed"), ("megatron-core", "megatron-core"),
    ],
)  # fmt: skip
def test_published_spellings_map_to_identifiers(published: str, ident: str) -> None:
    assert framework_id(published) == ident


@pytest.mark.parametrize(
    "name", ["megatron", "NeMo Megatron", "nemo-ish", "Megatron-LM 2023x", "pytorch"]
)
def test_unknown_framework_is_an_error_not_a_substring_guess(name: str) -> None:
    with pytest.raises(UserInputError, match=r"framework.*one of megatron-lm-2021"):
        framework_id(name)
    with pytest.raises(ValueError, match="framework"):
        Plan(framework=name)


def test_blank_fields_take_the_framework_defaults_and_stated_ones_win() -> None:
    nemo = Plan(framework="nemo", tp=4, pp=2, dp=2, global_batch=16)
    assert (nemo.sharding, nemo.overlap_tp, nemo.sp, nemo.fused_ce, nemo.attention) == (
        "zero1", True, True, True, "flash",
    )  # fmt: skip
    stated = Plan(framework="nemo", tp=4, sharding="zero3", overlap_tp=False, sp=False)
    assert (stated.sharding, stated.overlap_tp, stated.sp) == ("zero3", False, False)
    old = Plan(framework="megatron-lm-2021", tp=8, pp=4, dp=1, global_batch=8)
    assert (old.sharding, old.attention, old.overlap_dp, old.overlap_tp) == (
        "none", "unfused", False, False,
    )  # fmt: skip
    deepseek = Plan(framework="deepseek-hai-llm", pp=16, dp=128, ep=64, global_batch=15360)
    assert (deepseek.vpp, deepseek.ep_dispatch, deepseek.ep_dedup, deepseek.overlap_ep) == (
        2, "fp8", True, True,
    )  # fmt: skip
    assert Plan(framework="deepseek-hai-llm").vpp == 1  # interleaving only with pp > 1
    # DeepSpeed 0.3 ZeRO-3 reduces gradients on the compute stream (overlap_comm off by
    # default) and synchronizes the device at every fetch: nothing hides the reduce-scatter.
    deepspeed = Plan(framework="deepspeed-2021", dp=64, global_batch=64)
    assert (deepspeed.sharding, deepspeed.gather_unit, deepspeed.overlap_dp) == (
        "zero3", "matrix", False,
    )  # fmt: skip
    assert not deepspeed.overlap_param_gather
    assert Plan(framework="maxtext").graphs
    # torchtitan runs eager element-wise ops unless its FP8 recipe compiles; stated wins.
    assert not Plan(framework="torchtitan").fused_elementwise
    assert Plan(framework="torchtitan", precision="fp8").fused_elementwise
    assert Plan(framework="torchtitan", fused_elementwise=True).fused_elementwise
    assert Plan(framework="nemo").fused_elementwise and Plan().fused_elementwise
    # llm-foundry's Composer FSDP (mixed_precision DEFAULT) keeps fp32 weights under autocast.
    assert Plan(framework="llm-foundry").param_dtype == "fp32"
    assert Plan(framework="llm-foundry", param_dtype="bf16").param_dtype == "bf16"
    assert Plan(framework="torchtitan").param_dtype == "bf16" and Plan().param_dtype == "bf16"


def test_every_framework_documents_its_source() -> None:
    for fw in FRAMEWORKS.values():
        assert len(fw.source) > 40 and fw.era


@settings(derandomize=True, max_examples=60, deadline=None)
@given(st.text(max_size=30))
def test_framework_names_are_either_known_or_refused(text: str) -> None:
    try:
        ident = framework_id(text)
    except UserInputError:
        return
    assert ident in FRAMEWORKS


def test_csv_framework_column_goes_through_the_registry() -> None:
    old = plan_from_row({**BASE, "framework": "Megatron-LM", "sp": "no"})
    assert (old.framework, old.sharding, old.attention) == ("megatron-lm-2021", "none", "unfused")
    with pytest.raises(UserInputError, match="framework"):
        run_from_row({**BASE, "framework": "Megatron"})


def test_blank_global_batch_is_derived_or_refused() -> None:
    row = {**BASE, "global_batch": "", "iteration_time_s": "2.0", "tokens_per_sec_per_gpu": "4096"}
    assert global_batch_from_row(row) == round(4096 * 16 * 2.0 / 8192)  # 16 sequences
    assert run_from_row(row).plan.global_batch == 16
    with pytest.raises(UserInputError, match=r"global_batch.*iteration_time_s"):
        global_batch_from_row({**BASE, "global_batch": ""})


def test_uneven_stage_validation() -> None:
    ok = Plan(pp=16, pp_first=7, pp_last=7, dp=1, global_batch=16)
    validate_plan(ok, MODEL)
    validate_plan(Plan(pp=16, pp_layers=(7, *[8] * 14, 7), global_batch=16), MODEL)
    with pytest.raises(UserInputError, match="pp_layers"):
        validate_plan(Plan(pp=16, pp_layers=(8,) * 16, global_batch=16), MODEL)  # 128 ≠ 126
    with pytest.raises(UserInputError, match="pp_layers"):
        validate_plan(Plan(pp=4, pp_layers=(100, 26), global_batch=4), MODEL)  # 2 counts, pp 4
    with pytest.raises(UserInputError, match="pp_first"):
        validate_plan(Plan(pp=4, pp_first=125, global_batch=4), MODEL)  # nothing left for 3
    with pytest.raises(UserInputError, match="pp > 1"):
        validate_plan(Plan(pp_first=1), MODEL)


def test_extra_plan_columns_from_csv() -> None:
    row = {**BASE, "tp": "1", "pp": "2", "dp": "8", "pp_layers": "10;22", "ep_imbalance": "1",
           "attention": "unfused", "graphs": "yes"}  # fmt: skip
    plan = plan_from_row(row)
    assert (plan.pp_layers, plan.attention, plan.graphs, plan.ep_imbalance) == (
        (10, 22), "unfused", True, 1.0,
    )  # fmt: skip
    with pytest.raises(UserInputError, match="graphs"):
        plan_from_row({**row, "graphs": "maybe"})


def test_planner_plans_for_a_framework() -> None:
    """SpaceOptions(framework=...) keeps the framework's fixed features on every plan it
    evaluates (the grid and the Plan it returns agree), and an unknown one is refused."""
    from shardmeter.estimate.step import estimate_step
    from shardmeter.search import SpaceOptions, plan
    from shardmeter.specs.loader import load_cluster, load_model

    model, cluster = load_model("llama-3.1-8b"), load_cluster("dgx-h100")
    options = SpaceOptions(framework="MaxText 2024.12 (GPU)", micro_batches=(1, 2))
    res = plan(model, cluster, gpus=8, global_batch=16, options=options, top_k=1)
    assert res.best_time is not None
    best = res.best_time.islands[0]
    assert (best.plan.framework, best.plan.compiled, best.plan.graphs) == ("maxtext", True, True)
    again = estimate_step(model, cluster, best.plan, check_layers=False)
    assert again.step_time_s == pytest.approx(best.step.step_time_s, rel=1e-9)
    with pytest.raises(UserInputError, match="framework"):
        SpaceOptions(framework="maxtext-ish")
