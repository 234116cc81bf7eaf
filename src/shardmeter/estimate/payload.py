"""What one exchange puts on the WAN: bits per parameter of each payload family, indices and
scales included, whether it can be summed in flight (all-reduce) or must be gathered, and the
extra memory it keeps per parameter (error-feedback residuals).

Units: bits per parameter of the model, bytes per parameter. Sources per family in
`PayloadSpec` (specs/topology.py); the error-feedback residual is an fp32 copy of the
un-sent remainder (Seide et al. 2014; Karimireddy et al. 2019, EF-SGD Alg. 2).

HeLoCo's whole messages (bytes): `push_bytes` and `dispatch_bytes` count what its wire format
sends (docs/network.md "Wire format"): each tensor's frames, its JSON header entry, the
header's envelope and the 32-byte tag, over a model's tensors (`model_tensors`). A resolved
`Payload` carries the push's bytes beyond bits × N / 8 and the dispatch of θ in fp32, which the
async mode charges (`outer.outer_round`).
"""

from __future__ import annotations

import dataclasses
import json
import math
from collections.abc import Sequence
from dataclasses import dataclass

from shardmeter.specs.model import TransformerSpec
from shardmeter.specs.topology import PayloadSpec

RESIDUAL_BYTES = 4.0  # fp32 error-feedback residual per parameter (EF-SGD, Alg. 2)
DEFAULT_INDEX_BITS = {"topk": 32, "dct_topk": 16}  # int32 flat index; int16 in-chunk index

# HeLoCo's messages on the wire (docs/network.md "Wire format", heloco/net/wire.py): a JSON
# header frame {"v","type","id","re","ts","body","tensors":[{"name","codec","shape","block"
# [,"k"]}]}, each tensor's frames, and a 32-byte HMAC-SHA256 tag. Bytes.
TAG_BYTES = 32
# The header without its tensor entries, as json.dumps(separators=(",", ":")) writes it: a
# push's body holds worker, incarnation (20 digits, "-", 8 hex), round_id, base_revision,
# steps, tokens, mean_loss and compute_s; a dispatch's revision, steps and round_id. Numbers
# at typical widths (ts and floats 18 characters, counts 5).
PUSH_ENVELOPE_BYTES = len(
    '{"v":1,"type":"push","id":"' + "0" * 32 + '","re":"","ts":' + "1" * 18 + ',"body":'
    '{"worker":0,"incarnation":"' + "0" * 20 + "-" + "0" * 8 + '","round_id":11111,'
    '"base_revision":11111,"steps":111,"tokens":11111,"mean_loss":'
    + "1" * 18
    + ',"compute_s":'
    + "1" * 18
    + '},"tensors":[]}'
)
DISPATCH_ENVELOPE_BYTES = len(
    '{"v":1,"type":"dispatch","id":"'
    + "0" * 32
    + '","re":"'
    + "0" * 32
    + '","ts":'
    + "1" * 18
    + ',"body":{"revision":11111,"steps":111,"round_id":11111},"tensors":[]}'
)
DISPATCH_BITS = 32  # HeLoCo dispatches θ in fp32, whatever Δ is sent as (docs/network.md)
INT8_BLOCK = 4096  # elements per fp32 scale of the transport's int8 (heloco/net/compress.py)


@dataclass(frozen=True)
class Payload:
    """A payload resolved for one model: wire bits per parameter, how it is combined, memory."""

    kind: str  # PayloadSpec.kind
    label: str
    bits_per_param: float  # on the wire, per model parameter, per exchange
    gathered: bool  # True: all-gather (sparse, sign); False: summable (dense, low-rank)
    extra_bytes_per_param: float  # kept on each GPU (sharded like the gradients)
    rounds: int = 1  # sequential collectives per exchange (PowerSGD: P, then Q)
    # HeLoCo's push beyond bits_per_param × N / 8 (header, tag, per-tensor rounding of k),
    # and its dispatch of θ (fp32), whole messages: what a parameter-server exchange moves
    push_overhead_bytes: float = 0.0
    pull_bytes: float | None = None  # None: N × DISPATCH_BITS / 8 (no model given)


