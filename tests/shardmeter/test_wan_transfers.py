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
    GLOO_ALLGATHER_HOST_BPS,
    GLOO_MAX_SEGMENT_BYTES,
    HELOCO_SERVER_PUSH_BPS,
    INITIAL_RWND_BYTES,
    INITIAL_WINDOW_SEGMENTS,
    LINUX_TCP_RMEM_MAX,
    LINUX_TCP_WMEM_MAX,
    TCP_RTO_MIN_S,
    TRANSPORT_EFFICIENCY,
    TRANSPORT_HOST_BPS,
    WINDOW_FILL,
    TcpPath,
    WanPaths,
    end_window,
    gloo_pattern_s,
    gloo_pipeline_s,
    gloo_segments,
    goodput_Bps,
    heloco_exchange_s,
    heloco_legs_s,
    link_Bps,
    pattern_s,
    restart_window,
    rto_s,
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
    """The textbook ring (NCCL's): one-way latency and one chunk per step."""
    path = TcpPath(link_Bps=1e7 * 1514 / 1448, rtt_s=0.02)  # goodput 10 MB/s
    w, lat, m = 1e7, 0.01, 4e6
    eff = TRANSPORT_EFFICIENCY["nccl"]
    ring = pattern_s("allreduce", m, 4, path, "nccl")
    assert ring == pytest.approx(6 * (lat + m / 4 / (w * eff)))
    reduce = 3 * (lat + m / 4 / (w * eff)) + lat + 3 * m / 4 / (w * eff)
    assert pattern_s("reduce", m, 4, path, "nccl") == pytest.approx(reduce)
    gather = pattern_s("allgather", m, 4, path, "nccl")
    assert gather == pytest.approx(3 * (lat + m / (w * eff)))


def test_gloo_segments_are_at_most_1_mib_at_least_two_per_rank() -> None:
    assert GLOO_MAX_SEGMENT_BYTES == 2**20
    assert gloo_segments(32e6, 2) == (32, 1e6)  # 31 MiB-segments rounded up to a multiple of 2
    assert gloo_segments(1e6, 4) == (8, 125000.0)  # small: 2n segments
    # reduce.cc sizes the segment first: min(M / 2n, 1 MiB)
    assert gloo_segments(32e6, 2, reduce=True) == (32, float(2**20))
    assert gloo_segments(1e6, 2, reduce=True) == (4, 250000.0)


def test_gloo_pipeline_two_in_flight_closed_form() -> None:
    path = TcpPath(link_Bps=1e7 * 1514 / 1448, rtt_s=0.1, window_bytes=1e9)  # 10 MB/s
    seg, t = 1e5, 0.01  # a segment takes 10 ms: the round trip dominates
    # distinct neighbours: two segments per RTT + t, the last pair's second one t later
    assert gloo_pipeline_s(6, seg, path, False, 1.0) == pytest.approx(3 * (0.1 + t) + t)
    assert gloo_pipeline_s(5, seg, path, False, 1.0) == pytest.approx(3 * (0.1 + t))
    # the same peer both ways: each recv-ready waits behind a segment on the connection
    assert gloo_pipeline_s(6, seg, path, True, 1.0) == pytest.approx(3 * 0.1 + 6 * t)
    # big segments: the link is the limit
    big = 5e6
    assert gloo_pipeline_s(4, big, path, False, 1.0) == pytest.approx(0.1 + 4 * big / 1e7)
    assert gloo_pipeline_s(0, seg, path, True, 1.0) == 0.0


def test_gloo_allreduce_and_reduce_closed_form() -> None:
    path = TcpPath(link_Bps=1e7 * 1514 / 1448, rtt_s=0.04, window_bytes=1e9)
    m, w = 32e6, 1e7
    # two ranks: 32 segments of 1 MB, 16 per phase, the same peer both ways
    phase = 8 * 0.04 + 16 * 1e6 / w
    assert pattern_s("allreduce", m, 2, path) == pytest.approx(2 * phase)
    # reduce: 1 MiB segments, 31 of them hold data (32 rounded to a multiple of 2); a ring
    # pass of all but two, then the other rank's chunk (M − 16 MiB) to the root
    seg = 2**20
    ring = 15 * 0.04 + 29 * seg / w
    gather = 0.04 + (m - 16 * seg) / w
    assert pattern_s("reduce", m, 2, path) == pytest.approx(ring + gather)
    assert gloo_pattern_s("broadcast", m, 2, path) is None  # generic formula


