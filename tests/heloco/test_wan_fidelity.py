"""benchmarks/wan_fidelity.py's comparison logic, without namespaces: a worker's round is read
from events and its report as the benchmark reads a real run, the prediction is ShardMeter's
async round for the same link and exchange mode, and saved measurements re-predict."""

from __future__ import annotations

import json
from pathlib import Path
from types import ModuleType
from typing import Any

import pytest

from shardmeter.estimate.wan import goodput_Bps, heloco_exchange_s, slow_start_s


@pytest.fixture(scope="module")
def bench(load_benchmark: Any) -> ModuleType:
    return load_benchmark("wan_fidelity")


def events(worker: int, times: list[float], timing: bool) -> list[dict[str, Any]]:
    """Round events of one worker: push arrivals at ``times``; with ``timing``, a blocking
    round's fields (0.2 s receive, then compute, 0.3 s send before the arrival)."""
    out = []
    for k, t in enumerate(times):
        e: dict[str, Any] = {"type": "round", "worker": worker, "round_id": k, "steps": 10,
                             "tokens": 2560, "start": t - 1.5, "time": t}  # fmt: skip
        if timing:
            e |= {"recv_start": t - 1.5, "recv_end": t - 1.3, "compute_start": t - 1.3,
                  "compute_end": t - 0.3, "send_start": t - 0.3, "send_end": t}  # fmt: skip
        out.append(e)
    return out


REPORT = {"compute_s": 5.0, "rounds": 5, "push_bytes": [550_000] * 5}


def test_a_workers_round_comes_from_its_push_arrivals_and_report(bench: ModuleType) -> None:
    other = events(1, [0.7, 9.0, 20.0], False)  # another worker's rounds are not counted
    m = bench.measure_worker(0, events(0, [2.0, 4.0, 6.5, 8.0], True) + other, REPORT, 256.0)
    assert m.period_s == pytest.approx(2.0)  # (8 − 2) / 3 intervals
    assert m.rounds == 3 and m.steps == 10 and m.compute_s == pytest.approx(1.0)
    assert m.utilization == pytest.approx(0.5)
    assert m.tokens_per_s == pytest.approx(10 * 256 / 2.0)
    assert m.recv_s == pytest.approx(0.2) and m.send_s == pytest.approx(0.3)
    assert m.idle_s == pytest.approx(2.0 - 1.0 - 0.5)
    assert m.push_bytes == pytest.approx(550_000)
    # without the timing fields (or in an overlapped run) receive, send and idle are unknown
    bare = bench.measure_worker(0, events(0, [2.0, 4.0, 6.0], False), REPORT, 256.0)
    assert bare.send_s is None and bare.recv_s is None and bare.idle_s is None
    overl = bench.measure_worker(0, events(0, [2.0, 4.0, 6.0], True), REPORT, 256.0, spans=False)
    assert overl.send_s is None
    with pytest.raises(ValueError, match="2 rounds"):
        bench.measure_worker(0, events(0, [2.0, 4.0], True), REPORT, 256.0)


def test_a_warm_up_is_left_out_while_three_rounds_remain(bench: ModuleType) -> None:
    # a start-up of 4 s rounds, then 2 s rounds: measured from the first arrival after 10 s
    times = [4.0, 8.0, 12.0, 14.0, 16.0, 18.0]
    m = bench.measure_worker(0, events(0, times, True), REPORT, 256.0, warmup_s=10.0)
    assert m.period_s == pytest.approx(2.0) and m.rounds == 3
    whole = bench.measure_worker(0, events(0, times, True), REPORT, 256.0)
    assert whole.period_s == pytest.approx(14.0 / 5)
    few = bench.measure_worker(0, events(0, times, True), REPORT, 256.0, warmup_s=15.0)
    assert few.period_s == whole.period_s  # only 2 left after 15 s: the whole run counts


