"""Islands fidelity: overlap, fragment schedules, given step times, payload families,
object storage, failures and churn. Closed forms, properties and one-line errors."""

from __future__ import annotations

import dataclasses
import json
import math
from pathlib import Path
from typing import Any

import numpy as np
import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from shardmeter.cli import main
from shardmeter.errors import UserInputError
from shardmeter.estimate.churn import daly_interval_s
from shardmeter.estimate.islands import (
    IslandInput,
    TopologyEstimate,
    check_payload_memory,
    compose,
    predict_topology,
    with_step_times,
    with_wan,
)
from shardmeter.estimate.outer import outer_round
from shardmeter.estimate.payload import lowrank_bits, resolve_payload
from shardmeter.estimate.result import StepEstimate
from shardmeter.estimate.wan import WanPaths, wan_paths
from shardmeter.specs.loader import load_model
from shardmeter.specs.plan import Plan
from shardmeter.specs.topology import (
    TOPOLOGY_DIR,
    FailureSpec,
    OuterSpec,
    PayloadSpec,
    load_topology,
    topology_from_dict,
)

# fixed seeds: the same examples on every run (CI or not)
PROPS = settings(
    max_examples=15,
    deadline=None,
    derandomize=True,
    suppress_health_check=[HealthCheck.too_slow],
)
MODES = ["sync", "diloco", "streaming", "async"]


def step(seconds: float, tokens: float, n_gpus: int, backward: float = 0.0) -> StepEstimate:
    return StepEstimate(
        step_time_s=seconds,
        time_breakdown={"compute": seconds},
        memory_breakdown={},
        tokens_per_step=tokens,
        n_gpus=n_gpus,
        tokens_per_s=tokens / seconds,
        tokens_per_s_per_gpu=tokens / seconds / n_gpus,
        mfu=0.4,
        hfu=0.4,
        memory_bytes=1e9,
        hbm_bytes=80e9,
        fits=True,
        bottleneck="compute",
        regime="compute-bound",
        backward_window_s=backward,
    )


def two_islands(gbit: float = 10.0, rtt_ms: float = 0.0) -> WanPaths:
    data = {
        "islands": [{"name": "a", "cluster": "dgx-h100"}, {"name": "b", "cluster": "dgx-h100"}],
        "wan": {"default": {"bandwidth_gbit": gbit, "latency_ms": rtt_ms}},
    }
    return wan_paths(topology_from_dict(data))


# --- overlap: closed forms ---------------------------------------------------------------------


def test_sync_dp_gradient_exchange_hides_behind_the_backward_bucket_by_bucket() -> None:
    """K per-layer buckets released evenly over a backward of b seconds on a FIFO link: the
    exchange ends at max(start + b/K + c, end + c/K), so exposed = max(c/K, c − b(1 − 1/K))."""
    wan = two_islands(gbit=8.0)  # 1 GB/s
    inner = np.array([1.0, 1.0])
    for gbytes in (0.01, 0.5, 0.8, 3.0):
        c = 2 * (1 / 2) * gbytes  # ring all-reduce of two islands sends M per island
        rnd = outer_round(
            "sync", inner, wan, gbytes * 1e9 / 2, bits=16, backward_s=[0.6, 0.6], buckets=[30, 30]
        )
        exposed = max(c / 30, c - 0.6 * (1 - 1 / 30))
        np.testing.assert_allclose(rnd.wan_exposed_s, exposed, rtol=1e-9)
        off = outer_round("sync", inner, wan, gbytes * 1e9 / 2, bits=16, buckets=[30, 30])
        np.testing.assert_allclose(off.wan_exposed_s, c, rtol=1e-9)


def test_eager_overlap_is_link_bound_and_streaming_tau_can_be_a_whole_round() -> None:
    wan = two_islands(gbit=8.0)
    inner = np.array([0.1, 0.1])
    # 4 GB per round over 1 GB/s: 4 s per 10 s round hides; 20 s does not (the link carries
    # one round per round: exposed = 20 − 10)
    for gbytes, exposed in ((4.0, 0.0), (20.0, 10.0)):
        n = gbytes * 1e9 / 0.5  # 4-bit payload
        eager = outer_round("diloco", inner, wan, n, inner_steps=100, bits=4, overlap=True)
        np.testing.assert_allclose(eager.wan_exposed_s, exposed, atol=1e-9)
        whole = outer_round(
            "streaming", inner, wan, n, inner_steps=100, bits=4, fragments=8, overlap_steps=100
        )
        np.testing.assert_allclose(whole.wan_exposed_s, exposed, atol=1e-9)


