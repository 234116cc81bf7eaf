"""Turns on a shared server link (``link_slots``): the coordinator hands the link to one push at
a time, first come first served; the worker asks before it pushes; the planner prices the
schedule."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import numpy as np
import pytest
from tests.heloco.test_net_coordinator import make_coord, pull, push

from heloco.net import wire
from heloco.net.client import ClientConfig
from heloco.net.coordinator import SLOT_POLL_S, Budget, Coordinator
from heloco.net.link import NetLink
from shardmeter.estimate.outer import _take_turns, _turn_rounds, outer_round
from shardmeter.estimate.wan import WanPaths, slow_start_s


def slot(coord: Coordinator, w: int, incarnation: str = "a") -> str:
    return coord.handle(wire.make("slot", {"worker": w, "incarnation": incarnation})).type


def test_pushes_take_the_link_one_at_a_time_first_come_first_served() -> None:
    coord = make_coord(workers=3, link_slots=True)
    d = [pull(coord, w) for w in range(3)]
    assert slot(coord, 0) == "slot"
    assert slot(coord, 1) == "wait"
    assert slot(coord, 2) == "wait"
    assert slot(coord, 1) == "wait"  # asking again keeps its place, gains nothing
    assert slot(coord, 0) == "slot"  # the holder asking again (a lost grant) keeps it
    assert coord.push_turns.queue == [1, 2]
    assert push(coord, 0, d[0]).type == "ack"  # its push arrived: the link is free
    assert slot(coord, 2) == "wait"  # but worker 1 asked first
    assert slot(coord, 1) == "slot"
    assert slot(coord, 2) == "wait"
    assert push(coord, 1, d[1]).type == "ack"
    assert slot(coord, 2) == "slot"
    assert coord.push_turns.holder == 2 and coord.push_turns.queue == []


def test_without_link_slots_every_transfer_may_go_at_once() -> None:
    coord = make_coord(workers=3)
    assert [slot(coord, w) for w in range(3)] == ["slot"] * 3
    hello = coord.handle(wire.make("hello", {"worker": 0, "incarnation": "a"}))
    assert "link_slots" not in hello.body
    coord = make_coord(workers=3, link_slots=True)  # dispatches never wait for turns
    assert [pull(coord, w).type for w in range(3)] == ["dispatch"] * 3


def test_the_welcome_tells_workers_to_ask() -> None:
    coord = make_coord(workers=2, link_slots=True)
    hello = coord.handle(wire.make("hello", {"worker": 0, "incarnation": "a"}))
    assert hello.type == "welcome" and hello.body["link_slots"] is True


def test_an_evicted_or_replaced_holder_frees_the_link() -> None:
    now = [0.0]
    coord = make_coord(workers=3, link_slots=True, clock=lambda: now[0], t0=0.0)
    coord.evict_after_s = 10.0
    assert slot(coord, 0) == "slot" and slot(coord, 1) == "wait"
    now[0] = 8.0
    assert slot(coord, 1) == "wait" and slot(coord, 2) == "wait"
    now[0] = 12.0  # worker 0 silent for 12 s: evicted, its turn passes to the queue's head
    assert coord.evict_silent() == [0]
    assert slot(coord, 2) == "wait" and slot(coord, 1) == "slot"
    # a new process of worker 1's slot: the old one's turn dies with it
    coord.handle(wire.make("hello", {"worker": 1, "incarnation": "b"}))
    assert coord.push_turns.holder is None
    assert slot(coord, 2) == "slot"


def test_a_worker_that_leaves_frees_the_link() -> None:
    coord = make_coord(workers=2, link_slots=True)
    assert slot(coord, 0) == "slot" and slot(coord, 1) == "wait"
    coord.handle(wire.make("bye", {"worker": 0, "incarnation": "a"}))
    assert slot(coord, 1) == "slot"


def test_each_grant_is_a_turn_event_with_its_first_ask() -> None:
    now = [0.0]
    events: list[dict[str, Any]] = []
    coord = make_coord(workers=2, link_slots=True, clock=lambda: now[0], t0=0.0)
    coord.on_event = events.append
    d = pull(coord, 0)
    assert slot(coord, 0) == "slot"
    now[0] = 1.0
    assert slot(coord, 1) == "wait"  # its first ask
    now[0] = 1.5
    assert slot(coord, 1) == "wait" and slot(coord, 0) == "slot"  # a lost grant: no event
    assert push(coord, 0, d).type == "ack"
    now[0] = 2.0
    assert slot(coord, 1) == "slot"
    turns = [e for e in events if e["type"] == "turn"]
    assert turns == [
        {"type": "turn", "worker": 0, "asked": 0.0, "time": 0.0},
        {"type": "turn", "worker": 1, "asked": 1.0, "time": 2.0},
    ]


def test_the_worker_asks_until_granted_and_then_pushes(monkeypatch: pytest.MonkeyPatch) -> None:
    link = NetLink(ClientConfig("tcp://127.0.0.1:1"), b"k" * 32, 0)
    replies = iter(["wait", "wait", "slot"])
    calls: list[str] = []

    def call(type_: str, body: dict[str, Any] | None = None, result: Any = None) -> wire.Message:
        calls.append(type_)
        kind = next(replies)
        payload = {"retry_s": SLOT_POLL_S, "revision": 0} if kind == "wait" else {"revision": 0}
        return wire.make(kind, payload)

    monkeypatch.setattr(link, "_call", call)
    link.take_link()
    assert calls == []  # the server did not ask for turns
    link.link_slots = True
    link.take_link()
    assert calls == ["slot", "slot", "slot"] and link.slot_waits == 2
    link.client.close()


# -- the planner --------------------------------------------------------------------------------
def test_turns_keep_each_workers_own_round_until_the_link_is_full() -> None:
    remote = np.array([False, True, True, True])
    own = np.array([1.0, 2.0, 2.0, 2.0])
    push = np.array([0.0, 0.5, 0.5, 0.5])
    # 1.5 s of pushes per 2 s round: the link never makes anyone wait
    assert np.allclose(_take_turns(own, (push, 0.5 * push), remote), own)
    # 1 s rounds: three 0.5 s turns make a 1.5 s cycle
    fast = np.array([1.0, 1.0, 1.0, 1.0])
    assert np.allclose(_take_turns(fast, (push, 0.5 * push), remote), [1.0, 1.5, 1.5, 1.5])
    # the busier direction limits: pulls of 0.6 s a round on the other direction
    assert np.allclose(_take_turns(fast, (push, 1.2 * push), remote), [1.0, 1.8, 1.8, 1.8])


def test_turns_give_a_slow_worker_its_own_round_and_the_others_the_rest() -> None:
    remote = np.array([False, True, True, True])
    own = np.array([1.0, 1.0, 1.0, 4.0])
    push = np.array([0.0, 0.5, 0.5, 0.5])
    got = _take_turns(own, (push, 0 * push), remote)
    # the slow worker takes 0.5/4 of the link; the two fast share the rest: c = 1/(1 - 1/8)
    assert np.allclose(got[1:], [8 / 7, 8 / 7, 4.0])
    assert np.isclose((push[1:] / got[1:]).sum(), 1.0)


def star(n: int, server_Bps: float, rtt: float = 0.02, spoke_Bps: float = 2.5e6) -> WanPaths:
    """A hub (island 0) and n spokes of ``spoke_Bps`` each; the hub's own link ``server_Bps``."""
    k = n + 1
    bw = np.full((k, k), spoke_Bps)
    lat = np.zeros((k, k))
    lat[0, 1:] = lat[1:, 0] = rtt
    return WanPaths(
        names=tuple(f"i{i}" for i in range(k)),
        ring=tuple(range(k)),
        bandwidth_Bps=bw,
        rtt_s=lat,
        egress_usd_per_byte=np.zeros((k, k)),
        center=0,
        server_Bps=server_Bps,
    )


