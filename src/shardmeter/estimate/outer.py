"""Outer synchronisation across islands: WAN collectives and the four outer modes.

Pure numpy formulas. Every function broadcasts: the island axis is the LAST axis of per-island
arrays (inner step times, outer-optimizer times), and any leading axes (plans, H values,
bandwidth scales, bit widths) broadcast together, so a planner can evaluate a million
configurations in one call. Units: seconds, bytes, bytes/s; `rtt_s` is the round-trip time that
one synchronous message round over the WAN costs (design doc C.4: α_WAN ≈ RTT per round).
"""

from __future__ import annotations

import itertools
from dataclasses import dataclass
from typing import Literal

import numpy as np
from numpy.typing import ArrayLike, NDArray

FloatArray = NDArray[np.float64]

Mode = Literal["sync", "diloco", "streaming", "async"]
Reduce = Literal["ring", "hub"]
MODES: tuple[str, ...] = ("sync", "diloco", "streaming", "async")

# Bytes an outer Nesterov step touches per parameter: read+write fp32 params and momentum,
# read the fp32 pseudo-gradient (DiLoCo, Douillard et al. 2023, Alg. 1; 5 × 4 bytes).
OUTER_OPT_BYTES_PER_PARAM = 20.0


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


@dataclass(frozen=True)
class OuterRound:
    """One outer round (H inner steps; one step for sync DP), per island (last axis).

    Times are seconds per round; an island's round = busy + straggler + wan_exposed + outer_opt.
    """

    round_s: FloatArray  # wall time of island i's round
    busy_s: FloatArray  # time in inner steps (H · T_inner,i)
    straggler_s: FloatArray  # waiting for slower islands
    wan_exposed_s: FloatArray  # blocked on the WAN
    outer_opt_s: FloatArray  # exposed outer-optimizer step
    inner_steps: FloatArray  # inner steps of island i per round (1 for sync DP)
    wan_comm_s: FloatArray  # duration of the WAN exchange per round (hidden or not)
    wan_bytes: FloatArray  # WAN bytes attributed to island i per round (see wan_bytes_per_round)
    staleness: FloatArray  # expected outer updates by others between island i's pull and push
    hide_Bps: FloatArray  # path bandwidth at which the exchange fits its overlap window (inf: none)

    @property
    def utilization(self) -> FloatArray:
        """Compute utilization: time in inner steps over wall time (INTELLECT-1's definition)."""
        return self.busy_s / self.round_s

    def tokens_per_s(self, tokens_per_step: ArrayLike) -> FloatArray:
        """Island i's tokens/s: H_i · tokens per inner step / round (island axis last)."""
        return self.inner_steps * np.asarray(tokens_per_step, dtype=np.float64) / self.round_s


def _wan_collective_s(
    nbytes: FloatArray, wan: WanPaths, reduce: Reduce, scale: FloatArray
) -> tuple[FloatArray, FloatArray]:
    """All-reduce of `nbytes` across all islands over the WAN, plus host copies. Returns
    (seconds, bytes attributed per island (..., I))."""
    n = wan.n
    host = 2.0 * nbytes / wan.host_copy_Bps  # D2H + H2D around a CPU (Gloo) collective, C.4
    if n < 2:
        zero = np.zeros((*np.shape(nbytes), n))
        return np.zeros_like(nbytes), zero
    if reduce == "ring":
        bw, rtt, _ = wan.ring_bottleneck()
        t = ring_allreduce_s(nbytes, n, bw * scale, rtt) + host
        sent = np.broadcast_to(ring_sent_bytes(nbytes, n)[..., None], (*np.shape(t), n))
        return t, sent
    c = wan.center
    spoke_bw = wan.bandwidth_Bps[:, c] * np.asarray(scale)[..., None]
    t = hub_allreduce_s(nbytes, spoke_bw, wan.rtt_s[:, c], wan.server_Bps * scale) + host
    mask = np.arange(n) != c
    moved = np.where(mask, 2.0 * np.asarray(nbytes)[..., None], 0.0)  # up + down per spoke
    return t, moved


def egress_usd_per_byte(wan: WanPaths, mode: Mode, reduce: Reduce) -> FloatArray:
    """Price of island i's attributed WAN bytes: its ring edge, or its path to the centre."""
    if wan.n < 2:
        return np.zeros(wan.n)
    if mode != "async" and reduce == "ring":
        return wan.egress_usd_per_byte[np.arange(wan.n), wan.ring_successor]
    return wan.egress_usd_per_byte[:, wan.center]


def island_steps(h: FloatArray, inner: FloatArray, balance: bool) -> FloatArray:
    """Inner steps per island per round, (..., I): H everywhere, or with `balance` as many as
    fit in the slowest island's H steps, H_i = ⌊H·max_j T_j / T_i⌋ (per-island H_i for
    heterogeneous islands, design doc C.9)."""
    hh = np.broadcast_to(h[..., None], inner.shape)
    if not balance:
        return hh
    t_max = inner.max(axis=-1, keepdims=True)
    return np.maximum(1.0, np.floor(hh * t_max / inner * (1 + 1e-12)))


