"""Wire format: one message = a JSON header frame, raw tensor frames, and an HMAC tag frame.

Frames, in order::

    header   UTF-8 JSON: {"v", "type", "id", "re", "ts", "body", "tensors": [TensorMeta...]}
    data_0   raw bytes of tensor 0 (fp32 / bf16 / int8, little endian)
    scales_0 fp32 block scales of tensor 0 (int8 only)
    ...
    tag      HMAC-SHA256(secret, length-prefixed header + tensor frames)

``id`` is a random 128-bit nonce and ``ts`` the sender's Unix time; both are inside the
authenticated header so a receiver can recognise replays (:class:`heloco.net.auth.ReplayGuard`).
``re`` names the request a reply answers, so a client can drop late replies to requests it has
given up on. Decoding checks the tag first, then sizes, and never unpickles anything.
"""

from __future__ import annotations

import json
import os
import time
from collections.abc import Sequence
from dataclasses import dataclass, field
from typing import Any

import torch

from heloco.net import auth, compress
from heloco.net.compress import Codec, Encoded
from heloco.types import Params

PROTOCOL_VERSION = 1
DEFAULT_MAX_BYTES = 1 << 30  # 1 GiB per message: a 250M-parameter fp32 model
MAX_HEADER_BYTES = 1 << 20  # the JSON header (names, shapes, metadata) stays small

Frame = bytes | memoryview


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
        """The tensors decoded to fp32 (raises ``WireError('bad_tensor')`` on a size mismatch)."""
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
    params: Params | None = None,
    codec: Codec = "fp32",
    block: int = compress.DEFAULT_BLOCK,
    re: str = "",
) -> Message:
    """Build a message with a fresh id and timestamp, encoding ``params`` with ``codec``."""
    tensors = {k: compress.encode(v, codec, block) for k, v in (params or {}).items()}
    return Message(type_, dict(body or {}), tensors, new_id(), re, time.time())


def _header(msg: Message) -> bytes:
    meta = [
        {"name": k, "codec": e.codec, "shape": list(e.shape), "block": e.block}
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


def encode(msg: Message, secret: bytes) -> list[Frame]:
    """Frames of ``msg`` with its HMAC tag appended."""
    frames: list[Frame] = [_header(msg)]
    for enc in msg.tensors.values():
        frames.append(enc.data)
        if enc.codec == "int8":
            frames.append(enc.scales)
    frames.append(auth.sign(secret, frames))
    return frames


def wire_bytes(frames: Sequence[Frame]) -> int:
    """Total bytes of a framed message."""
    return sum(len(f) for f in frames)


def _reject_constant(name: str) -> Any:
    """Strict JSON: NaN and ±Infinity are not numbers a peer may send."""
    raise ValueError(f"non-standard JSON constant {name}")


def _parse_header(raw: Frame) -> dict[str, Any]:
    try:
        head = json.loads(bytes(raw), parse_constant=_reject_constant)
    except (UnicodeDecodeError, ValueError) as exc:  # JSONDecodeError is a ValueError
        raise WireError("bad_header", str(exc)) from exc
    if not isinstance(head, dict) or head.get("v") != PROTOCOL_VERSION:
        raise WireError("bad_version", f"expected protocol v{PROTOCOL_VERSION}")
    for key, kind in (("type", str), ("id", str), ("re", str), ("body", dict), ("tensors", list)):
        if not isinstance(head.get(key), kind):
            raise WireError("bad_header", f"field {key!r} missing or not {kind.__name__}")
    if not isinstance(head.get("ts"), int | float):
        raise WireError("bad_header", "field 'ts' missing or not a number")
    return head


def _tensor_meta(meta: Any) -> tuple[str, Codec, tuple[int, ...], int]:
    if not isinstance(meta, dict):
        raise WireError("bad_header", "tensor entry is not an object")
    name, codec, shape, block = (
        meta.get("name"),
        meta.get("codec"),
        meta.get("shape"),
        meta.get("block"),
    )
    if not isinstance(name, str) or codec not in compress.CODECS:
        raise WireError("bad_header", f"tensor {name!r}: bad name or codec {codec!r}")
    if not isinstance(shape, list) or not all(isinstance(s, int) and s >= 0 for s in shape):
        raise WireError("bad_header", f"tensor {name!r}: bad shape {shape!r}")
    if not isinstance(block, int) or (codec == "int8" and block < 1):
        raise WireError("bad_header", f"tensor {name!r}: bad block {block!r}")
    return name, codec, tuple(shape), block


def decode(frames: Sequence[Frame], secret: bytes, max_bytes: int = DEFAULT_MAX_BYTES) -> Message:
    """Authenticate and parse a framed message.

    Order of checks: total size (cheap, before hashing), HMAC tag, header, then every tensor's
    byte count against its declared shape. Raises :class:`WireError` with reason ``too_large``,
    ``bad_frames``, ``bad_mac``, ``bad_header``, ``bad_version`` or ``bad_tensor``.
    """
    total = wire_bytes(frames)
    if total > max_bytes:
        raise WireError("too_large", f"{total} bytes > limit {max_bytes}")
    if len(frames) < 2:
        raise WireError("bad_frames", f"{len(frames)} frames")
    body_frames, tag = frames[:-1], bytes(frames[-1])
    if len(tag) != auth.TAG_BYTES or not auth.verify(secret, body_frames, tag):
        raise WireError("bad_mac", "HMAC tag does not match")
    if len(body_frames[0]) > MAX_HEADER_BYTES:
        raise WireError("too_large", f"header of {len(body_frames[0])} bytes")
    head = _parse_header(body_frames[0])
    tensors: dict[str, Encoded] = {}
    cursor = 1
    for meta in head["tensors"]:
        name, codec, shape, block = _tensor_meta(meta)
        want = 2 if codec == "int8" else 1
        if cursor + want > len(body_frames):
            raise WireError("bad_frames", f"tensor {name!r}: missing frames")
        data = bytes(body_frames[cursor])
        scales = bytes(body_frames[cursor + 1]) if codec == "int8" else b""
        cursor += want
        want_data, want_scales = compress.expected_nbytes(codec, shape, block or 1)
        if len(data) != want_data or len(scales) != want_scales:
            raise WireError(
                "bad_tensor", f"tensor {name!r}: byte count does not match shape {shape}"
            )
        tensors[name] = Encoded(codec, shape, block, data, scales)
    if cursor != len(body_frames):
        raise WireError("bad_frames", f"{len(body_frames) - cursor} unexpected frames")
    return Message(head["type"], head["body"], tensors, head["id"], head["re"], float(head["ts"]))
