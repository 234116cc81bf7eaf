"""Unit tests of the wire format, codecs and authentication (single process)."""

from __future__ import annotations

import json
import math
import time
from pathlib import Path

import pytest
import torch
from hypothesis import given, settings
from hypothesis import strategies as st

from heloco.net import auth, compress, wire
from heloco.net.wire import WireError
from shardmeter.errors import UserInputError

SECRET = b"0123456789abcdef-test-secret"


@settings(max_examples=60, deadline=None)
@given(
    shape=st.lists(st.integers(0, 9), min_size=0, max_size=4),
    block=st.integers(1, 64),
    scale=st.floats(1e-6, 1e6),
    seed=st.integers(0, 2**31 - 1),
)
def test_int8_roundtrip_within_documented_bound(
    shape: list[int], block: int, scale: float, seed: int
) -> None:
    g = torch.Generator().manual_seed(seed)
    x = torch.randn(tuple(shape), generator=g) * scale
    enc = compress.encode(x, "int8", block)
    y = compress.decode(enc)
    assert y.shape == x.shape and y.dtype == torch.float32
    bound = compress.int8_error_bound(x, block).view_as(x)
    err = (y - x).abs()
    # max abs error <= max|x_b| / 254 per block, plus fp32 rounding of the product q * s.
    assert bool((err <= bound * (1 + 1e-5) + 1e-30).all()), float((err - bound).max())
    assert len(enc.scales) == 4 * compress.n_blocks(x.numel(), block)


def test_int8_bound_is_tight_and_zero_block_exact() -> None:
    x = torch.tensor([1.0, 0.5 / 127 * 0.999, 0.0, 0.0, 0.0, 0.0])
    enc = compress.encode(x, "int8", block=2)
    y = compress.decode(enc)
    assert torch.equal(y[2:], torch.zeros(4))
    assert float((y - x).abs().max()) <= 1.0 / 254
    assert float((y - x).abs().max()) > 0.9 / 254


@pytest.mark.parametrize("codec", ["fp32", "bf16", "int8"])
def test_codecs_any_shape(codec: compress.Codec) -> None:
    for shape in [(), (0,), (7,), (3, 5), (2, 3, 4, 5)]:
        x = torch.randn(shape)
        y = compress.decode(compress.encode(x, codec, block=8))
        assert y.shape == x.shape
        if codec == "fp32":
            assert torch.equal(x, y)
        elif codec == "bf16":
            assert torch.allclose(x, y, rtol=2**-8, atol=0)


def test_encoded_sizes() -> None:
    x = torch.randn(1000)
    assert compress.encode(x, "fp32").nbytes == 4000
    assert compress.encode(x, "bf16").nbytes == 2000
    assert compress.encode(x, "int8", block=100).nbytes == 1000 + 4 * 10
    with pytest.raises(UserInputError):
        compress.check_codec("fp8")


def test_message_roundtrip_and_tamper() -> None:
    params = {"a.weight": torch.randn(4, 3), "b": torch.randn(5)}
    msg = wire.make("push", {"worker": 1, "round_id": 3}, params, codec="int8", block=4)
    frames = wire.encode(msg, SECRET)
    out = wire.decode(frames, SECRET)
    assert out.type == "push" and out.body == {"worker": 1, "round_id": 3}
    assert out.id == msg.id and math.isclose(out.ts, msg.ts)
    got = out.params()
    assert list(got) == ["a.weight", "b"]
    assert torch.allclose(got["b"], params["b"], atol=float(params["b"].abs().max()) / 254 + 1e-7)
    with pytest.raises(WireError, match="bad_mac"):
        wire.decode(frames, b"another-secret-of-16+bytes")
    tampered = list(frames)
    tampered[1] = bytes(len(frames[1]))
    with pytest.raises(WireError, match="bad_mac"):
        wire.decode(tampered, SECRET)
    with pytest.raises(WireError, match="too_large"):
        wire.decode(frames, SECRET, max_bytes=wire.wire_bytes(frames) - 1)


def test_int8_on_threads_is_the_serial_result() -> None:
    x = torch.randn(2 * compress.CHUNK_ELEMENTS + 4099, generator=torch.Generator().manual_seed(1))
    q1, s1 = compress.quantize_int8(x, 4096)
    q3, s3 = compress.quantize_int8(x, 4096, threads=3)
    assert torch.equal(q1, q3) and torch.equal(s1, s3)


def test_tag_of_large_frames_is_the_same_on_any_thread_count_and_covers_every_byte() -> None:
    """Frames above a piece are MACed through their pieces' SHA-256 digests: the tag does not
    depend on how many threads hashed them, and still changes with any byte, any piece's
    order, or a byte moved across a frame boundary."""
    piece = auth.PIECE_BYTES
    gen = torch.Generator().manual_seed(0)
    big = torch.randint(0, 256, (9 * piece + 17,), dtype=torch.uint8, generator=gen).numpy()
    frames = [b"head", big.tobytes(), b"x" * 100, big[: piece + 1].tobytes()]
    assert sum(map(len, frames)) > auth.PARALLEL_BYTES  # hashed on threads when asked
    tag = auth.sign(SECRET, frames)
    assert auth.sign(SECRET, frames, threads=3) == tag
    assert auth.verify(SECRET, [memoryview(f) for f in frames], tag, threads=2)
    flipped = bytearray(frames[1])
    flipped[3 * piece + 5] ^= 1
    swapped = frames[1][piece : 2 * piece] + frames[1][:piece] + frames[1][2 * piece :]
    moved = [frames[0], frames[1][:-1], frames[1][-1:] + frames[2], frames[3]]
    for other in ([*frames[:1], flipped, *frames[2:]], [frames[0], swapped, *frames[2:]], moved):
        assert not auth.verify(SECRET, other, tag, threads=2)
    assert auth.sign(b"another-secret-of-16+bytes", frames) != tag


