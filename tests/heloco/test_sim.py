"""Simulated clock: ordering, sync barrier, budgets, DyLU, grace, comm delays, determinism."""

from __future__ import annotations

import itertools
import json
import math
from pathlib import Path

import pytest
import torch

from heloco.data import ValLoss
from heloco.metrics import EVENTS_FILE, SUMMARY_FILE, MetricsWriter, RunStats
from heloco.outer import OuterConfig, build_optimizer, resolve_method
from heloco.server import Server, ServerConfig
from heloco.sim import (
    Clock,
    InnerSetup,
    ModelSetup,
    SimConfig,
    build_run,
    loss_at_time_budget,
    parse_sim_config,
    resolve_paces,
    run_simulation,
    simulate,
    worker_inner_configs,
)
from heloco.sim.clock import lump_timing
from heloco.types import Params, RoundResult
from shardmeter.errors import UserInputError

TARGET = torch.tensor([1.0, -2.0, 0.5])


class FakeWorker:
    """Pulls θ toward a fixed target: Δ = 0.05·steps·(θ − target); 10 tokens per step."""

    def __init__(self, worker: int) -> None:
        self.worker = worker

    def run_round(
        self, start: Params, steps: int, base_revision: int, round_id: int | None = None
    ) -> RoundResult:
        delta = {"w": 0.05 * steps * (start["w"] - TARGET)}
        return RoundResult(self.worker, delta, steps, 10 * steps, 0.0, base_revision, round_id)


def evaluate(params: Params) -> ValLoss:
    loss = float((params["w"] - TARGET).square().sum())
    return ValLoss(loss, {"xx": loss})


def fake_server(method: str, k: int, h: int = 1, grace: float = 0.0) -> Server:
    """A server of ``method``'s policy over one 3-vector parameter."""
    init = {"w": torch.zeros(3)}
    spec = resolve_method(method).spec
    return Server(
        init,
        build_optimizer(method, init, OuterConfig(), k),
        ServerConfig(
            n_workers=k,
            inner_steps=h,
            synchronous=spec.policy.synchronous,
            dylu=spec.policy.dylu,
            grace_window=grace,
        ),
    )


def run_fake(
    method: str,
    paces: list[float],
    h: int = 1,
    comm: list[float] | None = None,
    tokens: int | None = None,
    seconds: float | None = None,
    grace: float = 0.0,
    jitter: float = 0.0,
    seed: int = 0,
    eval_every: int = 0,
    out: Path | None = None,
) -> tuple[Server, object]:
    k = len(paces)
    server = fake_server(method, k, h, grace)
    clock = Clock(paces, comm or [0.0] * k, jitter, seed, tokens, seconds, eval_every)
    with MetricsWriter(out) as writer:
        traj = simulate(
            server,
            [FakeWorker(w) for w in range(k)],
            clock,
            evaluate,
            writer,
            RunStats(k, [{"xx": 1.0}] * k),
        )
    return server, traj


def arrivals(server: Server) -> list[int]:
    return [a.worker for r in server.log for a in r.arrivals]


def test_events_follow_finish_time_with_ties_by_worker_id() -> None:
    server, traj = run_fake("mla", [1.0, 2.0, 3.0], seconds=6.0)
    assert arrivals(server) == [0, 0, 1, 0, 2, 0, 1, 0, 0, 1, 2]
    assert traj.time == 6.0  # type: ignore[attr-defined]
    # at t = 2 workers 0 and 1 both arrive; both are applied before worker 0 restarts
    assert [a.staleness for r in server.log for a in r.arrivals][:5] == [0, 0, 2, 0, 4]


def test_sync_round_takes_h_times_the_slowest_pace() -> None:
    server, traj = run_fake("sync", [1.0, 2.0, 3.0], h=4, seconds=50.0)
    assert server.revision == 4  # rounds end at 12, 24, 36, 48; the 5th would end at 60
    assert traj.time == pytest.approx(48.0)  # type: ignore[attr-defined]
    assert traj.tokens == 4 * 3 * 40  # type: ignore[attr-defined]
    assert traj.stopped_by == "time"  # type: ignore[attr-defined]
    assert [len(r.arrivals) for r in server.log] == [3, 3, 3, 3]


def test_token_budget_stops_at_the_arrival_that_reaches_it() -> None:
    server, traj = run_fake("heloco", [1.0, 1.5], h=2, tokens=100)
    assert traj.tokens == 100 and server.revision == 5  # type: ignore[attr-defined]
    assert traj.stopped_by == "tokens"  # type: ignore[attr-defined]


