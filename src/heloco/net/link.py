"""A worker's link to a `heloco serve` over ZeroMQ: hello, heartbeats, pull, push, bye.

:class:`NetLink` is the :class:`heloco.outer_loop.Link` that ``heloco work`` and a user's own
loop (:func:`connect`) use. Pushes are retried by the client until the server answers (it may
be restarting); the server's revision log makes a retried push count once. Every request
carries the worker slot and this process's incarnation, so the server can tell a replacement
from a stale process.
"""

from __future__ import annotations

import dataclasses
import os
import threading
import time
from pathlib import Path
from typing import Any, NoReturn, TypeVar

from pydantic import BaseModel

from heloco.net import auth, compress, keys, messages, wire
from heloco.net.client import Client, ClientConfig, ServerUnreachable, ShardedClient
from heloco.net.compress import Codec
from heloco.net.wire import Message
from heloco.types import Dispatch, Params, PushOutcome, RoundResult
from shardmeter.errors import UserInputError

M = TypeVar("M", bound=BaseModel)
BYE_S = 3.0  # seconds a leaving worker waits for the server to acknowledge its bye
STAGE_ATTEMPTS = 3  # a sharded push is staged again this often if the server lost the parts


class Replaced(RuntimeError):
    """The server handed this worker's slot to a newer process."""


class ProtocolError(RuntimeError):
    """The server answered with something the protocol does not allow."""


def reply_body(reply: Message, model: type[M]) -> M:
    """The validated body of a server reply (:mod:`heloco.net.messages`); a reply that breaks
    the protocol raises :class:`ProtocolError` rather than reaching the worker's state."""
    try:
        return messages.parse(model, reply.body)
    except messages.InvalidMessage as exc:
        raise ProtocolError(f"invalid {reply.type!r} reply from the server: {exc}") from None