def test_tag_covers_frame_boundaries_of_small_frames() -> None:
    """The same bytes cut into frames differently (a header byte moved into a tensor frame, an
    empty frame added) get different tags: each frame's length is MACed before its bytes."""
    frames = [b'{"v":1}', b"\x00\x01\x02\x03", b"tail"]
    tag = auth.sign(SECRET, frames)
    for other in (
        [b'{"v":1', b"}\x00\x01\x02\x03", b"tail"],
        [b'{"v":1}', b"\x00\x01", b"\x02\x03tail"],
        [b'{"v":1}', b"", b"\x00\x01\x02\x03", b"tail"],
        [b"".join(frames)],
    ):
        assert b"".join(other) == b"".join(frames)
        assert not auth.verify(SECRET, other, tag)


def test_declared_shape_must_match_bytes() -> None:
    msg = wire.make("push", {}, {"w": torch.randn(6)})
    bad = wire.Message(
        msg.type,
        msg.body,
        {"w": compress.Encoded("fp32", (7,), 0, msg.tensors["w"].data)},
        msg.id,
        "",
        msg.ts,
    )
    with pytest.raises(WireError, match="bad_tensor"):
        wire.decode(wire.encode(bad, SECRET), SECRET)


def test_replay_guard() -> None:
    guard = auth.ReplayGuard(window_s=10.0)
    now = time.time()
    assert guard.check("a", now, now) is None
    assert guard.check("a", now, now + 1) == "replay"
    assert guard.check("b", now - 11, now) == "stale"
    assert guard.check("a", now + 20, now + 20) is None  # forgotten after the window


def test_load_secret(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.delenv(auth.SECRET_ENV, raising=False)
    monkeypatch.delenv(auth.SECRET_FILE_ENV, raising=False)
    with pytest.raises(UserInputError):
        auth.load_secret()
    monkeypatch.setenv(auth.SECRET_ENV, "short")
    with pytest.raises(UserInputError):
        auth.load_secret()
    monkeypatch.setenv(auth.SECRET_ENV, "x" * 20)
    assert auth.load_secret() == b"x" * 20
    f = tmp_path / "s"
    f.write_text("y" * 32 + "\n")
    assert auth.load_secret(f) == b"y" * 32


_json = st.recursive(
    st.none()
    | st.booleans()
    | st.integers(-5, 5)
    | st.floats(allow_nan=False)
    | st.text(max_size=5),
    lambda kids: (
        st.lists(kids, max_size=3) | st.dictionaries(st.text(max_size=5), kids, max_size=3)
    ),
    max_leaves=8,
)


@settings(max_examples=150, deadline=None)
@given(
    head=st.fixed_dictionaries(
        {},
        optional={
            "v": st.sampled_from([1, 2, "1"]),
            "type": st.sampled_from(["push", "pull", 3]),
            "id": st.text(max_size=4) | st.integers(),
            "re": st.text(max_size=4),
            "ts": st.floats(allow_nan=False) | st.text(max_size=2),
            "body": _json,
            "tensors": st.lists(
                st.fixed_dictionaries(
                    {},
                    optional={
                        "name": st.text(max_size=3) | st.integers(),
                        "codec": st.sampled_from(
                            ["fp32", "bf16", "int8", "fp8", "topk_bf16", "sign_fp32"]
                        ),
                        "shape": st.lists(st.integers(-2, 4), max_size=3) | _json,
                        "block": st.integers(-1, 8) | st.text(max_size=2),
                        "k": st.integers(-1, 8) | st.text(max_size=2),
                    },
                ),
                max_size=3,
            )
            | _json,
        },
    ),
    payload=st.lists(st.binary(max_size=40), max_size=4),
)
def test_authenticated_garbage_only_raises_wire_error(
    head: dict[str, object], payload: list[bytes]
) -> None:
    """A peer holding the secret but sending nonsense gets a WireError, never a crash."""
    frames: list[wire.Frame] = [json.dumps(head).encode(), *payload]
    frames.append(auth.sign(SECRET, frames))
    try:
        msg = wire.decode(frames, SECRET)
    except WireError:
        return
    msg.params()  # whatever decoded must also decode its tensors consistently


def test_non_standard_json_constants_rejected() -> None:
    frames: list[wire.Frame] = [
        b'{"v":1,"type":"push","id":"a","re":"","ts":NaN,"body":{},"tensors":[]}'
    ]
    frames.append(auth.sign(SECRET, frames))
    with pytest.raises(WireError, match="bad_header"):
        wire.decode(frames, SECRET)
