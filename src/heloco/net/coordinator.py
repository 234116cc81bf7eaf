"""The server's message logic: a :class:`heloco.server.Server` behind authenticated messages.

Transport-free: :meth:`Coordinator.handle` maps one decoded request to one reply, so the ZeroMQ
loop (:mod:`heloco.net.endpoint`) stays a thin shell and the logic is testable in process.
Requests (worker → server) and replies:

``hello``     → ``welcome`` {run, heartbeat_s, revision}   (run: the run config the worker builds)
``pull``      → ``dispatch`` {revision, steps, round_id[, fragment]} + fp32 params | ``wait``
              | ``done`` (streaming: the params are every tensor or one fragment's)
``push``      → ``ack`` {revision, applied, duplicate, staleness} | ``rejected`` {reason}
              (staleness τ = revision at arrival − base revision, as in the revision log;
              None while the round waits for a barrier or grace window)
``heartbeat`` → ``pong`` {revision, done}
``status``    → ``status`` (see :meth:`Coordinator.status`)
``bye``       → ``pong``
``slot``      → ``slot`` {revision} | ``wait`` (with ``link_slots``: the server's link for one push,
              first come first served; :class:`Turns`)
Every body is validated by its model in :mod:`heloco.net.messages` first. Malformed or
invalid requests get ``error`` {reason, detail}; nothing invalid is applied or stored.
"""

from __future__ import annotations

import dataclasses
import math
import re
import time
from collections.abc import Callable
from dataclasses import asdict, dataclass, field
from typing import Any, Protocol

from heloco.net import compress, messages, wire
from heloco.net.wire import Message, WireError
from heloco.run import Budget, RunControl
from heloco.server import Server, SubmissionRejected, UpdateRecord
from heloco.types import Delta, Dispatch, RoundResult, RoundTiming, tensor_bytes

WORKER_KEY = re.compile(r"worker(\d+)")  # allow-list name bound to one worker slot
SLOT_POLL_S = 0.01  # seconds a worker waits before asking for the server's link again


@dataclass
class Counters:
    """What the server dropped, rejected and accepted since it started (status + summary)."""

    bad_mac: int = 0
    replay: int = 0
    stale: int = 0
    too_large: int = 0
    malformed: int = 0
    bad_update: int = 0
    rejected: int = 0
    fenced: int = 0
    duplicate: int = 0
    accepted: int = 0
    evictions: int = 0
    rejoins: int = 0
    forbidden: int = 0
    checkpoint_failed: int = 0

    def load(self, values: dict[str, int]) -> None:
        """Set the counts a checkpoint holds in place (every holder of this object sees them);
        counts this version does not know are ignored, counts the checkpoint lacks become 0."""
        for f in dataclasses.fields(self):
            setattr(self, f.name, int(values.get(f.name, 0)))


@dataclass
class WorkerInfo:
    """The server's view of one worker slot."""

    worker: int
    incarnation: str = ""
    active: bool = False
    last_seen: float = 0.0
    pulls: int = 0
    accepted: int = 0
    applied: int = 0
    staleness_sum: int = 0
    steps: int = 0
    tokens: int = 0
    last_loss: float = math.nan


class Turns:
    """One direction of a shared link, one transfer at a time, first come first served.

    :meth:`ask` grants the turn to worker ``w`` if nobody holds it and nobody asked before
    ``w`` (else ``w`` joins the queue once, keeping its place when it asks again); a holder
    that asks again (its grant's reply was lost) keeps it. :meth:`release` ends ``w``'s turn
    and drops it from the queue."""

    def __init__(self) -> None:
        self.holder: int | None = None
        self.queue: list[int] = []

    def ask(self, w: int) -> bool:
        """Whether worker ``w`` may send now (it then holds the turn)."""
        if self.holder == w:
            return True
        if self.holder is None and (not self.queue or self.queue[0] == w):
            self.holder = w
            if self.queue:
                self.queue.pop(0)
            return True
        if w not in self.queue:
            self.queue.append(w)
        return False

    def release(self, w: int) -> None:
        """Worker ``w``'s transfer arrived, or it is gone."""
        if self.holder == w:
            self.holder = None
        if w in self.queue:
            self.queue.remove(w)