@pytest.mark.parametrize("exchange", ["blocking", "overlapped"])
def test_the_planner_prices_turns_instead_of_random_meetings(exchange: str) -> None:
    inner = np.full(4, 0.1)
    kw: dict[str, Any] = {"inner_steps": 10, "bits": 32, "exchange": exchange}
    shared = star(3, 1.25e6)  # spokes of 2.5 MB/s behind one 1.25 MB/s hub link
    fifo = outer_round("async", inner, shared, 150_000, **kw)
    turns = outer_round("async", inner, shared, 150_000, link_slots=True, **kw)
    rtt, leg = 0.02, 600_000 / 1.25e6  # each leg alone at the shared link's rate
    # a push's turn: its push, 1.5 RTT, half a poll
    hold = rtt + leg + 0.5 * (SLOT_POLL_S + rtt)
    # turns never meet, so they beat the random-alignment mean of a shared FIFO
    assert np.all(turns.round_s[1:] < fifo.round_s[1:])
    remote = np.array([False, True, True, True])
    if exchange == "blocking":
        # the dispatch restarts from the initial window after a second of compute; when the
        # next worker's push starts with it, its ACKs wait behind that push at the hub:
        # 300 kB queued from 2.5 MB/s into 1.25 MB/s, 0.12 s on average
        met = float(slow_start_s(600_000, 1.25e6, rtt + 300e3 / 2.5e6))
        assert met > leg + 0.2
        # the worker's own exchange (two requests and replies, its turn's request) plus the
        # dispatch that meets a push, as often as the turn station says, plus its wait
        want_x, want_round, wait, meet = _turn_rounds(
            np.full(4, 3 * rtt + leg), np.full(4, leg), np.full(4, met), np.full(4, hold),
            np.full(4, 1.0), 1.0, True, remote,
        )  # fmt: skip
        drifting = outer_round(
            "async", inner, shared, 150_000, link_slots=True, turn_schedule=False, **kw
        )
        assert np.allclose(drifting.round_s[1:], want_round[1:])
        assert np.allclose(drifting.wan_comm_s[1:], want_x[1:])
        # 0.5 s turns in a 2 s round: the deterministic bound has nobody wait; drifting
        # phases do, and some dispatches meet the next push
        assert np.all(wait[1:] > 0.05) and np.all((meet[1:] > 0.2) & (meet[1:] < 1.0))
        # the schedule: one round robin, a little shorter than the mean over random phases
        assert np.allclose(turns.round_s[1:], turns.round_s[1])
        assert np.all(turns.round_s[1:] < drifting.round_s[1:])
        assert np.allclose(turns.wan_comm_s[1:], turns.round_s[1:] - 1.0)
    else:  # the link is full: one cycle of three turns, a little more where phases drift
        assert np.all(turns.round_s[1:] >= 3 * hold)
        assert np.allclose(turns.round_s[1:], 3 * hold, rtol=0.03)
        # the schedule locks (three equal workers in turn): each waits for its dispatch, so
        # its exchange, ask to dispatch in, is its whole round; the mean-value analysis of
        # drifting phases gives a longer one
        assert np.allclose(turns.wan_comm_s[1:], turns.round_s[1:])
        drifting = outer_round(
            "async", inner, shared, 150_000, link_slots=True, turn_schedule=False, **kw
        )
        assert np.all(drifting.round_s[1:] > turns.round_s[1:] + 0.01)
    # the option changes nothing where the server's link is not shared
    unshared = star(3, float("inf"))
    free = outer_round("async", inner, unshared, 150_000, link_slots=True, **kw)
    assert np.allclose(free.round_s, outer_round("async", inner, unshared, 150_000, **kw).round_s)


