"""The TCP window over an idle connection when a direction's bottleneck queue lies downstream
of its sender (HeLoCo's dispatch at the worker's downlink), closed form per term: the queueing
delay of a transfer's last byte, the smoothed RTT it inflates (RFC 6298's EWMA over a ramp of
samples), the window Linux's slow start leaves, the RTO built from that smoothed RTT, and the
exchange's steady state in each mode."""

from __future__ import annotations

import dataclasses

import numpy as np
import pytest

from shardmeter.estimate import wan as wan_mod
from shardmeter.estimate.outer import outer_round
from shardmeter.estimate.wan import (
    BOTTLENECK_QUEUE_S,
    DELACK_SEGMENTS,
    INITIAL_WINDOW_SEGMENTS,
    SRTT_GAIN,
    WanPaths,
    acked_window,
    burst_queue_s,
    end_window,
    heloco_legs_s,
    restart_window,
)

MSS = 1448.0
IW = INITIAL_WINDOW_SEGMENTS * MSS
R, RTT = 2.5e6, 0.15  # 20 Mbit/s, 150 ms: the BDP is 259 segments


def ewma(samples: list[float], start: float = 0.0) -> float:
    """RFC 6298 eq. (2.3), one sample at a time: SRTT <- (1 − α)·SRTT + α·R'."""
    s = start
    for x in samples:
        s += SRTT_GAIN * (x - s)
    return s


def ramp(n: int, top: float) -> list[float]:
    return [top * (i + 1) / n for i in range(n)]


def test_constants_are_the_rfcs_and_the_rule_of_thumb() -> None:
    assert SRTT_GAIN == 1 / 8 and DELACK_SEGMENTS == 2 and BOTTLENECK_QUEUE_S == 0.25


def test_a_transfer_that_fits_the_window_queues_whole() -> None:
    """200 segments from a kept window of 400 leave at line rate: the last byte waits M/R, and
    the 100 ACK samples (one per two segments) ramp to it."""
    m = 200 * MSS
    q_last, q_srtt = burst_queue_s(m, R, RTT, MSS, start_window=400 * MSS)
    assert q_last == pytest.approx(m / R)
    assert q_srtt == pytest.approx(ewma(ramp(100, m / R)))
    # a long ramp lags its top by d·(1 − g)/g, d = 2·MSS/R per sample
    assert q_srtt == pytest.approx(m / R - 7 * 2 * MSS / R, rel=1e-3)


def test_an_ack_clocked_last_round_queues_half_or_what_passes_the_pipe() -> None:
    """70 segments from IW: rounds of 10, 20 and 40. The last two leave ACK-clocked at twice
    the rate, leaving half of each round queued, or all beyond the BDP when it is smaller."""
    m = 70 * MSS
    q_last, q_srtt = burst_queue_s(m, R, RTT, MSS)
    assert q_last == pytest.approx(20 * MSS / R)
    assert q_srtt == pytest.approx(ewma(ramp(10, 10 * MSS / R) + ramp(20, 20 * MSS / R)))
    small = 5 * MSS / R  # a BDP of 5 segments: 35 of the last 40 stand in the queue
    q_last, q_srtt = burst_queue_s(m, R, small, MSS)
    assert q_last == pytest.approx(35 * MSS / R)
    assert q_srtt == pytest.approx(ewma(ramp(10, 15 * MSS / R) + ramp(20, 35 * MSS / R)))


def test_the_queue_is_at_most_the_bottlenecks_buffer_and_none_without_a_round_trip() -> None:
    q_last, q_srtt = burst_queue_s(5e6, R, RTT, MSS, start_window=1e7)
    assert q_last == pytest.approx(BOTTLENECK_QUEUE_S)
    assert q_srtt < BOTTLENECK_QUEUE_S
    assert burst_queue_s(5e6, R, 0.0, MSS) == (0.0, 0.0)


def test_slow_start_leaves_every_acked_byte_up_to_twice_the_flight_and_the_path() -> None:
    assert acked_window(100 * MSS, R, RTT, MSS, start_window=20 * MSS) == pytest.approx(120 * MSS)
    assert acked_window(100 * MSS, R, RTT, MSS, start_window=150 * MSS) == pytest.approx(200 * MSS)
    assert acked_window(100 * MSS, R, RTT, MSS, start_window=300 * MSS) == pytest.approx(300 * MSS)
    # the path holds its BDP plus the queue: 2.5e6 · (0.15 + 0.25) = 1 MB
    assert acked_window(2e6, R, RTT, MSS, start_window=IW) == pytest.approx(R * (RTT + 0.25))
    # the sender-paced window stops at the slow-start round that carried the BDP
    assert end_window(2e6, R, RTT, MSS) == pytest.approx(32 * IW)


