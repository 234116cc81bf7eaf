"""The worker's side of the wire: authenticated request/reply with retries over a DEALER socket.

A request waits ``timeout_s`` for its reply (matched by ``re`` = request id; late replies to
abandoned requests are dropped). On a timeout the socket is closed and reopened and the request
is re-sent as a fresh message (new id and timestamp, same body), with exponential backoff, until
``deadline_s`` passes without any reply ("lazy pirate" pattern, ZeroMQ guide ch. 4). So a
worker rides out a server restart; exactly-once is the server's job (its revision log).
"""

from __future__ import annotations

import dataclasses
import threading
import time
from collections.abc import Callable, Mapping, Sequence
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass
from functools import partial
from typing import Any

import torch
import zmq

from heloco.codecs import CodedDelta
from heloco.net import compress, wire
from heloco.net.compress import Codec
from heloco.net.keys import ClientKeys, connect_securely
from heloco.net.pool import WORKER_THREADS
from heloco.net.wire import Message, WireError
from shardmeter.errors import UserInputError


class ServerUnreachable(RuntimeError):
    """No valid reply within the deadline."""


@dataclass(frozen=True)
class ClientConfig:
    """Where the server is and how patiently to talk to it (seconds)."""

    address: str
    timeout_s: float = 30.0
    deadline_s: float = 300.0
    backoff_s: float = 0.1
    backoff_max_s: float = 5.0
    max_bytes: int = wire.DEFAULT_MAX_BYTES
    keys: ClientKeys | None = None  # CURVE: the server's public key and ours (None: off)


@dataclass
class Traffic:
    """Bytes and seconds spent on the wire by one client (for the benchmark and metrics)."""

    sent_bytes: int = 0
    recv_bytes: int = 0
    requests: int = 0
    retries: int = 0
    seconds: float = 0.0


class Client:
    """One DEALER connection to the server (not thread-safe: one per thread)."""

    def __init__(
        self, cfg: ClientConfig, secret: bytes, ctx: zmq.Context[Any] | None = None
    ) -> None:
        self.cfg = cfg
        self.secret = secret
        self.ctx = ctx or zmq.Context.instance()
        self.traffic = Traffic()
        self._sock: zmq.Socket[bytes] | None = None

    def _socket(self) -> zmq.Socket[bytes]:
        if self._sock is None:
            sock = self.ctx.socket(zmq.DEALER)
            sock.setsockopt(zmq.LINGER, 0)
            sock.setsockopt(zmq.MAXMSGSIZE, self.cfg.max_bytes)
            if self.cfg.keys is not None:
                connect_securely(sock, self.cfg.keys)
            try:
                sock.connect(self.cfg.address)
            except zmq.ZMQError as exc:
                sock.close(linger=0)
                raise UserInputError(
                    "address", self.cfg.address, f"a tcp://HOST:PORT address ({exc.strerror})"
                ) from None
            self._sock = sock
        return self._sock

    def close(self) -> None:
        """Close the socket (pending messages are dropped)."""
        if self._sock is not None:
            self._sock.close(linger=0)
            self._sock = None

    def send(self, msg: Message) -> None:
        """Send without waiting (tests use it to inject duplicates and replays)."""
        frames = wire.encode(msg, self.secret, WORKER_THREADS)
        self.traffic.sent_bytes += wire.wire_bytes(frames)
        self._socket().send_multipart(frames, copy=False)

    def send_frames(self, frames: Sequence[wire.Frame]) -> None:
        """Send raw frames as they are (tests: replay a captured message byte for byte)."""
        self._socket().send_multipart(frames, copy=False)

    def receive(self, want: str, timeout_s: float) -> Message | None:
        """The reply to request ``want`` within ``timeout_s``, or None."""
        sock = self._socket()
        end = time.monotonic() + timeout_s
        while (left := end - time.monotonic()) > 0:
            if not sock.poll(int(left * 1000) + 1, zmq.POLLIN):
                return None
            frames = [f.buffer for f in sock.recv_multipart(copy=False)]
            self.traffic.recv_bytes += wire.wire_bytes(frames)
            try:
                reply = wire.decode(frames, self.secret, self.cfg.max_bytes, WORKER_THREADS)
            except WireError:
                continue
            if reply.re == want:
                return reply
        return None

    def call(self, msg: Message) -> Message:
        """Send ``msg`` and wait for its reply, retrying as a fresh message until the deadline."""
        start = time.monotonic()
        backoff = self.cfg.backoff_s
        attempt = msg
        self.traffic.requests += 1
        while True:
            self.send(attempt)
            reply = self.receive(attempt.id, self.cfg.timeout_s)
            if reply is not None:
                self.traffic.seconds += time.monotonic() - start
                return reply
            self.close()
            if time.monotonic() - start + backoff > self.cfg.deadline_s:
                self.traffic.seconds += time.monotonic() - start
                raise ServerUnreachable(
                    f"no reply to {msg.type!r} from {self.cfg.address} within {self.cfg.deadline_s:g} s"
                )
            time.sleep(backoff)
            backoff = min(backoff * 2, self.cfg.backoff_max_s)
            self.traffic.retries += 1
            attempt = dataclasses.replace(msg, id=wire.new_id(), ts=time.time())

    def request(
        self,
        type_: str,
        body: dict[str, Any] | None = None,
        params: Mapping[str, torch.Tensor] | None = None,
        codec: Codec = "fp32",
        block: int = compress.DEFAULT_BLOCK,
    ) -> Message:
        """Build, send and await one request."""
        return self.call(wire.make(type_, body, params, codec, block, threads=WORKER_THREADS))


