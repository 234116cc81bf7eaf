"""The server's ZeroMQ loop: a :class:`Coordinator` behind one listener per shard.

Workers connect out with DEALER sockets, so only the server needs a reachable port. Requests
are authenticated by :class:`heloco.net.listener.Listener` and answered by the coordinator;
with ``shards > 1`` every shard also has its own listener and thread (:mod:`heloco.net.shards`).
Between messages the loop evicts silent workers, closes grace windows and writes periodic
checkpoints; SIGTERM sets ``stop`` and the loop ends with a final checkpoint.

The endpoint builds its coordinator, handing it the endpoint itself as the coordinator's
storage (the shards' tensors) and, for durable serving, as its persistence (checkpoints): the
coordinator is complete when built, and nothing sets its attributes afterwards.
Dispatches are sent from θ's own memory; before an update writes θ, the parameters a reply
still sends are given fresh storage (copy on write, :meth:`heloco.net.shards.ShardState.unshare`).
"""

from __future__ import annotations

import sys
import threading
import time
from collections.abc import Callable, Sequence
from dataclasses import asdict, dataclass, fields
from pathlib import Path
from typing import Any, Protocol

import torch
import zmq
from pydantic import Field

from heloco.net import checkpoint, messages, wire
from heloco.net.coordinator import (
    Coordinator,
    Counters,
    DispatchStorage,
    Persistence,
    UpdateEvent,
    WorkerInfo,
)
from heloco.net.keys import ServerKeys
from heloco.net.listener import Listener
from heloco.net.messages import Count, Incarnation
from heloco.net.shards import (
    GroupRunner,
    ShardService,
    ShardState,
    part_sizes,
    plan_shards,
    shard_bind,
)
from heloco.net.wire import Message
from heloco.server import ServerState
from heloco.types import Delta, Dispatch
from shardmeter.errors import UserInputError

FINAL_LINGER_MS = 500  # at a normal end, the last replies (the byes' pongs) still go out
MAX_SHARDS = messages.MAX_SHARDS


FRAME_SLACK_BYTES = 4096  # per-frame transport overhead allowed above the payload (CURVE box)


@dataclass(frozen=True)
class EndpointConfig:
    """Socket, limits and checkpoint policy of a serving process.

    ``keys`` turns on CURVE: only allow-listed clients complete the handshake (None: any
    peer connects and only the HMAC guards it; for in-process tests and benchmarks).
    ``checkpoint_every`` counts outer updates (0: only at exit), ``checkpoint_every_s`` wall
    seconds (0: off). ``durable`` checkpoints after every update *before* the ack is sent, so
    an acknowledged push survives a crash (SIGKILL) of the server. ``drain_s`` is how long the
    server keeps answering ``done`` after the target revision so workers can leave cleanly.
    ``shards`` splits the tensors over that many sockets and threads (ports ``bind`` + i).
    """

    bind: str = "tcp://127.0.0.1:0"
    max_bytes: int = wire.DEFAULT_MAX_BYTES
    replay_window_s: float = 300.0
    poll_ms: int = 20
    checkpoint_dir: Path | None = None
    checkpoint_every: int = 0
    checkpoint_every_s: float = 0.0
    keep_checkpoints: int = 2
    durable: bool = False
    drain_s: float = 5.0
    keys: ServerKeys | None = None
    shards: int = 1

    def __post_init__(self) -> None:
        if not 1 <= self.shards <= MAX_SHARDS:
            raise UserInputError("--shards", self.shards, f"an integer in [1, {MAX_SHARDS}]")


class CoordinatorBuilder(Protocol):
    """Builds the coordinator an :class:`Endpoint` serves, given the endpoint's storage and
    persistence: ``functools.partial(Coordinator, server, budget, ...)`` is one."""

    def __call__(
        self, *, storage: DispatchStorage, persistence: Persistence | None
    ) -> Coordinator: ...


