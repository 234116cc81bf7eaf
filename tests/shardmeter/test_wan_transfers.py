"""WAN transfers as TCP sends them, closed form per term: one-way latency per ring step and per
hub phase, Linux's default window cap (lifted by streams or a stated window), slow start from
the initial window, header goodput, transport fractions, the collective patterns and HeLoCo's
own exchange."""

from __future__ import annotations

import math

import numpy as np
import pytest

from shardmeter.estimate.outer import collective, outer_round
from shardmeter.estimate.wan import (
    DEFAULT_WINDOW_BYTES,
    HELOCO_SERVER_PUSH_BPS,
    INITIAL_RWND_BYTES,
    INITIAL_WINDOW_SEGMENTS,
    LINUX_TCP_RMEM_MAX,
    LINUX_TCP_WMEM_MAX,
    TRANSPORT_EFFICIENCY,
    TRANSPORT_HOST_BPS,
    WINDOW_FILL,
    TcpPath,
    WanPaths,
    goodput_Bps,
    heloco_exchange_s,
    link_Bps,
    pattern_s,
    slow_start_s,
    stream_Bps,
)
from shardmeter.specs.topology import WanLinkParams

MSS = 1448.0
IW = INITIAL_WINDOW_SEGMENTS * MSS


def uniform(n: int, Bps: float, rtt: float) -> WanPaths:
    bw = np.full((n, n), Bps)
    np.fill_diagonal(bw, np.inf)
    r = np.full((n, n), rtt)
    np.fill_diagonal(r, 0.0)
    return WanPaths(tuple(f"i{k}" for k in range(n)), bw, r, np.zeros((n, n)), tuple(range(n)), 0)


def test_default_window_is_linux_buffers_times_the_measured_fill() -> None:
    assert LINUX_TCP_RMEM_MAX == 6 * 2**20 and LINUX_TCP_WMEM_MAX == 4 * 2**20
    assert pytest.approx(WINDOW_FILL * 4 * 2**20) == DEFAULT_WINDOW_BYTES


def test_one_stream_over_100ms_at_10gbit_is_window_limited_by_default() -> None:
    link = WanLinkParams(bandwidth_gbit=10.0, latency_ms=100.0)
    assert link_Bps(link) == pytest.approx(DEFAULT_WINDOW_BYTES / 0.1)
    assert link_Bps(link) < 0.05 * 10e9 / 8  # under 500 Mbit/s on a 10 Gbit/s path
    # more streams or a bigger window lift the cap, up to the link
    four = WanLinkParams(bandwidth_gbit=10.0, latency_ms=100.0, streams=4)
    assert link_Bps(four) == pytest.approx(4 * DEFAULT_WINDOW_BYTES / 0.1)
    big = WanLinkParams(bandwidth_gbit=10.0, latency_ms=100.0, window_mb=64.0)
    assert link_Bps(big) == pytest.approx(64e6 / 0.1)
    wide = WanLinkParams(bandwidth_gbit=10.0, latency_ms=100.0, streams=64, window_mb=64.0)
    assert link_Bps(wide) == pytest.approx(10e9 / 8)
    # a short path is not capped
    near = WanLinkParams(bandwidth_gbit=10.0, latency_ms=1.0)
    assert link_Bps(near) == pytest.approx(10e9 / 8)


def test_stream_rate_is_min_of_link_and_window_per_rtt() -> None:
    assert stream_Bps(1e9, 0.1, 2e6, 3) == pytest.approx(6e7)
    assert stream_Bps(1e7, 0.1, 2e6, 3) == pytest.approx(1e7)
    assert stream_Bps(1e9, 0.0) == pytest.approx(1e9)


def test_goodput_pays_headers_on_every_segment() -> None:
    assert goodput_Bps(1514.0, 1500) == pytest.approx(1448.0)
    assert goodput_Bps(1e6, 9000) == pytest.approx(1e6 * 8948 / 9014)
    assert TcpPath(1514.0, 0.0).goodput_Bps == pytest.approx(1448.0)


