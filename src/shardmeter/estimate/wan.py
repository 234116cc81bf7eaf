"""The WAN between islands: path matrices resolved from a topology, and the collectives
that run over them (ring and hub all-reduce, ring all-gather, a gather through object storage).

Units: seconds, bytes, bytes/s; `rtt_s` is a path's round-trip time; one message costs half
of it (one-way latency), a request and its reply all of it. A path's bandwidth is TCP's: one
stream carries at most its window per round trip, Linux's default window unless the link
states `window_mb` and `streams`. The last section models transfers as TCP sends them
(headers, window, slow start) and the collectives and HeLoCo exchange built from them, as
benchmarks/wan_collectives.py measures them. Functions broadcast over numpy arrays.
"""

from __future__ import annotations

import dataclasses
import itertools
import math
from dataclasses import dataclass
from typing import Literal

import numpy as np
from numpy.typing import ArrayLike, NDArray

from shardmeter.errors import UserInputError
from shardmeter.specs.topology import GBIT, BucketSpec, Topology, WanLinkParams, WanMatrix

FloatArray = NDArray[np.float64]


@dataclass(frozen=True)
class BucketPath:
    """Object storage as every island sees it: path bandwidth per direction, request RTT,
    USD per byte downloaded, and the bucket's aggregate throughput."""

    Bps: float
    rtt_s: float
    usd_per_byte: float
    aggregate_Bps: float = float("inf")

    def scaled(self, factor: float) -> BucketPath:
        return BucketPath(
            self.Bps * factor, self.rtt_s, self.usd_per_byte, self.aggregate_Bps * factor
        )


def bucket_path(spec: BucketSpec) -> BucketPath:
    aggregate = float("inf") if spec.aggregate_gbit is None else spec.aggregate_gbit * GBIT
    return BucketPath(
        spec.bandwidth_gbit * GBIT, spec.latency_ms * 1e-3, spec.egress_usd_per_gb / 1e9, aggregate
    )


@dataclass(frozen=True)
class WanPaths:
    """Island-to-island WAN paths resolved from a topology (I islands, matrices are I × I).

    `bandwidth_Bps[i, j]` is the effective bandwidth of the path i→j per direction (for a star,
    the slower of the two spokes; min(link, streams·window/RTT) when TCP limits apply);
    `rtt_s[i, j]` its round-trip time (sum of the spokes for a star); diagonals are inf and 0.
    `ring` is the island order of the ring all-reduce, `center` the hub/parameter-server island.
    """

    names: tuple[str, ...]
    bandwidth_Bps: FloatArray
    rtt_s: FloatArray
    egress_usd_per_byte: FloatArray
    ring: tuple[int, ...]
    center: int
    server_Bps: float = float("inf")  # aggregate parameter-server capacity per direction
    host_copy_Bps: float = float("inf")  # device↔host copy bandwidth (Gloo on CPU); inf = none
    hub: int | None = None  # star centre that relays island-to-island paths (None: mesh)
    bucket: BucketPath | None = None  # object storage for reduce = "bucket"

    def path_name(self, i: int, j: int) -> str:
        """'a↔b', or 'a↔hub↔b' for a path relayed by a star's hub."""
        a, b = self.names[i], self.names[j]
        if self.hub is None or self.hub in (i, j):
            return f"{a}↔{b}"
        return f"{a}↔{self.names[self.hub]}↔{b}"

    @property
    def n(self) -> int:
        return len(self.names)

    @property
    def ring_edges(self) -> tuple[tuple[int, int], ...]:
        order = self.ring
        return tuple((order[k], order[(k + 1) % len(order)]) for k in range(len(order)))

    @property
    def ring_successor(self) -> NDArray[np.int64]:
        """succ[i] = the island i sends to in the ring."""
        succ = np.arange(self.n)
        for a, b in self.ring_edges:
            succ[a] = b
        return succ

    def ring_bottleneck(self) -> tuple[float, float, tuple[int, int]]:
        """(bandwidth, RTT, edge) that pace the ring: slowest edge bandwidth, largest RTT."""
        if self.n < 2:
            return float("inf"), 0.0, (0, 0)
        edges = self.ring_edges
        bw = [float(self.bandwidth_Bps[a, b]) for a, b in edges]
        worst = edges[int(np.argmin(bw))]
        rtt = max(float(self.rtt_s[a, b]) for a, b in edges)
        return min(bw), rtt, worst

    def scaled(self, factor: float) -> WanPaths:
        """The same WAN with every bandwidth multiplied by `factor` (sweeps, knee search)."""
        return WanPaths(
            names=self.names,
            bandwidth_Bps=self.bandwidth_Bps * factor,
            rtt_s=self.rtt_s,
            egress_usd_per_byte=self.egress_usd_per_byte,
            ring=self.ring,
            center=self.center,
            server_Bps=self.server_Bps * factor,
            host_copy_Bps=self.host_copy_Bps,
            hub=self.hub,
            bucket=None if self.bucket is None else self.bucket.scaled(factor),
        )

    def subset(self, keep: list[int]) -> WanPaths:
        """The WAN among the islands `keep` (island-count sweeps)."""
        idx = np.asarray(keep)
        bw = self.bandwidth_Bps[np.ix_(idx, idx)]
        center = keep.index(self.center) if self.center in keep else 0
        hub = keep.index(self.hub) if self.hub is not None and self.hub in keep else None
        return WanPaths(
            names=tuple(self.names[i] for i in keep),
            bandwidth_Bps=bw,
            rtt_s=self.rtt_s[np.ix_(idx, idx)],
            egress_usd_per_byte=self.egress_usd_per_byte[np.ix_(idx, idx)],
            ring=best_ring(bw),
            center=center,
            server_Bps=self.server_Bps,
            host_copy_Bps=self.host_copy_Bps,
            hub=hub,
            bucket=self.bucket,
        )


def best_ring(bandwidth_Bps: FloatArray) -> tuple[int, ...]:
    """Ring order that maximises the slowest edge (exhaustive up to 9 islands, greedy beyond)."""
    n = bandwidth_Bps.shape[0]
    if n <= 3:
        return tuple(range(n))
    if n <= 9:
        best: tuple[int, ...] = tuple(range(n))
        best_bw = -1.0
        for perm in itertools.permutations(range(1, n)):
            if perm[0] > perm[-1]:
                continue  # a ring and its reverse are the same
            order = (0, *perm)
            bw = min(bandwidth_Bps[order[k], order[(k + 1) % n]] for k in range(n))
            if bw > best_bw:
                best, best_bw = order, float(bw)
        return best
    path = [0]
    left = set(range(1, n))
    while left:
        nxt = max(left, key=lambda j: bandwidth_Bps[path[-1], j])
        path.append(nxt)
        left.remove(nxt)
    return tuple(path)


