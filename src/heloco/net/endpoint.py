"""The server's ZeroMQ loop: a ROUTER socket in front of a :class:`Coordinator`.

Workers connect out with DEALER sockets, so only the server needs a reachable port. Every
inbound message is size-checked (``zmq.MAXMSGSIZE`` per frame, then the whole message), then
its HMAC is verified, then its id and timestamp go through the replay guard; failures are
counted and dropped without a reply (bad tag, replay) or answered with an ``error`` (too large).
Between messages the loop evicts silent workers, closes grace windows and writes periodic
checkpoints; SIGTERM sets ``stop`` and the loop ends with a final checkpoint.
"""

from __future__ import annotations

import re
import sys
import threading
import time
from collections.abc import Callable, Sequence
from dataclasses import asdict, dataclass, fields
from pathlib import Path
from typing import Any

import torch
import zmq
from pydantic import Field

from heloco.net import auth, checkpoint, messages, wire
from heloco.net.coordinator import Coordinator, Counters, UpdateEvent, WorkerInfo, error
from heloco.net.keys import AllowList, ServerKeys, serve_securely
from heloco.net.messages import Count, Incarnation
from heloco.net.wire import Message, WireError
from heloco.server import ServerState
from shardmeter.errors import UserInputError

FINAL_LINGER_MS = 500  # at a normal end, the last replies (the byes' pongs) still go out
MAX_BATCH = 4096  # messages handled per wake-up: drain the queue (heartbeats too) before evicting


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


def zmq_address(bind: str) -> str:
    """``tcp://host:0`` means "any free port" (ZeroMQ spells it ``*``)."""
    return bind[:-2] + ":*" if bind.endswith(":0") else bind


