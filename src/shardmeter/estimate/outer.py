"""Outer synchronisation across islands: the four outer modes composed from inner steps, the
WAN collective of the payload, and the schedule that decides how much of it hides (C.9).

Pure numpy formulas. Every function broadcasts: the island axis is the LAST axis of per-island
arrays (inner step times, backward windows, outer-optimizer times), and any leading axes (plans,
H values, bandwidth scales, payload bits, fragment counts) broadcast together, so a planner can
evaluate a million configurations in one call. Units: seconds, bytes, bytes/s, USD.
"""

from __future__ import annotations

import itertools
from dataclasses import dataclass
from typing import Literal

import numpy as np
from numpy.typing import ArrayLike, NDArray

from shardmeter.estimate.convoy import SLOT_POLL_S, ConvoyWorkers, turn_convoy
from shardmeter.estimate.payload import DISPATCH_BITS
from shardmeter.estimate.schedule import Schedule, even_schedule, round_stall_s
from shardmeter.estimate.wan import (
    WanPaths,
    heloco_legs_s,
    heloco_legs_windows,
    hub_allreduce_s,
    hub_push_queue_s,
)

FloatArray = NDArray[np.float64]

Mode = Literal["sync", "diloco", "streaming", "async"]
Reduce = Literal["ring", "hub", "bucket"]
# The async mode's exchange (see outer_round): "duplex" (one delta up and one model down at
# once, hidden behind the next round), HeLoCo's runtime "blocking" (between rounds),
# "overlapped" (behind the next round) or "streaming" (P fragment exchanges, each behind the
# next H/P steps); "heloco" prices the same as "overlapped".
Exchange = Literal["duplex", "blocking", "overlapped", "streaming", "heloco"]
EXCHANGES: tuple[str, ...] = ("duplex", "blocking", "overlapped", "streaming")
MODES: tuple[str, ...] = ("sync", "diloco", "streaming", "async")

# Bytes an outer Nesterov step touches per parameter: read+write fp32 params and momentum,
# read the fp32 pseudo-gradient (DiLoCo, Douillard et al. 2023, Alg. 1; 5 × 4 bytes).
OUTER_OPT_BYTES_PER_PARAM = 20.0


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
    wan_bytes: FloatArray  # WAN bytes attributed to island i per round
    egress_usd: FloatArray  # egress charged for island i's bytes per round
    staleness: FloatArray  # expected outer updates by others between island i's pull and push

    @property
    def utilization(self) -> FloatArray:
        """Compute utilization: time in inner steps over wall time (INTELLECT-1's definition)."""
        return self.busy_s / self.round_s

    @property
    def wan_hidden_s(self) -> FloatArray:
        """WAN exchange time that ran under compute (exchange minus its exposed part); a
        rounding residue of the subtraction (below 1e-9 of the exchange) is zero."""
        hidden = self.wan_comm_s - self.wan_exposed_s
        return np.where(hidden > 1e-9 * self.wan_comm_s, hidden, 0.0)

    def tokens_per_s(self, tokens_per_step: ArrayLike) -> FloatArray:
        """Island i's tokens/s: H_i · tokens per inner step / round (island axis last)."""
        return self.inner_steps * np.asarray(tokens_per_step, dtype=np.float64) / self.round_s


@dataclass(frozen=True)
class Collective:
    """The exchange of one payload across all islands: a fixed (latency) part paid by every
    fragment, a transfer part split among fragments, bytes and egress per island."""

    fixed_s: FloatArray  # (...)
    transfer_s: FloatArray  # (...)
    bytes: FloatArray  # (..., I) bytes attributed to each island
    egress_usd: FloatArray  # (..., I) USD for them


