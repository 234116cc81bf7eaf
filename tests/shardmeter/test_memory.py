"""Memory per GPU: ZeRO model states, Korthikanti activations, pipeline in-flight factor."""

from __future__ import annotations

import numpy as np
import pytest

from shardmeter.estimate.memory import (
    activation_bytes_per_layer,
    in_flight_micro_batches,
    korthikanti_activation_bytes,
    local_params,
    memory_breakdown,
    model_state_bytes,
)
from shardmeter.estimate.plan_arrays import PlanArrays
from shardmeter.specs.hardware import Accelerator, Cluster, Link
from shardmeter.specs.model import TransformerSpec

GPT3 = TransformerSpec(n_layers=96, hidden=12288, n_heads=96, ffn=49152, vocab=51200, seq_len=2048)
CLUSTER = Cluster(
    accelerator=Accelerator(name="g", peak_tflops={"bf16": 300.0}, hbm_gb=80, hbm_gbps=2000),
    gpus_per_node=8,
    nvlink_domain=8,
    intra=Link(bandwidth_gbps=300),
    inter=Link(bandwidth_gbps=25),
)


@pytest.mark.parametrize(("stage", "expected_gb"), [(0, 120.0), (1, 31.4), (2, 16.6), (3, 1.875)])
def test_zero_paper_example(stage: int, expected_gb: float) -> None:
    """ZeRO paper Fig. 1: 7.5B parameters, 64-way DP: 120 GB -> 31.4 / 16.6 / 1.9 GB."""
    states = model_state_bytes(7.5e9, 64, stage)
    assert float(states.total) / 1e9 == pytest.approx(expected_gb, abs=0.05)


def test_zero_components() -> None:
    s1 = model_state_bytes(1e9, 8, 1)
    assert (float(s1.weights), float(s1.gradients), float(s1.optimizer)) == (2e9, 2e9, 1.5e9)
    s3 = model_state_bytes(1e9, 8, 3)
    assert float(s3.weights) == 0.25e9


def test_korthikanti_table2() -> None:
    """Korthikanti et al. 2022 Table 2 for GPT-3 (s=2048, b=1, h=12288, a=96) at t = 8."""
    s, b, h, a, t = 2048, 1, 12288, 96, 8
    sbh = s * b * h
    assert korthikanti_activation_bytes(s, b, h, a) == pytest.approx(sbh * (34 + 5 * a * s / h))
    assert korthikanti_activation_bytes(s, b, h, a, t) == pytest.approx(
        sbh * (10 + 24 / t + 5 * a * s / (h * t))
    )
    assert korthikanti_activation_bytes(s, b, h, a, t, sp=True) == pytest.approx(
        sbh * (34 + 5 * a * s / h) / t
    )
    assert korthikanti_activation_bytes(s, b, h, a, t, recompute="selective") == pytest.approx(
        sbh * (10 + 24 / t)
    )
    assert korthikanti_activation_bytes(
        s, b, h, a, t, sp=True, recompute="selective"
    ) == pytest.approx(34 * sbh / t)
    assert korthikanti_activation_bytes(s, b, h, a, t, recompute="full") == 2 * sbh
    assert korthikanti_activation_bytes(s, b, h, a, t, sp=True, recompute="full") == 2 * sbh / t


def test_recount_matches_korthikanti_without_dropout_and_scores() -> None:
    """For a GPT layer our flash/no-dropout recount is Korthikanti's minus the 2sbh dropout
    masks and the 5as²b score term: 32sbh/t with SP, (8 + 24/t)sbh without."""
    s, h, t = 2048, 12288, 8
    plans = PlanArrays.from_columns(tp=t, sp=np.array([True, False]), micro_batch=1)
    got = activation_bytes_per_layer(GPT3, plans)
    np.testing.assert_allclose(got, [32 * s * h / t, (8 + 24 / t) * s * h])
    full = activation_bytes_per_layer(GPT3, PlanArrays.from_columns(tp=t, sp=True, recompute=2))
    assert float(full[()]) == pytest.approx(
        korthikanti_activation_bytes(s, 1, h, 96, t, True, "full")
    )


def test_fp8_saves_gemm_inputs_in_one_byte() -> None:
    """FP8 (Transformer Engine) keeps the two norm outputs and the GELU output as 1-byte casts:
    a GPT layer with SP saves (32 − 2·1 − 4·1)·sbh/t = 26·sbh/t bytes instead of 32·sbh/t
    (norm outputs h each, GELU output 4h per token, all /t with SP or tp)."""
    s, h, t = 2048, 12288, 8
    plans = PlanArrays.from_columns(tp=t, sp=True, precision=np.array([0, 2]))
    got = activation_bytes_per_layer(GPT3, plans)
    np.testing.assert_allclose(got, [32 * s * h / t, 26 * s * h / t])


def test_pipeline_in_flight() -> None:
    """1F1B: stage 0 holds p micro-batches; interleaving multiplies by 1 + (p−1)/(p·v)."""
    plans = PlanArrays.from_columns(
        pp=np.array([1, 4, 4, 4]), vpp=np.array([1, 1, 2, 1]), global_batch=np.array([8, 8, 8, 2])
    )
    np.testing.assert_allclose(in_flight_micro_batches(plans), [1, 4, 4 * (1 + 3 / 8), 2])


def test_params_divided_by_tp_pp() -> None:
    one = local_params(GPT3, PlanArrays.from_columns())
    assert float(one.total[()]) == pytest.approx(GPT3.params_total)
    split = local_params(GPT3, PlanArrays.from_columns(tp=8, pp=4))
    expected = (GPT3.params_non_embedding / 4 + GPT3.vocab * GPT3.hidden) / 8
    assert float(split.total[()]) == pytest.approx(expected)


def test_breakdown_has_overhead_and_fsdp_buffer() -> None:
    mem = memory_breakdown(
        GPT3, CLUSTER, PlanArrays.from_columns(dp=8, sharding=np.array([2, 3]), shard_group=8)
    )
    assert np.all(mem.overhead == CLUSTER.memory_overhead_gb * 1e9)
    assert mem.buffers[1] > mem.buffers[0]
    assert mem.weights[1] == pytest.approx(mem.weights[0] / 8)
