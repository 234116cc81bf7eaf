"""Pseudo-gradient codecs for the wire: fp32, bf16 and blockwise int8 (pure torch, any shape).

A tensor is flattened, encoded on its own device, and turned into raw little-endian bytes on
the CPU. ``int8`` splits the flat tensor into blocks of ``block`` elements and stores one fp32
scale per block, ``s_b = max|x_b| / 127``, with ``q = round(x / s_b)`` in [-127, 127]
(absmax quantisation, Dettmers et al. 2022 "8-bit Optimizers via Block-wise Quantization",
§2). Rounding to the nearest integer bounds the error per element by ``s_b / 2 =
max|x_b| / 254`` (see :func:`int8_error_bound`).
"""

from __future__ import annotations

import math
from dataclasses import dataclass
from typing import Literal, get_args

import torch

from shardmeter.errors import UserInputError

Codec = Literal["fp32", "bf16", "int8"]
CODECS: tuple[str, ...] = get_args(Codec)
DEFAULT_BLOCK = 4096  # elements per int8 block: 4 bytes of scale per 4 KiB of payload (0.1 %)
INT8_MAX = 127


@dataclass(frozen=True)
class Encoded:
    """One tensor on the wire: its codec, shape and the raw byte frames it needs.

    ``data`` holds the element bytes (fp32, bf16 or int8); ``scales`` the fp32 per-block scales
    (int8 only, empty otherwise).
    """

    codec: Codec
    shape: tuple[int, ...]
    block: int
    data: bytes
    scales: bytes = b""

    @property
    def nbytes(self) -> int:
        """Bytes on the wire for this tensor (data + scales)."""
        return len(self.data) + len(self.scales)


def check_codec(codec: str) -> Codec:
    """Validate a codec name from user input."""
    if codec not in CODECS:
        raise UserInputError("codec", codec, f"one of {', '.join(CODECS)}")
    return codec  # type: ignore[return-value]


def _raw(t: torch.Tensor) -> bytes:
    """Little-endian bytes of a contiguous CPU tensor (bf16 goes through a uint8 view)."""
    return t.detach().reshape(-1).contiguous().cpu().view(torch.uint8).numpy().tobytes()


def _from_raw(data: bytes, dtype: torch.dtype) -> torch.Tensor:
    """A writable CPU tensor of ``dtype`` from raw bytes (copy, so the frame can be freed)."""
    if not data:
        return torch.empty(0, dtype=dtype)
    return torch.frombuffer(bytearray(data), dtype=torch.uint8).view(dtype)


def n_blocks(numel: int, block: int) -> int:
    """Number of int8 blocks for ``numel`` elements (last block may be short)."""
    return math.ceil(numel / block) if numel else 0


def _blocks(flat: torch.Tensor, block: int) -> torch.Tensor:
    """``flat`` as (n_blocks, block), zero-padded only when the last block is short."""
    nb = n_blocks(flat.numel(), block)
    pad = nb * block - flat.numel()
    return (torch.nn.functional.pad(flat, (0, pad)) if pad else flat).view(nb, block)


def quantize_int8(x: torch.Tensor, block: int = DEFAULT_BLOCK) -> tuple[torch.Tensor, torch.Tensor]:
    """Blockwise absmax int8 of the flattened ``x``: (q int8 [numel], scales fp32 [n_blocks]).

    Runs on ``x``'s device. A block of zeros gets scale 0 and decodes to zeros.
    """
    if block < 1:
        raise UserInputError("block", block, "an integer >= 1")
    flat = x.detach().reshape(-1).to(torch.float32)
    numel = flat.numel()
    blocks = _blocks(flat, block)
    lo, hi = torch.aminmax(blocks, dim=1)
    scales = torch.maximum(hi, -lo) / INT8_MAX
    inv = torch.where(scales > 0, 1.0 / scales, torch.zeros_like(scales))
    y = blocks * inv[:, None]
    q = y.round_().clamp_(-INT8_MAX, INT8_MAX).to(torch.int8)
    return q.reshape(-1)[:numel], scales


def dequantize_int8(q: torch.Tensor, scales: torch.Tensor, block: int) -> torch.Tensor:
    """Inverse of :func:`quantize_int8` as a flat fp32 tensor."""
    numel = q.numel()
    out = _blocks(q.to(torch.float32), block).mul_(scales[:, None])
    return out.reshape(-1)[:numel]


def int8_error_bound(x: torch.Tensor, block: int = DEFAULT_BLOCK) -> torch.Tensor:
    """Per-element bound on |decode(encode(x)) − x|: ``max|x_b| / 254`` for x's block b.

    Half a quantisation step, s_b / 2 with s_b = max|x_b| / 127, plus nothing else: the scale
    is stored in fp32 and the rounding error of ``x / s_b`` in fp32 is far below half a step.
    """
    flat = x.detach().reshape(-1).to(torch.float32)
    per_block = _blocks(flat, block).abs().amax(dim=1) / (2 * INT8_MAX)
    return per_block.repeat_interleave(block)[: flat.numel()].view_as(flat)


def encode(x: torch.Tensor, codec: Codec, block: int = DEFAULT_BLOCK) -> Encoded:
    """Encode one tensor (any shape, any device) into wire bytes."""
    shape = tuple(int(s) for s in x.shape)
    if codec == "fp32":
        return Encoded("fp32", shape, 0, _raw(x.to(torch.float32)))
    if codec == "bf16":
        return Encoded("bf16", shape, 0, _raw(x.to(torch.bfloat16)))
    if codec == "int8":
        q, scales = quantize_int8(x, block)
        return Encoded("int8", shape, block, _raw(q), _raw(scales))
    raise UserInputError("codec", codec, f"one of {', '.join(CODECS)}")


def element_bytes(codec: Codec) -> int:
    """Bytes per element of a codec's data frame."""
    return {"fp32": 4, "bf16": 2, "int8": 1}[codec]


def expected_nbytes(codec: Codec, shape: tuple[int, ...], block: int) -> tuple[int, int]:
    """(data bytes, scale bytes) a well-formed encoding of ``shape`` must have."""
    numel = math.prod(shape)
    scales = 4 * n_blocks(numel, block) if codec == "int8" else 0
    return numel * element_bytes(codec), scales


def decode(enc: Encoded, device: torch.device | str = "cpu") -> torch.Tensor:
    """Decode wire bytes into an fp32 tensor of ``enc.shape`` on ``device``.

    Raises ``ValueError`` if the byte counts do not match the declared shape and codec.
    """
    want_data, want_scales = expected_nbytes(enc.codec, enc.shape, enc.block or 1)
    if len(enc.data) != want_data or len(enc.scales) != want_scales:
        raise ValueError(
            f"{enc.codec} tensor of shape {enc.shape}: got {len(enc.data)}+{len(enc.scales)} "
            f"bytes, expected {want_data}+{want_scales}"
        )
    if enc.codec == "fp32":
        flat = _from_raw(enc.data, torch.float32)
    elif enc.codec == "bf16":
        flat = _from_raw(enc.data, torch.bfloat16).to(torch.float32)
    else:
        q = _from_raw(enc.data, torch.int8).to(device)
        scales = _from_raw(enc.scales, torch.float32).to(device)
        flat = dequantize_int8(q, scales, enc.block)
    return flat.to(device).view(enc.shape)