def matrix_shapes(model: TransformerSpec) -> list[tuple[int, int, int]]:
    """(rows, cols, count) of every weight matrix: attention q/k/v/o, the MLP's matrices (dense,
    routed and shared experts) and the embeddings (design doc C.1 parameter count)."""
    h, layers = model.hidden, model.n_layers
    shapes = [
        (h, model.q_dim, layers),
        (h, model.kv_dim, 2 * layers),
        (model.q_dim, h, layers),
        (h, model.dense_ffn, model.mlp_matrices * model.n_dense_layers),
        (model.vocab, h, 1 if model.tied_embeddings else 2),
    ]
    if model.moe is not None:
        experts = model.moe.experts + model.moe.shared_experts
        shapes.append((h, model.expert_ffn, model.mlp_matrices * experts * model.n_moe_layers))
    return [s for s in shapes if s[2] > 0]


def lowrank_bits(model: TransformerSpec, rank: int, value_bits: int) -> float:
    """PowerSGD: an m×n matrix travels as P (m×r) and Q (n×r), r·(m+n) values instead of
    m·n (Vogels et al. 2019, Alg. 1); never more than the dense matrix."""
    sent = sum(min(rank * (m + n), m * n) * k for m, n, k in matrix_shapes(model))
    total = sum(m * n * k for m, n, k in matrix_shapes(model))
    return value_bits * sent / total


def model_tensors(model: TransformerSpec) -> list[tuple[str, tuple[int, ...]]]:
    """(name, shape) of every parameter tensor, named as a Hugging Face Llama checkpoint names
    them: the matrices of `matrix_shapes` (the same shapes and counts) and two norm vectors
    per layer plus the final norm. Another model's names differ by a few characters per
    tensor, a few bytes of its header."""
    h, layers = model.hidden, model.n_layers
    out: list[tuple[str, tuple[int, ...]]] = []
    for i in range(layers):
        pre = f"model.layers.{i}."
        out += [
            (pre + "self_attn.q_proj.weight", (h, model.q_dim)),
            (pre + "self_attn.k_proj.weight", (h, model.kv_dim)),
            (pre + "self_attn.v_proj.weight", (h, model.kv_dim)),
            (pre + "self_attn.o_proj.weight", (model.q_dim, h)),
            (pre + "input_layernorm.weight", (h,)),
            (pre + "post_attention_layernorm.weight", (h,)),
        ]
    dense = model.mlp_matrices * model.n_dense_layers
    out += [
        (f"model.layers.{j % layers}.mlp.w{j}.weight", (h, model.dense_ffn)) for j in range(dense)
    ]
    if model.moe is not None:
        experts = model.moe.experts + model.moe.shared_experts
        count = model.mlp_matrices * experts * model.n_moe_layers
        out += [
            (f"model.layers.{j % layers}.mlp.experts.w{j}.weight", (h, model.expert_ffn))
            for j in range(count)
        ]
    out.append(("model.embed_tokens.weight", (model.vocab, h)))
    if not model.tied_embeddings:
        out.append(("lm_head.weight", (model.vocab, h)))
    out.append(("model.norm.weight", (h,)))
    return out