def hub_topology(exchange: str, slots: bool) -> Any:
    """docs/wan.md's example: three islands pushing an 8B model's fp32 pseudo-gradients
    through the server island's one 1 Gbit/s link."""
    from shardmeter.specs.topology import topology_from_dict

    return topology_from_dict(
        {
            "run": {"model": "llama-3-8b", "global_batch": 64, "mode": "async",
                    "inner_steps": 10, "bits": 32, "exchange": exchange,
                    "server": "s", "link_slots": slots, "step_time_s": 1.0},
            "islands": [{"name": n, "cluster": "dgx-h100"} for n in ("s", "a", "b", "c")],
            "wan": {"kind": "star", "hub": "s", "server_bandwidth_gbit": 1,
                    "default": {"bandwidth_gbit": 10, "latency_ms": 1}},
        }
    )  # fmt: skip


def test_a_topology_that_takes_turns_is_predicted_with_them() -> None:
    from shardmeter.estimate.islands import predict_topology

    # each spoke alone fills the shared link: turns beat random meetings
    fifo = predict_topology(hub_topology("overlapped", False))
    turns = predict_topology(hub_topology("overlapped", True))
    assert turns.round_s < fifo.round_s


@pytest.mark.parametrize(
    ("exchange", "min_h", "most_runs"), [("blocking", 3351, 80), ("overlapped", None, 120)]
)
def test_an_estimate_and_its_threshold_searches_run_the_turns_schedule(
    monkeypatch: pytest.MonkeyPatch, exchange: str, min_h: int | None, most_runs: int
) -> None:
    """Every configuration the threshold searches (smallest H, smallest WAN to be
    compute-bound, WAN to hide the exchange) evaluate runs the turns' event schedule, the
    one the topology's own configuration runs; they bisect (islands._first_true), so a few
    dozen schedules, not one per grid point."""
    import shardmeter.estimate.outer as outer
    from shardmeter.estimate.islands import predict_topology

    calls: list[int] = []
    schedule = outer.turn_convoy

    def counted(*args: Any, **kwargs: Any) -> Any:
        calls.append(1)
        return schedule(*args, **kwargs)

    monkeypatch.setattr(outer, "turn_convoy", counted)
    est = predict_topology(hub_topology(exchange, True))
    assert est.min_inner_steps is not None and est.min_wan_gbit is not None
    if min_h is not None:
        assert est.min_inner_steps == min_h
    assert 10 <= len(calls) <= most_runs


