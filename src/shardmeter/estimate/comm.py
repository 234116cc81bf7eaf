"""Collective communication costs (seconds) over a cluster's NVLink domain and NICs.

Ring collectives follow Thakur et al. 2005 / Patarasuk & Mueller 2009 (alpha-beta model). A
group larger than what fits in one NVLink domain runs hierarchically: the intra-domain part over
the fast fabric, the cross-domain part over the per-GPU NIC (rail-optimised). `M` is always the
full buffer in bytes (all-reduce buffer, all-gather output, reduce-scatter input); `n` the group
size; `stride` the rank distance between group members (inner parallel degrees).
All functions take floats or broadcastable numpy arrays.
"""

from __future__ import annotations

from dataclasses import dataclass

from shardmeter.estimate._xp import Num, maximum, minimum, where
from shardmeter.estimate._xp import floor as _floor
from shardmeter.specs.hardware import Cluster, Link


@dataclass(frozen=True)
class LinkRate:
    """Achieved bytes/s per GPU per direction and per-hop latency (s) of one link."""

    bytes_per_s: float
    latency_s: float

    @classmethod
    def of(cls, link: Link) -> LinkRate:
        return cls(link.effective_bytes_per_s, link.latency_s)


def ring_all_reduce_time(m: Num, n: Num, link: LinkRate) -> Num:
    """Ring all-reduce over n ≥ 1 ranks: 2(n−1)·α + 2(n−1)/n · M/W (Thakur et al. 2005)."""
    steps = n - 1.0
    return 2.0 * steps * (link.latency_s + m / (n * link.bytes_per_s))


def ring_all_gather_time(m: Num, n: Num, link: LinkRate) -> Num:
    """Ring all-gather (= reduce-scatter) over n ≥ 1 ranks: (n−1)·α + (n−1)/n · M/W."""
    steps = n - 1.0
    return steps * (link.latency_s + m / (n * link.bytes_per_s))


ring_reduce_scatter_time = ring_all_gather_time


def p2p_time(m: Num, link: LinkRate) -> Num:
    """Point-to-point send of M bytes: α + M/W."""
    return link.latency_s + m / link.bytes_per_s


def domain_members(n: Num, stride: Num, nvlink_domain: int) -> Num:
    """Group members that share one NVLink domain: min(n, max(1, domain // stride))."""
    return minimum(n * 1.0, maximum(_floor(nvlink_domain / stride), 1.0))


def crosses_domain(n: Num, stride: Num, cluster: Cluster) -> Num:
    """True where a group of n ranks at this stride spans more than one NVLink domain."""
    return n > domain_members(n, stride, cluster.nvlink_domain)


def all_reduce_time(m: Num, n: Num, stride: Num, cluster: Cluster) -> Num:
    """Hierarchical all-reduce: RS_intra(M, g) + AR_inter(M/g, n/g) + AG_intra(M, g).

    Reduces to a plain ring over NVLink when the group fits one domain (C.4, hierarchical row).
    """
    intra, inter = LinkRate.of(cluster.intra), LinkRate.of(cluster.inter)
    g = domain_members(n, stride, cluster.nvlink_domain)
    return 2.0 * ring_reduce_scatter_time(m, g, intra) + ring_all_reduce_time(m / g, n / g, inter)


def all_gather_time(m: Num, n: Num, stride: Num, cluster: Cluster) -> Num:
    """Hierarchical all-gather of an M-byte output: AG_inter(M/g, n/g) + AG_intra(M, g)."""
    intra, inter = LinkRate.of(cluster.intra), LinkRate.of(cluster.inter)
    g = domain_members(n, stride, cluster.nvlink_domain)
    return ring_all_gather_time(m, g, intra) + ring_all_gather_time(m / g, n / g, inter)


reduce_scatter_time = all_gather_time


def all_to_all_time(m: Num, n: Num, stride: Num, cluster: Cluster) -> Num:
    """All-to-all of an M-byte local send buffer: (n−1)·α + (n−1)/n · M/W (C.4).

    The (g−1)/n share bound for peers in the same NVLink domain and the (n−g)/n share bound for
    other domains move concurrently, so the slower of the two sets the time.
    """
    intra, inter = LinkRate.of(cluster.intra), LinkRate.of(cluster.inter)
    g = domain_members(n, stride, cluster.nvlink_domain)
    t_intra = (g - 1.0) * intra.latency_s + (g - 1.0) / n * m / intra.bytes_per_s
    t_inter = (n - g) * inter.latency_s + (n - g) / n * m / inter.bytes_per_s
    return maximum(t_intra, t_inter)


def ring_hop_time(m: Num, n: Num, stride: Num, cluster: Cluster) -> Num:
    """One step of a ring of n ranks at `stride` (ring attention): α + M/W over the NIC when
    the ring spans NVLink domains (its slowest hop sets the pace), else over NVLink."""
    intra, inter = LinkRate.of(cluster.intra), LinkRate.of(cluster.inter)
    return where(crosses_domain(n, stride, cluster), p2p_time(m, inter), p2p_time(m, intra))


def send_recv_time(m: Num, stride: Num, cluster: Cluster) -> Num:
    """Point-to-point between neighbours `stride` ranks apart (pipeline / ring-attention hop)."""
    across = stride >= cluster.nvlink_domain
    intra, inter = LinkRate.of(cluster.intra), LinkRate.of(cluster.inter)
    return where(across, p2p_time(m, inter), p2p_time(m, intra))
