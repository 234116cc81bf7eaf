"""The push turns as a deterministic first-come-first-served schedule, closed form per term:
a push's fluid queue at a narrower hub link, a lone worker's round, the faster of two workers
waiting out the difference of their rounds (a convoy), a dispatch whose ACKs wait behind the
next push's full buffer, dispatches sharing the hub's downlink, the lock test, and where the
planner uses the schedule; the overlapped exchange's ask (compute and dispatch both done)
and the window a dispatch starts from (kept, restarted at each of the server's sends)."""

from __future__ import annotations

import numpy as np
import pytest

from shardmeter.estimate.convoy import (
    SLOT_POLL_S,
    ConvoyWorkers,
    hub_queue_bytes,
    schedule_period,
    turn_convoy,
)
from shardmeter.estimate.wan import (
    BOTTLENECK_QUEUE_S,
    acked_window,
    restart_window,
    slow_start_s,
)

IW = 14_480.0  # bytes: 10 segments of 1448 (RFC 6928)


def workers(**kw: tuple[float, ...]) -> ConvoyWorkers:
    return ConvoyWorkers(**{k: np.array(v, dtype=np.float64) for k, v in kw.items()})


def test_a_push_queues_the_least_of_its_rise_the_buffer_and_its_drain() -> None:
    m, r, c = 600e3, 2.5e6, 1.25e6
    # rises at r − C, peaks when its last byte is in (M/r), drains at C over M/C in all
    assert hub_queue_bytes(0.1, m, r, c) == pytest.approx((r - c) * 0.1)
    assert hub_queue_bytes(m / r, m, r, c) == pytest.approx(m * (1 - c / r))
    assert hub_queue_bytes(0.4, m, r, c) == pytest.approx(m - c * 0.4)
    assert hub_queue_bytes(m / c + 1e-9, m, r, c) == 0.0 and hub_queue_bytes(-0.01, m, r, c) == 0.0
    # a sender far faster than the hub holds the hub's buffer (0.25 s at its rate) full
    assert hub_queue_bytes(0.2, m, 1e12, c) == pytest.approx(BOTTLENECK_QUEUE_S * c)
    # a sender no faster than the hub queues nothing
    assert hub_queue_bytes(0.2, m, c, c) == 0.0


def test_one_worker_runs_its_own_round_and_never_waits() -> None:
    w = workers(compute_s=(1.0,), rtt_s=(0.02,), hold_s=(0.5,), pre_s=(0.03,),
                push_bytes=(0.48e6,), push_Bps=(2e6,), pull_bytes=(0.3e6,),
                pull_Bps=(1e6,), pull_window=(IW,))  # fmt: skip
    c = turn_convoy(w, 1e6)
    d = float(slow_start_s(0.3e6, 1e6, 0.02, start_window=IW))  # its own push is in: no queue
    assert c.dispatch_s == pytest.approx([d])
    assert c.wait_s == pytest.approx([0.0])
    assert c.round_s == pytest.approx([0.5 + 0.03 + d + 0.02 + 1.0])


def test_the_faster_of_two_workers_waits_the_difference_of_their_rounds() -> None:
    # no round trip, no queue: own rounds 0.5 + 0.1 + 1.0 = 1.6 s and 0.5 + 0.1 + 0.9 = 1.5 s;
    # the faster catches up, asks while the slower holds the link, and from then on is
    # granted half a poll after each of the slower one's releases: one period, 1.6 s, and it
    # waits 0.1 s (the poll it waits after a release it spent less in its own round)
    w = workers(compute_s=(1.0, 0.9), rtt_s=(0.0, 0.0), hold_s=(0.5, 0.5), pre_s=(0.0, 0.0),
                push_bytes=(0.5e6, 0.5e6), push_Bps=(1e6, 1e6), pull_bytes=(0.1e6, 0.1e6),
                pull_Bps=(1e6, 1e6), pull_window=(IW, IW))  # fmt: skip
    c = turn_convoy(w, 1e6)
    assert c.locked
    assert c.round_s == pytest.approx([1.6, 1.6])
    assert c.wait_s == pytest.approx([0.0, 1.6 - 1.5])
    assert c.dispatch_s == pytest.approx([0.1, 0.1])


