"""Closed-form checks of the caching allocator's per-tensor rounding (reserved − allocated)
and of the loss on vocabulary-sharded logits (DTensor loss_parallel) and the GEMM inputs DTensor
sequence parallelism saves."""

from __future__ import annotations

import math
from collections.abc import Callable
from typing import Any

import pytest

from shardmeter.estimate.memory import (
    EAGER_FP32_LOGITS_BYTES,
    LOSS_PARALLEL_LOGITS_BYTES,
    MIB,
    activation_bytes_per_layer,
    fragmentation_bytes,
    memory_breakdown,
    rounding_waste,
)
from shardmeter.estimate.plan_arrays import PlanArrays
from shardmeter.specs.loader import load_cluster
from shardmeter.specs.model import TransformerSpec
from shardmeter.specs.plan import Plan

ScalarPlan = Callable[..., PlanArrays]  # the `scalar_plan` fixture (conftest.py)
PredictJson = Callable[[list[str]], dict[str, Any]]  # the `predict_json` fixture

# h = 3000 and F = 8000: no tensor of this model is a whole multiple of 2 MiB
ODD = TransformerSpec(n_layers=2, hidden=3000, n_heads=24, ffn=8000, vocab=1000, seq_len=2048)
# BERT-large's shapes: every matrix and activation a whole multiple of 2 MiB (or under 10 MiB)
WHOLE = TransformerSpec(n_layers=2, hidden=1024, n_heads=16, ffn=4096, vocab=1000, seq_len=512)


def _waste(nbytes: float) -> float:
    """CUDACachingAllocator: requests of 10 MiB or more get a segment rounded up to 2 MiB."""
    if nbytes < 10 * 2**20:
        return 0.0
    return math.ceil(nbytes / 2**21) * 2**21 - nbytes


def _odd_sets() -> tuple[float, float, float, float, float]:
    """(row, mlp) activation waste and (bf16, fp32 weight, fp32 MLP) matrix waste of ODD."""
    row = _waste(2.0 * 2048 * 3000)  # tokens × h × 2 B (also Q, K, V and attention output)
    mlp = _waste(2.0 * 2048 * 8000)  # tokens × F × 2 B
    return row, mlp, _waste(2.0 * 3000 * 3000), _waste(4.0 * 3000 * 3000), _waste(4.0 * 3000 * 8000)


def test_rounding_waste_closed_form() -> None:
    """Under 10 MiB (kMinLargeAlloc) a request shares a segment: no waste; from 10 MiB on it
    gets a segment rounded up to 2 MiB (kRoundLarge)."""
    assert float(rounding_waste(9.9 * MIB)) == 0.0
    assert float(rounding_waste(10.0 * MIB)) == 0.0
    assert float(rounding_waste(10.0 * MIB + 1.0)) == pytest.approx(2.0 * MIB - 1.0)
    assert float(rounding_waste(11.0 * MIB)) == pytest.approx(1.0 * MIB)
    assert float(rounding_waste(12_288_000.0)) == pytest.approx(294_912.0)


def test_rounding_counts_every_tensor(scalar_plan: ScalarPlan) -> None:
    """No recompute, one GPU, AdamW with an fp32 master: each layer-micro-batch keeps the two
    norm inputs, the two GEMM inputs, Q, K, V and the attention output (tokens × h each here)
    and the GELU MLP's two tensors; each matrix keeps w and g (bf16), master, m, v (fp32)."""
    row, mlp, w16, w32, _ = _odd_sets()
    mlp16, mlp32 = _waste(2.0 * 3000 * 8000), _waste(4.0 * 3000 * 8000)
    got = float(fragmentation_bytes(ODD, scalar_plan(), held_layers=3.0, local_layers=2.0))
    saved = 8 * row + 2 * mlp
    per_matrix = 4 * (2 * w16 + 3 * w32) + 2 * (2 * mlp16 + 3 * mlp32)
    assert row > 0 and mlp > 0 and w16 > 0
    assert got == pytest.approx(3.0 * saved + 2.0 * per_matrix)