def result(bench: ModuleType, exchange: str, codec: str = "fp32") -> Any:
    link = bench.Link(6e6, 0.04)
    run = bench.Run("t", (link, bench.Link(30e6)), (0.1, 0.1), codec=codec, exchange=exchange)
    workers = tuple(
        bench.Measured(w, 5, 2.0, 10.0, 256.0, 1.0, None, None, 550_000.0) for w in range(2)
    )
    return bench.RunResult(run, 1500, 136_960, workers)


@pytest.mark.parametrize("codec", ["fp32", "int8"])
def test_prediction_is_shardmeters_heloco_exchange_over_the_emulated_link(
    bench: ModuleType, codec: str
) -> None:
    """Blocking: H·T + X; overlapped: max(H·T, X); X = push (q bits) then pull (fp32), each
    a round trip plus its bytes at the link's goodput at MTU 1500. Blocking idles many RTOs:
    both legs from the initial window. Overlapped on this link-bound path (X > H·T) keeps the
    link busy: the push still idles the pull's 0.7 s, RTOs of 0.24 s, back to the initial
    window, but the dispatch queues at the worker's downlink and keeps a window beyond the
    BDP, so it runs at the rate from its first byte."""
    rate = float(goodput_Bps(6e6 / 8, 1500))
    bits = 32 if codec == "fp32" else 8
    push, pull = 136_960 * bits / 8, 136_960 * 4
    x = float(heloco_exchange_s(push, rate, 0.04, pull))
    block = bench.predict(result(bench, "blocking", codec))[0]
    over = bench.predict(result(bench, "overlapped", codec))[0]
    assert block.exchange_s == pytest.approx(x) and block.round_s == pytest.approx(1.0 + x)
    kept = 2 * 0.04 + float(slow_start_s(push, rate, 0.04)) + pull / rate
    assert kept < x and over.round_s == pytest.approx(max(1.0, kept))
    assert block.utilization == pytest.approx(1.0 / (1.0 + x))


def test_errors_and_targets_over_rows(bench: ModuleType) -> None:
    rows = bench.compare([result(bench, "blocking"), result(bench, "overlapped")])
    assert len(rows) == 4
    for r in rows:  # measured 50% utilization at a 2 s period
        assert r.util_error_points == pytest.approx(100 * (r.predicted.utilization - 0.5))
        assert r.tokens_error == pytest.approx(2.0 / r.predicted.round_s - 1.0)
    s = bench.summarize(rows)
    errs = sorted(abs(r.util_error_points) for r in rows)
    assert s.util_median_abs_points == pytest.approx((errs[1] + errs[2]) / 2)
    assert s.util_max_abs_points == pytest.approx(errs[-1])
    assert s.tokens_within_10pct == sum(abs(r.tokens_error) <= 0.1 for r in rows)
    # each blocking worker is paired with the overlapped one on its link
    assert [p[0] for p in s.overlap_pairs] == ["bw=6Mbit,rtt=40ms fp32", "bw=30Mbit,rtt=0ms fp32"]


def test_saved_measurements_repredict(
    bench: ModuleType, tmp_path: Path, capsys: pytest.CaptureFixture[str], monkeypatch: Any
) -> None:
    path = tmp_path / "m.json"
    bench.save(
        path, [result(bench, "blocking")], {"uptime": ["up 3:00,  load average: 1.00, 2.00, 3.00"]}
    )
    loaded, extra = bench.load(path)
    assert loaded == [result(bench, "blocking")] and len(extra["uptime"]) == 1
    monkeypatch.setattr("sys.argv", ["wan_fidelity.py", "--load", str(path)])
    bench.main()
    out = capsys.readouterr().out
    assert "2 workers: utilization |error|" in out and "(1 min) 1.0-1.0 over 1" in out
    assert json.loads(path.read_text())["results"][0]["n_params"] == 136_960


def test_first_crossing_interpolates_between_evals(bench: ModuleType) -> None:
    pts = [(0.0, 0.0, 5.0), (10.0, 1000.0, 4.0), (20.0, 2000.0, 3.0), (30.0, 3000.0, 3.5)]
    assert bench.first_crossing(pts, 3.5) == pytest.approx((15.0, 1500.0))
    assert bench.first_crossing(pts, 2.0) is None
    assert bench.first_crossing(pts, 6.0) == (0.0, 0.0)


