"""The link clock and the overlapped exchange on the simulated clock, and the server's side.

Tiny runs (one or two workers, 2 inner steps a round) whose times follow from the formulas by
hand: a link of ``mbit`` Mbit/s and ``latency`` s moves B bytes in latency + B / (mbit·1e6/8)
seconds, and an overlapped worker's rounds follow max(compute, exchange) instead of their sum.
"""

from __future__ import annotations

import json
import math
from collections.abc import Callable
from pathlib import Path
from typing import Any

import pytest
import torch

from heloco.config import RunConfig
from heloco.metrics import round_event
from heloco.outer import build_optimizer
from heloco.overlap import eager_start, overlapped_dispatch
from heloco.server import ArrivalRecord, Server, ServerConfig, SubmissionRejected
from heloco.sim import build_run, parse_sim_config, run_simulation
from heloco.sim.build import ClockSetup
from heloco.sim.clock import InnerSetup, link_seconds, request_seconds, resolve_links
from heloco.sim.loop import simulate
from heloco.types import Dispatch, RoundResult, RoundTiming
from shardmeter.errors import UserInputError

ROUND_TOKENS = 2 * 2 * 32


@pytest.fixture
def values(tiny_net_values: Callable[..., dict[str, Any]]) -> Callable[..., dict[str, Any]]:
    def make(**over: Any) -> dict[str, Any]:
        v = tiny_net_values(method="heloco", workers=1, token_budget=6 * ROUND_TOKENS)
        v.update(over)
        return v

    return make


def n_params(v: dict[str, Any]) -> int:
    parts = build_run(parse_sim_config(v))
    return sum(p.numel() for p in parts.model.parameters())


def rounds_of(out: Path) -> list[dict[str, Any]]:
    lines = (out / "events.jsonl").read_text().splitlines()
    return [e for e in map(json.loads, lines) if e.get("type") == "round"]


def mbit_for(nbytes: int, seconds: float) -> float:
    """The Mbit/s at which ``nbytes`` take ``seconds``."""
    return nbytes * 8 / 1e6 / seconds


# -- the link clock ---------------------------------------------------------------------------
def test_link_seconds_is_latency_plus_bytes_over_rate() -> None:
    assert link_seconds(1_000_000, 8.0, 0.05) == pytest.approx(1.05)  # 1 MB at 1 MB/s
    assert link_seconds(0, 100.0, 0.02) == pytest.approx(0.02)


def test_a_leg_is_a_request_and_its_reply() -> None:
    """Each leg of the exchange waits for a reply (the push for its ack, the pull's request
    for the dispatch): two one-way latencies per leg, one round trip, as the runtime pays."""
    assert request_seconds(1_000_000, 8.0, 0.05) == pytest.approx(1.10)
    assert request_seconds(0, 100.0, 0.02) == pytest.approx(0.04)


def test_links_charge_payload_up_and_dispatch_down(values: Callable[..., dict[str, Any]]) -> None:
    v = values(workers=2, link_mbit=[8.0, 16.0], link_latency=[0.1, 0.0])
    n = n_params(v)
    links = resolve_links(InnerSetup.of(parse_sim_config(v)), [n])
    assert links is not None
    assert links.pull_bytes == 4 * n and links.push_bytes == [4 * n, 4 * n]
    assert links.up[0] == pytest.approx(2 * 0.1 + 4 * n / 1e6)  # a round trip + the bytes
    assert links.down[0] == pytest.approx(2 * 0.1 + 4 * n / 1e6)
    assert links.down[1] == pytest.approx(4 * n / 2e6)
    sign = resolve_links(
        InnerSetup.of(parse_sim_config(values(payload="sign", link_mbit=[8.0]))), [n]
    )
    assert sign is not None and sign.push_bytes[0] < 4 * n / 16  # 1 bit + a scale per group
    # a shared server link of 8 Mbit/s gives each of 2 workers 4 Mbit/s
    shared = resolve_links(InnerSetup.of(parse_sim_config(values(**v, server_link_mbit=8.0))), [n])
    assert shared is not None and shared.down[1] == pytest.approx(4 * n / 0.5e6)


