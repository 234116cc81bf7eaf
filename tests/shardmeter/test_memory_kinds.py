"""Closed-form checks of the memory setups (optimizer, master weights, offload) and of the three
kinds of memory answer (allocated, reserved, device total), and the memory measurements."""

from __future__ import annotations

import csv
from collections.abc import Callable
from typing import Any

import numpy as np
import pytest

from shardmeter.cli.validate_memory import memory_results_to_dict
from shardmeter.errors import UserInputError
from shardmeter.estimate.compute import recompute_share
from shardmeter.estimate.memory import (
    ADAM_4BIT_STATE,
    ADAM_8BIT_STATE,
    COMPILED_LOGITS_BYTES,
    CUDA_CONTEXT_BYTES,
    EAGER_FP32_CACHED_BYTES,
    EAGER_FP32_LOGITS_BYTES,
    EAGER_NORM_EXTRA,
    EAGER_SWIGLU_EXTRA,
    FP32_GRAD_BYTES,
    GRAD_BYTES,
    LOGITS_BYTES,
    MIB,
    NCCL_BUFFSIZE,
    NCCL_CHANNELS,
    OFFLOAD_FETCH_BYTES,
    OFFLOAD_STEP_BYTES,
    PCIE_BYTES_PER_S,
    UNSHARDED_GRAD_BYTES,
    activation_bytes_per_layer,
    largest_parameter,
    memory_breakdown,
    nccl_buffer_bytes,
    offload_transfer_time,
    optimizer_state_bytes,
    optimizer_step_bytes,
)
from shardmeter.estimate.plan_arrays import PlanArrays
from shardmeter.estimate.step import estimate_step, estimate_step_arrays
from shardmeter.memcheck import (
    MemoryResult,
    memory_run_from_row,
    read_memory_rows,
    summarize_memory,
)
from shardmeter.specs.loader import load_cluster, load_model
from shardmeter.specs.model import TransformerSpec
from shardmeter.specs.plan import Plan

ScalarPlan = Callable[..., PlanArrays]  # the `scalar_plan` fixture (conftest.py)
PredictJson = Callable[[list[str]], dict[str, Any]]  # the `predict_json` fixture


@pytest.mark.parametrize(
    ("optimizer", "master", "expected"),
    [
        ("adamw", "fp32", 12.0),  # fp32 master 4 + m, v fp32 8 (ZeRO paper K = 12)
        ("adamw", "remainder", 10.0),  # 16-bit remainder 2 + 8
        ("adamw", "none", 4.0),  # pure bf16: m, v in bf16
        ("adamw8bit", "none", 2.0 * ADAM_8BIT_STATE),
        ("adamw4bit", "none", 2.0 * ADAM_4BIT_STATE),
        ("adafactor", "none", 0.0),
        ("sgd", "fp32", 8.0),  # master 4 + momentum fp32 4
        ("muon", "none", 2.0),  # momentum in bf16
    ],
)
def test_optimizer_state_bytes_closed_form(
    optimizer: str, master: str, expected: float, scalar_plan: ScalarPlan
) -> None:
    on_gpu, paged = optimizer_state_bytes(scalar_plan(optimizer=optimizer, master_weights=master))
    assert float(on_gpu) == pytest.approx(expected)
    assert float(paged) == 0.0


def test_low_bit_state_constants() -> None:
    assert pytest.approx(1.0 + 4.0 / 2048.0) == ADAM_8BIT_STATE
    assert pytest.approx(0.5 + 4.0 / 128.0) == ADAM_4BIT_STATE


def test_paged_states_leave_the_allocator(scalar_plan: ScalarPlan) -> None:
    on_gpu, paged = optimizer_state_bytes(
        scalar_plan(optimizer="paged_adamw8bit", master_weights="none")
    )
    assert float(on_gpu) == 0.0
    assert float(paged) == pytest.approx(2.0 * ADAM_8BIT_STATE)


