"""`benchmarks/moe_rows.py`: its replay of Megatron-Core's interleaved 1F1B schedule against
the closed forms it must reduce to (Narayanan et al. SC'21 §2.2: without hops a step of even
stages is `m·v` chunk-micro-batches plus a fill and drain of `(p−1)` chunk times), and the
MoE rows it reads."""

from __future__ import annotations

from collections.abc import Callable
from pathlib import Path
from types import ModuleType

import pytest

from shardmeter.errors import UserInputError


@pytest.fixture(scope="module")
def bench(load_benchmark: Callable[[str], ModuleType]) -> ModuleType:
    return load_benchmark("moe_rows")


def unit(f: float) -> Callable[[int, int], float]:
    return lambda r, c: f


@pytest.mark.parametrize(
    ("p", "v", "m"), [(1, 1, 8), (4, 1, 8), (2, 24, 32), (4, 2, 16), (8, 4, 32)]
)
def test_interleaved_replay_without_hops_is_the_work_plus_fill_and_drain(
    bench: ModuleType, p: int, v: int, m: int
) -> None:
    f, b = 1.0, 2.0
    step = bench.interleaved_step(bench.Schedule(p, v, m, p), unit(f), unit(b), 0.0)
    assert step == pytest.approx(m * v * (f + b) + (p - 1) * (f + b))


def test_hops_cost_nothing_on_one_rank_and_something_across_ranks(bench: ModuleType) -> None:
    one = bench.Schedule(1, 4, 8, 1)
    assert bench.interleaved_step(one, unit(1.0), unit(2.0), 5.0) == pytest.approx(4 * 8 * 3.0)
    two = bench.Schedule(2, 4, 8, 2)
    base = bench.interleaved_step(two, unit(1.0), unit(2.0), 0.0)
    # Four one-way edges of the ring (fill and drain, forward and backward) at the least.
    assert bench.interleaved_step(two, unit(1.0), unit(2.0), 0.5) >= base + 2 * 0.5


def test_a_slow_last_chunk_sets_the_pace_of_its_rank(bench: ModuleType) -> None:
    """An output head on the last chunk (4 chunk-times more) adds m·(4+8) to that rank's work
    and the schedule waits on it, as the model's m·max_s(t_s) says."""
    p, v, m = 2, 24, 32
    fwd = lambda r, c: 1.0 + (4.0 if (r, c) == (p - 1, v - 1) else 0.0)  # noqa: E731
    bwd = lambda r, c: 2.0 + (8.0 if (r, c) == (p - 1, v - 1) else 0.0)  # noqa: E731
    step = bench.interleaved_step(bench.Schedule(p, v, m, p), fwd, bwd, 0.0)
    busiest = m * (v * 3.0 + 12.0)
    assert busiest <= step <= busiest * 1.01


def test_moe_rows_are_the_runs_with_experts(bench: ModuleType) -> None:
    runs = bench.moe_runs([bench.HOLDOUT])
    assert {r.run_id for r in runs} >= {"1016", "1036", "1077"}
    assert all(r.model.moe is not None for r in runs)


@pytest.mark.parametrize(
    ("p", "v", "m"), [(2, 2, 8), (2, 24, 32), (4, 2, 16), (4, 3, 12), (8, 4, 32), (16, 2, 16)]
)
def test_interleaved_replay_exposes_one_hop_per_virtual_stage_edge_each_way(
    bench: ModuleType, p: int, v: int, m: int
) -> None:
    """A hop under a chunk's forward and backward (here 1/12 and 1/6 of them) delays the replayed
    step by one hop per edge between the p·v virtual stages, each way, at fill and drain:
    2·(p·v − 1) hops (the model charges 2·(p − 1)); also when each rank waits for its own
    previous send before its next step (overlap_p2p_comm's `req.wait()`)."""
    s = bench.Schedule(p, v, m, p)
    base = bench.interleaved_step(s, unit(1.0), unit(2.0), 0.0)
    for hop in (0.25, 0.5):
        for own in (False, True):
            step = bench.interleaved_step(s, unit(1.0), unit(2.0), hop, own_sends=own)
            assert (step - base) / hop == pytest.approx(2 * (p * v - 1))


def test_waiting_for_its_own_sends_costs_a_rank_once_a_hop_outlasts_a_forward(
    bench: ModuleType,
) -> None:
    """A hop longer than a chunk's forward (1.5 against 1) is no longer hidden behind the next
    forward of the warm-up when the rank waits for its own send first."""
    s = bench.Schedule(4, 2, 16, 4)
    free = bench.interleaved_step(s, unit(1.0), unit(2.0), 1.5)
    waits = bench.interleaved_step(s, unit(1.0), unit(2.0), 1.5, own_sends=True)
    assert waits > free + 1.5


@pytest.mark.parametrize(("p", "m"), [(1, 4), (2, 8), (3, 8), (4, 16), (8, 64), (16, 32)])
def test_blocking_1f1b_replay_is_the_work_plus_fill_and_drain_and_its_hops(
    bench: ModuleType, p: int, m: int
) -> None:
    """Without hops `(m + p − 1)·(f + b)` (SC'21 §2.2); each blocking hop under a forward adds
    `2·m + 2·p − 5` hops from p = 3 (the replay's count: two blocking calls per micro-batch and
    the fill and drain, `2·(m + p − 1)`, less 3), `m + 1` at p = 2, none at p = 1."""
    f, b, hop = 1.0, 2.0, 0.1
    base = bench.blocking_1f1b_step(p, m, f, b, 0.0)
    assert base == pytest.approx((m + p - 1) * (f + b))
    hops = (bench.blocking_1f1b_step(p, m, f, b, hop) - base) / hop
    assert hops == pytest.approx(0 if p == 1 else m + 1 if p == 2 else 2 * m + 2 * p - 5)