def test_time_and_token_budget_whichever_first() -> None:
    _, by_time = run_fake("mla", [1.0, 1.0], tokens=10_000, seconds=3.0)
    assert by_time.tokens == 60  # type: ignore[attr-defined]
    _, by_tokens = run_fake("mla", [1.0, 1.0], tokens=40, seconds=100.0)
    assert by_tokens.time == 2.0  # type: ignore[attr-defined]


def test_loss_at_time_budget_when_stopped_by_time() -> None:
    _, traj = run_fake("mla", [1.0, 3.0], seconds=7.5, eval_every=20)
    assert traj.time == 7.0 and traj.stopped_by == "time"  # type: ignore[attr-defined]
    assert loss_at_time_budget(7.5, traj) == traj.evals[-1].loss  # type: ignore[arg-type,attr-defined]
    traj.stopped_by = "tokens"  # type: ignore[attr-defined]
    assert loss_at_time_budget(100.0, traj) is None  # type: ignore[arg-type]
    assert loss_at_time_budget(None, traj) is None  # type: ignore[arg-type]


def test_dylu_gives_slow_workers_fewer_steps() -> None:
    server, _ = run_fake("dn-dylu", [1.0, 2.0, 4.0], h=8, seconds=16.0)
    steps = {a.worker: a.steps for r in server.log for a in r.arrivals}
    assert steps == {0: 8, 1: 4, 2: 2}
    # equal round times (8 s) make every worker arrive at 8 and 16
    assert arrivals(server) == [0, 1, 2, 0, 1, 2]


def test_comm_delay_adds_to_each_round() -> None:
    server, _ = run_fake("mla", [1.0, 1.0], comm=[0.0, 0.5], seconds=3.0)
    assert arrivals(server) == [0, 1, 0, 0, 1]  # w1 at 1.5, 3.0; w0 at 1, 2, 3


def test_grace_window_batches_arrivals() -> None:
    server, traj = run_fake("heloco", [1.0, 1.2, 5.0], grace=0.5, seconds=2.0)
    # w0 at 1.0 opens a window to 1.5; w1 at 1.2 joins; both apply at 1.5 and restart then.
    assert arrivals(server)[:2] == [0, 1]
    assert [a.staleness for a in server.log[1].arrivals] == [1]
    assert server.revision == 2 and traj.time == 1.5  # type: ignore[attr-defined]


def test_arrival_balancing_equalises_effective_contributions() -> None:
    k = 3  # "max" scales everyone to the least represented worker: equal contributions
    init = {"w": torch.zeros(3)}
    opt = build_optimizer("mla+ab", init, OuterConfig(ab_normalize="max"), k)
    server = Server(init, opt, ServerConfig(n_workers=k, inner_steps=1))
    stats = RunStats(k)
    clock = Clock([1.0, 1.0, 4.0], [0.0] * k, 0.0, 0, None, 200.0, 0)
    simulate(server, [FakeWorker(w) for w in range(k)], clock, evaluate, None, stats)
    assert stats.worker_shares() == pytest.approx([4 / 9, 4 / 9, 1 / 9], abs=0.01)
    assert stats.weight_shares() == pytest.approx([1 / 3] * 3, abs=0.03)


def test_jitter_is_seeded() -> None:
    a, _ = run_fake("mla", [1.0, 1.3, 1.7], seconds=20.0, jitter=0.3, seed=1)
    b, _ = run_fake("mla", [1.0, 1.3, 1.7], seconds=20.0, jitter=0.3, seed=1)
    c, _ = run_fake("mla", [1.0, 1.3, 1.7], seconds=20.0, jitter=0.3, seed=2)
    assert arrivals(a) == arrivals(b)
    assert arrivals(a) != arrivals(c)


def test_evals_every_n_tokens_and_cycle_average(tmp_path: Path) -> None:
    _, traj = run_fake("heloco", [1.0, 3.0], h=1, seconds=9.0, eval_every=20, out=tmp_path)
    evals = traj.evals  # type: ignore[attr-defined]
    assert evals[0].tokens == 0 and evals[-1].time == 9.0
    assert all(b.tokens - a.tokens >= 10 for a, b in itertools.pairwise(evals))
    last = evals[-1]
    window = [e.loss for e in evals[:-1] if last.time - 3.0 < e.time <= last.time] + [last.loss]
    assert last.cycle_loss == pytest.approx(sum(window) / len(window))
    lines = [json.loads(x) for x in (tmp_path / EVENTS_FILE).read_text().splitlines()]
    assert {x["type"] for x in lines} == {"eval", "update", "round"}
    assert sum(x["type"] == "eval" for x in lines) == len(evals)