def test_rounding_by_recompute_mode(scalar_plan: ScalarPlan) -> None:
    """Selective drops the attention output and the activation-function output; full recompute
    keeps the layer input; recompute_every = 2 keeps everything in half the layers."""
    row, mlp, *_ = _odd_sets()
    states = float(fragmentation_bytes(ODD, scalar_plan(), 0.0, 1.0))
    sel = float(fragmentation_bytes(ODD, scalar_plan(recompute="selective"), 1.0, 1.0)) - states
    full = float(fragmentation_bytes(ODD, scalar_plan(recompute="full"), 1.0, 1.0)) - states
    every = scalar_plan(recompute="full", recompute_every=2)
    half = float(fragmentation_bytes(ODD, every, 1.0, 1.0)) - states
    assert sel == pytest.approx(7 * row + mlp)
    assert full == pytest.approx(row)
    assert half == pytest.approx(0.5 * row + 0.5 * (8 * row + 2 * mlp))


@pytest.mark.parametrize(
    ("offload", "kept"),
    [("none", "wgo"), ("optimizer", "wg"), ("grads+optimizer", "w"), ("params+optimizer", "")],
)
def test_rounding_counts_only_gpu_resident_state_tensors(
    offload: str, kept: str, scalar_plan: ScalarPlan
) -> None:
    """Offload moves the states (and with ZeRO-Offload the gradients, with the parameters all
    of them) to the host, where the CUDA allocator does not round them."""
    _, _, w16, w32, _ = _odd_sets()
    mlp16, mlp32 = _waste(2.0 * 3000 * 8000), _waste(4.0 * 3000 * 8000)
    plans = scalar_plan(
        offload=offload, sharding="zero3" if offload == "params+optimizer" else "none"
    )
    got = float(fragmentation_bytes(ODD, plans, 0.0, 1.0))
    attn = ("w" in kept) * w16 + ("g" in kept) * w16 + ("o" in kept) * 3 * w32
    ffn = ("w" in kept) * mlp16 + ("g" in kept) * mlp16 + ("o" in kept) * 3 * mlp32
    assert got == pytest.approx(4 * attn + 2 * ffn)


def test_rounding_of_sharded_states(scalar_plan: ScalarPlan) -> None:
    """Under ZeRO-3 over 4 GPUs every state tensor is a quarter matrix (FSDP2 shards each
    parameter on dim 0), rounded on its own."""
    got = float(fragmentation_bytes(ODD, scalar_plan(dp=4, sharding="zero3"), 0.0, 1.0))
    attn = 2 * _waste(2.0 * 9e6 / 4) + 3 * _waste(4.0 * 9e6 / 4)
    ffn = 2 * _waste(2.0 * 24e6 / 4) + 3 * _waste(4.0 * 24e6 / 4)
    assert got == pytest.approx(4 * attn + 2 * ffn)
    # ZeRO-1 shards only the master and the states
    z1 = float(fragmentation_bytes(ODD, scalar_plan(dp=4, sharding="zero1"), 0.0, 1.0))
    attn1 = 2 * _waste(2.0 * 9e6) + 3 * _waste(4.0 * 9e6 / 4)
    ffn1 = 2 * _waste(2.0 * 24e6) + 3 * _waste(4.0 * 24e6 / 4)
    assert z1 == pytest.approx(4 * attn1 + 2 * ffn1)


def test_whole_multiples_waste_nothing(scalar_plan: ScalarPlan) -> None:
    """BERT-large's 1024 × 1024 and 1024 × 4096 matrices (bf16 and fp32) and its 512-token
    activations are whole multiples of 2 MiB or under 10 MiB: no rounding at all."""
    assert float(fragmentation_bytes(WHOLE, scalar_plan(), 4.0, 2.0)) == 0.0


def test_loss_parallel_holds_sixteen_bytes_per_local_logit(
    scalar_plan: ScalarPlan,
) -> None:
    """The eager fp32 loss on logits sharded over tp (DTensor loss_parallel): saved
    log-softmax, zeros_like grad, exp and their sum, 16 B per local logit; 12 B without TP."""
    cluster = load_cluster("dgx-h100")
    model = ODD.model_copy(update={"vocab": 64_000})
    one = memory_breakdown(model, cluster, scalar_plan(ce_upcast="eager"))
    two = memory_breakdown(model, cluster, scalar_plan(tp=2, ce_upcast="eager"))
    logits = model.seq_len * model.vocab
    assert LOSS_PARALLEL_LOGITS_BYTES == 16.0 and EAGER_FP32_LOGITS_BYTES == 12.0
    assert float(one.buffers) == pytest.approx(12.0 * logits)
    assert float(two.buffers) == pytest.approx(16.0 * logits / 2)


