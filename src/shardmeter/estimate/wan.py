"""The WAN between islands: path matrices resolved from a topology, and the collectives
that run over them (ring and hub all-reduce, ring all-gather, a gather through object storage).

Units: seconds, bytes, bytes/s; `rtt_s` is the round-trip time one synchronous message round
costs (design doc C.4: α_WAN ≈ RTT per round). Functions broadcast over numpy arrays.
"""

from __future__ import annotations

import itertools
from dataclasses import dataclass

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
    """Effective bytes/s of a link: efficiency × nominal, capped by streams·window/RTT (C.4)."""
    nominal = link.bandwidth_gbit * GBIT * link.efficiency
    window = None if link.window_mb is None else link.window_mb * 1e6
    return float(effective_wan_Bps(nominal, link.latency_ms * 1e-3, link.streams, window))


def _link_between(topo: Topology, a: str, b: str) -> WanLinkParams | None:
    for link in topo.wan.links:
        if {link.from_, link.to} == {a, b}:
            return link
    return topo.wan.default


def _matrix_paths(m: WanMatrix, n: int) -> tuple[FloatArray, FloatArray, FloatArray]:
    """(bytes/s, RTT s, USD/byte) matrices from a [wan.matrix] table."""
    off = ~np.eye(n, dtype=bool)
    gbit = np.asarray(m.bandwidth_gbit, dtype=np.float64)
    bw = np.where(off, gbit * GBIT * m.efficiency, np.inf)
    rtt = np.where(off, np.asarray(m.latency_ms, dtype=np.float64) * 1e-3, 0.0)
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