@dataclass(frozen=True)
class UpdateEvent:
    """One applied outer update with the wall time it happened and the tokens so far."""

    record: UpdateRecord
    time: float
    tokens: int


class DispatchStorage(Protocol):
    """Where a serving process keeps the tensors it sends and receives (the endpoint's
    shards, :mod:`heloco.net.shards`). Dispatch replies then carry θ's own tensors, which the
    storage keeps from being written while the transport sends them."""

    @property
    def sharded(self) -> bool:
        """Whether shards send dispatches and stage pushes (else the messages carry them)."""
        ...

    def serve_dispatch(self, dispatch: Dispatch) -> None:
        """Sharded: have the shards send this dispatch's tensors (the reply carries none)."""
        ...

    def staged(self, worker: int, round_id: int) -> Delta | None:
        """Sharded: the Δ every shard holds for this round (None: not all staged yet)."""
        ...

    def shard_info(self) -> list[dict[str, Any]]:
        """Sharded: each shard's port and tensors, for ``welcome``."""
        ...

    def shard_status(self) -> list[dict[str, Any]]:
        """Sharded: each shard's address, tensors, bytes and counters, for ``status``."""
        ...


class Persistence(Protocol):
    """Durable serving: what the server has accepted survives a crash before it is acked."""

    def persist(self) -> bool:
        """Make the state so far durable; False if that failed (the push is then not acked)."""
        ...