def test_gloo_allgather_two_ranks_waits_behind_the_late_ranks_data() -> None:
    path = TcpPath(link_Bps=1e7 * 1514 / 1448, rtt_s=0.1, window_bytes=1e9)
    m, w = 4e6, 1e7
    host = 2 * m / GLOO_ALLGATHER_HOST_BPS
    assert pattern_s("allgather", m, 2, path) == pytest.approx(0.1 + 1.5 * m / w + host)
    # three ranks: the ring, plus torch's copy of the 3·M output
    ring = 2 * (0.05 + m / w) + 3 * m / GLOO_ALLGATHER_HOST_BPS
    assert pattern_s("allgather", m, 3, path) == pytest.approx(ring)


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
    four = rtt + float(slow_start_s(4 * m, rate, rtt))  # an int8 push, then the fp32 model
    assert heloco_exchange_s(m, rate, rtt, 4 * m) == pytest.approx(one + four)
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
    assert duplex.wan_bytes[1] == pytest.approx(m + pull)  # push and pull, at once


def test_async_blocking_exchange_adds_to_the_round_and_overlapped_hides_under_it() -> None:
    """HeLoCo's exchange X = 2·(RTT + slow start(M)) on a 1e8 B/s, 40 ms path: blocking
    (pull → H steps → push, then its ack) is H·T + X; overlapped is max(H·T, X), X from the
    windows kept over its idle."""
    wan = uniform(2, 1e8, 0.04)
    m = 1e8 * 32 / 8  # 0.4 GB: X ≈ 8.4 s
    x = float(heloco_exchange_s(m, 1e8, 0.04))
    inner = np.array([1.0, 0.5])
    kw = {"inner_steps": 10, "bits": 32}
    block = outer_round("async", inner, wan, 1e8, exchange="blocking", **kw)
    over = outer_round("async", inner, wan, 1e8, exchange="overlapped", **kw)
    # the overlapped link never rests: the dispatch keeps a window past the BDP (heloco_legs_s)
    x_over = float(heloco_exchange_s(m, 1e8, 0.04, compute_s=5.0, blocking=False))
    assert x_over < x
    assert block.wan_comm_s[1] == pytest.approx(x) and over.wan_comm_s[1] == pytest.approx(x_over)
    assert block.round_s[1] == pytest.approx(5.0 + x)  # 5 s of compute, then the exchange
    assert over.round_s[1] == pytest.approx(max(5.0, x_over))
    assert block.utilization[1] == pytest.approx(5.0 / (5.0 + x))
    assert block.round_s[0] == pytest.approx(10.0) == over.round_s[0]  # the server's island
    # "heloco" names the overlapped exchange: the same round
    old = outer_round("async", inner, wan, 1e8, exchange="heloco", **kw)
    np.testing.assert_allclose(old.round_s, over.round_s)
    with pytest.raises(ValueError, match="exchange 'eager'"):
        outer_round("async", inner, wan, 1e8, exchange="eager", **kw)  # type: ignore[arg-type]


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


def test_topology_run_exchange_reaches_the_async_round() -> None:
    """run.exchange (and `predict --exchange`) picks the async round: with a given 1 s step
    and H = 100 on two-clouds, blocking is 100 s + X and overlapped max(100 s, X)."""
    from shardmeter.estimate.islands import predict_topology
    from shardmeter.specs.topology import load_topology

    topo = load_topology("two-clouds")
    kw = {"mode": "async", "step_time_s": 1.0, "inner_steps": 100}
    block = predict_topology(topo, exchange="blocking", **kw).islands[1]
    over = predict_topology(topo, exchange="overlapped", **kw).islands[1]
    x = over.wan_exposed_s + over.wan_hidden_s  # the whole exchange
    assert x > 0
    assert block.round_s == pytest.approx(100.0 + x)
    assert over.round_s == pytest.approx(max(100.0, x))