def wire_tensor(spec: PayloadSpec, numel: int, dense_bits: float = 32) -> tuple[str, int, int, int]:
    """(codec, block, k, frame bytes) of one tensor of ``numel`` elements as HeLoCo sends it
    (docs/network.md, the payload table): top-k keeps k = ⌈f·n⌉ (at least 1) values of
    value_bits and int32 indices; sign ⌈n/8⌉ bytes of bits and ⌈n/group⌉ scales; dense fp32,
    bf16, or int8 with one fp32 scale per 4096 elements. Other families: bits × n / 8."""
    if spec.kind == "topk":
        k = min(numel, max(1 if numel else 0, math.ceil(float(spec.fraction or 1) * numel - 1e-9)))
        width = "bf16" if spec.value_bits == 16 else "fp32"
        return f"topk_{width}", 0, k, k * (spec.value_bits + 32) // 8
    if spec.kind == "sign":
        width = "bf16" if spec.scale_bits == 16 else "fp32"
        groups = -(-numel // spec.group)
        return f"sign_{width}", spec.group, 0, -(-numel // 8) + groups * spec.scale_bits // 8
    if spec.kind == "dense":
        if dense_bits <= 8:
            return "int8", INT8_BLOCK, 0, numel + 4 * -(-numel // INT8_BLOCK)
        return ("bf16", 0, 0, 2 * numel) if dense_bits <= 16 else ("fp32", 0, 0, 4 * numel)
    return spec.kind, 0, 0, math.ceil(numel * _family_bits(spec) / 8)


def tensor_entry_bytes(name: str, shape: Sequence[int], codec: str, block: int, k: int) -> int:
    """One tensor's entry in the JSON header, with its separating comma (heloco/net/wire.py)."""
    entry = {"name": name, "codec": codec, "shape": list(shape), "block": block}
    if codec.startswith("topk"):
        entry["k"] = k
    return len(json.dumps(entry, separators=(",", ":"))) + 1


def push_bytes(
    spec: PayloadSpec, tensors: Sequence[tuple[str, Sequence[int]]], dense_bits: float = 32
) -> int:
    """A HeLoCo push of Δ as ``spec`` (a dense one at ``dense_bits``), whole message: header
    (envelope and one entry per tensor), every tensor's frames, and the tag (module constants)."""
    total = PUSH_ENVELOPE_BYTES + TAG_BYTES - 1  # the last entry has no comma
    for name, shape in tensors:
        codec, block, k, frames = wire_tensor(spec, math.prod(shape), dense_bits)
        total += tensor_entry_bytes(name, shape, codec, block, k) + frames
    return total


def dispatch_bytes(tensors: Sequence[tuple[str, Sequence[int]]]) -> int:
    """A HeLoCo dispatch of θ (fp32 tensors), whole message, as :func:`push_bytes` counts."""
    total = DISPATCH_ENVELOPE_BYTES + TAG_BYTES - 1
    for name, shape in tensors:
        total += tensor_entry_bytes(name, shape, "fp32", 0, 0) + 4 * math.prod(shape)
    return total


def _family_bits(spec: PayloadSpec) -> float:
    """Bits per parameter of a family whose size does not depend on the model's shapes."""
    if spec.kind in ("topk", "dct_topk"):
        index = spec.index_bits or DEFAULT_INDEX_BITS[spec.kind]
        return float(spec.fraction or 1.0) * (spec.value_bits + index)
    if spec.kind == "sign":
        return 1.0 + spec.scale_bits / spec.group
    return float(spec.value_bits)


def dense_payload(bits: float) -> Payload:
    """q-bit values, summed in flight, no extra state."""
    return Payload("dense", f"dense {bits:g}-bit", float(bits), False, 0.0)


def resolve_payload(spec: PayloadSpec, dense_bits: float, model: TransformerSpec) -> Payload:
    """The payload of `spec` for `model`; `dense_bits` is q of a dense exchange. The HeLoCo
    message terms (`push_overhead_bytes`, `pull_bytes`) count `model_tensors(model)`."""
    ef = RESIDUAL_BYTES if spec.error_feedback else 0.0
    if spec.kind == "dense":
        payload = dense_payload(dense_bits)
    elif spec.kind in ("topk", "dct_topk", "sign"):
        payload = Payload(spec.kind, spec.label, _family_bits(spec), True, ef)
    else:
        bits = lowrank_bits(model, spec.rank, spec.value_bits)
        q_bytes = spec.value_bits / 8 * spec.rank * sum(n * k for _, n, k in matrix_shapes(model))
        extra = ef + q_bytes / model.params_total
        payload = Payload(spec.kind, spec.label, bits, False, extra, rounds=2)
    return with_messages(payload, spec, dense_bits, model_tensors(model), model.params_total)


def with_messages(
    payload: Payload,
    spec: PayloadSpec,
    dense_bits: float,
    tensors: Sequence[tuple[str, Sequence[int]]],
    n_params: float | None = None,
) -> Payload:
    """`payload` with HeLoCo's whole-message bytes for a model of these tensors: the push's
    bytes beyond bits × N / 8 (N = `n_params`, default the tensors' elements) and the
    dispatch's (θ in fp32)."""
    n = sum(math.prod(shape) for _, shape in tensors) if n_params is None else n_params
    push = push_bytes(spec, tensors, dense_bits)
    return dataclasses.replace(
        payload,
        push_overhead_bytes=push - payload.bits_per_param * n / 8,
        pull_bytes=float(dispatch_bytes(tensors)),
    )
