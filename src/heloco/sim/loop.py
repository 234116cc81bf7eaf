"""The event loop: workers with paces, rounds processed in order of simulated finish time.

A worker dispatched at time t with H_w steps finishes at t + H_w·pace_w·jitter + comm_w
(spec 3, "Speed heterogeneity"); arrivals are applied in finish-time order, ties broken by
worker id, and every arrival at one time is applied before any of those workers is dispatched
again (as the authors' prototype does). Sync methods wait for the slowest worker every round.
"""

from __future__ import annotations

import heapq
import math
import time
from collections.abc import Callable, Generator, Sequence
from dataclasses import replace
from typing import Protocol

import numpy as np

from heloco.data import derive_seed
from heloco.metrics import EvalPoint, MetricsWriter, RunStats
from heloco.overlap import overlapped_dispatch
from heloco.run import Budget, RunControl
from heloco.server import Server, UpdateRecord
from heloco.sim.clock import Clock, lump_timing, round_seconds
from heloco.sim.config import JITTER_KEY
from heloco.sim.recorder import Evaluator, Recorder, Trajectory
from heloco.streaming import Stream, begin_sub_round, end_sub_round
from heloco.types import Delta, Dispatch, Params, RoundResult, RoundTiming, tensor_bytes
from heloco.worker import Worker


class RoundRunner(Protocol):
    """What the clock needs from a worker (``heloco.worker.Worker`` satisfies it)."""

    def run_round(
        self, start: Params, steps: int, base_revision: int, round_id: int | None = None
    ) -> RoundResult: ...


class RoundSource(Protocol):
    """Where the event loop gets its workers' rounds. A round is submitted when its worker is
    dispatched (with its simulated arrival time) and taken when it arrives; ``ready`` says
    whether it can be taken now. A batched source computes many submitted rounds at once
    while the loop waits (see :func:`simulation`)."""

    def submit(self, dispatch: Dispatch, arrival: float) -> None: ...

    def ready(self, worker: int) -> bool: ...

    def take(self, worker: int) -> RoundResult: ...


class DirectRounds:
    """Each round computed by its worker when the loop takes it, one at a time."""

    def __init__(self, workers: Sequence[RoundRunner]) -> None:
        self.workers = workers
        self.pending: dict[int, Dispatch] = {}

    def submit(self, dispatch: Dispatch, arrival: float) -> None:
        self.pending[dispatch.worker] = dispatch

    def ready(self, worker: int) -> bool:
        return True

    def take(self, worker: int) -> RoundResult:
        d = self.pending.pop(worker)
        return self.workers[worker].run_round(d.params, d.steps, d.revision, d.round_id)


class StreamRounds:
    """Each streaming sub-round computed by its worker when the loop takes it, one at a time,
    through the worker's :class:`heloco.streaming.Stream` (the networked worker's
    :class:`heloco.outer_loop.OuterLoop` drives the same object in the same order).

    The loop submits each dispatch the server hands out. A full one begins a sub-round from
    it; a fragment one (D_{k+1}) is what the sub-round now begun answers, and that sub-round
    first merges the dispatch before it (D_k, which arrived during the sub-round before) and
    runs D_k's steps, as the worker does at its boundary."""

    def __init__(self, workers: Sequence[Worker], fragments: list[list[str]], alpha: float):
        self.workers = workers
        self.streams = [Stream(fragments, alpha) for _ in workers]
        self.latest: dict[int, Dispatch] = {}
        # worker -> (dispatch to load or merge first, full?, steps, the dispatch it answers)
        self.pending: dict[int, tuple[Dispatch | None, bool, int, Dispatch]] = {}

    def submit(self, dispatch: Dispatch, arrival: float) -> None:
        w = dispatch.worker
        stream = self.streams[w]
        if stream.is_full(dispatch):
            self.pending[w] = (dispatch, True, dispatch.steps, dispatch)
        else:
            prev = self.latest[w]
            first = None if stream.is_full(prev) else prev
            self.pending[w] = (first, False, prev.steps, dispatch)
        self.latest[w] = dispatch

    def ready(self, worker: int) -> bool:
        return True

    def take(self, worker: int) -> RoundResult:
        first, full, steps, answers = self.pending.pop(worker)
        stream, runner = self.streams[worker], self.workers[worker]
        if full:
            assert first is not None
            stream.reset(first)
        elif first is not None:
            stream.merge(first)
        begin_sub_round(runner.boundary, stream, steps, full)
        runner.train_round()
        return end_sub_round(runner.boundary, stream, answers)


