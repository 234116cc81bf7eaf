"""A sharded server in one process: N sockets, each owning a disjoint set of tensors.

`heloco serve --shards N` splits the model's tensors into N shards balanced by bytes
(:func:`plan_shards`). Shard 0 is the leader: it runs the coordinator (revisions, exactly-once,
DyLU, barriers, checkpoints) on the whole server state. Every shard, the leader included, has
its own ROUTER socket (port ``P + i`` for a server bound to port ``P``) and thread, which
receives, authenticates (CURVE, HMAC, size limits, replay guard) and decodes only its own
tensors, and its own thread in the outer step (:class:`GroupRunner`), so the per-byte work of
a push and of a pull runs on N cores. A worker talks to all shards in parallel:

``pull``   → leader: ``dispatch`` {revision, steps, round_id} without tensors;
``fetch``  {worker, round_id} → every shard: ``slice`` + that shard's tensors of the dispatch;
``stage``  {worker, round_id} + that shard's part of Δ → every shard: ``staged``;
``push``   (the round's counts, no tensors) → leader: applies the staged parts as one update.

The leader applies a round only when every shard has staged its part, and a dispatch's tensors
stay as they were dispatched until every shard has sent them (copy on write), so there is one
revision for the whole model, one checkpoint, and no shard is ever ahead of another: all shards
live and restart together in one process. A checkpoint has the same layout as an unsharded
server's (restore with any shard count).
"""

from __future__ import annotations

import threading
from collections.abc import Callable, Iterable, Iterator, Mapping, Sequence
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass, field
from typing import TypeVar

import torch
import zmq

from heloco.net import compress, messages, wire
from heloco.net.coordinator import check_peer, error
from heloco.net.wire import Message, WireError
from heloco.outer.base import read_chunk
from heloco.server import Server
from heloco.types import Delta, Dispatch, Params

T = TypeVar("T")


def plan_shards(sizes: Mapping[str, int], n: int) -> list[list[str]]:
    """Tensor names per shard, balanced by bytes: largest first, each to the shard with the
    fewest bytes so far (ties: the lower index), names kept in model order within a shard.

    Greedy longest-processing-time (Graham 1969): the fullest shard holds at most 4/3 of the
    optimum, and at most the mean plus the largest tensor."""
    if n < 1:
        raise ValueError(f"shards must be >= 1, got {n}")
    load = [0] * n
    owner: dict[str, int] = {}
    for name in sorted(sizes, key=lambda k: -sizes[k]):
        i = min(range(n), key=lambda j: (load[j], j))
        owner[name] = i
        load[i] += sizes[name]
    return [[k for k in sizes if owner[k] == i] for i in range(n)]


class GroupRunner:
    """Runs an outer optimizer's per-block work shard by shard on parallel threads (one per
    shard); each block runs alone, so the result is the serial one, bit for bit."""

    def __init__(self, groups: Sequence[Sequence[str]]) -> None:
        self.shard_of = {name: i for i, group in enumerate(groups) for name in group}
        self.pool = ThreadPoolExecutor(max(1, len(groups)), thread_name_prefix="heloco-shard")
        self.n = len(groups)

    def map(self, fn: Callable[[str], T], names: Sequence[str]) -> list[T]:
        """``[fn(name) for name in names]`` with each shard's names on its own thread."""
        buckets: list[list[str]] = [[] for _ in range(self.n)]
        for name in names:
            buckets[self.shard_of[name]].append(name)
        busy = [b for b in buckets if b]
        if len(busy) <= 1:
            return [fn(name) for name in names]
        futures = [self.pool.submit(_each, fn, b) for b in busy]
        done = {
            k: r
            for b, f in zip(busy, futures, strict=True)
            for k, r in zip(b, f.result(), strict=True)
        }
        return [done[name] for name in names]

    def close(self) -> None:
        """Stop the threads."""
        self.pool.shutdown(wait=False)


def _each(fn: Callable[[str], T], names: list[str]) -> list[T]:
    return [fn(k) for k in names]


@dataclass
class _View:
    """A dispatch being fetched: its tensors as dispatched, and the shards that sent theirs."""

    round_id: int
    revision: int
    params: Params
    sent: set[int] = field(default_factory=set)