def collective(
    nbytes: FloatArray,
    wan: WanPaths,
    reduce: Reduce,
    *,
    gathered: bool = False,
    rounds: int = 1,
    scale: ArrayLike = 1.0,
) -> Collective:
    """All-reduce (summable payloads) or all-gather (sparse, sign) of `nbytes` per island.

    ring all-reduce: 2(I−1)·α + 2(I−1)/I · M/W; ring all-gather: (I−1)·α + (I−1)·M/W
    (Patarasuk & Mueller 2009; design doc C.4), paced by the slowest edge and largest RTT;
    α = RTT/2, the one-way latency one step waits for its chunk (Hockney's α; Thakur,
    Rabenseifner & Gropp 2005), not a round trip.
    hub: reduce (or gather) at the hub, then broadcast: two collectives, each paying one
    one-way latency and its own transfer, paced by the slowest spoke or the hub's aggregate
    link. bucket: every island uploads M once and downloads the others'
    (I−1)·M from object storage, 2 requests of RTT (C.4), capped by the bucket's aggregate
    throughput. `rounds` sequential collectives pay the latency again (PowerSGD's P then Q).
    Device↔host copies around a CPU (Gloo) collective add 2·M/W_host.
    """
    n = wan.n
    m = np.asarray(nbytes, dtype=np.float64)
    s = np.asarray(scale, dtype=np.float64)
    shape = np.broadcast_shapes(m.shape, s.shape)
    m, s = np.broadcast_to(m, shape), np.broadcast_to(s, shape)
    zero = np.zeros(shape)
    if n < 2:
        return Collective(zero, zero, np.zeros((*shape, n)), np.zeros((*shape, n)))
    host = 2.0 * m / wan.host_copy_Bps
    idx = np.arange(n)
    if reduce == "bucket":
        if wan.bucket is None:
            raise ValueError("reduce = 'bucket' needs WanPaths.bucket")
        b = wan.bucket
        up, down = m, (n - 1) * m
        per_path = (up + down) / (b.Bps * s)
        aggregate = n * (up + down) / (b.aggregate_Bps * s)
        moved = np.broadcast_to((up + down)[..., None], (*shape, n))
        return Collective(
            fixed_s=np.full(shape, 2.0 * b.rtt_s * rounds),
            transfer_s=np.maximum(per_path, aggregate) + host,
            bytes=moved,
            egress_usd=np.broadcast_to((down * b.usd_per_byte)[..., None], (*shape, n)),
        )
    if reduce == "ring":
        bw, rtt, _ = wan.ring_bottleneck()
        hops = (n - 1.0) if gathered else 2.0 * (n - 1.0)
        sent = (n - 1.0) * m if gathered else 2.0 * (n - 1.0) / n * m
        price = wan.egress_usd_per_byte[idx, wan.ring_successor]
        moved = np.broadcast_to(sent[..., None], (*shape, n))
        return Collective(
            fixed_s=np.full(shape, hops * rtt / 2.0 * rounds),  # one-way latency per step
            transfer_s=sent / (bw * s) + host,
            bytes=moved,
            egress_usd=moved * price,
        )
    c = wan.center
    spoke_bw = wan.bandwidth_Bps[:, c] * s[..., None]
    remote = idx != c
    down = (n - 1.0) * m if gathered else m  # a gather sends everyone the others' payloads
    t_up = hub_allreduce_s(m, spoke_bw, 0.0, wan.server_Bps * s) / 2.0
    t_down = hub_allreduce_s(down, spoke_bw, 0.0, wan.server_Bps * s) / 2.0
    moved = np.where(remote, (m + down)[..., None], 0.0)
    rtt = float(np.max(np.where(remote, wan.rtt_s[:, c], 0.0)))
    return Collective(
        fixed_s=np.full(shape, 2.0 * (rtt / 2.0) * rounds),  # reduce, then broadcast: L each
        transfer_s=t_up + t_down + host,
        bytes=moved,
        egress_usd=moved * wan.egress_usd_per_byte[:, c],
    )


def island_steps(h: FloatArray, inner: FloatArray, balance: bool) -> FloatArray:
    """Inner steps per island per round, (..., I): H everywhere, or with `balance` as many as
    fit in the slowest island's H steps, H_i = ⌊H·max_j T_j / T_i⌋ (per-island H_i for
    heterogeneous islands, design doc C.9)."""
    hh = np.broadcast_to(h[..., None], inner.shape)
    if not balance:
        return hh
    t_max = inner.max(axis=-1, keepdims=True)
    return np.maximum(1.0, np.floor(hh * t_max / inner * (1 + 1e-12)))


def _pacing(values: FloatArray, inner: FloatArray) -> FloatArray:
    """The value (..., I) -> (...) of the slowest island, whose step sets the lockstep pace."""
    slowest = np.argmax(inner, axis=-1)[..., None]
    return np.take_along_axis(np.broadcast_to(values, inner.shape), slowest, axis=-1)[..., 0]