def test_offload_moves_states_to_host(tiny: TransformerSpec, scalar_plan: ScalarPlan) -> None:
    cluster = load_cluster("dgx-h100")
    base = memory_breakdown(tiny, cluster, scalar_plan(master_weights="fp32"))
    opt = memory_breakdown(tiny, cluster, scalar_plan(offload="optimizer"))
    full = memory_breakdown(tiny, cluster, scalar_plan(offload="params+optimizer"))
    assert float(opt.optimizer_states) == 0.0
    assert float(opt.host) == pytest.approx(float(base.optimizer_states))
    assert float(opt.weights) == pytest.approx(float(base.weights))
    assert float(full.weights) == 0.0 and float(full.gradients) == 0.0
    # weights + grads + states on the host: 16 B per parameter
    assert float(full.host) == pytest.approx(
        float(base.allocated - base.activations - base.buffers)
    )
    assert float(full.buffers) > float(base.buffers)  # two units fetched from the host


def test_nccl_buffers_closed_form(scalar_plan: ScalarPlan) -> None:
    per_comm = NCCL_CHANNELS * 2.0 * NCCL_BUFFSIZE
    assert NCCL_BUFFSIZE == 4 * MIB
    assert float(nccl_buffer_bytes(scalar_plan())) == 0.0
    assert float(nccl_buffer_bytes(scalar_plan(dp=8))) == pytest.approx(per_comm)
    assert float(nccl_buffer_bytes(scalar_plan(dp=2, tp=2, pp=2))) == pytest.approx(3 * per_comm)


def test_three_kinds_add_up(tiny: TransformerSpec) -> None:
    est = estimate_step(
        tiny, load_cluster("dgx-h100"), Plan(dp=8, sharding="zero3", global_batch=8)
    )
    d = est.memory_detail
    assert est.memory_reserved_bytes == pytest.approx(
        est.memory_allocated_bytes + d["fragmentation"]
    )
    assert est.memory_total_bytes == pytest.approx(
        est.memory_reserved_bytes + d["cuda_context"] + d["nccl_buffers"]
    )
    assert d["cuda_context"] == pytest.approx(CUDA_CONTEXT_BYTES)
    assert est.memory_bytes == pytest.approx(sum(est.memory_breakdown.values()))
    assert est.fits == (est.memory_total_bytes <= est.hbm_bytes)


def test_stated_overhead_replaces_the_terms(tiny: TransformerSpec, scalar_plan: ScalarPlan) -> None:
    cluster = load_cluster("tpu-v5p-pod")
    mem = memory_breakdown(tiny, cluster, scalar_plan(dp=8))
    assert float(mem.overhead) == pytest.approx(0.5e9)
    assert float(mem.fragmentation) == 0.0


def test_memory_csv_rows_and_sources(memory_rows: list[dict[str, str]]) -> None:
    assert len(memory_rows) >= 40
    assert len({r["source_id"] for r in memory_rows}) >= 4
    for r in memory_rows:  # every row names its source and quotes it
        assert r["source_url"].startswith("https://") and r["quote"]
        assert r["memory_kind"] in ("allocated", "reserved", "total")


def test_validate_memory_verdicts_and_breakdown(memory_results: list[MemoryResult]) -> None:
    summary = summarize_memory(memory_results)
    assert summary.verdicts >= 30
    assert summary.verdicts_right == summary.verdicts
    doc = memory_results_to_dict(memory_results)
    row = next(r for r in doc["rows"] if r["run_id"] == "ao-optim-2")
    assert row["kind"] == "allocated"
    assert row["predicted_bytes"] == pytest.approx(row["allocated_bytes"])
    # full bf16 with 8-bit AdamW: weights 2 + grads 2 + states 2 B per parameter
    b = row["breakdown_bytes"]
    assert b["optimizer_states"] == pytest.approx(b["weights"] * ADAM_8BIT_STATE)
    assert abs(row["ape"]) < 0.05


def test_memory_row_errors_name_the_cell(
    tmp_path: object, memory_rows: list[dict[str, str]]
) -> None:
    row = dict(memory_rows[0])
    with pytest.raises(UserInputError, match=r"plan\.optimizer"):
        memory_run_from_row({**row, "optimizer": "lion"})
    with pytest.raises(UserInputError, match="memory_unit"):
        memory_run_from_row({**row, "memory_unit": "bytes"})


def test_presets_model_default_unchanged(scalar_plan: ScalarPlan) -> None:
    """The default plan (adamw, fp32 master, no offload) keeps the ZeRO 16 B per parameter."""
    model = load_model("llama-3.1-8b")
    mem = memory_breakdown(model, load_cluster("dgx-h100"), scalar_plan())
    states = float(mem.weights + mem.gradients + mem.optimizer_states)
    assert states / model.params_total == pytest.approx(16.0)
    assert np.isfinite(states)