def effective_wan_Bps(
    link_Bps: ArrayLike,
    rtt_s: ArrayLike,
    streams: ArrayLike | None = None,
    window_bytes: ArrayLike | None = None,
) -> FloatArray:
    """min(link, streams·window/RTT): TCP window-limited throughput (design doc C.4)."""
    link = np.asarray(link_Bps, dtype=np.float64)
    if streams is None or window_bytes is None:
        return link
    rtt = np.asarray(rtt_s, dtype=np.float64)
    with np.errstate(divide="ignore"):
        tcp = np.where(rtt > 0, np.asarray(streams) * np.asarray(window_bytes) / rtt, np.inf)
    return np.minimum(link, tcp)


def ring_allreduce_s(
    nbytes: ArrayLike, n: ArrayLike, bandwidth_Bps: ArrayLike, latency_s: ArrayLike
) -> FloatArray:
    """Ring all-reduce: 2(n−1)·α + 2(n−1)/n · M/W (Patarasuk & Mueller 2009; design doc C.4)."""
    m = np.asarray(nbytes, dtype=np.float64)
    k = np.asarray(n, dtype=np.float64)
    t = 2.0 * (k - 1.0) * np.asarray(latency_s) + 2.0 * (k - 1.0) / k * m / np.asarray(
        bandwidth_Bps
    )
    return np.where(k > 1, t, 0.0)


def ring_sent_bytes(nbytes: ArrayLike, n: ArrayLike) -> FloatArray:
    """Bytes each ring member sends in an all-reduce: 2(n−1)/n · M (design doc C.4)."""
    k = np.asarray(n, dtype=np.float64)
    return 2.0 * (k - 1.0) / k * np.asarray(nbytes, dtype=np.float64)


def hub_allreduce_s(
    nbytes: ArrayLike,
    spoke_Bps: ArrayLike,
    spoke_rtt_s: ArrayLike,
    hub_Bps: ArrayLike = np.inf,
) -> FloatArray:
    """Reduce to a hub, then broadcast back: two phases, each paced by the slowest spoke
    (RTT + M/W) or by the hub's aggregate link ((I−1)·M/W_hub). Parameter-server pattern, about
    2 RTTs (design doc C.4). Spoke arrays have the island axis last; the hub's own entry is
    (inf, 0) and costs nothing."""
    m = np.asarray(nbytes, dtype=np.float64)[..., None]
    bw = np.asarray(spoke_Bps, dtype=np.float64)
    rtt = np.asarray(spoke_rtt_s, dtype=np.float64)
    remote = np.isfinite(bw)
    per_spoke = np.where(remote, rtt + m / bw, 0.0).max(axis=-1)
    n_remote = remote.sum(axis=-1)
    hub = np.squeeze(m, -1) * n_remote / np.asarray(hub_Bps, dtype=np.float64)
    return 2.0 * np.maximum(per_spoke, hub)


def link_Bps(link: WanLinkParams) -> float:
    """Effective bytes/s of a link: efficiency × nominal, capped by streams·window/RTT, where
    an unstated window is Linux's default cap (DEFAULT_WINDOW_BYTES) and unstated streams 1:
    one TCP stream carries at most one window per round trip (RFC 7323 sec. 1.1)."""
    nominal = link.bandwidth_gbit * GBIT * link.efficiency
    window = DEFAULT_WINDOW_BYTES if link.window_mb is None else link.window_mb * 1e6
    streams = 1 if link.streams is None else link.streams
    return float(stream_Bps(nominal, link.latency_ms * 1e-3, window, streams))


def _link_between(topo: Topology, a: str, b: str) -> WanLinkParams | None:
    for link in topo.wan.links:
        if {link.from_, link.to} == {a, b}:
            return link
    return topo.wan.default


def _matrix_paths(m: WanMatrix, n: int) -> tuple[FloatArray, FloatArray, FloatArray]:
    """(bytes/s, RTT s, USD/byte) matrices from a [wan.matrix] table."""
    off = ~np.eye(n, dtype=bool)
    gbit = np.asarray(m.bandwidth_gbit, dtype=np.float64)
    rtt = np.where(off, np.asarray(m.latency_ms, dtype=np.float64) * 1e-3, 0.0)
    bw = np.where(off, stream_Bps(gbit * GBIT * m.efficiency, rtt), np.inf)  # default window
    usd = np.zeros((n, n)) if m.egress_usd_per_gb is None else np.asarray(m.egress_usd_per_gb)
    price = np.where(off, usd / 1e9, 0.0)
    return bw, rtt, price


def wan_paths(topo: Topology) -> WanPaths:
    """Resolve the WAN into island-to-island path matrices (a star routes through its hub)."""
    names = topo.island_names
    n = len(names)
    bw = np.full((n, n), np.inf)
    rtt = np.zeros((n, n))
    price = np.zeros((n, n))
    wan = topo.wan
    if wan.kind == "star" and n > 1:
        hub = names.index(str(wan.hub))
        spokes: dict[int, WanLinkParams] = {}
        for i, name in enumerate(names):
            if i == hub:
                continue
            spoke = _link_between(topo, name, names[hub])
            if spoke is None:
                raise UserInputError(
                    "wan.links", name, f"no spoke from {name!r} to the hub; add it or wan.default"
                )
            spokes[i] = spoke
        for i in range(n):
            for j in range(n):
                if i == j:
                    continue
                hops = [spokes[k] for k in (i, j) if k != hub]
                bw[i, j] = min(link_Bps(h) for h in hops)
                rtt[i, j] = sum(h.latency_ms for h in hops) * 1e-3
                price[i, j] = sum(h.egress_usd_per_gb for h in hops) / 1e9
        center = hub
        star_hub: int | None = hub
    elif wan.kind == "matrix" and wan.matrix is not None:
        star_hub, center = None, 0
        bw, rtt, price = _matrix_paths(wan.matrix, n)
    else:
        star_hub = None
        for i in range(n):
            for j in range(i + 1, n):
                link = _link_between(topo, names[i], names[j])
                if link is None:
                    raise UserInputError(
                        "wan.links",
                        f"{names[i]}-{names[j]}",
                        "no link between these islands; add it or set wan.default",
                    )
                bw[i, j] = bw[j, i] = link_Bps(link)
                rtt[i, j] = rtt[j, i] = link.latency_ms * 1e-3
                price[i, j] = price[j, i] = link.egress_usd_per_gb / 1e9
        center = 0
    if topo.run.server is not None:
        center = names.index(topo.run.server)
    server = wan.server_bandwidth_gbit
    host = wan.host_copy_gbps
    return WanPaths(
        names=tuple(names),
        bandwidth_Bps=bw,
        rtt_s=rtt,
        egress_usd_per_byte=price,
        ring=best_ring(bw),
        center=center,
        server_Bps=float("inf") if server is None else server * GBIT,
        host_copy_Bps=float("inf") if host is None else host * 1e9,
        hub=star_hub,
        bucket=None if wan.bucket is None else bucket_path(wan.bucket),
    )


