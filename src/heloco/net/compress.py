"""Pseudo-gradient codecs for the wire: fp32, bf16, blockwise int8, and the compressed payloads
of :mod:`heloco.codecs` (top-k, sign) as frames (pure torch, any shape).

A tensor is flattened, encoded on its own device, and exposed as raw little-endian bytes of a
CPU tensor (a ``memoryview``, no copy): an fp32 CPU tensor is sent as it is, so keep it
unchanged until its message is sent. Decoding is the reverse: an fp32 frame becomes a tensor
over the frame's own memory, and bf16/int8 frames decode straight into one fp32 tensor.

``int8`` splits the flat tensor into blocks of ``block`` elements and stores one fp32 scale per
block, ``s_b = max|x_b| / 127``, with ``q = round(x / s_b)`` in [-127, 127] (absmax
quantisation, Dettmers et al. 2022 "8-bit Optimizers via Block-wise Quantization", §2).
Rounding to the nearest integer bounds the error per element by ``s_b / 2 = max|x_b| / 254``
(see :func:`int8_error_bound`). Quantising and dequantising run over whole blocks at a time in
chunks of :data:`CHUNK_ELEMENTS` (vectorised, cache-sized, no padded copy of the input).

A top-k tensor (``topk_bf16``/``topk_fp32``) travels as two frames: its ``k`` values, then
their int32 flat indices (strictly increasing, each in [0, n)); a sign tensor
(``sign_bf16``/``sign_fp32``, ``block`` = elements per scale) as its packed sign bits, then its
scales. :func:`check_structure` refuses an index out of range or repeated before anything is
decoded; sizes are checked against the header before any allocation.
"""

from __future__ import annotations

import math
import threading
from collections.abc import Iterator, Mapping
from dataclasses import dataclass, replace
from typing import Any, Literal, get_args

import numpy as np
import torch

from heloco import codecs
from heloco.codecs import Coded
from heloco.net.pool import parallel_map
from heloco.types import RoundResult
from shardmeter.errors import UserInputError

Codec = Literal["fp32", "bf16", "int8"]
CODECS: tuple[str, ...] = get_args(Codec)
WireCodec = Literal["fp32", "bf16", "int8", "topk_bf16", "topk_fp32", "sign_bf16", "sign_fp32"]
WIRE_CODECS: tuple[str, ...] = get_args(WireCodec)
TWO_FRAMES = frozenset({"int8", "topk_bf16", "topk_fp32", "sign_bf16", "sign_fp32"})
_SPARSE_DTYPES = {"bf16": torch.bfloat16, "fp32": torch.float32}
DEFAULT_BLOCK = 4096  # elements per int8 block: 4 bytes of scale per 4 KiB of payload (0.1 %)
INT8_MAX = 127
CHUNK_ELEMENTS = 1 << 20  # elements quantised per pass: 4 MiB of fp32 stays in cache
MAX_SCALE = float(torch.finfo(torch.float32).max) / 128  # q·s stays finite for any int8 q

Buffer = bytes | bytearray | memoryview
_DTYPES = {"fp32": torch.float32, "bf16": torch.bfloat16}


@dataclass(frozen=True)
class Encoded:
    """One tensor on the wire: its codec, shape and the raw byte frames it needs.

    ``data`` holds the element bytes (fp32, bf16 or int8); ``scales`` the fp32 per-block scales
    (int8 only, empty otherwise). Both may be views of a tensor or of a received frame. For
    top-k, ``data`` holds the ``k`` values and ``scales`` their int32 indices; for sign,
    ``data`` the packed sign bits and ``scales`` one scale per ``block`` elements.
    """

    codec: WireCodec
    shape: tuple[int, ...]
    block: int
    data: Buffer
    scales: Buffer = b""
    k: int = 0  # top-k: values kept

    @property
    def nbytes(self) -> int:
        """Bytes on the wire for this tensor (data + scales)."""
        return len(self.data) + len(self.scales)

    @property
    def numel(self) -> int:
        """Elements of the decoded tensor."""
        return math.prod(self.shape)