def test_turns_cost_where_one_push_cannot_fill_the_shared_link() -> None:
    """Spokes at a quarter of the server's rate: three pushes at once fit on the shared link,
    so holding it for one slow push at a time only makes the others wait."""
    inner = np.full(4, 0.1)
    kw: dict[str, Any] = {"inner_steps": 10, "bits": 32, "exchange": "overlapped"}
    slow = star(3, 1.25e6, spoke_Bps=1.25e6 / 4)
    fifo = outer_round("async", inner, slow, 150_000, **kw)
    turns = outer_round("async", inner, slow, 150_000, link_slots=True, **kw)
    assert np.all(turns.round_s[1:] > fifo.round_s[1:])


def test_shardmeter_predict_takes_link_slots_from_the_command_line(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    from shardmeter.cli import main

    topo = tmp_path / "shared.toml"
    topo.write_text(
        '[run]\nmodel = "llama-3-8b"\nglobal_batch = 64\nmode = "async"\ninner_steps = 10\n'
        'bits = 32\nexchange = "overlapped"\nserver = "s"\nstep_time_s = 1.0\n\n'
        '[wan]\nkind = "star"\nhub = "s"\nserver_bandwidth_gbit = 1\n'
        "default = { bandwidth_gbit = 10, latency_ms = 1 }\n\n"
        + "".join(f'[[islands]]\nname = "{n}"\ncluster = "dgx-h100"\n\n' for n in "sabc"),
        encoding="utf-8",
    )
    rates = []
    for extra in ([], ["--link-slots"]):
        assert main(["predict", "--topology", str(topo), "--json", *extra]) == 0
        rates.append(json.loads(capsys.readouterr().out)["tokens_per_s"])
    assert rates[1] > rates[0]  # turns: no two pushes meet on the hub's link


def test_over_the_wire_a_push_waits_for_the_holders_push_to_arrive() -> None:
    import threading
    import time
    from functools import partial

    from tests.heloco.test_net_shards import SECRET, model, round_of_model

    from heloco.net.endpoint import Endpoint, EndpointConfig
    from heloco.outer import OuterConfig, build_optimizer
    from heloco.server import Server, ServerConfig

    init = model()
    opt = build_optimizer("async-nesterov", init, OuterConfig(), 2)
    build = partial(
        Coordinator, Server(init, opt, ServerConfig(n_workers=2)), Budget(), link_slots=True
    )
    endpoint = Endpoint(build, SECRET, EndpointConfig(poll_ms=5))
    address = endpoint.open()
    thread = threading.Thread(target=endpoint.serve, daemon=True)
    thread.start()
    links = [NetLink(ClientConfig(address, timeout_s=5, deadline_s=10), SECRET, w) for w in (0, 1)]
    try:
        for link in links:
            link.join()
            assert link.link_slots  # the welcome said so
        rounds = [round_of_model(link, init)[0] for link in links]
        links[0].take_link()  # worker 0 holds the link, its push not yet sent
        done: list[bool] = []
        second = threading.Thread(
            target=lambda: done.append(links[1].push(rounds[1], 0.1).accepted)
        )
        second.start()
        time.sleep(0.3)
        assert not done and links[1].slot_waits > 0 and endpoint.coord.server.revision == 0
        assert links[0].push(rounds[0], 0.1).accepted  # its arrival passes the turn on
        second.join(10)
        assert done == [True] and endpoint.coord.server.revision == 2
        assert [a.worker for r in endpoint.coord.server.log for a in r.arrivals] == [0, 1]
    finally:
        for link in links:
            link.close()
        endpoint.stop.set()
        thread.join(10)