def test_csv_reader_rejects_bad_files(tmp_path: object) -> None:
    import pathlib

    path = pathlib.Path(str(tmp_path)) / "x.csv"
    with open(path, "w", newline="") as fh:
        csv.writer(fh).writerow(["run_id"])
    with pytest.raises(UserInputError, match="missing columns"):
        read_memory_rows(path)


def test_kept_gathered_weights_and_accumulated_grads(
    scalar_plan: ScalarPlan,
) -> None:
    """reshard_after_forward = False: + 2 B per parameter not held locally (the gathered bf16
    weights) and, with PP, + 4 B per local parameter (unsharded fp32 gradients)."""
    model = load_model("llama-3.1-8b")
    cluster = load_cluster("dgx-h100")
    base = dict(dp=8, pp=2, sharding="zero3", global_batch=16, micro_batch=1)
    freed = memory_breakdown(model, cluster, scalar_plan(**base))
    kept = memory_breakdown(model, cluster, scalar_plan(**base, reshard_after_forward=False))
    params = float(freed.weights) / 2.0 * 8.0  # local parameters before sharding
    extra = float(kept.buffers - freed.buffers)
    assert extra == pytest.approx(params * (2.0 * (1 - 1 / 8) + UNSHARDED_GRAD_BYTES), rel=1e-6)
    single = dict(dp=8, sharding="zero3", global_batch=16)
    no_pp = memory_breakdown(model, cluster, scalar_plan(**single, reshard_after_forward=False))
    ref = memory_breakdown(model, cluster, scalar_plan(**single))
    local = float(ref.weights) / 2.0 * 8.0
    assert float(no_pp.buffers - ref.buffers) == pytest.approx(local * 2.0 * (1 - 1 / 8), rel=1e-6)


def test_torchtitan_keeps_gathered_weights_with_pp() -> None:
    assert Plan(framework="torchtitan", pp=2, global_batch=8).reshard_after_forward is False
    assert Plan(framework="torchtitan", global_batch=8).reshard_after_forward is True


def test_fp8_recipe_torchao_saves_bf16(scalar_plan: ScalarPlan) -> None:
    """Transformer Engine keeps the GEMM inputs as 1-byte casts; torchao's float8 keeps bf16:
    its activations equal the bf16 run's."""
    model = load_model("llama-3.1-8b")
    cluster = load_cluster("dgx-h100")
    bf16 = memory_breakdown(model, cluster, scalar_plan(precision="bf16"))
    te = memory_breakdown(model, cluster, scalar_plan(precision="fp8", fp8_recipe="te"))
    ao = memory_breakdown(model, cluster, scalar_plan(precision="fp8", fp8_recipe="torchao"))
    assert float(ao.activations) == pytest.approx(float(bf16.activations))
    assert float(te.activations) < float(bf16.activations)
    assert Plan(framework="torchtitan", precision="fp8").fp8_recipe == "torchao"


def test_offload_pcie_time_closed_form(scalar_plan: ScalarPlan) -> None:
    """Optimizer offload: 4 B per owned parameter and step over PCIe at 25 GB/s; with the
    parameters, 4 B more per micro-batch."""
    owned = 1e9
    opt = offload_transfer_time(owned, scalar_plan(offload="optimizer"))
    assert float(opt) == pytest.approx(owned * OFFLOAD_STEP_BYTES / PCIE_BYTES_PER_S)
    both = offload_transfer_time(owned, scalar_plan(offload="params+optimizer", global_batch=4))
    expected = owned * (OFFLOAD_STEP_BYTES + 4 * OFFLOAD_FETCH_BYTES) / PCIE_BYTES_PER_S
    assert float(both) == pytest.approx(expected)
    assert float(offload_transfer_time(owned, scalar_plan())) == 0.0


def test_offload_charged_in_step_time() -> None:
    model = load_model("llama-3.1-8b")
    cluster = load_cluster("dgx-h100")
    plan = Plan(dp=1, global_batch=1, recompute="full", offload="optimizer")
    est = estimate_step(model, cluster, plan)
    assert est.time_breakdown["optimizer"] == pytest.approx(
        model.params_total * OFFLOAD_STEP_BYTES / PCIE_BYTES_PER_S, rel=1e-6
    )
    assert est.memory_breakdown["optimizer_states"] == 0.0
    assert est.memory_detail["host"] == pytest.approx(12.0 * model.params_total, rel=1e-6)


