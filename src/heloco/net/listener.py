"""One ROUTER socket that authenticates requests and sends replies (the server's and each
shard's).

Every inbound message is size-checked (``zmq.MAXMSGSIZE`` per frame, then the whole message),
then its HMAC is verified, then its id and timestamp go through the replay guard; failures are
counted and dropped without a reply (bad tag, replay) or answered with an ``error`` (too large).
Accepted requests go to ``answer``. With keys the socket has its own context whose ZAP handler
admits only allow-listed CURVE keys, during the handshake.

Replies are sent without copying tensor frames. A frame that is a parameter's own memory (a
dispatch of θ) is tracked until libzmq lets go of it, and reported to ``on_sent`` with its
address, so the server can copy that parameter before writing it (copy on write).
"""

from __future__ import annotations

import re
import threading
from collections.abc import Callable, Sequence
from typing import Any

import numpy as np
import zmq

from heloco.net import auth, compress, wire
from heloco.net.coordinator import Counters, error
from heloco.net.keys import AllowList, ServerKeys, serve_securely
from heloco.net.wire import Message, WireError
from heloco.types import Params
from shardmeter.errors import UserInputError

MAX_BATCH = 4096  # messages handled per wake-up: drain the queue (heartbeats too) before evicting

Answer = Callable[[Message, str | None], Message | None]
OnSent = Callable[[Message, Message, list[zmq.MessageTracker], dict[str, int]], None]


def zmq_address(bind: str) -> str:
    """``tcp://host:0`` means "any free port" (ZeroMQ spells it ``*``)."""
    return bind[:-2] + ":*" if bind.endswith(":0") else bind