def test_the_rto_comes_from_the_smoothed_rtt_the_connection_measured() -> None:
    w = 64 * IW
    assert restart_window(w, 0.4, RTT, MSS) == pytest.approx(w / 2)  # RTO 0.35 s
    assert restart_window(w, 0.4, RTT, MSS, srtt_s=0.25) == pytest.approx(w)  # RTO 0.45 s
    assert restart_window(w, 0.46, RTT, MSS, srtt_s=0.25) == pytest.approx(w / 2)


def test_the_window_is_halved_in_whole_segments() -> None:
    """Linux keeps cwnd in segments and halves it by a shift: 391 >> 5 = 12, not 12.2 (the
    blocking dispatch on the 150 ms link, measured: 392 segments, restarted at 12)."""
    got = restart_window(391 * MSS + 100.0, 5.0 * 0.35 + 0.01, RTT, MSS)
    assert got == pytest.approx(12 * MSS)
    assert restart_window(391 * MSS + 100.0, 0.3, RTT, MSS) == pytest.approx(391 * MSS + 100.0)


def test_a_queued_sender_idles_its_queue_longer_against_an_rto_with_that_queue() -> None:
    """One step of the dispatch's window: 189 segments sent whole from a window of 404 (what
    the kernel showed); the hub's last send is M/R before the last byte leaves the bottleneck,
    and its RTO is RTT + the smoothed queue + 200 ms."""
    m, w = 189 * MSS, 404 * MSS
    q_last, q_srtt = burst_queue_s(m, R, RTT, MSS, start_window=w)
    left = float(acked_window(m, R, RTT, MSS, start_window=w))
    assert left == pytest.approx(w)
    rto = RTT + q_srtt + 0.2
    for idle, halved in ((rto - q_last - 0.01, 1), (rto - q_last + 0.01, 2)):
        got = wan_mod._next_window(np.float64(m), R, np.float64(RTT), np.float64(w),
                                   np.float64(idle), True)  # fmt: skip
        assert got == pytest.approx(left / halved)
    # the sender-paced direction: its own idle against RTT + 200 ms
    held = float(end_window(m, R, RTT, MSS, start_window=w))
    for idle, halved in ((0.34, 1), (0.36, 2)):
        got = wan_mod._next_window(np.float64(m), R, np.float64(RTT), np.float64(w),
                                   np.float64(idle), False)  # fmt: skip
        assert got == pytest.approx(held / halved)


def test_streaming_on_a_long_link_keeps_the_dispatch_window_as_the_kernel_did() -> None:
    """A fragment of 274 kB each way behind 0.5 s of compute, 20 Mbit/s, 150 ms: the window
    stays whole, each leg one burst, M/R (measured on the emulated link: cwnd 404 and 395,
    never halved; idle 0.40 s against an RTO of 0.46 s at the hub). Were the dispatch paced
    at the hub, its RTO from the base RTT would halve it once a sub-round: two rounds a leg."""
    m = 274e3
    up, down = heloco_legs_s(m, R, RTT, m, 0.5, blocking=False)
    assert up == pytest.approx(m / R) and down == pytest.approx(m / R)
    _, slow = heloco_legs_s(m, R, RTT, m, 0.5, blocking=False, queued=(False, False))
    assert slow > RTT + 0.5 * m / R


def test_a_narrower_shared_hub_link_queues_the_pushes_instead() -> None:
    """The worker's own link the bottleneck: the dispatch queues downstream of the hub. The
    hub's shared link the bottleneck: the hub paces its dispatch and the pushes queue."""
    bw = np.array([[np.inf, R], [R, np.inf]])
    rtt = np.array([[0.0, RTT], [RTT, 0.0]])
    base = WanPaths(("s", "w"), bw, rtt, np.zeros((2, 2)), (0, 1), 0)
    inner = np.array([0.1, 0.1])  # 1 s of compute: each direction idles 2-3 RTOs
    kw = {"inner_steps": 10, "bits": 8, "exchange": "overlapped"}
    m, pull = 68_500.0, 68_500 * 4.0  # an int8 push, the fp32 model back
    rnd = outer_round("async", inner, base, 68_500, **kw)  # type: ignore[arg-type]
    up, down = heloco_legs_s(m, R, RTT, pull, 1.0, blocking=False, queued=(False, True))
    assert rnd.wan_comm_s[1] == pytest.approx(2 * RTT + up + down)
    own = rnd.wan_comm_s[1]
    shared = dataclasses.replace(base, server_Bps=R)
    rnd = outer_round("async", inner, shared, 68_500, **kw)  # type: ignore[arg-type]
    up, down = heloco_legs_s(m, R, RTT, pull, 1.0, blocking=False, queued=(True, False))
    assert rnd.wan_comm_s[1] == pytest.approx(2 * RTT + up + down) != own