def test_dtensor_sp_saves_the_gathered_gemm_inputs(scalar_plan: ScalarPlan) -> None:
    """With sequence parallelism over tp = 4, Megatron saves the sequence shard of the QKV and
    MLP GEMM inputs (all-gathered again in backward); DTensor SP saves the all-gathered,
    full-sequence input: 2 × h × s × (1 − 1/tp) × 2 B more per layer, and nothing without SP."""
    shard = activation_bytes_per_layer(ODD, scalar_plan(tp=4, sp=True))
    gathered = activation_bytes_per_layer(ODD, scalar_plan(tp=4, sp=True, sp_gathered_inputs=True))
    extra = 2.0 * ODD.hidden * ODD.seq_len * (1.0 - 1.0 / 4.0) * 2.0
    assert float(gathered - shard) == pytest.approx(extra)
    no_sp = scalar_plan(tp=4, sp=False, sp_gathered_inputs=True)
    assert float(activation_bytes_per_layer(ODD, no_sp)) == pytest.approx(
        float(activation_bytes_per_layer(ODD, scalar_plan(tp=4, sp=False)))
    )
    # torchtitan's default with TP; Megatron-style frameworks keep the shard
    assert Plan(framework="torchtitan", tp=2).sp_gathered_inputs
    assert not Plan(framework="torchtitan").sp_gathered_inputs
    assert not Plan(framework="megatron-lm", tp=2).sp_gathered_inputs


def test_predict_cli_sp_gathered_inputs(
    predict_json: PredictJson,
) -> None:
    args = ["predict", "--model", "llama-3.1-8b", "--gpu", "h100-sxm", "--gpus", "8",
            "--tp", "8", "--sp", "--json"]  # fmt: skip
    plain = predict_json([*args, "--no-sp-gathered-inputs"])
    flagged = predict_json([*args, "--sp-gathered-inputs"])
    assert flagged["plan"]["sp_gathered_inputs"] is True
    assert flagged["memory_bytes"] > plain["memory_bytes"]


def test_torch_pipelining_keeps_stage_outputs(scalar_plan: ScalarPlan) -> None:
    """1F1B over pp = 4 with 8 micro-batches: the first stage has min(p, m) = 4 micro-batches
    in flight and, with pp_keeps_outputs, keeps its output (one layer input) of each."""
    model = ODD.model_copy(update={"n_layers": 8})
    cluster = load_cluster("dgx-h100")
    base = {"pp": 4, "micro_batch": 1, "global_batch": 8, "recompute": "full"}
    plain = memory_breakdown(model, cluster, scalar_plan(**base))
    kept = memory_breakdown(model, cluster, scalar_plan(**base, pp_keeps_outputs=True))
    layer_input = 2.0 * model.hidden * model.seq_len
    assert float(kept.activations - plain.activations) == pytest.approx(4 * layer_input)
    one = {"micro_batch": 1, "global_batch": 8, "recompute": "full"}
    assert float(
        memory_breakdown(model, cluster, scalar_plan(**one, pp_keeps_outputs=True)).total
    ) == (pytest.approx(float(memory_breakdown(model, cluster, scalar_plan(**one)).total)))
    assert Plan(framework="torchtitan", pp=2).pp_keeps_outputs
    assert not Plan(framework="megatron-lm", pp=2).pp_keeps_outputs


def test_selective_recompute_rebuilds_what_it_left_out(
    scalar_plan: ScalarPlan,
) -> None:
    """During a selectively checkpointed layer's backward, the tensors the selective set left
    out are recomputed beside everything kept: allocated = L × selective set + max(everything
    − selective set − logits, 0) + logits (the loss backward frees the logits first)."""
    cluster = load_cluster("dgx-h100")
    for policy in ("megatron", "torchtitan_op"):
        plans = scalar_plan(recompute="selective", selective_policy=policy)
        mem = memory_breakdown(ODD, cluster, plans)
        kept = float(activation_bytes_per_layer(ODD, plans))
        everything = float(activation_bytes_per_layer(ODD, scalar_plan()))
        logits = 6.0 * ODD.seq_len * ODD.vocab
        assert everything - kept > logits  # the rebuilt tensors outweigh the logits here
        expected = ODD.n_layers * kept + everything - kept - logits
        assert float(mem.activations) == pytest.approx(expected)
