"""A pool of workers of many simulated runs: their submitted rounds computed together, each
distinct round once, and only rounds some run may still take.

Runs simulated side by side (the methods of one grid setting and seed) hand their rounds to
one pool, which computes them when some run waits (see :func:`heloco.sim.run.run_simulations`).
Three things make that cheaper than each run computing its own rounds, without changing a bit
of any result:

- **Identical rounds once.** A round is a pure function of the worker's state (data position,
  schedule position, round count, kept AdamW moments), its data stream and inner config, the
  dispatched parameters and the step count. Rounds of different runs that agree on all of
  them, compared bit for bit, are computed once; the others get a copy of the
  result and of the worker state it leaves. Every worker's first round of the methods that
  dispatch the initial model unchanged is such a round.
- **Only rounds that may be taken.** A run stops when its taken rounds reach its token budget
  (or the next arrival falls past its time budget), and rounds arrive in the order of their
  simulated arrival. So a round whose earlier-arriving rounds already fill the budget can
  never be taken; it is left uncomputed (and dropped when its run ends).
- **Batched** (:class:`heloco.sim.batch.BatchEngine`): the remaining rounds' inner steps in one
  stacked kernel. The plain pool computes them one after another, each on its own worker.

The simulated clock does not change: rounds only run earlier than their arrival, never in
another order for the same worker.
"""

from __future__ import annotations

import json
from collections.abc import Hashable, Sequence
from dataclasses import dataclass, replace

import torch

from heloco.types import Dispatch, Params, RoundResult
from heloco.worker import Worker


@dataclass(frozen=True)
class _Pending:
    dispatch: Dispatch
    arrival: float


def _worker_state(worker: Worker) -> tuple[str, dict[str, torch.Tensor]]:
    """The worker's state between rounds: JSON meta and tensors (RNG, kept moments)."""
    state = worker.boundary.state_dict()
    return json.dumps(state["meta"], sort_keys=True), state["tensors"]


def _probe(tensors: Sequence[torch.Tensor]) -> tuple[bytes, ...]:
    """A cheap fingerprint: the first and last elements of each tensor (equal tensors have
    equal fingerprints; candidates are then compared in full)."""
    out = []
    for t in tensors:
        flat = t.detach().reshape(-1)
        ends = torch.cat([flat[:4], flat[-4:]]).cpu()
        out.append(ends.contiguous().view(torch.uint8).numpy().tobytes())
    return tuple(out)


def _bits(t: torch.Tensor) -> torch.Tensor:
    """The tensor's bytes (so -0.0 and 0.0 differ, and NaNs with the same bits agree)."""
    return t.detach().reshape(-1).contiguous().view(torch.uint8)


def same_tensors(a: Sequence[torch.Tensor], b: Sequence[torch.Tensor]) -> bool:
    """Whether the two sequences hold tensors of the same dtypes, shapes and bits."""
    return len(a) == len(b) and all(
        x.dtype == y.dtype and x.shape == y.shape and torch.equal(_bits(x), _bits(y))
        for x, y in zip(a, b, strict=True)
    )