class Listener:
    """A bound ROUTER socket, its replay guard and counters, answering with ``answer``.

    ``params`` gives the server's parameters (to recognise frames that are their memory);
    ``on_sent(request, reply, trackers, pinned)`` is called after each reply.
    """

    def __init__(
        self,
        secret: bytes,
        bind: str,
        answer: Answer,
        *,
        max_bytes: int,
        frame_limit: int,
        replay_window_s: float = 300.0,
        keys: ServerKeys | None = None,
        counters: Counters | None = None,
        params: Callable[[], Params] | None = None,
        on_sent: OnSent | None = None,
    ) -> None:
        self.secret = secret
        self.bind = bind
        self.answer = answer
        self.max_bytes = max_bytes
        self.frame_limit = frame_limit
        self.keys = keys
        self.counters = counters if counters is not None else Counters()
        self.params = params
        self.on_sent = on_sent
        self.guard = auth.ReplayGuard(replay_window_s)
        self.address = ""
        self._ctx: zmq.Context[Any] | None = None
        self._auth: AllowList | None = None
        self._sock: zmq.Socket[bytes] | None = None

    def open(self) -> str:
        """Bind the socket; returns the concrete address (with the chosen port)."""
        self._ctx = zmq.Context()
        sock = self._ctx.socket(zmq.ROUTER)
        sock.setsockopt(zmq.LINGER, 0)
        sock.setsockopt(zmq.MAXMSGSIZE, self.frame_limit)
        sock.setsockopt(zmq.ROUTER_MANDATORY, 0)
        if self.keys is not None:
            self._auth = AllowList(self._ctx, self.keys.allowed)
            self._auth.start()
            serve_securely(sock, self.keys)
        try:
            sock.bind(zmq_address(self.bind))
        except zmq.ZMQError as exc:
            sock.close()
            self.close()
            raise UserInputError(
                "--bind", self.bind, f"a free, local tcp://HOST:PORT ({exc.strerror})"
            ) from None
        self._sock = sock
        self.address = sock.getsockopt_string(zmq.LAST_ENDPOINT)
        return self.address

    @property
    def is_open(self) -> bool:
        """Whether the socket is bound."""
        return self._sock is not None

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

    def poll(self, timeout_ms: int) -> bool:
        """Whether a request arrived within ``timeout_ms``."""
        assert self._sock is not None
        return bool(self._sock.poll(timeout_ms, zmq.POLLIN))

    def handle_frames(
        self, frames: Sequence[wire.Frame], peer: str | None = None
    ) -> Message | None:
        """Authenticate, de-duplicate and answer one inbound message (None: dropped).

        ``peer`` is the allow-list name of the CURVE key the connection authenticated with.
        """
        return self._handle(frames, peer)[1]

    def _handle(
        self, frames: Sequence[wire.Frame], peer: str | None
    ) -> tuple[Message | None, Message | None]:
        """(the authenticated request or None, its reply or None)."""
        counters = self.counters
        try:
            msg = wire.decode(frames, self.secret, self.max_bytes)
        except WireError as exc:
            if exc.reason == "bad_mac":
                counters.bad_mac += 1
                return None, None
            if exc.reason == "too_large":
                counters.too_large += 1
                request = Message("?", id=_peek_id(bytes(frames[0])))
                return None, error(request, "too_large", str(exc))
            counters.malformed += 1
            return None, None
        why = self.guard.check(msg.id, msg.ts)
        if why is not None:
            setattr(counters, why, getattr(counters, why) + 1)
            return None, None
        return msg, self.answer(msg, peer)

    def drain(self) -> None:
        """Handle every queued request (up to :data:`MAX_BATCH`) and send the replies."""
        assert self._sock is not None
        for _ in range(MAX_BATCH):
            try:
                frames = self._sock.recv_multipart(zmq.NOBLOCK, copy=False)
            except zmq.Again:
                return
            if len(frames) < 2:
                continue
            peer = str(frames[1].get("User-Id")) if self.keys is not None else None
            request, reply = self._handle([f.buffer for f in frames[1:]], peer)
            if reply is not None:
                trackers, pinned = self.reply(frames[0].bytes, reply)
                if self.on_sent is not None and request is not None:
                    self.on_sent(request, reply, trackers, pinned)

    def reply(
        self, identity: bytes, msg: Message
    ) -> tuple[list[zmq.MessageTracker], dict[str, int]]:
        """Send a reply; returns the trackers of frames that are parameters' own memory and
        those parameters' addresses (name -> address)."""
        assert self._sock is not None
        params = self.params() if self.params is not None else {}
        frames: list[wire.Frame | zmq.Frame] = [identity]
        trackers: list[zmq.MessageTracker] = []
        pinned: dict[str, int] = {}
        for frame, name in zip(wire.encode(msg, self.secret), frame_names(msg), strict=True):
            address = frame_address(frame)
            held = params.get(name)
            if held is not None and held.numel() and address == held.data_ptr():
                tracked = zmq.Frame(frame, track=True, copy=False)
                assert tracked.tracker is not None
                trackers.append(tracked.tracker)
                pinned[name] = address
                frames.append(tracked)
            else:
                frames.append(frame)
        self._sock.send_multipart(frames, copy=False)
        return trackers, pinned

    def run(self, stop: threading.Event, poll_ms: int) -> None:
        """Answer requests until ``stop`` is set (a shard's thread)."""
        while not stop.is_set():
            if self.poll(poll_ms):
                self.drain()


def frame_names(msg: Message) -> list[str]:
    """The tensor each frame of ``wire.encode(msg)`` carries ("" for header, scales, tag)."""
    names = [""]
    for name, enc in msg.tensors.items():
        names += [name, ""] if enc.codec in compress.TWO_FRAMES else [name]
    return [*names, ""]


def frame_address(frame: wire.Frame) -> int:
    """Address of a frame's first byte (0 for an empty frame)."""
    return int(np.frombuffer(frame, dtype=np.uint8).ctypes.data) if len(frame) else 0


_ID_PREFIX = re.compile(rb'^\{"v":1,"type":"[a-z]{1,16}","id":"([0-9a-f]{32})"')


def _peek_id(header: bytes) -> str:
    """The request id of a header that failed a check, to address the error reply.

    Read by a fixed pattern from the first bytes as :func:`heloco.net.wire.encode` writes
    them, never by parsing JSON: the message is not authenticated yet.
    """
    match = _ID_PREFIX.match(header[:128])
    return match.group(1).decode() if match else ""