def outer_round(
    mode: Mode,
    inner_s: ArrayLike,
    wan: WanPaths,
    n_params: float,
    *,
    inner_steps: ArrayLike = 1,
    bits: ArrayLike = 16,
    gathered: bool = False,
    collective_rounds: int = 1,
    outer_opt_s: ArrayLike = 0.0,
    reduce: Reduce = "ring",
    overlap: bool = False,
    fragments: ArrayLike = 1,
    schedule: Schedule | None = None,
    overlap_steps: ArrayLike = 0,
    backward_s: ArrayLike = 0.0,
    buckets: ArrayLike = 1,
    bandwidth_scale: ArrayLike = 1.0,
    balance: bool = False,
    exchange: Exchange = "duplex",
    push_overhead_bytes: ArrayLike = 0.0,
    pull_bytes: ArrayLike | None = None,
    link_slots: bool = False,
    turn_schedule: bool = True,
) -> OuterRound:
    """Compose per-island inner step times into one outer round of `mode`.

    inner_s, backward_s, buckets, outer_opt_s: (..., I) per island (inner step; backward window
    of its last micro-batch, 0 = no backward overlap; layers per pipeline stage; a full
    outer-optimizer step). `bits` is the payload's wire bits per parameter (gradients in sync
    DP, pseudo-gradients otherwise); `gathered` payloads are all-gathered, the others summed.
    H (`inner_steps`), `bits`, P (`fragments`, or an explicit `schedule`), τ (`overlap_steps`)
    and `bandwidth_scale` broadcast over the leading axes.

    - sync: DP across islands (HSDP over the WAN). The slowest island sets the pace; the
      gradient exchange (hierarchical: the shard crosses the WAN, C.4) starts bucket by bucket
      during the backward and what it does not hide stalls the step (`round_stall_s`, H = 1).
    - diloco: H·max_i T_i of local steps, then the pseudo-gradient exchange: blocking
      (τ = `overlap_steps`, 0 by default), or with `overlap` (eager / one-outer-step, Kale et al.
      2025) hidden behind the next round (τ = H), then the slowest outer-optimizer step.
    - streaming: P fragments synced at offsets round(k·H/P) (or `schedule`), each may take τ
      inner steps, τ = H with `overlap` (Douillard et al. 2025, arXiv 2501.18512).
    - async: parameter server at `wan.center`; islands never wait for each other. The push is
      M = N·bits/8 + `push_overhead_bytes` (HeLoCo's header and tag, `payload.push_bytes`); the
      pull is the model, `pull_bytes` (default N · 32/8: HeLoCo dispatches θ in fp32 whatever Δ
      is sent as, docs/network.md), never the compressed payload. With `exchange = "duplex"`
      island i's round is max(H·T_i, X_i), X_i = RTT_i + max(M, pull)/W_i (the delta up and the
      model down at once, hidden behind the next round). HeLoCo's runtime sends the push, then
      the pull, each a request and its reply, each from the congestion window its connection
      kept over the idle since its previous round (Linux halves it per RTO of idle, RFC 2861:
      back to the initial window after a blocking round's compute, largely kept when an
      overlapped exchange keeps the link nearly busy; X_i = `heloco_exchange_s` with the
      round's compute and mode); `exchange = "blocking"` (its worker loop: pull, H steps, push, wait
      for the ack) pays it between rounds, H·T_i + X_i, and `"overlapped"` (or `"heloco"`) runs
      it behind the next round, max(H·T_i, X_i). `"streaming"` (HeLoCo's streaming exchange,
      heloco/streaming.py, after Streaming DiLoCo, Douillard et al. 2025, arXiv 2501.18512,
      Alg. 1 with τ = H/P) runs P sub-rounds of H/P steps, each hiding one fragment's
      exchange X_i^f = (RTT_i + push of M/P) + (RTT_i + pull of pull/P) (the legs as above,
      their idle from the sub-round), so island i's round of H steps is
      P · max(H·T_i/P, X_i^f) seconds and its exchange P · X_i^f. A shared server link is a processor-sharing
      station (`_share_server`); remote rounds then stretch by the server's overload, the
      busier direction's Σ_i (bytes/round_i)/W_server when above 1 (design doc C.9). With
      `link_slots` the workers take turns on it for their pushes instead (`_turn_rounds`,
      at least `_take_turns`' cycle; blocking and overlapped, where their schedule locks
      into a convoy, its rounds: `_convoy_rounds`, run unless `turn_schedule` is False).
    `balance` (diloco, streaming) lets faster islands run more inner steps per round.
    """
    inner = np.asarray(inner_s, dtype=np.float64)
    n = inner.shape[-1]
    shape = np.broadcast_shapes(
        inner.shape[:-1],
        np.shape(bandwidth_scale),
        np.shape(inner_steps),
        np.shape(bits),
        np.shape(fragments),
        np.shape(overlap_steps),
        np.shape(backward_s)[:-1],
        np.shape(buckets)[:-1],
        np.shape(outer_opt_s)[:-1],
        () if schedule is None else schedule.offsets.shape[:-1],
    )
    inner = np.broadcast_to(inner, (*shape, n))
    opt = np.broadcast_to(np.asarray(outer_opt_s, dtype=np.float64), (*shape, n))
    h = np.broadcast_to(np.asarray(inner_steps, dtype=np.float64), shape)
    scale = np.broadcast_to(np.asarray(bandwidth_scale, dtype=np.float64), shape)
    nbytes = np.broadcast_to(n_params * np.asarray(bits, dtype=np.float64) / 8.0, shape)
    zeros = np.zeros((*shape, n))
    t_max = inner.max(axis=-1)

    if mode == "async":
        if exchange not in (*EXCHANGES, "heloco"):
            raise ValueError(f"exchange {exchange!r}: one of {', '.join(EXCHANGES)}")
        up = nbytes + np.asarray(push_overhead_bytes, dtype=np.float64)
        down = np.broadcast_to(
            n_params * DISPATCH_BITS / 8.0
            if pull_bytes is None
            else np.asarray(pull_bytes, dtype=np.float64),
            shape,
        )
        p = np.broadcast_to(np.asarray(fragments, dtype=np.float64), shape)
        if exchange == "streaming" and np.any(p < 1):
            raise ValueError("fragments: the streaming exchange needs P >= 1")
        return _async_round(inner, wan, up, down, h, scale, exchange, p, link_slots, turn_schedule)

    coll = collective(nbytes, wan, reduce, gathered=gathered, rounds=collective_rounds, scale=scale)
    window = _pacing(np.asarray(backward_s, dtype=np.float64), inner)
    layers = _pacing(np.asarray(buckets, dtype=np.float64), inner)
    if mode == "sync":
        one = np.ones(shape)
        stall = round_stall_s(
            t_max, one, even_schedule(one, 1), 0.0, coll.fixed_s, coll.transfer_s, window, layers
        )
        stall_i = np.broadcast_to(stall[..., None], (*shape, n))
        return OuterRound(
            round_s=t_max[..., None] + stall_i,
            busy_s=inner,
            straggler_s=t_max[..., None] - inner,
            wan_exposed_s=stall_i,
            outer_opt_s=zeros,
            inner_steps=np.ones((*shape, n)),
            wan_comm_s=np.broadcast_to((coll.fixed_s + coll.transfer_s)[..., None], (*shape, n)),
            wan_bytes=coll.bytes,
            egress_usd=coll.egress_usd,
            staleness=zeros,
        )
    if mode not in ("diloco", "streaming"):
        raise ValueError(f"unknown mode {mode!r}")

    tau = h if overlap else np.broadcast_to(np.asarray(overlap_steps, dtype=np.float64), shape)
    if mode == "diloco":
        sched = even_schedule(h, 1)
    else:
        sched = schedule if schedule is not None else even_schedule(h, fragments)
    stall = round_stall_s(t_max, h, sched, tau, coll.fixed_s, coll.transfer_s, window, layers)
    p_real = (np.broadcast_to(sched.shares, (*shape, sched.n)) > 0).sum(axis=-1)
    comm = p_real * coll.fixed_s + coll.transfer_s
    compute = (h * t_max)[..., None]
    steps = island_steps(h, inner, balance)
    busy = steps * inner
    opt_max = opt.max(axis=-1, keepdims=True)
    stall_i = np.broadcast_to(stall[..., None], (*shape, n))
    return OuterRound(
        round_s=compute + stall_i + opt_max,
        busy_s=busy,
        straggler_s=compute - busy + (opt_max - opt),
        wan_exposed_s=stall_i,
        outer_opt_s=opt,
        inner_steps=steps,
        wan_comm_s=np.broadcast_to(comm[..., None], (*shape, n)),
        wan_bytes=coll.bytes,
        egress_usd=coll.egress_usd,
        staleness=np.broadcast_to((tau / h)[..., None], (*shape, n)),
    )


