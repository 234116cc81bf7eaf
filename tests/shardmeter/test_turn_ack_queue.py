"""Turns on a shared server link as the kernel and the workers' drifting phases run them,
closed form per term: the queue a push builds at a narrower hub link (a fluid triangle), a
dispatch's ACK clock behind it, the push turns as one first-come-first-served station (exact
mean-value analysis with the residual-life correction for a fixed hold, and its
Bard-Schweitzer estimate beyond eight workers), and the rounds they give."""

from __future__ import annotations

import numpy as np
import pytest

from shardmeter.estimate import outer as outer_mod
from shardmeter.estimate.outer import _turn_rounds, _turn_station
from shardmeter.estimate.wan import (
    BOTTLENECK_QUEUE_S,
    heloco_legs_s,
    hub_push_queue_s,
    slow_start_s,
)


def test_a_push_into_a_narrower_hub_link_queues_a_triangle() -> None:
    # 600 kB from 2.5 MB/s into 1.25 MB/s: half of it is still queued at its last byte in,
    # 300 kB (0.24 s at the hub's rate), and the mean over its 0.48 s crossing is half that
    assert float(hub_push_queue_s(600e3, 2.5e6, 1.25e6)) == pytest.approx(300e3 / 2.5e6)
    # a sender far faster than the hub fills the hub's buffer (0.25 s at its rate) and stops
    assert float(hub_push_queue_s(600e3, 1e12, 1.25e6)) == pytest.approx(
        BOTTLENECK_QUEUE_S * 1.25e6 / (2 * 1.25e6)
    )
    # a sender no faster than the hub queues nothing; nor does an unshaped hub
    assert float(hub_push_queue_s(600e3, 1.25e6, 1.25e6)) == 0.0
    assert float(hub_push_queue_s(600e3, 2.5e6, np.inf)) == 0.0


def test_the_pulls_ack_clock_runs_a_round_trip_plus_the_ack_wait() -> None:
    up0, down0 = heloco_legs_s(600e3, 1.25e6, 0.02, 550e3)
    up, down = heloco_legs_s(600e3, 1.25e6, 0.02, 550e3, ack_delay_s=0.12)
    assert float(up) == pytest.approx(float(up0))  # the push's own clock is untouched
    assert float(down) == pytest.approx(float(slow_start_s(550e3, 1.25e6, 0.14)))
    assert float(down) > float(down0)
    # a kept window that already carries rate × (RTT + wait) does not feel the wait
    kept = 1.25e6 * 0.3
    assert float(slow_start_s(550e3, 1.25e6, 0.14, start_window=kept)) == pytest.approx(
        550e3 / 1.25e6
    )


def test_one_worker_never_waits_for_its_turn() -> None:
    resp, busy_without = _turn_station(np.array([0.5]), np.array([1.5]))
    assert resp == pytest.approx([0.5]) and busy_without == pytest.approx([0.0])


def test_two_workers_wait_half_a_hold_for_each_push_they_find() -> None:
    d, z = 0.5, 1.5
    resp, busy_without = _turn_station(np.array([d, d]), np.array([z, z]))
    u1 = d / (z + d)  # the other worker alone: its station's busy share
    # Reiser-Lavenberg: R = D(1 + Q(1)) less the half hold a push in service has left
    assert resp == pytest.approx([d * (1 + u1) - u1 * d / 2] * 2)
    assert busy_without == pytest.approx([u1, u1])


def test_three_workers_by_the_recursion_written_out() -> None:
    d, z = 0.49, 1.66
    r1 = d
    x1 = 1 / (z + r1)
    q1 = u1 = x1 * d
    r2 = d * (1 + q1) - u1 * d / 2
    x2 = 1 / (z + r2)
    q2, u2 = 2 * x2 * r2, 2 * x2 * d
    r3 = d * (1 + q2) - u2 * d / 2
    resp, busy_without = _turn_station(np.full(3, d), np.full(3, z))
    assert resp == pytest.approx([r3] * 3) and busy_without == pytest.approx([u2] * 3)
    # the benchmark's blocking turns: a wait of about 0.13 s a round (measured 0.08-0.14)
    assert 0.1 < r3 - d < 0.16


def test_beyond_the_exact_limit_the_schweitzer_estimate_solves_its_fixed_point(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    d, z, n = 0.3, 4.0, 5
    exact, u_exact = _turn_station(np.full(n, d), np.full(n, z))
    monkeypatch.setattr(outer_mod, "EXACT_MVA_MAX_WORKERS", 2)
    r, u = _turn_station(np.full(n, d), np.full(n, z))
    x = 1 / (z + r[0])
    q, busy = x * r[0], x * d
    assert r[0] == pytest.approx(d * (1 + (n - 1) * q) - (n - 1) * busy * d / 2, rel=1e-6)
    assert u[0] == pytest.approx((n - 1) * busy)
    assert r[0] == pytest.approx(exact[0], rel=0.05) and u[0] == pytest.approx(u_exact[0], rel=0.1)


def test_blocking_rounds_add_the_wait_and_the_dispatches_that_meet_a_push() -> None:
    remote = np.array([False, True, True, True])
    hold = np.array([0.0, 0.5, 0.5, 0.5])
    rest, dispatch, met = np.full(4, 0.55), np.full(4, 0.47), np.full(4, 0.8)
    busy = np.full(4, 1.0)
    exchange, round_s, wait, meet = _turn_rounds(rest, dispatch, met, hold, busy, 1.0, True, remote)
    idx = [1, 2, 3]
    # the fixed point: the station, solved at the think time the rounds give, returns the
    # wait and the meeting share that give those rounds
    resp, busy_without = _turn_station(hold[idx], round_s[idx] - hold[idx] - wait[idx])
    assert resp - hold[idx] == pytest.approx(wait[idx], rel=1e-6)
    assert busy_without == pytest.approx(meet[idx], rel=1e-6)
    assert round_s[idx] == pytest.approx(
        busy[idx] + rest[idx] + dispatch[idx] + meet[idx] * (met[idx] - dispatch[idx])
        + wait[idx]
    )  # fmt: skip
    assert exchange[idx] == pytest.approx(round_s[idx] - busy[idx])
    assert np.all(meet[idx] > 0.3) and np.all(wait[idx] > 0.05)
    # the server's own island takes no turns and exchanges nothing: its round is its compute
    assert wait[0] == 0.0 and meet[0] == 0.0 and exchange[0] == 0.0 and round_s[0] == busy[0]


def test_overlapped_rounds_hide_the_wait_behind_compute_until_the_exchange_is_longer() -> None:
    remote = np.array([False, True, True])
    hold = np.array([0.0, 0.2, 0.2])
    rest, dispatch, met = np.full(3, 0.3), np.full(3, 0.25), np.full(3, 0.25)
    busy = np.full(3, 2.0)  # a long round: the exchange and its wait hide behind it
    exchange, round_s, wait, _ = _turn_rounds(rest, dispatch, met, hold, busy, 1.0, False, remote)
    assert round_s[1:] == pytest.approx([2.0, 2.0]) and np.all(wait[1:] > 0)
    assert exchange[1:] == pytest.approx(rest[1:] + dispatch[1:] + wait[1:])
    short = np.full(3, 0.1)  # the exchange and its wait are the round
    exchange, round_s, wait, _ = _turn_rounds(rest, dispatch, met, hold, short, 1.0, False, remote)
    assert round_s[1:] == pytest.approx(rest[1:] + dispatch[1:] + wait[1:])
