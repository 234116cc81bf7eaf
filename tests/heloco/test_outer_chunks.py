"""Chunked outer steps: θ and the optimizer state bit for bit as block-at-a-time, diagnostics
to float rounding, for every method and every form a pseudo-gradient arrives in (a tensor, a
wire message decoded chunk by chunk, a sharded server's merged parts)."""

from __future__ import annotations

import math
from collections.abc import Callable

import pytest
import torch

from heloco.net import compress
from heloco.net.shards import Merged, plan_shards
from heloco.outer import OuterConfig, build_optimizer, method_names, resolve_method
from heloco.outer import base as outer_base
from heloco.outer.base import Arrival, StepStats, merge_geometry
from heloco.types import Delta, Params

SHAPES = {"a": (31, 37), "b": (1500,), "c": (7,), "d": (3, 331)}  # odd sizes: ragged chunks
CHUNK = 256  # elements per chunk in the chunked runs (every big block spans several)
BLOCK = 48  # int8 block: chunk boundaries fall inside blocks


def _model(seed: int) -> Params:
    gen = torch.Generator().manual_seed(seed)
    return {k: torch.randn(s, generator=gen) for k, s in SHAPES.items()}


def _deltas(seed: int, n: int) -> list[Params]:
    gen = torch.Generator().manual_seed(seed)
    return [{k: torch.randn(s, generator=gen) * 1e-2 for k, s in SHAPES.items()} for _ in range(n)]


def _wire(codec: str) -> Callable[[Params], Delta]:
    def form(delta: Params) -> Delta:
        enc = {k: compress.encode(v, codec, BLOCK) for k, v in delta.items()}  # type: ignore[arg-type]
        # a received frame is writable memory: copy the encoder's bytes as a socket would
        return compress.Decoded(
            {
                k: compress.Encoded(
                    e.codec, e.shape, e.block, bytearray(e.data), bytearray(e.scales)
                )
                for k, e in enc.items()
            }
        )

    return form


def _merged(delta: Params) -> Delta:
    sizes = {k: v.numel() for k, v in delta.items()}
    plan = plan_shards(sizes, 2)
    parts: dict[int, Delta] = {
        i: _wire("int8")({k: delta[k] for k in names}) for i, names in enumerate(plan)
    }
    return Merged(parts, plan, list(delta))


def _strided(delta: Params) -> Delta:
    """The same values in non-contiguous tensors (transposed storage)."""
    return {k: v.t().contiguous().t() if v.dim() == 2 else v for k, v in delta.items()}


FORMS: dict[str, Callable[[Params], Delta]] = {
    "tensor": lambda d: d,
    "strided": _strided,
    "fp32": _wire("fp32"),
    "bf16": _wire("bf16"),
    "int8": _wire("int8"),
    "sharded-int8": _merged,
}


def _run(
    method: str, form: str, chunk: int, monkeypatch: pytest.MonkeyPatch
) -> tuple[Params, dict[str, torch.Tensor], list[StepStats]]:
    monkeypatch.setattr(outer_base, "CHUNK_ELEMENTS", chunk)
    params = _model(0)
    n_workers = 3
    opt = build_optimizer(method, params, OuterConfig(), n_workers)
    sync = resolve_method(method).spec.policy.synchronous
    stats = []
    for step in range(4):
        deltas = _deltas(10 + step, n_workers if sync else 1)
        arrivals = [
            Arrival(FORMS[form](d), worker=(step + i) % n_workers, staleness=step % 2)
            for i, d in enumerate(deltas)
        ]
        stats.append(opt.step(params, arrivals))
    return params, opt.state_dict().tensors, stats


@pytest.mark.parametrize("form", list(FORMS))
@pytest.mark.parametrize("method", method_names())
def test_chunked_step_equals_block_at_a_time(
    method: str, form: str, monkeypatch: pytest.MonkeyPatch
) -> None:
    whole = _run(method, form, 1 << 30, monkeypatch)
    chunked = _run(method, form, CHUNK, monkeypatch)
    assert whole[1].keys() == chunked[1].keys()
    got = {**chunked[0], **chunked[1]}
    for name, t in {**whole[0], **whole[1]}.items():
        if "heloco" in method and "uncorrected" not in method:
            # The correction reads the block's norms and cosine, summed per chunk: the same
            # coefficients to float rounding, so θ and m agree to rounding, not bit for bit.
            torch.testing.assert_close(got[name], t, rtol=1e-6, atol=1e-8, msg=name)
        else:
            assert torch.equal(got[name], t), name
    for a, b in zip(whole[2], chunked[2], strict=True):
        for field in ("delta_norm", "cos_delta_momentum", "correction_size"):
            x, y = getattr(a, field), getattr(b, field)
            assert (math.isnan(x) and math.isnan(y)) or y == pytest.approx(x, rel=1e-5, abs=1e-9)
        assert (a.frac_kept, a.frac_shrunk, a.frac_rotated) == (
            b.frac_kept,
            b.frac_shrunk,
            b.frac_rotated,
        )


def test_wire_chunks_decode_like_the_whole_tensor() -> None:
    gen = torch.Generator().manual_seed(3)
    x = torch.randn(10_000, generator=gen)
    for codec in ("fp32", "bf16", "int8"):
        dec = _wire(codec)({"x": x})
        assert isinstance(dec, compress.Decoded)
        whole = dec["x"].clone()
        for lo, hi in [(0, 10_000), (0, 64), (5, 70), (63, 129), (128, 4000), (9_990, 10_000)]:
            assert torch.equal(dec.chunk("x", lo, hi), whole[lo:hi]), (codec, lo, hi)


def test_one_chunk_geometry_is_returned_unchanged() -> None:
    g = (0.1 + 0.2, -1.0 / 3.0, 2.0**0.5)
    assert merge_geometry([g]) == g
    two = merge_geometry([(3.0, 1.0, 0.0), (4.0, 2.0, 1.0)])
    assert two == (5.0, 3.0, 1.0)