def test_eval_every_counts_steps_when_asked() -> None:
    k = 2
    server = fake_server("mla", k)
    clock = Clock([1.0, 1.0], [0.0, 0.0], 0.0, 0, None, 5.0, 4, "steps")
    traj = simulate(server, [FakeWorker(w) for w in range(k)], clock, evaluate)
    assert [e.steps for e in traj.evals] == [0, 4, 8, 10]  # 2 steps per second, to t = 5


def cosine_lengths(cfg: SimConfig, comm: list[float] | None = None) -> list[int]:
    """Each worker's cosine length at paces 1 and 3 s/step."""
    return [c.total_steps for c in worker_inner_configs(InnerSetup.of(cfg), [1.0, 3.0], comm)]


def test_budget_schedule_matches_each_workers_expected_steps() -> None:
    tokens = 400 * 2 * 16  # 400 inner steps of batch 2 x 16 tokens
    base = {
        "workers": 2,
        "paces": [1.0, 3.0],
        "inner_steps": 10,
        "token_budget": tokens,
        "inner": {"batch_size": 2, "seq_len": 16, "warmup_steps": 5},
        "inner_schedule": "budget",
    }
    cfg = SimConfig.model_validate({**base, "method": "mla"})
    assert cosine_lengths(cfg) == [300, 100]
    cfg = SimConfig.model_validate({**base, "method": "sync"})
    assert cosine_lengths(cfg) == [200, 200]
    cfg = SimConfig.model_validate({**base, "method": "sync", "time_budget": 95.0})
    assert cosine_lengths(cfg) == [30, 30]
    cfg = SimConfig.model_validate({**base, "method": "dn-dylu", "comm_delays": [5.0, 5.0]})
    # DyLU (H = 10 and 3): 10/15 and 3/14 steps per second once the comm delay is counted
    speed = [10 / 15, 3 / 14]
    expected = [math.ceil(400 * v / sum(speed)) for v in speed]
    comm = [5.0, 5.0]
    assert cosine_lengths(cfg, comm) == expected
    cfg = SimConfig.model_validate({**base, "method": "mla", "inner_schedule": "config"})
    assert worker_inner_configs(InnerSetup.of(cfg), [1.0, 3.0]) == [cfg.inner, cfg.inner]


def test_paces_from_a_distribution_are_seeded() -> None:
    base = {
        "workers": 4,
        "paces": {"kind": "lognormal", "median": 2.0, "sigma": 0.5},
        "token_budget": 10,
    }
    a = resolve_paces(InnerSetup.of(SimConfig.model_validate(base)))
    assert a == resolve_paces(InnerSetup.of(SimConfig.model_validate(base)))
    assert a != resolve_paces(InnerSetup.of(SimConfig.model_validate({**base, "seed": 7})))
    assert all(p > 0 for p in a) and len(a) == 4


@pytest.mark.parametrize(
    "bad",
    [
        {"method": "nope"},
        {"paces": [1.0]},
        {"paces": [1.0, 0.0, 1.0, 1.0, 1.0]},
        {"token_budget": None},
        {"comm_delays": [0.1]},
        {"seed": -1},
    ],
)
def test_bad_config_is_one_user_input_error(bad: dict[str, object]) -> None:
    with pytest.raises(UserInputError):
        parse_sim_config({"token_budget": 100, **bad})


TINY = {
    "workers": 3,
    "paces": [1.0, 2.0, 3.0],
    "inner_steps": 3,
    "model": "tiny",
    "data": {"synthetic_chars_per_language": 4000, "val_chars_per_language": 1000, "seq_len": 16},
    "inner": {"seq_len": 16, "batch_size": 2, "total_steps": 50},
    "eval_windows": 4,
    "eval_every": 300,
    "token_budget": 700,
}


