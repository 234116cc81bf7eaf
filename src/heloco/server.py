"""The authoritative server state machine, shared by the simulator and the network runtime.

It owns θ and the outer optimizer, hands out dispatches (with DyLU step counts), accepts each
round exactly once, measures staleness, applies updates immediately (async), per barrier of
the K workers (sync; an evicted worker leaves the barrier until its next dispatch), per
grace batch (the clock driver calls :meth:`Server.flush` when the window closes) or, with a
``quorum``, per merge of every buffered round once that many distinct workers have one
(Decoupled DiLoCo, below), and records the diagnostics of every update. It knows no clock and
no transport.

**Quorum merging** (Decoupled DiLoCo, Douillard et al. 2026, arXiv 2604.21428, §1 and the
abstract: asynchronous learners, "a minimum quorum, an adaptive grace window, and dynamic
token-weighted merging"). A submitted round is buffered and its worker is free at once: it is
dispatched again without waiting ("learners advance on their own clocks"), from θ as it is.
Once the buffered rounds come from ``quorum`` distinct workers the clock driver opens the grace
window (``grace_window`` seconds; fixed here, where the paper adapts it), and at its close
:meth:`flush` merges every buffered round into ONE outer step, each weighted by its share of
the merged tokens, w_m = n·tokens_m / Σ tokens (so the outer rule's mean of n arrivals is
Σ_m tokens_m Δ_m / Σ tokens; the paper's token-weighted merge, its exact score not public in
our sources). With ``grace_window`` 0 the merge happens at the quorum.

Invariant: ``revision`` equals the number of applied outer updates (len of ``log``).
"""

from __future__ import annotations

import math
from collections import deque
from collections.abc import Callable, Iterable, Sequence
from dataclasses import asdict, dataclass
from typing import Any, Literal

import torch
from pydantic import BaseModel, ConfigDict, Field

from heloco.config import DyluReference
from heloco.outer.base import Arrival, OptimizerState, OuterOptimizer, StepStats
from heloco.streaming import MAX_FRAGMENTS, Anchor, fragment_for_round, fragments_of
from heloco.types import Delta, Dispatch, Params, RoundResult, clone_params

__all__ = ["Dispatch", "Server", "ServerConfig", "SubmissionRejected", "UpdateRecord"]

RejectReason = Literal[
    "duplicate",
    "superseded",
    "unknown",
    "evicted",
    "revision_mismatch",
    "bad_worker",
    "bad_delta",
    "bad_fragment",
]


class ServerConfig(BaseModel):
    """Policies of the server. ``grace_window`` is in seconds; the clock driver enforces it."""

    model_config = ConfigDict(extra="forbid", frozen=True, allow_inf_nan=False)

    n_workers: int = Field(ge=1)
    inner_steps: int = Field(20, ge=1, description="H, local steps per round")
    synchronous: bool = Field(False, description="barrier: collect all K, then one averaged step")
    dylu: bool = Field(False, description="DyLU: H_w = floor(v_w / v_ref * H), in [1, H]")
    dylu_reference: DyluReference = Field(
        "max",
        description="DyLU v_ref: the fastest worker's latest speed (Liu et al. 2024), or a "
        "quantile of the recent speeds (the authors' production server)",
    )
    dylu_quantile: float = Field(0.9, gt=0, le=1, description="quantile of dylu_reference")
    dylu_window: int | None = Field(
        None, ge=1, description="recent speed observations the quantile sees (None: 4 per worker)"
    )
    grace_window: float = Field(0.0, ge=0, description="apply arrivals in a window as a batch")
    quorum: int = Field(
        0,
        ge=0,
        description="Decoupled DiLoCo: merge every buffered round, token-weighted, once this "
        "many distinct workers have one (0: off)",
    )
    overlapped: bool = Field(
        False,
        description="accept a push based on the worker's dispatch before the outstanding one "
        "(the overlapped exchange, heloco.overlap)",
    )
    fragments: int = Field(
        0,
        ge=0,
        le=MAX_FRAGMENTS,
        description="streaming (heloco.streaming): P fragments, each push one fragment's Δ and "
        "each outer step on its tensors only (0: whole-model rounds)",
    )