def test_shared_server_link_is_a_processor_sharing_station() -> None:
    """Two spokes behind one server link C, blocking exchange (a push, then a pull, each of
    M = 0.4 GB, S = M/C = 1 s on the server's link, 0.5 s on the path): exact mean-value
    analysis. Alone a worker cycles through Z = b (compute, b = H·T_inner = 1.9 s), the up
    station and the down station: X = 1/(b + 2S), Q = S·X at each; with the other worker
    there, a leg takes R = S·(1 + S/(b + 2S)) (the arrival theorem: it sees the network
    without itself)."""
    import dataclasses

    wan = dataclasses.replace(uniform(3, 8e8, 0.0), server_Bps=4e8)  # each path alone 0.5 s
    inner = np.array([0.19, 0.19, 0.19])  # H = 10: b = 1.9 s of compute
    rnd = outer_round("async", inner, wan, 1e8, inner_steps=10, bits=32, exchange="blocking")
    s, b = 1.0, 1.9
    t = s * (1 + s / (b + 2 * s))
    assert rnd.wan_comm_s[1] == pytest.approx(2 * t, rel=1e-9)
    assert rnd.wan_comm_s[2] == pytest.approx(2 * t, rel=1e-9)
    assert rnd.round_s[1] == pytest.approx(b + 2 * t, rel=1e-9)
    # a lone spoke shares with nobody: each leg takes its path (0.5 s) or the server's link
    # (1 s) alone, whichever is slower
    lone = dataclasses.replace(uniform(2, 8e8, 0.0), server_Bps=4e8)
    one = outer_round("async", inner[:2], lone, 1e8, inner_steps=10, bits=32, exchange="blocking")
    assert one.wan_comm_s[1] == pytest.approx(2.0)


def test_shared_link_alone_is_the_unshared_exchange() -> None:
    """One worker (N = 1): the mean-value analysis gives the alone time, round trips and slow
    start included, whatever the server's link when it is no slower than the path."""
    import dataclasses

    inner = np.array([0.19, 0.19])
    free = uniform(2, 4e8, 0.08)
    capped = dataclasses.replace(free, server_Bps=4e8)
    for exchange in ("blocking", "overlapped"):
        a = outer_round("async", inner, free, 1e8, inner_steps=10, bits=32, exchange=exchange)
        c = outer_round("async", inner, capped, 1e8, inner_steps=10, bits=32, exchange=exchange)
        assert a.wan_comm_s[1] > 2.0 + 2 * 0.08  # two legs of 1 s, two round trips, slow start
        assert c.wan_comm_s[1] == pytest.approx(a.wan_comm_s[1], rel=1e-9)


def test_three_equal_workers_share_the_link_by_exact_mva() -> None:
    """Three equal workers, blocking: the exact recurrence over populations of 1, 2, 3
    (Reiser & Lavenberg 1980), by hand for the symmetric case: R_1 = S, Q_1 = S/(b + 2S);
    R_2 = S·(1 + Q_1), Q_2 = 2·R_2/(b + 2·R_2); R_3 = S·(1 + Q_2)."""
    import dataclasses

    wan = dataclasses.replace(uniform(4, 8e8, 0.0), server_Bps=4e8)
    inner = np.full(4, 0.19)
    rnd = outer_round("async", inner, wan, 1e8, inner_steps=10, bits=32, exchange="blocking")
    s, b = 1.0, 1.9
    q1 = s / (b + 2 * s)
    r2 = s * (1 + q1)
    q2 = 2 * r2 / (b + 2 * r2)
    r3 = s * (1 + q2)
    np.testing.assert_allclose(rnd.wan_comm_s[1:], 2 * r3, rtol=1e-9)


