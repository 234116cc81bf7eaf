"""Types shared by the HeLoCo modules: parameter maps, a dispatch, the result of one worker
round and the server's answer to its push."""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass

import torch

Params = dict[str, torch.Tensor]
"""Ordered map from parameter name (as in ``model.named_parameters()``) to an fp32 tensor."""

Delta = Mapping[str, torch.Tensor]
"""A pseudo-gradient by parameter name: fp32 tensors, possibly decoded only when read (a
server keeps a pushed Δ in its wire form; see ``heloco.outer.base``)."""


@dataclass(frozen=True)
class RoundResult:
    """What a worker returns after one round of inner steps.

    ``delta`` is the pseudo-gradient start - end (fp32, CPU; a worker's is a dict, a server
    may hold it as a mapping that decodes each tensor when read). ``round_id`` is the per-worker
    dispatch number handed out by ``Server.dispatch``; together with ``worker`` it identifies
    the submission, so a server can reject a replayed one. ``None`` means "the round of the
    worker's outstanding dispatch" (the simulator and tests may omit it).
    """

    worker: int
    delta: Delta
    steps: int
    tokens: int
    mean_loss: float
    base_revision: int
    round_id: int | None = None
    fragment: int | None = None  # streaming: the one fragment Δ covers (heloco.streaming)


def clone_params(params: Params) -> Params:
    """A detached fp32 copy of ``params`` (same names, same order)."""
    return {name: t.detach().to(torch.float32).clone() for name, t in params.items()}


def zeros_like_params(params: Params) -> Params:
    """fp32 zeros with the names and shapes of ``params``."""
    return {name: torch.zeros_like(t, dtype=torch.float32) for name, t in params.items()}


@dataclass(frozen=True)
class Dispatch:
    """What a worker receives: start point, its revision, steps to take and the round's id.

    ``fragment`` (streaming, :mod:`heloco.streaming`): the fragment the push answering this
    dispatch carries; ``params`` then holds every tensor or one fragment's."""

    params: Params
    revision: int
    steps: int
    round_id: int
    worker: int
    fragment: int | None = None


@dataclass(frozen=True)
class PushOutcome:
    """The server's answer to a push: applied (or buffered) and the revision after it."""

    accepted: bool
    revision: int
    reason: str = ""
    duplicate: bool = False


@dataclass(frozen=True)
class RoundTiming:
    """When a round received its dispatch, ran its inner steps and sent its push, on the run's
    clock (seconds, the origin of a ``round`` event's ``start`` and ``time``), and the tensor
    bytes each way: ``bytes_received`` the dispatch, ``bytes_sent`` the push (None: not
    known). In a blocking exchange the three follow each other; in an overlapped one the
    send and receive run beside the next round's compute."""

    recv_start: float
    recv_end: float
    compute_start: float
    compute_end: float
    send_start: float
    send_end: float
    bytes_sent: int | None = None
    bytes_received: int | None = None

    def event_fields(self) -> dict[str, float | int]:
        """The fields a ``round`` event carries (docs/heloco-metrics.md); unknown bytes left
        out."""
        fields = (
            "recv_start", "recv_end", "compute_start", "compute_end", "send_start", "send_end",
            "bytes_sent", "bytes_received",
        )  # fmt: skip
        return {k: v for k in fields if (v := getattr(self, k)) is not None}


def tensor_bytes(params: Mapping[str, torch.Tensor]) -> int:
    """Bytes of a parameter map's tensors as stored (a coded payload reports its own
    ``nbytes``: its wire size)."""
    coded = getattr(params, "nbytes", None)
    if isinstance(coded, int):
        return coded
    return sum(t.numel() * t.element_size() for t in params.values())
