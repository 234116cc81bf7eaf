"""The push turns on a shared server link as a deterministic schedule: the workers'
first-come-first-served turns, run event by event until they settle (a convoy), for the
blocking and the overlapped exchange.

With deterministic compute and link times, a closed first-come-first-served station does not
drift: it settles into a periodic schedule (the FCFS convoy of Blasgen, Gray, Mitoma & Price
1979, ACM SIGOPS Oper. Syst. Rev. 13(2)). On a hub link shared both ways, the schedule also
sets each dispatch's time: its ACKs cross the FIFO towards the server behind the pushes that
follow it, so a worker whose push is followed at once by the others' pushes gets the slowest
dispatch and sets the convoy's period. `turn_convoy` iterates that recurrence (asks, grants,
releases, the dispatch's slow-start rounds against the queue of the pushes then crossing)
over enough rounds to settle, and reads each worker's round, wait and dispatch off the last
half. Each dispatch starts from the congestion window the server's connection to that worker
kept: the window the last dispatch left, restarted at each of the server's sends on that
connection (the answer to the worker's ask, the push's ack) after an idle longer than its RTO
(Linux tcp_cwnd_restart, `wan.restart_window`): about half of it after an overlapped push's
hold, about the initial window after a blocking round's compute. Pure numpy and the
standard library; seconds, bytes, bytes/s.
"""

from __future__ import annotations

import heapq
from dataclasses import dataclass

import numpy as np
from numpy.typing import NDArray

from shardmeter.estimate.wan import BOTTLENECK_QUEUE_S, acked_window, restart_window

FloatArray = NDArray[np.float64]

SLOT_POLL_S = 0.01  # s: a waiting worker asks for the link again this long after "wait" (HeLoCo)
# A dispatch at its rate advances in steps of at least 1/SATURATED_STEPS of its time alone
# (or one round trip, if longer), so a long transfer costs a bounded number of events; the
# rate it shares is re-read at each step.
SATURATED_STEPS = 64
CONVOY_ROUNDS = 48  # rounds of every worker simulated; the last half is read (the first settle)
# Relative spread of a schedule's cycle lengths, its grants in a fixed order, within which
# it counts as repeating (`schedule_period`): a convoy. Settled schedules spread by float
# rounding (the benchmark's unequal links: 1e-13) or while they still settle (up to 8e-3 on
# the tests' links); drifting ones keep an order but spread their cycles by 0.10-0.23 (the
# benchmark's equal workers, BENCHMARKS.md, "Session 12 (helper `convoy`)"). Dimensionless.
CONVOY_LOCK_SPREAD = 0.02


@dataclass(frozen=True)
class ConvoyWorkers:
    """Per remote worker (1-D arrays, one entry a worker): seconds, bytes, bytes/s.

    compute_s: its H inner steps; rtt_s: its round trip to the server; hold_s: its push's
    turn, grant sent to last byte in (an RTT plus its push alone); pre_s: from its push's
    arrival to its dispatch's first byte (the ack out, the pull request in, the host copy);
    push_bytes / push_Bps: its push and the rate it enters the hub at (its own link);
    pull_bytes / pull_Bps: its dispatch and the rate it crosses at (its link or the hub's,
    the slower); pull_window: the congestion window its first dispatch starts from (later
    ones start from the window the connection kept, `turn_convoy`)."""

    compute_s: FloatArray
    rtt_s: FloatArray
    hold_s: FloatArray
    pre_s: FloatArray
    push_bytes: FloatArray
    push_Bps: FloatArray
    pull_bytes: FloatArray
    pull_Bps: FloatArray
    pull_window: FloatArray


@dataclass(frozen=True)
class Convoy:
    """What the settled schedule gives each worker (1-D arrays, seconds): its round (ask to
    ask; in a repeating schedule its share of the cycle), its mean wait for a turn (ask to
    grant), and its dispatch (first to last byte); and whether the grants repeat
    (`locked`, `schedule_period`: a convoy, every worker at a fixed share of one cycle)."""

    round_s: FloatArray
    wait_s: FloatArray
    dispatch_s: FloatArray
    locked: bool