class Endpoint:
    """Serves one :class:`Coordinator` until its target revision is reached or ``stop`` is set."""

    def __init__(self, coord: Coordinator, secret: bytes, cfg: EndpointConfig) -> None:
        self.coord = coord
        self.secret = secret
        self.cfg = cfg
        self.guard = auth.ReplayGuard(cfg.replay_window_s)
        self.stop = threading.Event()
        self.address = ""
        self._ctx: zmq.Context[Any] | None = None
        self._auth: AllowList | None = None
        self._sock: zmq.Socket[bytes] | None = None
        self._last_ckpt_rev = coord.server.revision
        self._last_ckpt_time = time.monotonic()
        self.on_checkpoint: Callable[[Path], None] | None = None
        self.extra_meta: Callable[[], dict[str, Any]] | None = None
        self.check_extra: Callable[[dict[str, Any]], object] | None = None
        self.restored_extra: dict[str, Any] = {}
        self.restored_from: Path | None = None
        self.skipped: list[checkpoint.Skipped] = []
        self._last_ckpt_accepted = coord.counters.accepted
        if cfg.durable:
            coord.persist = self.persist

    # -- checkpoints ------------------------------------------------------------------------
    def save_checkpoint(self) -> Path | None:
        """Server state (θ, optimizer, revision log) + coordinator counters, atomically.

        A failed write (a full disk) is counted (``checkpoint_failed``) and reported on
        stderr; the previous checkpoints stay intact and the server keeps serving. Returns
        None then, or without a checkpoint folder.
        """
        if self.cfg.checkpoint_dir is None:
            return None
        state = self.coord.server.state_dict()
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
        layout = {k: tuple(v.shape) for k, v in self.coord.server.state_dict().tensors.items()}
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

    # -- socket -----------------------------------------------------------------------------
    def frame_limit(self) -> int:
        """Largest frame a peer may send (``zmq.MAXMSGSIZE``): the header or the largest
        tensor in fp32, never more than the whole-message limit. libzmq cuts the connection
        of a peer that announces a longer frame before buffering it."""
        largest = max((4 * t.numel() for t in self.coord.server.params.values()), default=0)
        # + slack: libzmq checks the frame as sent, which under CURVE is the encrypted box
        # (plaintext + MAC + flags); without it a push whose largest tensor is exactly at the
        # limit, or over 1 MiB under CURVE, had its connection cut and never got a reply.
        return min(self.cfg.max_bytes, max(wire.MAX_HEADER_BYTES, largest) + FRAME_SLACK_BYTES)

    def open(self) -> str:
        """Bind the ROUTER socket; returns the concrete address (with the chosen port).

        With keys, the socket gets its own context whose ZAP handler admits only the
        allow-listed keys, during the handshake.
        """
        self._ctx = zmq.Context()
        sock = self._ctx.socket(zmq.ROUTER)
        sock.setsockopt(zmq.LINGER, 0)
        sock.setsockopt(zmq.MAXMSGSIZE, self.frame_limit())
        sock.setsockopt(zmq.ROUTER_MANDATORY, 0)
        if self.cfg.keys is not None:
            self._auth = AllowList(self._ctx, self.cfg.keys.allowed)
            self._auth.start()
            serve_securely(sock, self.cfg.keys)
        try:
            sock.bind(zmq_address(self.cfg.bind))
        except zmq.ZMQError as exc:
            sock.close()
            self.close()
            raise UserInputError(
                "--bind", self.cfg.bind, f"a free, local tcp://HOST:PORT ({exc.strerror})"
            ) from None
        self._sock = sock
        self.address = sock.getsockopt_string(zmq.LAST_ENDPOINT)
        return self.address

    def close(self, linger_ms: int = 0) -> None:
        """Close the socket (sending queued replies for up to ``linger_ms``), stop the ZAP
        handler and end the context."""
        if self._sock is not None:
            self._sock.close(linger=linger_ms)
            self._sock = None
        if self._auth is not None:
            self._auth.stop()
            self._auth = None
        if self._ctx is not None:
            self._ctx.term()
            self._ctx = None

    def _reply(self, identity: bytes, msg: Message) -> None:
        assert self._sock is not None
        self._sock.send_multipart([identity, *wire.encode(msg, self.secret)], copy=False)

    def handle_frames(
        self, frames: Sequence[wire.Frame], peer: str | None = None
    ) -> Message | None:
        """Authenticate, de-duplicate and answer one inbound message (None: dropped).

        ``peer`` is the allow-list name of the CURVE key the connection authenticated with.
        """
        counters = self.coord.counters
        try:
            msg = wire.decode(frames, self.secret, self.cfg.max_bytes)
        except WireError as exc:
            if exc.reason == "bad_mac":
                counters.bad_mac += 1
                return None
            if exc.reason == "too_large":
                counters.too_large += 1
                return error(Message("?", id=_peek_id(bytes(frames[0]))), "too_large", str(exc))
            counters.malformed += 1
            return None
        why = self.guard.check(msg.id, msg.ts)
        if why is not None:
            setattr(counters, why, getattr(counters, why) + 1)
            return None
        return self.coord.handle(msg, peer)

    def _drain(self) -> None:
        assert self._sock is not None
        for _ in range(MAX_BATCH):
            try:
                frames = self._sock.recv_multipart(zmq.NOBLOCK, copy=False)
            except zmq.Again:
                return
            if len(frames) < 2:
                continue
            peer = str(frames[1].get("User-Id")) if self.cfg.keys is not None else None
            reply = self.handle_frames([f.buffer for f in frames[1:]], peer)
            if reply is not None:
                self._reply(frames[0].bytes, reply)

    def serve(self) -> None:
        """Run until done (and drained) or stopped, then write a final checkpoint.

        An exception ends the loop *without* a checkpoint (the state may be mid-update); the
        last good checkpoint stays the one to resume from.
        """
        if self._sock is None:
            self.open()
        assert self._sock is not None
        poller = zmq.Poller()
        poller.register(self._sock, zmq.POLLIN)
        done_since: float | None = None
        try:
            while not self.stop.is_set():
                if poller.poll(self.cfg.poll_ms):
                    self._drain()
                self.coord.evict_silent()
                self.coord.flush_due()
                self._periodic()
                if self.coord.done:
                    done_since = done_since or time.monotonic()
                    idle = not self.coord.active_workers()
                    if idle or time.monotonic() - done_since > self.cfg.drain_s:
                        break
        except BaseException:
            self.close()
            raise
        self.save_checkpoint()
        self.close(linger_ms=FINAL_LINGER_MS)


_ID_PREFIX = re.compile(rb'^\{"v":1,"type":"[a-z]{1,16}","id":"([0-9a-f]{32})"')


def _peek_id(header: bytes) -> str:
    """The request id of a header that failed a check, to address the error reply.

    Read by a fixed pattern from the first bytes as :func:`heloco.net.wire.encode` writes
    them, never by parsing JSON: the message is not authenticated yet.
    """
    match = _ID_PREFIX.match(header[:128])
    return match.group(1).decode() if match else ""


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
    """Inverse of :func:`coordinator_meta`; wall time continues from the saved elapsed time."""
    known = {f.name for f in fields(Counters)}
    coord.tokens = meta.tokens
    coord.t0 = coord.clock() - meta.elapsed
    coord.counters = Counters(**{k: v for k, v in meta.counters.items() if k in known})
    coord.workers = [
        WorkerInfo(
            **(w.model_dump() | {"last_loss": float("nan") if w.last_loss is None else w.last_loss})
        )
        for w in meta.workers
    ]