def test_file_cli_text_and_python_take_the_same_schedules() -> None:
    """H = 30 with 8 fragments (the eager paper's setting) is allowed; P and an explicit list
    mean the same thing whether they come from the file, as text or as Python values."""
    base: dict[str, Any] = {
        "run": {
            "model": "llama-3-8b",
            "global_batch": 64,
            "mode": "streaming",
            "inner_steps": 30,
            "fragments": 8,
            "overlap_steps": 1,
        },
        "islands": [{"name": "a", "cluster": "dgx-h100"}, {"name": "b", "cluster": "dgx-h100"}],
        "wan": {"default": {"bandwidth_gbit": 0.5, "latency_ms": 50}},
    }
    topo = topology_from_dict(base)
    even = predict_topology(topo)
    assert even.utilization < 1.0  # the WAN matters here, so the schedules are compared
    for same in (predict_topology(topo, fragments="8"), predict_topology(topo, fragments=8)):
        assert _numbers(same) == _numbers(even)
    listed = [{"offset": round(k * 30 / 8), "layers": 4} for k in range(8)]  # 32 layers
    run = {**base["run"], "fragments": listed}
    from_table = predict_topology(topology_from_dict({**base, "run": run}))
    text = ",".join(f"{f['offset']}:{f['layers']}" for f in listed)
    for same in (predict_topology(topo, fragments=text), predict_topology(topo, fragments=listed)):
        assert _numbers(same) == _numbers(from_table)
    # a listed schedule holds consecutive layers, P even fragments strided ones: both hide
    # most of the exchange, the same bytes cross the WAN
    assert from_table.wan_bytes_per_round == pytest.approx(even.wan_bytes_per_round)


def test_cli_accepts_the_schedule_the_file_accepts(capsys: pytest.CaptureFixture[str]) -> None:
    argv = ["predict", "--topology", "two-clouds", "--mode", "streaming", "--json"]
    assert main([*argv, "--fragments", "8"]) == 0
    p8 = json.loads(capsys.readouterr().out)
    topo = load_topology("two-clouds")
    assert p8["utilization"] == predict_topology(topo, mode="streaming", fragments=8).utilization
    text = ",".join(f"{round(k * 100 / 8)}:4" for k in range(8))
    assert main([*argv, "--fragments", text]) == 0
    listed = json.loads(capsys.readouterr().out)
    api = predict_topology(topo, mode="streaming", fragments=text)
    assert listed["utilization"] == api.utilization
    assert main([*argv, "--fragments", "0:8,50:8"]) == 2  # 16 of llama-3-8b's 32 layers
    err = capsys.readouterr().err
    assert "run.fragments: got '2 fragments of 16 layers'; must cover the model's 32" in err
    assert err.count("\n") == 1


# --- properties ---------------------------------------------------------------------------------


@st.composite
def islands(draw: st.DrawFn) -> tuple[list[IslandInput], WanPaths, int]:
    n = draw(st.integers(2, 5))
    names = [f"isl{k}" for k in range(n)]
    link = {
        "bandwidth_gbit": draw(st.floats(0.05, 400.0)),
        "latency_ms": draw(st.floats(0.0, 300.0)),
        "egress_usd_per_gb": draw(st.floats(0.0, 0.1)),
    }
    star = draw(st.booleans())
    wan: dict[str, Any] = (
        {"kind": "star", "hub": names[0], "default": link} if star else {"default": link}
    )
    data = {"islands": [{"name": x, "cluster": "dgx-h100"} for x in names], "wan": wan}
    inputs = []
    for name in names:
        seconds = draw(st.floats(0.05, 20.0))
        inputs.append(
            IslandInput(
                name,
                step(seconds, draw(st.floats(1e4, 4e6)), 8, seconds * draw(st.floats(0, 0.7))),
                price_per_gpu_hour=2.0,
                hbm_Bps=3e12,
                buckets=draw(st.integers(1, 96)),
            )
        )
    return inputs, wan_paths(topology_from_dict(data)), draw(st.integers(10**8, 10**11))