def test_predict_cli_memory_flags(predict_json: PredictJson) -> None:
    doc = predict_json(
        [
            "predict", "--model", "llama-3.1-8b", "--gpu", "a100-80gb", "--gpus", "1",
            "--optimizer", "adamw8bit", "--master-weights", "none", "--recompute", "full",
            "--json",
        ]
    )  # fmt: skip
    assert doc["plan"]["optimizer"] == "adamw8bit"
    assert doc["memory_total_bytes"] == doc["memory_bytes"]
    assert doc["memory_allocated_bytes"] < doc["memory_reserved_bytes"] < doc["memory_bytes"]


def test_recompute_every_closed_form(scalar_plan: ScalarPlan) -> None:
    """recompute_every = N: 1/N of the layers keep their input, the rest everything; the
    recompute time and FLOPs are 1/N of full recompute's."""
    model = load_model("llama-3.1-8b")
    cluster = load_cluster("dgx-h100")
    base = dict(dp=8, sharding="zero3", global_batch=8)
    none = memory_breakdown(model, cluster, scalar_plan(**base))
    full = memory_breakdown(model, cluster, scalar_plan(**base, recompute="full"))
    half = memory_breakdown(
        model, cluster, scalar_plan(**base, recompute="full", recompute_every=2)
    )
    layers = model.n_layers
    kept_none = float(none.activations) / layers
    working = float(full.activations) - layers * 2.0 * model.hidden * model.seq_len
    kept_half = (float(half.activations) - working) / layers
    assert kept_half == pytest.approx(0.5 * 2.0 * model.hidden * model.seq_len + 0.5 * kept_none)
    t_full = estimate_step(model, cluster, Plan(**base, recompute="full"))
    t_half = estimate_step(model, cluster, Plan(**base, recompute="full", recompute_every=2))
    assert t_half.time_breakdown["recompute"] == pytest.approx(
        0.5 * t_full.time_breakdown["recompute"], rel=1e-9
    )
    assert float(recompute_share(scalar_plan(recompute="full", recompute_every=4))) == 0.25


def test_recompute_every_needs_full() -> None:
    with pytest.raises(ValueError, match="recompute_every"):
        Plan(recompute="selective", recompute_every=2)


def test_recompute_every_flops_and_blocks(scalar_plan: ScalarPlan) -> None:
    model = load_model("llama-3.1-8b")
    cluster = load_cluster("dgx-h100")
    full = estimate_step_arrays(model, cluster, scalar_plan(recompute="full"))
    half = estimate_step_arrays(model, cluster, scalar_plan(recompute="full", recompute_every=2))
    model_flops = float(full.model_flops_per_step)
    extra_full = float(full.hardware_flops_per_step) - model_flops
    extra_half = float(half.hardware_flops_per_step) - model_flops
    assert extra_half == pytest.approx(0.5 * extra_full)


@pytest.mark.parametrize(
    ("setup", "expected"),
    [
        ({}, 28.0),  # fp32 master + m, v: read 14, write 14 (C.2)
        ({"master_weights": "remainder"}, 24.0),
        ({"master_weights": "none"}, 14.0),  # read w, g, m, v (8); write w, m, v (6)
        ({"master_weights": "none", "optimizer": "adamw8bit"}, 6.0 + 4.0 + 4 * 4.0 / 2048.0),
        ({"optimizer": "sgd"}, 20.0),  # read master, momentum, grad; write master, momentum, w
    ],
)
def test_optimizer_step_bytes_closed_form(
    setup: dict[str, str], expected: float, scalar_plan: ScalarPlan
) -> None:
    assert float(optimizer_step_bytes(scalar_plan(**setup))) == pytest.approx(expected)


def test_optimizer_step_time_follows_the_bytes(scalar_plan: ScalarPlan) -> None:
    model, cluster = load_model("llama-3.1-8b"), load_cluster("dgx-h100")
    base = dict(dp=8, sharding="zero3", global_batch=8)
    adam = estimate_step(model, cluster, Plan(**base)).time_breakdown["optimizer"]
    low = estimate_step(model, cluster, Plan(**base, optimizer="adamw8bit", master_weights="none"))
    ratio = (
        float(optimizer_step_bytes(scalar_plan(optimizer="adamw8bit", master_weights="none"))) / 28
    )
    assert low.time_breakdown["optimizer"] == pytest.approx(adam * ratio, rel=1e-9)