def test_overlapped_workers_behind_a_slow_shared_link_think_zero() -> None:
    """Overlapped, the link slower than a round: a worker's next push follows its pull at
    once (round = exchange, no think time). Two workers, two stations of S = 1 s, Z = 0:
    R_1 = S, Q_1 = 1/2; R_2 = S·(1 + 1/2): the round is 3 s."""
    import dataclasses

    wan = dataclasses.replace(uniform(3, 8e8, 0.0), server_Bps=4e8)
    inner = np.full(3, 0.01)  # 0.1 s of compute, far less than an exchange
    rnd = outer_round("async", inner, wan, 1e8, inner_steps=10, bits=32, exchange="overlapped")
    np.testing.assert_allclose(rnd.round_s[1:], 3.0, rtol=1e-6)
    # compute (b = 3.5 s) longer than the exchange: the worker thinks Z = b − X between
    # exchanges, and X = 2·(1 + 1/(Z + 2)) (R_1 = 1, Q_1 = 1/(Z + 2)), so Z² + 0.5·Z − 1 = 0
    slow = outer_round(
        "async", np.full(3, 0.35), wan, 1e8, inner_steps=10, bits=32, exchange="overlapped"
    )
    z = (-0.5 + math.sqrt(0.25 + 4.0)) / 2
    np.testing.assert_allclose(slow.wan_comm_s[1:], 3.5 - z, rtol=1e-6)
    np.testing.assert_allclose(slow.round_s[1:], 3.5, rtol=1e-9)