# --- TCP as the bytes see it: headers, windows, slow start; transports and patterns -------------
# Units: bytes, seconds, bytes/s. `rtt_s` is a path's round trip; a message's one-way latency
# is half of it (Hockney's α; Thakur, Rabenseifner & Gropp 2005, sec. 2).

LINUX_TCP_RMEM_MAX = 6 * 2**20  # net.ipv4.tcp_rmem max, bytes (Linux ip-sysctl.rst default)
LINUX_TCP_WMEM_MAX = 4 * 2**20  # net.ipv4.tcp_wmem max, bytes (Linux ip-sysctl.rst default)
# In-flight bytes per byte of socket buffer: the rest of the buffer holds skb overhead and
# unsent data: one Reno stream over 1 Gbit/s, 100 ms carried 2.97 MB per RTT with tcp_wmem
# 4 MiB (heloco.net.wan.probe on the emulated WAN, docs/wan.md).
WINDOW_FILL = 0.71
DEFAULT_WINDOW_BYTES = WINDOW_FILL * min(LINUX_TCP_RMEM_MAX, LINUX_TCP_WMEM_MAX)
INITIAL_WINDOW_SEGMENTS = 10  # RFC 6928: IW = 10 MSS
# ... but never more than the receiver first advertises: half its initial buffer, tcp_rmem's
# default 128 KiB (ip-sysctl.rst: tcp_rmem, tcp_adv_win_scale = 1). Binds above MSS 6.5 kB.
INITIAL_RWND_BYTES = 131072 / 2
TCP_IP_HEADER_BYTES = 52  # IPv4 20 (RFC 791) + TCP 20 (RFC 9293) + timestamps 12 (RFC 7323)
LINK_HEADER_BYTES = 14  # Ethernet header: what a shaper (tc) and a provider's meter count
DEFAULT_MTU = 1500

Transport = Literal["nccl", "gloo", "zmq"]
# Achieved fraction of a TCP path's goodput once the transfer runs at the stream's rate.
# gloo and zmq (HeLoCo's server: ZeroMQ + HMAC + decode) measured here by
# benchmarks/wan_collectives.py; NCCL's socket transport reaches <= 60% of a 32 Gbit/s link
# in nccl-tests (github.com/NVIDIA/nccl/issues/209, 2019).
TRANSPORT_EFFICIENCY: dict[str, float] = {"nccl": 0.60, "gloo": 1.0, "zmq": 1.0}
# Host bytes/s a transport's CPU work adds in series with the wire (bytes / rate): HeLoCo
# signs, checks and decodes every message whole (HMAC-SHA256, codec), so a message costs
# M/W + M/C. A pull's C is the worker's (each worker decodes its own copy, in parallel); a
# push's is the server's, which also applies the outer step and takes the pushes one after
# another. Fitted (least max error) to the 1 Gbit/s rows of benchmarks/wan_collectives.py on
# this 2-core machine at load average 15-24: this machine's rates under that load, not the
# transport's; gloo's collectives other than all-gather reached the link (no host term).
TRANSPORT_HOST_BPS: dict[str, float] = {"nccl": math.inf, "gloo": math.inf, "zmq": 2.4e8}
HELOCO_SERVER_PUSH_BPS = 1.3e8


@dataclass(frozen=True)
class TcpPath:
    """One direction of a path as TCP sees it: link rate (bytes/s of Ethernet frames), round
    trip, MTU, window per stream (None: Linux's default cap, DEFAULT_WINDOW_BYTES) and
    parallel streams."""

    link_Bps: float
    rtt_s: float
    mtu_bytes: int = DEFAULT_MTU
    window_bytes: float | None = None
    streams: int = 1

    @property
    def goodput_Bps(self) -> float:
        """Payload bytes/s of a full link: link × (MTU − 52) / (MTU + 14) (RFC 791/9293/7323
        headers on every segment; Ethernet framing)."""
        return float(goodput_Bps(self.link_Bps, self.mtu_bytes))

    @property
    def window(self) -> float:
        return DEFAULT_WINDOW_BYTES if self.window_bytes is None else self.window_bytes

    @property
    def rate_Bps(self) -> float:
        """Steady payload rate: min(goodput, streams · window / RTT)."""
        return float(stream_Bps(self.goodput_Bps, self.rtt_s, self.window, self.streams))

    @property
    def mss(self) -> float:
        return float(self.mtu_bytes - TCP_IP_HEADER_BYTES)


def goodput_Bps(link_Bps: ArrayLike, mtu_bytes: ArrayLike = DEFAULT_MTU) -> FloatArray:
    """Payload bytes/s of a link: every MTU-sized frame carries MTU − 52 bytes of payload
    and costs MTU + 14 on the wire (IPv4 RFC 791, TCP RFC 9293, timestamps RFC 7323)."""
    mtu = np.asarray(mtu_bytes, dtype=np.float64)
    return (
        np.asarray(link_Bps, dtype=np.float64)
        * (mtu - TCP_IP_HEADER_BYTES)
        / (mtu + LINK_HEADER_BYTES)
    )


def stream_Bps(
    link_Bps: ArrayLike,
    rtt_s: ArrayLike,
    window_bytes: ArrayLike = DEFAULT_WINDOW_BYTES,
    streams: ArrayLike = 1,
) -> FloatArray:
    """min(link, streams · window / RTT): a TCP stream has at most one window in flight per
    round trip (RFC 7323 sec. 1.1), so a long path caps it below the link."""
    rtt = np.asarray(rtt_s, dtype=np.float64)
    with np.errstate(divide="ignore", over="ignore"):
        cap = np.where(
            rtt > 0, np.asarray(streams) * np.asarray(window_bytes, dtype=np.float64) / rtt, np.inf
        )
    return np.minimum(np.asarray(link_Bps, dtype=np.float64), cap)