def hub_queue_bytes(t_s: float, push_bytes: float, push_Bps: float, hub_Bps: float) -> float:
    """Bytes a push queues at a hub link of `hub_Bps` `t_s` seconds after its first byte
    reached it, entering at `push_Bps`: a fluid queue (Anick, Mitra & Sondhi 1982, Bell
    Syst. Tech. J. 61(8)) that grows at r − C, is held at the hub's buffer K =
    BOTTLENECK_QUEUE_S·C while the sender still has bytes, and drains at C once the last
    byte is in: min((r − C)·t, K, M − C·t) over the push's M/C seconds, else 0."""
    if push_Bps <= hub_Bps or not 0.0 <= t_s <= push_bytes / hub_Bps:
        return 0.0
    cap = BOTTLENECK_QUEUE_S * hub_Bps
    return max(min((push_Bps - hub_Bps) * t_s, cap, push_bytes - hub_Bps * t_s), 0.0)


def turn_convoy(
    w: ConvoyWorkers, hub_Bps: float, rounds: int = CONVOY_ROUNDS, overlapped: bool = False
) -> Convoy:
    """Run the turns event by event from a common start (every worker pulling at t = 0)
    until each worker has done `rounds` rounds, and read the last half.

    A worker's ask reaches the server `rtt_s`/2 after its compute ends; the server grants
    the link if no push holds it and nobody asked before, else queues the ask (first come
    first served); the next in line is granted half a poll period (SLOT_POLL_S + its RTT)
    after the link frees. A push holds the link `hold_s` from its grant; its bytes cross
    the hub in the last M/C of that hold, queueing `hub_queue_bytes`. Its dispatch starts
    `pre_s` after its arrival, from `pull_window` bytes, doubling once per ACK-clocked round
    trip (RFC 5681 sec. 3.1) of RTT + the hub's queue towards the server at that moment /
    C (its ACKs cross that FIFO), until the window carries the path's rate × that round
    trip or the bytes run out, and sends the rest at `pull_Bps` (`slow_start_s`'s schedule,
    each round at its own clock). Blocking: the next ask comes one RTT plus its compute
    after the dispatch's last byte is sent. Overlapped (heloco.outer_loop, Exchange): a
    worker starts its next round, and asks, when its compute is done and the dispatch it
    pulled in the background is in: the next ask at max(last ask + compute, dispatch's last
    byte + RTT); the first round trains from the first dispatch as in blocking. A dispatch
    starts from `pull_window` the first time, then from what the last one left
    (`acked_window`), restarted (`restart_window`, the RTO from the last dispatch's round
    trip) over the idle before each of the server's sends to that worker: the answer to its
    ask (grant or "wait"; "wait" again every poll, within the RTO), its push's ack (the
    hold after the grant), the dispatch. The hub's link towards the workers is shared
    evenly by the dispatches crossing it at once (processor sharing: each gets at most
    C / their number). Returns each worker's mean round, wait and dispatch, and whether
    they locked."""
    n = len(w.compute_s)
    f = {k: [float(x) for x in getattr(w, k)] for k in ConvoyWorkers.__dataclass_fields__}
    pushes: list[tuple[float, int]] = []  # (first byte at the hub, worker), in grant order
    asks: list[list[float]] = [[] for _ in range(n)]
    waits: list[list[float]] = [[] for _ in range(n)]
    dispatches: list[list[float]] = [[] for _ in range(n)]
    events: list[tuple[float, int, str, int]] = []
    seq = 0
    holder: int | None = None
    queue: list[int] = []
    d_start = [0.0] * n
    sent = [0.0] * n
    window = [0.0] * n
    pulling = [False] * n
    # the window each worker's connection from the server keeps (bytes), the one its
    # dispatch under way started from, when the server last sent it data, and the round trip
    # its last dispatch's ACKs measured
    kept = list(f["pull_window"])
    start_window = list(kept)
    last_send = [0.0] * n
    srtt = list(f["rtt_s"])

    def send(i: int, t: float) -> None:  # the server sends worker i data at t
        idle = t - last_send[i]
        kept[i] = float(restart_window(kept[i], idle, f["rtt_s"][i], srtt_s=srtt[i]))
        last_send[i] = t

    def post(t: float, kind: str, i: int) -> None:
        nonlocal seq
        heapq.heappush(events, (t, seq, kind, i))
        seq += 1

    def queued(t: float) -> float:
        out = 0.0
        for start, k in pushes[-2:]:  # turns: at most the last two pushes' windows reach t
            out += hub_queue_bytes(t - start, f["push_bytes"][k], f["push_Bps"][k], hub_Bps)
        return out

    def grant(i: int, g: float) -> None:
        nonlocal holder
        holder = i
        waits[i].append(g - asks[i][-1])
        end = g + f["hold_s"][i]
        pushes.append((end - f["push_bytes"][i] / hub_Bps, i))
        post(end, "release", i)

    for i in range(n):
        post(0.0, "dispatch", i)
    done = 0  # workers with `rounds` asks
    while events and done < n:
        t, _, kind, i = heapq.heappop(events)
        if kind == "ask":
            asks[i].append(t)
            send(i, t)  # the answer: its grant or "wait"
            done += len(asks[i]) == rounds
            if holder is None and not queue:
                grant(i, t)
            else:
                queue.append(i)
        elif kind == "release":
            holder = None
            send(i, t)  # the push's ack
            post(t + f["pre_s"][i], "dispatch", i)
            if queue:
                j = queue.pop(0)
                grant(j, t + 0.5 * (SLOT_POLL_S + f["rtt_s"][j]))
        elif kind == "dispatch":
            send(i, t)
            d_start[i], sent[i], window[i] = t, 0.0, kept[i]
            start_window[i] = kept[i]
            pulling[i] = True
            post(t, "round", i)
        else:  # one slow-start round of i's dispatch
            rtt = f["rtt_s"][i]
            # the hub's link towards the workers, shared evenly by the dispatches crossing it
            rate = min(f["pull_Bps"][i], hub_Bps / max(sum(pulling), 1))
            clock = rtt + queued(t + rtt) / hub_Bps
            if clock <= 0:  # no round trip: no slow start, the rate alone (slow_start_s)
                burst, step = float("inf"), 0.0
            elif window[i] >= rate * clock:  # at the rate, in steps of a round trip or more
                step = max(clock, f["pull_bytes"][i] / f["pull_Bps"][i] / SATURATED_STEPS)
                burst = rate * step
            else:  # one slow-start round: the window, one round trip
                burst, step = window[i], clock
            left = f["pull_bytes"][i] - sent[i]
            if left <= burst:
                end = t + left / rate
                pulling[i] = False
                dispatches[i].append(end - d_start[i])
                last_send[i], srtt[i] = end, clock
                # what it left: every byte acknowledged (acked_window)
                m, r = f["pull_bytes"][i], f["pull_Bps"][i]
                kept[i] = float(acked_window(m, r, rtt, start_window=start_window[i]))
                ready = end + rtt  # the dispatch is in and the ask has reached the server
                if overlapped and asks[i]:
                    post(max(ready, asks[i][-1] + f["compute_s"][i]), "ask", i)
                else:
                    post(ready + f["compute_s"][i], "ask", i)
            else:
                sent[i] += burst
                window[i] = max(window[i], 2.0 * min(window[i], rate * clock))
                post(t + step, "round", i)
    half = rounds // 2
    round_s = np.array([(a[-1] - a[-1 - half]) / half for a in asks])
    tail = pushes[len(pushes) // 2 :]
    period = schedule_period([k for _, k in tail], [t for t, _ in tail])
    if period is not None:  # whole cycles of the orbit: each worker's share of their mean
        cycles = (len(tail) - 1) // period
        cycle = (tail[-1][0] - tail[-1 - cycles * period][0]) / cycles
        turns = np.bincount([k for _, k in tail[-period:]], minlength=n)
        round_s = np.where(turns > 0, cycle / np.maximum(turns, 1), round_s)
    return Convoy(
        round_s=round_s,
        wait_s=np.array([float(np.mean(x[-half:])) for x in waits]),
        dispatch_s=np.array([float(np.mean(x[-half:])) for x in dispatches]),
        locked=period is not None,
    )


def schedule_period(order: list[int], times: list[float]) -> int | None:
    """The smallest P (grants) with which a schedule's grants repeat: the same worker every
    P grants, and each grant time P later by one cycle, whose lengths spread by at most
    CONVOY_LOCK_SPREAD of their mean, over the whole window (at least two cycles); None
    when no P does (the phases drift). `order`: the worker of each grant, in order;
    `times`: their times (s)."""
    for p in range(1, len(order) // 2 + 1):
        if any(order[g] != order[g + p] for g in range(len(order) - p)):
            continue
        shift = np.subtract(times[p:], times[:-p])
        if float(np.ptp(shift)) <= CONVOY_LOCK_SPREAD * float(np.mean(shift)):
            return p
    return None