class Endpoint:
    """Serves one :class:`Coordinator` until its target revision is reached or ``stop`` is set.

    The endpoint builds its coordinator (``build``) with itself as the coordinator's
    :class:`DispatchStorage` (its shards hold the tensors it sends and stages) and, when
    ``durable``, as its :class:`Persistence` (a checkpoint before each ack)."""

    def __init__(
        self,
        build: CoordinatorBuilder,
        secret: bytes,
        cfg: EndpointConfig,
        extra_meta: Callable[[], dict[str, Any]] | None = None,
        check_extra: Callable[[dict[str, Any]], object] | None = None,
    ) -> None:
        """``extra_meta`` gives the serving session's own state to checkpoint (``extra``);
        ``check_extra`` checks a checkpoint's ``extra`` before it is loaded (raises if it
        is unusable, so the checkpoint is skipped)."""
        self.secret = secret
        self.cfg = cfg
        self.stop = threading.Event()
        # The coordinator reaches its storage and persistence only while serving, after this
        # constructor has built the shard state they use.
        self.coord = build(storage=self, persistence=self if cfg.durable else None)
        coord = self.coord
        server = coord.server
        self.state = ShardState(server, plan_shards(part_sizes(server.params), cfg.shards))
        server.before_write = self.state.unshare
        self.services = [ShardService(i, self.state, len(coord.workers)) for i in range(cfg.shards)]
        self.listeners = [self._listener(i) for i in range(cfg.shards)]
        self._threads: list[threading.Thread] = []
        self._runner: GroupRunner | None = None
        if self.sharded:
            self._runner = GroupRunner(self.state.plan)
            server.optimizer.runner = self._runner
        self._last_ckpt_rev = server.revision
        self._last_ckpt_time = time.monotonic()
        self.on_checkpoint: Callable[[Path], None] | None = None
        self.extra_meta = extra_meta
        self.check_extra = check_extra
        self.restored_extra: dict[str, Any] = {}
        self.restored_from: Path | None = None
        self.skipped: list[checkpoint.Skipped] = []
        self._last_ckpt_accepted = coord.counters.accepted

    def _listener(self, shard: int) -> Listener:
        leader = shard == 0
        return Listener(
            self.secret,
            shard_bind(self.cfg.bind, shard),
            self._answer if leader else self.services[shard].answer,
            max_bytes=self.cfg.max_bytes,
            frame_limit=self.frame_limit(shard),
            replay_window_s=self.cfg.replay_window_s,
            keys=self.cfg.keys,
            counters=self.coord.counters if leader else Counters(),
            params=lambda: self.coord.server.params,
            on_sent=self._sent(shard),
        )

    @property
    def address(self) -> str:
        """The leader's bound address ("" before :meth:`open`)."""
        return self.listeners[0].address

    def _answer(self, msg: Message, peer: str | None) -> Message | None:
        if msg.type in messages.SHARD_REQUESTS and self.cfg.shards > 1:
            return self.services[0].answer(msg, peer)
        return self.coord.handle(msg, peer)

    def _sent(
        self, shard: int
    ) -> Callable[[Message, Message, list[zmq.MessageTracker], dict[str, int]], None]:
        def sent(
            request: Message,
            reply: Message,
            trackers: list[zmq.MessageTracker],
            pinned: dict[str, int],
        ) -> None:
            if reply.type == "slice":
                worker, round_id = request.body["worker"], reply.body["round_id"]
                self.state.sent(shard, worker, round_id, trackers, pinned)
            else:
                self.state.track(trackers, pinned)

        return sent

    def handle_frames(
        self, frames: Sequence[wire.Frame], peer: str | None = None
    ) -> Message | None:
        """Authenticate, de-duplicate and answer one inbound message at the leader (None:
        dropped); ``peer`` is the allow-list name of the CURVE key of the connection."""
        return self.listeners[0].handle_frames(frames, peer)

    # -- the coordinator's storage (DispatchStorage) --------------------------------------------
    @property
    def sharded(self) -> bool:
        """Whether the tensors are split over more than one shard."""
        return self.cfg.shards > 1

    def serve_dispatch(self, dispatch: Dispatch) -> None:
        """Open the dispatch's views on every shard; the shards send its tensors."""
        self.state.open_view(dispatch)

    def staged(self, worker: int, round_id: int) -> Delta | None:
        """The Δ every shard has staged for the round (None: not all yet)."""
        return self.state.take(worker, round_id)

    def shard_info(self) -> list[dict[str, Any]]:
        """Per shard: its port and its tensors (for ``welcome``; the sockets are bound)."""
        return [
            {"port": int(listener.address.rsplit(":", 1)[1]), "tensors": names}
            for listener, names in zip(self.listeners, self.state.plan, strict=True)
        ]

    def shard_status(self) -> list[dict[str, Any]]:
        """Per shard: address, tensors, fp32 bytes and what its listener counted."""
        params = self.coord.server.params
        out = []
        for i, (names, listener) in enumerate(zip(self.state.plan, self.listeners, strict=True)):
            counted = {k: v for k, v in asdict(listener.counters).items() if v} if i else {}
            out.append(
                {
                    "shard": i,
                    "address": listener.address,
                    "tensors": len(names),
                    "bytes": sum(4 * params[k].numel() for k in names),
                    "counters": counted | self.services[i].counters,
                }
            )
        return out

    # -- checkpoints ------------------------------------------------------------------------
    def save_checkpoint(self) -> Path | None:
        """Server state (θ, optimizer, revision log) + coordinator counters, atomically.

        A failed write (a full disk) is counted (``checkpoint_failed``) and reported on
        stderr; the previous checkpoints stay intact and the server keeps serving. Returns
        None then, or without a checkpoint folder.
        """
        if self.cfg.checkpoint_dir is None:
            return None
        state = self.coord.server.state_dict(copy=False)  # written out before the next update
        meta = {
            "server": state.meta,
            "coordinator": coordinator_meta(self.coord),
            "extra": self.extra_meta() if self.extra_meta is not None else {},
        }
        self._last_ckpt_time = time.monotonic()  # a failed write is retried a period later
        try:
            path = checkpoint.save(
                self.cfg.checkpoint_dir,
                self.coord.server.revision,
                state.tensors,
                meta,
                self.cfg.keep_checkpoints,
            )
        except checkpoint.CheckpointError as exc:
            self.coord.counters.checkpoint_failed += 1
            print(f"heloco serve: warning: checkpoint not written: {exc}", file=sys.stderr)
            return None
        self._last_ckpt_rev = self.coord.server.revision
        self._last_ckpt_accepted = self.coord.counters.accepted
        if self.on_checkpoint is not None:
            self.on_checkpoint(path)
        return path

    def persist(self) -> bool:
        """Checkpoint unless the newest checkpoint already holds every accepted round
        (``durable``: called before each ack); False if the write failed."""
        accepted = self.coord.counters.accepted
        if (self._last_ckpt_rev, self._last_ckpt_accepted) == (
            self.coord.server.revision,
            accepted,
        ):
            return True
        return self.save_checkpoint() is not None

    def restore(self) -> bool:
        """Load the newest valid checkpoint under ``checkpoint_dir``; True if one was loaded.

        A corrupt or unusable newer checkpoint is skipped with a warning (and listed in
        ``skipped``) in favour of the previous one. If checkpoints exist and none is usable,
        the server refuses to start rather than silently start over.
        """
        if self.cfg.checkpoint_dir is None:
            return False
        live = self.coord.server.state_dict(copy=False).tensors
        layout = {k: tuple(v.shape) for k, v in live.items()}
        loaded, self.skipped = checkpoint.newest_valid(
            self.cfg.checkpoint_dir, lambda ck: self._restore_from(ck, layout)
        )
        for skip in self.skipped:
            print(
                f"heloco serve: warning: skipping checkpoint {skip.path}: {skip.reason}",
                file=sys.stderr,
            )
        if loaded is None and self.skipped:
            raise UserInputError(
                "checkpoint_dir",
                str(self.cfg.checkpoint_dir),
                f"a folder with a usable checkpoint ({len(self.skipped)} unusable, newest: "
                f"{self.skipped[0].reason}); move them away to start over",
            )
        return loaded is not None

    def _restore_from(self, ck: checkpoint.Checkpoint, layout: dict[str, tuple[int, ...]]) -> Path:
        """Check a loaded checkpoint against this server, then load it (raises if unusable)."""
        server_meta = ck.state.get("server")
        if not isinstance(server_meta, dict):
            raise checkpoint.CheckpointError("no server state")
        coord_meta = messages.parse(CoordinatorMeta, ck.state.get("coordinator"))
        if len(coord_meta.workers) != len(self.coord.workers):
            raise checkpoint.CheckpointError("written for a different number of workers")
        fixed = {k: tuple(v.shape) for k, v in ck.tensors.items() if not k.startswith("pending/")}
        if fixed != layout or any(t.dtype != torch.float32 for t in ck.tensors.values()):
            raise checkpoint.CheckpointError("tensors do not match this run's model and method")
        extra = ck.state.get("extra", {})
        if not isinstance(extra, dict):
            raise checkpoint.CheckpointError("'extra' is not an object")
        if self.check_extra is not None:
            self.check_extra(extra)
        self.coord.server.load_state_dict(ServerState(ck.tensors, server_meta))
        load_coordinator_meta(self.coord, coord_meta)
        self.restored_extra = dict(extra)
        self._last_ckpt_rev = self.coord.server.revision
        self._last_ckpt_accepted = self.coord.counters.accepted
        self.restored_from = ck.path
        return ck.path

    def after_update(self, event: UpdateEvent) -> None:
        """Checkpoint every ``checkpoint_every`` updates (``durable`` saves in :meth:`persist`)."""
        every = self.cfg.checkpoint_every
        if every > 0 and event.record.revision - self._last_ckpt_rev >= every:
            self.save_checkpoint()

    def _periodic(self) -> None:
        due_s = self.cfg.checkpoint_every_s
        if (
            due_s > 0
            and time.monotonic() - self._last_ckpt_time >= due_s
            and self.coord.server.revision != self._last_ckpt_rev
        ):
            self.save_checkpoint()

    # -- sockets ----------------------------------------------------------------------------
    def frame_limit(self, shard: int = 0) -> int:
        """Largest frame a peer may send to shard ``shard`` (``zmq.MAXMSGSIZE``): the header or
        its largest tensor in fp32, plus slack for what CURVE adds to a frame, never more than
        the whole-message limit. libzmq cuts the connection of a peer that announces a longer
        frame before buffering it."""
        params = self.coord.server.params
        largest = max((4 * params[k].numel() for k in self.state.plan[shard]), default=0)
        # + slack: libzmq checks the frame as sent, which under CURVE is the encrypted box
        # (plaintext + MAC + flags); without it a push whose largest tensor is exactly at the
        # limit, or over 1 MiB under CURVE, had its connection cut and never got a reply.
        return min(self.cfg.max_bytes, max(wire.MAX_HEADER_BYTES, largest) + FRAME_SLACK_BYTES)

    def open(self) -> str:
        """Bind every shard's socket; returns the leader's address (with the chosen port).

        With keys, each socket gets its own context whose ZAP handler admits only the
        allow-listed keys, during the handshake.
        """
        try:
            for listener in self.listeners:
                listener.open()
        except BaseException:
            self.close()
            raise
        return self.address

    def close(self, linger_ms: int = 0) -> None:
        """Stop the shards' threads, close every socket (sending queued replies for up to
        ``linger_ms``), stop the ZAP handlers and end the contexts."""
        for thread in self._threads:
            thread.join(timeout=10)
        self._threads = []
        for listener in self.listeners:
            listener.close(linger_ms)
        if self._runner is not None:
            self._runner.close()

    def _start_shards(self) -> None:
        for i, listener in enumerate(self.listeners[1:], start=1):
            thread = threading.Thread(
                target=listener.run,
                args=(self.stop, self.cfg.poll_ms),
                name=f"heloco-shard{i}",
                daemon=True,
            )
            thread.start()
            self._threads.append(thread)

    def serve(self) -> None:
        """Run until done (and drained) or stopped, then write a final checkpoint.

        An exception ends the loop *without* a checkpoint (the state may be mid-update); the
        last good checkpoint stays the one to resume from.
        """
        if not self.listeners[0].is_open:
            self.open()
        leader = self.listeners[0]
        self._start_shards()
        done_since: float | None = None
        try:
            while not self.stop.is_set():
                if leader.poll(self.cfg.poll_ms):
                    leader.drain()
                self.state.forget(self.coord.evict_silent())
                self.coord.flush_due()
                self._periodic()
                if self.coord.done:
                    done_since = done_since or time.monotonic()
                    idle = not self.coord.active_workers()
                    if idle or time.monotonic() - done_since > self.cfg.drain_s:
                        break
        except BaseException:
            self.stop.set()
            self.close()
            raise
        self.stop.set()
        self.save_checkpoint()
        self.close(linger_ms=FINAL_LINGER_MS)