def slow_start_s(
    nbytes: ArrayLike,
    rate_Bps: ArrayLike,
    rtt_s: ArrayLike,
    mss: ArrayLike = DEFAULT_MTU - 52,
    start_window: ArrayLike | None = None,
) -> FloatArray:
    """Seconds from the first byte sent to the last byte sent of a transfer that starts from
    TCP's initial window (a new connection, or one idle longer than its RTO: RFC 5681
    sec. 4.1). The window starts at IW = 10 MSS (RFC 6928; at most the receiver's first
    advertised window, INITIAL_RWND_BYTES), or at `start_window` bytes (a window kept across
    a short idle, `restart_window`; never below IW), and doubles every round trip
    (RFC 5681 sec. 3.1) until it carries rate × RTT; round k sends W0·2^k bytes. Transfers
    that end inside slow start take (k − 1) round trips plus their last round at the rate;
    longer ones k* round trips, then the rest at the rate (Cardwell, Savage & Anderson 2000,
    sec. 2.1). Add one one-way latency for the last byte to arrive."""
    m = np.asarray(nbytes, dtype=np.float64)
    rate = np.asarray(rate_Bps, dtype=np.float64)
    rtt = np.asarray(rtt_s, dtype=np.float64)
    iw = _start_window(mss, start_window)
    with np.errstate(invalid="ignore", divide="ignore"):  # no round trip: the rate alone
        k_star, k = _slow_start_rounds(m, rate * rtt, iw)
        sent_ss = iw * (2.0**k_star - 1.0)  # bytes sent until the window carries the BDP
        last = m - iw * (2.0 ** (k - 1.0) - 1.0)
        short = (k - 1.0) * rtt + last / rate
        long = k_star * rtt + (m - sent_ss) / rate
        out = np.where(m <= sent_ss, short, long)
    return np.where(rtt > 0, out, m / rate)


def _slow_start_rounds(
    m: FloatArray, bdp: FloatArray, w0: FloatArray
) -> tuple[FloatArray, FloatArray]:
    """Slow-start rounds from a window of ``w0`` bytes (doubling per round trip, RFC 5681
    sec. 3.1): k*, the rounds until the window carries the path's ``bdp`` bytes, and k, the
    smallest k with W0·(2^k − 1) >= M that a transfer of ``m`` bytes needs (at least 1)."""
    with np.errstate(invalid="ignore", divide="ignore"):  # an unshaped local path: inf · 0
        k_star = np.ceil(np.log2(np.maximum(bdp / w0, 1.0)))
        k = np.maximum(np.ceil(np.log2(m / w0 + 1.0)), 1.0)
    return k_star, k


def _start_window(mss: ArrayLike, start_window: ArrayLike | None) -> FloatArray:
    """Bytes: IW = min(10 MSS, INITIAL_RWND_BYTES) (RFC 6928), or a kept window, at least IW."""
    iw = np.minimum(INITIAL_WINDOW_SEGMENTS * np.asarray(mss, dtype=np.float64), INITIAL_RWND_BYTES)
    if start_window is None:
        return iw
    return np.maximum(iw, np.asarray(start_window, dtype=np.float64))


def end_window(
    nbytes: ArrayLike,
    rate_Bps: ArrayLike,
    rtt_s: ArrayLike,
    mss: ArrayLike = DEFAULT_MTU - 52,
    start_window: ArrayLike | None = None,
) -> FloatArray:
    """Congestion window (bytes) a transfer leaves behind under `slow_start_s`'s schedule: the
    window of its last slow-start round, W0·2^(k−1) for a transfer that ends inside slow start,
    W0·2^k* once it reached rate × RTT (doubling per round trip, RFC 5681 sec. 3.1; an
    application-limited sender stops growing it there, RFC 7661 sec. 4.3)."""
    m = np.asarray(nbytes, dtype=np.float64)
    w0 = _start_window(mss, start_window)
    with np.errstate(invalid="ignore"):  # an unshaped local path: inf · 0
        bdp = np.asarray(rate_Bps, dtype=np.float64) * np.asarray(rtt_s, dtype=np.float64)
    k_star, k = _slow_start_rounds(m, bdp, w0)
    with np.errstate(invalid="ignore", over="ignore"):
        out = np.where(m <= w0 * (2.0**k_star - 1.0), w0 * 2.0 ** (k - 1.0), w0 * 2.0**k_star)
    return np.asarray(out, dtype=np.float64)


# A bottleneck's queue, in seconds at its rate: the rule of thumb B = RTT × C with
# RTT = 250 ms (Appenzeller, Keslassy & McKeown 2004, "Sizing router buffers", sec. 1), and
# the emulated WAN's downlink queue (heloco.net.wan, EmulatedWan.queue_s).
BOTTLENECK_QUEUE_S = 0.25


def acked_window(
    nbytes: ArrayLike,
    rate_Bps: ArrayLike,
    rtt_s: ArrayLike,
    mss: ArrayLike = DEFAULT_MTU - 52,
    start_window: ArrayLike | None = None,
) -> FloatArray:
    """Congestion window (bytes) a transfer of M bytes from W0 leaves when nothing holds its
    segments back at the sender: slow start adds every byte acknowledged (RFC 5681 eq. 2 with
    byte counting, RFC 3465; Linux tcp_slow_start, cwnd += acked) while the window is less than
    twice what is in flight (Linux tcp_is_cwnd_limited, "grows to twice what was ACKed"), and
    the path holds at most its BDP plus the bottleneck's queue (BOTTLENECK_QUEUE_S at the rate):
    min(W0 + M, 2M, R·(RTT + B)), never below W0. Loss and its recovery are not modelled."""
    m = np.asarray(nbytes, dtype=np.float64)
    w0 = _start_window(mss, start_window)
    with np.errstate(invalid="ignore"):  # an unshaped local path: inf · 0
        cap = np.asarray(rate_Bps, dtype=np.float64) * (
            np.asarray(rtt_s, dtype=np.float64) + BOTTLENECK_QUEUE_S
        )
    return np.maximum(w0, np.minimum(np.minimum(w0 + m, 2.0 * m), cap))


# Linux's RTO on a path of steady round trip: SRTT + RTTVAR, where RTTVAR is never below
# TCP_RTO_MIN (include/net/tcp.h: HZ/5; tcp_input.c, tcp_rtt_estimator and tcp_set_rto), the
# floor RFC 6298 eq. (2.3) puts on K·RTTVAR (G); seconds.
TCP_RTO_MIN_S = 0.2