@dataclass
class _Send:
    """A reply in flight whose frames are parameters' own memory (name -> address)."""

    trackers: list[zmq.MessageTracker]
    pinned: dict[str, int]


class ShardState:
    """What the shards of one server share, under one lock: the plan, dispatches being
    fetched, replies in flight that send θ's own memory, and the staged parts of rounds."""

    def __init__(self, server: Server, plan: list[list[str]]) -> None:
        self.server = server
        self.plan = plan
        self.lock = threading.Lock()
        self._views: dict[int, _View] = {}
        self._sends: list[_Send] = []
        self._staged: dict[int, tuple[int, dict[int, Delta]]] = {}

    @property
    def n(self) -> int:
        """Number of shards."""
        return len(self.plan)

    # -- copy on write ----------------------------------------------------------------------
    def track(self, trackers: list[zmq.MessageTracker], pinned: dict[str, int]) -> None:
        """Remember a reply whose frames are θ's own memory until libzmq lets go of them."""
        if pinned:
            with self.lock:
                self._sends.append(_Send(trackers, pinned))

    def unshare(self) -> None:
        """Before θ is written (the server's ``before_write``): every parameter still in a
        dispatch that some shard has yet to send, or in a reply in flight, gets fresh storage;
        the dispatch keeps the old tensor. Updates never wait for a slow receiver."""
        params = self.server.params
        with self.lock:
            self._sends = [s for s in self._sends if not all(t.done for t in s.trackers)]
            stale = {
                name
                for s in self._sends
                for name, address in s.pinned.items()
                if params[name].data_ptr() == address
            }
            for view in self._views.values():
                for i, names in enumerate(self.plan):
                    if i not in view.sent:
                        stale.update(k for k in names if view.params[k] is params[k])
            self.server.unshare(stale)

    # -- dispatches -------------------------------------------------------------------------
    def open_view(self, d: Dispatch) -> None:
        """Keep dispatch ``d`` (it replaces the worker's previous one) until every shard has
        sent its part."""
        with self.lock:
            self._views[d.worker] = _View(d.round_id, d.revision, d.params)

    def view_of(self, shard: int, worker: int, round_id: int) -> tuple[int, Params] | None:
        """(revision, this shard's tensors) of the worker's dispatch ``round_id``, or None if it
        is not (or no longer) open."""
        with self.lock:
            view = self._views.get(worker)
            if view is None or view.round_id != round_id:
                return None
            return view.revision, {k: view.params[k] for k in self.plan[shard]}

    def sent(
        self,
        shard: int,
        worker: int,
        round_id: int,
        trackers: list[zmq.MessageTracker],
        pinned: dict[str, int],
    ) -> None:
        """Shard ``shard`` has handed its part of the dispatch to libzmq: track the frames
        instead, and close the view once every shard has sent."""
        with self.lock:
            if pinned:
                self._sends.append(_Send(trackers, pinned))
            view = self._views.get(worker)
            if view is not None and view.round_id == round_id:
                view.sent.add(shard)
                if len(view.sent) == self.n:
                    del self._views[worker]

    def forget(self, workers: Iterable[int]) -> None:
        """Drop the open dispatches and staged parts of workers that are gone (evicted)."""
        with self.lock:
            for w in workers:
                self._views.pop(w, None)
                self._staged.pop(w, None)

    # -- staging ----------------------------------------------------------------------------
    def stage(self, shard: int, worker: int, round_id: int, part: Delta) -> None:
        """Hold shard ``shard``'s part of the worker's round ``round_id`` (a part of another
        round of the same worker is dropped: one staged round per worker)."""
        with self.lock:
            held = self._staged.get(worker)
            if held is None or held[0] != round_id:
                held = (round_id, {})
                self._staged[worker] = held
            held[1][shard] = part

    def take(self, worker: int, round_id: int) -> Delta | None:
        """The worker's whole Δ of round ``round_id`` in the server's tensor order once every
        shard has staged its part (and no longer held), else None."""
        with self.lock:
            held = self._staged.get(worker)
            if held is None or held[0] != round_id or len(held[1]) != self.n:
                return None
            del self._staged[worker]
        return Merged(held[1], self.plan, list(self.server.params))