@dataclass
class Coordinator:
    """Drives ``server`` from requests; stops dispatching once the budget is reached.

    The budget, the tokens counted against it, grace windows and the start barrier are the
    run's :class:`heloco.run.RunControl` (``control``), the policy the simulator follows too,
    driven here with wall seconds since ``t0``. In sync mode a barrier that is partly filled when the budget is reached is completed first
    (the simulator checks its budget between rounds); buffered grace-window arrivals are
    flushed at the budget (as in the simulator).

    A fresh run (revision 0) with ``wait_for_workers_s > 0`` starts together: pulls are
    answered ``wait`` until every worker slot has pulled once, or that many seconds after the
    first pull, and the clock (``t0``) restarts then, as the simulator starts all workers at
    time 0. ``max_tokens_per_step`` bounds the tokens a push may claim per inner step.

    Both are given at construction, by the serving process (:class:`heloco.net.endpoint.Endpoint`
    builds its coordinator): ``storage`` (:class:`DispatchStorage`) holds the tensors the
    transport sends and stages; with it, dispatch replies carry θ's own tensors (no copy) and
    a sharded storage sends them from its shards and stages pushes there. ``persistence``
    (:class:`Persistence`, durable serving) makes each accepted round survive a crash before
    its ack. Without them (in-process use) replies carry copies and nothing is persisted.

    ``link_slots`` (a server whose one link every worker shares): the workers take turns on
    it for their pushes (:class:`Turns`), so pushes cross it one at a time, whole, first come
    first served: a worker asks (``slot``) before each push and sends its bytes once granted;
    its turn ends when the push arrives. Dispatches take no turns: each follows its worker's
    push, so turns spread them too (docs/wan.md, "Shared server link").

    ``on_update`` is called after each applied update (metrics, evaluation, durable
    checkpoints); ``on_round`` after each accepted round with (worker, round_id, steps, tokens,
    loss, start, end, timing) in wall seconds since ``t0`` (timing: :func:`measured_timing`,
    None where the push carries no timing).
    """

    server: Server
    budget: Budget
    run: dict[str, Any] = field(default_factory=dict)
    heartbeat_s: float = 2.0
    evict_after_s: float = 10.0
    on_update: Callable[[UpdateEvent], None] | None = None
    on_round: (
        Callable[[int, int, int, int, float, float, float, RoundTiming | None], None] | None
    ) = None
    on_event: Callable[[dict[str, Any]], None] | None = None
    clock: Callable[[], float] = time.time
    t0: float = field(default_factory=time.time)
    max_tokens_per_step: int | None = None
    wait_for_workers_s: float = 0.0
    storage: DispatchStorage | None = None
    persistence: Persistence | None = None
    link_slots: bool = False

    def __post_init__(self) -> None:
        n = self.server.cfg.n_workers
        self.workers = [WorkerInfo(w) for w in range(n)]
        self.counters = Counters()
        self.control = RunControl(
            self.budget, self.server.cfg.grace_window, n, self.wait_for_workers_s
        )
        self._shapes = {k: tuple(v.shape) for k, v in self.server.params.items()}
        # (worker, round id) -> (run seconds it was dispatched, its revision)
        # (worker, round id) -> (sent at, revision, its tensors' fp32 bytes) of a dispatch
        self._dispatch_time: dict[tuple[int, int], tuple[float, int, int]] = {}
        self.push_turns = Turns()  # link_slots: the link towards the server (pushes)
        self._asked: dict[int, float] = {}  # link_slots: a waiting worker's first ask (run s)

    @property
    def tokens(self) -> int:
        """Training tokens of the accepted rounds (counted by ``control``)."""
        return self.control.tokens

    @property
    def started(self) -> bool:
        """Whether the run has started (its start barrier is open)."""
        return self.control.started

    @property
    def _shards(self) -> DispatchStorage | None:
        """The storage if it is sharded (its shards send dispatches and stage pushes)."""
        return self.storage if self.storage is not None and self.storage.sharded else None

    def _start_barrier(self, worker: int) -> bool:
        """Whether dispatching may begin (see the class doc); opens the barrier when due."""
        if self.control.started:
            return True
        now = self.clock()
        if self.control.request(worker, now - self.t0):
            if self.server.revision == 0 and self.tokens == 0:
                self.t0 = now
            workers = sorted(self.control.ready)
            self._emit({"type": "start", "workers": workers, "time": self.elapsed()})
        return self.control.started

    # -- state ------------------------------------------------------------------------------
    def budget_reached(self) -> bool:
        """Whether the run's token, wall-clock or revision budget is used up."""
        return self.control.reached(self.elapsed(), self.server.revision)

    @property
    def done(self) -> bool:
        """Budget reached and no accepted round still waiting for a barrier."""
        return self.budget_reached() and not self.server.pending_workers

    def elapsed(self) -> float:
        """Seconds since the coordinator started (its own clock)."""
        return self.clock() - self.t0

    def resume_clock(self, elapsed: float) -> None:
        """Continue a restored run's clock: :meth:`elapsed` is ``elapsed`` now."""
        self.t0 = self.clock() - elapsed

    def _emit(self, payload: dict[str, Any]) -> None:
        if self.on_event is not None:
            self.on_event(payload)

    # -- liveness ---------------------------------------------------------------------------
    def _seen(self, worker: int, incarnation: str) -> WorkerInfo:
        """Mark ``worker`` alive; a newer incarnation (process) of its slot takes over.

        Incarnations start with the process's start time (zero-padded nanoseconds), so they
        order by age: a message from an *older* process than the registered one is fenced off
        with ``error: replaced`` (two live processes never share a slot), while a newer one
        takes the slot over even if the server lost its hello in a crash.
        """
        info = self.workers[worker]
        if info.incarnation and incarnation and incarnation < info.incarnation:
            self.counters.fenced += 1
            raise WireError("replaced", f"a newer process serves worker {worker}")
        if info.incarnation and incarnation and incarnation != info.incarnation:
            self.counters.rejoins += 1
            self.release_link(worker)  # the old process's grant or place dies with it
            if self.server.fragments:  # streaming: the new process holds no fragments
                self.server.restart(worker)
            self._emit(
                {"type": "worker", "event": "replaced", "worker": worker, "time": self.elapsed()}
            )
        elif not info.active and info.incarnation:
            self.counters.rejoins += 1
            self._emit(
                {"type": "worker", "event": "rejoined", "worker": worker, "time": self.elapsed()}
            )
        elif not info.incarnation:
            self._emit(
                {"type": "worker", "event": "joined", "worker": worker, "time": self.elapsed()}
            )
        info.incarnation = incarnation or info.incarnation
        info.active = True
        info.last_seen = self.clock()
        return info

    def evict_silent(self) -> list[int]:
        """Mark workers silent for longer than ``evict_after_s`` as gone; returns their ids.

        Async: their outstanding round stays valid in the server, so a worker that comes back
        may still push it, and a replacement's first pull supersedes it. Sync: the server
        cancels the round (:meth:`Server.evict`) so the barrier shrinks to the live workers
        and is applied if they have all arrived; the worker rejoins at its next pull.
        """
        now = self.clock()
        gone = []
        for info in self.workers:
            if info.active and now - info.last_seen > self.evict_after_s:
                info.active = False
                self.counters.evictions += 1
                gone.append(info.worker)
                self.release_link(info.worker)
                self._emit(
                    {
                        "type": "worker",
                        "event": "evicted",
                        "worker": info.worker,
                        "time": self.elapsed(),
                        "silent_s": now - info.last_seen,
                    }
                )
                if self.server.cfg.synchronous:
                    record = self.server.evict(info.worker)
                    if record is not None:
                        self._applied(record)
        return gone

    def active_workers(self) -> list[int]:
        """Slots of the workers currently considered alive."""
        return [w.worker for w in self.workers if w.active]

    # -- grace windows ----------------------------------------------------------------------
    def flush_due(self) -> list[UpdateEvent]:
        """Apply buffered async arrivals whose grace window has closed."""
        window = self.server.cfg.grace_window
        if self.server.cfg.quorum and self.server.pending_workers and self.budget_reached():
            self.control.close_grace()  # the budget: merge what is buffered, quorum or not
            return [self._applied(r) for r in self.server.flush(final=True)]
        if window <= 0 or self.server.cfg.synchronous or self.control.grace_end is None:
            return []
        if not self.control.grace_closes_before(self.elapsed()) and not self.budget_reached():
            return []
        self.control.close_grace()
        return [self._applied(r) for r in self.server.flush()]

    # -- requests ---------------------------------------------------------------------------
    def handle(self, msg: Message, peer: str | None = None) -> Message:
        """One reply for one authenticated request.

        The body is validated against the request's model (:mod:`heloco.net.messages`) before
        anything reads it; only ``push`` may carry tensors. ``peer`` is the name the transport
        authenticated (a CURVE key's allow-list name): a key named ``worker<i>`` may speak
        only for slot ``i``.
        """
        model = messages.REQUESTS.get(msg.type)
        if model is None:
            self.counters.malformed += 1
            return error(msg, "unknown_type", f"unknown message type {msg.type[:32]!r}")
        try:
            if msg.tensors and msg.type not in messages.TENSOR_REQUESTS:
                raise WireError("malformed", f"a {msg.type!r} request carries no tensors")
            try:
                body = messages.parse(model, msg.body)
            except messages.InvalidMessage as exc:
                raise WireError("malformed", f"{msg.type}: {exc}") from None
            if isinstance(body, messages.Ident):
                check_peer(peer, body.worker)
            return self._answer(msg, body)
        except WireError as exc:
            if exc.reason == "bad_update":
                self.counters.bad_update += 1
            elif exc.reason == "forbidden":
                self.counters.forbidden += 1
            elif exc.reason not in ("replaced", "unstaged"):
                self.counters.malformed += 1
            return error(msg, exc.reason, str(exc))

    def _answer(self, msg: Message, body: Any) -> Message:
        if isinstance(body, messages.Push):
            return self._push(msg, body)
        if isinstance(body, messages.Ident):
            handler = {
                "hello": self._hello,
                "pull": self._pull,
                "heartbeat": self._heartbeat,
                "slot": self._link_slot,
            }
            return handler.get(msg.type, self._bye)(msg, body)
        return wire.make("status", self.status(), re=msg.id)

    def _slot(self, body: messages.Ident) -> int:
        if not body.worker < len(self.workers):
            raise WireError("bad_worker", f"worker {body.worker} not in [0, {len(self.workers)})")
        return body.worker

    def _hello(self, msg: Message, body: messages.Ident) -> Message:
        info = self._seen(self._slot(body), body.incarnation)
        welcome = {
            "run": self.run,
            "heartbeat_s": self.heartbeat_s,
            "revision": self.server.revision,
            "n_workers": len(self.workers),
            "worker_steps": info.steps,
        }
        if self._shards is not None:
            welcome["shards"] = self._shards.shard_info()
        if self.link_slots:
            welcome["link_slots"] = True
        return wire.make("welcome", welcome, re=msg.id)

    def _heartbeat(self, msg: Message, body: messages.Ident) -> Message:
        self._seen(self._slot(body), body.incarnation)
        return wire.make("pong", {"revision": self.server.revision, "done": self.done}, re=msg.id)

    def _bye(self, msg: Message, body: messages.Ident) -> Message:
        w = self._slot(body)
        self._seen(w, body.incarnation)
        self.workers[w].active = False
        self.release_link(w)
        self._emit({"type": "worker", "event": "left", "worker": w, "time": self.elapsed()})
        return wire.make("pong", {"revision": self.server.revision, "done": self.done}, re=msg.id)

    # -- the shared link, one transfer per direction at a time (link_slots) ----------------
    def _link_slot(self, msg: Message, body: messages.Ident) -> Message:
        """Grant worker ``w`` the link towards the server for its next push, or tell it to
        wait (:class:`Turns`). Without ``link_slots`` (or once the run is over) at once. A
        grant is a ``turn`` event: ``asked`` when its first ask arrived, ``time`` granted."""
        w = self._slot(body)
        self._seen(w, body.incarnation)
        now, held = self.elapsed(), self.push_turns.holder == w
        if not self.link_slots or self.done or self.push_turns.ask(w):
            asked = self._asked.pop(w, now)
            if self.link_slots and not self.done and not held:  # not a lost grant's re-ask
                self._emit({"type": "turn", "worker": w, "asked": asked, "time": now})
            return wire.make("slot", {"revision": self.server.revision}, re=msg.id)
        self._asked.setdefault(w, now)
        return wire.make(
            "wait", {"retry_s": SLOT_POLL_S, "revision": self.server.revision}, re=msg.id
        )

    def release_link(self, worker: int) -> None:
        """Worker ``worker`` is gone (left, evicted, replaced): its turn and place go."""
        self.push_turns.release(worker)
        self._asked.pop(worker, None)

    def _pull(self, msg: Message, body: messages.Ident) -> Message:
        w = self._slot(body)
        info = self._seen(w, body.incarnation)
        if self.done:
            return wire.make("done", {"revision": self.server.revision}, re=msg.id)
        if not self._start_barrier(w):
            return wire.make("wait", {"retry_s": 0.1, "revision": self.server.revision}, re=msg.id)
        if w in self.server.pending_workers and self.server.holds_workers:
            # Sync barrier or grace window still open: the next model does not exist yet.
            return wire.make("wait", {"retry_s": 0.05, "revision": self.server.revision}, re=msg.id)
        d = self.server.dispatch(w, copy=self.storage is None)
        info.pulls += 1
        # A new dispatch supersedes the worker's older rounds: forget their start times, but
        # the last one's (an overlapped round trains from it while this one travels).
        mine = sorted(k for k in self._dispatch_time if k[0] == w)
        for key in mine[:-1]:
            del self._dispatch_time[key]
        self._dispatch_time[(w, d.round_id)] = (self.elapsed(), d.revision, tensor_bytes(d.params))
        reply = {"revision": d.revision, "steps": d.steps, "round_id": d.round_id}
        if d.fragment is not None:
            reply["fragment"] = d.fragment
        if self._shards is not None:
            self._shards.serve_dispatch(d)
            return wire.make("dispatch", reply, re=msg.id)
        return wire.make("dispatch", reply, d.params, codec="fp32", re=msg.id)

    def _trained_from(self, w: int, body: messages.Push) -> tuple[float, int, int] | None:
        """The dispatch an accepted round trained from (when it was sent, in run seconds; its
        revision; its bytes): the one it answers, or (overlapped) the one before, whose
        revision it names as its base; streaming, the one before (a fragment's, or the full
        one of its first sub-round)."""
        own = self._dispatch_time.get((w, body.round_id))
        if body.fragment is not None:  # streaming: it trained after the dispatch before
            return self._dispatch_time.get((w, body.round_id - 1), own)
        if own is not None and own[1] == body.base_revision:
            return own
        before = [v for k, v in self._dispatch_time.items() if k[0] == w and k[1] < body.round_id]
        before = [v for v in before if v[1] == body.base_revision]
        return before[-1] if before else None

    def _header_result(self, w: int, body: messages.Push) -> RoundResult:
        """The push's round without its pseudo-gradient (enough for the revision-log check)."""
        return RoundResult(
            worker=w,
            delta={},
            steps=body.steps,
            tokens=body.tokens,
            mean_loss=math.nan if body.mean_loss is None else body.mean_loss,
            base_revision=body.base_revision,
            round_id=body.round_id,
            fragment=body.fragment,
        )

    def _check_fragment(self, body: messages.Push) -> list[str] | None:
        """Streaming: the tensor names of the push's fragment, after checking its index
        against the server's P (before any tensor is decoded); None for whole-model pushes,
        which a streaming server refuses, as a non-streaming one refuses a fragment."""
        parts = self.server.fragments
        if not parts:
            if body.fragment is not None:
                raise WireError("malformed", "push.fragment: this run does not stream fragments")
            return None
        if body.fragment is None:
            raise WireError("malformed", "push.fragment: required (exchange = 'streaming')")
        if not body.fragment < len(parts):
            raise WireError("malformed", f"push.fragment: {body.fragment} not in [0, {len(parts)})")
        return parts[body.fragment]

    def _check_claims(self, w: int, body: messages.Push) -> None:
        """A round's claims are bounded by its dispatch: no more inner steps than it was
        given, no more tokens than those steps hold (``max_tokens_per_step``)."""
        steps = self.server.dispatched_steps(w)
        if steps is not None and body.steps > steps:
            raise WireError("malformed", f"push steps {body.steps} > dispatched {steps}")
        limit = self.max_tokens_per_step
        if limit is not None and body.tokens > body.steps * limit:
            raise WireError(
                "malformed", f"push tokens {body.tokens} > {body.steps} steps x {limit} per step"
            )

    def _delta_of(
        self, msg: Message, worker: int, round_id: int, names: list[str] | None = None
    ) -> Delta:
        """The push's Δ: its own tensors, or (sharded, a push without tensors) the parts the
        shards have staged; ``unstaged`` until every shard holds its part. ``names``: a
        streaming push's fragment (its tensors exactly)."""
        shards = self._shards
        if shards is None or msg.tensors:
            return self._checked_delta(msg, names)
        delta = shards.staged(worker, round_id)
        if delta is None:
            raise WireError("unstaged", f"stage round {round_id} on every shard, then push")
        return delta

    def _checked_delta(self, msg: Message, names: list[str] | None = None) -> Delta:
        """The pseudo-gradient, decoded as the outer step reads it (:class:`compress.Decoded`);
        wrong names, wrong shapes or non-finite values raise. ``names``: the tensors it must
        hold (a streaming fragment's; default every parameter).

        Finiteness is read from the wire form (:func:`compress.is_finite`), so the server
        need not check the decoded tensors again."""
        want = list(self._shapes) if names is None else names
        if set(msg.tensors) != set(want):
            missing = sorted(set(want) - set(msg.tensors))[:3]
            extra = sorted(set(msg.tensors) - set(want))[:3]
            raise WireError(
                "bad_update", f"parameter names differ: missing {missing}, extra {extra}"
            )
        for name, enc in msg.tensors.items():
            if enc.shape != self._shapes[name]:
                raise WireError("bad_update", f"{name}: shape {enc.shape} != {self._shapes[name]}")
            if not compress.is_finite(enc):
                raise WireError("bad_update", f"{name}: non-finite values")
        return compress.Decoded({name: msg.tensors[name] for name in want})

    def _push(self, msg: Message, body: messages.Push) -> Message:
        w = self._slot(body)
        info = self._seen(w, body.incarnation)
        self.push_turns.release(w)  # its bytes have crossed the link, whatever the answer
        names = self._check_fragment(body)
        probe = self._header_result(w, body)
        if self.budget_reached() and not (
            self.server.cfg.synchronous and self.server.pending_workers
        ):
            self.counters.rejected += 1
            return wire.make(
                "rejected", {"reason": "done", "revision": self.server.revision}, re=msg.id
            )
        try:
            # Check the revision log before paying for decoding a rejected or replayed round.
            reason = self.server.check(probe, validated=True)  # the probe carries no delta yet
            if reason is not None:
                raise SubmissionRejected(reason, w, probe.round_id)
            self._check_claims(w, body)
            delta = self._delta_of(msg, w, body.round_id, names)
            result = dataclasses.replace(probe, delta=delta)
            record = self.server.accept(result)  # checked above; nothing changed since
        except SubmissionRejected as exc:
            if exc.reason == "duplicate":
                # A retried push whose first copy was applied (its ack was lost): answer again.
                self.counters.duplicate += 1
                return wire.make(
                    "ack",
                    {
                        "revision": self.server.revision,
                        "applied": True,
                        "duplicate": True,
                        "staleness": None,
                    },
                    re=msg.id,
                )
            self.counters.rejected += 1
            return wire.make(
                "rejected", {"reason": exc.reason, "revision": self.server.revision}, re=msg.id
            )
        self.counters.accepted += 1
        info.accepted += 1
        info.tokens += result.tokens
        info.steps += result.steps
        info.last_loss = result.mean_loss
        self.control.count(result.tokens)
        if body.compute_s is not None:
            self.server.observe_speed(w, result.steps / body.compute_s)
        own = self._dispatch_time.get((w, body.round_id))
        answered_revision = own[1] if own is not None else result.base_revision
        source = self._trained_from(w, body)
        start = None if source is None else source[0]
        end = self.elapsed()
        timing = None
        if source is not None and body.recv_s is not None and body.lead_s is not None:
            sent = sum(enc.nbytes for enc in msg.tensors.values()) or None  # None: staged
            timing = measured_timing(
                source[0], end, body.recv_s, body.lead_s, body.compute_s or 0.0,
                source[2], sent, body.compute_from_s,
            )  # fmt: skip
        shown = 0.0 if start is None else start
        if timing is not None and (
            result.base_revision != answered_revision or result.fragment is not None
        ):
            # overlapped: the round began at its boundary, a round after its dispatch came
            shown = timing.compute_start
        if self.on_round is not None:
            self.on_round(
                w,
                body.round_id,
                result.steps,
                result.tokens,
                result.mean_loss,
                shown,
                end,
                timing,
            )
        if record is None and not self.server.cfg.synchronous and self.server.window_ready():
            self.control.open_grace(self.elapsed())
        if record is not None:
            self._applied(record)
        if self.persistence is not None and not self.persistence.persist():
            # Applied (or buffered) but not on disk: no ack, so no promise a crash would break.
            detail = "accepted but the checkpoint failed; not acknowledged"
            return wire.make("error", {"reason": "not_durable", "detail": detail}, re=msg.id)
        return wire.make(
            "ack",
            {
                "revision": self.server.revision,
                "applied": record is not None,
                "duplicate": False,
                "staleness": _staleness_of(record, w, body.round_id),
            },
            re=msg.id,
        )

    def _applied(self, record: UpdateRecord) -> UpdateEvent:
        for arrival in record.arrivals:  # staleness as the revision log has it (spec 1.1, τ)
            self.workers[arrival.worker].applied += 1
            self.workers[arrival.worker].staleness_sum += arrival.staleness
        event = UpdateEvent(record, self.elapsed(), self.tokens)
        if self.on_update is not None:
            self.on_update(event)
        return event

    # -- status -----------------------------------------------------------------------------
    def status(self) -> dict[str, Any]:
        """Revision, workers (alive, accepted rounds, mean staleness), throughput, counters."""
        elapsed = max(self.elapsed(), 1e-9)
        now = self.clock()
        workers = [
            {
                "worker": i.worker,
                "active": i.active,
                "silent_s": round(now - i.last_seen, 3) if i.last_seen else None,
                "accepted": i.accepted,
                "mean_staleness": i.staleness_sum / i.applied if i.applied else None,
                "last_loss": i.last_loss if math.isfinite(i.last_loss) else None,
                "speed": self.server.speeds[i.worker],
            }
            for i in self.workers
        ]
        return {
            "revision": self.server.revision,
            "budget": asdict(self.budget),
            "done": self.done,
            "log_length": len(self.server.log),
            "logged_rounds": sum(len(r.arrivals) for r in self.server.log),
            "pending": self.server.pending_workers,
            "elapsed_s": elapsed,
            "updates_per_s": self.server.revision / elapsed,
            "tokens": self.tokens,
            "tokens_per_s": self.tokens / elapsed,
            "workers": workers,
            "counters": asdict(self.counters),
            **({"shards": self._shards.shard_status()} if self._shards is not None else {}),
        }