def rto_s(rtt_s: ArrayLike) -> FloatArray:
    """Retransmission timeout (s) of a connection whose smoothed round trip is `rtt_s`
    (variance → 0): SRTT + TCP_RTO_MIN (RFC 6298 eq. 2.3, with Linux's 200 ms floor on the
    variance term)."""
    return np.asarray(rtt_s, dtype=np.float64) + TCP_RTO_MIN_S


# The smoothed round trip's gain per RTT sample (RFC 6298 sec. 2.3: alpha = 1/8; Linux
# tcp_rtt_estimator, srtt += (m − srtt)/8 on every ACK that acknowledges new data).
SRTT_GAIN = 1.0 / 8.0
# Full-sized segments a receiver acknowledges per ACK (RFC 5681 sec. 4.2: at least every
# second segment; Linux's __tcp_ack_snd_check), so a window of W bytes gives W/(2·MSS) samples.
DELACK_SEGMENTS = 2.0


def burst_queue_s(
    nbytes: ArrayLike,
    rate_Bps: ArrayLike,
    rtt_s: ArrayLike,
    mss: ArrayLike = DEFAULT_MTU - 52,
    start_window: ArrayLike | None = None,
) -> tuple[FloatArray, FloatArray]:
    """Queueing delay (s) at a bottleneck downstream of the sender, from a transfer of M bytes
    in slow start from W0 (`_start_window`; the window doubles every round trip, RFC 5681
    sec. 3.1, past the BDP too, no loss modelled): (the delay its last byte waits there, the
    part of the sender's smoothed RTT that is queue when its last ACK has arrived).

    A round of B bytes queues q(B): the first leaves at the sender's line rate, so its last
    byte waits B/R; a later one leaves ACK-clocked at twice the rate (two segments out per
    segment acknowledged), leaving max(B/2, B − R·RTT) queued (half of it, or all it holds
    beyond the pipe), at most the queue the bottleneck holds, BOTTLENECK_QUEUE_S. Its
    n = B/(DELACK_SEGMENTS·MSS) RTT samples see a queue ramping to q
    in steps d = q/n, whose EWMA (gain g = SRTT_GAIN from the base, RFC 6298 eq. 2.3) is
    ramp(n, d) = d·[n(1 − a^n) − a(1 − n·a^(n−1) + (n − 1)·a^n)/g], a = 1 − g; the smoothed
    RTT's queue is the last round's ramp plus a^n times the round before's. Both are 0
    without a round trip (no slow start)."""
    m = np.asarray(nbytes, dtype=np.float64)
    rate = np.asarray(rate_Bps, dtype=np.float64)
    rtt = np.asarray(rtt_s, dtype=np.float64)
    seg = np.asarray(mss, dtype=np.float64)
    w0 = _start_window(mss, start_window)
    with np.errstate(invalid="ignore", divide="ignore", over="ignore"):
        bdp = rate * rtt
        _, k = _slow_start_rounds(m, bdp, w0)  # rounds, doubling throughout
        last = m - w0 * (2.0 ** (k - 1.0) - 1.0)
        prev = w0 * 2.0 ** (k - 2.0)

        def queued(b: FloatArray, first: ArrayLike) -> FloatArray:
            q = np.where(first, b, np.maximum(b / 2.0, b - bdp)) / rate
            return np.minimum(q, BOTTLENECK_QUEUE_S)

        def ramp(b: FloatArray, q: FloatArray) -> tuple[FloatArray, FloatArray]:
            n = b / (DELACK_SEGMENTS * seg)
            d = np.where(n > 0, q / n, 0.0)
            a = 1.0 - SRTT_GAIN
            an = a**n
            smooth = d * (n * (1.0 - an) - a * (1.0 - n * an / a + (n - 1.0) * an) / SRTT_GAIN)
            return np.maximum(smooth, 0.0), an

        q_last = queued(last, k <= 1.0)
        s_last, a_last = ramp(last, q_last)
        s_prev, _ = ramp(prev, queued(prev, k <= 2.0))
        q_srtt = s_last + np.where(k >= 2.0, a_last * s_prev, 0.0)
    ok = (rtt > 0) & np.isfinite(rate) & (rate > 0)
    return np.where(ok, q_last, 0.0), np.where(ok, q_srtt, 0.0)


def restart_window(
    window_bytes: ArrayLike,
    idle_s: ArrayLike,
    rtt_s: ArrayLike,
    mss: ArrayLike = DEFAULT_MTU - 52,
    srtt_s: ArrayLike | None = None,
) -> FloatArray:
    """Congestion window (bytes) a connection sends with after `idle_s` seconds without sending
    anything: Linux with net.ipv4.tcp_slow_start_after_idle = 1 keeps it whole up to one RTO of
    idle, then halves it once per further RTO, ⌈idle/RTO⌉ − 1 times, never below the restart
    window min(IW, cwnd) (RFC 2861 sec. 3, congestion window validation; kernel tcp_output.c,
    tcp_cwnd_restart, which halves the window in whole segments, cwnd >>= 1). RFC 5681
    sec. 4.1 would restart from IW after one RTO instead. The RTO
    is `rto_s` of the smoothed RTT the connection last measured, `srtt_s` (default `rtt_s`:
    no queue in its samples)."""
    w = np.asarray(window_bytes, dtype=np.float64)
    idle = np.asarray(idle_s, dtype=np.float64)
    rto = rto_s(rtt_s if srtt_s is None else srtt_s)
    # capped at 64: no window is 2^64 bytes, so the floor binds long before
    halvings = np.minimum(np.where(idle > rto, np.ceil(idle / rto) - 1.0, 0.0), 64.0)
    seg = np.asarray(mss, dtype=np.float64)
    # the kernel counts the window in segments and halves it by a shift (cwnd >>= 1)
    kept = np.floor(np.floor(w / seg) / 2.0**halvings) * seg
    return np.maximum(_start_window(mss, None), np.where(halvings > 0, kept, w))


def transfer_s(
    nbytes: ArrayLike, path: TcpPath, cold: bool = False, efficiency: float = 1.0
) -> FloatArray:
    """One message of `nbytes` over `path`, first byte sent to last byte received: one-way
    latency plus M / rate (warm connection), or the slow-start schedule from the initial
    window (`cold`). `efficiency` is the transport's achieved fraction of the rate."""
    rate = path.rate_Bps * efficiency
    m = np.asarray(nbytes, dtype=np.float64)
    send = slow_start_s(m, rate, path.rtt_s, path.mss) if cold else m / rate
    return path.rtt_s / 2.0 + send