@dataclass(frozen=True)
class ArrivalRecord:
    """One accepted round as applied: who, from which revision, how stale, how much."""

    worker: int
    round_id: int
    base_revision: int
    staleness: int
    steps: int
    tokens: int
    train_loss: float
    fragment: int | None = None  # streaming: the fragment the step updated


@dataclass(frozen=True)
class UpdateRecord:
    """One outer update (one revision): its arrivals and the optimizer's diagnostics."""

    revision: int
    arrivals: tuple[ArrivalRecord, ...]
    stats: StepStats


@dataclass(frozen=True)
class ServerState:
    """A checkpoint: tensors (θ, optimizer state, buffered deltas) plus a JSON-able rest."""

    tensors: Params
    meta: dict[str, Any]


class SubmissionRejected(ValueError):
    """A submission the server will not apply (replayed, superseded or never dispatched)."""

    def __init__(self, reason: RejectReason, worker: int, round_id: int | None) -> None:
        self.reason = reason
        self.worker = worker
        self.round_id = round_id
        super().__init__(f"round {round_id} of worker {worker} rejected: {reason}")


@dataclass(frozen=True)
class _Outstanding:
    round_id: int
    revision: int
    steps: int
    # overlapped: the worker's dispatch before this one (a push may be based on it)
    prev_revision: int | None = None
    prev_steps: int | None = None
    fragment: int | None = None  # streaming: the fragment the answering push carries


def dylu_steps(
    speeds: Sequence[float | None], worker: int, inner_steps: int, v_ref: float | None = None
) -> int:
    """DyLU local steps H_w = min(H, max(1, floor(v_w / v_ref · H))) (steps per second).

    Liu et al. 2024 (Asynchronous Local-SGD), dynamic local updates; spec 2.4. ``v_ref``
    defaults to the maximum known speed. A worker whose speed is not yet known gets the full H.
    The 1e-9 keeps a ratio that is an integer up to float rounding from dropping a step.
    """
    known = [v for v in speeds if v is not None and v > 0]
    v = speeds[worker]
    ref = max(known) if v_ref is None and known else v_ref
    if v is None or v <= 0 or ref is None or ref <= 0:
        return inner_steps
    return min(inner_steps, max(1, math.floor(v / ref * inner_steps + 1e-9)))


def quantile_speed(pool: Sequence[float], q: float) -> float | None:
    """The q-quantile of a speed pool as the authors' production server takes it:
    sorted(pool)[ceil(q·(n−1))] (an upper order statistic; the max for n ≤ 1/(1−q)).
    None for an empty pool."""
    if not pool:
        return None
    ordered = sorted(pool)
    return ordered[math.ceil(q * (len(ordered) - 1))]