def test_eager_elementwise_saves_more(scalar_plan: ScalarPlan) -> None:
    """Eager RMSNorm keeps an fp32 copy and a normalized bf16 tensor (+4 B per element and
    norm), eager SwiGLU the silu output (+2 B per F element), per layer and token."""
    model, cluster = load_model("llama-3.1-8b"), load_cluster("dgx-h100")
    fused = memory_breakdown(model, cluster, scalar_plan())
    eager = memory_breakdown(model, cluster, scalar_plan(fused_elementwise=False))
    tokens = model.seq_len
    per_layer = (
        EAGER_NORM_EXTRA * 2 * model.hidden * tokens + EAGER_SWIGLU_EXTRA * model.ffn * tokens
    )
    got = float(eager.activations - fused.activations)
    assert got == pytest.approx(model.n_layers * per_layer)
    assert EAGER_NORM_EXTRA == 4.0 and EAGER_SWIGLU_EXTRA == 2.0
    # full recompute keeps the layer input only; the re-run layer holds the eager extras (on
    # the reserved side: the working layer and the logits share the allocated peak)
    f_fused = memory_breakdown(model, cluster, scalar_plan(recompute="full"))
    f_eager = memory_breakdown(
        model, cluster, scalar_plan(recompute="full", fused_elementwise=False)
    )
    assert float(f_eager.reserved - f_fused.reserved) == pytest.approx(per_layer)


def test_torchtitan_op_sac_saved_set_closed_form(
    tiny: TransformerSpec, scalar_plan: ScalarPlan
) -> None:
    """torchtitan's per-op selective checkpointing keeps, per layer and token, the layer input
    and the outputs of wq, wv (odd matmuls), SDPA, w1 and w2: h + q + kv + q + F + h, bf16."""
    model = load_model("llama-3.1-8b")
    plans = scalar_plan(recompute="selective", selective_policy="torchtitan_op")
    per_token = 2 * model.hidden + 2 * model.q_dim + model.kv_dim + model.ffn
    expected = 2.0 * model.seq_len * per_token
    assert float(activation_bytes_per_layer(model, plans)) == pytest.approx(expected)
    # Megatron's selective set keeps the norm and GEMM inputs, K and the MLP gate and up
    megatron = float(activation_bytes_per_layer(model, scalar_plan(recompute="selective")))
    assert megatron > expected
    # GELU: the 6th matmul (w2) is even, so not kept
    gelu = tiny.model_copy(update={"mlp": "gelu"})
    got = float(activation_bytes_per_layer(gelu, plans))
    per = tiny.hidden + 2 * tiny.q_dim + tiny.kv_dim + tiny.ffn
    assert got == pytest.approx(2.0 * tiny.seq_len * per)
    # the framework's `selective` means its own policy
    assert Plan(framework="torchtitan").selective_policy == "torchtitan_op"
    assert Plan(framework="megatron-core").selective_policy == "megatron"


def test_cross_entropy_upcast_logits_closed_form(scalar_plan: ScalarPlan) -> None:
    """Logits per token and vocabulary entry: eager fp32 upcast 12 B allocated (+2 B reserved
    for the cached bf16 block), compiled 4 B, the default 8 B."""
    model, cluster = load_model("llama-3.1-8b"), load_cluster("dgx-h100")
    logits = model.seq_len * model.vocab
    base = memory_breakdown(model, cluster, scalar_plan())
    eager = memory_breakdown(model, cluster, scalar_plan(ce_upcast="eager"))
    compiled = memory_breakdown(model, cluster, scalar_plan(ce_upcast="compiled"))
    fused = memory_breakdown(model, cluster, scalar_plan(ce_upcast="eager", fused_ce=True))
    assert EAGER_FP32_LOGITS_BYTES == 12.0 and COMPILED_LOGITS_BYTES == 4.0
    assert float(eager.buffers - base.buffers) == pytest.approx(
        (EAGER_FP32_LOGITS_BYTES - LOGITS_BYTES) * logits
    )
    assert float(compiled.buffers - base.buffers) == pytest.approx(
        (COMPILED_LOGITS_BYTES - LOGITS_BYTES) * logits
    )
    assert float(eager.fragmentation - base.fragmentation) == pytest.approx(
        EAGER_FP32_CACHED_BYTES * logits
    )
    assert float(compiled.fragmentation) == pytest.approx(float(base.fragmentation))
    # a fused loss never holds the fp32 logits, whatever the upcast says
    assert float(fused.fragmentation) == pytest.approx(float(base.fragmentation))
    assert Plan(framework="torchtitan").ce_upcast == "eager"