RESTART_ROUNDS = 8  # rounds iterated to the steady window of a connection used once a round


def heloco_legs_s(
    nbytes: ArrayLike,
    rate_Bps: ArrayLike,
    rtt_s: ArrayLike,
    pull_bytes: ArrayLike | None = None,
    compute_s: ArrayLike | None = None,
    blocking: bool = True,
    queued: tuple[ArrayLike, ArrayLike] = (False, True),
    ack_delay_s: ArrayLike = 0.0,
) -> tuple[FloatArray, FloatArray]:
    """Seconds to send HeLoCo's push (Δ, `nbytes`) and its pull (the model, `pull_bytes`,
    default the same), first byte to last byte sent, under `slow_start_s`.

    Without `compute_s` each starts from TCP's initial window (RFC 5681 sec. 4.1). With it,
    each direction of the worker's one connection is used once a round, so it starts from the
    window its previous round left (`end_window`) after the idle since (`restart_window`):
    the worker sends the pull request one RTT after its push (within the RTO: no restart)
    and its next push one period after the last; the server its ack, then the model. From
    the last byte of a leg to the next send on that side is the period − that leg − one RTT,
    period = H·T + X (blocking) or max(H·T, X) (overlapped), X = 2·RTT + push + pull.

    `queued` says, for the push and the pull, whether the direction's bottleneck queue lies
    downstream of its sender (default: the pull, which crosses the worker's downlink) rather
    than in the sender's own host, where Linux's TCP small queues hold about a millisecond of
    it (tcp_output.c, tcp_small_queue_check) and the rest waits unsent. A queued direction's
    sender sends its last byte `burst_queue_s` earlier than it leaves the bottleneck, so it
    idles that much longer, its RTO is built from the smoothed RTT its own queue inflated
    (`burst_queue_s`, RFC 6298 eq. 2.3), and its window grows by every byte acknowledged
    (`acked_window`); a paced one keeps the window of its last slow-start round
    (`end_window`). `ack_delay_s` (s) is added to the round trip of the pull's ACK clock
    only: its ACKs wait that long in a queue the other way (`hub_push_queue_s`), so its slow
    start doubles once per RTT + that delay. Seconds; the steady state after RESTART_ROUNDS
    rounds, each from the one before."""
    up, down, _ = heloco_legs_windows(
        nbytes, rate_Bps, rtt_s, pull_bytes, compute_s, blocking, queued, ack_delay_s
    )
    return up, down


def heloco_legs_windows(
    nbytes: ArrayLike,
    rate_Bps: ArrayLike,
    rtt_s: ArrayLike,
    pull_bytes: ArrayLike | None = None,
    compute_s: ArrayLike | None = None,
    blocking: bool = True,
    queued: tuple[ArrayLike, ArrayLike] = (False, True),
    ack_delay_s: ArrayLike = 0.0,
) -> tuple[FloatArray, FloatArray, FloatArray]:
    """`heloco_legs_s`'s (push, pull) seconds and the congestion window (bytes) the pull
    starts from in that steady state (`_start_window`: IW without `compute_s`)."""
    m = np.asarray(nbytes, dtype=np.float64)
    pull = m if pull_bytes is None else np.asarray(pull_bytes, dtype=np.float64)
    rtt = np.asarray(rtt_s, dtype=np.float64)
    # the pull's ACK clock: its round trip plus the wait of its ACKs (`ack_delay_s`)
    clock = rtt + np.asarray(ack_delay_s, dtype=np.float64)
    up = slow_start_s(m, rate_Bps, rtt)
    down = slow_start_s(pull, rate_Bps, clock)
    w_down: FloatArray | None = None
    if compute_s is not None:
        compute = np.asarray(compute_s, dtype=np.float64)
        w_up = None
        for _ in range(RESTART_ROUNDS):
            x = 2.0 * rtt + up + down
            period = compute + x if blocking else np.maximum(compute, x)
            w_up = _next_window(m, rate_Bps, rtt, w_up, period - up - rtt, queued[0])
            w_down = _next_window(pull, rate_Bps, rtt, w_down, period - down - rtt, queued[1])
            up = slow_start_s(m, rate_Bps, rtt, start_window=w_up)
            down = slow_start_s(pull, rate_Bps, clock, start_window=w_down)
    start = _start_window(DEFAULT_MTU - 52, w_down)
    return up, down, np.broadcast_to(start, np.broadcast(up, down).shape).astype(np.float64)


def hub_push_queue_s(
    push_bytes: ArrayLike, sender_Bps: ArrayLike, hub_Bps: ArrayLike
) -> FloatArray:
    """Mean queueing delay (s) at a hub link of `hub_Bps` (bytes/s) while a push of
    `push_bytes` crosses it from a sender of `sender_Bps`: the push enters at r and leaves at
    C < r, so the queue grows at r − C until its last byte is in and then drains at C (a fluid
    queue, dQ/dt = r − C; Anick, Mitra & Sondhi 1982, Bell Syst. Tech. J. 61(8)), to at most
    Q = min(M·(1 − C/r), BOTTLENECK_QUEUE_S·C) bytes: a triangle over the push's M/C seconds,
    whose mean delay is Q/(2C). Every packet the other way that crosses the same FIFO (a
    dispatch's ACKs, on a hub link shared both ways) waits that long. 0 when r ≤ C."""
    m = np.asarray(push_bytes, dtype=np.float64)
    r = np.asarray(sender_Bps, dtype=np.float64)
    c = np.asarray(hub_Bps, dtype=np.float64)
    with np.errstate(invalid="ignore", divide="ignore"):
        peak = np.minimum(m * (1.0 - c / r), BOTTLENECK_QUEUE_S * c)
        out = np.where((r > c) & (c > 0), peak / (2.0 * c), 0.0)
    return np.asarray(np.where(np.isfinite(out), out, 0.0), dtype=np.float64)


def _next_window(
    nbytes: FloatArray,
    rate_Bps: ArrayLike,
    rtt: FloatArray,
    start_window: FloatArray | None,
    idle_s: FloatArray,
    queued: ArrayLike,
) -> FloatArray:
    """The window a direction's next leg starts from: what its last leg (from `start_window`)
    left, after `idle_s` from the leg's last byte at the bottleneck to the next send; a
    `queued` direction's sender idles its last byte's queueing delay longer, and its RTO is
    built from the smoothed RTT with its queue (`burst_queue_s`)."""
    held = restart_window(end_window(nbytes, rate_Bps, rtt, start_window=start_window), idle_s, rtt)
    q_last, q_srtt = burst_queue_s(nbytes, rate_Bps, rtt, start_window=start_window)
    left = acked_window(nbytes, rate_Bps, rtt, start_window=start_window)
    free = restart_window(left, idle_s + q_last, rtt, srtt_s=rtt + q_srtt)
    return np.where(queued, free, held)