class RoundPool:
    """Slots of workers (of one or many runs); computes submitted rounds when asked.

    ``bind`` attaches a worker with its ``identity``: anything that, besides the worker's state,
    the dispatch and the step count, determines its rounds (its data stream, inner config, loss,
    model shape); workers of equal identity may share rounds.
    """

    def __init__(self, slots: int) -> None:
        self.workers: list[Worker | None] = [None] * slots
        self.identity: list[Hashable] = [None] * slots
        self.pending: dict[int, _Pending] = {}
        self.done: dict[int, RoundResult] = {}
        self.waited: set[int] = set()
        self.views: list[PooledRounds] = []
        self.computed = 0  # rounds computed
        self.shared = 0  # rounds copied from an identical round
        self.computed_steps = 0  # inner steps of the computed rounds
        self.shared_steps = 0  # inner steps of the copied rounds

    @property
    def slots(self) -> int:
        return len(self.workers)

    def bind(self, slot: int, worker: Worker, identity: Hashable) -> None:
        self.workers[slot] = worker
        self.identity[slot] = identity

    def submit(self, slot: int, dispatch: Dispatch, arrival: float) -> None:
        if slot in self.pending or slot in self.done:
            raise RuntimeError(f"slot {slot} already has a round in flight")
        self.pending[slot] = _Pending(dispatch, arrival)

    def ready(self, slot: int) -> bool:
        if slot in self.done:
            return True
        self.waited.add(slot)
        return False

    def take(self, slot: int) -> RoundResult:
        return self.done.pop(slot)

    def cancel(self, slots: Sequence[int]) -> None:
        """Forget the rounds of ``slots`` (a run that ended or failed)."""
        for s in slots:
            self.pending.pop(s, None)
            self.done.pop(s, None)
            self.waited.discard(s)

    def run(self) -> int:
        """Compute every submitted round some run waits for or may still take (each distinct
        round once); returns how many rounds became ready."""
        wanted = set(self.waited)
        for view in self.views:
            wanted.update(view.may_take())
        slots = sorted(s for s in wanted if s in self.pending)
        if not slots:
            return 0
        groups = self._identical(slots)
        leaders = sorted(groups)
        dispatches = [self.pending.pop(s).dispatch for s in leaders]
        results = self._compute(leaders, [self._worker(s) for s in leaders], dispatches)
        for s, result in zip(leaders, results, strict=True):
            self.done[s] = result
            self._share(s, result, groups[s])
            self.computed_steps += result.steps
            self.shared_steps += result.steps * len(groups[s])
        self.computed += len(leaders)
        self.shared += len(slots) - len(leaders)
        self.waited.difference_update(slots)
        return len(slots)

    # -- identical rounds -----------------------------------------------------------------
    def _identical(self, slots: list[int]) -> dict[int, list[int]]:
        """Leader slot -> the other slots whose round is the same computation."""
        states = {s: _worker_state(self._worker(s)) for s in slots}
        buckets: dict[Hashable, list[int]] = {}
        for s in slots:
            d = self.pending[s].dispatch
            meta, tensors = states[s]
            cheap = (
                self.identity[s],
                d.steps,
                meta,
                tuple(tensors),
                tuple(d.params),
                _probe(list(tensors.values())),
                _probe(list(d.params.values())),
            )
            buckets.setdefault(cheap, []).append(s)
        groups: dict[int, list[int]] = {}
        for members in buckets.values():
            leaders: list[int] = []
            for s in members:
                same = next((lead for lead in leaders if self._same_round(lead, s, states)), None)
                if same is None:
                    leaders.append(s)
                    groups[s] = []
                else:
                    groups[same].append(s)
        return groups

    def _same_round(
        self, a: int, b: int, states: dict[int, tuple[str, dict[str, torch.Tensor]]]
    ) -> bool:
        pa, pb = self.pending[a].dispatch.params, self.pending[b].dispatch.params
        return same_tensors(list(states[a][1].values()), list(states[b][1].values())) and (
            same_tensors(list(pa.values()), list(pb.values()))
        )

    def _share(self, leader: int, result: RoundResult, followers: list[int]) -> None:
        """Give each follower the leader's result and the worker state the round left."""
        if not followers:
            return
        state = self._worker(leader).boundary.state_dict()
        for s in followers:
            d = self.pending.pop(s).dispatch
            self._worker(s).boundary.load_state_dict(state)
            delta: Params = {k: v.clone() for k, v in result.delta.items()}
            self.done[s] = replace(
                result, delta=delta, base_revision=d.revision, round_id=d.round_id
            )

    # -- computing ------------------------------------------------------------------------
    def _compute(
        self, slots: list[int], workers: list[Worker], dispatches: list[Dispatch]
    ) -> list[RoundResult]:
        """The rounds, one after another, each by its own worker."""
        return [
            w.run_round(d.params, d.steps, d.revision, d.round_id)
            for w, d in zip(workers, dispatches, strict=True)
        ]

    def round_tokens(self, slot: int) -> int:
        """Training tokens of the round submitted for ``slot``."""
        steps = self.pending[slot].dispatch.steps
        return steps * self._worker(slot).sampler.tokens_per_batch

    def _worker(self, slot: int) -> Worker:
        w = self.workers[slot]
        if w is None:
            raise RuntimeError(f"slot {slot} has no worker")
        return w


class PooledRounds:
    """One run's view of a :class:`RoundPool`: its workers are slots ``offset..offset+K-1``.

    Tracks the tokens of the rounds the run took, so it can tell the pool which of its
    submitted rounds it may still take (see :meth:`may_take`).
    """

    def __init__(
        self,
        pool: RoundPool,
        offset: int,
        workers: int,
        token_budget: int | None,
        time_budget: float | None,
    ) -> None:
        self.pool, self.offset, self.workers = pool, offset, workers
        self.token_budget, self.time_budget = token_budget, time_budget
        self.taken_tokens = 0
        pool.views.append(self)

    def submit(self, dispatch: Dispatch, arrival: float) -> None:
        self.pool.submit(self.offset + dispatch.worker, dispatch, arrival)

    def ready(self, worker: int) -> bool:
        return self.pool.ready(self.offset + worker)

    def take(self, worker: int) -> RoundResult:
        result = self.pool.take(self.offset + worker)
        self.taken_tokens += result.tokens
        return result

    def cancel(self) -> None:
        """Drop the run's rounds (it ended or failed) and stop asking for them."""
        self.pool.cancel(range(self.offset, self.offset + self.workers))
        if self in self.pool.views:
            self.pool.views.remove(self)

    def may_take(self) -> list[int]:
        """Slots of the submitted rounds this run may still take.

        The loop takes rounds in order of (arrival, worker), counts every taken round's tokens
        and stops once they reach the token budget, or when the next arrival falls past the
        time budget; rounds dispatched later only fill the budget sooner. So a round is
        possibly taken only if it arrives within the time budget and the rounds arriving
        before it leave the budget unfilled (the sync loop may take more: it finishes a
        started round, and those rounds are computed when it waits for them).
        """
        mine = [
            (p.arrival, s)
            for s, p in self.pool.pending.items()
            if self.offset <= s < self.offset + self.workers
        ]
        tokens = self.taken_tokens
        out = []
        for arrival, s in sorted(mine):
            if self.token_budget is not None and tokens >= self.token_budget:
                break
            if self.time_budget is not None and arrival > self.time_budget:
                break
            out.append(s)
            tokens += self.pool.round_tokens(s)
        return out