def test_a_dispatch_behind_the_next_push_ack_clocks_at_rtt_plus_the_full_buffer() -> None:
    # two workers with nothing to compute alternate on the link (each asks again long before
    # the other's 2 MB push is in): each round is two turns and two polls; each dispatch
    # crosses while the other's push, from a far faster sender, holds the hub's buffer full,
    # so its slow start doubles once per RTT + 0.25 s
    rtt, hold = 0.02, 0.02 + 2.0
    fast = workers(compute_s=(0.0, 0.0), rtt_s=(rtt, rtt), hold_s=(hold, hold),
                   pre_s=(rtt, rtt), push_bytes=(2e6, 2e6), push_Bps=(1e9, 1e9),
                   pull_bytes=(0.3e6, 0.3e6), pull_Bps=(1e6, 1e6),
                   pull_window=(IW, IW))  # fmt: skip
    c = turn_convoy(fast, 1e6)
    assert c.round_s == pytest.approx([2 * (hold + 0.5 * (SLOT_POLL_S + rtt))] * 2)
    queued = float(slow_start_s(0.3e6, 1e6, rtt + BOTTLENECK_QUEUE_S, start_window=IW))
    assert c.dispatch_s == pytest.approx([queued, queued])
    # the same pushes entering at the hub's own rate queue nothing: the path's RTT alone
    paced = turn_convoy(ConvoyWorkers(**{**fast.__dict__, "push_Bps": np.array([1e6, 1e6])}), 1e6)
    alone = float(slow_start_s(0.3e6, 1e6, rtt, start_window=IW))
    assert paced.dispatch_s == pytest.approx([alone, alone])
    assert queued > 3 * alone


def test_dispatches_crossing_at_once_share_the_hubs_downlink() -> None:
    # pushes of 0.12 s, dispatches of 1 MB each that would take 1 s alone: one always
    # crosses while the other's turn passes, so the downlink never idles and a round is
    # both dispatches' bytes at its rate, 2 s (within a round trip of rate steps)
    w = workers(compute_s=(0.0, 0.0), rtt_s=(0.02, 0.02), hold_s=(0.12, 0.12),
                pre_s=(0.02, 0.02), push_bytes=(0.1e6, 0.1e6), push_Bps=(1e6, 1e6),
                pull_bytes=(1e6, 1e6), pull_Bps=(1e6, 1e6),
                pull_window=(2e6, 2e6))  # fmt: skip
    c = turn_convoy(w, 1e6)
    assert c.round_s == pytest.approx([2.0, 2.0], rel=0.02)


def test_workers_lock_into_one_period_or_drift_at_their_own_rounds() -> None:
    # three workers on the benchmark's shared link (20 Mbit/s each, 10 Mbit/s hub, 0.55 MB
    # pushes), equal compute or one of them 0.5 s slower: one round robin, one period
    hub = 1.25e6 * 0.956
    base = dict(rtt_s=(0.02,) * 3, hold_s=(0.02 + 0.46,) * 3, pre_s=(0.02,) * 3,
                push_bytes=(547_840.0,) * 3, push_Bps=(2.39e6,) * 3,
                pull_bytes=(547_840.0,) * 3, pull_Bps=(hub,) * 3, pull_window=(IW,) * 3)  # fmt: skip
    for compute in ((1.0, 1.0, 1.0), (1.0, 1.0, 1.5)):
        c = turn_convoy(workers(compute_s=compute, **base), hub)
        assert c.locked and float(np.ptp(c.round_s) / np.mean(c.round_s)) < 1e-3
    # two workers of rounds in no whole ratio (1.15 and 1.50 s alone, 50 ms holds) rarely
    # meet: no period, and each runs its own round plus its mean wait (a few ms)
    w = workers(compute_s=(1.0, 1.0 + 2**0.5 / 4), rtt_s=(0.0, 0.0), hold_s=(0.05, 0.05),
                pre_s=(0.0, 0.0), push_bytes=(5e4, 5e4), push_Bps=(1e6, 1e6),
                pull_bytes=(1e5, 1e5), pull_Bps=(1e6, 1e6), pull_window=(IW, IW))  # fmt: skip
    drift = turn_convoy(w, 1e6)
    assert not drift.locked and np.all(drift.wait_s < 0.01)
    alone = w.compute_s + w.hold_s + drift.dispatch_s
    assert drift.round_s == pytest.approx(alone + drift.wait_s, rel=1e-3)


