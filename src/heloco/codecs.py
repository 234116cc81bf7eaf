"""Compressed pseudo-gradient payloads with error feedback: the planner's payload families run.

A payload is named as ShardMeter names it (``shardmeter plan --payload``, docs/islands.md), and
read by :func:`heloco.config.parse_payload`, where the run file checks it:

- ``dense``: no codec here (the transport's fp32/bf16/int8 apply, :mod:`heloco.net.compress`);
- ``topk:fraction=f``: per tensor the ``k = ceil(f·n)`` entries of largest magnitude, their
  values in ``value_bits`` (16: bf16, 32: fp32) and their flat indices as int32, sorted
  ascending (Lin et al. 2018, DGC; the sparsifier of SparseLoCo, Sarfi et al. 2025, arXiv
  2508.15706, §3);
- ``sign``: one bit per element and one scale per ``group`` elements in ``scale_bits`` (16:
  bf16, 32: fp32); the scale is the group's mean magnitude, so a group decodes to
  ``mean|p_g| · sign(p)`` (the scaled sign compressor of EF-signSGD, Karimireddy et al. 2019,
  "Error Feedback Fixes SignSGD", Alg. 1 with C(p) = ‖p‖₁/d · sign(p) per group; 1-bit
  updates with error feedback as MuLoCo sends them, arXiv 2505.23725).

Bytes per tensor of ``n`` elements, the planner's bits per parameter times n / 8 up to one
rounding per tensor (``shardmeter.estimate.payload.resolve_payload``):

- top-k: ``k · (value_bits + 32) / 8`` with ``k = ceil(f·n)``;
- sign: ``ceil(n / 8) + ceil(n / group) · scale_bits / 8``.

Error feedback (Karimireddy et al. 2019, EF-SGD Alg. 2; SparseLoCo Alg. 1 with β = 1): each
worker keeps a residual ``e`` per tensor (fp32, zero at the start), sends ``c = C(Δ + e)`` and
keeps ``e' = Δ + e − D(c)``, the part not yet sent. What the server receives is ``D(c)``; over
rounds everything the worker computed reaches the model, late rather than never. The
residual is part of the worker's state (:meth:`ErrorFeedback.state_dict`), so a restarted
worker resumes it. Pure torch on the CPU, deterministic: the simulator and the networked
worker run the same functions.
"""

from __future__ import annotations

import math
from collections.abc import Iterator, Mapping
from dataclasses import dataclass, replace
from typing import Any, Literal, Protocol

import numpy as np
import torch

from heloco.config import INDEX_BITS, parse_payload
from heloco.types import Params, RoundResult
from shardmeter.errors import UserInputError
from shardmeter.specs.topology import PayloadSpec

Kind = Literal["topk", "sign"]
MAX_INDEX = 2**31 - 1  # int32: a tensor with more elements cannot be sent as top-k
_FLOATS = {16: torch.bfloat16, 32: torch.float32}


def payload_name(spec: PayloadSpec) -> str:
    """The spelling ``parse_payload`` reads back (only the settings that matter to the kind)."""
    if spec.kind == "topk":
        return f"topk:fraction={spec.fraction:g},value_bits={spec.value_bits}"
    if spec.kind == "sign":
        return f"sign:group={spec.group},scale_bits={spec.scale_bits}"
    return "dense"


@dataclass(frozen=True)
class Coded:
    """One tensor as it travels: ``data`` and ``aux`` are flat CPU tensors.

    top-k: ``data`` the kept values (bf16/fp32), ``aux`` their flat indices (int32, strictly
    increasing, in [0, n)). sign: ``data`` the sign bits packed little-endian (uint8, bit
    ``i % 8`` of byte ``i // 8`` set where element i ≥ 0), ``aux`` the per-group scales.
    """

    kind: Kind
    shape: tuple[int, ...]
    data: torch.Tensor
    aux: torch.Tensor
    group: int = 0  # sign: elements per scale

    @property
    def numel(self) -> int:
        """Elements of the decoded tensor."""
        return math.prod(self.shape)

    @property
    def k(self) -> int:
        """Kept values (top-k) or scales (sign)."""
        return int(self.data.numel()) if self.kind == "topk" else int(self.aux.numel())

    @property
    def nbytes(self) -> int:
        """Bytes on the wire for this tensor (both frames)."""
        return int(
            self.data.numel() * self.data.element_size()
            + self.aux.numel() * self.aux.element_size()
        )