def heloco_exchange_s(
    nbytes: ArrayLike,
    rate_Bps: ArrayLike,
    rtt_s: ArrayLike,
    pull_bytes: ArrayLike | None = None,
    compute_s: ArrayLike | None = None,
    blocking: bool = True,
) -> FloatArray:
    """HeLoCo's round exchange over one worker's path: a push of Δ (`nbytes`) and a pull of
    the model (`pull_bytes`, default the same), each a request and its reply (RTT) plus its
    bytes (`heloco_legs_s`: from TCP's initial window, or, given the round's `compute_s` and
    exchange mode, from the window the connection kept over its idle): (RTT + push) +
    (RTT + pull) (heloco/net/link.py push and pull)."""
    rtt = np.asarray(rtt_s, dtype=np.float64)
    up, down = heloco_legs_s(nbytes, rate_Bps, rtt, pull_bytes, compute_s, blocking)
    return (rtt + up) + (rtt + down)


# gloo's own algorithms (torch.distributed's CPU backend; gloo/allreduce.cc, reduce.cc,
# allgather.cc, transport/tcp/pair.cc):
# - a send leaves only once the peer's recv-ready message has arrived (pair.cc: send waits for
#   NOTIFY_RECV_READY), and that message is written to the same TCP connection as the rank's
#   outgoing data, behind it;
# - the ring all-reduce and reduce move segments of at most 1 MiB, two in flight per neighbour
#   (allreduce.h, reduce.h: kMaxSegmentSize = 1024 * 1024, "two are in flight at all times").
GLOO_MAX_SEGMENT_BYTES = 1024 * 1024
# Host bytes/s of torch's gloo all-gather per output byte: it gathers into a new flat n·M
# tensor and copies it out to the n outputs (ProcessGroupGloo.cpp AsyncAllgatherWork),
# fitted to the 1 Gbit/s rows of benchmarks/wan_collectives.py on this 2-core machine
# at load average 15-24 (as TRANSPORT_HOST_BPS).
GLOO_ALLGATHER_HOST_BPS = 2.2e8