def test_a_schedule_repeats_when_its_grants_and_their_spacing_do() -> None:
    # one worker's grants every 1 s: period 1
    assert schedule_period([0] * 6, [0.0, 1.0, 2.0, 3.0, 4.0, 5.0]) == 1
    # two workers 0, 1, 0, 1 with 0.3 s and 0.7 s between: period 2 (cycle 1 s)
    assert schedule_period([0, 1] * 4, [0.0, 0.3, 1.0, 1.3, 2.0, 2.3, 3.0, 3.3]) == 2
    # a 3:2 lock, worker 0 three grants for worker 1's two: period 5
    order = [0, 1, 0, 0, 1] * 3
    times = [c + x for c in (0.0, 2.0, 4.0) for x in (0.0, 0.4, 0.8, 1.3, 1.6)]
    assert schedule_period(order, times) == 5
    # the same order, but the spacing keeps growing (cycles of 1.0, 1.1, 1.2 s ...): the
    # phases drift, no period
    times = [sum(1.0 + 0.1 * k for k in range(c)) + x for c in range(5) for x in (0.0, 0.3)]
    assert schedule_period([0, 1] * 5, times) is None
    # cycles within CONVOY_LOCK_SPREAD of each other still repeat
    times = [c * (1.0 + 0.001 * (c % 2)) + x for c in range(5) for x in (0.0, 0.3)]
    assert schedule_period([0, 1] * 5, times) == 2


def test_a_long_dispatch_at_its_rate_takes_its_bytes_at_the_rate() -> None:
    # 1 MB at 1 MB/s behind a 1 ms round trip: past slow start it moves in steps of 1/64 of
    # its second (longer than a round trip), each the rate's bytes: slow_start_s's time
    w = workers(compute_s=(1.0,), rtt_s=(0.001,), hold_s=(0.5,), pre_s=(0.001,),
                push_bytes=(0.48e6,), push_Bps=(1e6,), pull_bytes=(1e6,),
                pull_Bps=(1e6,), pull_window=(IW,))  # fmt: skip
    c = turn_convoy(w, 1e6)
    assert c.dispatch_s == pytest.approx([float(slow_start_s(1e6, 1e6, 0.001, start_window=IW))])


def lone(compute: float, hold: float, rtt: float = 0.05, pull: float = 5e5) -> ConvoyWorkers:
    """One worker behind a 1 MB/s hub link it does not outrun (no queue at the hub)."""
    return workers(compute_s=(compute,), rtt_s=(rtt,), hold_s=(hold,), pre_s=(rtt,),
                   push_bytes=(1e5,), push_Bps=(1e6,), pull_bytes=(pull,), pull_Bps=(1e6,),
                   pull_window=(IW,))  # fmt: skip


def test_an_overlapped_worker_asks_once_its_compute_and_its_dispatch_are_done() -> None:
    # the round behind its exchange: ask to ask is the hold, the ack's and pull's round trip,
    # the dispatch (0.5 MB at 1 MB/s, from the window it kept: below) and its RTT back
    fast = turn_convoy(lone(0.1, 0.375), 1e6, overlapped=True)
    assert fast.locked and fast.dispatch_s == pytest.approx([0.5])
    assert fast.round_s == pytest.approx([0.375 + 0.05 + 0.5 + 0.05])
    # a longer compute hides the exchange: the round is the compute (blocking adds them)
    slow = turn_convoy(lone(2.0, 0.375), 1e6, overlapped=True)
    assert slow.round_s == pytest.approx([2.0])
    blocking = turn_convoy(lone(2.0, 0.375), 1e6)
    assert blocking.round_s == pytest.approx([2.0 + 0.375 + 0.05 + blocking.dispatch_s[0] + 0.05])


def test_two_overlapped_workers_on_a_full_link_take_it_in_turn() -> None:
    # 0.5 s holds, 0.2 s of compute, no round trip: each worker waits out the other's hold
    # and the half poll after it; the cycle is both holds and both half polls
    w = workers(compute_s=(0.2, 0.2), rtt_s=(0.0, 0.0), hold_s=(0.5, 0.5), pre_s=(0.0, 0.0),
                push_bytes=(5e5, 5e5), push_Bps=(1e6, 1e6), pull_bytes=(1e5, 1e5),
                pull_Bps=(1e6, 1e6), pull_window=(IW, IW))  # fmt: skip
    c = turn_convoy(w, 1e6, overlapped=True)
    assert c.locked and c.round_s == pytest.approx([1.0 + SLOT_POLL_S] * 2)
    # each asks when its 0.1 s dispatch is in and is granted half a poll after the other's hold
    assert c.wait_s == pytest.approx([1.0 + SLOT_POLL_S - 0.5 - 0.1] * 2)