class Heartbeat:
    """A background thread with its own socket that tells the server this worker is alive.

    ``over`` is set once a reply says the run is done, so the worker can stop mid-round.
    """

    def __init__(
        self, cfg: ClientConfig, secret: bytes, body: dict[str, Any], period_s: float
    ) -> None:
        self.client = Client(
            dataclasses.replace(cfg, timeout_s=period_s, deadline_s=period_s), secret
        )
        self.body = body
        self.period_s = period_s
        self.stop = threading.Event()
        self.over = threading.Event()
        self.thread = threading.Thread(target=self._run, name="heloco-heartbeat", daemon=True)

    def _run(self) -> None:
        while not self.stop.wait(self.period_s):
            try:
                reply = self.client.request("heartbeat", self.body)
                if reply.type == "pong" and reply_body(reply, messages.Pong).done:
                    self.over.set()
            except (ServerUnreachable, ProtocolError):
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
        self.shards: ShardedClient | None = None  # a sharded server's shards (from welcome)
        self.heartbeat: Heartbeat | None = None
        self.over = threading.Event()  # the server said the run is over (heartbeat or pull)
        self.finished = False
        self.acked: list[list[int]] = []  # [round_id, revision after]
        self.rejected: dict[str, int] = {}
        self.duplicates = 0
        self.push_bytes: list[int] = []  # bytes each push put on the wire (retries, stages too)
        # the last two dispatches: (round id, revision, pull sent, decoded); a push's timing
        # counts from the one its round trained from (overlapped: the one before the last)
        self.received: list[tuple[int, int, float, float]] = []
        self.compute_window: tuple[float, float] | None = None  # next push's compute, note_round
        self.link_slots = False  # the server said: ask for its link before each push (welcome)
        self.slot_waits = 0  # slot requests answered "wait"

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
        welcome = reply_body(reply, messages.Welcome).model_dump()
        self.link_slots = bool(welcome["link_slots"])
        if welcome["shards"] and self.shards is None:
            shards = [(s["port"], s["tensors"]) for s in welcome["shards"]]
            self.shards = ShardedClient(self.cfg, self.secret, shards, self.client.traffic)
        self.heartbeat = Heartbeat(self.cfg, self.secret, self.ident, welcome["heartbeat_s"])
        self.heartbeat.over = self.over
        self.heartbeat.__enter__()
        return welcome

    def pull(self) -> Dispatch | None:
        """The next dispatch (waiting while the server says so), or None when it is done."""
        while True:
            sent = time.perf_counter()
            reply = self._call("pull")
            if reply.type == "wait":
                time.sleep(reply_body(reply, messages.Wait).retry_s)
                continue
            if reply.type == "dispatch":
                b = reply_body(reply, messages.DispatchBody)
                params = self._fetch(b.round_id) if self.shards else reply.params("cpu")
                if params is None:
                    continue  # a shard no longer holds that dispatch: pull a fresh one
                self.received = [
                    *self.received[-1:],
                    (b.round_id, b.revision, sent, time.perf_counter()),
                ]
                return Dispatch(params, b.revision, b.steps, b.round_id, self._worker, b.fragment)
            if reply.type == "done":
                self.finished = True
                self.over.set()
                return None
            self._refused(reply, "pull")

    def _fetch(self, round_id: int) -> Params | None:
        """A sharded dispatch's tensors from every shard (None: one no longer holds it)."""
        assert self.shards is not None
        params: Params = {}
        for reply in self.shards.fetch(self.ident, round_id):
            if reply.type == "error":
                if reply_body(reply, messages.ErrorBody).reason == "superseded":
                    return None
                raise ProtocolError(f"fetch refused: {reply.body}")
            if reply.type != "slice":
                raise ProtocolError(f"unexpected reply to fetch: {reply.type!r}")
            reply_body(reply, messages.SliceBody)
            params.update(reply.params("cpu"))
        return params

    def _stage(self, result: RoundResult) -> str | None:
        """Hand every shard its part of Δ; None, or the reason a shard refused it."""
        assert self.shards is not None
        round_id = int(result.round_id or 0)
        replies = self.shards.stage(self.ident, round_id, result.delta, self.codec, self.block)
        for reply in replies:
            if reply.type == "error":
                return reply_body(reply, messages.ErrorBody).reason
            if reply.type != "staged":
                raise ProtocolError(f"unexpected reply to stage: {reply.type!r}")
        return None

    def take_link(self) -> None:
        """With ``link_slots`` (the server's welcome): ask for the server's link until it is
        granted, so this push crosses it alone (:class:`heloco.net.coordinator.Turns`); the
        wait is idle time, before the push's own timing begins."""
        while self.link_slots:
            reply = self._call("slot")
            if reply.type == "slot":
                reply_body(reply, messages.Granted)
                return
            if reply.type == "wait":
                self.slot_waits += 1
                time.sleep(reply_body(reply, messages.Wait).retry_s)
                continue
            self._refused(reply, "slot")

    def _refused(self, reply: Message, request: str) -> NoReturn:
        """A reply to `request` that is neither of its answers: a newer process took this
        worker's place (Replaced), the server refused it, or the reply makes no sense."""
        if reply.type == "error":
            err = reply_body(reply, messages.ErrorBody)
            if err.reason == "replaced":
                raise Replaced(f"worker {self._worker}: {err.detail}")
            raise ProtocolError(f"{request} refused: {err.reason}: {err.detail}")
        raise ProtocolError(f"unexpected reply to {request}: {reply.type!r}")

    def push(self, result: RoundResult, compute_s: float) -> PushOutcome:
        """Send Δ with the round's counts; the server's ack or rejection is recorded.

        With ``link_slots``, first wait for the server's link (:meth:`take_link`). To a
        sharded server: stage every shard's part in parallel, then push the counts to the
        leader (staged again if the server lost them, e.g. in a restart)."""
        self.take_link()
        body = {
            "round_id": result.round_id,
            "base_revision": result.base_revision,
            "steps": result.steps,
            "tokens": result.tokens,
            "mean_loss": result.mean_loss if result.mean_loss == result.mean_loss else None,
            "compute_s": compute_s,
        }
        if result.fragment is not None:
            body["fragment"] = result.fragment
        body |= self._timing(result)
        sent = self.client.traffic.sent_bytes
        reply = self._push(body, result)
        self.push_bytes.append(self.client.traffic.sent_bytes - sent)
        if reply.type == "ack":
            ack = reply_body(reply, messages.Ack)
            self.acked.append([int(result.round_id or 0), ack.revision])
            self.duplicates += int(ack.duplicate)
            return PushOutcome(True, ack.revision, duplicate=ack.duplicate)
        if reply.type == "rejected":
            rejected = reply_body(reply, messages.Rejected)
            reason, revision = rejected.reason, rejected.revision
        elif reply.type == "error":
            reason, revision = reply_body(reply, messages.ErrorBody).reason, -1
        else:
            raise ProtocolError(f"unexpected reply to push: {reply.type!r}")
        self.rejected[reason] = self.rejected.get(reason, 0) + 1
        return PushOutcome(False, revision, reason)

    def note_round(self, compute_start: float, compute_end: float) -> None:
        """When the round about to be pushed ran its inner steps (``time.perf_counter``)."""
        self.compute_window = (compute_start, compute_end)

    def _timing(self, result: RoundResult) -> dict[str, float]:
        """The push's timing fields (this process's clock; :mod:`heloco.net.coordinator`),
        counted from sending the pull of the dispatch the round trained from: the one it
        answers (blocking), or the one before it whose revision it names as its base
        (overlapped). Empty when that pull is not known."""
        mine = [r for r in self.received if r[0] == result.round_id]
        base = [r for r in self.received if r[1] == result.base_revision]
        got = mine if mine and mine[-1][1] == result.base_revision else base
        if result.fragment is not None:  # streaming: it trained after the dispatch before
            got = [r for r in self.received if r[0] == (result.round_id or 0) - 1] or mine
        if not got:
            return {}
        _, _, pulled, decoded = got[-1]
        out = {"recv_s": decoded - pulled, "lead_s": time.perf_counter() - pulled}
        window, self.compute_window = self.compute_window, None
        if window is not None and window[0] >= pulled:
            out["compute_from_s"] = window[0] - pulled
        return out

    def _push(self, body: dict[str, Any], result: RoundResult) -> Message:
        if self.shards is None:
            return self._call("push", body, result)
        for _ in range(STAGE_ATTEMPTS):
            refused = self._stage(result)
            if refused is not None:
                return wire.make("error", {"reason": refused, "detail": "a shard refused Δ"})
            reply = self._call("push", body)
            if not (reply.type == "error" and reply.body.get("reason") == "unstaged"):
                return reply
        return reply

    def close(self) -> None:
        """Say bye if training ended normally (or the server said it is over); stop the
        heartbeats; close the socket. Idempotent.

        The bye is a courtesy that lets the server finish without waiting for eviction: it
        is tried for a few seconds and given up silently (the server may have finished).
        """
        try:
            if self.finished or self.over.is_set():
                self.finished = False
                self.over.clear()
                patience = min(self.cfg.timeout_s, BYE_S)
                short = dataclasses.replace(self.cfg, timeout_s=patience, deadline_s=patience)
                bye = Client(short, self.secret)
                try:
                    bye.request("bye", self.ident)
                except ServerUnreachable:
                    pass
                finally:
                    bye.close()
        finally:
            if self.heartbeat is not None:
                self.heartbeat.__exit__()
                self.heartbeat = None
            if self.shards is not None:
                self.shards.close()
                self.shards = None
            self.client.close()


def connect(
    address: str,
    worker: int,
    key_folder: Path | str | None = None,
    secret: bytes | None = None,
    codec: Codec = "fp32",
    timeout_s: float = 60.0,
    deadline_s: float = 600.0,
) -> NetLink:
    """A link to the `heloco serve` at ``address`` as worker slot ``worker``.

    ``key_folder`` is this host's folder from ``heloco keys`` (CURVE keys; `heloco serve`
    admits no one without); the HMAC secret defaults to ``$HELOCO_SECRET`` /
    ``$HELOCO_SECRET_FILE``, then the folder's ``hmac.secret`` (never an argument on a command
    line). Nothing is sent until the :class:`~heloco.outer_loop.OuterLoop` starts."""
    if not address.startswith("tcp://"):
        raise UserInputError("address", address, "a tcp://HOST:PORT address")
    folder = Path(key_folder) if key_folder is not None else None
    curve = keys.load_client(folder) if folder is not None else None
    key = secret if secret is not None else auth.load_secret(None, keys.hmac_secret_file(folder))
    cfg = ClientConfig(address, timeout_s, deadline_s, keys=curve)
    return NetLink(cfg, key, worker, codec)