def gloo_segments(nbytes: float, n: int, reduce: bool = False) -> tuple[int, float]:
    """(segments, bytes per segment) of gloo's ring over `nbytes` among `n` ranks: at least
    2n segments of at most 1 MiB, a multiple of n (gloo/allreduce.cc ring; reduce.cc sizes the
    segment first: min(M/2n, 1 MiB))."""
    if reduce:
        seg = max(min(math.ceil(nbytes / (2 * n)), GLOO_MAX_SEGMENT_BYTES), 1)
        count = max(math.ceil(nbytes / seg), 2 * n)
        return -(-count // n) * n, float(seg)
    count = max(math.ceil(nbytes / GLOO_MAX_SEGMENT_BYTES), 2 * n)
    count = -(-count // n) * n
    return count, float(math.ceil(nbytes / count))


def gloo_pipeline_s(k: float, seg: float, path: TcpPath, same_peer: bool, eff: float) -> float:
    """Seconds for `k` segments of `seg` bytes to cross one ring edge through gloo's
    two-in-flight rendezvous: a rank posts the recv of segment i + 2 when segment i has
    arrived; its recv-ready message takes a one-way latency to the sender, then the data
    another plus seg/W. With distinct neighbours (n > 2) two segments cross per
    RTT + seg/W, or the link is the limit: max(⌈k/2⌉·(RTT + t) + [k even]·t, RTT + k·t),
    t = seg/W. With two ranks the neighbour is the same peer, so the recv-ready message
    waits behind the segment the rank is sending on that connection:
    ⌈k/2⌉·RTT + k·t (gloo/transport/tcp/pair.cc; allreduce.cc). Never under one-way latency
    plus k·seg at the stream's rate (window)."""
    if k <= 0:
        return 0.0
    rtt = path.rtt_s
    t = seg / (path.goodput_Bps * eff)
    pairs = math.ceil(k / 2)
    if same_peer:
        fill = pairs * rtt + k * t
    else:
        fill = max(pairs * (rtt + t) + (1 - k % 2) * t, rtt + k * t)
    return max(fill, rtt / 2 + k * seg / (path.rate_Bps * eff))


GLOO_PATTERNS = ("allreduce", "reduce", "allgather")  # gloo's own algorithms, below


def gloo_pattern_s(pattern: str, nbytes: float, n: int, path: TcpPath) -> float | None:
    """Seconds of gloo's all-reduce, reduce or all-gather among `n` ranks of payload `nbytes`
    (None for the other patterns: the generic formulas hold). Warm connections; every peer's
    recv-ready messages arrived before the last rank entered, as when ranks arrive apart.

    - allreduce: reduce-scatter then all-gather, each (n−1)·(segments/n) segments through
      the two-in-flight pipeline (gloo/allreduce.cc ring).
    - reduce: a ring pass of all segments but two (reduce.cc loops i < segments − 2), then
      every rank sends its chunk to the root in one message: RTT (recv-ready, then data)
      plus the root's downlink carrying the others' chunks, or one chunk at the stream's
      window-limited rate, whichever is longer.
    - allgather, two ranks: the last to enter finds the peer's recv-ready messages waiting
      and writes both halves of its M at once; its own recv-ready messages go out behind
      them, so the peer's second half leaves only after M: RTT + 1.5·M/W (allgather.cc sends
      two halves, send before recv; pair.cc). n > 2: (n−1)·(L + M/W) (ring; recv-ready
      messages go to the other neighbour). Both plus torch's copy of the n·M output at
      GLOO_ALLGATHER_HOST_BPS.
    """
    eff = TRANSPORT_EFFICIENCY["gloo"]
    lat = path.rtt_s / 2.0
    w = path.goodput_Bps * eff
    rate = path.rate_Bps * eff
    same = n == 2
    if pattern == "allreduce":
        count, seg = gloo_segments(nbytes, n)
        k = (n - 1) * count // n
        return 2.0 * gloo_pipeline_s(k, seg, path, same, eff)
    if pattern == "reduce":
        count, seg = gloo_segments(nbytes, n, reduce=True)
        used = min(count, math.ceil(nbytes / seg))  # segments past M are empty
        ring = gloo_pipeline_s(max(used - 2, 0), seg, path, same, eff)
        chunk = min(count // n * seg, nbytes)
        others = max(nbytes - chunk, 0.0)  # the root's own chunk stays
        return ring + 2.0 * lat + max(others / w, min(chunk, others) / rate)
    if pattern == "allgather":
        host = n * nbytes / GLOO_ALLGATHER_HOST_BPS
        if same:
            return 2.0 * lat + max(nbytes / rate, 1.5 * nbytes / w) + host
        return (n - 1) * (lat + nbytes / rate) + host
    return None


Pattern = Literal[
    "allreduce", "reduce", "broadcast", "reduce+bcast", "allgather", "p2p",
    "heloco-pull", "heloco-push", "heloco-exchange",
]  # fmt: skip
PATTERNS: tuple[str, ...] = Pattern.__args__  # type: ignore[attr-defined]


def _binomial_chains(n: int) -> list[tuple[int, int]]:
    """(levels, Σ concurrent sends of its ancestors) for every rank of a binomial-tree
    broadcast from rank 0 over n ranks, each parent sending to all its children at once:
    rank v (v > 0) hangs under v − 2^b, b the highest bit of v, and sends to v + 2^j for
    every j above b with v + 2^j < n (gloo/broadcast.cc)."""
    dim = max(1, (n - 1).bit_length())
    children = [sum(1 for j in range(v.bit_length(), dim) if v + (1 << j) < n) for v in range(n)]
    chains = [(0, 0)] * n
    for v in range(1, n):
        parent = v - (1 << (v.bit_length() - 1))
        levels, load = chains[parent]
        chains[v] = (levels + 1, load + children[parent])
    return chains[1:]


def pattern_s(
    pattern: str,
    nbytes: ArrayLike,
    n: int,
    path: TcpPath,
    transport: Transport = "gloo",
    cold: bool | None = None,
) -> FloatArray:
    """Seconds of one collective or exchange among `n` processes, each behind an access link
    `path` (the same rate both ways; `path.rtt_s` between any two). `nbytes` is each
    process's payload M. L = RTT/2 is one message's one-way latency; W the stream's rate
    times the transport's efficiency.

    - allreduce (ring): 2(n−1) steps of one chunk M/n each: 2(n−1)·(L + M/(nW))
      (Patarasuk & Mueller 2009; one α per step = one-way latency, Thakur et al. 2005;
      gloo/allreduce.cc ring).
    - reduce to one rank: a ring reduce-scatter, (n−1)·(L + M/(nW)), then every rank sends
      its reduced chunk to the root, whose downlink takes (n−1)·M/n: L + (n−1)·M/(nW)
      (gloo/reduce.cc).
    - broadcast from one rank: binomial tree (Thakur et al. 2005, sec. 4.1) whose every
      rank posts its sends to all its children at once (gloo/broadcast.cc), so k children
      share its uplink: a child receives L + k·M/W after its parent did; the deepest chain
      takes ⌈log2 n⌉ latencies and (d + (d−1) + … + 1)·M/W for d = ⌈log2 n⌉ when n = 2^d.
    - reduce+bcast: the two above one after the other: two collectives, each with its own
      latency and pipeline fill, not one.
    - allgather (ring): (n−1)·(L + M/W) (gloo/allgather.cc).
    - p2p: L + M/W.
    - heloco-pull / heloco-push: n − 1 workers each fetch / send M from / to one server at
      once: a request (L), then M through the server's link shared by all, (n−1)·M/W, from
      TCP's initial window (a worker computed in between: idle > RTO, RFC 5681 sec. 4.1),
      the host's CPU per message: M/C on a pull (each worker decodes its own),
      (n−1)·M/C_server on a push (the server applies them in turn), and the reply (L); heloco-exchange is a push then a pull, HeLoCo's round
      (heloco/net/worker_loop.py: pull, H inner steps, push).

    `cold` (default: True for the HeLoCo exchange, False for collectives, whose connections
    carried the previous call) starts each transfer from the initial window. With transport
    "gloo" on warm connections, allreduce, reduce and allgather are gloo's own algorithms
    (`gloo_pattern_s`: 1 MiB segments two in flight, its recv-ready rendezvous); the formulas
    above are the textbook ring that NCCL runs.
    """
    eff = TRANSPORT_EFFICIENCY[transport]
    m = np.asarray(nbytes, dtype=np.float64)
    lat = path.rtt_s / 2.0
    k = float(n)
    heloco = pattern.startswith("heloco")
    is_cold = heloco if cold is None else cold

    def send(size: FloatArray | float) -> FloatArray:
        """Seconds to put `size` bytes through one stream, without the one-way latency."""
        return transfer_s(size, path, is_cold, eff) - lat

    if transport == "gloo" and not is_cold and n > 1 and pattern in GLOO_PATTERNS:
        one = np.vectorize(lambda size: gloo_pattern_s(pattern, float(size), n, path))
        return np.asarray(one(m), dtype=np.float64)
    if pattern == "allreduce":
        return 2.0 * (k - 1.0) * (lat + send(m / k))
    if pattern == "reduce":
        return (k - 1.0) * (lat + send(m / k)) + lat + send((k - 1.0) * m / k)
    if pattern == "broadcast":
        return max(
            (hops * lat + send(load * m) for hops, load in _binomial_chains(n)),
            key=lambda t: float(np.max(t)),
        )
    if pattern == "reduce+bcast":
        return pattern_s("reduce", m, n, path, transport, cold) + pattern_s(
            "broadcast", m, n, path, transport, cold
        )
    if pattern == "allgather":
        return (k - 1.0) * (lat + send(m))
    if pattern == "p2p":
        return lat + send(m)
    if pattern in ("heloco-pull", "heloco-push"):
        # n − 1 streams share the server's link: each at 1/(n−1) of it, its own window; the
        # server checks and applies the n − 1 pushes one after another
        workers = max(k - 1.0, 1.0)
        shared = dataclasses.replace(path, link_Bps=path.link_Bps / workers)
        wire = lat + transfer_s(m, shared, is_cold, eff)
        if pattern == "heloco-pull" or transport != "zmq":
            return wire + m / TRANSPORT_HOST_BPS[transport]
        return wire + workers * m / HELOCO_SERVER_PUSH_BPS
    if pattern == "heloco-exchange":
        return pattern_s("heloco-push", m, n, path, transport, cold) + pattern_s(
            "heloco-pull", m, n, path, transport, cold
        )
    raise UserInputError("pattern", pattern, f"one of {', '.join(PATTERNS)}")