@st.composite
def outers(draw: st.DrawFn, mode: str | None = None) -> OuterSpec:
    h = draw(st.sampled_from([1, 3, 8, 30, 100]))
    p = draw(st.integers(1, min(h, 8)))
    listed = draw(st.booleans())
    fragments: Any = p
    if listed:
        offsets = draw(st.lists(st.integers(0, h - 1), min_size=1, max_size=4))
        fragments = [{"offset": o, "layers": draw(st.integers(1, 8))} for o in offsets]
    return OuterSpec(
        mode=mode or draw(st.sampled_from(MODES)),
        inner_steps=h,
        bits=draw(st.sampled_from([16, 8, 4])),
        fragments=fragments,
        overlap_steps=draw(st.integers(0, h)),
        outer_overlap=draw(st.booleans()),
        backward_overlap=draw(st.booleans()),
        reduce=draw(st.sampled_from(["ring", "hub"])),
        balance_steps=draw(st.booleans()),
    )


@pytest.mark.slow
@pytest.mark.parametrize("mode", MODES)
@PROPS
@given(data=st.data())
def test_enabling_any_overlap_never_lowers_utilization(mode: str, data: st.DataObject) -> None:
    """Each switch on its own, from any starting setting, in every mode: the backward overlap
    (sync DP's bucketed gradients, every fragment's layers), τ one step more and a whole round
    (streaming), the eager outer overlap (DiLoCo, streaming)."""
    inputs, wan, n_params = data.draw(islands())
    outer = data.draw(outers(mode))
    base = compose(inputs, wan, n_params, outer, 1e12)
    more = [
        {"backward_overlap": True},
        {"outer_overlap": True},
        {"overlap_steps": min(outer.inner_steps, outer.overlap_steps + 1)},
        {"overlap_steps": outer.inner_steps},
        {"backward_overlap": True, "outer_overlap": True, "overlap_steps": outer.inner_steps},
    ]
    for change in more:
        better = compose(inputs, wan, n_params, outer.model_copy(update=change), 1e12)
        assert better.utilization >= base.utilization - 1e-9, change
        assert better.tokens_per_s >= base.tokens_per_s * (1 - 1e-9), change
        assert better.wan_bytes_per_round == pytest.approx(base.wan_bytes_per_round), change


@pytest.mark.slow
@pytest.mark.parametrize("mode", MODES)
@PROPS
@given(data=st.data(), faster=st.floats(1.01, 1000.0))
def test_more_bandwidth_never_lowers_utilization(
    mode: str, data: st.DataObject, faster: float
) -> None:
    inputs, wan, n_params = data.draw(islands())
    outer = data.draw(outers(mode))
    base = compose(inputs, wan, n_params, outer, 1e12)
    wider = compose(inputs, wan.scaled(faster), n_params, outer, 1e12)
    assert wider.utilization >= base.utilization - 1e-9
    assert wider.tokens_per_s >= base.tokens_per_s * (1 - 1e-9)


def _numbers(est: TopologyEstimate) -> dict[str, Any]:
    """Every figure of an estimate, without the label that says where step times came from."""
    out = dataclasses.asdict(est)
    for isl in out["islands"]:
        isl.pop("step_source")
    return out


@pytest.mark.parametrize("mode", ["sync", "diloco", "streaming", "async"])
def test_a_given_step_time_equal_to_the_predicted_one_changes_nothing(mode: str) -> None:
    topo = load_topology("two-clouds")
    predicted = predict_topology(topo, mode=mode, fragments=4, overlap_steps=1)
    times = {isl.name: isl.step.step_time_s for isl in predicted.islands}
    given_est = predict_topology(
        with_step_times(topo, times), mode=mode, fragments=4, overlap_steps=1
    )
    assert {isl.step_source for isl in given_est.islands} == {"given"}
    assert _numbers(given_est) == _numbers(predicted)


def test_a_given_step_time_replaces_the_prediction_and_keeps_its_shares() -> None:
    topo = load_topology("two-clouds")
    est = predict_topology(with_step_times(topo, "aws-us-east-1=20"), mode="sync")
    aws, neo = est.islands
    assert (aws.step_source, neo.step_source) == ("given", "predicted")
    assert aws.step.step_time_s == 20.0
    assert aws.step.backward_window_s / 20.0 == pytest.approx(
        neo.step.backward_window_s / neo.step.step_time_s, rel=0.05
    )
    assert sum(aws.step.time_breakdown.values()) == pytest.approx(20.0)
    assert est.bottleneck.island == "aws-us-east-1"  # the given slow island now paces
    assert predict_topology(topo, step_time_s=20.0).islands[1].step_source == "given"