def test_streaming_prediction_is_per_fragment_push(
    bench: ModuleType, capsys: pytest.CaptureFixture[str]
) -> None:
    """A streaming run pushes one of P fragments every H/P steps, so each measured round (5
    steps of 0.1 s) is compared with one P-th of ShardMeter's streaming round of H = 10 steps:
    max(H·T/P, X_f), X_f = a round trip and the push of N·32/8/P bytes, then a round trip and
    the pull of N·32/8/P (windows kept over the sub-round's idle), at the link's goodput."""
    from shardmeter.estimate.wan import heloco_legs_s

    link = bench.Link(6e6, 0.04)
    run = bench.Run("t", (link,), (0.1,), exchange="streaming", fragments=2)
    measured = bench.Measured(0, 5, 1.0, 5.0, 256.0, 0.5, None, None, 274_000.0, 274_000.0)
    r = bench.RunResult(run, 1500, 136_960, (measured,))
    (p,) = bench.predict(r)
    rate = float(goodput_Bps(6e6 / 8, 1500))
    half = 136_960 * 4 / 2
    up, down = heloco_legs_s(half, rate, 0.04, half, 0.5, blocking=False)
    x = 2 * 0.04 + float(up) + float(down)
    assert p.exchange_s == pytest.approx(x) and p.compute_s == pytest.approx(0.5)
    assert p.round_s == pytest.approx(max(0.5, x))
    assert p.bytes_per_push == pytest.approx(2 * half)
    assert "fragments=2" in bench.launch_argv(run, Path("out"))
    bench.print_streaming(bench.compare([r]))
    line = capsys.readouterr().out.splitlines()[-1]
    assert "streaming" in line and line.split()[-2:] == ["548", "548"]  # kB per push


def test_a_streaming_event_counts_its_dispatch_bytes(bench: ModuleType) -> None:
    rounds = events(0, [2.0, 4.0, 6.0], True)
    for e, n in zip(rounds, (1000, 300, 500), strict=True):
        e |= {"bytes_sent": 200, "bytes_received": n}
    m = bench.measure_worker(0, rounds, REPORT, 256.0, spans=False)
    assert m.push_bytes == 200 and m.pull_bytes == pytest.approx(400)  # the window's rounds


def test_the_shared_link_run_takes_turns_and_is_predicted_so(bench: ModuleType) -> None:
    shared = next(r for r in bench.RUNS if r.name == "shared server")
    assert shared.link_slots and "--link-slots" in bench.launch_argv(shared, Path("x"))
    fifo = next(r for r in bench.FIFO_RUNS if r.name == "shared fifo")
    assert not fifo.link_slots and "--link-slots" not in bench.launch_argv(fifo, Path("x"))
    workers = tuple(
        bench.Measured(w, 5, 2.0, 10.0, 256.0, 1.0, None, None, 550_000.0) for w in range(3)
    )
    for mode in ("blocking", "overlapped"):
        turns = bench.predict(bench.RunResult(bench.replace(shared, exchange=mode), 1500,
                                              136_960, workers))  # fmt: skip
        meet = bench.predict(bench.RunResult(bench.replace(fifo, exchange=mode), 1500,
                                             136_960, workers))  # fmt: skip
        # turns never meet on the link: faster than the random meetings of one FIFO
        assert all(t.round_s < m.round_s for t, m in zip(turns, meet, strict=True))


def test_merge_replaces_only_the_runs_measured_again(bench: ModuleType) -> None:
    a, b = result(bench, "blocking"), result(bench, "overlapped")
    again = bench.replace(a, mtu=9000)
    other = bench.replace(a, run=bench.replace(a.run, name="u"))
    out, extra = bench.merged(
        [a, b], {"date": "d0", "uptime": ["x"]}, [again, other], {"date": "d1", "uptime": ["y"]}
    )
    assert out == [again, b, other]
    assert extra["date"] == "d0" and extra["uptime"] == ["x", "y"]
    assert extra["merged"] == [{"date": "d1", "runs": ["t (blocking)", "u (blocking)"]}]


