"""Closed-form checks of the WAN collectives and outer modes (shardmeter.estimate.outer)."""

from __future__ import annotations

import numpy as np
import pytest

from shardmeter.estimate.outer import outer_round
from shardmeter.estimate.wan import (
    WanPaths,
    best_ring,
    effective_wan_Bps,
    hub_allreduce_s,
    ring_allreduce_s,
)


def uniform_wan(n: int, gbit: float = 10.0, rtt_ms: float = 50.0, usd_gb: float = 0.0) -> WanPaths:
    bw = np.full((n, n), gbit * 1e9 / 8)
    np.fill_diagonal(bw, np.inf)
    rtt = np.full((n, n), rtt_ms * 1e-3)
    np.fill_diagonal(rtt, 0.0)
    price = np.full((n, n), usd_gb / 1e9)
    np.fill_diagonal(price, 0.0)
    return WanPaths(
        names=tuple(f"i{k}" for k in range(n)),
        bandwidth_Bps=bw,
        rtt_s=rtt,
        egress_usd_per_byte=price,
        ring=tuple(range(n)),
        center=0,
    )


@pytest.mark.parametrize("n", [2, 3, 5, 8])
def test_ring_allreduce_matches_textbook(n: int) -> None:
    m, w, a = 20e9, 1.25e9, 0.08
    expected = 2 * (n - 1) / n * m / w + 2 * (n - 1) * a
    assert ring_allreduce_s(m, n, w, a) == pytest.approx(expected, rel=1e-12)


def test_ring_allreduce_one_member_is_free_and_broadcasts() -> None:
    assert ring_allreduce_s(1e9, 1, 1e9, 0.1) == 0.0
    out = ring_allreduce_s(np.array([1e9, 2e9])[:, None], 4, np.array([1e9, 2e9, 4e9]), 0.0)
    assert out.shape == (2, 3)
    assert out[1, 1] == pytest.approx(1.5 * 2e9 / 2e9)


def test_sync_dp_over_wan_is_slowest_step_plus_ring() -> None:
    """Sync DP: every step waits for the slowest island, then a ring over the WAN."""
    wan = uniform_wan(4, gbit=100.0, rtt_ms=30.0)
    n_params = 1e9
    inner = np.array([1.0, 1.2, 0.8, 1.0])
    rnd = outer_round("sync", inner, wan, n_params, bits=16)
    ar = 2 * 3 / 4 * 2e9 / (100e9 / 8) + 2 * 3 * 0.03 / 2  # one-way latency per ring step
    np.testing.assert_allclose(rnd.round_s, 1.2 + ar)
    np.testing.assert_allclose(rnd.straggler_s, [0.2, 0.0, 0.4, 0.2], atol=1e-12)
    np.testing.assert_allclose(rnd.wan_bytes, 2 * 3 / 4 * 2e9)


def test_diloco_blocking_and_eager() -> None:
    wan = uniform_wan(2, gbit=8.0, rtt_ms=0.0)
    inner = np.array([2.0, 2.0])
    comm = 2 * 1 / 2 * 1e9 / 1e9  # 1 GB int8 pseudo-gradient over 1 GB/s, 2 islands
    blocking = outer_round("diloco", inner, wan, 1e9, inner_steps=10, bits=8)
    np.testing.assert_allclose(blocking.round_s, 20.0 + comm)
    eager = outer_round("diloco", inner, wan, 1e9, inner_steps=10, bits=8, overlap=True)
    np.testing.assert_allclose(eager.round_s, 20.0)  # 1 s exchange hides behind 20 s compute
    slow = outer_round(
        "diloco", inner, wan.scaled(1 / 40), 1e9, inner_steps=10, bits=8, overlap=True
    )
    np.testing.assert_allclose(slow.round_s, 40.0)  # 40 s exchange: exposed beyond 20 s


def test_streaming_fragments_hide_behind_tau_steps() -> None:
    wan = uniform_wan(2, gbit=8.0, rtt_ms=0.0)
    inner = np.array([1.0, 1.0])
    # 4 fragments of 0.25 GB (int8, 1e9 params): 0.25 s each; tau = 0 -> all exposed
    s0 = outer_round("streaming", inner, wan, 1e9, inner_steps=100, bits=8, fragments=4)
    np.testing.assert_allclose(s0.round_s, 100.0 + 4 * 0.25)
    s1 = outer_round(
        "streaming", inner, wan, 1e9, inner_steps=100, bits=8, fragments=4, overlap_steps=1
    )
    np.testing.assert_allclose(s1.round_s, 100.0)
    np.testing.assert_allclose(s1.wan_hidden_s, 1.0)  # 4 × 0.25 s, all under compute