@pytest.mark.slow
@pytest.mark.parametrize("mode", MODES)
@PROPS
@given(
    data=st.data(),
    ckpt=st.floats(0.0, 7200.0),
    restart=st.floats(0.0, 3600.0),
    quorum=st.sampled_from([None, 1, 2]),
    grace=st.floats(0.0, 600.0),
)
def test_a_failure_rate_of_zero_reproduces_the_failure_free_numbers(
    mode: str,
    data: st.DataObject,
    ckpt: float,
    restart: float,
    quorum: int | None,
    grace: float,
) -> None:
    """No MTBF (a zero failure rate) with any restart, checkpoint cost, quorum and grace: every
    figure equals the failure-free estimate's, in every mode; a vanishing rate converges to it."""
    inputs, wan, n_params = data.draw(islands())
    outer = data.draw(outers(mode))
    plain = compose(inputs, wan, n_params, outer, 1e12)
    zero = FailureSpec(checkpoint_s=ckpt, restart_s=restart, quorum=quorum, grace_s=grace)
    same = compose(inputs, wan, n_params, outer.model_copy(update={"failures": zero}), 1e12)
    ours, theirs = _numbers(same), _numbers(plain)
    assert ours.pop("failures")["goodput"] == theirs.pop("failures")["goodput"] == 1.0
    assert ours.pop("settings").failures == zero  # the inputs differ, not the figures
    theirs.pop("settings")
    assert ours == theirs
    rare = FailureSpec(gpu_mtbf_hours=1e15, checkpoint_s=ckpt, restart_s=restart)
    nearly = compose(inputs, wan, n_params, outer.model_copy(update={"failures": rare}), 1e12)
    assert nearly.tokens_per_s == pytest.approx(plain.tokens_per_s, rel=1e-4)
    assert nearly.utilization == pytest.approx(plain.utilization, rel=1e-4)
    assert nearly.cost_usd == pytest.approx(plain.cost_usd, rel=1e-4)


# --- failures and churn --------------------------------------------------------------------------


def test_sync_stalls_everyone_async_and_quorum_lose_only_the_failed_island() -> None:
    inputs = [IslandInput(f"i{k}", step(1.0, 1e6, 8), price_per_gpu_hour=2.0) for k in range(4)]
    wan = two_islands(gbit=100.0)
    wan = WanPaths(
        tuple(f"i{k}" for k in range(4)),
        np.where(np.eye(4, dtype=bool), np.inf, 100e9 / 8),
        np.zeros((4, 4)),
        np.zeros((4, 4)),
        (0, 1, 2, 3),
        0,
    )
    fail = FailureSpec(island_mtbf_hours=10.0, restart_s=600.0)
    lam = 1 / 36000.0
    sync = compose(
        inputs, wan, 10**9, OuterSpec(mode="diloco", inner_steps=100, failures=fail), 1e12
    )
    rework = sync.islands[0].round_s / 2  # peers hold the model of the last outer step
    assert sync.failures.shared_stall
    assert sync.failures.goodput == pytest.approx(1 / (1 + 4 * lam * (600 + rework)), rel=1e-9)
    quorum = fail.model_copy(update={"quorum": 3, "grace_s": 30.0})
    q = compose(
        inputs, wan, 10**9, OuterSpec(mode="diloco", inner_steps=100, failures=quorum), 1e12
    )
    assert not q.failures.shared_stall
    assert q.failures.goodput == pytest.approx(
        1 / (1 + lam * (600 + rework) + 3 * lam * 30), rel=1e-9
    )
    asyn = compose(
        inputs, wan, 10**9, OuterSpec(mode="async", inner_steps=100, failures=fail), 1e12
    )
    assert asyn.failures.goodput > q.failures.goodput > sync.failures.goodput
    assert sync.wall_s == pytest.approx(sync.failures.wall_s_failure_free / sync.failures.goodput)
    assert sync.cost_usd > sync.failures.cost_usd_failure_free
    assert sync.failures.failures_per_day == pytest.approx(4 * 24 / 10.0)


