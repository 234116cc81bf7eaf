"""Collective costs: ring all-reduce, all-gather, hierarchical composition, all-to-all."""

from __future__ import annotations

import pytest

from shardmeter.estimate.comm import (
    LinkRate,
    all_gather_time,
    all_reduce_time,
    all_to_all_time,
    domain_members,
    p2p_time,
    ring_all_gather_time,
    ring_all_reduce_time,
)
from shardmeter.specs.hardware import Accelerator, Cluster, Link

LINK = LinkRate(bytes_per_s=100e9, latency_s=5e-6)
CLUSTER = Cluster(
    accelerator=Accelerator(name="g", peak_tflops={"bf16": 100.0}, hbm_gb=80, hbm_gbps=2000),
    gpus_per_node=8,
    nvlink_domain=8,
    intra=Link(name="nvlink", bandwidth_gbps=400, latency_us=2, efficiency=0.75),
    inter=Link(name="ib", bandwidth_gbps=50, latency_us=5, efficiency=0.8),
)


def test_ring_all_reduce_time() -> None:
    """2(n−1)·α + 2(n−1)/n·M/W for M = 1 GB, n = 8, W = 100 GB/s, α = 5 µs."""
    assert float(ring_all_reduce_time(1e9, 8, LINK)) == pytest.approx(14 * 5e-6 + 0.0175)
    assert float(ring_all_reduce_time(1e9, 1, LINK)) == 0.0


def test_ring_all_gather_and_p2p() -> None:
    assert float(ring_all_gather_time(1e9, 4, LINK)) == pytest.approx(3 * 5e-6 + 0.75e9 / 100e9)
    assert float(p2p_time(1e8, LINK)) == pytest.approx(5e-6 + 1e-3)


def test_group_inside_nvlink_domain_uses_intra_only() -> None:
    intra = LinkRate.of(CLUSTER.intra)
    assert float(all_reduce_time(1e9, 8, 1, CLUSTER)) == pytest.approx(
        float(ring_all_reduce_time(1e9, 8, intra))
    )


def test_hierarchical_all_reduce() -> None:
    """n = 32 at stride 1 over 8-GPU domains: RS_intra(M,8) + AR_inter(M/8, 4) + AG_intra(M,8)."""
    intra, inter = LinkRate.of(CLUSTER.intra), LinkRate.of(CLUSTER.inter)
    m = 4e9
    expected = 2 * float(ring_all_gather_time(m, 8, intra)) + float(
        ring_all_reduce_time(m / 8, 4, inter)
    )
    assert float(all_reduce_time(m, 32, 1, CLUSTER)) == pytest.approx(expected)
    # Stride 8 (e.g. DP over TP=8 groups): every member in another domain -> flat ring on NICs.
    assert float(all_reduce_time(m, 4, 8, CLUSTER)) == pytest.approx(
        float(ring_all_reduce_time(m, 4, inter))
    )
    # All-gather: hierarchical bytes, but NCCL's one flat ring pays n − 1 hop latencies:
    # 7 + 3 in the hierarchical rings, and the other 7·3 intra-domain hops of the 4 domains.
    expected_ag = (
        float(ring_all_gather_time(m / 8, 4, inter))
        + float(ring_all_gather_time(m, 8, intra))
        + 7 * 3 * intra.latency_s
    )
    assert float(all_gather_time(m, 32, 1, CLUSTER)) == pytest.approx(expected_ag)


def test_domain_members() -> None:
    assert float(domain_members(64, 1, 8)) == 8
    assert float(domain_members(64, 2, 8)) == 4
    assert float(domain_members(64, 16, 8)) == 1
    assert float(domain_members(4, 1, 72)) == 4


def test_all_to_all_slower_across_nodes() -> None:
    inside = float(all_to_all_time(1e9, 8, 1, CLUSTER))
    across = float(all_to_all_time(1e9, 16, 1, CLUSTER))
    intra = LinkRate.of(CLUSTER.intra)
    assert inside == pytest.approx(7 * intra.latency_s + 7 / 8 * 1e9 / intra.bytes_per_s)
    assert across > inside
