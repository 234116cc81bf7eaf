"""Closed-form checks of ZeRO-Offload's gradients, the host-aware allocator rounding, the loss
and full-recompute peaks, the norm kind of eager layers, and the memory data's accuracy."""

from __future__ import annotations

from collections.abc import Callable

import pytest

from shardmeter.errors import UserInputError
from shardmeter.estimate.memory import (
    ACT_BYTES,
    EAGER_NORM_EXTRA,
    GRAD_BYTES,
    LOGITS_BYTES,
    ZERO_REDUCE_BUCKET,
    activation_bytes_per_layer,
    fragmentation_bytes,
    memory_breakdown,
    offload_transfer_time,
)
from shardmeter.estimate.plan_arrays import PlanArrays
from shardmeter.memcheck import (
    MemoryResult,
    memory_run_from_row,
    summarize_memory,
)
from shardmeter.specs.loader import load_cluster, load_model
from shardmeter.specs.model import TransformerSpec

ScalarPlan = Callable[..., PlanArrays]  # the `scalar_plan` fixture (conftest.py)


def test_zero_offload_keeps_one_reduce_bucket(
    tiny: TransformerSpec, scalar_plan: ScalarPlan
) -> None:
    """ZeRO-Offload (grads+optimizer): the GPU keeps the bf16 weights and one reduce bucket of
    5e8 gradient elements; the gradients, fp32 master and Adam states go to the host."""
    model, cluster = load_model("llama-3.1-8b"), load_cluster("dgx-h100")
    n = model.params_total
    mem = memory_breakdown(model, cluster, scalar_plan(offload="grads+optimizer"))
    assert ZERO_REDUCE_BUCKET == 5e8
    assert float(mem.gradients) == pytest.approx(GRAD_BYTES * 5e8)
    assert float(mem.weights) == pytest.approx(2.0 * n)
    assert float(mem.optimizer_states) == 0.0
    assert float(mem.host) == pytest.approx((12.0 + GRAD_BYTES) * n)
    # a model smaller than the bucket keeps its whole gradient in it
    small = memory_breakdown(tiny, cluster, scalar_plan(offload="grads+optimizer"))
    assert float(small.gradients) == pytest.approx(GRAD_BYTES * tiny.params_total)
    # optimizer-only offload keeps every gradient on the GPU
    opt = memory_breakdown(model, cluster, scalar_plan(offload="optimizer"))
    assert float(opt.gradients) == pytest.approx(GRAD_BYTES * n)
    assert float(opt.host) == pytest.approx(12.0 * n)


def test_zero_offload_step_pays_the_same_pcie_bytes(scalar_plan: ScalarPlan) -> None:
    """Gradients down and weights up once per step (4 B per owned parameter), as optimizer
    offload: ZeRO-Offload moves the gradients during backward instead of after it."""
    owned = 1e9
    t_opt = float(offload_transfer_time(owned, scalar_plan(offload="optimizer")))
    t_zo = float(offload_transfer_time(owned, scalar_plan(offload="grads+optimizer")))
    assert t_zo == pytest.approx(t_opt) and t_zo > 0.0


def test_full_recompute_working_layer_waits_for_the_loss(
    tiny: TransformerSpec, scalar_plan: ScalarPlan
) -> None:
    """Autograd runs the loss backward first and frees the logits before the last layer is
    re-run: allocated = layer inputs + max(working layer − logits, 0) + logits; the reserved
    side keeps both (the logits' segments stay cached)."""
    model, cluster = tiny, load_cluster("dgx-h100")
    for vocab in (1000, 200_000):  # working layer larger, then smaller, than the logits
        m = model.model_copy(update={"vocab": vocab})
        plans = scalar_plan(recompute="full")
        mem = memory_breakdown(m, cluster, plans)
        working = float(activation_bytes_per_layer(m, scalar_plan(recompute="none")))
        layer_input = ACT_BYTES * m.hidden * m.seq_len
        logits = LOGITS_BYTES * m.seq_len * vocab
        expected = m.n_layers * layer_input + max(working - logits, 0.0)
        assert float(mem.activations) == pytest.approx(expected)
        assert float(mem.buffers) == pytest.approx(logits)
        rounding = float(fragmentation_bytes(m, plans, float(m.n_layers), float(m.n_layers)))
        assert float(mem.fragmentation) == pytest.approx(rounding + min(working, logits))


def test_logits_bytes_closed_form(tiny: TransformerSpec, scalar_plan: ScalarPlan) -> None:
    """The loss without a separate upcast: 6 B per logit at its backward (saved log-softmax,
    NLL gradient, log-softmax gradient; or Megatron's in-place fp32 softmax and the cast)."""
    assert LOGITS_BYTES == 6.0
    mem = memory_breakdown(tiny, load_cluster("dgx-h100"), scalar_plan())
    assert float(mem.buffers) == pytest.approx(6.0 * tiny.seq_len * tiny.vocab)


def test_eager_layernorm_saves_what_a_fused_norm_saves(
    tiny: TransformerSpec, scalar_plan: ScalarPlan
) -> None:
    """Eager nn.LayerNorm is one native kernel (bf16 input and fp32 row statistics saved);
    only eager RMSNorm's Python upcast keeps the +4 B per element and norm."""
    cluster = load_cluster("dgx-h100")
    layer = tiny.model_copy(update={"norm": "layernorm"})
    fused = memory_breakdown(layer, cluster, scalar_plan())
    eager = memory_breakdown(layer, cluster, scalar_plan(fused_elementwise=False))
    assert float(eager.activations) == pytest.approx(float(fused.activations))
    rms_fused = memory_breakdown(tiny, cluster, scalar_plan())
    rms_eager = memory_breakdown(tiny, cluster, scalar_plan(fused_elementwise=False))
    extra = EAGER_NORM_EXTRA * 2 * tiny.hidden * tiny.seq_len * tiny.n_layers
    assert float(rms_eager.activations - rms_fused.activations) == pytest.approx(extra)


def test_memory_rows_norm_and_verdict_only_fits(memory_rows: list[dict[str, str]]) -> None:
    row = next(r for r in memory_rows if r["run_id"] == "rasbt-7-flash")
    assert memory_run_from_row(row).model.norm == "layernorm"
    with pytest.raises(UserInputError, match="norm"):
        memory_run_from_row({**row, "norm": "batchnorm"})
    fit = next(r for r in memory_rows if r["run_id"] == "ds-zero-offload-10b")
    run = memory_run_from_row(fit)
    assert run.measured is None and run.outcome == "fit"
    assert run.plan.offload == "grads+optimizer"


def test_memory_accuracy_targets(memory_results: list[MemoryResult]) -> None:
    """Over every measured row and per kind: median |error| <= 8%, p90 <= 15%, from >= 40 rows
    and >= 4 sources; the OOM verdict right on every row that reports a fit or an OOM."""
    summary = summarize_memory(memory_results)
    assert summary.overall.n >= 40 and len(summary.per_source) >= 4
    assert summary.overall.median_ape <= 0.08 and summary.overall.p90_ape <= 0.15
    # and per kind: allocated, reserved and device total each meet the same targets
    assert set(summary.per_kind) == {"allocated", "reserved", "total"}
    for errors in summary.per_kind.values():
        assert errors.median_ape <= 0.08 and errors.p90_ape <= 0.15
    assert summary.verdicts_right == summary.verdicts >= 45
    zero_offload = next(r for r in memory_results if r.run_id == "ds-zero-offload-10b")
    assert zero_offload.verdict_ok  # 10B on one 32 GB V100 fits only with the gradients off