def _async_round(
    inner: FloatArray,
    wan: WanPaths,
    up_bytes: FloatArray,
    down_bytes: FloatArray,
    h: FloatArray,
    scale: FloatArray,
    exchange_pattern: Exchange = "duplex",
    fragments: FloatArray | None = None,
    link_slots: bool = False,
    turn_schedule: bool = True,
) -> OuterRound:
    """Parameter server at `wan.center` (design doc C.9, asynchronous): a push of
    `up_bytes`, a pull of `down_bytes` per round, in the exchange mode `exchange_pattern`
    (`"streaming"`: in P = `fragments` exchanges of a P-th each, one per H/P steps); a shared
    server link with `link_slots`: pushes take turns on it (`_turn_rounds`, `_take_turns`;
    blocking and overlapped, with `turn_schedule`, the convoy where the schedule locks,
    `_convoy_rounds`)."""
    n = inner.shape[-1]
    c = wan.center
    remote = np.arange(n) != c
    path_bw = wan.bandwidth_Bps[:, c] * scale[..., None]
    up, down = up_bytes[..., None], down_bytes[..., None]
    host = (up + down) / wan.host_copy_Bps
    rtt = wan.rtt_s[:, c]
    busy = h[..., None] * inner
    # blocking: pull → H steps → push and its ack, in turn; else behind the next round
    blocking = exchange_pattern == "blocking"
    legs: tuple[tuple[FloatArray, FloatArray], ...]
    # p exchanges a round, each hidden behind busy_x of compute (p = 1 but streaming)
    p = fragments[..., None] if exchange_pattern == "streaming" and fragments is not None else 1.0
    busy_x = busy / p
    if exchange_pattern == "duplex":
        both = np.maximum(up, down)
        exchange = np.where(remote, rtt + both / path_bw + host, 0.0)
        legs = ((both, both / path_bw),)
    else:
        # the push, then the pull, each its own request and reply and each from the window its
        # connection kept over the idle since its last use (heloco_legs_s); streaming: one
        # fragment's share (M/P, pull/P) behind each sub-round (Streaming DiLoCo, arXiv
        # 2501.18512)
        # each direction's queue: the worker's own host paces its uplink, and the hub's
        # dispatch queues at the worker's downlink, unless the hub's shared link is the
        # narrower one, which then paces the dispatch and queues the pushes (heloco_legs_s)
        hub_bound = path_bw >= wan.server_Bps * scale[..., None] * (1.0 - 1e-9)
        queued = (hub_bound, ~hub_bound)
        t_up, t_down = heloco_legs_s(up / p, path_bw, rtt, down / p, busy_x, blocking, queued)
        exchange = np.where(remote, 2.0 * rtt + t_up + t_down + host / p, 0.0)
        legs = ((up / p, t_up), (down / p, t_down))
    server = wan.server_Bps * scale[..., None]
    turns = link_slots and np.isfinite(wan.server_Bps) and exchange_pattern != "duplex"
    if turns:
        # each leg alone, at most the server link's rate; plus the turn's request and grant
        alone = [np.maximum(t, b / server) for b, t in legs]
        fixed = exchange - sum(t for _, t in legs)
        # a dispatch that leaves as the next worker's push is granted: that push queues at
        # the hub towards the server, where the dispatch's ACKs wait (hub_push_queue_s), so
        # its slow start doubles once per RTT + that wait (from the window it kept)
        ack_wait = hub_push_queue_s(up / p, path_bw, server)
        _, met = heloco_legs_s(
            up / p, np.minimum(path_bw, server), rtt, down / p, busy_x, blocking, queued,
            ack_delay_s=ack_wait,
        )  # fmt: skip
        met = np.maximum(met, down / p / server)
        # a push's turn holds the link from its grant (half an RTT out) to its last byte in
        # (half an RTT back), plus the mean wait for the next worker's poll to find it free;
        # dispatches take no turns: the link carries their bytes whenever one is on its way
        hold = p * (rtt + alone[0] + 0.5 * (SLOT_POLL_S + rtt))
        exchange, round_s, _, _ = _turn_rounds(
            fixed + alone[0] + rtt, alone[1], met, hold, busy, p, blocking, remote
        )
        round_s = _take_turns(round_s, (hold, down / server), remote)
        if turn_schedule and exchange_pattern != "streaming":
            # the turns' deterministic schedule: its rounds and exchanges
            _, _, window = heloco_legs_windows(
                up, np.minimum(path_bw, server), rtt, down, busy, blocking, queued
            )
            parts = (busy, rtt, rtt + alone[0], fixed - rtt, up, path_bw, down,
                     np.minimum(path_bw, server), window)  # fmt: skip
            round_s, exchange = _convoy_rounds(
                round_s, exchange, parts, server, remote, overlapped=not blocking
            )
            # a round is never shorter than its compute (the overlapped schedule's cycle share
            # of a compute-bound worker is its compute, float rounding aside)
            round_s = np.maximum(round_s, busy)
            if blocking:
                exchange = np.where(remote, round_s - busy, exchange)
    elif np.isfinite(wan.server_Bps):
        exchange = _share_server(exchange, legs, busy_x, blocking, server, remote)
    if not turns:
        round_s = busy + exchange if blocking else p * np.maximum(busy_x, exchange)
    exchange = p * exchange  # the round's exchanges, hidden or not
    # the server's link, each direction on its own (full duplex): the busier one limits
    inflow = np.where(remote, up / round_s, 0.0).sum(axis=-1, keepdims=True)
    outflow = np.where(remote, down / round_s, 0.0).sum(axis=-1, keepdims=True)
    overload = np.maximum(1.0, np.maximum(inflow, outflow) / server)
    round_s = np.where(remote, round_s * overload, round_s)
    rate = 1.0 / round_s
    moved = np.where(remote, up + down, 0.0)
    return OuterRound(
        round_s=round_s,
        busy_s=busy,
        straggler_s=np.zeros_like(inner),
        wan_exposed_s=round_s - busy,
        outer_opt_s=np.zeros_like(inner),
        inner_steps=np.broadcast_to(h[..., None], inner.shape),
        wan_comm_s=exchange,
        wan_bytes=moved,
        egress_usd=moved * wan.egress_usd_per_byte[:, c],
        staleness=round_s * (rate.sum(axis=-1, keepdims=True) - rate),
    )