def check_codec(codec: str) -> Codec:
    """Validate a codec name from user input."""
    if codec not in CODECS:
        raise UserInputError("codec", codec, f"one of {', '.join(CODECS)}")
    return codec  # type: ignore[return-value]


def as_bytes(t: torch.Tensor) -> memoryview:
    """The little-endian bytes of ``t`` flattened, on the CPU: a view of ``t``'s own memory
    when it is a contiguous CPU tensor (bf16 goes through a uint8 view, numpy has no bf16)."""
    flat = t.detach().reshape(-1)
    if flat.device.type != "cpu":
        flat = flat.cpu()
    return flat.contiguous().view(torch.uint8).numpy().data


def _view(data: Buffer, dtype: torch.dtype) -> torch.Tensor:
    """A flat CPU tensor of ``dtype`` over ``data`` without a copy when ``data`` is a writable,
    aligned buffer (a received frame); immutable or misaligned bytes are copied first."""
    if not len(data):
        return torch.empty(0, dtype=dtype)
    itemsize = torch.empty(0, dtype=dtype).element_size()
    raw = np.frombuffer(data, dtype=np.uint8)
    if not raw.flags.writeable or raw.ctypes.data % itemsize:
        raw = raw.copy()
    return torch.from_numpy(raw).view(dtype)


def n_blocks(numel: int, block: int) -> int:
    """Number of int8 blocks for ``numel`` elements (last block may be short)."""
    return math.ceil(numel / block) if numel else 0


def _blocks(flat: torch.Tensor, block: int) -> torch.Tensor:
    """``flat`` as (n_blocks, block), zero-padded only when the last block is short."""
    nb = n_blocks(flat.numel(), block)
    pad = nb * block - flat.numel()
    return (torch.nn.functional.pad(flat, (0, pad)) if pad else flat).view(nb, block)


