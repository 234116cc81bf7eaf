"""The outer-optimizer protocol and the small helpers every update rule shares.

An outer optimizer turns pseudo-gradients into a new global model. It mutates the server's
parameters in place (fp32), keeps its own fp32 state, and says which point to dispatch to the
next worker. One ``step`` call is one outer update (one server revision).

Every rule works one parameter tensor (block) at a time through its ``runner``
(:class:`BlockRunner`): per-block functions that read that block's pseudo-gradients, state and
parameters only, plus whole-model quantities formed afterwards from per-block scalars. So a
server can run the blocks of disjoint shards on parallel threads (the same result, bit for bit),
and a pseudo-gradient may be a mapping that decodes one tensor when it is read (a wire message
that never exists as a whole fp32 model): a block function holds one decoded tensor at a time.

A block larger than :data:`CHUNK_ELEMENTS` is processed in chunks of that many elements
(:func:`chunks`): the update, the int8 decoding of the pseudo-gradient and the block's
diagnostics all run on one chunk while it is in cache, instead of one pass over the whole
block per operation. Every element sees the same float operations in the same order, so θ and
the state come out bit for bit as block-at-a-time; only the block's norms and inner products
are summed per chunk (:func:`merge_geometry`), which changes them in the last bits, and with
them HeLoCo's correction coefficients (θ then agrees to float rounding). Blocks up to
:data:`CHUNK_ELEMENTS` are one chunk and unchanged: every tensor of the TinyGPT presets with
the byte vocabulary (the paper grid's); not the 50257-token embedding of ``paper-gpt2vocab``.
"""

from __future__ import annotations

import math
from collections.abc import Callable, Iterator, Sequence
from dataclasses import dataclass, field
from functools import partial
from typing import Any, Protocol, TypeVar, runtime_checkable

import torch

from heloco.config import RhoMode
from heloco.types import Delta, Params, clone_params
from shardmeter.errors import UserInputError

CHUNK_ELEMENTS = 1 << 19  # elements per chunk: 2 MiB of fp32 per tensor, in cache together
Rho = RhoMode | float
T = TypeVar("T")


@dataclass(frozen=True)
class Arrival:
    """One pseudo-gradient as the optimizer sees it.

    ``weight`` multiplies the arrival on top of ρ (arrival balancing sets it; 1 otherwise).
    """

    delta: Delta
    worker: int
    staleness: int
    weight: float = 1.0


class BlockRunner(Protocol):
    """Runs a per-block function over parameter names; results come in the names' order."""

    def map(self, fn: Callable[[str], T], names: Sequence[str]) -> list[T]: ...


class Serial:
    """One block after another on the calling thread."""

    def map(self, fn: Callable[[str], T], names: Sequence[str]) -> list[T]:
        """``[fn(name) for name in names]``."""
        return [fn(name) for name in names]


SERIAL = Serial()


@dataclass(frozen=True)
class StepStats:
    """Diagnostics of one outer step (means over the step's arrivals).

    ``cos_delta_momentum`` is the whole-model cosine between the weighted update and the
    momentum *before* the step (nan while the momentum is zero). Fractions count parameter
    tensors (blocks); ``mean_lambda`` / ``mean_beta`` average over all blocks, 0 where the case
    did not apply. ``correction_size`` is ||Δ̂ − Δ|| / ||Δ|| over the whole model;
    ``tensor_correction_size`` is the mean over tensors of ||Δ̂_b − Δ_b|| / ||Δ_b|| (the
    authors' notebook reports this one).
    """

    rho: float
    delta_norm: float
    cos_delta_momentum: float
    frac_kept: float = 1.0
    frac_shrunk: float = 0.0
    frac_rotated: float = 0.0
    correction_size: float = 0.0
    tensor_correction_size: float = 0.0
    mean_lambda: float = 0.0
    mean_beta: float = 0.0


@dataclass
class OptimizerState:
    """A checkpointable state: fp32 tensors by name plus a JSON-able remainder."""

    tensors: Params = field(default_factory=dict)
    meta: dict[str, Any] = field(default_factory=dict)


@runtime_checkable
class OuterOptimizer(Protocol):
    """What the server calls. Implementations: nesterov, delayed, lookahead, heloco, balanced."""

    name: str
    runner: BlockRunner

    def step(self, params: Params, arrivals: Sequence[Arrival]) -> StepStats:
        """Apply one outer update to ``params`` in place from one or more arrivals."""
        ...

    def dispatch_params(self, params: Params) -> Params:
        """Fresh tensors of the point the next worker should start from."""
        ...

    def dispatches_params(self) -> bool:
        """Whether that point is θ itself right now (a server may then send θ uncopied)."""
        ...

    def state_dict(self, copy: bool = True) -> OptimizerState:
        """The state as tensors and JSON; ``copy=False`` gives the live tensors (a checkpoint
        written at once needs no second copy of the model)."""
        ...

    def load_state_dict(self, state: OptimizerState) -> None: ...


