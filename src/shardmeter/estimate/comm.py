"""Collective communication costs (seconds) over a cluster's NVLink domain and NICs.

Ring collectives follow Thakur et al. 2005 / Patarasuk & Mueller 2009 (alpha-beta model). A
group larger than what fits in one NVLink domain runs hierarchically: the intra-domain part over
the fast fabric, the cross-domain part over the per-GPU NIC (rail-optimised). On a TPU torus
(`Cluster.ici_axes`) a group gets the ICI links of the torus axes it spans (the scaling book's
`W_ici` per axis, Austin et al. 2025, "How to Scale Your Model", sharding.md). `M` is always the
full buffer in bytes (all-reduce buffer, all-gather output, reduce-scatter input); `n` the group
size; `stride` the rank distance between group members (inner parallel degrees).
All functions take floats or broadcastable numpy arrays.
"""

from __future__ import annotations

import functools
import math
from dataclasses import dataclass

from shardmeter.estimate._xp import Num, as_float, log, maximum, minimum, where
from shardmeter.estimate._xp import floor as _floor
from shardmeter.specs.hardware import Cluster, Link


@dataclass(frozen=True)
class LinkRate:
    """Achieved bytes/s per GPU per direction and per-hop latency (s) of one link."""

    bytes_per_s: float
    latency_s: float

    @classmethod
    def of(cls, link: Link) -> LinkRate:
        return _rate_of(link)


@functools.lru_cache(maxsize=256)
def _rate_of(link: Link) -> LinkRate:
    """LinkRate of a (frozen, hashable) Link, computed once per link."""
    return LinkRate(link.effective_bytes_per_s, link.latency_s)