def test_predict_cli_selective_policy_and_ce_flags(
    predict_json: PredictJson,
) -> None:
    args = ["predict", "--model", "llama-3.1-8b", "--gpu", "h100-sxm", "--gpus", "8",
            "--dp", "8", "--recompute", "selective", "--json"]  # fmt: skip
    plain = predict_json(args)
    flagged = predict_json([*args, "--selective-policy", "torchtitan_op", "--ce-upcast", "eager"])
    assert flagged["plan"]["selective_policy"] == "torchtitan_op"
    assert flagged["plan"]["ce_upcast"] == "eager"
    assert flagged["memory_bytes"] != plain["memory_bytes"]


def test_fp32_gradient_buffer_closed_form(scalar_plan: ScalarPlan) -> None:
    """An fp32 gradient buffer holds 4 B per parameter: unsharded under ZeRO-1 (Megatron's
    distributed optimizer shards only the states), divided by the group under ZeRO-2."""
    model, cluster = load_model("llama-3.1-8b"), load_cluster("dgx-h100")
    assert FP32_GRAD_BYTES == 4.0 and GRAD_BYTES == 2.0
    for sharding, divisor in (("zero1", 1.0), ("zero2", 8.0)):
        bf16 = memory_breakdown(model, cluster, scalar_plan(dp=8, sharding=sharding))
        fp32 = memory_breakdown(
            model, cluster, scalar_plan(dp=8, sharding=sharding, grad_accum_dtype="fp32")
        )
        assert float(fp32.gradients) == pytest.approx(2.0 * float(bf16.gradients))
        params = float(bf16.gradients) * divisor / GRAD_BYTES
        assert float(fp32.gradients) == pytest.approx(FP32_GRAD_BYTES * params / divisor)
        assert float(fp32.weights) == pytest.approx(float(bf16.weights))


def test_optimizer_in_backward_keeps_one_gradient(scalar_plan: ScalarPlan) -> None:
    """With the step fused into backward only the largest parameter's gradient is live: the
    V·h table for Llama 2 7B (32,000 × 4,096 bf16), sharded under ZeRO-3."""
    model, cluster = load_model("llama-2-7b"), load_cluster("dgx-h100")
    plans = scalar_plan(master_weights="none", optimizer_in_backward=True)
    assert float(largest_parameter(model, plans)) == model.vocab * model.hidden
    fused = memory_breakdown(model, cluster, plans)
    assert float(fused.gradients) == pytest.approx(GRAD_BYTES * model.vocab * model.hidden)
    plain = memory_breakdown(model, cluster, scalar_plan(master_weights="none"))
    assert float(plain.gradients) > 40 * float(fused.gradients)
    assert float(fused.weights) == pytest.approx(float(plain.weights))
    sharded = memory_breakdown(
        model, cluster,
        scalar_plan(dp=8, sharding="zero3", master_weights="none", optimizer_in_backward=True),
    )  # fmt: skip
    assert float(sharded.gradients) == pytest.approx(float(fused.gradients) / 8)


def test_device_total_rows_use_the_stated_fp32_gradients(
    memory_results: list[MemoryResult],
) -> None:
    """The nvidia-smi (pynvml) rows are compared with the device total, and their
    grad_accum_dtype cell is read: torch.amp keeps fp32 gradients, 4 B per parameter."""
    r = next(x for x in memory_results if x.run_id == "hf-bert-amp-gc")
    assert r.kind == "total" and r.estimate is not None and r.run is not None
    assert r.run.plan.grad_accum_dtype == "fp32"
    est = r.estimate
    assert r.predicted == pytest.approx(est.memory_total_bytes)
    assert est.memory_total_bytes - est.memory_reserved_bytes == pytest.approx(CUDA_CONTEXT_BYTES)
    # fp16 copy 2 B + fp32 gradients 4 B per parameter: gradients are twice the weights
    b = est.memory_breakdown
    assert b["gradients"] == pytest.approx(2 * b["weights"])