def test_blocking_round_takes_compute_plus_both_legs(
    values: Callable[..., dict[str, Any]], tmp_path: Path
) -> None:
    """Pace 1 s, 2 steps: each round is down + 2 s + up; the events split it."""
    v = values()
    n = n_params(v)
    mbit = mbit_for(4 * n, 1.0)  # 1 s per leg
    run_simulation(parse_sim_config(values(link_mbit=[mbit], out_dir=tmp_path)))
    rounds = rounds_of(tmp_path)
    assert [r["time"] for r in rounds] == pytest.approx([4.0, 8.0, 12.0, 16.0, 20.0, 24.0])
    first = rounds[0]
    assert (first["recv_start"], first["recv_end"]) == pytest.approx((0.0, 1.0))
    assert (first["compute_start"], first["compute_end"]) == pytest.approx((1.0, 3.0))
    assert (first["send_start"], first["send_end"]) == pytest.approx((3.0, 4.0))
    assert first["bytes_sent"] == first["bytes_received"] == 4 * n


def test_fixed_comm_delays_keep_one_lump(values: Callable[..., dict[str, Any]], tmp_path: Path):
    """Without link rates the round still takes compute + comm_delays (the lump is split by
    bytes only in the record)."""
    run_simulation(parse_sim_config(values(comm_delays=[0.5], out_dir=tmp_path)))
    first = rounds_of(tmp_path)[0]
    assert first["time"] == pytest.approx(2.5) and first["send_end"] == pytest.approx(2.5)
    assert first["compute_end"] - first["compute_start"] == pytest.approx(2.0)


# -- the overlapped exchange ------------------------------------------------------------------
def test_overlapped_rounds_hide_the_exchange(
    values: Callable[..., dict[str, Any]], tmp_path: Path
) -> None:
    """Exchange 2 s (1 s each way) = compute 2 s: blocking 4 s a round, overlapped 2 s after
    the first, and every round after the first one round of updates staler."""
    v = values()
    mbit = mbit_for(4 * n_params(v), 1.0)
    blocking = run_simulation(parse_sim_config(values(link_mbit=[mbit])))
    over = run_simulation(
        parse_sim_config(values(link_mbit=[mbit], exchange="overlapped", out_dir=tmp_path))
    )
    rounds = rounds_of(tmp_path)
    assert [r["time"] for r in rounds] == pytest.approx([4.0, 6.0, 8.0, 10.0, 12.0, 14.0])
    assert blocking.summary.time == pytest.approx(24.0) and over.summary.time == pytest.approx(14)
    second = rounds[1]  # trains from D_0 + its own Δ_0 while Δ_0 and D_1 travel
    assert (second["compute_start"], second["compute_end"]) == pytest.approx((3.0, 5.0))
    assert (second["send_start"], second["send_end"]) == pytest.approx((5.0, 6.0))
    assert (rounds[2]["recv_start"], rounds[2]["recv_end"]) == pytest.approx((4.0, 5.0))
    assert blocking.summary.staleness_mean == [0.0]
    assert over.summary.staleness_mean == pytest.approx([5 / 6])
    assert over.summary.tokens == blocking.summary.tokens == 6 * ROUND_TOKENS
    assert over.losses[-1] < over.losses[0]


def test_slow_link_waits_for_the_dispatch(
    values: Callable[..., dict[str, Any]], tmp_path: Path
) -> None:
    """Exchange 4 s (2 s each way) > compute 2 s: a round's push leaves when its dispatch is
    in, so rounds are 4 s apart after the first: the link is the bottleneck."""
    v = values()
    mbit = mbit_for(4 * n_params(v), 2.0)
    run_simulation(
        parse_sim_config(values(link_mbit=[mbit], exchange="overlapped", out_dir=tmp_path))
    )
    times = [r["time"] for r in rounds_of(tmp_path)]
    assert times == pytest.approx([6.0, 10.0, 14.0, 18.0, 22.0, 26.0])