def test_slow_start_closed_form() -> None:
    rate, rtt = 1e6, 0.1  # BDP 100 kB: IW 14.48 kB doubles 3 times (k* = 3) to 115.8 kB
    # fits in the initial window: one round, sent at the rate
    assert slow_start_s(IW, rate, rtt, MSS) == pytest.approx(IW / rate)
    # 3 IW: round 0 carries IW, round 1 the other 2 IW
    assert slow_start_s(3 * IW, rate, rtt, MSS) == pytest.approx(rtt + 2 * IW / rate)
    # longer than slow start: k* = 3 round trips carry 7 IW, the rest at the rate
    m = 1e6
    assert slow_start_s(m, rate, rtt, MSS) == pytest.approx(3 * rtt + (m - 7 * IW) / rate)
    # no round trip: the rate alone
    assert slow_start_s(m, rate, 0.0, MSS) == pytest.approx(m / rate)


def test_initial_window_is_capped_by_the_receivers_first_window() -> None:
    """A jumbo MSS: 10 segments would be 124 kB, but the receiver first offers 64 KiB."""
    mss, rate, rtt = 12448.0, 12.5e6, 0.04  # BDP 500 kB: 64 KiB doubles 3 times
    iw = INITIAL_RWND_BYTES
    assert iw == 65536 and iw < INITIAL_WINDOW_SEGMENTS * mss
    m = 4e6
    assert slow_start_s(m, rate, rtt, mss) == pytest.approx(3 * rtt + (m - 7 * iw) / rate)


def test_transfer_is_one_way_latency_plus_bytes_at_the_stream_rate() -> None:
    path = TcpPath(link_Bps=1514e3, rtt_s=0.04, mtu_bytes=1500)
    warm = pattern_s("p2p", 1e6, 2, path, "gloo", cold=False)
    assert warm == pytest.approx(0.02 + 1e6 / 1448e3)
    cold = pattern_s("p2p", 1e6, 2, path, "gloo", cold=True)
    assert cold == pytest.approx(0.02 + float(slow_start_s(1e6, 1448e3, 0.04, MSS)))


def test_ring_allreduce_pays_one_way_latency_per_step() -> None:
    n, m, w, rtt = 5, 1e9, 1e8, 0.08
    coll = collective(np.array(m), uniform(n, w, rtt), "ring")
    assert float(coll.fixed_s) == pytest.approx(2 * (n - 1) * rtt / 2)
    assert float(coll.transfer_s) == pytest.approx(2 * (n - 1) / n * m / w)
    gathered = collective(np.array(m), uniform(n, w, rtt), "ring", gathered=True)
    assert float(gathered.fixed_s) == pytest.approx((n - 1) * rtt / 2)


def test_hub_is_two_collectives_of_one_way_latency_each() -> None:
    n, m, w, rtt = 4, 1e9, 1e8, 0.06
    coll = collective(np.array(m), uniform(n, w, rtt), "hub")
    assert float(coll.fixed_s) == pytest.approx(2 * rtt / 2)
    assert float(coll.transfer_s) == pytest.approx(2 * m / w)  # reduce in, broadcast out


def test_pattern_allreduce_reduce_allgather_closed_form() -> None:
    path = TcpPath(link_Bps=1e7 * 1514 / 1448, rtt_s=0.02)  # goodput 10 MB/s
    w, lat, m = 1e7, 0.01, 4e6
    eff = TRANSPORT_EFFICIENCY["gloo"]
    assert pattern_s("allreduce", m, 4, path) == pytest.approx(6 * (lat + m / 4 / (w * eff)))
    reduce = 3 * (lat + m / 4 / (w * eff)) + lat + 3 * m / 4 / (w * eff)
    assert pattern_s("reduce", m, 4, path) == pytest.approx(reduce)
    assert pattern_s("allgather", m, 4, path) == pytest.approx(3 * (lat + m / (w * eff)))