def _staleness_of(record: UpdateRecord | None, worker: int, round_id: int) -> int | None:
    """Staleness of ``worker``'s round in ``record``, as logged (None: not applied yet)."""
    if record is None:
        return None
    for a in record.arrivals:
        if a.worker == worker and a.round_id == round_id:
            return a.staleness
    return None


def check_peer(peer: str | None, worker: int) -> None:
    """A ``worker<i>`` key speaks only for slot ``i``; other allowed names for any slot."""
    if peer is None:
        return
    match = WORKER_KEY.fullmatch(peer)
    if match is not None and int(match.group(1)) != worker:
        raise WireError("forbidden", f"key {peer!r} may not speak for worker {worker}")


def error(msg: Message, reason: str, detail: str) -> Message:
    """An ``error`` reply to ``msg``."""
    return wire.make("error", {"reason": reason, "detail": detail[:500]}, re=msg.id)


def measured_timing(
    start: float,
    end: float,
    recv_s: float,
    lead_s: float,
    compute_s: float,
    bytes_received: int | None,
    bytes_sent: int | None,
    compute_from_s: float | None = None,
) -> RoundTiming:
    """A blocking round's receive, compute and send on the run's clock, from what the worker
    measured on its own clock.

    The server knows when it dispatched (``start``) and when it had the push (``end``, its
    ack leaves then); the worker, counting from sending its pull, when the dispatch was
    decoded (``recv_s``) and when the push began (``lead_s``), and its compute
    (``compute_s``, ending as the push begins). Its pull's send is placed at ``start`` (the
    pull request's own transit, a small message, is counted in the receive), so: receive =
    [start, start + recv_s], compute = [send_start − compute_s, send_start], send =
    [start + lead_s, end], each clamped into [start, end] and in order (seconds). The gap
    between receive and compute (loading θ, saving state) is idle. An overlapped round
    (:mod:`heloco.overlap`) trained from the dispatch before the one it answers, so ``start``
    is that dispatch's, and it sends ``compute_from_s`` (from the pull to its first step):
    compute = [start + compute_from_s, + compute_s], clamped into [receive end, send start];
    its wait for the next dispatch between compute and send is idle.
    """
    recv_end = min(end, start + recv_s)
    send_start = min(end, max(recv_end, start + lead_s))
    compute_start = max(recv_end, send_start - compute_s)
    compute_end = send_start
    if compute_from_s is not None:  # overlapped: it began at its boundary, maybe waited after
        compute_start = min(send_start, max(recv_end, start + compute_from_s))
        compute_end = min(send_start, compute_start + compute_s)
    return RoundTiming(
        recv_start=start,
        recv_end=recv_end,
        compute_start=compute_start,
        compute_end=compute_end,
        send_start=send_start,
        send_end=end,
        bytes_sent=bytes_sent,
        bytes_received=bytes_received,
    )
