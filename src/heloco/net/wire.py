"""Wire format: one message = a JSON header frame, raw tensor frames, and an HMAC tag frame.

Frames, in order::

    header   UTF-8 JSON: {"v", "type", "id", "re", "ts", "body", "tensors": [TensorMeta...]}
    data_0   raw bytes of tensor 0 (fp32 / bf16 / int8 elements, top-k values, sign bits)
    scales_0 int8: fp32 block scales; top-k: int32 indices; sign: scales (one per block)
    ...
    tag      HMAC-SHA256(secret, length-prefixed header + tensor frames)

``id`` is a random 128-bit nonce and ``ts`` the sender's Unix time; both are inside the
authenticated header so a receiver can recognise replays (:class:`heloco.net.auth.ReplayGuard`).
``re`` names the request a reply answers, so a client can drop late replies to requests it has
given up on. Decoding checks the tag first, then sizes, and never unpickles anything. Tensor frames are
never copied on the way: an encoded fp32 tensor is sent from its own memory, and a received one
decodes to a view of its frame (:mod:`heloco.net.compress`).
"""

from __future__ import annotations

import json
import math
import os
import re
import time
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any

import numpy as np
import torch

from heloco.codecs import CodedDelta
from heloco.net import auth, compress, messages
from heloco.net.compress import Codec, Encoded
from heloco.net.messages import Header
from heloco.types import Params

PROTOCOL_VERSION = 1
DEFAULT_MAX_BYTES = 1 << 30  # 1 GiB per message: a 250M-parameter fp32 model
MAX_HEADER_BYTES = 1 << 20  # the JSON header (names, shapes, metadata) stays small
MAX_JSON_DEPTH = 16  # nesting of the header's JSON (ours is at most 5 deep)

Frame = compress.Buffer


class WireError(ValueError):
    """A message that cannot be accepted. ``reason`` is a short counter name."""

    def __init__(self, reason: str, detail: str) -> None:
        self.reason = reason
        super().__init__(f"{reason}: {detail}")


@dataclass(frozen=True)
class Message:
    """A decoded (or to-be-encoded) message. ``tensors`` keep the header's order."""

    type: str
    body: dict[str, Any] = field(default_factory=dict)
    tensors: dict[str, Encoded] = field(default_factory=dict)
    id: str = ""
    re: str = ""
    ts: float = 0.0

    def params(self, device: torch.device | str = "cpu") -> Params:
        """The tensors decoded to fp32 (raises ``WireError('bad_tensor')`` on a size mismatch).

        fp32 tensors on the CPU are views of the received frames (no copy)."""
        out: Params = {}
        for name, enc in self.tensors.items():
            try:
                out[name] = compress.decode(enc, device)
            except ValueError as exc:
                raise WireError("bad_tensor", f"{name}: {exc}") from exc
        return out


def new_id() -> str:
    """A random 128-bit message id (hex)."""
    return os.urandom(16).hex()


def make(
    type_: str,
    body: dict[str, Any] | None = None,
    params: Mapping[str, torch.Tensor] | None = None,
    codec: Codec = "fp32",
    block: int = compress.DEFAULT_BLOCK,
    re: str = "",
    threads: int = 1,
) -> Message:
    """Build a message with a fresh id and timestamp, encoding ``params`` with ``codec``
    (int8 quantised on ``threads`` threads). A :class:`heloco.codecs.CodedDelta` is sent as
    it was compressed (top-k, sign), whatever ``codec`` says."""
    if isinstance(params, CodedDelta):
        tensors = {k: compress.from_coded(c) for k, c in params.coded.items()}
    else:
        tensors = {k: compress.encode(v, codec, block, threads) for k, v in (params or {}).items()}
    return Message(type_, dict(body or {}), tensors, new_id(), re, time.time())


def _header(msg: Message) -> bytes:
    meta = [
        {"name": k, "codec": e.codec, "shape": list(e.shape), "block": e.block}
        | ({"k": e.k} if e.codec.startswith("topk") else {})
        for k, e in msg.tensors.items()
    ]
    head = {
        "v": PROTOCOL_VERSION,
        "type": msg.type,
        "id": msg.id,
        "re": msg.re,
        "ts": msg.ts,
        "body": msg.body,
        "tensors": meta,
    }
    return json.dumps(head, separators=(",", ":"), allow_nan=False).encode()


def encode(msg: Message, secret: bytes, threads: int = 1) -> list[Frame]:
    """Frames of ``msg`` with its HMAC tag appended (hashed on ``threads`` threads)."""
    frames: list[Frame] = [_header(msg)]
    for enc in msg.tensors.values():
        frames.append(enc.data)
        if enc.codec in compress.TWO_FRAMES:
            frames.append(enc.scales)
    frames.append(auth.sign(secret, frames, threads))
    return frames


def wire_bytes(frames: Sequence[Frame]) -> int:
    """Total bytes of a framed message."""
    return sum(len(f) for f in frames)


def _reject_constant(name: str) -> Any:
    """Strict JSON: NaN and ±Infinity are not numbers a peer may send."""
    raise ValueError(f"non-standard JSON constant {name}")