def rho_weight(rho: Rho, n_workers: int, staleness: int) -> float:
    """Arrival weight ρ_t (spec 1.5): 1/√K, or delay-aware (1/√K)/√(1+τ), 1, or a constant."""
    if isinstance(rho, bool):
        raise UserInputError("rho", rho, "allowed: 'sqrt_k', 'delay', 'none' or a positive number")
    if isinstance(rho, int | float):
        if not rho > 0:
            raise UserInputError("rho", rho, "a numeric rho must be > 0")
        return float(rho)
    if rho == "sqrt_k":
        return 1.0 / math.sqrt(n_workers)
    if rho == "delay":
        return 1.0 / math.sqrt(n_workers) / math.sqrt(1.0 + max(staleness, 0))
    if rho == "none":
        return 1.0
    raise UserInputError("rho", rho, "allowed: 'sqrt_k', 'delay', 'none' or a positive number")


def norm(t: torch.Tensor) -> float:
    """L2 norm of one tensor (the kernel :func:`block_norms` uses for each)."""
    return float(torch._foreach_norm([t])[0])


def block_norms(tensors: Sequence[torch.Tensor]) -> torch.Tensor:
    """Per-tensor L2 norms as one float64 vector (one foreach call)."""
    return torch.stack(torch._foreach_norm(list(tensors))).to(torch.float64)


def block_dots(a: Sequence[torch.Tensor], b: Sequence[torch.Tensor]) -> torch.Tensor:
    """Per-tensor inner products <a_b, b_b> as one float64 vector."""
    return torch.stack(
        [torch.dot(x.reshape(-1), y.reshape(-1)) for x, y in zip(a, b, strict=True)]
    ).to(torch.float64)


def whole_cosine(dots: torch.Tensor, norms_a: torch.Tensor, norms_b: torch.Tensor) -> float:
    """Whole-model cosine from per-block dots and norms; nan if either vector is zero."""
    na = float(norms_a.square().sum().sqrt())
    nb = float(norms_b.square().sum().sqrt())
    if na == 0.0 or nb == 0.0:
        return math.nan
    return float(dots.sum()) / (na * nb)


def check_names(params: Params, delta: Delta) -> None:
    """Raise if a pseudo-gradient does not carry exactly the model's tensors."""
    if delta.keys() != params.keys():
        missing = sorted(set(params) - set(delta))[:3]
        extra = sorted(set(delta) - set(params))[:3]
        raise UserInputError(
            "delta", f"missing={missing} extra={extra}", "the model's parameter names"
        )


def zero_momentum(params: Params) -> Params:
    """fp32 zero buffers shaped like ``params``."""
    return {k: torch.zeros_like(v, dtype=torch.float32) for k, v in params.items()}


def copy_into(dst: Params, src: Params) -> None:
    """Copy ``src`` tensors into the same-named ``dst`` buffers (load_state_dict helper)."""
    for k, v in dst.items():
        v.copy_(src[k])


def prefixed(prefix: str, tensors: Params, copy: bool = True) -> Params:
    """Name tensors ``prefix/name`` for a flat checkpoint (copies unless ``copy=False``)."""
    return {f"{prefix}/{k}": v.detach().clone() if copy else v for k, v in tensors.items()}


def unprefixed(prefix: str, tensors: Params) -> Params:
    """Inverse of :func:`prefixed` for one prefix."""
    head = prefix + "/"
    return {k[len(head) :]: v for k, v in tensors.items() if k.startswith(head)}


def plain_dispatch(params: Params) -> Params:
    """Dispatch θ itself (every method except HeLoCo's look-ahead)."""
    return clone_params(params)


class MomentumRule:
    """Shared part of the momentum rules: hyperparameters, an fp32 momentum ``m``, the flag
    ``seeded`` (m has been written at least once), plain dispatch and a momentum checkpoint."""

    name = ""

    def __init__(
        self, params: Params, *, lr: float, momentum: float, rho: Rho, n_workers: int
    ) -> None:
        self.lr = lr
        self.momentum = momentum
        self.rho = rho
        self.n_workers = n_workers
        self.m = zero_momentum(params)
        self.seeded = False
        self.runner: BlockRunner = SERIAL

    def arrival_weight(self, arrival: Arrival) -> float:
        """ρ_t (spec 1.5, :func:`rho_weight`) times the arrival's own weight; dimensionless."""
        return rho_weight(self.rho, self.n_workers, arrival.staleness) * arrival.weight

    def dispatch_params(self, params: Params) -> Params:
        """Fresh tensors of θ (subclasses with a look-ahead point override this)."""
        return plain_dispatch(params)

    def dispatches_params(self) -> bool:
        """The dispatch point is θ (subclasses with a look-ahead point override this)."""
        return True

    def state_dict(self, copy: bool = True) -> OptimizerState:
        """The momentum as ``momentum/<name>`` tensors plus ``seeded``."""
        return OptimizerState(prefixed("momentum", self.m, copy), {"seeded": self.seeded})

    def load_state_dict(self, state: OptimizerState) -> None:
        """Inverse of :meth:`state_dict`; copies into the existing buffers."""
        copy_into(self.m, unprefixed("momentum", state.tensors))
        self.seeded = bool(state.meta["seeded"])