def test_eager_and_delayed_starts_differ(values: Callable[..., dict[str, Any]]) -> None:
    eager = run_simulation(parse_sim_config(values(exchange="overlapped")))
    delayed = run_simulation(parse_sim_config(values(exchange="overlapped", overlap_eager=0.0)))
    blocking = run_simulation(parse_sim_config(values()))
    assert eager.losses[0] == delayed.losses[0] == blocking.losses[0]
    assert len({eager.losses[-1], delayed.losses[-1], blocking.losses[-1]}) == 3


def test_eager_start_subtracts_lambda_delta() -> None:
    theta = {"w": torch.tensor([1.0, 2.0])}
    delta = {"w": torch.tensor([0.5, -1.0])}
    assert torch.equal(eager_start(theta, delta, 1.0)["w"], torch.tensor([0.5, 3.0]))
    assert torch.equal(eager_start(theta, delta, 0.5)["w"], torch.tensor([0.75, 2.5]))
    assert torch.equal(eager_start(theta, delta, 0.0)["w"], theta["w"])
    latest = Dispatch(theta, 3, 5, 7, 0)
    answer = Dispatch(theta, 4, 2, 8, 0)
    d = overlapped_dispatch(latest, delta, 1.0, answer)
    assert (d.revision, d.steps, d.round_id, d.worker) == (3, 5, 8, 0)


def test_overlapped_kill_loses_nothing_accepted_and_doubles_nothing(
    values: Callable[..., dict[str, Any]],
    arrivals_once: Callable[[RunConfig], list[ArrivalRecord]],
) -> None:
    """A worker killed with a push in flight: that round is lost, every accepted round is
    applied once, and the worker rejoins with a fresh (blocking) first round."""
    cfg = parse_sim_config(
        values(
            workers=2,
            paces=[1.0, 1.5],
            comm_delays=None,
            link_mbit=[mbit_for(4 * n_params(values()), 1.0)] * 2,
            exchange="overlapped",
            token_budget=12 * ROUND_TOKENS,
            failures=[{"worker": 1, "at": 5.5, "down": 3.0}],
        )
    )
    w1 = [a for a in arrivals_once(cfg) if a.worker == 1]
    assert [a.round_id for a in w1] == sorted(a.round_id for a in w1) and len(w1) >= 2
    assert w1[1].staleness >= 0


# -- the server -------------------------------------------------------------------------------
def _server(overlapped: bool) -> Server:
    init = {"w": torch.zeros(2)}
    opt = build_optimizer("heloco", init, parse_sim_config({"token_budget": 1}).outer, 1, [1.0])
    return Server(init, opt, ServerConfig(n_workers=1, inner_steps=2, overlapped=overlapped))


def _result(rid: int, base: int, steps: int = 2) -> RoundResult:
    return RoundResult(0, {"w": torch.ones(2)}, steps, 8, 1.0, base, rid)


def test_server_accepts_the_previous_base_only_when_overlapped() -> None:
    for overlapped in (False, True):
        s = _server(overlapped)
        s.dispatch(0)
        s.submit(_result(0, 0))
        s.dispatch(0)  # revision 1, previous dispatch at 0
        if overlapped:
            assert s.dispatched_steps(0) == 2
            s.submit(_result(1, 0))  # trained from D_0 while D_1 travelled
            assert s.log[-1].arrivals[0].staleness == 1  # revision 1 − base 0
        else:
            with pytest.raises(SubmissionRejected, match="revision_mismatch"):
                s.submit(_result(1, 0))
    s = _server(True)
    s.dispatch(0)
    s.submit(_result(0, 0))
    s.evict(0)  # a restarted worker's first round is based on its own dispatch
    s.dispatch(0)
    with pytest.raises(SubmissionRejected, match="revision_mismatch"):
        s.submit(_result(1, 0))
    state = _server(True)
    state.dispatch(0)
    restored = _server(True)
    restored.load_state_dict(state.state_dict())
    restored.submit(_result(0, 0))
    restored.dispatch(0)
    restored.submit(_result(1, 0))