def test_broadcast_parents_share_their_uplink_among_children() -> None:
    path = TcpPath(link_Bps=1e7 * 1514 / 1448, rtt_s=0.02)
    w, lat, m = 1e7 * TRANSPORT_EFFICIENCY["gloo"], 0.01, 1e6
    assert pattern_s("broadcast", m, 2, path) == pytest.approx(lat + m / w)
    # rank 0 sends to 1 and 2 at once (2M), then rank 1 to 3 (M): 3M/W over two levels
    assert pattern_s("broadcast", m, 4, path) == pytest.approx(2 * lat + 3 * m / w)
    # rank 7: 0 -> 1 (3 sends), 1 -> 3 (2 sends), 3 -> 7 (1 send)
    assert pattern_s("broadcast", m, 8, path) == pytest.approx(3 * lat + 6 * m / w)
    both = pattern_s("reduce", m, 4, path) + pattern_s("broadcast", m, 4, path)
    assert pattern_s("reduce+bcast", m, 4, path) == pytest.approx(both)


def test_transport_fraction_scales_the_bytes_not_the_latency() -> None:
    path = TcpPath(link_Bps=1514e4, rtt_s=0.05)
    m = 1e7
    gloo = pattern_s("p2p", m, 2, path, "gloo", cold=False) - 0.025
    nccl = pattern_s("p2p", m, 2, path, "nccl", cold=False) - 0.025
    ratio = TRANSPORT_EFFICIENCY["gloo"] / TRANSPORT_EFFICIENCY["nccl"]
    assert nccl == pytest.approx(gloo * ratio)


def test_heloco_exchange_is_a_push_and_a_pull_from_the_initial_window() -> None:
    rate, rtt, m = 1e7, 0.05, 4e6
    one = rtt + float(slow_start_s(m, rate, rtt))
    assert heloco_exchange_s(m, rate, rtt) == pytest.approx(2 * one)
    # n − 1 workers share the server's link: each stream gets 1/(n−1) of it; a worker decodes
    # its own pull, the server applies the 3 pushes one after another
    path = TcpPath(link_Bps=rate * 1514 / 1448, rtt_s=rtt)
    pull = pattern_s("heloco-pull", m, 4, path, "zmq")
    push = pattern_s("heloco-push", m, 4, path, "zmq")
    eff, host = TRANSPORT_EFFICIENCY["zmq"], TRANSPORT_HOST_BPS["zmq"]
    wire = rtt + float(slow_start_s(m, rate * eff / 3, rtt))
    assert pull == pytest.approx(wire + m / host)
    assert push == pytest.approx(wire + 3 * m / HELOCO_SERVER_PUSH_BPS)
    both = push + pull
    assert pattern_s("heloco-exchange", m, 4, path, "zmq") == pytest.approx(both)


def test_async_round_prices_heloco_exchange_when_asked() -> None:
    wan = uniform(2, 1e8, 0.04)
    m = 1e9 * 16 / 8
    duplex = outer_round("async", np.array([1.0, 1.0]), wan, 1e9, bits=16)
    helo = outer_round("async", np.array([1.0, 1.0]), wan, 1e9, bits=16, exchange="heloco")
    pull = 1e9 * 4  # θ in fp32, whatever Δ is sent as
    assert duplex.wan_comm_s[1] == pytest.approx(0.04 + pull / 1e8)
    assert helo.wan_comm_s[1] == pytest.approx(float(heloco_exchange_s(m, 1e8, 0.04, pull)))
    assert helo.wan_bytes[1] == pytest.approx(m + pull)
    assert helo.wan_comm_s[0] == 0.0 == duplex.wan_comm_s[0]


def test_unknown_pattern_is_a_one_line_error() -> None:
    with pytest.raises(ValueError, match=r"^pattern: got 'scatter'"):
        pattern_s("scatter", 1.0, 2, TcpPath(1e6, 0.0))


def test_slow_start_rounds_grow_by_doubling() -> None:
    """k rounds from IW carry IW·(2^k − 1) bytes: the k-th round ends exactly there."""
    rate, rtt = 1e9, 0.1  # BDP far above: stays in slow start
    for k in range(1, 8):
        m = IW * (2**k - 1)
        t = float(slow_start_s(m, rate, rtt, MSS))
        last = IW * 2 ** (k - 1)
        assert t == pytest.approx((k - 1) * rtt + last / rate)
        assert math.isfinite(t)