TURN_BISECTIONS = 60  # bisection steps for the common cycle of the workers' turns
TURN_ITERATIONS = 60  # damped fixed-point steps of the turn station and the rounds it gives
# The hold a customer in service still has left, as a share of it, when another arrives at an
# FCFS station: (1 + cv²)/2 (Reiser 1979, IEEE Trans. Commun. 27(8)), 1/2 for a fixed hold
# (cv = 0). Dimensionless; 0 at a processor-sharing station (no residual-life term).
FIXED_HOLD_RESIDUAL = 0.5


def _turn_rounds(
    rest_s: FloatArray,
    dispatch_s: FloatArray,
    met_s: FloatArray,
    hold_s: FloatArray,
    busy: FloatArray,
    p: FloatArray | float,
    blocking: bool,
    remote: NDArray[np.bool_],
) -> tuple[FloatArray, FloatArray, FloatArray, FloatArray]:
    """(exchange, round, wait, meet) of each worker (..., N): seconds, and the probability
    that its dispatch meets the next push, when the pushes take turns on the
    server's shared link and the workers' phases drift (each round's legs vary), so a worker
    may find the link held: the turns are one first-come-first-served station of demand
    `hold_s` per round, the rest of each worker's round its think time, solved by
    `_turn_station` (damped iteration: the think time is the round less the station's time).
    A worker's exchange is `rest_s` (its push alone, the fixed part, the turn's request)
    plus its dispatch: `met_s` (its ACKs behind the next push) with the probability that
    the next worker is already waiting when this push arrives, else `dispatch_s`; plus its
    wait for the turn. Blocking: round = busy + exchange; else p·max(busy/p, exchange/p')
    with the exchange per fragment (p exchanges a round, each waiting its share)."""
    wait = np.zeros_like(hold_s)
    meet = np.zeros_like(hold_s)
    idx = np.flatnonzero(remote)
    busy_x = busy / p

    def rounds(wait: FloatArray, meet: FloatArray) -> tuple[FloatArray, FloatArray]:
        exchange = rest_s + dispatch_s + meet * (met_s - dispatch_s) + wait / p
        exchange = np.where(remote, exchange, 0.0)  # the server's own island exchanges nothing
        return exchange, busy + exchange if blocking else p * np.maximum(busy_x, exchange)

    exchange, round_s = rounds(wait, meet)
    for _ in range(TURN_ITERATIONS):
        think = np.maximum(round_s - hold_s - wait, 0.0)
        resp, busy_without = _turn_station(hold_s[..., idx], think[..., idx])
        new_wait, new_meet = np.zeros_like(wait), np.zeros_like(meet)
        new_wait[..., idx] = resp - hold_s[..., idx]
        new_meet[..., idx] = busy_without
        step = max(np.max(np.abs(new_wait - wait), initial=0.0),
                   np.max(np.abs(new_meet - meet), initial=0.0))  # fmt: skip
        wait, meet = 0.5 * (wait + new_wait), 0.5 * (meet + new_meet)
        exchange, round_s = rounds(wait, meet)
        if step <= 1e-12 * max(1.0, float(np.max(round_s, initial=0.0))):
            break
    return exchange, round_s, wait, meet