def test_unequal_workers_taking_turns_are_predicted_as_their_convoy(bench: ModuleType) -> None:
    # the saved launch of three unequal workers on one 10 Mbit/s hub link with turns: in
    # blocking they locked into one period (all three at 885 tokens/s); the planner's settled
    # schedule locks too and gives one round to all three, within 10% of each measured one
    saved = Path(__file__).resolve().parents[2] / "benchmarks/results"
    results, _ = bench.load(saved / "wan_fidelity_shared_unequal.json")
    blocking = next(r for r in results if r.run.exchange == "blocking")
    rounds = [p.round_s for p in bench.predict(blocking)]
    assert max(rounds) - min(rounds) < 1e-3 * max(rounds)
    for m, p in zip(blocking.workers, bench.predict(blocking), strict=True):
        assert p.round_s == pytest.approx(m.period_s, rel=0.10)
    # a held-out launch whose workers locked at whole ratios, not one period (rounds of 2.14,
    # 3.28 and 2.32 s): each worker's share of the schedule's cycle, within 10%
    results, _ = bench.load(saved / "wan_fidelity_shared_unequal_c.json")
    blocking = next(r for r in results if r.run.exchange == "blocking")
    for m, p in zip(blocking.workers, bench.predict(blocking), strict=True):
        assert p.round_s == pytest.approx(m.period_s, rel=0.10)
    # three equal workers on the fidelity table's shared link: one round robin, each within
    # 10% (their rounds measured 2.21-2.24 s)
    equal = next(r for r in bench.load(saved / "wan_fidelity.json")[0]
                 if r.run.name == "shared server" and r.run.exchange == "blocking")  # fmt: skip
    rounds = [p.round_s for p in bench.predict(equal)]
    assert max(rounds) - min(rounds) < 1e-3 * max(rounds)
    for m, p in zip(equal.workers, bench.predict(equal), strict=True):
        assert p.round_s == pytest.approx(m.period_s, rel=0.10)
    # a held-out launch whose workers drift (rounds of 3.15, 2.46 and 3.33 s, up to three
    # dispatches on the hub's downlink at once): the schedule's own mean rounds, within 5%
    results, _ = bench.load(saved / "wan_fidelity_shared_unequal_d.json")
    blocking = next(r for r in results if r.run.exchange == "blocking")
    for m, p in zip(blocking.workers, bench.predict(blocking), strict=True):
        assert p.round_s == pytest.approx(m.period_s, rel=0.05)


def test_overlapped_workers_taking_turns_are_predicted_as_their_convoy(
    bench: ModuleType,
) -> None:
    # the overlapped exchange with turns: the measured workers of each unequal launch run at
    # one rate (b: all three at 1327 tokens/s; c: rounds of 1.38-1.42 s, worker 1's compute),
    # and so does the schedule, each dispatch from the window its connection kept (about
    # half the last one's after a push's hold): every worker within 10% (the mean-value
    # analysis gave +11.1% for b's worker 1 and +9.9% for c's worker 0), never a round
    # shorter than its compute
    saved = Path(__file__).resolve().parents[2] / "benchmarks/results"
    for name in ("", "_b", "_c"):
        results, _ = bench.load(saved / f"wan_fidelity_shared_unequal{name}.json")
        run = next(r for r in results if r.run.exchange == "overlapped")
        predicted = bench.predict(run)
        rounds = [p.round_s for p in predicted]
        assert max(rounds) - min(rounds) < 1e-3 * max(rounds)
        for m, p in zip(run.workers, predicted, strict=True):
            assert p.round_s == pytest.approx(m.period_s, rel=0.05)
            assert p.exposed_s >= 0.0
