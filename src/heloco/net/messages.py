"""Validated shapes of every message: the header, each request body and each reply body.

A peer's JSON reaches the server's state only through these models. They are strict: types
are exact (``true`` is not an integer, ``1.0`` is not a count, a string is not a number),
floats are finite, integers are bounded (``10**400`` is rejected, not converted), strings are
short, and unknown fields are refused. So a malformed message is answered with one ``error``
reply and never raises anywhere else, and nothing out of range is ever stored or checkpointed.

The bounds are far above any real run (2**53 tokens, 2**20 inner steps per round, 2**16
worker slots) and far below what breaks arithmetic or JSON (``float(10**400)`` overflows).
"""

from __future__ import annotations

import reprlib
from typing import Annotated, Any, Literal, TypeVar

from pydantic import BaseModel, ConfigDict, Field, ValidationError

from heloco.net.compress import WireCodec

MAX_COUNT = 2**53  # revisions, round ids, tokens: exact as JSON numbers and as float64
MAX_STEPS = 2**20  # inner steps in one round
MAX_WORKERS = 2**16  # worker slots a request may name (the server checks its own K)
MAX_TENSORS = 100_000  # tensors in one message
MAX_DIMS = 8  # dimensions of one tensor
MAX_DIM = 2**40  # elements along one dimension (the byte count bounds the product)
MAX_BLOCK = 2**24  # elements per int8 block
MAX_NAME = 512  # characters of a tensor name
MAX_SECONDS = 1e7  # measured compute seconds of one round (about 4 months)
MAX_LOSS = 1e9  # reported mean training loss, in either direction
MAX_SHARDS = 256  # shards of one server
MAX_FRAGMENTS = 1024  # streaming fragments of one model (heloco.streaming.MAX_FRAGMENTS)
Fragment = Annotated[int, Field(ge=0, lt=MAX_FRAGMENTS)]

Count = Annotated[int, Field(ge=0, le=MAX_COUNT)]
Seconds = Annotated[float, Field(gt=0, le=MAX_SECONDS)]
MessageId = Annotated[str, Field(pattern=r"^[0-9a-f]{32}$")]
ReplyTo = Annotated[str, Field(pattern=r"^([0-9a-f]{32})?$")]
Incarnation = Annotated[str, Field(max_length=64, pattern=r"^[0-9A-Za-z_.-]*$")]
Reason = Annotated[str, Field(max_length=64)]


class Strict(BaseModel):
    """Exact types, finite floats, no unknown fields, immutable."""

    model_config = ConfigDict(strict=True, extra="forbid", frozen=True, allow_inf_nan=False)


class TensorMeta(Strict):
    """One tensor's entry in the header: name, codec, shape, int8 block size (sign: elements
    per scale) and, for top-k only, the values kept ``k``."""

    name: str = Field(min_length=1, max_length=MAX_NAME)
    codec: WireCodec
    shape: list[Annotated[int, Field(ge=0, le=MAX_DIM)]] = Field(max_length=MAX_DIMS)
    block: int = Field(ge=0, le=MAX_BLOCK)
    k: int = Field(0, ge=0, le=MAX_COUNT)


class Header(Strict):
    """The first frame of every message (see :mod:`heloco.net.wire`)."""

    v: Literal[1]
    type: str = Field(min_length=1, max_length=32)
    id: MessageId
    re: ReplyTo
    ts: float = Field(ge=0, le=1e11)
    body: dict[str, Any]
    tensors: list[TensorMeta] = Field(max_length=MAX_TENSORS)


# -- requests (worker -> server) ----------------------------------------------------------------
class Ident(Strict):
    """Who sends a request: the worker slot and the sending process's incarnation."""

    worker: int = Field(ge=0, lt=MAX_WORKERS)
    incarnation: Incarnation = ""


class Push(Ident):
    """A finished round: which dispatch it answers, how much work it was, what it measured."""

    round_id: Count
    base_revision: Count
    steps: int = Field(ge=1, le=MAX_STEPS)
    tokens: Count
    mean_loss: float | None = Field(None, ge=-MAX_LOSS, le=MAX_LOSS)
    compute_s: Seconds | None = None
    # The worker's clock, from sending the pull this round trained from: until its dispatch
    # was decoded (recv_s) and until this push began (lead_s); heloco.net.coordinator.
    recv_s: Annotated[float, Field(ge=0, le=MAX_SECONDS)] | None = None
    lead_s: Annotated[float, Field(ge=0, le=MAX_SECONDS)] | None = None
    # From sending that pull until the round's first inner step (an overlapped round starts
    # at its boundary, not when a dispatch is decoded); None: compute ends as the push begins.
    compute_from_s: Annotated[float, Field(ge=0, le=MAX_SECONDS)] | None = None
    # Streaming (heloco.streaming): the one fragment Δ holds; the server checks it against
    # its own P and the dispatch's, and the tensors against that fragment's names.
    fragment: Fragment | None = None