def test_an_overlapped_dispatch_starts_from_the_window_its_connection_kept() -> None:
    # 0.5 MB at 1 MB/s, 50 ms round trip, RTO 0.25 s (RFC 6298 with Linux's 200 ms floor):
    # the last dispatch left min(W0 + M, 2M, R·(RTT + 0.25 s)) = 300 kB; the worker asks
    # when it is in (an RTT of idle), and the push's ack comes a hold of 0.375 s after the
    # grant: one halving, 103 segments, more than the path holds (50 kB): the rate alone
    left = float(acked_window(5e5, 1e6, 0.05, start_window=3e5))
    kept = float(restart_window(left, 0.375, 0.05))
    assert left == pytest.approx(3e5) and kept == 103 * 1448.0
    assert turn_convoy(lone(0.1, 0.375), 1e6, overlapped=True).dispatch_s == pytest.approx([0.5])
    # a hold of 2 s halves it back to the initial window: slow start again
    from_iw = float(slow_start_s(5e5, 1e6, 0.05, start_window=IW))
    assert float(restart_window(left, 2.0, 0.05)) == IW
    long_hold = turn_convoy(lone(0.1, 2.0), 1e6, overlapped=True)
    assert long_hold.dispatch_s == pytest.approx([from_iw]) and from_iw > 0.55
    # a blocking round's compute of 2 s (8 RTOs) between the dispatch and the ask's answer
    # halves it back to the initial window too
    assert turn_convoy(lone(2.0, 0.375), 1e6).dispatch_s == pytest.approx([from_iw])


def test_each_of_the_servers_sends_restarts_the_window_on_its_own_idle() -> None:
    # 1 MB at 1 MB/s, 0.2 s round trip (RTO 0.4 s): 450 kB kept; the worker computes 2.05 s,
    # so it asks 0.5 s after its dispatch is in (one halving at the answer: 155 segments,
    # above the 200 kB the path holds), and the ack comes 0.35 s after the grant (no
    # halving): the dispatch at the rate. Counted from the dispatch to the ack, the idle of
    # 0.85 s would halve it twice, below the path's 200 kB: slow start
    left = float(acked_window(1e6, 1e6, 0.2, start_window=4.5e5))
    assert left == pytest.approx(4.5e5)
    assert float(restart_window(restart_window(left, 0.5, 0.2), 0.35, 0.2)) == 155 * 1448.0 > 2e5
    assert float(restart_window(left, 0.85, 0.2)) < 2e5
    c = turn_convoy(lone(2.05, 0.35, rtt=0.2, pull=1e6), 1e6, overlapped=True)
    assert c.dispatch_s == pytest.approx([1.0]) and c.round_s == pytest.approx([2.05])


def test_the_rto_comes_from_the_round_trip_the_last_dispatchs_acks_saw(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    # three workers whose pushes queue at the hub (2.39 MB/s into 1.2 MB/s): a dispatch that
    # ends while the next push fills the hub's buffer saw its round trip grow by that queue,
    # up to the buffer's 0.25 s, and the window's next restart takes its RTO from that
    import shardmeter.estimate.convoy as convoy

    seen: list[float] = []

    def recorded(window: float, idle: float, rtt: float, srtt_s: float) -> object:
        seen.append(srtt_s)
        return restart_window(window, idle, rtt, srtt_s=srtt_s)

    monkeypatch.setattr(convoy, "restart_window", recorded)
    hub = 1.25e6 * 0.956
    w = workers(compute_s=(1.0, 1.0, 1.5), rtt_s=(0.02,) * 3, hold_s=(0.48,) * 3,
                pre_s=(0.02,) * 3, push_bytes=(547_840.0,) * 3, push_Bps=(2.39e6,) * 3,
                pull_bytes=(547_840.0,) * 3, pull_Bps=(hub,) * 3, pull_window=(IW,) * 3)  # fmt: skip
    turn_convoy(w, hub)
    assert min(seen) >= 0.02 - 1e-12
    assert 0.02 + 0.1 < max(seen) <= 0.02 + BOTTLENECK_QUEUE_S + 1e-9
