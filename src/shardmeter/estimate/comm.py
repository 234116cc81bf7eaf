"""Collective communication costs (seconds) over a cluster's NVLink domain and NICs.

Ring collectives follow Thakur et al. 2005 / Patarasuk & Mueller 2009 (alpha-beta model). A
group larger than what fits in one NVLink domain runs hierarchically: the intra-domain part over
the fast fabric, the cross-domain part over the per-GPU NIC (rail-optimised). `M` is always the
full buffer in bytes (all-reduce buffer, all-gather output, reduce-scatter input); `n` the group
size; `stride` the rank distance between group members (inner parallel degrees).
All functions broadcast over numpy arrays.
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np
from numpy.typing import ArrayLike, NDArray

from shardmeter.specs.hardware import Cluster, Link

FloatArray = NDArray[np.float64]


@dataclass(frozen=True)
class LinkRate:
    """Achieved bytes/s per GPU per direction and per-hop latency (s) of one link."""

    bytes_per_s: float
    latency_s: float

    @classmethod
    def of(cls, link: Link) -> LinkRate:
        return cls(link.effective_bytes_per_s, link.latency_s)


def ring_all_reduce_time(m: ArrayLike, n: ArrayLike, link: LinkRate) -> FloatArray:
    """Ring all-reduce: 2(n−1)·α + 2(n−1)/n · M/W (Thakur et al. 2005, Eq. for ring AR)."""
    n_ = np.asarray(n, dtype=np.float64)
    steps = np.maximum(n_ - 1.0, 0.0)
    return np.asarray(
        2.0 * steps * link.latency_s
        + 2.0 * steps / np.maximum(n_, 1.0) * np.asarray(m) / link.bytes_per_s,
        dtype=np.float64,
    )


def ring_all_gather_time(m: ArrayLike, n: ArrayLike, link: LinkRate) -> FloatArray:
    """Ring all-gather (= reduce-scatter): (n−1)·α + (n−1)/n · M/W (Thakur et al. 2005)."""
    n_ = np.asarray(n, dtype=np.float64)
    steps = np.maximum(n_ - 1.0, 0.0)
    return np.asarray(
        steps * link.latency_s + steps / np.maximum(n_, 1.0) * np.asarray(m) / link.bytes_per_s,
        dtype=np.float64,
    )


ring_reduce_scatter_time = ring_all_gather_time


def p2p_time(m: ArrayLike, link: LinkRate) -> FloatArray:
    """Point-to-point send of M bytes: α + M/W."""
    return np.asarray(link.latency_s + np.asarray(m) / link.bytes_per_s, dtype=np.float64)


def domain_members(n: ArrayLike, stride: ArrayLike, nvlink_domain: int) -> FloatArray:
    """Group members that share one NVLink domain: min(n, max(1, domain // stride))."""
    n_ = np.asarray(n, dtype=np.float64)
    per_domain = np.maximum(np.floor(nvlink_domain / np.asarray(stride, dtype=np.float64)), 1.0)
    return np.asarray(np.minimum(n_, per_domain), dtype=np.float64)


def crosses_domain(n: ArrayLike, stride: ArrayLike, cluster: Cluster) -> NDArray[np.bool_]:
    """True where a group of n ranks at this stride spans more than one NVLink domain."""
    g = domain_members(n, stride, cluster.nvlink_domain)
    return np.asarray(np.asarray(n, dtype=np.float64) > g)


def all_reduce_time(m: ArrayLike, n: ArrayLike, stride: ArrayLike, cluster: Cluster) -> FloatArray:
    """Hierarchical all-reduce: RS_intra(M, g) + AR_inter(M/g, n/g) + AG_intra(M, g).

    Reduces to a plain ring over NVLink when the group fits one domain (C.4, hierarchical row).
    """
    intra, inter = LinkRate.of(cluster.intra), LinkRate.of(cluster.inter)
    g = domain_members(n, stride, cluster.nvlink_domain)
    k = np.asarray(n, dtype=np.float64) / g
    m_ = np.asarray(m, dtype=np.float64)
    return 2.0 * ring_reduce_scatter_time(m_, g, intra) + ring_all_reduce_time(m_ / g, k, inter)


def all_gather_time(m: ArrayLike, n: ArrayLike, stride: ArrayLike, cluster: Cluster) -> FloatArray:
    """Hierarchical all-gather of an M-byte output: AG_inter(M/g, n/g) + AG_intra(M, g)."""
    intra, inter = LinkRate.of(cluster.intra), LinkRate.of(cluster.inter)
    g = domain_members(n, stride, cluster.nvlink_domain)
    k = np.asarray(n, dtype=np.float64) / g
    m_ = np.asarray(m, dtype=np.float64)
    return ring_all_gather_time(m_, g, intra) + ring_all_gather_time(m_ / g, k, inter)


reduce_scatter_time = all_gather_time


def all_to_all_time(m: ArrayLike, n: ArrayLike, stride: ArrayLike, cluster: Cluster) -> FloatArray:
    """All-to-all of an M-byte local send buffer: (n−1)·α + (n−1)/n · M/W (C.4).

    The (g−1)/n share bound for peers in the same NVLink domain and the (n−g)/n share bound for
    other domains move concurrently, so the slower of the two sets the time.
    """
    intra, inter = LinkRate.of(cluster.intra), LinkRate.of(cluster.inter)
    n_ = np.asarray(n, dtype=np.float64)
    g = domain_members(n_, stride, cluster.nvlink_domain)
    m_ = np.asarray(m, dtype=np.float64)
    t_intra = (g - 1.0) * intra.latency_s + (g - 1.0) / n_ * m_ / intra.bytes_per_s
    t_inter = (n_ - g) * inter.latency_s + (n_ - g) / n_ * m_ / inter.bytes_per_s
    return np.asarray(np.maximum(t_intra, t_inter), dtype=np.float64)


def send_recv_time(m: ArrayLike, stride: ArrayLike, cluster: Cluster) -> FloatArray:
    """Point-to-point between neighbours `stride` ranks apart (pipeline / ring-attention hop)."""
    across = np.asarray(stride, dtype=np.float64) >= cluster.nvlink_domain
    intra, inter = LinkRate.of(cluster.intra), LinkRate.of(cluster.inter)
    return np.asarray(np.where(across, p2p_time(m, inter), p2p_time(m, intra)), dtype=np.float64)
