"""The server's ZeroMQ loop: a ROUTER socket in front of a :class:`Coordinator`.

Workers connect out with DEALER sockets, so only the server needs a reachable port. Every
inbound message is size-checked (``zmq.MAXMSGSIZE`` per frame, then the whole message), then
its HMAC is verified, then its id and timestamp go through the replay guard; failures are
counted and dropped without a reply (bad tag, replay) or answered with an ``error`` (too large).
Between messages the loop evicts silent workers, closes grace windows and writes periodic
checkpoints; SIGTERM sets ``stop`` and the loop ends with a final checkpoint.
"""

from __future__ import annotations

import json
import threading
import time
from collections.abc import Callable, Sequence
from dataclasses import asdict, dataclass
from pathlib import Path
from typing import Any

import zmq

from heloco.net import auth, checkpoint, wire
from heloco.net.coordinator import Coordinator, Counters, UpdateEvent, WorkerInfo, error
from heloco.net.wire import Message, WireError
from heloco.server import ServerState
from shardmeter.errors import UserInputError

MAX_BATCH = 4096  # messages handled per wake-up: drain the queue (heartbeats too) before evicting


@dataclass(frozen=True)
class EndpointConfig:
    """Socket, limits and checkpoint policy of a serving process.

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
        self._ctx: zmq.Context[Any] = zmq.Context.instance()
        self._sock: zmq.Socket[bytes] | None = None
        self._last_ckpt_rev = coord.server.revision
        self._last_ckpt_time = time.monotonic()
        self.on_checkpoint: Callable[[Path], None] | None = None
        self.extra_meta: Callable[[], dict[str, Any]] | None = None
        self.restored_extra: dict[str, Any] = {}

    # -- checkpoints ------------------------------------------------------------------------
    def save_checkpoint(self) -> Path | None:
        """Server state (θ, optimizer, revision log) + coordinator counters, atomically."""
        if self.cfg.checkpoint_dir is None:
            return None
        state = self.coord.server.state_dict()
        meta = {
            "server": state.meta,
            "coordinator": coordinator_meta(self.coord),
            "extra": self.extra_meta() if self.extra_meta is not None else {},
        }
        path = checkpoint.save(
            self.cfg.checkpoint_dir,
            self.coord.server.revision,
            state.tensors,
            meta,
            self.cfg.keep_checkpoints,
        )
        self._last_ckpt_rev = self.coord.server.revision
        self._last_ckpt_time = time.monotonic()
        if self.on_checkpoint is not None:
            self.on_checkpoint(path)
        return path

    def restore(self) -> bool:
        """Load the newest checkpoint under ``checkpoint_dir``, if any; True if one was loaded."""
        if self.cfg.checkpoint_dir is None:
            return False
        path = checkpoint.latest(self.cfg.checkpoint_dir)
        if path is None:
            return False
        ck = checkpoint.load(path)
        self.coord.server.load_state_dict(ServerState(ck.tensors, ck.state["server"]))
        load_coordinator_meta(self.coord, ck.state["coordinator"])
        self.restored_extra = dict(ck.state.get("extra", {}))
        self._last_ckpt_rev = self.coord.server.revision
        return True

    def after_update(self, event: UpdateEvent) -> None:
        """Checkpoint if the policy says so (called by the coordinator before the ack)."""
        rev = event.record.revision
        every = self.cfg.checkpoint_every
        if self.cfg.durable or (every > 0 and rev - self._last_ckpt_rev >= every):
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
    def open(self) -> str:
        """Bind the ROUTER socket; returns the concrete address (with the chosen port)."""
        sock = self._ctx.socket(zmq.ROUTER)
        sock.setsockopt(zmq.LINGER, 0)
        sock.setsockopt(zmq.MAXMSGSIZE, self.cfg.max_bytes)
        sock.setsockopt(zmq.ROUTER_MANDATORY, 0)
        try:
            sock.bind(zmq_address(self.cfg.bind))
        except zmq.ZMQError as exc:
            sock.close()
            raise UserInputError(
                "--bind", self.cfg.bind, f"a free, local tcp://HOST:PORT ({exc.strerror})"
            ) from None
        self._sock = sock
        self.address = sock.getsockopt_string(zmq.LAST_ENDPOINT)
        return self.address

    def close(self) -> None:
        """Close the ROUTER socket if it is open."""
        if self._sock is not None:
            self._sock.close(linger=0)
            self._sock = None

    def _reply(self, identity: bytes, msg: Message) -> None:
        assert self._sock is not None
        self._sock.send_multipart([identity, *wire.encode(msg, self.secret)], copy=False)

    def handle_frames(self, frames: Sequence[wire.Frame]) -> Message | None:
        """Authenticate, de-duplicate and answer one inbound message (None: dropped)."""
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
        return self.coord.handle(msg)

    def _drain(self) -> None:
        assert self._sock is not None
        for _ in range(MAX_BATCH):
            try:
                frames = self._sock.recv_multipart(zmq.NOBLOCK)
            except zmq.Again:
                return
            if len(frames) < 2:
                continue
            reply = self.handle_frames(frames[1:])
            if reply is not None:
                self._reply(frames[0], reply)

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
        self.close()


def _peek_id(header: bytes) -> str:
    """The request id of an unauthenticated header, if it parses (only to address an error)."""
    try:
        head = json.loads(header[: wire.MAX_HEADER_BYTES])
    except (ValueError, UnicodeDecodeError):
        return ""
    value = head.get("id", "") if isinstance(head, dict) else ""
    return value if isinstance(value, str) else ""


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


def load_coordinator_meta(coord: Coordinator, meta: dict[str, Any]) -> None:
    """Inverse of :func:`coordinator_meta`; wall time continues from the saved elapsed time."""
    coord.tokens = int(meta["tokens"])
    coord.t0 = coord.clock() - float(meta["elapsed"])
    coord.counters = Counters(**meta["counters"])
    coord.workers = [
        WorkerInfo(
            **(w | {"last_loss": float("nan") if w["last_loss"] is None else w["last_loss"]})
        )
        for w in meta["workers"]
    ]
