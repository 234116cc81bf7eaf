"""When a WAN exchange can run without stopping compute: fragment schedules and the stall they
leave per round.

An outer round is H inner steps of `step_s` each (the slowest island's, in lockstep). Fragment f
(a share of the payload) is released at inner step o_f: layer by layer as the backward pass of
that step reaches its layers (per-layer buckets, as DDP/FSDP reduce gradients, C.7; the
fragment is complete when its layer nearest the input is), or at the end of the step without
backward overlap. It must have crossed the WAN by the end of step o_f + τ, when it is merged
(Streaming DiLoCo, Douillard et al. 2025, arXiv 2501.18512, Alg. 2; τ = H is the one-outer-step
overlap of Kale et al. 2025, arXiv 2502.12996). The WAN is one FIFO link: a fragment starts when
the previous one has left, so back-to-back fragments queue. Where a fragment is late, compute
stalls until it lands. Synchronous DP is the schedule H = 1, P = 1, τ = 0; blocking DiLoCo is
P = 1, τ = 0; eager DiLoCo P = 1, τ = H.

`round_stall_s` replays a few rounds of this timeline on numpy arrays (leading axes broadcast,
one vectorized pass per event) and returns the steady-state stall of one round.
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np
from numpy.typing import ArrayLike, NDArray

FloatArray = NDArray[np.float64]
ROUNDS = 4  # rounds replayed; the last one is reported (with the link-capacity bound)


@dataclass(frozen=True)
class Schedule:
    """Fragments of one round: offsets (inner step, 0 ≤ o < H) and payload shares (Σ = 1),
    arrays (..., P); padding fragments have share 0. `strided`: fragment f of P holds layers
    f, f+P, f+2P, ... (the pattern Streaming DiLoCo prefers, its Fig. 7); otherwise fragments
    hold consecutive layers from the input side in list order."""

    offsets: FloatArray
    shares: FloatArray
    strided: bool = True

    @property
    def n(self) -> int:
        return int(self.offsets.shape[-1])


def even_schedule(inner_steps: ArrayLike, fragments: ArrayLike) -> Schedule:
    """P equal fragments at offsets round(k·H/P), k = 0..P−1 (P may vary along leading axes;
    shorter schedules are padded with empty fragments)."""
    h = np.asarray(inner_steps, dtype=np.float64)
    p = np.asarray(fragments, dtype=np.float64)
    shape = np.broadcast_shapes(h.shape, p.shape)
    width = int(np.max(p)) if p.size else 1
    k = np.arange(width, dtype=np.float64)
    hh, pp = np.broadcast_to(h, shape)[..., None], np.broadcast_to(p, shape)[..., None]
    real = k < pp
    return Schedule(
        offsets=np.where(real, np.round(k * hh / pp), 0.0),
        shares=np.where(real, 1.0 / pp, 0.0),
    )


def explicit_schedule(offsets: list[int], layers: list[int]) -> Schedule:
    """A schedule listed fragment by fragment: payload shares in proportion to their layers,
    consecutive layers from the input side in list order."""
    total = float(sum(layers))
    return Schedule(
        offsets=np.asarray(offsets, dtype=np.float64),
        shares=np.asarray(layers, dtype=np.float64) / total,
        strided=False,
    )


def release_span(
    schedule: Schedule, shares: FloatArray, layers: FloatArray
) -> tuple[FloatArray, FloatArray]:
    """(u, v): when fragment f's first and last gradient bucket are ready, as fractions of the
    backward pass. The backward runs from the last layer to the first, one layer per 1/L of it,
    so layer l is ready at (L − l)/L; a fragment is ready when its layer nearest the input is."""
    ell = layers[..., None]
    n = np.maximum(1.0, shares * ell)  # layers in the fragment
    if schedule.strided:
        p = (shares > 0).sum(axis=-1, keepdims=True).astype(np.float64)
        f = np.arange(shares.shape[-1], dtype=np.float64)
        last = (ell - f) / ell
        first = last - (n - 1.0) * p / ell
    else:
        start = (np.cumsum(shares, axis=-1) - shares) * ell  # layers before the fragment
        last = (ell - start) / ell
        first = (ell - start - n + 1.0) / ell
    return np.clip(first, 0.0, 1.0), np.clip(last, 0.0, 1.0)


def round_stall_s(
    step_s: ArrayLike,
    inner_steps: ArrayLike,
    schedule: Schedule,
    tau: ArrayLike,
    fixed_s: ArrayLike,
    transfer_s: ArrayLike,
    window_s: ArrayLike,
    buckets: ArrayLike,
) -> FloatArray:
    """Steady-state compute stall per round (seconds).

    step_s: inner step; inner_steps: H; tau: steps a fragment may take (0 ≤ τ ≤ H);
    fixed_s: per-fragment latency of the collective (RTT terms); transfer_s: the whole
    payload's bandwidth time, fragment f takes share_f of it; window_s: the backward pass
    during which buckets are released (0: released at the end of the step); buckets: layers
    of the whole model per pipeline stage (a fragment holds share_f of them, at least one).
    """
    t = np.asarray(step_s, dtype=np.float64)
    h = np.asarray(inner_steps, dtype=np.float64)
    tau_ = np.asarray(tau, dtype=np.float64)
    fixed = np.asarray(fixed_s, dtype=np.float64)
    transfer = np.asarray(transfer_s, dtype=np.float64)
    window = np.asarray(window_s, dtype=np.float64)
    layers = np.asarray(buckets, dtype=np.float64)
    lead = np.broadcast_shapes(
        t.shape,
        h.shape,
        tau_.shape,
        fixed.shape,
        transfer.shape,
        window.shape,
        layers.shape,
        schedule.offsets.shape[:-1],
        schedule.shares.shape[:-1],
    )
    p = schedule.n
    offsets = np.broadcast_to(schedule.offsets, (*lead, p))
    shares = np.broadcast_to(schedule.shares, (*lead, p))
    t, h, tau_, fixed, transfer, window, layers = (
        np.broadcast_to(a, lead) for a in (t, h, tau_, fixed, transfer, window, layers)
    )
    comm = np.where(shares > 0, fixed[..., None] + shares * transfer[..., None], 0.0)
    k = np.maximum(1.0, np.round(shares * layers[..., None]))
    b = np.minimum(window, t)
    u, v = release_span(schedule, shares, layers)

    # Events of ROUNDS rounds: releases (key o + 0.5, inside step o) and deadlines (key
    # o + τ + 1, the end of step o + τ); fragment e = r·P + f. Configurations are flattened to
    # rows and every event's data gathered in time order once, so the replay is one pass of
    # column operations.
    n_ev = ROUNDS * p
    rows = int(np.prod(lead, dtype=np.int64))
    r = np.repeat(np.arange(ROUNDS, dtype=np.float64), p)
    base = np.tile(offsets, ROUNDS) + r * h[..., None]  # (..., R·P): step index of release
    keys = np.concatenate([base + 0.5, base + tau_[..., None] + 1.0], axis=-1)
    order = np.argsort(keys.reshape(rows, 2 * n_ev), axis=-1, kind="stable")
    frag = order % n_ev

    def in_order(a: FloatArray) -> FloatArray:
        flat = np.broadcast_to(a, (*lead, n_ev)).reshape(rows, n_ev)
        return np.ascontiguousarray(np.take_along_axis(flat, frag, axis=-1).T)

    step_o = in_order(base)
    comm_o, k_o = in_order(np.tile(comm, ROUNDS)), in_order(np.tile(k, ROUNDS))
    u_o, v_o = in_order(np.tile(u, ROUNDS)), in_order(np.tile(v, ROUNDS))
    release_o = np.ascontiguousarray((order < n_ev).T)
    counted_o = np.ascontiguousarray((frag >= (ROUNDS - 1) * p).T)  # the reported round
    slot_o = np.ascontiguousarray(frag.T) * rows + np.arange(rows)
    t1, tau1, b1 = t.reshape(rows), tau_.reshape(rows), b.reshape(rows)

    delay = np.zeros(rows)  # stall accumulated so far
    link_free = np.full(rows, -np.inf)
    finish = np.full(n_ev * rows, -np.inf)  # when fragment e has crossed, per row
    stall = np.zeros(rows)
    for j in range(2 * n_ev):
        step, c, slot = step_o[j], comm_o[j], slot_o[j]
        end = (step + 1.0) * t1 + delay
        first = end - b1 + b1 * u_o[j]
        last = end - b1 + b1 * v_o[j]
        done = np.maximum(np.maximum(link_free, first) + c, last + c / k_o[j])
        release = release_o[j] & (c > 0)
        link_free = np.where(release, done, link_free)
        finish[slot] = np.where(release, done, finish[slot])
        due = (step + tau1 + 1.0) * t1 + delay
        late = np.where(release_o[j], 0.0, np.maximum(0.0, finish[slot] - due))
        delay = delay + late
        stall = stall + np.where(counted_o[j], late, 0.0)
    # A link busy all the time carries one round's fragments per round: round ≥ Σ c_f. The
    # replay starts from an idle link, so a backlog that grows slowly (τ near H) may not have
    # built up yet; the capacity bound is its steady state.
    return np.maximum(stall.reshape(lead), comm.sum(axis=-1) - h * t)
