"""The streaming exchange: P fragments of the model, each synchronised on its own staggered turn.

After Streaming DiLoCo (Douillard et al. 2025, "Streaming DiLoCo with overlapping
communication", arXiv 2501.18512, Algorithm 1), run against HeLoCo's asynchronous server.

**Fragments.** The model's parameter tensors are split into P fragments (:func:`fragments_of`):
the tensors of transformer layer i (a name with a ``.<i>.`` part, e.g. ``blocks.3.attn.w``)
go to fragment i mod P, the strided pattern the paper prefers (its Fig. 7); every other tensor
(embeddings, final norm, head) goes, largest first, to the fragment then holding the fewest
elements. Both sides compute the same partition from the names and sizes alone.

**Sub-rounds.** With H inner steps per round, a worker runs sub-rounds of H/P steps (H must be
a multiple of P; under DyLU, max(1, ⌊H_w/P⌋)). Each dispatch names the fragment f that the
push answering it carries, f = (round_id + 1) mod P, so fragment p is sent after inner steps
p·H/P, p·H/P + H, ... of the worker's count: the offsets round(p·H/P) that ShardMeter's
streaming mode charges (``shardmeter.estimate.schedule.even_schedule``), each fragment every H
steps. Fragment f's pseudo-gradient is Δ_f = θ̂_f − θ_f: its anchor θ̂_f (the global value of
f the worker last received, Algorithm 1's θ_global at the fragment's previous sync) minus the
worker's current value, covering the H steps since that sync (fewer for a fragment's first
sync after a full dispatch). Only Δ_f goes up (fp32, or the push codec), so a push carries the
fragment's share of the bytes.

**Overlap τ and merge α.** A push and the pull of the worker's next dispatch run in the
background while the next sub-round trains (τ = H/P inner steps, one fragment in flight at a
time, as HeLoCo's overlapped exchange keeps one round in flight). The dispatch answering the
push of fragment f carries only the server's new value of f, θ_f^g (a "fragment dispatch").
At the boundary after the next sub-round the worker first measures the Δ of the fragment it
sends now, then merges the arrived fragment (Algorithm 1's merge):

    θ_f ← α·θ_f + (1 − α)·θ_f^g ;  θ̂_f ← θ_f^g

α = 0 takes the global value, α = 0.5 the paper's mix. The other fragments keep training
locally. P ≥ 2, so the fragment merged is never the one just measured.

**Full dispatches.** A worker's first dispatch, and any dispatch that does not answer an
accepted push of the same worker (after a restart, an eviction or a refused push), carries
every tensor: the worker then loads it whole, every anchor becomes the dispatched value, and
a round in training from older state is dropped (it would be based on anchors the server no
longer holds). So a restarted worker needs no saved model: it starts over from θ.

**Base and staleness.** A push's base revision is the revision of the dispatch its fragment's
anchor came from. The server keeps, per worker and fragment, that revision and the count of
outer updates the fragment had then; a push's staleness is the fragment's updates since
(updates of other fragments do not age it). The outer optimizer steps on the fragment's
tensors only, with its own per-tensor state, so HeLoCo's block correction compares Δ_f with
the fragment's own momentum; DyLU sees each sub-round's speed (steps / compute seconds).

The simulator (:mod:`heloco.sim.loop`) and the networked worker
(:class:`heloco.outer_loop.OuterLoop`) both drive :class:`Stream`, so one config and seed
gives the same losses either way.
"""

from __future__ import annotations

import re
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, replace

import torch

from heloco.rounds import Rounds
from heloco.types import Delta, Dispatch, Params, RoundResult
from shardmeter.errors import UserInputError

LAYER = re.compile(r"\.(\d+)\.")
MAX_FRAGMENTS = 1024  # fragments of one model (a config and a wire bound)


def fragment_for_round(round_id: int, fragments: int) -> int:
    """The fragment the push answering dispatch ``round_id`` carries: (round_id + 1) mod P."""
    return (round_id + 1) % fragments


def fragments_of(
    shapes: Mapping[str, Sequence[int] | torch.Size], fragments: int
) -> list[list[str]]:
    """P lists of tensor names, each in the model's order (module docstring, "Fragments").

    Layer tensors go to fragment layer mod P; the rest, largest first (ties in model order), to
    the fragment with the fewest elements so far (ties: the lowest index)."""
    if not 1 <= fragments <= MAX_FRAGMENTS:
        raise UserInputError("fragments", fragments, f"an integer in [1, {MAX_FRAGMENTS}]")
    names = list(shapes)
    numel = {n: int(torch.Size(shapes[n]).numel()) for n in names}
    owner: dict[str, int] = {}
    loads = [0] * fragments
    rest = []
    for n in names:
        m = LAYER.search(n)
        if m is None:
            rest.append(n)
            continue
        owner[n] = int(m.group(1)) % fragments
        loads[owner[n]] += numel[n]
    order = {n: i for i, n in enumerate(names)}
    for n in sorted(rest, key=lambda k: (-numel[k], order[k])):
        f = min(range(fragments), key=lambda i: (loads[i], i))
        owner[n] = f
        loads[f] += numel[n]
    parts: list[list[str]] = [[] for _ in range(fragments)]
    for n in names:
        parts[owner[n]].append(n)
    if any(not p for p in parts):
        raise UserInputError(
            "fragments", fragments, f"at most the model's {len(names)} tensors, none left empty"
        )
    return parts


