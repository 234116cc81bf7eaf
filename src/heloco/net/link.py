"""A worker's link to a `heloco serve` over ZeroMQ: hello, heartbeats, pull, push, bye.

:class:`NetLink` is the :class:`heloco.outer_loop.Link` that ``heloco work`` and a user's own
loop (:func:`connect`) use. Pushes are retried by the client until the server answers (it may
be restarting); the server's revision log makes a retried push count once. Every request
carries the worker slot and this process's incarnation, so the server can tell a replacement
from a stale process.
"""

from __future__ import annotations

import os
import threading
import time
from typing import Any

from heloco.net import auth, compress
from heloco.net.client import Client, ClientConfig, ServerUnreachable
from heloco.net.compress import Codec
from heloco.net.wire import Message
from heloco.outer_loop import PushOutcome
from heloco.server import Dispatch
from heloco.types import RoundResult
from shardmeter.errors import UserInputError


class Replaced(RuntimeError):
    """The server handed this worker's slot to a newer process."""


class Heartbeat:
    """A background thread with its own socket that tells the server this worker is alive."""

    def __init__(
        self, cfg: ClientConfig, secret: bytes, body: dict[str, Any], period_s: float
    ) -> None:
        short = ClientConfig(
            cfg.address, timeout_s=period_s, deadline_s=period_s, max_bytes=cfg.max_bytes
        )
        self.client = Client(short, secret)
        self.body = body
        self.period_s = period_s
        self.stop = threading.Event()
        self.thread = threading.Thread(target=self._run, name="heloco-heartbeat", daemon=True)

    def _run(self) -> None:
        while not self.stop.wait(self.period_s):
            try:
                self.client.request("heartbeat", self.body)
            except ServerUnreachable:
                continue
        self.client.close()

    def __enter__(self) -> Heartbeat:
        self.thread.start()
        return self

    def __exit__(self, *exc: object) -> None:
        self.stop.set()
        self.thread.join(timeout=self.period_s + 1)


class NetLink:
    """Worker slot ``worker`` of the server at ``cfg.address`` (pseudo-gradients sent as
    ``codec``: fp32, bf16 or blockwise int8 of ``block`` elements per scale)."""

    def __init__(
        self,
        cfg: ClientConfig,
        secret: bytes,
        worker: int,
        codec: Codec = "fp32",
        block: int = compress.DEFAULT_BLOCK,
    ) -> None:
        if worker < 0:
            raise UserInputError("worker", worker, "an integer >= 0")
        if block < 1:
            raise UserInputError("block", block, "an integer >= 1 (elements per int8 block)")
        compress.check_codec(codec)
        self.cfg = cfg
        self.secret = secret
        self._worker = worker
        self.codec = codec
        self.block = block
        # Ordered by process start, so the server can tell a replacement from a stale process.
        self.incarnation = f"{time.time_ns():020d}-{os.urandom(4).hex()}"
        self.client = Client(cfg, secret)
        self.heartbeat: Heartbeat | None = None
        self.finished = False
        self.acked: list[list[int]] = []  # [round_id, revision after]
        self.rejected: dict[str, int] = {}
        self.duplicates = 0

    @property
    def worker(self) -> int:
        """The worker slot."""
        return self._worker

    @property
    def ident(self) -> dict[str, Any]:
        """The worker slot and incarnation every request carries."""
        return {"worker": self._worker, "incarnation": self.incarnation}

    def _call(
        self, type_: str, body: dict[str, Any] | None = None, result: RoundResult | None = None
    ) -> Message:
        params = result.delta if result is not None else None
        return self.client.request(type_, self.ident | (body or {}), params, self.codec, self.block)

    def join(self) -> dict[str, Any]:
        """Hello; starts the heartbeats at once. Returns the welcome (run config, the slot's
        accepted inner steps, heartbeat period)."""
        reply = self._call("hello")
        if reply.type != "welcome":
            raise UserInputError("worker", self._worker, f"server refused: {reply.body}")
        welcome = dict(reply.body)
        period = float(welcome.get("heartbeat_s", 2.0))
        self.heartbeat = Heartbeat(self.cfg, self.secret, self.ident, period)
        self.heartbeat.__enter__()
        return welcome

    def pull(self) -> Dispatch | None:
        """The next dispatch (waiting while the server says so), or None when it is done."""
        while True:
            reply = self._call("pull")
            if reply.type == "wait":
                time.sleep(float(reply.body.get("retry_s", 0.05)))
                continue
            if reply.type == "dispatch":
                b = reply.body
                params = reply.params("cpu")
                return Dispatch(params, b["revision"], b["steps"], b["round_id"], self._worker)
            if reply.type == "done":
                self.finished = True
                return None
            if reply.body.get("reason") == "replaced":
                raise Replaced(f"worker {self._worker}: {reply.body.get('detail')}")
            raise RuntimeError(f"unexpected reply to pull: {reply.type} {reply.body}")

    def push(self, result: RoundResult, compute_s: float) -> PushOutcome:
        """Send Δ with the round's counts; the server's ack or rejection is recorded."""
        body = {
            "round_id": result.round_id,
            "base_revision": result.base_revision,
            "steps": result.steps,
            "tokens": result.tokens,
            "mean_loss": result.mean_loss if result.mean_loss == result.mean_loss else None,
            "compute_s": compute_s,
        }
        reply = self._call("push", body, result)
        revision = int(reply.body.get("revision", -1))
        if reply.type == "ack":
            self.acked.append([int(result.round_id or 0), revision])
            duplicate = bool(reply.body.get("duplicate"))
            self.duplicates += int(duplicate)
            return PushOutcome(True, revision, duplicate=duplicate)
        reason = str(reply.body.get("reason", reply.type))
        self.rejected[reason] = self.rejected.get(reason, 0) + 1
        return PushOutcome(False, revision, reason)

    def close(self) -> None:
        """Say bye if training ended normally; stop the heartbeats; close the socket.
        Idempotent."""
        try:
            if self.finished:
                self.finished = False
                self._call("bye")
        finally:
            if self.heartbeat is not None:
                self.heartbeat.__exit__()
                self.heartbeat = None
            self.client.close()


def connect(
    address: str,
    worker: int,
    secret: bytes | None = None,
    codec: Codec = "fp32",
    timeout_s: float = 60.0,
    deadline_s: float = 600.0,
) -> NetLink:
    """A link to the `heloco serve` at ``address`` as worker slot ``worker``; the shared
    secret defaults to ``$HELOCO_SECRET`` / ``$HELOCO_SECRET_FILE`` (never an argument on a
    command line). Nothing is sent until the :class:`~heloco.outer_loop.OuterLoop` starts."""
    if not address.startswith("tcp://"):
        raise UserInputError("address", address, "a tcp://HOST:PORT address")
    key = secret if secret is not None else auth.load_secret(None)
    return NetLink(ClientConfig(address, timeout_s, deadline_s), key, worker, codec)
