"""Collective costs: ring all-reduce, all-gather, flat cross-domain rings, all-to-all."""

from __future__ import annotations

import pytest

from shardmeter.estimate.comm import (
    LinkRate,
    all_gather_time,
    all_reduce_time,
    all_to_all_time,
    domain_members,
    flat_ring_bandwidth_time,
    p2p_time,
    reduce_scatter_time,
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


def test_cross_domain_rings_are_one_flat_ring() -> None:
    """n = 32 at stride 1 over 8-GPU domains (W_nv = 300 GB/s, α 2 µs; W_ib = 40 GB/s, α 5 µs),
    M = 4 GB: each GPU moves 31/32·M = 3.875 GB; 1/8 of it crosses its NIC (0.484375 GB,
    12.109 ms) while 7/8 moves over NVLink (11.302 ms) at once, so the NIC's 12.109 ms sets
    the bandwidth term. All-gather: + 28 intra and 3 inter hops (71 µs). All-reduce: twice the
    bandwidth + 2·7·2 + 2·3·5 = 58 µs."""
    m = 4e9
    assert float(all_gather_time(m, 32, 1, CLUSTER)) == pytest.approx(0.012109375 + 71e-6)
    assert float(reduce_scatter_time(m, 32, 1, CLUSTER)) == pytest.approx(0.012109375 + 71e-6)
    assert float(all_reduce_time(m, 32, 1, CLUSTER)) == pytest.approx(2 * 0.012109375 + 58e-6)
    # Stride 8 (e.g. DP over TP=8 groups): every member in another domain -> flat ring on NICs.
    inter = LinkRate.of(CLUSTER.inter)
    assert float(all_reduce_time(m, 4, 8, CLUSTER)) == pytest.approx(
        float(ring_all_reduce_time(m, 4, inter))
    )
    assert float(all_gather_time(m, 4, 8, CLUSTER)) == pytest.approx(
        float(ring_all_gather_time(m, 4, inter))
    )


def test_flat_ring_bandwidth_is_the_slower_link() -> None:
    """Stride 2, n = 16: g = 4 per domain, 1/4 of 15/16·M crosses the NIC, 3/4 NVLink; with a
    1.2 TB/s NIC the NVLink share (3/4·3.75 GB / 300 GB/s = 9.375 ms) sets the time."""
    m = 4e9
    fast = CLUSTER.model_copy(
        update={"inter": CLUSTER.inter.model_copy(update={"bandwidth_gbps": 1500.0})}
    )
    assert float(flat_ring_bandwidth_time(m, 16, 2, fast)) == pytest.approx(9.375e-3)
    # On the 40 GB/s NIC: 1/4·3.75 GB / 40 GB/s = 23.4375 ms.
    assert float(flat_ring_bandwidth_time(m, 16, 2, CLUSTER)) == pytest.approx(23.4375e-3)


def test_tpu_torus_keeps_the_per_axis_rings() -> None:
    """On a torus the cross-slice all-gather stays AG_intra(M, g) + AG_inter(M/g, n/g)."""
    tpu = CLUSTER.model_copy(update={"ici_axes": 1})
    intra, inter = LinkRate.of(tpu.intra), LinkRate.of(tpu.inter)
    m = 4e9
    expected = float(ring_all_gather_time(m, 8, intra)) + float(
        ring_all_gather_time(m / 8, 4, inter)
    )
    assert float(all_gather_time(m, 32, 1, tpu)) == pytest.approx(expected)
    expected_ar = 2 * float(ring_all_gather_time(m, 8, intra)) + float(
        ring_all_reduce_time(m / 8, 4, inter)
    )
    assert float(all_reduce_time(m, 32, 1, tpu)) == pytest.approx(expected_ar)


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