def _row_chunks(numel: int, block: int) -> Iterator[tuple[int, int, int]]:
    """(first block, end block, block length) covering ``numel`` elements: chunks of whole
    blocks of about :data:`CHUNK_ELEMENTS`, then the short last block on its own."""
    full = numel // block
    step = max(1, CHUNK_ELEMENTS // block)
    for start in range(0, full, step):
        yield start, min(full, start + step), block
    if full * block < numel:
        yield full, full + 1, numel - full * block


def quantize_int8(
    x: torch.Tensor, block: int = DEFAULT_BLOCK, threads: int = 1
) -> tuple[torch.Tensor, torch.Tensor]:
    """Blockwise absmax int8 of the flattened ``x``: (q int8 [numel], scales fp32 [n_blocks]).

    Runs on ``x``'s device; on the CPU its chunks are quantised on ``threads`` threads (the
    same result: chunks are whole blocks). A block of zeros gets scale 0 and decodes to zeros.
    """
    if block < 1:
        raise UserInputError("block", block, "an integer >= 1")
    flat = x.detach().reshape(-1).to(torch.float32)
    numel = flat.numel()
    q = torch.empty(numel, dtype=torch.int8, device=flat.device)
    scales = torch.empty(n_blocks(numel, block), dtype=torch.float32, device=flat.device)
    local = threading.local()

    def chunk(span: tuple[int, int, int]) -> None:
        first, end, length = span
        lo, hi = first * block, first * block + (end - first) * length
        scratch = getattr(local, "scratch", None)
        if scratch is None:
            scratch = local.scratch = torch.empty(
                min(numel, max(block, CHUNK_ELEMENTS)), device=flat.device
            )
        rows = flat[lo:hi].view(-1, length)
        s = scales[first:end]
        torch.maximum(torch.amax(rows, 1), torch.amin(rows, 1).neg_(), out=s)
        s.div_(INT8_MAX)
        inv = torch.where(s > 0, 1.0 / s, 0.0)
        y = torch.mul(rows, inv[:, None], out=scratch[: hi - lo].view(-1, length))
        q[lo:hi].view(-1, length).copy_(y.round_().clamp_(-INT8_MAX, INT8_MAX))

    spans = list(_row_chunks(numel, block))
    parallel = threads > 1 and len(spans) > 1 and flat.device.type == "cpu"
    parallel_map(chunk, spans, threads if parallel else 1)
    return q, scales


def dequantize_int8(
    q: torch.Tensor, scales: torch.Tensor, block: int, out: torch.Tensor | None = None
) -> torch.Tensor:
    """Inverse of :func:`quantize_int8` as a flat fp32 tensor (written into ``out`` if given)."""
    numel = q.numel()
    if out is None:
        out = torch.empty(numel, dtype=torch.float32, device=q.device)
    for first, end, length in _row_chunks(numel, block):
        lo, hi = first * block, first * block + (end - first) * length
        dequantize_range(q, scales, block, lo, hi, out[lo:hi])
    return out


def dequantize_range(
    q: torch.Tensor, scales: torch.Tensor, block: int, lo: int, hi: int, out: torch.Tensor
) -> torch.Tensor:
    """Elements ``[lo, hi)`` of :func:`dequantize_int8` into ``out[: hi - lo]``: the same value
    per element (``float(q_i) · s_b``, one rounding), decoding nothing outside the range."""
    dst = out[: hi - lo]
    pos = lo
    while pos < hi:
        b = pos // block
        whole = (hi - pos) // block if pos % block == 0 else 0
        end = pos + whole * block if whole else min(hi, (b + 1) * block)
        rows = max(whole, 1)
        length = (end - pos) // rows
        dst[pos - lo : end - lo].view(rows, length).copy_(q[pos:end].view(rows, length)).mul_(
            scales[b : b + rows, None]
        )
        pos = end
    return dst


def int8_error_bound(x: torch.Tensor, block: int = DEFAULT_BLOCK) -> torch.Tensor:
    """Per-element bound on |decode(encode(x)) − x|: ``max|x_b| / 254`` for x's block b.

    Half a quantisation step, s_b / 2 with s_b = max|x_b| / 127, plus nothing else: the scale
    is stored in fp32 and the rounding error of ``x / s_b`` in fp32 is far below half a step.
    """
    flat = x.detach().reshape(-1).to(torch.float32)
    per_block = _blocks(flat, block).abs().amax(dim=1) / (2 * INT8_MAX)
    return per_block.repeat_interleave(block)[: flat.numel()].view_as(flat)


def encode(x: torch.Tensor, codec: Codec, block: int = DEFAULT_BLOCK, threads: int = 1) -> Encoded:
    """Encode one tensor (any shape, any device) into wire bytes (fp32 on the CPU: no copy;
    int8 quantised on ``threads`` threads)."""
    shape = tuple(int(s) for s in x.shape)
    if codec in _DTYPES:
        return Encoded(codec, shape, 0, as_bytes(x.detach().to(_DTYPES[codec])))
    if codec == "int8":
        q, scales = quantize_int8(x, block, threads)
        return Encoded("int8", shape, block, as_bytes(q), as_bytes(scales))
    raise UserInputError("codec", codec, f"one of {', '.join(CODECS)}")


def element_bytes(codec: Codec) -> int:
    """Bytes per element of a codec's data frame."""
    return {"fp32": 4, "bf16": 2, "int8": 1}[codec]


def _float_bytes(codec: str) -> int:
    """Bytes of one value (top-k) or scale (sign) of a compressed codec: bf16 2, fp32 4."""
    return 2 if codec.endswith("bf16") else 4


def expected_nbytes(
    codec: WireCodec, shape: tuple[int, ...], block: int, k: int = 0
) -> tuple[int, int]:
    """(data bytes, second-frame bytes) a well-formed encoding of ``shape`` must have: for
    int8 the scales, for top-k (``k`` values) the indices, for sign the scales."""
    numel = math.prod(shape)
    if codec.startswith("topk"):
        return k * _float_bytes(codec), 4 * k
    if codec.startswith("sign"):
        return -(-numel // 8), codecs.sign_groups(numel, block) * _float_bytes(codec)
    scales = 4 * n_blocks(numel, block) if codec == "int8" else 0
    return numel * element_bytes(codec), scales  # type: ignore[arg-type]


def from_coded(c: Coded) -> Encoded:
    """The wire form of a :class:`heloco.codecs.Coded` tensor (views of its tensors)."""
    width = "bf16" if c.kind == "topk" and c.data.dtype == torch.bfloat16 else "fp32"
    if c.kind == "sign":
        width = "bf16" if c.aux.dtype == torch.bfloat16 else "fp32"
    codec: WireCodec = f"{c.kind}_{width}"  # type: ignore[assignment]
    k = c.k if c.kind == "topk" else 0
    return Encoded(codec, c.shape, c.group, as_bytes(c.data), as_bytes(c.aux), k)


def to_coded(enc: Encoded) -> Coded:
    """A received top-k or sign tensor as :class:`heloco.codecs.Coded` over its frames."""
    kind, _, width = enc.codec.partition("_")
    if kind == "topk":
        return Coded(
            "topk",
            enc.shape,
            _view(enc.data, _SPARSE_DTYPES[width]),
            _view(enc.scales, torch.int32),
        )
    return Coded(
        "sign",
        enc.shape,
        _view(enc.data, torch.uint8),
        _view(enc.scales, _SPARSE_DTYPES[width]),
        enc.block,
    )


def is_coded(codec: str) -> bool:
    """Whether ``codec`` is one of :mod:`heloco.codecs`' payloads (top-k, sign)."""
    return codec.startswith(("topk", "sign"))


def check_structure(enc: Encoded) -> None:
    """Raise ``ValueError`` unless a top-k or sign tensor is well formed: sizes, and top-k
    indices strictly increasing inside [0, n) (no element written twice, none outside).
    Nothing to check for the dense codecs beyond their sizes."""
    _check_sizes(enc)
    if is_coded(enc.codec):
        codecs.validate(to_coded(enc), finite=False)


def _check_sizes(enc: Encoded) -> None:
    want_data, want_scales = expected_nbytes(enc.codec, enc.shape, enc.block or 1, enc.k)
    if len(enc.data) != want_data or len(enc.scales) != want_scales:
        raise ValueError(
            f"{enc.codec} tensor of shape {enc.shape}: got {len(enc.data)}+{len(enc.scales)} "
            f"bytes, expected {want_data}+{want_scales}"
        )


def is_finite(enc: Encoded) -> bool:
    """Whether every decoded value is finite, read from the wire form (no decoding): the
    extremes of an fp32/bf16 frame (``aminmax`` propagates NaN), or for int8 the scales
    (finite and at most :data:`MAX_SCALE`, so that ``q·s`` cannot overflow)."""
    _check_sizes(enc)
    if is_coded(enc.codec):
        try:
            codecs.validate(to_coded(enc))
        except ValueError:
            return False
        return True
    if enc.codec == "int8":
        values, limit = _view(enc.scales, torch.float32), MAX_SCALE
    else:
        values, limit = _view(enc.data, _DTYPES[enc.codec]), math.inf
    if not values.numel():
        return True
    lo, hi = (float(v) for v in torch.aminmax(values))
    return math.isfinite(lo) and math.isfinite(hi) and max(-lo, hi) <= limit


def decode(
    enc: Encoded, device: torch.device | str = "cpu", out: torch.Tensor | None = None
) -> torch.Tensor:
    """Decode wire bytes into an fp32 tensor of ``enc.shape`` on ``device``.

    An fp32 frame decoded to the CPU is a view of the frame's memory (no copy); bf16 and int8
    decode into ``out`` (a flat fp32 tensor of ``enc.numel`` elements) when it is given.
    Raises ``ValueError`` if the byte counts do not match the declared shape and codec.
    """
    _check_sizes(enc)
    if is_coded(enc.codec):
        flat = codecs.decode(to_coded(enc), out).reshape(-1)
    elif enc.codec == "int8":
        q = _view(enc.data, torch.int8).to(device)
        scales = _view(enc.scales, torch.float32).to(device)
        flat = dequantize_int8(q, scales, enc.block, out)
    elif out is not None:
        flat = out.copy_(_view(enc.data, _DTYPES[enc.codec]))
    else:
        flat = _view(enc.data, _DTYPES[enc.codec]).to(torch.float32)
    return flat.to(device).view(enc.shape)


class Decoded(Mapping[str, torch.Tensor]):
    """Named wire tensors that decode to fp32 when read: an fp32 frame as a view of itself,
    bf16 and int8 into a scratch buffer of the reading thread. A tensor read stays valid until
    the same thread reads the next one from this mapping, so a reader that handles one tensor
    at a time (the outer rules' block functions) holds one decoded tensor, never the whole
    model in fp32, and allocates no fresh memory per read."""

    def __init__(self, tensors: Mapping[str, Encoded], device: torch.device | str = "cpu") -> None:
        self.encoded = dict(tensors)
        self.device = device
        self._largest = max(
            (e.numel for e in self.encoded.values() if e.codec != "fp32"), default=0
        )
        self._local = threading.local()

    def __getitem__(self, name: str) -> torch.Tensor:
        enc = self.encoded[name]
        if enc.codec == "fp32":
            return decode(enc, self.device)
        scratch = getattr(self._local, "scratch", None)
        if scratch is None:
            scratch = torch.empty(self._largest, dtype=torch.float32, device=self.device)
            self._local.scratch = scratch
        return decode(enc, self.device, out=scratch[: enc.numel])

    def chunk(self, name: str, lo: int, hi: int) -> torch.Tensor:
        """Elements ``[lo, hi)`` of tensor ``name`` flattened, as fp32: a view of an fp32 frame,
        else decoded into the reading thread's chunk scratch (valid until its next chunk).
        What :func:`heloco.outer.base.chunks` reads, so only one chunk is ever decoded."""
        enc = self.encoded[name]
        if enc.codec == "fp32":
            return _view(enc.data, torch.float32)[lo:hi].to(self.device)
        scratch = getattr(self._local, "chunk", None)
        if scratch is None or scratch.numel() < hi - lo:
            scratch = torch.empty(hi - lo, dtype=torch.float32, device=self.device)
            self._local.chunk = scratch
        if is_coded(enc.codec):
            return codecs.decode_range(to_coded(enc), lo, hi, scratch).to(self.device)
        if enc.codec == "int8":
            first = lo // enc.block  # the blocks the range touches, moved to the device alone
            q = _view(enc.data, torch.int8)[first * enc.block : hi].to(self.device)
            s = _view(enc.scales, torch.float32)[first : n_blocks(hi, enc.block)].to(self.device)
            start = first * enc.block
            return dequantize_range(q, s, enc.block, lo - start, hi - start, scratch)
        return scratch[: hi - lo].copy_(_view(enc.data, _DTYPES[enc.codec])[lo:hi])

    def __iter__(self) -> Iterator[str]:
        return iter(self.encoded)

    def __len__(self) -> int:
        return len(self.encoded)

    def shape(self, name: str) -> tuple[int, ...]:
        """Shape of tensor ``name`` without decoding it."""
        return self.encoded[name].shape


class WireRoundTrip:
    """A dense wire codec's effect on Δ, for the simulator: each tensor encoded as a worker
    sends it (``heloco work --codec``) and decoded as the server reads it, with no residual
    (the transport's int8/bf16 keep none). The values the server applies are those of a real
    push, bit for bit (:func:`encode`, then :func:`decode`). A :class:`heloco.codecs.Compressor`.
    """

    def __init__(self, codec: str, block: int = DEFAULT_BLOCK) -> None:
        self.codec = check_codec(codec)
        if self.codec == "fp32":
            raise UserInputError("codec", codec, "bf16 or int8 (fp32 needs no round trip)")
        self.block = block

    def compress_result(self, result: RoundResult) -> RoundResult:
        """``result`` with every tensor of Δ replaced by its decoded wire form (fp32)."""
        delta = {
            name: decode(encode(d.detach().to("cpu", torch.float32), self.codec, self.block))
            .clone()
            .to(d.device)
            for name, d in result.delta.items()
        }
        return replace(result, delta=delta)

    def state_dict(self) -> dict[str, Any]:
        """No state: ``{"meta": {"codec": name}, "tensors": {}}``."""
        return {"meta": {"codec": self.codec}, "tensors": {}}

    def load_state_dict(self, state: Mapping[str, Any]) -> None:
        """Nothing to restore (a dense codec keeps no residual)."""