def torus_shape(chips: int, axes: int) -> tuple[int, ...]:
    """A TPU slice of `chips` chips on an `axes`-dimensional torus, as cubic as powers of two
    allow, first axis fastest (v5p: 64 -> 4x4x4, 128 -> 4x4x8; v5e: 256 -> 16x16)."""
    bits = max(int(math.log2(max(chips, 1))), 0)
    return tuple(2 ** (bits // axes + (i >= axes - bits % axes)) for i in range(axes))


def axes_spanned(n: Num, stride: Num, shape: tuple[int, ...]) -> Num:
    """Torus axes a group of n ranks at `stride` covers (ranks laid out first axis fastest):
    the axes whose index bits overlap the group's bits [log2 stride, log2 stride·n)."""
    lo = log(maximum(as_float(stride), 1.0)) / math.log(2.0)
    hi = lo + log(maximum(as_float(n), 1.0)) / math.log(2.0)
    count: Num = 0.0
    start = 0.0
    for side in shape:
        end = start + math.log2(side)
        count = count + where(minimum(hi, end) - maximum(lo, start) > 1e-9, 1.0, 0.0)
        start = end
    return count


def intra_rate(n: Num, stride: Num, cluster: Cluster) -> LinkRate:
    """The fast fabric as this group sees it: the whole NVLink/xGMI bandwidth per GPU, or on
    a torus the share of the ICI axes the group spans (a bidirectional ring per axis)."""
    intra = LinkRate.of(cluster.intra)
    if cluster.ici_axes is None:
        return intra
    shape = torus_shape(cluster.nvlink_domain, cluster.ici_axes)
    share = maximum(axes_spanned(n, stride, shape), 1.0) / cluster.ici_axes
    return LinkRate(intra.bytes_per_s * share, intra.latency_s)


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
    inter = LinkRate.of(cluster.inter)
    g = domain_members(n, stride, cluster.nvlink_domain)
    intra = intra_rate(g, stride, cluster)
    return 2.0 * ring_reduce_scatter_time(m, g, intra) + ring_all_reduce_time(m / g, n / g, inter)


def all_gather_time(m: Num, n: Num, stride: Num, cluster: Cluster) -> Num:
    """All-gather of an M-byte output: hierarchical bandwidth, AG_inter(M/g, n/g) +
    AG_intra(M, g) (rail-optimised rings). On GPUs NCCL runs all-gather and reduce-scatter
    only as one flat ring, so its latency is n − 1 hops, (n − n/g) of them inside a domain
    and n/g − 1 across (NCCL src/graph/tuning.cc, ring nsteps/nInterSteps); a TPU torus
    keeps the per-axis form."""
    inter = LinkRate.of(cluster.inter)
    g = domain_members(n, stride, cluster.nvlink_domain)
    intra = intra_rate(g, stride, cluster)
    hierarchical = ring_all_gather_time(m, g, intra) + ring_all_gather_time(m / g, n / g, inter)
    if cluster.ici_axes is not None:
        return hierarchical
    return hierarchical + (g - 1.0) * (n / g - 1.0) * intra.latency_s


reduce_scatter_time = all_gather_time


def all_to_all_time(m: Num, n: Num, stride: Num, cluster: Cluster) -> Num:
    """All-to-all of an M-byte local send buffer: (n−1)·α + (n−1)/n · M/W (C.4).

    The (g−1)/n share bound for peers in the same NVLink domain and the (n−g)/n share bound for
    other domains move concurrently, so the slower of the two sets the time.
    """
    g = domain_members(n, stride, cluster.nvlink_domain)
    return split_exchange_time((g - 1.0) / n * m, (n - g) / n * m, n, stride, cluster)


def split_exchange_time(m_intra: Num, m_inter: Num, n: Num, stride: Num, cluster: Cluster) -> Num:
    """An exchange among n ranks that sends `m_intra` bytes to peers in its NVLink domain and
    `m_inter` bytes over the NIC at once: the slower link sets the time, each paying one
    latency per peer it addresses (g−1 in the domain, n−g outside)."""
    inter = LinkRate.of(cluster.inter)
    g = domain_members(n, stride, cluster.nvlink_domain)
    intra = intra_rate(g, stride, cluster)
    t_intra = (g - 1.0) * intra.latency_s + m_intra / intra.bytes_per_s
    t_inter = (n - g) * inter.latency_s + m_inter / inter.bytes_per_s
    return maximum(t_intra, t_inter)


def sync_time(n: Num, cluster: Cluster) -> Num:
    """A latency-bound all-reduce of a few bytes over n ranks (loss, gradient norm): a tree,
    2·log2(g)·α over the fast fabric plus 2·log2(n/g)·α over the NIC (NCCL tree, Sanders et al.
    2009)."""
    g = domain_members(n, 1.0, cluster.nvlink_domain)
    log2 = 1.0 / math.log(2.0)
    inside = 2.0 * log(maximum(g, 1.0)) * log2 * cluster.intra.latency_s
    across = 2.0 * log(maximum(n / g, 1.0)) * log2 * cluster.inter.latency_s
    return inside + across


def dcn_ring_steps(n: Num, stride: Num, cluster: Cluster) -> Num:
    """Ring steps that cross the data-center network in an all-reduce over n ranks at `stride`
    on a TPU multislice: the ring over the n/g slices the group spans takes 2(n/g − 1) steps
    (Thakur et al. 2005), each a send to and a receive from another slice. 0 inside one slice
    and on GPUs, whose collectives move NIC data without stopping the kernel (NCCL's proxy
    thread). Steps, dimensionless."""
    if cluster.ici_axes is None:
        return 0.0
    g = domain_members(n, stride, cluster.nvlink_domain)
    return 2.0 * maximum(n / g - 1.0, 0.0)


def ring_hop_time(m: Num, n: Num, stride: Num, cluster: Cluster) -> Num:
    """One step of a ring of n ranks at `stride` (ring attention): α + M/W over the NIC when
    the ring spans NVLink domains (its slowest hop sets the pace), else over NVLink."""
    inter = LinkRate.of(cluster.inter)
    intra = intra_rate(n, stride, cluster)
    return where(crosses_domain(n, stride, cluster), p2p_time(m, inter), p2p_time(m, intra))


def send_recv_time(m: Num, stride: Num, cluster: Cluster) -> Num:
    """Point-to-point between neighbours `stride` ranks apart (pipeline / ring-attention hop)."""
    across = stride >= cluster.nvlink_domain
    intra, inter = LinkRate.of(cluster.intra), LinkRate.of(cluster.inter)
    return where(across, p2p_time(m, inter), p2p_time(m, intra))