def test_rounds_lost_to_failures_move_no_wan_bytes_and_pay_no_egress() -> None:
    """A shared stall repeats no exchange: the rounds that reach the token budget are the same
    with and without failures, so WAN bytes and egress are too; only GPU time grows."""
    topo = load_topology("two-clouds")
    free = predict_topology(topo, mode="diloco", tokens=1e11)
    hit = predict_topology(
        topo, mode="diloco", tokens=1e11, failures="gpu_mtbf_hours=2000,restart_s=3600"
    )
    assert hit.failures.shared_stall and hit.failures.goodput < 0.99
    assert hit.wan_bytes_total == pytest.approx(free.wan_bytes_total, rel=1e-12)
    assert hit.egress_cost_usd == pytest.approx(free.egress_cost_usd, rel=1e-12)
    assert free.egress_cost_usd > 0
    assert hit.gpu_cost_usd == pytest.approx(free.gpu_cost_usd / hit.failures.goodput, rel=1e-9)


def test_per_gpu_mtbf_scales_with_island_size_and_young_daly_interval() -> None:
    inputs = [
        IslandInput("big", step(1.0, 1e6, 64), price_per_gpu_hour=2.0),
        IslandInput("small", step(1.0, 1e6, 8), price_per_gpu_hour=2.0),
    ]
    fail = FailureSpec(gpu_mtbf_hours=64_000.0, checkpoint_s=100.0)
    est = compose(inputs, two_islands(), 10**9, OuterSpec(mode="async", failures=fail), 1e12)
    assert [isl.mtbf_hours for isl in est.islands] == pytest.approx([1000.0, 8000.0])
    assert est.islands[0].goodput < est.islands[1].goodput
    m = 1000.0 * 3600  # async: the big island's own MTBF is what stalls its work
    assert est.failures.optimal_interval_s == pytest.approx(math.sqrt(2 * 100 * m) - 100)
    assert daly_interval_s(100.0, 150.0) == 150.0  # C ≥ M/2: checkpoint every MTBF
    assert daly_interval_s(0.0, 1e6) == math.inf == daly_interval_s(100.0, math.inf)


# --- payload families and object storage -----------------------------------------------------


def test_payload_bits_per_parameter_count_indices_and_scales() -> None:
    model = load_model("llama-3-8b")
    topk = resolve_payload(PayloadSpec(kind="topk", fraction=0.01), 16, model)
    assert topk.bits_per_param == pytest.approx(0.01 * (16 + 32)) and topk.gathered
    assert topk.extra_bytes_per_param == 4.0  # the fp32 error-feedback residual
    sign = resolve_payload(PayloadSpec(kind="sign", group=64, scale_bits=32), 16, model)
    assert sign.bits_per_param == pytest.approx(1 + 32 / 64)
    dct = resolve_payload(PayloadSpec(kind="dct_topk", fraction=1 / 16, chunk=64), 16, model)
    assert dct.bits_per_param == pytest.approx((16 + 16) / 16)
    low = resolve_payload(PayloadSpec(kind="lowrank", rank=4, value_bits=16), 16, model)
    h, f, q, kv, v = model.hidden, model.ffn, model.q_dim, model.kv_dim, model.vocab
    sent = 32 * (4 * (h + q) * 2 + 4 * (h + kv) * 2 + 3 * 4 * (h + f)) + 2 * 4 * (v + h)
    total = 32 * (2 * h * q + 2 * h * kv + 3 * h * f) + 2 * v * h
    assert low.bits_per_param == pytest.approx(16 * sent / total)
    assert lowrank_bits(model, 4, 16) == low.bits_per_param and low.rounds == 2
    dense = resolve_payload(PayloadSpec(), 8, model)
    assert (dense.bits_per_param, dense.gathered, dense.extra_bytes_per_param) == (8.0, False, 0.0)


def test_gathered_payloads_cost_m_minus_one_copies_and_objects_storage_egress() -> None:
    base: dict[str, Any] = {
        "run": {"model": "llama-3-8b", "global_batch": 64, "mode": "diloco", "bits": 16},
        "islands": [{"name": f"i{k}", "cluster": "dgx-h100"} for k in range(4)],
        "wan": {
            "default": {"bandwidth_gbit": 10, "latency_ms": 0},
            "bucket": {"bandwidth_gbit": 5, "latency_ms": 40, "egress_usd_per_gb": 0.09},
        },
    }
    topo = topology_from_dict(base)
    n = predict_topology(topo).n_params
    topk = predict_topology(topo, payload="topk:fraction=0.05,value_bits=16,index_bits=16")
    m = n * 0.05 * 32 / 8
    assert topk.islands[0].wan_bytes_per_round == pytest.approx(3 * m)  # ring all-gather
    bucket = predict_topology(topo, payload="topk:fraction=0.05,index_bits=16", reduce="bucket")
    assert bucket.islands[0].wan_bytes_per_round == pytest.approx(m + 3 * m)  # up once, down 3×
    rounds = bucket.wall_s / bucket.islands[0].round_s
    assert bucket.egress_cost_usd == pytest.approx(4 * 3 * m * 0.09 / 1e9 * rounds, rel=1e-9)
    exchange = 2 * 0.04 + 4 * m / (5e9 / 8)
    assert bucket.wan_comm_s == pytest.approx(exchange, rel=1e-9)