Loop = Generator[None, None, "Trajectory"]
"""A simulated run in progress: yields while it waits for a round, returns its trajectory."""


class _Sim:
    """The event loop shared by async and sync methods."""

    def __init__(
        self, server: Server, rounds: RoundSource, clock: Clock, recorder: Recorder
    ) -> None:
        self.server, self.rounds, self.clock, self.rec = server, rounds, clock, recorder
        self.traj = recorder.traj
        # The run's policy (budgets, grace windows), shared with the network coordinator.
        budget = Budget(tokens=clock.token_budget, seconds=clock.time_budget)
        self.control = RunControl(budget, server.cfg.grace_window, len(clock.paces))
        self.jitter_rngs = [
            np.random.default_rng(derive_seed(clock.seed, JITTER_KEY, w))
            for w in range(len(clock.paces))
        ]
        self.dispatch_bytes = tensor_bytes(server.params)  # each dispatch: θ in fp32

    # -- helpers ----------------------------------------------------------------------------
    def compute_seconds(self, worker: int, steps: int) -> float:
        """Simulated compute time of a round in seconds: steps · pace · e^(σz − σ²/2), z ~ N(0, 1).

        The factor has mean 1 because a lognormal's mean is E[e^(σz)] = e^(σ²/2).
        """
        sigma = self.clock.jitter
        factor = 1.0
        if sigma > 0:
            z = float(self.jitter_rngs[worker].standard_normal())
            factor = math.exp(sigma * z - 0.5 * sigma * sigma)
        return steps * self.clock.paces[worker] * factor

    def budget_reached(self) -> bool:
        return self.control.tokens_reached()

    def record_round(
        self,
        result: RoundResult,
        start: float,
        end: float,
        compute: float,
        timing: RoundTiming | None = None,
    ) -> None:
        self.control.count(result.tokens)
        rid = -1 if result.round_id is None else result.round_id
        sent = tensor_bytes(result.delta)
        if timing is None:  # one comm lump (comm_delays): split by the bytes each way
            timing = lump_timing(start, end, compute, self.dispatch_bytes, sent)
        elif timing.bytes_sent is None:  # exact legs, bytes as sent
            timing = replace(timing, bytes_sent=sent, bytes_received=self.dispatch_bytes)
        self.rec.record_round(
            result.worker, rid, result.steps, result.tokens, result.mean_loss, start, end, timing
        )

    def record_update(self, record: UpdateRecord) -> None:
        self.rec.record_update(record, self.traj.time, self.traj.tokens)

    def eval_now(self) -> None:
        self.rec.eval_now(self.traj.time)

    def maybe_eval(self) -> None:
        self.rec.maybe_eval(self.traj.time)

    def finish(self) -> Trajectory:
        self.rec.finish(self.traj.time)
        return self.traj

    def take(self, worker: int) -> Generator[None, None, RoundResult]:
        """The worker's round, once its source has it (yields until then)."""
        while not self.rounds.ready(worker):
            yield
        return self.rounds.take(worker)

    # -- async ------------------------------------------------------------------------------
    def timing(
        self, w: int, recv: tuple[float, float], compute: tuple[float, float], arrival: float
    ) -> RoundTiming:
        """A round's :class:`RoundTiming`: its dispatch received over ``recv``, computed over
        ``compute``, its push sent from ``send_start`` = the round's boundary until
        ``arrival``; bytes where a link clock counts them."""
        clock = self.clock
        return RoundTiming(
            recv[0],
            recv[1],
            compute[0],
            compute[1],
            arrival - clock.up(w),
            arrival,
            clock.push_bytes[w] if clock.push_bytes else None,
            clock.pull_bytes if clock.push_bytes else None,
        )

    def run_async(self) -> Loop:
        heap: list[tuple[float, int]] = []
        # worker -> (the round's dispatch, its compute start, its compute seconds, its timing)
        inflight: dict[int, tuple[Dispatch, float, float, RoundTiming]] = {}
        # overlapped: worker -> (newest dispatch received, the boundary at which the next
        # round starts, the interval over which that dispatch was received)
        pipes: dict[int, tuple[Dispatch, float, tuple[float, float]]] = {}
        overlapped = self.clock.exchange == "overlapped"
        streaming = self.clock.exchange == "streaming"
        # legs known: link clock or overlap
        exact = overlapped or streaming or bool(self.clock.push_bytes)
        eager = self.clock.eager
        control = self.control
        # kills and rejoins on the simulated clock: (time, order, worker, is_kill)
        events = sorted(
            [(at, 1, w, True) for w, at, _ in self.clock.failures]
            + [(at + down, 0, w, False) for w, at, down in self.clock.failures]
        )
        down: set[int] = set()
        deltas: dict[int, Delta] = {}  # overlapped: the Δ a ready worker's next round applies

        def start(w: int, t: float) -> None:
            """Dispatch at ``t``; the round trains from it once it arrived (blocking, and an
            overlapped worker's first round after a (re)start)."""
            d = self.server.dispatch(w)
            compute = self.compute_seconds(w, d.steps)
            arrival = t + compute + self.clock.comm_delays[w]
            t1 = t + self.clock.down(w)
            timing = self.timing(w, (t, t1), (t1, t1 + compute), arrival)
            inflight[w] = (d, t1, compute, timing)
            if overlapped:
                pipes[w] = (d, t1 + compute, (t, t1))
            heapq.heappush(heap, (arrival, w))
            self.rounds.submit(d, arrival)

        def start_next(w: int, t: float, delta: Delta) -> None:
            """Overlapped (heloco.overlap): the push that arrived at ``t`` is answered by a
            dispatch that travels down while the round begun at the boundary trains from
            the previous dispatch with Δ applied eagerly; that round's push leaves once both
            its compute and the new dispatch are done."""
            latest, boundary, recv = pipes[w]
            answer = self.server.dispatch(w)
            d = overlapped_dispatch(latest, delta, eager, answer)
            compute = self.compute_seconds(w, d.steps)
            got = t + self.clock.down(w)
            end = max(boundary + compute, got)
            arrival = end + self.clock.up(w)
            timing = self.timing(w, recv, (boundary, boundary + compute), arrival)
            inflight[w] = (d, boundary, compute, timing)
            pipes[w] = (answer, end, (t, got))
            heapq.heappush(heap, (arrival, w))
            self.rounds.submit(d, arrival)

        sizes = {k: v.numel() * 4 for k, v in self.server.params.items()}  # fp32 bytes
        whole = sum(sizes.values())
        frag_bytes = [sum(sizes[n] for n in names) for names in self.server.fragments]

        def leg(w: int, nbytes: int, up: bool) -> float:
            """A streaming leg's seconds: the link clock's, or the push's share of the fixed
            comm_delays (a dispatch then takes none, as in the other exchanges)."""
            if not up and not self.clock.link_mbit:
                return 0.0
            return self.clock.leg(w, nbytes, whole)

        def start_stream(w: int, t: float) -> None:
            """Streaming (heloco.streaming): a full dispatch at ``t``; the first sub-round
            trains from it once it arrived and pushes its fragment."""
            d = self.server.dispatch(w)
            compute = self.compute_seconds(w, d.steps)
            sent = frag_bytes[d.fragment or 0]
            t1 = t + leg(w, tensor_bytes(d.params), False)
            end = t1 + compute
            arrival = end + leg(w, sent, True)
            timing = RoundTiming(t, t1, t1, end, end, arrival, sent, tensor_bytes(d.params))
            inflight[w] = (d, t1, compute, timing)
            pipes[w] = (d, end, (t, t1))
            heapq.heappush(heap, (arrival, w))
            self.rounds.submit(d, arrival)

        def next_stream(w: int, t: float) -> None:
            """Streaming: the push that arrived at ``t`` is answered by a fragment dispatch
            that travels down while the sub-round begun at the boundary trains (the previous
            dispatch's steps); its push leaves once both are done, as in overlapped."""
            latest, boundary, recv = pipes[w]
            answer = self.server.dispatch(w)
            compute = self.compute_seconds(w, latest.steps)
            got = t + leg(w, tensor_bytes(answer.params), False)
            end = max(boundary + compute, got)
            sent = frag_bytes[answer.fragment or 0]
            arrival = end + leg(w, sent, True)
            timing = RoundTiming(
                recv[0], recv[1], boundary, boundary + compute, end, arrival, sent,
                tensor_bytes(latest.params),
            )  # fmt: skip
            inflight[w] = (replace(answer, steps=latest.steps), boundary, compute, timing)
            pipes[w] = (answer, end, (t, got))
            heapq.heappush(heap, (arrival, w))
            self.rounds.submit(answer, arrival)

        def next_time() -> float:
            return heap[0][0] if heap else math.inf

        first = start_stream if streaming else start
        for w in range(len(self.clock.paces)):
            first(w, 0.0)
        self.eval_now()
        waiting: list[int] = []
        ready: list[int] = []  # applied at time t, dispatched once every arrival at t is in
        while True:
            grace_end = control.grace_end
            horizon = min(next_time(), math.inf if grace_end is None else grace_end)
            if events and events[0][0] <= horizon:
                t_ev, _, w, kill = events.pop(0)
                if control.past_time(t_ev):
                    events = []
                    continue
                self.traj.time = max(self.traj.time, t_ev)
                if kill and w not in down:
                    down.add(w)
                    pipes.pop(w, None)  # an overlapped worker restarts blocking
                    if w in inflight:  # its round in flight is lost
                        del inflight[w]
                        heap = [(a, v) for a, v in heap if v != w]
                        heapq.heapify(heap)
                    waiting = [v for v in waiting if v != w]
                    ready = [v for v in ready if v != w]
                    self.server.evict(w)
                elif not kill and w in down:
                    down.discard(w)
                    if w not in inflight:
                        first(w, t_ev)
                continue
            if control.grace_closes_before(heap[0][0] if heap else None):
                window_end = control.grace_end
                assert window_end is not None  # a window closes only when one is open
                if control.past_time(window_end):
                    self.traj.stopped_by = "time"
                    break
                self.traj.time = window_end
                for rec in self.server.flush():
                    self.record_update(rec)
                for w in waiting:
                    if w not in down:
                        start(w, window_end)
                control.close_grace()
                waiting = []
                self.maybe_eval()
                continue
            if not heap or control.past_time(heap[0][0]):
                self.traj.stopped_by = "time"
                break
            t, w = heapq.heappop(heap)
            self.traj.time = t
            d, t0, compute, timing = inflight.pop(w)
            result: RoundResult = yield from self.take(w)
            if d.steps > 0 and compute > 0:
                self.server.observe_speed(w, d.steps / compute)
            if overlapped:  # the next round's start, before the server may keep Δ
                deltas[w] = result.delta
            start_at = timing.compute_start if overlapped or streaming else timing.recv_start
            self.record_round(result, start_at, t, compute, timing if exact else None)
            self.traj.useful_seconds += compute
            applied = self.server.submit(result)
            if applied is not None:
                self.record_update(applied)
                ready.append(w)
            elif self.server.holds_workers:
                control.open_grace(t)
                waiting.append(w)
            else:  # quorum: the worker goes on; the window opens once the quorum is met
                ready.append(w)
                if self.server.window_ready():
                    control.open_grace(t)
            self.maybe_eval()
            if self.budget_reached():
                for rec in self.server.flush(final=True):
                    self.record_update(rec)
                self.traj.stopped_by = "tokens"
                break
            if ready and (not heap or heap[0][0] > t):
                for v in sorted(ready):
                    if streaming:
                        next_stream(v, t) if v in pipes else start_stream(v, t)
                    elif v in pipes:
                        start_next(v, t, deltas.pop(v))
                    else:
                        start(v, t)
                ready = []
        for _, t0, compute, _ in inflight.values():  # rounds cut by the stop: in progress
            self.traj.useful_seconds += max(0.0, min(compute, self.traj.time - t0))
        return self.finish()

    # -- sync -------------------------------------------------------------------------------
    def run_sync(self) -> Loop:
        k = len(self.clock.paces)
        exact = bool(self.clock.push_bytes)  # a link clock: each leg's own time
        self.eval_now()
        while not self.budget_reached():
            now = self.traj.time
            # a worker down at the round's start sits it out (the server evicted it: the
            # barrier shrinks, as heartbeats would make it); one killed during it loses it
            alive = [w for w in range(k) if not self.clock.is_down(w, now)]
            if not alive:
                self.traj.time = min(self.clock.back_at(w, now) for w in range(k))
                continue
            dispatches = {w: self.server.dispatch(w) for w in alive}
            computes = {w: self.compute_seconds(w, d.steps) for w, d in dispatches.items()}
            ends = {w: now + c + self.clock.comm_delays[w] for w, c in computes.items()}
            lost = {w for w in alive if self.clock.killed_between(w, now, ends[w])}
            kept = [w for w in alive if w not in lost]
            round_end = max(ends.values())
            if not kept:
                round_end = max(self.clock.back_at(w, now) for w in alive)
            if self.control.past_time(round_end):
                self.traj.stopped_by = "time"
                break
            for w in lost:
                self.server.evict(w)
            for w in range(k):
                if w not in alive:
                    self.server.evict(w)
            for w in kept:
                self.rounds.submit(dispatches[w], ends[w])
            record = None
            for w in sorted(kept, key=lambda i: (ends[i], i)):
                d = dispatches[w]
                result: RoundResult = yield from self.take(w)
                if d.steps > 0 and computes[w] > 0:
                    self.server.observe_speed(w, d.steps / computes[w])
                t1 = now + self.clock.down(w)
                timing = self.timing(w, (now, t1), (t1, t1 + computes[w]), ends[w])
                self.record_round(result, now, ends[w], computes[w], timing if exact else None)
                self.traj.useful_seconds += computes[w]
                record = self.server.submit(result) or record
            self.traj.time = round_end
            if not kept:
                continue
            if record is None:
                raise RuntimeError("sync round ended without an update")
            self.record_update(record)
            self.maybe_eval()
        if self.budget_reached():
            self.traj.stopped_by = "tokens"
        return self.finish()