def topk_count(numel: int, fraction: float) -> int:
    """k = ceil(f·n) kept values of an n-element tensor (at least 1 of a non-empty one)."""
    return min(numel, max(1 if numel else 0, math.ceil(fraction * numel - 1e-9)))


def sign_groups(numel: int, group: int) -> int:
    """Scales of a sign-coded n-element tensor: ceil(n / group)."""
    return -(-numel // group) if numel else 0


def expected_nbytes(spec: PayloadSpec, numel: int) -> int:
    """Wire bytes of one coded tensor of ``numel`` elements (module docstring)."""
    if spec.kind == "topk":
        return topk_count(numel, float(spec.fraction or 1.0)) * (spec.value_bits + INDEX_BITS) // 8
    if spec.kind == "sign":
        return -(-numel // 8) + sign_groups(numel, spec.group) * spec.scale_bits // 8
    return 4 * numel


# -- the compressors -----------------------------------------------------------------------------
def encode_topk(p: torch.Tensor, fraction: float, value_bits: int) -> Coded:
    """Top-k of the flattened ``p`` by magnitude: values and sorted int32 indices."""
    flat = p.detach().reshape(-1).to(torch.float32)
    n = flat.numel()
    if n > MAX_INDEX:
        raise UserInputError("payload", "topk", f"tensors of at most {MAX_INDEX} elements")
    k = topk_count(n, fraction)
    idx = torch.topk(flat.abs(), k, sorted=False).indices if k < n else torch.arange(n)
    idx = torch.sort(idx).values
    return Coded("topk", tuple(p.shape), flat[idx].to(_FLOATS[value_bits]), idx.to(torch.int32))


_BIT_WEIGHTS = torch.tensor([1 << b for b in range(8)], dtype=torch.int32)


def pack_bits(bits: torch.Tensor) -> torch.Tensor:
    """Bool tensor -> uint8, bit ``i % 8`` of byte ``i // 8`` (little-endian bit order)."""
    n = bits.numel()
    pad = -n % 8
    b = torch.nn.functional.pad(bits.reshape(-1).to(torch.uint8), (0, pad)).view(-1, 8)
    return (b.to(torch.int32) * _BIT_WEIGHTS).sum(1).to(torch.uint8)


def unpack_bits(packed: torch.Tensor, n: int) -> torch.Tensor:
    """Inverse of :func:`pack_bits`: the first ``n`` bits as bool."""
    bits = np.unpackbits(packed.numpy(), bitorder="little")[:n]
    return torch.from_numpy(bits.astype(np.bool_))


def encode_sign(p: torch.Tensor, group: int, scale_bits: int) -> Coded:
    """Scaled sign of the flattened ``p``: one bit per element, one mean-|p| scale per group."""
    flat = p.detach().reshape(-1).to(torch.float32)
    n = flat.numel()
    ng = sign_groups(n, group)
    pad = ng * group - n
    sums = torch.nn.functional.pad(flat.abs(), (0, pad)).view(ng, group).sum(1)
    counts = torch.full((ng,), float(group))
    if pad:
        counts[-1] = group - pad
    scales = (sums / counts).to(_FLOATS[scale_bits])
    return Coded("sign", tuple(p.shape), pack_bits(flat >= 0), scales, group)


def decode(c: Coded, out: torch.Tensor | None = None) -> torch.Tensor:
    """The dense fp32 tensor of ``c`` (its shape; written into ``out``, flat, when given)."""
    n = c.numel
    flat = torch.empty(n, dtype=torch.float32) if out is None else out[:n]
    if c.kind == "topk":
        flat.zero_()
        flat[c.aux.to(torch.int64)] = c.data.to(torch.float32)
    else:
        ng = c.aux.numel()
        scale = c.aux.to(torch.float32)
        sign = unpack_bits(c.data, n).to(torch.float32).mul_(2).sub_(1)
        pad = ng * c.group - n
        dense = torch.nn.functional.pad(sign, (0, pad)).view(ng, c.group) * scale[:, None]
        flat.copy_(dense.reshape(-1)[:n])
    return flat.view(c.shape)


def decode_range(c: Coded, lo: int, hi: int, out: torch.Tensor) -> torch.Tensor:
    """Elements ``[lo, hi)`` of the flattened :func:`decode` into ``out[: hi - lo]``, the same
    values, decoding nothing outside the range (the server's chunked reads)."""
    dst = out[: hi - lo]
    if c.kind == "topk":
        dst.zero_()
        idx = c.aux
        a = int(torch.searchsorted(idx, torch.tensor(lo, dtype=idx.dtype)))
        b = int(torch.searchsorted(idx, torch.tensor(hi, dtype=idx.dtype)))
        dst[idx[a:b].to(torch.int64) - lo] = c.data[a:b].to(torch.float32)
        return dst
    first, last = lo // 8, -(-hi // 8)
    bits = unpack_bits(c.data[first:last], (last - first) * 8)[lo - first * 8 : hi - first * 8]
    groups = torch.arange(lo, hi) // c.group
    dst.copy_(bits.to(torch.float32).mul_(2).sub_(1).mul_(c.aux.to(torch.float32)[groups]))
    return dst


def validate(c: Coded, finite: bool = True) -> None:
    """Raise ``ValueError`` unless ``c`` is a well-formed encoding of its shape: frame sizes,
    top-k indices strictly increasing inside [0, n) (so no element is written twice), and
    (``finite``) every value or scale finite. What a receiver checks before the outer step
    reads it."""
    n = c.numel
    if c.kind == "topk":
        if c.data.numel() != c.aux.numel() or c.aux.numel() > n:
            raise ValueError(
                f"top-k of {n} elements: {c.data.numel()} values, {c.aux.numel()} indices"
            )
        if c.aux.numel():
            idx = c.aux
            if int(idx[0]) < 0 or int(idx[-1]) >= n:
                raise ValueError(f"top-k index outside [0, {n})")
            if idx.numel() > 1 and not bool((idx[1:] > idx[:-1]).all()):
                raise ValueError("top-k indices not strictly increasing")
    else:
        if c.group < 1 or c.data.numel() != -(-n // 8) or c.aux.numel() != sign_groups(n, c.group):
            raise ValueError(f"sign of {n} elements: sizes do not match group {c.group}")
    values = c.data if c.kind == "topk" else c.aux
    if finite and values.numel():
        lo, hi = (float(v) for v in torch.aminmax(values.to(torch.float32)))
        if not (math.isfinite(lo) and math.isfinite(hi)):
            raise ValueError("non-finite values")


def encode(p: torch.Tensor, spec: PayloadSpec) -> Coded:
    """``p`` compressed as ``spec`` says (no error feedback: see :class:`ErrorFeedback`)."""
    if spec.kind == "topk":
        return encode_topk(p, float(spec.fraction or 1.0), spec.value_bits)
    if spec.kind == "sign":
        return encode_sign(p, spec.group, spec.scale_bits)
    raise UserInputError("payload", spec.kind, "topk or sign (dense needs no codec)")


# -- error feedback and the coded Δ ---------------------------------------------------------------
class CodedDelta(Mapping[str, torch.Tensor]):
    """A pseudo-gradient as it travels: named :class:`Coded` tensors that decode to dense fp32
    when read (what the simulator's server reads; a network link sends :attr:`coded`)."""

    def __init__(self, coded: Mapping[str, Coded], spec: PayloadSpec) -> None:
        self.coded = dict(coded)
        self.spec = spec

    def __getitem__(self, name: str) -> torch.Tensor:
        return decode(self.coded[name])

    def __iter__(self) -> Iterator[str]:
        return iter(self.coded)

    def __len__(self) -> int:
        return len(self.coded)

    @property
    def nbytes(self) -> int:
        """Bytes of every coded tensor's frames (the push's payload, headers aside)."""
        return sum(c.nbytes for c in self.coded.values())

    def subset(self, names: list[str]) -> CodedDelta:
        """The tensors ``names`` (a sharded server's part), still coded."""
        return CodedDelta({n: self.coded[n] for n in names}, self.spec)


class Compressor(Protocol):
    """What a worker's round boundary (:class:`heloco.rounds.Rounds`) compresses Δ with:
    :class:`ErrorFeedback` (top-k, sign), or a dense wire codec's round trip without a residual
    (:class:`heloco.net.compress.WireRoundTrip`, the simulator's int8/bf16 uplink)."""

    def compress_result(self, result: RoundResult) -> RoundResult: ...
    def state_dict(self) -> dict[str, Any]: ...
    def load_state_dict(self, state: Mapping[str, Any]) -> None: ...


class ErrorFeedback:
    """One worker's compressor with its residual (module docstring, EF-SGD Alg. 2):
    :meth:`compress` turns Δ into ``C(Δ + e)`` and keeps ``e ← Δ + e − D(C(Δ + e))``.

    The residual tensors are replaced, never written in place, so a state taken before a
    round (:meth:`state_dict`) stays as it was.
    """

    def __init__(self, spec: PayloadSpec | str) -> None:
        self.spec = parse_payload(spec)
        if self.spec.kind == "dense":
            raise UserInputError("payload", "dense", "topk or sign (dense needs no residual)")
        self.residual: Params = {}

    @property
    def name(self) -> str:
        """The payload's spelling (:func:`payload_name`)."""
        return payload_name(self.spec)

    def compress(self, delta: Mapping[str, torch.Tensor]) -> CodedDelta:
        """``C(Δ + e)`` per tensor, with the residual updated."""
        coded: dict[str, Coded] = {}
        residual: Params = {}
        for name, d in delta.items():
            p = d.detach().to("cpu", torch.float32)
            e = self.residual.get(name)
            if e is not None:
                p = p + e
            c = encode(p, self.spec)
            coded[name] = c
            residual[name] = p - decode(c)
        self.residual = residual
        return CodedDelta(coded, self.spec)

    def compress_result(self, result: RoundResult) -> RoundResult:
        """``result`` with its Δ compressed (and the residual updated)."""
        return replace(result, delta=self.compress(result.delta))

    def state_dict(self) -> dict[str, Any]:
        """``{"meta": {"payload": name}, "tensors": {name: residual}}`` (no pickle)."""
        return {"meta": {"payload": self.name}, "tensors": dict(self.residual)}

    def load_state_dict(self, state: Mapping[str, Any]) -> None:
        """Restore :meth:`state_dict` output. The residual is the un-sent part of Δ whatever
        codec left it, so a worker restarted with another payload keeps it too."""
        self.residual = {
            k: v.detach().to("cpu", torch.float32).clone() for k, v in state["tensors"].items()
        }


def feedback_for(payload: str | PayloadSpec | None) -> ErrorFeedback | None:
    """An :class:`ErrorFeedback` for a compressed payload; None for dense (or None)."""
    if payload is None:
        return None
    spec = parse_payload(payload)
    return None if spec.kind == "dense" else ErrorFeedback(spec)