def _convoy_rounds(
    round_s: FloatArray,
    exchange_s: FloatArray,
    parts: tuple[FloatArray, ...],
    server_Bps: FloatArray,
    remote: NDArray[np.bool_],
    overlapped: bool = False,
) -> tuple[FloatArray, FloatArray]:
    """Rounds and exchanges (..., N) of pushes taking turns (blocking, or `overlapped`):
    the first-come-first-served schedule of the remote workers (`convoy.turn_convoy`, one
    configuration at a time; `parts` are `ConvoyWorkers`' fields in order, each broadcast
    to (..., N)): its rounds (each worker's share of the cycle where it locks, its mean
    round over the schedule's last half where the phases drift), and its exchanges from ask
    to dispatch in: wait + hold + the time to the dispatch + the dispatch + RTT (the
    dispatch's last byte to the worker, half an RTT; its next ask back, the other half).
    With fewer than two remote workers nobody waits: `round_s` and `exchange_s` (the
    mean-value analysis, `_turn_rounds`). Seconds."""
    idx = np.flatnonzero(remote)
    shape = np.broadcast(round_s, exchange_s, *parts).shape
    out = np.array(np.broadcast_to(round_s, shape))
    exchange = np.array(np.broadcast_to(exchange_s, shape))
    full = [np.broadcast_to(x, shape) for x in parts]
    hub = np.broadcast_to(server_Bps, (*shape[:-1], 1))
    if len(idx) < 2:
        return out, exchange
    for pos in np.ndindex(shape[:-1]):
        workers = ConvoyWorkers(*(x[pos][idx] for x in full))
        convoy = turn_convoy(workers, float(hub[pos][0]), overlapped=overlapped)
        out[(*pos, idx)] = convoy.round_s
        exchange[(*pos, idx)] = (convoy.wait_s + workers.hold_s + workers.pre_s
                                 + convoy.dispatch_s + workers.rtt_s)  # fmt: skip
    return out, exchange


def _turn_station(hold: FloatArray, think: FloatArray) -> tuple[FloatArray, FloatArray]:
    """The push turns as one first-come-first-served station with a deterministic hold per
        round (demand D_i s) and a think time Z_i s per worker, one customer per worker (..., N):
        exact mean-value analysis over the populations S (Reiser & Lavenberg 1980, JACM 27(2),
        eqs. 3.1-3.3) with the residual-life correction for a service that is not exponential
        (Reiser 1979, IEEE Trans. Commun. 27(8): a customer in service has on average
        D(1 + cv²)/2 left, D/2 for a fixed hold): R_i(S) = D_i·(1 + Q(S − i)) − U(S − i)·D_i/2,
        X_i(S) = 1/(Z_i + R_i(S)), Q(S) = Σ X_i·R_i, U(S) = Σ X_i·D_i. Returns, at the full
        population, R_i (s: the wait for the turn plus the hold) and U(N − i), the station's busy
        share without i: by the arrival theorem what i finds on arriving, and (unit jumps) what
        it leaves on departing: the probability that the next worker is already waiting when
        its push arrives. Above EXACT_MVA_MAX_WORKERS, the Bard-Schweitzer estimate of both
    (`_exact_mva`, `_schweitzer_mva` with FIXED_HOLD_RESIDUAL)."""
    solve = _exact_mva if think.shape[-1] <= EXACT_MVA_MAX_WORKERS else _schweitzer_mva
    (resp,), (without,) = solve([hold], think, (FIXED_HOLD_RESIDUAL,))
    return resp, without