class ShardedClient:
    """A worker's connections to every shard of a sharded server (:mod:`heloco.net.shards`):
    one :class:`Client` per shard, used in parallel from one thread per shard. Shard 0 is the
    server's own address; shard i is on the same host at its own port (from ``welcome``).
    Each connection has its own ZeroMQ context, hence its own I/O thread: CURVE encryption
    and the socket copies of the shards' transfers run in parallel too (one context's single
    I/O thread would serialise them). Bytes, retries and the wall seconds of each parallel
    exchange add to ``traffic``."""

    def __init__(
        self,
        cfg: ClientConfig,
        secret: bytes,
        shards: Sequence[tuple[int, Sequence[str]]],
        traffic: Traffic,
    ) -> None:
        host = cfg.address.rsplit(":", 1)[0]
        addresses = [cfg.address] + [f"{host}:{port}" for port, _ in shards[1:]]
        self._contexts: list[zmq.Context[Any]] = [zmq.Context() for _ in addresses]
        self.clients = [
            Client(dataclasses.replace(cfg, address=a), secret, ctx)
            for a, ctx in zip(addresses, self._contexts, strict=True)
        ]
        self.names = [list(names) for _, names in shards]
        self.traffic = traffic
        self._pool = ThreadPoolExecutor(len(self.clients), thread_name_prefix="heloco-shard")

    def _all(self, requests: Sequence[Callable[[], Message]]) -> list[Message]:
        """Build (encode) and send one request per shard in parallel; the replies in shard
        order."""
        start = time.monotonic()
        before = [
            (c.traffic.sent_bytes, c.traffic.recv_bytes, c.traffic.retries) for c in self.clients
        ]
        futures = [
            self._pool.submit(_call, c, make)
            for c, make in zip(self.clients, requests, strict=True)
        ]
        try:
            return [f.result() for f in futures]
        finally:
            for c, (sent, recv, retries) in zip(self.clients, before, strict=True):
                self.traffic.sent_bytes += c.traffic.sent_bytes - sent
                self.traffic.recv_bytes += c.traffic.recv_bytes - recv
                self.traffic.retries += c.traffic.retries - retries
            self.traffic.requests += 1
            self.traffic.seconds += time.monotonic() - start

    def fetch(self, ident: dict[str, Any], round_id: int) -> list[Message]:
        """Every shard's ``slice`` (or ``error``) of the dispatch ``round_id``."""
        body = ident | {"round_id": round_id}
        return self._all([partial(wire.make, "fetch", body) for _ in self.clients])

    def stage(
        self,
        ident: dict[str, Any],
        round_id: int,
        delta: Mapping[str, torch.Tensor],
        codec: Codec,
        block: int,
    ) -> list[Message]:
        """Every shard's ``staged`` (or ``error``) for its part of the round's Δ."""
        body = ident | {"round_id": round_id}
        return self._all(
            [
                partial(
                    wire.make,
                    "stage",
                    body,
                    delta.subset(names)
                    if isinstance(delta, CodedDelta)
                    else {k: delta[k] for k in names},
                    codec,
                    block,
                    threads=WORKER_THREADS,
                )
                for names in self.names
            ]
        )

    def close(self) -> None:
        """Close every connection, stop the threads and end the contexts (in the background:
        ``term`` waits for a request still in flight, which it makes fail with ``ETERM``)."""
        self._pool.shutdown(wait=False, cancel_futures=True)
        for c in self.clients:
            c.close()
        for ctx in self._contexts:
            threading.Thread(target=ctx.term, name="heloco-shard-term", daemon=True).start()


def _call(client: Client, make: Callable[[], Message]) -> Message:
    return client.call(make())
