"""What one exchange puts on the WAN: bits per parameter of each payload family, indices and
scales included, whether it can be summed in flight (all-reduce) or must be gathered, and the
extra memory it keeps per parameter (error-feedback residuals).

Units: bits per parameter of the model, bytes per parameter. Sources per family in
`PayloadSpec` (specs/topology.py); the error-feedback residual is an fp32 copy of the
un-sent remainder (Seide et al. 2014; Karimireddy et al. 2019, EF-SGD Alg. 2).
"""

from __future__ import annotations

from dataclasses import dataclass

from shardmeter.specs.model import TransformerSpec
from shardmeter.specs.topology import PayloadSpec

RESIDUAL_BYTES = 4.0  # fp32 error-feedback residual per parameter (EF-SGD, Alg. 2)
DEFAULT_INDEX_BITS = {"topk": 32, "dct_topk": 16}  # int32 flat index; int16 in-chunk index


@dataclass(frozen=True)
class Payload:
    """A payload resolved for one model: wire bits per parameter, how it is combined, memory."""

    kind: str  # PayloadSpec.kind
    label: str
    bits_per_param: float  # on the wire, per model parameter, per exchange
    gathered: bool  # True: all-gather (sparse, sign); False: summable (dense, low-rank)
    extra_bytes_per_param: float  # kept on each GPU (sharded like the gradients)
    rounds: int = 1  # sequential collectives per exchange (PowerSGD: P, then Q)


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


def dense_payload(bits: float) -> Payload:
    """q-bit values, summed in flight, no extra state."""
    return Payload("dense", f"dense {bits:g}-bit", float(bits), False, 0.0)


def resolve_payload(spec: PayloadSpec, dense_bits: float, model: TransformerSpec) -> Payload:
    """The payload of `spec` for `model`; `dense_bits` is q of a dense exchange."""
    ef = RESIDUAL_BYTES if spec.error_feedback else 0.0
    if spec.kind == "dense":
        return dense_payload(dense_bits)
    if spec.kind in ("topk", "dct_topk"):
        fraction = float(spec.fraction or 1.0)
        index = spec.index_bits or DEFAULT_INDEX_BITS[spec.kind]
        return Payload(spec.kind, spec.label, fraction * (spec.value_bits + index), True, ef)
    if spec.kind == "sign":
        return Payload(spec.kind, spec.label, 1.0 + spec.scale_bits / spec.group, True, ef)
    bits = lowrank_bits(model, spec.rank, spec.value_bits)
    q_bytes = spec.value_bits / 8 * spec.rank * sum(n * k for _, n, k in matrix_shapes(model))
    return Payload(spec.kind, spec.label, bits, False, ef + q_bytes / model.params_total, rounds=2)