def _take_turns(
    own_s: FloatArray, demand: tuple[FloatArray, ...], remote: NDArray[np.bool_]
) -> FloatArray:
    """Rounds when the workers take turns on the server's shared link for their pushes, one
    at a time, first come first served (HeLoCo's `--link-slots`), so no two pushes share it.

    own_s: (..., N) each worker's round with the link to itself (seconds); demand: per
    direction of the link, (..., N) seconds of it each worker uses per round (its push's
    turn; its dispatch's bytes at the link's rate: dispatches take no turns, but the link
    carries them whenever one is on its way). The asymptotic bound of a closed network
    (Lazowska, Zahorjan, Graham & Sevcik 1984, "Quantitative System Performance",
    sec. 5.2: X ≤ min(1/D_max, N/(D + Z))), the floor under `_turn_rounds`' rounds, which
    a deterministic schedule would reach: no two pushes meet, so a worker keeps its own
    round while the link has room, and when Σ_i D_i/own_i > 1 on a direction, the workers
    that would go faster than the link allows all wait for one cycle c per round (first come
    first served is then a round robin among them, their max-min fair share of the link:
    Bertsekas & Gallager 1992, Data Networks, sec. 6.5.2): round_i = max(own_i, c), c the
    smallest with Σ_i D_i / max(own_i, c) ≤ 1 on both directions. Seconds, (..., N)."""

    def load(c: FloatArray) -> FloatArray:
        rounds = np.maximum(own_s, c[..., None])
        return np.max([np.where(remote, d / rounds, 0.0).sum(axis=-1) for d in demand], axis=0)

    hi = np.max([np.where(remote, d, 0.0).sum(axis=-1) for d in demand], axis=0)
    lo = np.zeros_like(hi)
    for _ in range(TURN_BISECTIONS):
        mid = 0.5 * (lo + hi)
        over = load(mid) > 1.0
        lo, hi = np.where(over, mid, lo), np.where(over, hi, mid)
    return np.where(remote, np.maximum(own_s, hi[..., None]), own_s)


SHARE_ITERATIONS = 40  # damped fixed-point steps of the shared-server mean-value analysis
EXACT_MVA_MAX_WORKERS = 8  # exact MVA over the 2^N populations up to here; Bard-Schweitzer beyond
EXACT_MVA_CHUNK = 1 << 14  # configurations (leading axes) solved at once by the exact MVA


def _share_server(
    exchange: FloatArray,
    legs: tuple[tuple[FloatArray, FloatArray], ...],
    busy: FloatArray,
    blocking: bool,
    server_Bps: FloatArray,
    remote: NDArray[np.bool_],
) -> FloatArray:
    """The exchange when every worker's transfers cross the server's one link (per direction).

    A closed queueing network, one customer (worker) per class: each leg (bytes B_i, alone
    t_i: push, then pull; or one duplex leg) is a processor-sharing station of demand
    D_i = B_i/C on the server's link C, plus a delay of t_i − D_i (its own path, round trips,
    slow start); the rest of the round is a delay (think) station: the compute and the fixed
    part in a blocking round, round − exchange = max(H·T − X, 0) in an overlapped one (solved
    by damped iteration, the round from the exchange mode). Up to EXACT_MVA_MAX_WORKERS
    remote workers: exact multi-class mean-value analysis (`_exact_mva`; Reiser & Lavenberg
    1980, JACM 27(2)), exact for processor-sharing and delay stations whatever the service
    time distribution (BCMP theorem, Baskett, Chandy, Muntz & Palacios 1975, JACM 22(2)).
    Beyond: its Bard-Schweitzer approximation (`_schweitzer_mva`). Seconds; a lone leg takes
    max(t_i, D_i), its path or the server's link alone."""
    idx = np.flatnonzero(remote)
    alone = [np.where(remote, np.maximum(t, b / server_Bps), 0.0) for b, t in legs]
    fixed = exchange - np.where(remote, sum(t for _, t in legs), 0.0)
    demand = [
        np.where(remote, np.broadcast_to(b / server_Bps, alone[0].shape), 0.0) for b, _ in legs
    ]
    delay = fixed + sum(a - d for a, d in zip(alone, demand, strict=True))
    solve = _exact_mva if len(idx) <= EXACT_MVA_MAX_WORKERS else _schweitzer_mva
    total = delay + sum(alone)
    for _ in range(1 if blocking else SHARE_ITERATIONS):
        think = busy if blocking else np.maximum(busy - total, 0.0)
        shared, _ = solve([d[..., idx] for d in demand], (think + delay)[..., idx])
        new = delay.copy()
        new[..., idx] += sum(shared)
        step = np.max(np.abs(new - total), initial=0.0)
        total = new if blocking else 0.5 * (total + new)
        if step <= 1e-12 * np.max(np.abs(total), initial=1.0):
            break
    return np.asarray(np.where(remote, total, exchange), dtype=np.float64)