def test_real_run_is_deterministic_and_writes_metrics(tmp_path: Path, one_thread: None) -> None:
    cfg = parse_sim_config({**TINY, "method": "heloco+ab", "out_dir": str(tmp_path / "a")})
    first = run_simulation(cfg)
    second = run_simulation(cfg.model_copy(update={"out_dir": None}))
    assert first.losses == second.losses  # bit-identical
    for k in first.params:
        assert torch.equal(first.params[k], second.params[k])
    assert first.losses[-1] < first.losses[0]
    s = first.summary
    assert s.tokens >= 700 and s.updates > 0 and len(s.worker_shares) == 3
    assert sum(s.language_shares.values()) == pytest.approx(1.0)
    assert s.staleness_max[2] is not None and s.staleness_max[2] >= 1
    summary = json.loads((tmp_path / "a" / SUMMARY_FILE).read_text())
    assert summary["final_loss"] == pytest.approx(first.losses[-1])
    assert summary["correction"]["frac_kept"] is not None


def test_real_sync_run_waits_for_the_slowest(one_thread: None) -> None:
    res = run_simulation(parse_sim_config({**TINY, "method": "sync", "eval_every": 0}))
    per_round = 3 * 3.0  # H × slowest pace
    assert res.summary.time == pytest.approx(per_round * res.summary.updates)
    assert res.summary.worker_shares == pytest.approx([1 / 3] * 3)


def test_build_run_gives_workers_their_budget_schedule() -> None:
    cfg = parse_sim_config(
        {
            "workers": 2,
            "paces": [1.0, 3.0],
            "token_budget": 4096,
            "inner_schedule": "budget",
            "dylu": True,
            "data": {"synthetic_chars_per_language": 2000, "val_chars_per_language": 500},
            "inner": {"batch_size": 2, "seq_len": 16},
        }
    )
    parts = build_run(cfg)
    expected = worker_inner_configs(InnerSetup.of(cfg), [1.0, 3.0])
    assert [parts.worker(w).cfg for w in range(2)] == parts.inner == expected
    assert parts.steps == [20, 6]  # DyLU: floor(1/3 · 20)
    assert parts.server.steps_for(1) == 20  # speeds unknown until the driver reports them


@pytest.mark.parametrize("method", ["mla", "sync"])
def test_round_events_lay_out_receive_compute_send_on_the_clock(
    tmp_path: Path, method: str
) -> None:
    # Paces 1 and 2 s/step, H = 2, comm 3 s: every round is 2·pace + 3 s. θ and Δ are both
    # 3 fp32 values (12 bytes each way), so the comm lump splits 1.5 s receive, 1.5 s send.
    run_fake(method, [1.0, 2.0], h=2, comm=[3.0, 3.0], seconds=30.0, out=tmp_path)
    rounds = [
        x
        for x in map(json.loads, (tmp_path / EVENTS_FILE).read_text().splitlines())
        if x["type"] == "round"
    ]
    assert len(rounds) >= 4
    for r in rounds:
        pace = [1.0, 2.0][r["worker"]]
        assert r["recv_start"] == r["start"] and r["send_end"] == r["time"]
        assert r["recv_end"] - r["recv_start"] == pytest.approx(1.5)
        assert r["compute_start"] == r["recv_end"] and r["send_start"] == r["compute_end"]
        assert r["compute_end"] - r["compute_start"] == pytest.approx(2 * pace)
        assert r["send_end"] - r["send_start"] == pytest.approx(1.5)
        assert r["bytes_received"] == 12 and r["bytes_sent"] == 12


def test_the_comm_lump_splits_by_the_bytes_each_way() -> None:
    # A 10 s round of 4 s compute: 6 s of comm, 300 bytes received for 100 sent -> 4.5 + 1.5.
    t = lump_timing(0.0, 10.0, 4.0, bytes_received=300, bytes_sent=100)
    assert (t.recv_start, t.recv_end, t.compute_start) == (0.0, 4.5, 4.5)
    assert (t.compute_end, t.send_start, t.send_end) == (8.5, 8.5, 10.0)
    assert (t.bytes_received, t.bytes_sent) == (300, 100)


def test_the_model_takes_the_longest_window_of_training_and_validation() -> None:
    """ModelSetup sizes a TinyGPT to max(inner.seq_len, data.seq_len): validation windows
    longer than the training ones still fit, and the reverse."""
    for inner, data in ((16, 48), (48, 16)):
        cfg = parse_sim_config(
            {"token_budget": 10, "inner": {"seq_len": inner}, "data": {"seq_len": data}}
        )
        setup = ModelSetup.of(cfg)
        assert setup.seq_len == 48 and setup.tinygpt(50).seq_len == 48
        model = setup.build(50)
        logits = model(torch.zeros(1, 48, dtype=torch.long))
        assert logits.shape[:2] == (1, 48)