Geometry = tuple[float, float, float]
"""One block before a step: (‖G_b‖, ⟨G_b, m_b⟩, ‖m_b‖), G_b the weighted update, m_b momentum."""


@runtime_checkable
class ChunkedDelta(Protocol):
    """A pseudo-gradient that decodes a range of one tensor's flat elements on demand (a wire
    message: :class:`heloco.net.compress.Decoded`); the chunk stays valid until the same
    thread reads the next one from this mapping."""

    def chunk(self, name: str, lo: int, hi: int) -> torch.Tensor:
        """Elements ``[lo, hi)`` of tensor ``name`` flattened, as fp32."""
        ...


def read_chunk(delta: Delta, name: str, lo: int, hi: int) -> torch.Tensor:
    """Elements ``[lo, hi)`` of ``delta[name]`` flattened (decoded only there if it can)."""
    return chunk_reader(delta, name)(lo, hi)


def chunk_reader(delta: Delta, name: str) -> Callable[[int, int], torch.Tensor]:
    """``(lo, hi) ->`` elements ``[lo, hi)`` of ``delta[name]`` flattened: decoded per chunk
    by a :class:`ChunkedDelta`, else slices of the tensor flattened once."""
    if isinstance(delta, ChunkedDelta):
        return partial(delta.chunk, name)
    flat = delta[name].reshape(-1)
    return lambda lo, hi: flat[lo:hi]


def chunks(
    name: str, deltas: Sequence[Delta], state: Sequence[torch.Tensor]
) -> Iterator[tuple[list[torch.Tensor], list[torch.Tensor]]]:
    """(Δ chunks, state chunks) of block ``name`` for each of ``deltas`` and each ``state``
    tensor (θ, momentum, ...: views, written in place), :data:`CHUNK_ELEMENTS` at a time.

    A block of at most one chunk (or with a non-contiguous state tensor) comes whole, with
    its own shapes, exactly as a block-at-a-time rule reads it."""
    numel = state[0].numel()
    if numel <= CHUNK_ELEMENTS or not all(t.is_contiguous() for t in state):
        yield [d[name] for d in deltas], list(state)
        return
    flats = [t.view(-1) for t in state]
    readers = [chunk_reader(d, name) for d in deltas]
    for lo in range(0, numel, CHUNK_ELEMENTS):
        hi = min(numel, lo + CHUNK_ELEMENTS)
        yield [read(lo, hi) for read in readers], [f[lo:hi] for f in flats]


def merge_geometry(parts: Sequence[Geometry]) -> Geometry:
    """One block's geometry from its chunks': norms as the root of the exact (``fsum``) sum of
    their squares, inner products as their exact sum; one chunk is returned as it is."""
    if len(parts) == 1:
        return parts[0]
    return (
        math.sqrt(math.fsum(p[0] * p[0] for p in parts)),
        math.fsum(p[1] for p in parts),
        math.sqrt(math.fsum(p[2] * p[2] for p in parts)),
    )


def weighted_geometry(
    deltas: Sequence[torch.Tensor], coefs: Sequence[float], momentum: torch.Tensor, seeded: bool
) -> Geometry:
    """Geometry of G_b = Σ c_i Δ_i in one block; the momentum terms are 0 unless ``seeded``.

    One arrival: ‖G‖ = |c|·‖Δ‖ and ⟨G, m⟩ = c·⟨Δ, m⟩ without forming G."""
    if len(deltas) == 1:
        block, scale = deltas[0], coefs[0]
    else:
        block, scale = _combine(deltas, coefs), 1.0
    if not seeded:
        return norm(block) * abs(scale), 0.0, 0.0
    dot = float(torch.dot(block.reshape(-1), momentum.reshape(-1))) * scale
    return norm(block) * abs(scale), dot, norm(momentum)


def geometry_stats(blocks: Sequence[Geometry], rho: float, seeded: bool) -> StepStats:
    """Whole-model norm of G and its cosine with the momentum before the step, from the
    per-block geometry (:func:`weighted_geometry`)."""
    nd = torch.tensor([g[0] for g in blocks], dtype=torch.float64)
    cos = math.nan
    if seeded:
        dots = torch.tensor([g[1] for g in blocks], dtype=torch.float64)
        cos = whole_cosine(dots, nd, torch.tensor([g[2] for g in blocks], dtype=torch.float64))
    return StepStats(rho=rho, delta_norm=float(nd.square().sum().sqrt()), cos_delta_momentum=cos)


def _combine(tensors: Sequence[torch.Tensor], coefs: Sequence[float]) -> torch.Tensor:
    """Σ c_i t_i as a new tensor."""
    out = tensors[0] * coefs[0]
    for t, c in zip(tensors[1:], coefs[1:], strict=True):
        out.add_(t, alpha=c)
    return out