class Server:
    """Revisions, staleness, exactly-once, DyLU, grace batches and sync barriers."""

    def __init__(
        self, init: Params, optimizer: OuterOptimizer, cfg: ServerConfig, copy_init: bool = True
    ) -> None:
        """``copy_init=False`` adopts ``init``'s fp32 tensors as θ (the caller lets go of
        them): no second copy of a large model while it is built."""
        self.cfg = cfg
        self.optimizer = optimizer
        self.params = clone_params(init) if copy_init else dict(init)
        self.revision = 0
        self.log: list[UpdateRecord] = []
        self.speeds: list[float | None] = [None] * cfg.n_workers
        self.speed_pool: deque[float] = deque(maxlen=cfg.dylu_window or 4 * cfg.n_workers)
        self._next_round = [0] * cfg.n_workers
        self._last_accepted = [-1] * cfg.n_workers
        self._outstanding: dict[int, _Outstanding] = {}
        self._last_dispatch: dict[int, tuple[int, int]] = {}  # overlapped: (revision, steps)
        self._pending: list[tuple[RoundResult, int]] = []
        self._evicted: set[int] = set()
        # streaming (heloco.streaming): the partition, each fragment's outer-update count,
        # each worker's anchor per fragment, and the fragment of each worker's last accepted
        # push (its next dispatch carries that fragment only; anything else gets a full one)
        p = cfg.fragments
        shapes = {k: tuple(v.shape) for k, v in self.params.items()}
        self.fragments: list[list[str]] = fragments_of(shapes, p) if p else []
        self._fragment_updates = [0] * p
        self._anchors: dict[int, list[Anchor]] = {}
        self._answer: dict[int, int] = {}
        # Called before θ is written in place: a transport that sends θ without a copy
        # replaces the tensors still being sent (:meth:`unshare`) first.
        self.before_write: Callable[[], None] | None = None

    # -- dispatch ---------------------------------------------------------------------------
    def observe_speed(self, worker: int, steps_per_second: float) -> None:
        """Record a worker's measured speed (inner steps per second) for DyLU: its latest
        speed, and one entry of the pool of recent speeds."""
        self._check_worker(worker)
        if not steps_per_second > 0:
            raise ValueError(f"speed must be > 0, got {steps_per_second}")
        self.speeds[worker] = float(steps_per_second)
        self.speed_pool.append(float(steps_per_second))

    def reference_speed(self) -> float | None:
        """DyLU's v_ref in steps per second: the fastest latest speed, or the configured
        quantile of the recent-speed pool; None while no speed is known."""
        if self.cfg.dylu_reference == "quantile":
            return quantile_speed(self.speed_pool, self.cfg.dylu_quantile)
        known = [v for v in self.speeds if v is not None]
        return max(known) if known else None

    def steps_for(self, worker: int) -> int:
        """Local steps the worker's next round gets (H, or DyLU's H_w)."""
        if not self.cfg.dylu:
            return self.cfg.inner_steps
        return dylu_steps(self.speeds, worker, self.cfg.inner_steps, self.reference_speed())

    def dispatch(self, worker: int, copy: bool = True) -> Dispatch:
        """Hand ``worker`` its start point; supersedes any earlier outstanding round of it.

        ``copy=False`` hands out θ's own tensors when θ is the dispatch point (no look-ahead):
        the caller reads them before the next update, or has them unshared (:meth:`unshare`) first.
        """
        self._check_worker(worker)
        round_id = self._next_round[worker]
        self._next_round[worker] += 1
        steps = self.steps_for(worker)
        if self.fragments:
            return self._stream_dispatch(worker, round_id, steps, copy)
        prev = self._last_dispatch.get(worker) if self.cfg.overlapped else None
        self._outstanding[worker] = _Outstanding(
            round_id,
            self.revision,
            steps,
            None if prev is None else prev[0],
            None if prev is None else prev[1],
        )
        if self.cfg.overlapped:
            self._last_dispatch[worker] = (self.revision, steps)
        self._evicted.discard(worker)
        if copy or not self.optimizer.dispatches_params():
            params = self.optimizer.dispatch_params(self.params)
        else:
            params = dict(self.params)
        return Dispatch(params, self.revision, steps, round_id, worker)

    def _stream_dispatch(self, worker: int, round_id: int, steps: int, copy: bool) -> Dispatch:
        """Streaming: a sub-round of max(1, ⌊H_w/P⌋) steps whose push carries fragment
        (round_id + 1) mod P; the fragment of the worker's last accepted push if it has one
        (that anchor moves here), else every tensor (every anchor moves here)."""
        p = len(self.fragments)
        steps = max(1, steps // p)
        fragment = fragment_for_round(round_id, p)
        prev = self._last_dispatch.get(worker)
        self._outstanding[worker] = _Outstanding(
            round_id,
            self.revision,
            steps,
            None,
            None if prev is None else prev[1],
            fragment,
        )
        self._last_dispatch[worker] = (self.revision, steps)
        self._evicted.discard(worker)
        answered = self._answer.pop(worker, None)
        anchors = self._anchors.get(worker)
        if answered is not None and anchors is not None:
            names = self.fragments[answered]
            anchors[answered] = Anchor(self.revision, self._fragment_updates[answered])
        else:
            names = list(self.params)
            self._anchors[worker] = [Anchor(self.revision, u) for u in self._fragment_updates]
        view = {n: self.params[n] for n in names}
        if copy or not self.optimizer.dispatches_params():
            params = self.optimizer.dispatch_params(view)
        else:
            params = view
        return Dispatch(params, self.revision, steps, round_id, worker, fragment)

    def restart(self, worker: int) -> None:
        """A new process serves ``worker`` (streaming): it holds no fragments, so its next
        dispatch carries every tensor. Nothing else changes."""
        self._check_worker(worker)
        self._answer.pop(worker, None)
        self._anchors.pop(worker, None)

    def unshare(self, names: Iterable[str]) -> None:
        """Give the parameters ``names`` fresh storage (a copy) before θ is next written, so a
        dispatch still holding the old tensors (being sent) keeps the values it was given."""
        for name in names:
            self.params[name] = self.params[name].clone()

    def dispatched_steps(self, worker: int) -> int | None:
        """Steps of ``worker``'s outstanding round (None: it has none), to bound a push's claim."""
        out = self._outstanding.get(worker)
        if out is None:
            return None
        return out.steps if out.prev_steps is None else max(out.steps, out.prev_steps)

    # -- submission -------------------------------------------------------------------------
    def check(self, result: RoundResult, validated: bool = False) -> RejectReason | None:
        """Why ``result`` would be rejected, or None if :meth:`submit` would accept it.

        ``validated``: the caller has checked the delta's names, shapes and finiteness."""
        w = result.worker
        if not 0 <= w < self.cfg.n_workers:
            return "bad_worker"
        out = self._outstanding.get(w)
        rid = result.round_id
        if rid is not None and rid <= self._last_accepted[w]:
            return "duplicate"
        if out is None:
            return "evicted" if w in self._evicted else "unknown"
        if rid is not None and rid != out.round_id:
            return "superseded" if rid < out.round_id else "unknown"
        if self.fragments:
            return self._check_fragment(result, out, validated)
        if result.fragment is not None:
            return "bad_fragment"
        if result.base_revision not in (out.revision, out.prev_revision):
            return "revision_mismatch"
        if not validated and not _valid_delta(self.params, result.delta):
            return "bad_delta"
        return None

    def _check_fragment(
        self, result: RoundResult, out: _Outstanding, validated: bool
    ) -> RejectReason | None:
        """Streaming: the push carries the fragment its dispatch named, based on the
        revision of that fragment's anchor, with exactly the fragment's tensors."""
        f = result.fragment
        if f is None or f != out.fragment:
            return "bad_fragment"
        anchors = self._anchors.get(result.worker)
        if anchors is None or result.base_revision != anchors[f].revision:
            return "revision_mismatch"
        if not validated and not _valid_delta(self.fragment_params(f), result.delta):
            return "bad_delta"
        return None

    def fragment_params(self, fragment: int) -> Params:
        """θ's tensors of one fragment (the live tensors, in the model's order)."""
        return {n: self.params[n] for n in self.fragments[fragment]}

    def submit(self, result: RoundResult, validated: bool = False) -> UpdateRecord | None:
        """Accept one round. Returns the update it caused, or None while buffered (sync/grace).

        Raises :class:`SubmissionRejected` for a replayed, superseded or unknown round, or a
        pseudo-gradient with the wrong tensors or a non-finite entry (the round stays
        outstanding; the driver re-dispatches the worker). ``validated`` as in :meth:`check`.
        """
        reason = self.check(result, validated)
        if reason is not None:
            raise SubmissionRejected(reason, result.worker, result.round_id)
        return self.accept(result)

    def accept(self, result: RoundResult) -> UpdateRecord | None:
        """Accept a round that :meth:`check` has just passed (nothing submitted, dispatched or
        evicted since): :meth:`submit` without checking again. A transport that checks the
        revision log before it decodes a push's tensors calls this, so a push is checked once.
        """
        out = self._outstanding.pop(result.worker)
        self._last_accepted[result.worker] = out.round_id
        if self.fragments and result.fragment is not None:
            self._answer[result.worker] = result.fragment
        self._pending.append((result, out.round_id))
        if self.cfg.synchronous:
            return self._apply(self._take_pending()) if self._barrier_full() else None
        if self.cfg.quorum > 0:
            if self.cfg.grace_window > 0 or not self.quorum_met():
                return None
            return self._merge()
        if self.cfg.grace_window > 0:
            return None
        return self._apply(self._take_pending())

    def quorum_met(self) -> bool:
        """Buffered rounds come from at least ``quorum`` distinct workers (quorum mode)."""
        return len({r.worker for r, _ in self._pending}) >= self.cfg.quorum

    @property
    def holds_workers(self) -> bool:
        """Whether a worker with a buffered round waits for the window or barrier before its
        next dispatch (sync, grace); in quorum mode it is dispatched again at once."""
        return self.cfg.synchronous or self.cfg.quorum == 0

    def window_ready(self) -> bool:
        """Whether the clock driver should open the grace window now: at the first buffered
        round, or in quorum mode once the quorum is met."""
        return bool(self._pending) and (self.cfg.quorum == 0 or self.quorum_met())

    def _merge(self) -> UpdateRecord:
        """Every buffered round as one token-weighted outer step (module docstring)."""
        items = self._take_pending()
        total = sum(r.tokens for r, _ in items)
        n = len(items)
        weights = [n * r.tokens / total if total > 0 else 1.0 for r, _ in items]
        return self._apply(items, weights)

    def evict(self, worker: int) -> UpdateRecord | None:
        """Cancel ``worker``'s outstanding round and drop it from the sync barrier.

        A later push of the cancelled round is rejected (``evicted``); the worker rejoins the
        barrier when it is next dispatched. A round it already submitted stays in the barrier.
        Returns the update when the shrunken barrier is now complete (sync only), else None.
        """
        self._check_worker(worker)
        self._outstanding.pop(worker, None)
        self._last_dispatch.pop(worker, None)  # its next round starts afresh
        self._answer.pop(worker, None)  # streaming: from a full dispatch
        self._anchors.pop(worker, None)
        self._evicted.add(worker)
        if self.cfg.synchronous and self._pending and self._barrier_full():
            return self._apply(self._take_pending())
        return None

    @property
    def evicted_workers(self) -> list[int]:
        """Workers evicted and not dispatched since (outside the sync barrier)."""
        return sorted(self._evicted)

    def _barrier_full(self) -> bool:
        """Every worker not evicted has a round waiting in the barrier."""
        waiting = {r.worker for r, _ in self._pending}
        return all(w in waiting or w in self._evicted for w in range(self.cfg.n_workers))

    def flush(self, final: bool = False) -> list[UpdateRecord]:
        """Close a grace window: apply buffered async arrivals one by one in arrival order.

        Each is corrected against the momentum already updated by the previous one (HeLoCo
        Algorithm 2 ordering, spec 1.6). A partial sync barrier is left waiting. In quorum mode:
        one token-weighted merge of them all, or nothing while the quorum is not met (unless
        ``final``: the run's budget is reached and what is buffered is merged as it is).
        """
        if self.cfg.synchronous:
            return []
        if self.cfg.quorum > 0:
            due = self._pending and (final or self.quorum_met())
            return [self._merge()] if due else []
        return [self._apply([item]) for item in self._take_pending()]

    @property
    def pending_workers(self) -> list[int]:
        """Workers whose accepted rounds wait for a barrier or a grace window."""
        return [r.worker for r, _ in self._pending]

    def _take_pending(self) -> list[tuple[RoundResult, int]]:
        items, self._pending = self._pending, []
        return items

    @torch.no_grad()
    def _apply(
        self, items: list[tuple[RoundResult, int]], weights: list[float] | None = None
    ) -> UpdateRecord:
        ws = weights if weights is not None else [1.0] * len(items)
        arrivals = [
            Arrival(r.delta, r.worker, self._staleness(r), w)
            for (r, _), w in zip(items, ws, strict=True)
        ]
        if self.before_write is not None:
            self.before_write()
        fragment = items[0][0].fragment if self.fragments else None
        if fragment is None:
            stats = self.optimizer.step(self.params, arrivals)
        else:  # streaming: one arrival, the outer step on its fragment's tensors only
            stats = self.optimizer.step(self.fragment_params(fragment), arrivals)
            self._fragment_updates[fragment] += 1
        records = tuple(
            ArrivalRecord(
                worker=r.worker,
                round_id=rid,
                base_revision=r.base_revision,
                staleness=a.staleness,
                steps=r.steps,
                tokens=r.tokens,
                train_loss=r.mean_loss,
                fragment=r.fragment if self.fragments else None,
            )
            for (r, rid), a in zip(items, arrivals, strict=True)
        )
        self.revision += 1
        record = UpdateRecord(self.revision, records, stats)
        self.log.append(record)
        return record

    def _staleness(self, r: RoundResult) -> int:
        """τ of an arrival: revisions since its base; streaming: updates of its fragment since
        the worker's anchor of it (heloco.streaming, "Base and staleness")."""
        if not self.fragments or r.fragment is None:
            return self.revision - r.base_revision
        anchor = self._anchors[r.worker][r.fragment]
        return self._fragment_updates[r.fragment] - anchor.updates

    def _check_worker(self, worker: int) -> None:
        if not 0 <= worker < self.cfg.n_workers:
            raise ValueError(f"worker {worker} out of range [0, {self.cfg.n_workers})")

    # -- checkpoint -------------------------------------------------------------------------
    def state_dict(self, copy: bool = True) -> ServerState:
        """θ, optimizer state and buffered deltas as tensors; everything else JSON-able.

        ``copy=False``: θ and the optimizer state are the live tensors (to be written out
        before the next update, as a checkpoint is), not a second copy of the model."""
        opt = self.optimizer.state_dict(copy)
        tensors: Params = {f"params/{k}": v.clone() if copy else v for k, v in self.params.items()}
        tensors.update({f"optimizer/{k}": v for k, v in opt.tensors.items()})
        pending = []
        for i, (r, rid) in enumerate(self._pending):
            tensors.update({f"pending/{i}/{k}": v.clone() for k, v in r.delta.items()})
            pending.append(
                {
                    "worker": r.worker,
                    "steps": r.steps,
                    "tokens": r.tokens,
                    "mean_loss": _json_float(r.mean_loss),
                    "base_revision": r.base_revision,
                    "round_id": rid,
                }
            )
        meta = {
            "config": self.cfg.model_dump(),
            "revision": self.revision,
            "optimizer": opt.meta,
            "speeds": self.speeds,
            "speed_pool": list(self.speed_pool),
            "next_round": self._next_round,
            "last_accepted": self._last_accepted,
            "outstanding": {str(w): asdict(o) for w, o in self._outstanding.items()},
            "evicted": sorted(self._evicted),
            "last_dispatch": {str(w): list(v) for w, v in self._last_dispatch.items()},
            "pending": pending,
            "log": [_record_to_json(r) for r in self.log],
        }
        if self.fragments:
            meta["streaming"] = {
                "updates": list(self._fragment_updates),
                "anchors": {
                    str(w): [[a.revision, a.updates] for a in anchors]
                    for w, anchors in self._anchors.items()
                },
                "answer": {str(w): f for w, f in self._answer.items()},
            }
        return ServerState(tensors, meta)

    def load_state_dict(self, state: ServerState) -> None:
        """Restore :meth:`state_dict` output into a server built with the same config."""
        meta, tensors = state.meta, state.tensors
        if meta["config"]["n_workers"] != self.cfg.n_workers:
            raise ValueError("checkpoint was written for a different number of workers")
        if self.before_write is not None:
            self.before_write()
        with torch.no_grad():
            for k, v in self.params.items():
                v.copy_(tensors[f"params/{k}"])
        opt_tensors = {
            k.removeprefix("optimizer/"): v
            for k, v in tensors.items()
            if k.startswith("optimizer/")
        }
        self.optimizer.load_state_dict(OptimizerState(opt_tensors, meta["optimizer"]))
        self.revision = int(meta["revision"])
        self.speeds = [None if s is None else float(s) for s in meta["speeds"]]
        self.speed_pool.clear()
        self.speed_pool.extend(float(s) for s in meta.get("speed_pool", []))
        self._next_round = [int(x) for x in meta["next_round"]]
        self._last_accepted = [int(x) for x in meta["last_accepted"]]
        self._outstanding = {int(w): _Outstanding(**o) for w, o in meta["outstanding"].items()}
        self._evicted = {int(w) for w in meta.get("evicted", [])}
        self._last_dispatch = {
            int(w): (int(v[0]), int(v[1])) for w, v in meta.get("last_dispatch", {}).items()
        }
        self._pending = []
        for i, p in enumerate(meta["pending"]):
            delta = {k: tensors[f"pending/{i}/{k}"].clone() for k in self.params}
            result = RoundResult(
                worker=p["worker"],
                delta=delta,
                steps=p["steps"],
                tokens=p["tokens"],
                mean_loss=_float(p["mean_loss"]),
                base_revision=p["base_revision"],
                round_id=p["round_id"],
            )
            self._pending.append((result, int(p["round_id"])))
        self.log = [_record_from_json(r) for r in meta["log"]]
        stream = meta.get("streaming")
        if self.fragments and stream is not None:
            self._fragment_updates = [int(u) for u in stream["updates"]]
            self._anchors = {
                int(w): [Anchor(int(a[0]), int(a[1])) for a in anchors]
                for w, anchors in stream["anchors"].items()
            }
            self._answer = {int(w): int(f) for w, f in stream["answer"].items()}


def _valid_delta(params: Params, delta: Delta) -> bool:
    """Same names and shapes as the model and every entry finite (one foreach-norm pass; a
    mapping that decodes on read is checked one tensor at a time)."""
    if delta.keys() != params.keys():
        return False
    if not isinstance(delta, dict):
        return all(_finite_block(delta[k], v.shape) for k, v in params.items())
    if any(delta[k].shape != v.shape for k, v in params.items()):
        return False
    norms = torch._foreach_norm([delta[k] for k in params])
    return bool(torch.isfinite(torch.stack(norms)).all())


def _finite_block(d: torch.Tensor, shape: torch.Size) -> bool:
    return d.shape == shape and bool(torch.isfinite(torch._foreach_norm([d])[0]))


def _json_float(x: float) -> float | None:
    return None if math.isnan(x) else x


def _float(x: float | None) -> float:
    return math.nan if x is None else float(x)


def _record_to_json(r: UpdateRecord) -> dict[str, Any]:
    stats = {k: _json_float(v) for k, v in asdict(r.stats).items()}
    arrivals = [_arrival_to_json(a) for a in r.arrivals]
    return {"revision": r.revision, "arrivals": arrivals, "stats": stats}


def _arrival_to_json(a: ArrivalRecord) -> dict[str, Any]:
    out = {**asdict(a), "train_loss": _json_float(a.train_loss)}
    if out["fragment"] is None:  # whole-model rounds: the record as before streaming
        del out["fragment"]
    return out


def _record_from_json(d: dict[str, Any]) -> UpdateRecord:
    arrivals = tuple(
        ArrivalRecord(**{**a, "train_loss": _float(a["train_loss"])}) for a in d["arrivals"]
    )
    stats = StepStats(**{k: _float(v) for k, v in d["stats"].items()})
    return UpdateRecord(int(d["revision"]), arrivals, stats)
