"""Shared-secret authentication: loading the secret, HMAC-SHA256 tags and a replay guard.

Every message carries an HMAC-SHA256 tag (RFC 2104) over its header (which holds a random
message id and a timestamp) and all tensor frames. This gives integrity and sender
authentication between holders of the secret, per message. Confidentiality, and refusing
unknown peers before they can send anything, come from CURVE in the connection handshake
(:mod:`heloco.net.keys`); the HMAC is a second, independent layer on top of it.

The tag is ``HMAC(secret, ‖_f len(f) ‖ body(f))`` over the frames ``f``: ``body(f)`` is the
frame itself up to :data:`PIECE_BYTES`, else the SHA-256 digests of its consecutive
:data:`PIECE_BYTES` pieces (hash-then-MAC over a collision-resistant hash, as in a Merkle
tree: forging it needs a SHA-256 collision or an HMAC forgery; the length fixes the form).
The pieces hash independently, so a large message is hashed on several cores at once
(``hashlib`` releases the GIL): workers sign and verify on
:data:`heloco.net.pool.WORKER_THREADS` threads, a server shard on its own one thread.
"""

from __future__ import annotations

import hashlib
import hmac
import os
import time
from collections import OrderedDict
from collections.abc import Iterable
from pathlib import Path

from heloco.net.pool import parallel_map
from shardmeter.errors import UserInputError

SECRET_ENV = "HELOCO_SECRET"
SECRET_FILE_ENV = "HELOCO_SECRET_FILE"
MIN_SECRET_BYTES = 16
MAX_SECRET_BYTES = 4096
TAG_BYTES = 32  # SHA-256 output
PIECE_BYTES = 1 << 20  # a frame above 1 MiB is MACed as the SHA-256 digests of 1 MiB pieces
PARALLEL_BYTES = 8 << 20  # hash on several threads only above 8 MiB in all

Frames = Iterable[bytes | bytearray | memoryview]


def load_secret(secret_file: Path | None = None, fallback: Path | None = None) -> bytes:
    """The shared secret: from ``secret_file``, else ``$HELOCO_SECRET``, else
    ``$HELOCO_SECRET_FILE``, else the ``fallback`` file (a key folder's ``hmac.secret``).

    Never taken from the command line, where it would show in ``ps`` and shell history.
    """
    if secret_file is None and os.environ.get(SECRET_ENV):
        value = os.environ[SECRET_ENV].encode()
        source = f"${SECRET_ENV}"
    else:
        path = secret_file or (
            Path(os.environ[SECRET_FILE_ENV]) if os.environ.get(SECRET_FILE_ENV) else fallback
        )
        if path is None:
            raise UserInputError(
                "secret",
                None,
                f"pass --keys DIR (from `heloco keys`), --secret-file, or set ${SECRET_ENV} "
                f"or ${SECRET_FILE_ENV}",
            )
        if not path.is_file():
            raise UserInputError("secret_file", str(path), "an existing file holding the secret")
        with path.open("rb") as f:
            value = f.read(MAX_SECRET_BYTES + 1).strip()
        source = str(path)
    if not MIN_SECRET_BYTES <= len(value) <= MAX_SECRET_BYTES:
        raise UserInputError(
            "secret",
            f"<{len(value)} bytes from {source}>",
            f"{MIN_SECRET_BYTES} to {MAX_SECRET_BYTES} bytes",
        )
    return value


def new_secret() -> bytes:
    """A fresh random secret (32 bytes, hex encoded) for local launches."""
    return os.urandom(32).hex().encode()


def _pieces(frame: bytes | bytearray | memoryview) -> list[memoryview]:
    """A large frame's consecutive :data:`PIECE_BYTES` pieces, as byte views (no copy)."""
    view = memoryview(frame)
    if view.format != "B" or view.ndim != 1:
        view = view.cast("B")
    return [view[i : i + PIECE_BYTES] for i in range(0, len(view), PIECE_BYTES)]


def _sha256(piece: memoryview) -> bytes:
    return hashlib.sha256(piece).digest()


def sign(secret: bytes, frames: Frames, threads: int = 1) -> bytes:
    """The tag of ``frames`` (see the module docstring; no copy of tensor payloads). With
    ``threads`` > 1 a large message's pieces are hashed on that many threads: same tag."""
    frames = list(frames)
    large = [_pieces(f) if len(f) > PIECE_BYTES else [] for f in frames]
    pieces = [p for ps in large for p in ps]
    parallel = threads > 1 and sum(len(f) for f in frames) > PARALLEL_BYTES
    digests = parallel_map(_sha256, pieces, threads if parallel else 1)
    mac = hmac.new(secret, digestmod=hashlib.sha256)
    at = 0
    for frame, ps in zip(frames, large, strict=True):
        mac.update(len(frame).to_bytes(8, "little"))
        if ps:
            mac.update(b"".join(digests[at : at + len(ps)]))
            at += len(ps)
        else:
            mac.update(frame)
    return mac.digest()


def verify(secret: bytes, frames: Frames, tag: bytes, threads: int = 1) -> bool:
    """Constant-time check of a tag (``hmac.compare_digest``)."""
    return hmac.compare_digest(sign(secret, frames, threads), tag)


class ReplayGuard:
    """Recognises replays: a message id seen before, or a timestamp outside ±``window_s``.

    Ids are remembered for ``window_s`` (older messages are rejected by time anyway), so memory
    stays bounded by the message rate times the window.
    """

    def __init__(self, window_s: float = 300.0) -> None:
        self.window_s = window_s
        self._seen: OrderedDict[str, float] = OrderedDict()

    def check(self, msg_id: str, ts: float, now: float | None = None) -> str | None:
        """None if fresh (and remember it); otherwise the reason: ``"stale"`` or ``"replay"``."""
        now = time.time() if now is None else now
        while self._seen and next(iter(self._seen.values())) < now - self.window_s:
            self._seen.popitem(last=False)
        if abs(now - ts) > self.window_s:
            return "stale"
        if msg_id in self._seen:
            return "replay"
        self._seen[msg_id] = now
        return None