def test_sync_payload_state_is_charged_to_gpu_memory() -> None:
    topo = load_topology("two-clouds")
    est = predict_topology(topo, mode="sync", payload="sign")
    isl = est.islands[0]
    assert isl.payload_memory_bytes == pytest.approx(4.0 * est.n_params / isl.plan.shard_group)
    full = dataclasses.replace(step(1.0, 1e6, 8), memory_bytes=78e9)
    plan = Plan(dp=8, sharding="zero3", global_batch=8)
    inputs = [IslandInput(f"i{k}", full, plan=plan) for k in range(2)]
    sign = resolve_payload(PayloadSpec(kind="sign"), 16, load_model("llama-3-8b"))
    tight = compose(inputs, two_islands(), 8 * 10**9, OuterSpec(mode="sync"), 1e12, payload=sign)
    assert not tight.islands[0].fits  # 78 GB + 4 GB of residual > 80 GB
    with pytest.raises(UserInputError, match=r"^islands\[0\]\.plan: got 'out of memory'; the step"):
        check_payload_memory(tight)
    diloco = compose(inputs, two_islands(), 8 * 10**9, OuterSpec(), 1e12, payload=sign)
    assert diloco.islands[0].fits  # DiLoCo keeps it with the outer state in host memory


# --- bad input: one line naming the field ---------------------------------------------------


@pytest.mark.parametrize(
    ("flags", "message"),
    [
        (["--failures", "gpu_mtbf_hours=-5"], "run.failures.gpu_mtbf_hours: got -5"),
        (["--failures", "island_mtbf_hours=0"], "run.failures.island_mtbf_hours: got 0"),
        (["--payload", "topk:fraction=0"], "run.payload.fraction: got 0"),
        (["--payload", "topk:fraction=1.5"], "run.payload.fraction: got 1.5"),
        (["--payload", "topk"], "run.payload.fraction: got None; topk needs a kept fraction"),
        (["--payload", "zip"], "run.payload.kind: got 'zip'"),
        (["--mode", "streaming", "--fragments", "0:40"], "run.fragments: got '1 fragment of 40"),
        (["--mode", "streaming", "--fragments", "0:x"], "fragments: got '0:x'"),
        (["--mode", "streaming", "--fragments", "100:32"], "run.fragments[0].offset: got 100"),
        (["--overlap-steps", "101"], "run.overlap_steps: got 101"),
        (["--reduce", "bucket"], "run.reduce: got 'bucket'; needs a [wan.bucket] table"),
        (["--step-time", "mars=1"], "step_time_s: got 'mars'"),
        (["--step-time", "-1"], "run.step_time_s: got -1.0"),
        (["--bucket", "bandwidth_gbit=0"], "wan.bucket.bandwidth_gbit: got 0"),
    ],
)
def test_bad_islands_input_is_one_line(
    flags: list[str], message: str, capsys: pytest.CaptureFixture[str]
) -> None:
    assert main(["predict", "--topology", "two-clouds", *flags]) == 2
    err = capsys.readouterr().err
    assert message in err, err
    assert err.count("\n") == 1


def test_compare_modes_lists_every_mode(capsys: pytest.CaptureFixture[str]) -> None:
    argv = ["predict", "--topology", "two-clouds", "--compare-modes", "--json"]
    assert main([*argv, "--failures", "gpu_mtbf_hours=5000,quorum=1"]) == 0
    doc = json.loads(capsys.readouterr().out)
    assert [m["mode"] for m in doc["modes"]] == ["sync", "diloco", "streaming", "async"]
    assert all(0 < m["failures"]["goodput"] < 1 for m in doc["modes"])


# --- output defects ------------------------------------------------------------------------------