def test_async_never_waits_and_server_caps_the_total() -> None:
    wan = uniform_wan(3, gbit=80.0, rtt_ms=0.0)
    inner = np.array([1.0, 2.0, 4.0])
    rnd = outer_round("async", inner, wan, 1e9, inner_steps=10, bits=16)
    np.testing.assert_allclose(rnd.round_s, [10.0, 20.0, 40.0])
    np.testing.assert_allclose(rnd.straggler_s, 0.0)
    # staleness of island 2 (40 s rounds): 40/10 + 40/20 = 6 updates from the others
    assert rnd.staleness[2] == pytest.approx(6.0)
    capped = WanPaths(**{**wan.__dict__, "server_Bps": 0.05e9})  # 2 GB up, 4 GB down
    rc = outer_round("async", inner, capped, 1e9, inner_steps=10, bits=16)
    # the pull is θ in fp32 (4 GB) and the push 2 GB: duplex moves the larger, 80 s alone
    # over the server's 0.05 GB/s; the two exchanges in flight share it equally (processor
    # sharing): 160 s each, 2 × 4 GB per 160 s = the link's 0.05 GB/s
    np.testing.assert_allclose(rc.round_s, [10.0, 160.0, 160.0], rtol=1e-6)
    assert rc.wan_bytes[1] == pytest.approx(6e9)  # push + pull
    # a pull as large as the push (pull_bytes given): 40 s alone, 80 s shared
    same = outer_round("async", inner, capped, 1e9, inner_steps=10, bits=16, pull_bytes=2e9)
    np.testing.assert_allclose(same.round_s, [10.0, 80.0, 80.0], rtol=1e-6)


def test_hub_allreduce_two_phases() -> None:
    t = hub_allreduce_s(1e9, np.array([np.inf, 1e9, 0.5e9]), np.array([0.0, 0.1, 0.2]))
    assert t == pytest.approx(2 * (0.2 + 2.0))
    capped = hub_allreduce_s(1e9, np.array([np.inf, 1e9, 1e9]), np.zeros(3), hub_Bps=1e9)
    assert capped == pytest.approx(2 * 2.0)


def test_tcp_window_limits_bandwidth() -> None:
    # 4 streams × 16 MB / 0.1 s = 640 MB/s < 1.25 GB/s link
    assert effective_wan_Bps(1.25e9, 0.1, 4, 16e6) == pytest.approx(6.4e8)
    assert effective_wan_Bps(1.25e9, 0.1) == pytest.approx(1.25e9)


def test_best_ring_avoids_slow_link() -> None:
    bw = np.full((4, 4), 10.0)
    np.fill_diagonal(bw, np.inf)
    bw[0, 1] = bw[1, 0] = 1.0  # the ring 0-1-2-3 would use it; 0-2-1-3 does not
    order = best_ring(bw)
    edges = {frozenset((order[k], order[(k + 1) % 4])) for k in range(4)}
    assert frozenset((0, 1)) not in edges


def test_vectorized_over_h_and_bandwidth() -> None:
    wan = uniform_wan(3)
    inner = np.array([[1.0, 1.1, 0.9]])
    h = np.array([1, 10, 100])[:, None]
    scale = np.array([0.1, 1.0, 10.0, 100.0])
    rnd = outer_round("diloco", inner, wan, 1e9, inner_steps=h, bandwidth_scale=scale, bits=4)
    assert rnd.round_s.shape == (3, 4, 3)
    util = rnd.utilization
    assert np.all(np.diff(util, axis=0) >= 0) and np.all(np.diff(util, axis=1) >= 0)
    one = outer_round("diloco", inner[0], wan.scaled(10.0), 1e9, inner_steps=100, bits=4)
    np.testing.assert_allclose(rnd.round_s[2, 2], one.round_s)


def test_vectorized_over_bits_and_fragments() -> None:
    wan = uniform_wan(4, gbit=1.0, rtt_ms=100.0)
    bits = np.array([16, 8, 4])[:, None]
    frags = np.array([1, 2, 4, 8])
    rnd = outer_round(
        "streaming", np.full(4, 1.0), wan, 1e9, inner_steps=64, bits=bits, fragments=frags
    )
    assert rnd.round_s.shape == (3, 4, 4)
    one = outer_round("streaming", np.full(4, 1.0), wan, 1e9, inner_steps=64, bits=8, fragments=4)
    np.testing.assert_allclose(rnd.round_s[1, 2], one.round_s)
    # more fragments: same bytes, more latency-bound rounds: never faster when τ = 0
    assert np.all(np.diff(rnd.round_s[..., 0], axis=1) >= 0)


def test_window_limited_link_in_topology() -> None:
    from shardmeter.estimate.wan import link_Bps
    from shardmeter.specs.topology import WanLinkParams

    link = WanLinkParams(bandwidth_gbit=10.0, latency_ms=200.0, streams=1, window_mb=16.0)
    assert link_Bps(link) == pytest.approx(16e6 / 0.2)
    flat = WanLinkParams(bandwidth_gbit=10.0, efficiency=0.5, latency_ms=0.0)
    assert link_Bps(flat) == pytest.approx(0.625e9)