def test_beyond_the_exact_limit_the_approximation_is_kept(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    """Past EXACT_MVA_MAX_WORKERS the Bard-Schweitzer approximation: a leg sees the other
    worker's mean queue at the full population, T = S·(1 + T/round), round = b + 2T, so
    2T² + (b − 3S)·T − S·b = 0 (two workers, S = 1 s, b = 1.9 s)."""
    import dataclasses

    from shardmeter.estimate import outer

    monkeypatch.setattr(outer, "EXACT_MVA_MAX_WORKERS", 1)
    wan = dataclasses.replace(uniform(3, 8e8, 0.0), server_Bps=4e8)
    inner = np.array([0.19, 0.19, 0.19])
    rnd = outer_round("async", inner, wan, 1e8, inner_steps=10, bits=32, exchange="blocking")
    s, b = 1.0, 1.9
    t = (-(b - 3 * s) + math.sqrt((b - 3 * s) ** 2 + 8 * s * b)) / 4
    assert rnd.wan_comm_s[1] == pytest.approx(2 * t, rel=1e-6)
    assert outer.EXACT_MVA_MAX_WORKERS == 1
    assert 2 * t > 2 * s * (1 + s / (b + 2 * s))  # the approximation overstates the wait here


def test_rto_is_the_round_trip_plus_linux_floor() -> None:
    assert TCP_RTO_MIN_S == 0.2
    assert rto_s(0.1) == pytest.approx(0.3)
    assert rto_s(0.0) == pytest.approx(0.2)


def test_restart_window_halves_once_per_rto_after_the_first() -> None:
    w, rtt = 64 * IW, 0.1  # RTO 0.3 s
    assert restart_window(w, 0.3, rtt) == pytest.approx(w)  # idle ≤ RTO: kept whole
    assert restart_window(w, 0.31, rtt) == pytest.approx(w / 2)  # ⌈1.03⌉ − 1 = 1
    assert restart_window(w, 0.6, rtt) == pytest.approx(w / 2)
    assert restart_window(w, 0.61, rtt) == pytest.approx(w / 4)
    assert restart_window(w, 1.0, rtt) == pytest.approx(w / 8)
    assert restart_window(w, 100.0, rtt) == pytest.approx(IW)  # never below the restart window
    assert restart_window(IW / 2, 100.0, rtt) == pytest.approx(IW)


def test_slow_start_from_a_kept_window() -> None:
    rate, rtt = 16 * IW / 0.1, 0.1  # BDP = 16 IW
    m = 100 * IW
    # from 4 IW: 4 + 8 = 12 IW in two round trips, then the rest at the rate
    kept = slow_start_s(m, rate, rtt, MSS, start_window=4 * IW)
    assert kept == pytest.approx(2 * rtt + (m - 12 * IW) / rate)
    assert slow_start_s(m, rate, rtt, MSS) == pytest.approx(4 * rtt + (m - 15 * IW) / rate)
    # a kept window below IW starts from IW
    assert slow_start_s(m, rate, rtt, MSS, start_window=IW / 3) == pytest.approx(
        float(slow_start_s(m, rate, rtt, MSS))
    )


def test_end_window_is_the_last_slow_start_round() -> None:
    rate, rtt = 16 * IW / 0.1, 0.1
    assert end_window(100 * IW, rate, rtt, MSS) == pytest.approx(16 * IW)  # IW·2^k*, k* = 4
    assert end_window(100 * IW, rate, rtt, MSS, start_window=3 * IW) == pytest.approx(24 * IW)
    assert end_window(3 * IW, rate, rtt, MSS) == pytest.approx(2 * IW)  # ends in round 2


# 1 MB/s, 100 ms (BDP 6.9 IW: a cold leg's window reaches 8 IW in three round trips), 500 kB
EX_RATE, EX_RTT, EX_M = 1e6, 0.1, 5e5


def test_overlapped_exchange_keeps_the_window_over_a_short_idle() -> None:
    cold = 2 * (EX_RTT + 3 * EX_RTT + (EX_M - 7 * IW) / EX_RATE)
    assert heloco_exchange_s(EX_M, EX_RATE, EX_RTT) == pytest.approx(cold)
    # overlapped behind 1.5 s of compute: each side idles 1.5 − leg − RTT ≈ 0.79 s, in
    # (2, 3] RTOs of 0.3 s: the 8 IW window is halved twice, so each leg starts at 2 IW and
    # sends 2 + 4 IW in two round trips, then the rest at the rate
    # The dispatch queues at the worker's downlink: its window grows by every byte acked, to
    # the 350 kB (241 segments) the path holds (BDP + 250 ms of queue); its 0.89 s of idle
    # plus its last byte's 0.14 s in the queue is in (2, 3] RTOs of 0.43 s (0.1 + 0.13 s of
    # smoothed queue + 0.2): halved twice to 60 segments, it sends 6 IW, then the rest at the rate
    warm = 2 * EX_RTT + (2 * EX_RTT + (EX_M - 6 * IW) / EX_RATE)  # round trips, the push
    warm += EX_RTT + (EX_M - 6 * IW) / EX_RATE  # the pull
    kept = heloco_exchange_s(EX_M, EX_RATE, EX_RTT, compute_s=1.5, blocking=False)
    assert kept == pytest.approx(warm)
    up, down = heloco_legs_s(EX_M, EX_RATE, EX_RTT, compute_s=1.5, blocking=False)
    assert up == pytest.approx(2 * EX_RTT + (EX_M - 6 * IW) / EX_RATE)
    assert down == pytest.approx(EX_RTT + (EX_M - 6 * IW) / EX_RATE)
    # blocking: the idle holds the compute and the other leg, > 7 RTOs: back to IW
    blocked = heloco_exchange_s(EX_M, EX_RATE, EX_RTT, compute_s=1.5, blocking=True)
    assert blocked == pytest.approx(cold)


def test_async_round_prices_each_mode_with_its_idle() -> None:
    wan = uniform(2, EX_RATE, EX_RTT)
    inner = np.array([0.15, 0.15])
    params = EX_M / 4  # fp32 push and pull of EX_M bytes
    kw = dict(inner_steps=10, bits=32)
    over = outer_round("async", inner, wan, params, exchange="overlapped", **kw)
    block = outer_round("async", inner, wan, params, exchange="blocking", **kw)
    warm = float(heloco_exchange_s(EX_M, EX_RATE, EX_RTT, compute_s=1.5, blocking=False))
    assert over.wan_comm_s[1] == pytest.approx(warm)
    assert over.round_s[1] == pytest.approx(1.5)  # hidden: X = 1.43 s < H·T
    assert block.wan_comm_s[1] == pytest.approx(float(heloco_exchange_s(EX_M, EX_RATE, EX_RTT)))


# -- HeLoCo's streaming exchange (heloco/streaming.py; Streaming DiLoCo, arXiv 2501.18512) ----
def test_async_streaming_round_is_p_sub_rounds_each_hiding_a_fragment() -> None:
    """No round trip (legs = bytes / rate): N = 1e8 fp32 parameters, 4e8 B up and down on a
    1e8 B/s path, P = 4 fragments: each fragment's exchange is 1 s up + 1 s down = 2 s, hidden
    behind H/P = 2 inner steps, so a round of H = 8 steps is 4 · max(2·T, 2 s)."""
    wan = uniform(2, 1e8, 0.0)
    kw = dict(inner_steps=8, bits=32, exchange="streaming", fragments=4)
    link = outer_round("async", np.array([0.25, 0.25]), wan, 1e8, **kw)  # type: ignore[arg-type]
    assert link.round_s[1] == pytest.approx(8.0)  # 4 · max(0.5 s, 2 s): link-bound
    assert link.wan_comm_s[1] == pytest.approx(8.0)  # four 2 s fragment exchanges
    assert link.utilization[1] == pytest.approx(0.25)
    assert link.wan_bytes[1] == pytest.approx(8e8)  # P fragments of M/P each way
    assert link.inner_steps[1] == 8.0
    compute = outer_round("async", np.array([2.0, 2.0]), wan, 1e8, **kw)  # type: ignore[arg-type]
    assert compute.round_s[1] == pytest.approx(16.0)  # 4 · max(4 s, 2 s): hidden
    assert compute.utilization[1] == pytest.approx(1.0)
    assert compute.wan_comm_s[0] == 0.0  # the server's own island exchanges nothing


def test_async_streaming_pays_a_round_trip_pair_per_fragment() -> None:
    """With a round trip each fragment's exchange is its own two requests: P · (2·RTT + legs of
    M/P) per round, legs from the window kept over a sub-round's idle (`heloco_legs_s`); one
    fragment is the overlapped exchange."""
    wan = uniform(2, EX_RATE, EX_RTT)
    inner = np.array([0.15, 0.15])
    params = EX_M / 4  # fp32: EX_M bytes up and down
    kw = dict(inner_steps=10, bits=32)
    p = 5
    stream = outer_round("async", inner, wan, params, exchange="streaming", fragments=p, **kw)  # type: ignore[arg-type]
    up, down = heloco_legs_s(EX_M / p, EX_RATE, EX_RTT, EX_M / p, 1.5 / p, blocking=False)
    x = 2 * EX_RTT + float(up) + float(down)
    assert stream.wan_comm_s[1] == pytest.approx(p * x)
    assert stream.round_s[1] == pytest.approx(p * max(1.5 / p, x))
    over = outer_round("async", inner, wan, params, exchange="overlapped", **kw)  # type: ignore[arg-type]
    assert stream.round_s[1] > over.round_s[1]  # P round-trip pairs, not one
    one = outer_round("async", inner, wan, params, exchange="streaming", fragments=1, **kw)  # type: ignore[arg-type]
    np.testing.assert_allclose(one.round_s, over.round_s)
    np.testing.assert_allclose(one.wan_comm_s, over.wan_comm_s)
    with pytest.raises(ValueError, match="fragments"):
        outer_round("async", inner, wan, params, exchange="streaming", fragments=0, **kw)  # type: ignore[arg-type]


def test_topology_streaming_exchange_reaches_the_round() -> None:
    """`run.exchange = "streaming"` with `run.fragments` P prices P fragment exchanges."""
    from shardmeter.estimate.islands import predict_topology
    from shardmeter.specs.topology import load_topology

    topo = load_topology("two-clouds")
    kw = {"mode": "async", "step_time_s": 1.0, "inner_steps": 100}
    over = predict_topology(topo, exchange="overlapped", **kw).islands[1]
    stream = predict_topology(topo, exchange="streaming", fragments=4, **kw).islands[1]
    x_over = over.wan_exposed_s + over.wan_hidden_s
    x_stream = stream.wan_exposed_s + stream.wan_hidden_s
    assert x_stream > x_over  # four round-trip pairs instead of one, fewer bytes in each
    assert stream.round_s == pytest.approx(max(100.0, x_stream), rel=1e-6)


def test_exact_mva_broadcasts_over_configurations_in_chunks(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    """Many configurations (leading axes) in one call, solved a chunk at a time: each row is
    the row solved alone, in both exchange modes."""
    import dataclasses

    from shardmeter.estimate import outer

    monkeypatch.setattr(outer, "EXACT_MVA_CHUNK", 2)
    wan = dataclasses.replace(uniform(4, 8e8, 0.02), server_Bps=4e8)
    inner = np.random.default_rng(1).uniform(0.05, 0.4, (5, 4))
    for exchange in ("blocking", "overlapped"):
        many = outer_round("async", inner, wan, 1e8, inner_steps=10, bits=32, exchange=exchange)
        for k in range(5):
            one = outer_round(
                "async", inner[k], wan, 1e8, inner_steps=10, bits=32, exchange=exchange
            )
            np.testing.assert_allclose(many.round_s[k], one.round_s, rtol=1e-9)