def test_sweep_text_agrees_with_the_table() -> None:
    """Sync DP over two clouds is compute-bound at 4 GPUs per island and not beyond;
    the knee sentence must say so, not 'never compute-bound'."""
    from shardmeter.analysis import sweep

    # the link as 64 parallel streams of a 16 MB window: the full 25 Gbit/s (the default one
    # stream's window would cap it and no island size would be compute-bound)
    topo = load_topology("two-clouds")
    links = [
        {**x.model_dump(by_alias=True), "streams": 64, "window_mb": 16} for x in topo.wan.links
    ]
    res = sweep(with_wan(topo, links=links), "island_size", [4, 8, 16, 32], mode="sync")
    bound = [p.value for p in res.points if p.utilization >= res.threshold]
    assert [p.value for p in res.points if p.compute_bound] == bound == [4.0]
    text = res.knees[-1].text
    assert "Never" not in text and "stops being compute-bound" in text
    assert "between GPUs per island 4 and 8" in text and "Compute-bound at 4." in text
    assert res.knees[-1].value == 8.0


@pytest.mark.slow
def test_plan_plot_pareto_line_joins_plotted_points_only() -> None:
    from shardmeter.report.plan import front_line
    from shardmeter.search import Constraints, plan

    for res in (
        plan(topology="two-clouds"),
        plan(topology="eight-heterogeneous"),
        plan(model="llama-3.1-8b", cluster="dgx-h100", gpus=(8, 16), global_batch=64),
        plan(topology="two-clouds", constraints=Constraints(deadline_s=30 * 86400.0)),
    ):
        line_w, line_c = front_line(res)
        plotted = set(zip(res.cloud_wall_s.tolist(), res.cloud_cost_usd.tolist(), strict=True))
        assert line_w.size == len(res.pareto) > 0
        assert all(p in plotted for p in zip(line_w.tolist(), line_c.tolist(), strict=True))
        np.testing.assert_allclose(line_w, [c.wall_s for c in res.pareto], rtol=1e-9)
        np.testing.assert_allclose(line_c, [c.cost_usd for c in res.pareto], rtol=1e-9)
        walls, costs = res.cloud_wall_s, res.cloud_cost_usd
        for w, c in zip(line_w, line_c, strict=True):  # nothing plotted beats the line
            assert not np.any((walls < w * (1 - 1e-12)) & (costs < c * (1 - 1e-12)))


@pytest.mark.slow
def test_plan_searches_with_the_payload(capsys: pytest.CaptureFixture[str], tmp_path: Path) -> None:
    # two-clouds with its link as 64 streams of a 16 MB window (the full 25 Gbit/s): over one
    # default stream the WAN is too slow for sync DP to cross at all, payload or not
    text = (TOPOLOGY_DIR / "two-clouds.toml").read_text()
    wide = tmp_path / "two-clouds-wide.toml"
    wide.write_text(
        text.replace("latency_ms = 80.0", "latency_ms = 80.0\nstreams = 64\nwindow_mb = 16")
    )
    argv = ["plan", "--topology", str(wide), "--modes", "sync", "--top", "1", "--json"]
    assert main(argv) == 0
    dense = json.loads(capsys.readouterr().out)["best"]["time"]
    assert main([*argv, "--payload", "topk:fraction=0.01"]) == 0
    topk = json.loads(capsys.readouterr().out)["best"]["time"]
    assert topk["utilization"] > 0.95 > dense["utilization"]
    assert topk["wall_s"] < dense["wall_s"]
    assert main(["plan", "--cluster", "dgx-h100", "--gpus", "8", "--payload", "sign"]) == 2
    assert "--payload: got 'sign'; only with --topology" in capsys.readouterr().err


# --- regime and bottleneck: hidden versus exposed WAN time ----------------------------------


def test_regime_and_bottleneck_count_exposed_time_and_say_how_much_hides() -> None:
    """A 5 s exchange per 15 s round: blocking it is the largest loss (communication-bound);
    hidden behind the next round (eager) it is no loss at all, so the straggler wait is
    what remains, and the text says how much of the exchange hides."""
    inputs = [
        IslandInput("a", step(1.0, 1e6, 8), price_per_gpu_hour=2.0, hbm_Bps=1e15),
        IslandInput("b", step(1.5, 1e6, 8), price_per_gpu_hour=2.0, hbm_Bps=1e15),
    ]
    wan = two_islands(gbit=8.0)  # 1 GB/s: a ring all-reduce of 2 islands sends S per island
    n = 5e9 / 2  # 2 bytes per parameter: 5 GB, 5 s
    blocking = OuterSpec(mode="diloco", inner_steps=10, bits=16, backward_overlap=False)
    est = compose(inputs, wan, int(n), blocking, 1e12)
    assert est.wan_comm_s == pytest.approx(5.0) and est.wan_hidden_s == 0.0
    assert est.regime == "communication-bound (WAN a↔b)"
    assert est.bottleneck.phase == "WAN exchange: 5 s exposed of 5 s per round (0% hidden)"
    eager = compose(inputs, wan, int(n), blocking.model_copy(update={"outer_overlap": True}), 1e12)
    assert eager.wan_hidden_s == pytest.approx(5.0)
    assert eager.regime == "straggler-bound (waiting for b)"
    assert eager.utilization > est.utilization
    compute = compose(
        inputs[:1] * 2, wan, int(n), blocking.model_copy(update={"outer_overlap": True}), 1e12
    )
    assert compute.regime == "compute-bound"
    assert compute.bottleneck.phase.endswith(
        "WAN exchange 0 s exposed of 5 s per round (100% hidden)"
    )