class Merged(Mapping[str, torch.Tensor]):
    """The shards' parts of one Δ as one mapping in ``order``; reading a tensor reads it from
    its shard's part (decoding nothing else)."""

    def __init__(self, parts: Mapping[int, Delta], plan: list[list[str]], order: list[str]):
        self.parts = parts
        self.owner = {name: i for i, names in enumerate(plan) for name in names}
        self.order = order

    def __getitem__(self, name: str) -> torch.Tensor:
        return self.parts[self.owner[name]][name]

    def chunk(self, name: str, lo: int, hi: int) -> torch.Tensor:
        """Elements ``[lo, hi)`` of tensor ``name`` flattened, read from its shard's part."""
        return read_chunk(self.parts[self.owner[name]], name, lo, hi)

    def __iter__(self) -> Iterator[str]:
        return iter(self.order)

    def __len__(self) -> int:
        return len(self.order)


class ShardService:
    """Answers the requests a shard serves itself: ``stage`` and ``fetch`` of its tensors."""

    def __init__(self, index: int, state: ShardState, n_workers: int) -> None:
        self.index = index
        self.state = state
        self.n_workers = n_workers
        self.names = state.plan[index]
        self.shapes = {k: tuple(state.server.params[k].shape) for k in self.names}
        self.counters: dict[str, int] = {"staged": 0, "fetched": 0, "refused": 0}

    def answer(self, msg: Message, peer: str | None) -> Message:
        """One reply to a validated ``stage`` or ``fetch`` (``error`` for anything else)."""
        try:
            if msg.type not in messages.SHARD_REQUESTS:
                raise WireError("wrong_shard", f"shard {self.index} serves only stage and fetch")
            if msg.tensors and msg.type != "stage":
                raise WireError("malformed", f"a {msg.type!r} request carries no tensors")
            try:
                body = messages.parse(messages.RoundRef, msg.body)
            except messages.InvalidMessage as exc:
                raise WireError("malformed", f"{msg.type}: {exc}") from None
            check_peer(peer, body.worker)
            if body.worker >= self.n_workers:
                raise WireError("bad_worker", f"worker {body.worker} not in [0, {self.n_workers})")
            if msg.type == "stage":
                return self._stage(msg, body)
            return self._fetch(msg, body)
        except WireError as exc:
            self.counters["refused"] += 1
            return error(msg, exc.reason, str(exc))

    def _stage(self, msg: Message, body: messages.RoundRef) -> Message:
        if set(msg.tensors) != set(self.names):
            raise WireError("bad_update", f"tensors differ from shard {self.index}'s")
        for name, enc in msg.tensors.items():
            if enc.shape != self.shapes[name]:
                raise WireError("bad_update", f"{name}: shape {enc.shape} != {self.shapes[name]}")
            if not compress.is_finite(enc):
                raise WireError("bad_update", f"{name}: non-finite values")
        self.state.stage(self.index, body.worker, body.round_id, compress.Decoded(msg.tensors))
        self.counters["staged"] += 1
        return wire.make("staged", {"round_id": body.round_id}, re=msg.id)

    def _fetch(self, msg: Message, body: messages.RoundRef) -> Message:
        found = self.state.view_of(self.index, body.worker, body.round_id)
        if found is None:
            raise WireError("superseded", f"no open dispatch {body.round_id} of {body.worker}")
        revision, part = found
        self.counters["fetched"] += 1
        reply = {"round_id": body.round_id, "revision": revision}
        return wire.make("slice", reply, part, codec="fp32", re=msg.id)


def shard_bind(bind: str, index: int) -> str:
    """Shard ``index``'s address: the leader's host, port + index (port 0: any free port)."""
    host, port = bind.rsplit(":", 1)
    if port in ("0", "*"):
        return bind
    return f"{host}:{int(port) + index}"


def part_sizes(params: Params) -> dict[str, int]:
    """Bytes of each parameter in fp32 (what :func:`plan_shards` balances)."""
    return {k: 4 * v.numel() for k, v in params.items()}


def tensor_bytes(tensors: Iterable[torch.Tensor]) -> int:
    """fp32 bytes of ``tensors``."""
    return sum(4 * t.numel() for t in tensors)