def test_bad_values_name_field_value_and_rule(
    refused: Callable[[list[tuple[dict[str, Any], str]]], None],
) -> None:
    cases: list[tuple[dict[str, Any], str]] = [
        (dict(link_mbit=[0.0]), "link_mbit"),
        (dict(link_mbit=[1.0, 2.0]), "link_mbit"),
        (dict(link_latency=[0.1]), "link_latency"),
        (dict(link_mbit=[1.0], comm_delays=[0.1]), "link_mbit"),
        (dict(link_mbit=[1.0], link_latency=[-1.0]), "link_latency"),
        (dict(exchange="overlapped", method="sync"), "exchange"),
        (dict(exchange="overlapped", grace_window=1.0), "exchange"),
        (dict(exchange="sideways"), "exchange"),
        (dict(overlap_eager=2.0), "overlap_eager"),
    ]
    refused(cases)


def test_round_event_writes_timing_fields_of_the_contract() -> None:
    t = RoundTiming(0.0, 1.0, 1.0, 3.0, 3.0, 4.0, 10, None)
    e = round_event(0, 1, 2, 8, math.nan, 0.0, 4.0, t)
    assert {k for k in e if k not in ("type", "worker", "round_id", "steps", "tokens")} == {
        "train_loss",
        "start",
        "time",
        "recv_start",
        "recv_end",
        "compute_start",
        "compute_end",
        "send_start",
        "send_end",
        "bytes_sent",
    }
    assert "recv_start" not in round_event(0, 1, 2, 8, 1.0, 0.0, 4.0)


def test_exchange_flags_reach_the_config(capsys: pytest.CaptureFixture[str]) -> None:
    from heloco.cli import main
    from heloco.net.worker_loop import WorkerOptions

    assert main(["simulate", "--exchange", "overlapped", "--print-config"]) == 0
    assert 'exchange = "overlapped"' in capsys.readouterr().out
    assert main(["simulate", "--exchange", "overlapped", "--method", "sync", "--quiet"]) == 2
    err = capsys.readouterr().err.strip()
    assert err.count("\n") == 0 and "exchange" in err and "'blocking'" in err
    with pytest.raises(UserInputError, match="--exchange"):
        WorkerOptions(worker=0, exchange="sideways")
    from heloco.cli import build_parser
    from heloco.cli.launch import run_config

    args = build_parser().parse_args(["launch", "--out", "x", "--exchange", "overlapped"])
    assert run_config(args).exchange == "overlapped"


@pytest.mark.parametrize("exchange", ["blocking", "overlapped"])
def test_outer_loop_in_process_matches_simulator(
    values: Callable[..., dict[str, Any]],
    outer_loop_run: Callable[..., list[ArrivalRecord]],
    exchange: str,
) -> None:
    """OuterLoop over a LocalLink (the background exchange in a thread, no sockets) ends with
    the simulator's parameters, bit for bit: one scheme, two drivers."""
    cfg = parse_sim_config(values(exchange=exchange))
    arrivals = outer_loop_run(cfg, exchange=exchange, eager=cfg.overlap_eager)
    staleness = [a.staleness for a in arrivals]
    assert staleness == ([0] * 6 if exchange == "blocking" else [0, 1, 1, 1, 1, 1])