@dataclass(frozen=True)
class Anchor:
    """Where a worker's fragment was last synchronised: the revision of the dispatch it came
    from and the outer updates the fragment had had by then (server side)."""

    revision: int
    updates: int


@torch.no_grad()
def merge(local: torch.Tensor, arrived: torch.Tensor, alpha: float) -> torch.Tensor:
    """α·θ_local + (1 − α)·θ_global (Streaming DiLoCo, Algorithm 1's merge), a new tensor."""
    if alpha == 0.0:
        return arrived.clone()
    return local * alpha + arrived * (1.0 - alpha)


class Stream:
    """A streaming worker's state between sub-rounds (module docstring): its current θ
    (``local``, fp32 CPU), each tensor's anchor θ̂ and each fragment's anchor revision.

    The driver's boundary, in order: :func:`end_sub_round` (the ended sub-round's Δ of the
    fragment its dispatch names), :meth:`merge` of the dispatch that arrived meanwhile, then
    :func:`begin_sub_round`. A full dispatch is loaded by :meth:`reset`."""

    def __init__(self, fragments: list[list[str]], alpha: float) -> None:
        if not 0.0 <= alpha <= 1.0:
            raise UserInputError("stream_alpha", alpha, "a number in [0, 1]")
        self.fragments = fragments
        self.alpha = alpha
        self.owner = {n: f for f, names in enumerate(fragments) for n in names}
        self.local: Params = {}
        self.anchor: Params = {}
        self.revisions: list[int] = [0] * len(fragments)

    @property
    def ready(self) -> bool:
        """A full dispatch has been loaded (else the next dispatch must be full)."""
        return bool(self.local)

    def is_full(self, dispatch: Dispatch) -> bool:
        """Whether ``dispatch`` carries every tensor; a one-line error unless it carries
        either every tensor or exactly one fragment's."""
        keys = set(dispatch.params)
        if keys == set(self.owner):
            return True
        if keys and any(keys == set(names) for names in self.fragments):
            return False
        raise UserInputError(
            "dispatch", f"{len(keys)} tensors", "every tensor, or exactly one fragment's"
        )

    def reset(self, dispatch: Dispatch) -> None:
        """Load a full dispatch: θ = θ̂ = its parameters, every anchor at its revision."""
        if not self.is_full(dispatch):
            raise UserInputError("dispatch", "one fragment", "every tensor (a first dispatch)")
        self.local = {
            k: v.detach().to("cpu", torch.float32).clone() for k, v in dispatch.params.items()
        }
        self.anchor = {k: v.clone() for k, v in self.local.items()}
        self.revisions = [dispatch.revision] * len(self.fragments)

    def fragment_of(self, dispatch: Dispatch) -> int:
        """The fragment the push answering ``dispatch`` carries (one-line error if it has
        none or one out of range)."""
        f = dispatch.fragment
        if f is None or not 0 <= f < len(self.fragments):
            raise UserInputError(
                "dispatch.fragment", f, f"an integer in [0, {len(self.fragments)})"
            )
        return f

    @torch.no_grad()
    def finish(self, end: Params, fragment: int) -> tuple[Delta, int]:
        """θ = ``end`` (the sub-round's last parameters); (Δ_f = θ̂_f − θ_f, its base revision)."""
        self.local = end
        names = self.fragments[fragment]
        return {n: self.anchor[n] - end[n] for n in names}, self.revisions[fragment]

    @torch.no_grad()
    def merge(self, dispatch: Dispatch) -> None:
        """θ_f ← α·θ_f + (1 − α)·θ_f^g and θ̂_f ← θ_f^g for the fragment ``dispatch`` carries."""
        if self.is_full(dispatch):
            self.reset(dispatch)
            return
        f = self.owner[next(iter(dispatch.params))]
        for n, g in dispatch.params.items():
            arrived = g.detach().to("cpu", torch.float32)
            self.local[n] = merge(self.local[n], arrived, self.alpha)
            self.anchor[n] = arrived.clone()
        self.revisions[f] = dispatch.revision


def begin_sub_round(rounds: Rounds, stream: Stream, steps: int, full: bool) -> None:
    """Begin a sub-round of ``steps`` inner steps from the worker's θ; the inner optimizer is
    reset (if the method resets it each round) only after a full dispatch (``full``)."""
    if not stream.ready:
        raise RuntimeError("a streaming sub-round begun before a full dispatch was loaded")
    rounds.begin(Dispatch(stream.local, -1, steps, -1, rounds.worker), reset=full)


def end_sub_round(rounds: Rounds, stream: Stream, answers: Dispatch) -> RoundResult:
    """End the sub-round: the push answering ``answers`` (its round id), carrying Δ of the
    fragment ``answers`` names, based on that fragment's anchor revision."""
    fragment = stream.fragment_of(answers)
    end = rounds.current()
    counts = rounds.end(compress=False, delta=False)
    delta, base = stream.finish(end, fragment)
    return replace(
        counts, delta=delta, base_revision=base, round_id=answers.round_id, fragment=fragment
    )