def simulation(
    server: Server,
    rounds: RoundSource,
    clock: Clock,
    evaluate: Evaluator,
    writer: MetricsWriter | None = None,
    stats: RunStats | None = None,
    progress: Callable[[EvalPoint], None] | None = None,
) -> Loop:
    """Drive ``server`` on the simulated clock until a budget is reached, taking rounds from
    ``rounds``; a generator that yields whenever the round it needs next is not ready.

    The server is told each worker's configured speed (1/pace) before the first dispatch, so
    DyLU applies from the first round; afterwards it sees the measured (jittered) speed.
    """
    k = len(clock.paces)
    if len(clock.comm_delays) != k:
        raise ValueError("clock needs one pace and one comm delay per worker")
    for w, pace in enumerate(clock.paces):
        server.observe_speed(w, 1.0 / pace)
    steps = [server.steps_for(w) for w in range(k)]
    recorder = Recorder(
        server,
        evaluate,
        writer or MetricsWriter(None),
        stats or RunStats(k),
        max(round_seconds(steps, clock.paces, clock.comm_delays, clock.exchange != "blocking")),
        clock.eval_every,
        clock.eval_unit,
        progress,
    )
    sim = _Sim(server, rounds, clock, recorder)
    traj: Trajectory = yield from (sim.run_sync() if server.cfg.synchronous else sim.run_async())
    return traj


def run_to_end(loop: Loop) -> Trajectory:
    """The trajectory of a loop whose rounds are always ready (it never waits)."""
    try:
        next(loop)
    except StopIteration as stop:
        return stop.value
    raise RuntimeError("the event loop waits for a round that nothing computes")


def simulate(
    server: Server,
    workers: Sequence[RoundRunner],
    clock: Clock,
    evaluate: Evaluator,
    writer: MetricsWriter | None = None,
    stats: RunStats | None = None,
    progress: Callable[[EvalPoint], None] | None = None,
) -> Trajectory:
    """Drive ``server`` and ``workers`` on the simulated clock until a budget is reached, each
    round computed by its worker when it arrives (see :func:`simulation`)."""
    if len(workers) != len(clock.paces):
        raise ValueError("clock needs one pace and one comm delay per worker")
    t0 = time.perf_counter()
    source: RoundSource = DirectRounds(workers)
    if clock.exchange == "streaming":
        source = StreamRounds(workers, server.fragments, clock.stream_alpha)  # type: ignore[arg-type]
    traj = run_to_end(simulation(server, source, clock, evaluate, writer, stats, progress))
    traj.loop_seconds = time.perf_counter() - t0
    return traj