def test_evicted_overlapped_worker_starts_over_without_a_refused_round(
    values: Callable[..., dict[str, Any]],
) -> None:
    """Another worker's update lands and the server evicts worker 0 while its third push
    travels: that push is refused (evicted); the round in training, based on an older
    revision than the fresh dispatch, is dropped and a first round starts from that dispatch,
    so no later push is refused."""
    from heloco.outer_loop import LocalLink, OuterLoop
    from heloco.types import PushOutcome

    cfg = parse_sim_config(values(workers=2, exchange="overlapped", token_budget=8 * ROUND_TOKENS))
    parts = build_run(cfg)
    worker = parts.worker(0)
    reasons: list[str] = []

    class Evicting(LocalLink):
        def push(self, result: RoundResult, compute_s: float) -> PushOutcome:
            if self.rounds == 2:  # worker 1's round lands, then worker 0 is evicted
                d = self.server.dispatch(1)
                zero = {k: torch.zeros_like(v) for k, v in d.params.items()}
                self.server.submit(RoundResult(1, zero, 1, 64, 1.0, d.revision, d.round_id))
                self.server.evict(0)
            out = super().push(result, compute_s)
            reasons.append(out.reason)
            return out

    link = Evicting(parts.server, 0, token_budget=cfg.token_budget)
    outer = OuterLoop(
        worker.model, worker.optimizer, link, hook=False, rounds=worker.boundary,
        exchange="overlapped",
    )  # fmt: skip
    with outer:
        while not outer.done:
            outer.step(worker.inner_step(), worker.sampler.tokens_per_batch)
    assert reasons[2] == "evicted" and set(reasons[:2] + reasons[3:]) == {""}, reasons
    mine = [a for r in parts.server.log for a in r.arrivals if a.worker == 0]
    assert len(mine) == 8 and len({a.round_id for a in mine}) == 8
    assert mine[2].staleness == 0  # the first round after the restart: from its dispatch


def test_decoupled_quorum_runs_overlapped(values: Callable[..., dict[str, Any]]) -> None:
    """A quorum merge does not hold its workers, so they may overlap; every round is merged
    once and the staleness rises as in the asynchronous methods."""
    over = {"method": "decoupled", "workers": 3, "paces": [1.0, 1.0, 2.0], "quorum": 2}
    budget = 12 * ROUND_TOKENS
    blocking = run_simulation(parse_sim_config(values(**over, token_budget=budget)))
    cfg = parse_sim_config(values(**over, token_budget=budget, exchange="overlapped"))
    parts = build_run(cfg)
    simulate(parts.server, [parts.worker(w) for w in range(3)], ClockSetup.of(cfg).build(parts.paces, parts.comm, parts.links),
             parts.evaluate)  # fmt: skip
    seen = [(a.worker, a.round_id) for r in parts.server.log for a in r.arrivals]
    assert len(seen) == len(set(seen)) >= 12
    mean = sum(a.staleness for r in parts.server.log for a in r.arrivals) / len(seen)
    assert mean > sum(blocking.summary.staleness_mean) / 3


def test_overlapped_round_seconds_hide_the_exchange(values: Callable[..., dict[str, Any]]):
    """A round's planned length (server rates, cosine length under ``inner_schedule =
    "budget"``, the eval cycle) is max(H·pace, comm) overlapped, H·pace + comm blocking."""
    from heloco.sim.clock import round_seconds

    assert round_seconds([2, 4], [1.0, 1.0], [3.0, 1.0]) == [5.0, 5.0]
    assert round_seconds([2, 4], [1.0, 1.0], [3.0, 1.0], overlapped=True) == [3.0, 4.0]
    over = {"comm_delays": [2.0], "inner_schedule": "budget", "time_budget": 40.0}
    over["token_budget"] = None
    blocking = build_run(parse_sim_config(values(**over)))
    overlapped = build_run(parse_sim_config(values(**over, exchange="overlapped")))
    assert blocking.inner[0].total_steps == 20  # 40 s of 4 s rounds of 2 steps
    assert overlapped.inner[0].total_steps == 40  # 40 s of 2 s rounds