def _exact_mva(
    demand: list[FloatArray], think: FloatArray, residual: tuple[float, ...] | None = None
) -> tuple[list[FloatArray], list[FloatArray]]:
    """Exact multi-class mean-value analysis, one customer per class (Reiser & Lavenberg 1980,
    JACM 27(2), eqs. 3.1-3.3): for each population S (a set of workers, smallest first) and
    each i in S, R_ik(S) = D_ik·(1 + Q_k(S − i)) − ρ_k·U_k(S − i)·D_ik at station k (the
    arrival theorem: i sees the network without itself), X_i(S) = 1 / (Z_i + Σ_k R_ik(S)),
    Q_k(S) = Σ_{i∈S} X_i(S)·R_ik(S), U_k(S) = Σ_{i∈S} X_i(S)·D_ik. ρ_k (`residual`, default
    0: processor sharing, exact by BCMP) is the share of its hold a customer in service still
    has when another arrives at an FCFS station (FIXED_HOLD_RESIDUAL; Reiser 1979). demand:
    per station (..., N) seconds; think: (..., N) seconds. Returns, per station at the full
    population, R_ik (..., N) seconds and U_k(N − i), the station's busy share without i."""
    n = think.shape[-1]
    lead = think.shape[:-1]
    rho = residual if residual is not None else (0.0,) * len(demand)
    flat_d = [np.broadcast_to(d, think.shape).reshape(-1, n) for d in demand]
    flat_z = think.reshape(-1, n)
    out = [np.empty_like(flat_z) for _ in demand]
    out_u = [np.empty_like(flat_z) for _ in demand]
    for lo in range(0, flat_z.shape[0], EXACT_MVA_CHUNK):
        part = slice(lo, lo + EXACT_MVA_CHUNK)
        d = [x[part] for x in flat_d]
        z = flat_z[part]
        empty = np.zeros(z.shape[0])
        # Q_k and U_k of the populations one smaller
        queue = {0: ([empty for _ in d], [empty for _ in d])}
        for size in range(1, n + 1):
            level: dict[int, tuple[list[FloatArray], list[FloatArray]]] = {}
            for mask in _masks(n, size):
                q = [empty for _ in d]
                u = [empty for _ in d]
                members = [i for i in range(n) if mask >> i & 1]
                for i in members:
                    rest, rest_u = queue[mask & ~(1 << i)]
                    r = [
                        dk[:, i] * (1.0 + qk) - pk * uk * dk[:, i]
                        for dk, qk, uk, pk in zip(d, rest, rest_u, rho, strict=True)
                    ]
                    x = 1.0 / (z[:, i] + sum(r))
                    q = [qk + x * rk for qk, rk in zip(q, r, strict=True)]
                    u = [uk + x * dk[:, i] for uk, dk in zip(u, d, strict=True)]
                    if size == n:
                        for o, ou, rk, uk in zip(out, out_u, r, rest_u, strict=True):
                            o[part, i], ou[part, i] = rk, uk
                level[mask] = (q, u)
            queue = level
    return [o.reshape(*lead, n) for o in out], [o.reshape(*lead, n) for o in out_u]


def _masks(n: int, size: int) -> list[int]:
    """Every n-bit mask with `size` bits set (the populations of that size)."""
    return [sum(1 << i for i in c) for c in itertools.combinations(range(n), size)]


def _schweitzer_mva(
    demand: list[FloatArray], think: FloatArray, residual: tuple[float, ...] | None = None
) -> tuple[list[FloatArray], list[FloatArray]]:
    """Bard-Schweitzer approximate MVA (Schweitzer 1979; Reiser & Lavenberg 1980, eq. 3.2 with
    the arrival theorem approximated at the full population): a leg of i sees the OTHER
    workers' mean queue and busy share, Q_j = R_jk / round_j by Little's law and
    U_j = D_jk / round_j, R_ik = D_ik·(1 + Σ_{j≠i} Q_j) − ρ_k·Σ_{j≠i} U_j·D_ik,
    round_j = Z_j + Σ_k R_jk, solved by damped iteration. Arguments and result as
    `_exact_mva`."""
    rho = residual if residual is not None else (0.0,) * len(demand)
    r = [np.broadcast_to(d, think.shape).copy() for d in demand]
    for _ in range(SHARE_ITERATIONS):
        round_s = think + sum(r)
        new = []
        for dk, rk, pk in zip(demand, r, rho, strict=True):
            q = rk / round_s
            others = q.sum(axis=-1, keepdims=True) - q
            u = dk / round_s
            new.append(dk * (1.0 + others) - pk * (u.sum(axis=-1, keepdims=True) - u) * dk)
        r = [0.5 * (a + b) for a, b in zip(r, new, strict=True)]
    round_s = think + sum(r)
    busy = [np.broadcast_to(dk / round_s, think.shape) for dk in demand]
    return r, [b.sum(axis=-1, keepdims=True) - b for b in busy]


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