def _local_sgd_round(
    compute: FloatArray,
    exposed: FloatArray,
    opt: FloatArray,
    steps: FloatArray,
    inner: FloatArray,
    *,
    wan_comm_s: FloatArray,
    wan_bytes: FloatArray,
    staleness: FloatArray,
    hide_Bps: FloatArray,
) -> OuterRound:
    """A DiLoCo/Streaming round: H·max_i T_i of local steps, the exposed WAN time, then the
    slowest island's outer-optimizer step; island i is busy H_i·T_i of it (design doc C.9)."""
    opt_max = opt.max(axis=-1, keepdims=True)
    busy = steps * inner
    return OuterRound(
        round_s=compute + exposed + opt_max,
        busy_s=busy,
        straggler_s=compute - busy + (opt_max - opt),
        wan_exposed_s=exposed,
        outer_opt_s=opt,
        inner_steps=steps,
        wan_comm_s=wan_comm_s,
        wan_bytes=wan_bytes,
        staleness=staleness,
        hide_Bps=hide_Bps,
    )


def outer_round(
    mode: Mode,
    inner_s: ArrayLike,
    wan: WanPaths,
    n_params: float,
    *,
    inner_steps: ArrayLike = 1,
    bits: ArrayLike = 16,
    grad_bits: ArrayLike = 16,
    outer_opt_s: ArrayLike = 0.0,
    reduce: Reduce = "ring",
    overlap: bool = False,
    fragments: ArrayLike = 1,
    overlap_steps: ArrayLike = 0,
    bandwidth_scale: ArrayLike = 1.0,
    balance: bool = False,
) -> OuterRound:
    """Compose per-island inner step times into one outer round of `mode`.

    inner_s: (..., I) inner step seconds per island; outer_opt_s: (..., I) seconds of a full
    outer-optimizer step on island i; the scalars/arrays H (`inner_steps`), `bits`,
    `fragments`, `overlap_steps` (τ) and `bandwidth_scale` broadcast over the leading axes.
    `balance` (diloco, streaming) lets faster islands run more inner steps per round
    (`island_steps`), so they do not idle while the slowest finishes its H.

    - sync: synchronous DP across islands (HSDP over the WAN). Per step the slowest island sets
      the pace, then the gradient shard crosses the WAN (hierarchical: reduce-scatter inside the
      island is part of the inner step; the WAN all-reduce of the shard moves the full gradient
      per island): T = max_i T_i + AR(N·grad_bits/8) (design doc C.4 hierarchical all-reduce).
    - diloco: T = H·max_i T_i + AR(N·q/8) + T_outer_opt; with `overlap` (eager / delayed outer
      step, Kale et al. 2025) the exchange hides behind the next H steps:
      T = H·max_i T_i + max(0, AR − H·max_i T_i) + T_outer_opt (design doc C.9).
    - streaming: P fragments of N/P, each synced once per round and hidden behind τ inner
      steps: T = H·max_i T_i + P·max(0, AR(N·q/(8P)) − τ·max_i T_i) + T_outer_opt
      (Douillard et al. 2025, arXiv 2501.18512; design doc C.9).
    - async: parameter server at `wan.center`; islands never wait: island i's round is
      max(H·T_i, RTT_i + N·q/(8·W_i)) (one delta up and one model down per round, full duplex,
      overlapped with the next round), then all remote rounds stretch by the server's overload
      Σ_i (N·q/8)/T_i,round / W_server when above 1 (design doc C.9).
    """
    inner = np.asarray(inner_s, dtype=np.float64)
    n = inner.shape[-1]
    lead = inner.shape[:-1]
    scale = np.asarray(bandwidth_scale, dtype=np.float64)
    h = np.asarray(inner_steps, dtype=np.float64)
    q = np.asarray(bits, dtype=np.float64)
    opt = np.broadcast_to(np.asarray(outer_opt_s, dtype=np.float64), inner.shape)
    shape = np.broadcast_shapes(
        lead,
        np.shape(scale),
        np.shape(h),
        np.shape(q),
        np.shape(grad_bits),
        np.shape(fragments),
        np.shape(overlap_steps),
    )
    inner = np.broadcast_to(inner, (*shape, n))
    opt = np.broadcast_to(opt, (*shape, n))
    h = np.broadcast_to(h, shape)
    q = np.broadcast_to(q, shape)
    scale = np.broadcast_to(scale, shape)
    zeros = np.zeros((*shape, n))
    t_max = inner.max(axis=-1, keepdims=True)

    if mode == "sync":
        nbytes = np.broadcast_to(n_params * np.asarray(grad_bits, dtype=np.float64) / 8.0, shape)
        comm, moved = _wan_collective_s(nbytes, wan, reduce, scale)
        comm_i = np.broadcast_to(comm[..., None], (*shape, n))
        round_s = t_max + comm_i
        return OuterRound(
            round_s=round_s,
            busy_s=inner,
            straggler_s=t_max - inner,
            wan_exposed_s=comm_i,
            outer_opt_s=zeros,
            inner_steps=np.ones((*shape, n)),
            wan_comm_s=comm_i,
            wan_bytes=np.broadcast_to(moved, (*shape, n)),
            staleness=zeros,
            hide_Bps=np.full((*shape, n), np.inf),
        )

    nbytes = n_params * q / 8.0
    compute = h[..., None] * t_max  # H·max_i T_i: the local steps of diloco and streaming
    if mode == "diloco":
        comm, moved = _wan_collective_s(nbytes, wan, reduce, scale)
        comm_i = np.broadcast_to(comm[..., None], (*shape, n))
        exposed = np.maximum(0.0, comm_i - compute) if overlap else comm_i
        per_direction = moved if reduce == "ring" else moved / 2.0
        hide = per_direction / compute if overlap else np.full((*shape, n), np.inf)
        return _local_sgd_round(
            compute,
            exposed,
            opt,
            island_steps(h, inner, balance),
            inner,
            wan_comm_s=comm_i,
            wan_bytes=np.broadcast_to(moved, (*shape, n)),
            staleness=np.full((*shape, n), 1.0 if overlap else 0.0),
            hide_Bps=np.broadcast_to(hide, (*shape, n)),
        )

    if mode == "streaming":
        p = np.broadcast_to(np.asarray(fragments, dtype=np.float64), shape)
        tau = np.broadcast_to(np.asarray(overlap_steps, dtype=np.float64), shape)
        frag_comm, frag_moved = _wan_collective_s(nbytes / p, wan, reduce, scale)
        frag_comm_i = np.broadcast_to(frag_comm[..., None], (*shape, n))
        window = tau[..., None] * t_max
        exposed = p[..., None] * np.maximum(0.0, frag_comm_i - window)
        frag_dir = frag_moved if reduce == "ring" else frag_moved / 2.0
        with np.errstate(divide="ignore", invalid="ignore"):
            hide = np.where(window > 0, frag_dir / window, np.inf)
        return _local_sgd_round(
            compute,
            exposed,
            opt,
            island_steps(h, inner, balance),
            inner,
            wan_comm_s=p[..., None] * frag_comm_i,
            wan_bytes=p[..., None] * frag_moved,
            staleness=np.broadcast_to(tau[..., None] / h[..., None], (*shape, n)),
            hide_Bps=hide,
        )

    if mode == "async":
        c = wan.center
        remote = np.arange(n) != c
        path_bw = wan.bandwidth_Bps[:, c] * scale[..., None]
        path_rtt = wan.rtt_s[:, c]
        m = nbytes[..., None]
        host = 2.0 * m / wan.host_copy_Bps
        exchange = np.where(remote, path_rtt + m / path_bw + host, 0.0)
        busy = h[..., None] * inner
        round_s = np.maximum(busy, exchange)
        demand = np.where(remote, m / round_s, 0.0).sum(axis=-1, keepdims=True)
        overload = np.maximum(1.0, demand / (wan.server_Bps * scale[..., None]))
        round_s = np.where(remote, round_s * overload, round_s)
        rate = 1.0 / round_s
        staleness = round_s * (rate.sum(axis=-1, keepdims=True) - rate)
        return OuterRound(
            round_s=round_s,
            busy_s=busy,
            straggler_s=zeros,
            wan_exposed_s=round_s - busy,
            outer_opt_s=zeros,
            inner_steps=np.broadcast_to(h[..., None], (*shape, n)),
            wan_comm_s=exchange,
            wan_bytes=np.where(remote, 2.0 * m, 0.0),
            staleness=staleness,
            hide_Bps=np.where(remote, m / busy, np.inf),
        )
    raise ValueError(f"unknown mode {mode!r}")


def outer_opt_seconds(
    n_params: ArrayLike, n_gpus: ArrayLike, hbm_Bps: ArrayLike, fraction: ArrayLike = 1.0
) -> FloatArray:
    """Outer optimizer step on an island, memory bound: 20 bytes/param over the island's HBM
    (fp32 Nesterov, sharded across its GPUs; Calculon-style optimizer roofline, design doc C.2)."""
    return (
        OUTER_OPT_BYTES_PER_PARAM
        * np.asarray(n_params, dtype=np.float64)
        * np.asarray(fraction)
        / (np.asarray(n_gpus, dtype=np.float64) * np.asarray(hbm_Bps, dtype=np.float64))
    )