def coordinator_meta(coord: Coordinator) -> dict[str, Any]:
    """JSON state of the coordinator kept across restarts (tokens, counters, worker stats)."""
    workers = [asdict(w) | {"active": False, "last_seen": 0.0} for w in coord.workers]
    for w in workers:
        w["last_loss"] = None if w["last_loss"] != w["last_loss"] else w["last_loss"]
    return {
        "tokens": coord.tokens,
        "elapsed": coord.elapsed(),
        "counters": asdict(coord.counters),
        "workers": workers,
    }


class WorkerMeta(messages.Strict):
    """One worker slot as checkpointed (:class:`WorkerInfo`)."""

    worker: Count
    incarnation: Incarnation = ""
    active: bool = False
    last_seen: float = Field(0.0, ge=0)
    pulls: Count = 0
    accepted: Count = 0
    applied: Count = 0
    staleness_sum: Count = 0
    steps: Count = 0
    tokens: Count = 0
    last_loss: float | None = None


class CoordinatorMeta(messages.Strict):
    """The coordinator's checkpointed state, validated before it is loaded."""

    tokens: Count
    elapsed: float = Field(ge=0)
    counters: dict[str, Count]
    workers: list[WorkerMeta]


def load_coordinator_meta(coord: Coordinator, meta: CoordinatorMeta) -> None:
    """Inverse of :func:`coordinator_meta`; wall time continues from the saved elapsed time.

    The counters and worker records are loaded into the coordinator's own objects, never
    replaced: the listeners hold the same :class:`Counters` and keep counting into it.
    Arrivals an asynchronous server had buffered in a grace window get a new window."""
    coord.control.load_state_dict({"tokens": meta.tokens})
    coord.resume_clock(meta.elapsed)
    coord.counters.load(meta.counters)
    if len(meta.workers) != len(coord.workers):
        raise ValueError("checkpoint was written for a different number of workers")
    for info, w in zip(coord.workers, meta.workers, strict=True):
        saved = w.model_dump() | {"last_loss": float("nan") if w.last_loss is None else w.last_loss}
        for f in fields(WorkerInfo):
            setattr(info, f.name, saved[f.name])
    if coord.server.window_ready() and not coord.server.cfg.synchronous:
        coord.control.open_grace(coord.elapsed())  # the checkpoint's buffered arrivals