def test_no_overlap_hides_exactly_nothing() -> None:
    """The hidden share is exactly zero without overlap (no floating-point residue in the
    report: '0.00000000000266 ms hidden')."""
    est = predict_topology(load_topology("two-clouds"), mode="sync", backward_overlap=False)
    assert est.wan_hidden_s == 0.0 and all(i.wan_hidden_s == 0.0 for i in est.islands)
    assert est.wan_comm_s > 0


def test_payloads_in_sweep_and_failures_in_a_sweep(capsys: pytest.CaptureFixture[str]) -> None:
    argv = ["sweep", "--topology", "two-clouds", "--mode", "sync", "--over", "bandwidth"]
    argv += ["--values", "0.1,1,10", "--json", "--no-plots"]
    assert main(argv) == 0
    dense = json.loads(capsys.readouterr().out)["sweeps"][0]["points"]
    assert main([*argv, "--payload", "lowrank:rank=4"]) == 0
    low = json.loads(capsys.readouterr().out)["sweeps"][0]["points"]
    assert all(b["utilization"] > a["utilization"] for a, b in zip(dense, low, strict=True))
    churn = ["sweep", "--topology", "eight-heterogeneous", "--over", "gpu_mtbf", "--json"]
    churn += ["--values", "1000,100000", "--failures", "restart_s=600,quorum=6", "--no-plots"]
    assert main(churn) == 0
    points = json.loads(capsys.readouterr().out)["sweeps"][0]["points"]
    assert points[0]["utilization"] < points[1]["utilization"]


@pytest.mark.slow
def test_no_overlap_switches_every_overlap_off_in_predict_and_plan(
    capsys: pytest.CaptureFixture[str],
) -> None:
    """`--no-overlap` is the pessimistic bound: predict hides nothing in any mode, and the
    planner searches without any overlap (τ = 0 for streaming)."""
    topo = load_topology("two-clouds")
    for mode in MODES:
        argv = ["predict", "--topology", "two-clouds", "--mode", mode, "--fragments", "4"]
        assert (
            main([*argv, "--outer-overlap", "--overlap-steps", "2", "--no-overlap", "--json"]) == 0
        )
        doc = json.loads(capsys.readouterr().out)
        off = predict_topology(
            topo, mode=mode, fragments=4, backward_overlap=False, outer_overlap=False
        )
        assert doc["utilization"] == off.utilization
        assert doc["wan_hidden_s"] == off.wan_hidden_s
        if mode != "async":  # async hides its exchange behind the next round by design
            assert off.wan_hidden_s == 0.0
        assert off.utilization <= predict_topology(topo, mode=mode, fragments=4).utilization
    argv = ["plan", "--topology", "two-clouds", "--modes", "sync,streaming", "--top", "0"]
    assert main([*argv, "--json"]) == 0
    hidden = json.loads(capsys.readouterr().out)
    assert main([*argv, "--json", "--no-overlap"]) == 0
    exposed = json.loads(capsys.readouterr().out)
    assert exposed["best"]["time"]["utilization"] < hidden["best"]["time"]["utilization"]
    taus = {r["outer"]["overlap_steps"] for r in exposed["ranked"] if r["outer"]["mode"] != "sync"}
    assert taus == {0}
    assert main([*argv, "--no-overlap", "--overlap-steps", "1"]) == 2
    assert "--overlap-steps: got '1'; not with --no-overlap" in capsys.readouterr().err
    assert main(["plan", "--cluster", "dgx-h100", "--gpus", "8", "--no-overlap"]) == 2
    assert "--no-overlap: got True; only with --topology" in capsys.readouterr().err
