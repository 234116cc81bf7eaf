"""Memory per GPU: ZeRO model states, Korthikanti activations, pipeline in-flight factor."""

from __future__ import annotations

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from shardmeter.estimate.memory import (
    activation_bytes_per_layer,
    chunk_layers,
    in_flight_layers,
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
    """1F1B: stage 0 holds min(p, m) micro-batches; interleaving 1 + (p−1)/(p·v) times that
    (Korthikanti et al. 2022 §4.2.3), in layer-micro-batches of a 4-layer stage."""
    plans = PlanArrays.from_columns(
        pp=np.array([1, 4, 4, 4]), vpp=np.array([1, 1, 2, 1]), global_batch=np.array([8, 8, 8, 2])
    )
    got = in_flight_layers(plans, 0.0, 4.0, 4.0 / plans.vpp, last=False)
    np.testing.assert_allclose(got, 4 * np.array([1, 4, 4 * (1 + 3 / 8), 2]))


def schedule_peak(p: int, v: int, m: int, n: int, rank: int, weights: list[float]) -> float:
    """Peak layer-micro-batches of one rank, by running the interleaved 1F1B order itself:
    W = 2(p−1−rank) + (v−1)·n warm-up forwards, then forward/backward pairs, then the
    cool-down; forward k runs chunk (k mod n·v) // n, backward k its mirror v − 1 − that."""
    total = m * v
    warm = min(2 * (p - rank - 1) + (v - 1) * n, total)
    held = peak = 0.0
    forwards = backwards = 0
    while forwards < total:
        held += weights[(forwards % (n * v)) // n]
        forwards += 1
        peak = max(peak, held)
        if forwards > warm:
            held -= weights[v - 1 - (backwards % (n * v)) // n]
            backwards += 1
    return peak


@settings(max_examples=150, derandomize=True, deadline=None)
@given(
    p=st.integers(2, 6), v=st.integers(2, 4), rounds=st.integers(1, 3), wide=st.booleans(),
    q=st.integers(1, 3), data=st.data(),
)  # fmt: skip
def test_in_flight_matches_the_schedule(
    p: int, v: int, rounds: int, wide: bool, q: int, data: st.DataObject
) -> None:
    """Every rank kind, chunk groups N = p or 2p, end stages short of layers in their end
    chunks (first: front, last: back): the closed form equals the schedule's own peak."""
    n = p * (2 if wide else 1)
    m = n * rounds
    short = data.draw(st.integers(0, q * v))
    plans = PlanArrays.from_columns(
        pp=p, vpp=v, global_batch=m, vpp_group=0 if n == p else n, pp_end_chunks=True
    )
    first = float(in_flight_layers(plans, 0.0, float(short), float(q), last=False))
    front = [float(chunk_layers(float(short), float(q), float(c), float(v))) for c in range(v)]
    assert first == pytest.approx(schedule_peak(p, v, m, n, 0, front))
    last = float(in_flight_layers(plans, p - 1.0, float(short), float(q), last=True))
    assert last == pytest.approx(schedule_peak(p, v, m, n, p - 1, front[::-1]))
    mid = float(in_flight_layers(plans, 1.0, float(q * v), float(q), last=p == 2))
    assert mid == pytest.approx(schedule_peak(p, v, m, n, 1, [float(q)] * v))


def test_llama3_405b_in_flight_by_rank() -> None:
    """Meta's layout, p 16, v 8 one-layer chunks, N = 16: the middle rank 1 holds Megatron's
    warm-up 2·14 + 7·16 plus one = 141 at m = 32; rank 0's first chunk (embedding only) holds
    31 of its 143, so 112; the last rank 7·16 + 1 = 113 (its head-only chunk is backwarded
    first, and a one-layer chunk's forward comes on top); at m = 16 all run forward first."""
    for m, expected in ((32, (112, 141, 113)), (16, (112, 128, 112))):
        plans = PlanArrays.from_columns(pp=16, vpp=8, global_batch=m, pp_end_chunks=True)
        got = (
            float(in_flight_layers(plans, 0.0, 7.0, 1.0, last=False)),
            float(in_flight_layers(plans, 1.0, 8.0, 1.0, last=False)),
            float(in_flight_layers(plans, 15.0, 7.0, 1.0, last=True)),
        )
        assert got == pytest.approx(expected)


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
    assert np.all(mem.overhead == mem.fragmentation + mem.cuda_context + mem.nccl_buffers)
    assert np.all(mem.overhead > 0)
    assert mem.buffers[1] > mem.buffers[0]
    assert mem.weights[1] == pytest.approx(mem.weights[0] / 8)