def test_interleaved_replay_refuses_a_partial_micro_batch_group(bench: ModuleType) -> None:
    """m not a multiple of N has no schedule here: one line, naming m and N."""
    with pytest.raises(ValueError, match=r"m: got 32; a multiple of the group size N = 9"):
        bench.interleaved_step(bench.Schedule(9, 2, 32, 9), lambda r, c: 1.0, lambda r, c: 2.0, 0.0)


def test_held_out_errors_are_read_per_run_and_a_missing_file_is_one_line(
    bench: ModuleType, tmp_path: Path
) -> None:
    cv = tmp_path / "cv.csv"
    cv.write_text('run_id,source_id,signed_error\n"1016","H1","0.79646"\n"1011","H1","-0.027"\n')
    assert bench.held_out_errors(cv) == {"1016": pytest.approx(0.79646), "1011": -0.027}
    with pytest.raises(UserInputError, match="cross-validation CSV"):
        bench.held_out_errors(tmp_path / "missing.csv")
    assert bench._held_out_cell({"1016": 0.5}, "1016").strip() == "+50.0%"
    assert bench._held_out_cell({"1016": 0.5}, "1011").strip() == "-"


def test_flop_per_token_is_the_published_tables_own_ratio(bench: ModuleType) -> None:
    """Megatron-Bridge 25.11: 547 model TFLOP/s at 23,766 tokens/s (GB200), 214 at 9,299 (B200)."""
    for tflops, tokens in ((547.0, 23766.0), (214.0, 9299.0)):
        assert tflops * 1e12 / tokens == pytest.approx(bench.QWEN3_30B_FLOP_PER_TOKEN, rel=5e-3)


def test_layouts_of_run_1016_keep_the_row_first_and_move_to_ep16(bench: ModuleType) -> None:
    row = next(r for r in bench.read_rows(bench.HOLDOUT) if r["run_id"] == "1016")
    rows = bench.layout_rows(row)
    assert [layout.tflops for layout, _ in rows] == [121.0, 244.039, 287.305, 299.352]
    assert rows[0][0].cells == {}
    assert all(predicted > 0 for _, predicted in rows)
    first = bench.predict_run(bench.run_from_row(row)).tokens_per_s_per_gpu
    assert rows[0][1] == pytest.approx(first * bench.QWEN3_30B_FLOP_PER_TOKEN / 1e12)
    plan = bench.run_from_row({**row, **rows[1][0].cells}).plan
    assert (plan.pp, plan.ep, plan.dp, plan.micro_batch, plan.precision) == (1, 16, 16, 1, "bf16")


def test_time_missed_per_chunk_is_the_step_gap_over_the_chunk_micro_batches(
    bench: ModuleType,
) -> None:
    """An exact prediction misses nothing; a measurement at half the predicted throughput
    (twice the step) misses one predicted chunk-micro-batch per chunk-micro-batch."""
    row = next(r for r in bench.read_rows(bench.HOLDOUT) if r["run_id"] == "1016")
    run = bench.run_from_row(row)
    est = bench.predict_run(run)
    exact = bench.replace(run, measured=est.tokens_per_s_per_gpu)
    chunk, missed = bench.missed_per_chunk(exact)
    m = run.plan.global_batch // (run.plan.dp * run.plan.micro_batch)
    assert chunk == pytest.approx(est.step_time_s / (m * run.plan.vpp))
    assert missed == pytest.approx(0.0, abs=1e-12)
    half = bench.replace(run, measured=est.tokens_per_s_per_gpu / 2.0)
    assert bench.missed_per_chunk(half)[1] == pytest.approx(chunk)


def test_host_cost_per_launch_slows_only_the_plans_that_launch(bench: ModuleType) -> None:
    row = next(r for r in bench.read_rows(bench.HOLDOUT) if r["run_id"] == "1011")
    run = bench.run_from_row(row)
    shipped = run.cluster.accelerator.efficiency.kernel_launch_us
    same = bench.with_launch(run, shipped)
    assert bench.predict_run(same).step_time_s == pytest.approx(bench.predict_run(run).step_time_s)
    slow = bench.with_launch(run, 4.0 * shipped)
    assert slow.cluster.accelerator.efficiency.kernel_launch_us == 4.0 * shipped
    assert bench.predict_run(slow).step_time_s > bench.predict_run(run).step_time_s
    graphs = bench.replace(run, plan=run.plan.model_copy(update={"graphs": True}))
    assert bench.predict_run(bench.with_launch(graphs, 4.0 * shipped)).step_time_s == (
        pytest.approx(bench.predict_run(graphs).step_time_s)
    )


def test_fit_loss_by_source_adds_up_and_the_views_constant_is_restored(
    bench: ModuleType, capsys: pytest.CaptureFixture[str]
) -> None:
    runs = bench.moe_runs([bench.HOLDOUT])
    total, per = bench.loss_by_source(runs, 13.14)
    assert sum(per.values()) == pytest.approx(total)
    assert set(per) == {r.source_id for r in runs}
    shipped = bench.step_module.VIEW_OPS_PER_RANK
    bench.launch_fit_table(runs)
    assert shipped == bench.step_module.VIEW_OPS_PER_RANK
    assert "without DeepSpeed's shard views" in capsys.readouterr().out