_STRING = re.compile(rb'"(?:[^"\\]|\\.)*"')
_OPEN = np.zeros(256, dtype=np.int8)
_OPEN[[ord("["), ord("{")]] = 1
_OPEN[[ord("]"), ord("}")]] = -1


def json_depth(raw: bytes) -> int:
    """Deepest nesting of ``[``/``{`` in JSON text, strings skipped; linear time, no recursion.

    Run before ``json.loads`` so a header nested 100,000 deep is refused by a count, not by
    the parser's recursion limit.
    """
    outside = _STRING.sub(b"", raw)
    if not outside:
        return 0
    steps = _OPEN[np.frombuffer(outside, dtype=np.uint8)].astype(np.int64)
    return int(np.cumsum(steps).max(initial=0))


def _parse_header(raw: Frame) -> Header:
    """The header frame as a validated :class:`Header` (bounded size and depth, strict JSON)."""
    text = bytes(raw)
    if len(text) > MAX_HEADER_BYTES:
        raise WireError("too_large", f"header of {len(text)} bytes > {MAX_HEADER_BYTES}")
    depth = json_depth(text)
    if depth > MAX_JSON_DEPTH:
        raise WireError("bad_header", f"JSON nested {depth} deep > {MAX_JSON_DEPTH}")
    try:
        data = json.loads(text, parse_constant=_reject_constant)
    except (UnicodeDecodeError, ValueError, RecursionError) as exc:  # JSONDecodeError: ValueError
        raise WireError("bad_header", str(exc)[:200]) from None
    if isinstance(data, dict) and data.get("v", PROTOCOL_VERSION) != PROTOCOL_VERSION:
        raise WireError("bad_version", f"expected protocol v{PROTOCOL_VERSION}")
    try:
        head = messages.parse(Header, data)
    except messages.InvalidMessage as exc:
        raise WireError("bad_header", str(exc)) from None
    names = [t.name for t in head.tensors]
    if len(set(names)) != len(names):
        raise WireError("bad_header", "a tensor name appears twice")
    for t in head.tensors:
        blocked = t.codec == "int8" or t.codec.startswith("sign")
        if blocked != (t.block >= 1):
            raise WireError("bad_header", f"tensor {t.name!r}: block {t.block} with {t.codec}")
        if t.k and not t.codec.startswith("topk"):
            raise WireError("bad_header", f"tensor {t.name!r}: k {t.k} with {t.codec}")
        if t.k > math.prod(t.shape):
            raise WireError("bad_header", f"tensor {t.name!r}: k {t.k} > {math.prod(t.shape)}")
    return head


def decode(
    frames: Sequence[Frame], secret: bytes, max_bytes: int = DEFAULT_MAX_BYTES, threads: int = 1
) -> Message:
    """Authenticate (the tag hashed on ``threads`` threads) and parse a framed message.

    Order of checks: total size (cheap, before hashing), HMAC tag, header, then every tensor's
    byte count against its declared shape (and a top-k tensor's indices: sorted, unique, in
    range). Raises :class:`WireError` with reason ``too_large``,
    ``bad_frames``, ``bad_mac``, ``bad_header``, ``bad_version`` or ``bad_tensor``.
    """
    total = wire_bytes(frames)
    if total > max_bytes:
        raise WireError("too_large", f"{total} bytes > limit {max_bytes}")
    if len(frames) < 2:
        raise WireError("bad_frames", f"{len(frames)} frames")
    body_frames, tag = frames[:-1], bytes(frames[-1])
    if len(tag) != auth.TAG_BYTES or not auth.verify(secret, body_frames, tag, threads):
        raise WireError("bad_mac", "HMAC tag does not match")
    head = _parse_header(body_frames[0])
    tensors: dict[str, Encoded] = {}
    cursor = 1
    for meta in head.tensors:
        want = 2 if meta.codec in compress.TWO_FRAMES else 1
        if cursor + want > len(body_frames):
            raise WireError("bad_frames", f"tensor {meta.name!r}: missing frames")
        data, scales = body_frames[cursor], body_frames[cursor + 1] if want == 2 else b""
        cursor += want
        shape = tuple(meta.shape)
        want_data, want_scales = compress.expected_nbytes(
            meta.codec, shape, meta.block or 1, meta.k
        )
        if len(data) != want_data or len(scales) != want_scales:
            raise WireError(
                "bad_tensor", f"tensor {meta.name!r}: byte count does not match shape {shape}"
            )
        enc = Encoded(meta.codec, shape, meta.block, data, scales, meta.k)
        if compress.is_coded(meta.codec):
            try:
                compress.check_structure(enc)
            except ValueError as exc:
                raise WireError("bad_tensor", f"tensor {meta.name!r}: {exc}") from None
        tensors[meta.name] = enc
    if cursor != len(body_frames):
        raise WireError("bad_frames", f"{len(body_frames) - cursor} unexpected frames")
    return Message(head.type, head.body, tensors, head.id, head.re, head.ts)