class Empty(Strict):
    """A request without a body (``status``)."""


class RoundRef(Ident):
    """A sharded server's ``stage`` (this shard's part of a round's Δ) or ``fetch`` (this
    shard's part of a dispatch): which worker's round."""

    round_id: Count


REQUESTS: dict[str, type[Strict]] = {
    "hello": Ident,
    "pull": Ident,
    "push": Push,
    "heartbeat": Ident,
    "bye": Ident,
    "status": Empty,
    "slot": Ident,
}
SHARD_REQUESTS: dict[str, type[Strict]] = {"stage": RoundRef, "fetch": RoundRef}
TENSOR_REQUESTS = frozenset({"push", "stage"})  # the only requests that may carry tensors


# -- replies (server -> worker) -----------------------------------------------------------------
class ShardInfo(Strict):
    """One shard of a sharded server: its port (same host as the server) and its tensors."""

    port: int = Field(ge=1, le=65535)
    tensors: list[Annotated[str, Field(min_length=1, max_length=MAX_NAME)]] = Field(
        max_length=MAX_TENSORS
    )


class Welcome(Strict):
    """Reply to ``hello``: the run config the worker builds, and where its slot stands.
    ``shards`` lists a sharded server's shards (empty: one process serves every tensor)."""

    run: dict[str, Any]
    heartbeat_s: Seconds
    revision: Count
    n_workers: int = Field(ge=1, le=MAX_WORKERS)
    worker_steps: Count
    shards: list[ShardInfo] = Field(default_factory=list, max_length=MAX_SHARDS)
    link_slots: bool = False  # ask for the server link (``slot``) before each push


class DispatchBody(Strict):
    """Reply to ``pull`` with the parameters: train ``steps`` from ``revision``."""

    revision: Count
    steps: int = Field(ge=1, le=MAX_STEPS)
    round_id: Count
    # Streaming: the fragment the push answering this dispatch carries (the tensors are then
    # every parameter or one fragment's; heloco.streaming).
    fragment: Fragment | None = None


class Staged(Strict):
    """Reply to ``stage``: this shard holds its part of the round's Δ until the ``push``."""

    round_id: Count


class SliceBody(Strict):
    """Reply to ``fetch`` with this shard's tensors of the dispatch ``round_id``."""

    round_id: Count
    revision: Count


class Wait(Strict):
    """Reply to ``pull`` while a barrier or start is pending, or to ``slot`` while another
    worker's push holds the server's link: ask again after ``retry_s``."""

    retry_s: float = Field(gt=0, le=60)
    revision: Count


class Done(Strict):
    """Reply to ``pull`` once the run's budget is reached."""

    revision: Count


class Ack(Strict):
    """Reply to an accepted ``push``. ``staleness`` is the revision log's, None until applied."""

    revision: Count
    applied: bool
    duplicate: bool
    staleness: Count | None


class Rejected(Strict):
    """Reply to a ``push`` the revision log refuses (done, superseded, evicted, ...)."""

    reason: Reason
    revision: Count


class Pong(Strict):
    """Reply to ``heartbeat`` and ``bye``; ``done`` tells a worker the run is over."""

    revision: Count
    done: bool


class Granted(Strict):
    """Reply to ``slot``: the server's link is this worker's until its push arrives."""

    revision: Count


class ErrorBody(Strict):
    """Reply to a request that was malformed or invalid; nothing was applied."""

    reason: Reason
    detail: str = Field(max_length=1000)


REPLIES: dict[str, type[Strict]] = {
    "welcome": Welcome,
    "dispatch": DispatchBody,
    "wait": Wait,
    "done": Done,
    "ack": Ack,
    "rejected": Rejected,
    "pong": Pong,
    "error": ErrorBody,
    "staged": Staged,
    "slice": SliceBody,
    "slot": Granted,
}

M = TypeVar("M", bound=BaseModel)


class InvalidMessage(ValueError):
    """A body that does not match its model; the message names the first bad field."""


def parse(model: type[M], data: Any) -> M:
    """``model`` validated from ``data``, or :class:`InvalidMessage` naming the field."""
    try:
        return model.model_validate(data)
    except ValidationError as exc:
        raise InvalidMessage(describe(exc)) from None


def describe(exc: ValidationError) -> str:
    """One line: the first error's field path, what was wrong and (shortened) the value."""
    err = exc.errors(include_url=False)[0]
    where = ".".join(str(p) for p in err["loc"]) or "message"
    return f"{where}: {err['msg']} (got {_SHORT.repr(err.get('input'))})"


def _short_repr() -> reprlib.Repr:
    """A repr that stays short for any value (a peer may send megabytes)."""
    r = reprlib.Repr()
    r.maxlevel, r.maxdict, r.maxlist = 2, 3, 3
    r.maxstring = r.maxlong = r.maxother = 40
    return r


_SHORT = _short_repr()
