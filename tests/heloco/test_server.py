"""Server state machine: revisions, staleness, exactly-once, DyLU, grace, sync, checkpoint."""

from __future__ import annotations

import json

import pytest
import safetensors.torch
import torch

from heloco.outer import OuterConfig, build_optimizer
from heloco.server import Server, ServerConfig, SubmissionRejected, dylu_steps
from heloco.types import Params, RoundResult


def make(method: str = "heloco", k: int = 3, **cfg: object) -> Server:
    init = {"w": torch.zeros(2, 3), "b": torch.zeros(3)}
    opt = build_optimizer(method, init, OuterConfig(), k)
    return Server(init, opt, ServerConfig(n_workers=k, inner_steps=8, **cfg))


def delta(scale: float) -> Params:
    return {"w": torch.full((2, 3), scale), "b": torch.full((3,), -scale)}


def result(server: Server, worker: int, scale: float = 1.0, **kw: object) -> RoundResult:
    d = server.dispatch(worker)
    fields = {
        "worker": worker,
        "delta": delta(scale),
        "steps": d.steps,
        "tokens": 10 * d.steps,
        "mean_loss": 1.0,
        "base_revision": d.revision,
        "round_id": d.round_id,
    }
    fields.update(kw)
    return RoundResult(**fields)  # type: ignore[arg-type]


def test_revision_counts_updates_and_staleness_is_measured() -> None:
    s = make()
    r0, r1, r2 = (result(s, w) for w in range(3))
    assert [r.base_revision for r in (r0, r1, r2)] == [0, 0, 0]
    recs = [s.submit(r) for r in (r1, r0)]
    assert [r.revision for r in recs if r] == [1, 2]
    assert [r.arrivals[0].staleness for r in recs if r] == [0, 1]
    r1b = result(s, 1)  # re-dispatched at revision 2
    assert r1b.base_revision == 2
    rec = s.submit(r2)
    assert rec is not None and rec.arrivals[0].staleness == 2
    rec = s.submit(r1b)
    assert rec is not None and rec.arrivals[0].staleness == 1
    assert s.revision == len(s.log) == 4
    assert not torch.equal(s.params["w"], torch.zeros(2, 3))


def test_duplicates_and_replays_are_rejected() -> None:
    s = make()
    r = result(s, 0)
    s.submit(r)
    with pytest.raises(SubmissionRejected) as exc:
        s.submit(r)
    assert exc.value.reason == "duplicate"
    assert s.check(r) == "duplicate" and s.revision == 1
    old = result(s, 1)
    new = result(s, 1)  # a second dispatch supersedes the first
    assert s.check(old) == "superseded"
    assert s.check(RoundResult(5, delta(1), 1, 1, 1.0, 0, 0)) == "bad_worker"
    assert s.check(RoundResult(2, delta(1), 1, 1, 1.0, 0, 0)) == "unknown"  # never dispatched
    assert s.check(RoundResult(1, delta(1), 1, 1, 1.0, 0, new.round_id)) == "revision_mismatch"
    s.submit(new)
    assert s.revision == 2


def test_bad_deltas_are_rejected_before_touching_the_model() -> None:
    s = make()
    d = s.dispatch(0)
    nan = delta(1.0)
    nan["b"][1] = float("nan")
    for bad in (nan, {"w": torch.zeros(2, 3)}, {"w": torch.zeros(3, 2), "b": torch.zeros(3)}):
        r = RoundResult(0, bad, 1, 1, 1.0, d.revision, d.round_id)
        with pytest.raises(SubmissionRejected) as exc:
            s.submit(r)
        assert exc.value.reason == "bad_delta"
    assert s.revision == 0 and torch.equal(s.params["b"], torch.zeros(3))
    assert s.submit(RoundResult(0, delta(1.0), 1, 1, 1.0, d.revision, d.round_id)) is not None


def test_round_id_may_be_omitted_for_the_outstanding_round() -> None:
    s = make()
    r = result(s, 0, round_id=None)
    assert s.submit(r) is not None
    assert s.check(r) == "unknown"  # no outstanding round any more


def test_sync_barrier_applies_one_averaged_step() -> None:
    s = make("sync", k=3, synchronous=True)
    rs = [result(s, w, scale=float(w + 1)) for w in range(3)]
    assert s.submit(rs[0]) is None and s.submit(rs[1]) is None
    assert s.pending_workers == [0, 1]
    rec = s.submit(rs[2])
    assert rec is not None and s.revision == 1
    assert [a.worker for a in rec.arrivals] == [0, 1, 2]
    assert all(a.staleness == 0 for a in rec.arrivals)
    # mean Δ = 2 (w) and −2 (b); first Nesterov step: θ = −lr(1+μ)·mean = −0.7·1.9·2
    torch.testing.assert_close(s.params["w"], torch.full((2, 3), -0.7 * 1.9 * 2.0))


def test_evict_shrinks_the_sync_barrier_until_the_worker_is_dispatched_again() -> None:
    s = make("sync", k=3, synchronous=True)
    rs = [result(s, w) for w in range(3)]
    assert s.evict(1) is None  # nothing has arrived yet: the barrier of {0, 2} is still open
    assert s.submit(rs[0]) is None
    rec = s.submit(rs[2])
    assert rec is not None and [a.worker for a in rec.arrivals] == [0, 2]
    assert s.check(rs[1]) == "evicted" and s.evicted_workers == [1]
    with pytest.raises(SubmissionRejected):
        s.submit(rs[1])
    # Evicting the last missing worker applies the barrier of those that arrived.
    r0, r2 = result(s, 0), result(s, 2)
    assert s.submit(r0) is None
    rec = s.evict(2)
    assert rec is not None and [a.worker for a in rec.arrivals] == [0] and s.revision == 2
    assert s.check(r2) == "evicted"
    twin = make("sync", k=3, synchronous=True)
    twin.load_state_dict(s.state_dict())  # evictions survive a checkpoint
    assert twin.evicted_workers == [1, 2] and twin.check(r2) == "evicted"
    # A new dispatch puts a worker back into the barrier.
    r0, r1 = result(s, 0), result(s, 1)
    assert s.evicted_workers == [2]
    assert s.submit(r0) is None
    rec = s.submit(r1)
    assert rec is not None and [a.worker for a in rec.arrivals] == [0, 1]
    rs = [result(s, w) for w in range(3)]
    assert s.evicted_workers == []
    assert s.submit(rs[0]) is None and s.submit(rs[1]) is None
    assert s.submit(rs[2]) is not None and s.revision == 4


def test_evict_keeps_a_submitted_round_and_cancels_async_rounds() -> None:
    s = make("sync", k=2, synchronous=True)
    r0, r1 = result(s, 0), result(s, 1)
    assert s.submit(r0) is None
    assert s.evict(0) is None and s.pending_workers == [0]  # still waiting for worker 1
    rec = s.submit(r1)
    assert rec is not None and [a.worker for a in rec.arrivals] == [0, 1]
    a = make("heloco", k=2)
    r = result(a, 0)
    assert a.evict(0) is None and a.revision == 0 and a.check(r) == "evicted"


def test_grace_window_buffers_then_applies_sequentially() -> None:
    s = make("heloco", k=3, grace_window=0.5)
    rs = [result(s, w) for w in range(3)]
    assert all(s.submit(r) is None for r in rs)
    recs = s.flush()
    assert [r.revision for r in recs] == [1, 2, 3]
    assert [r.arrivals[0].staleness for r in recs] == [0, 1, 2]
    assert s.flush() == []


def test_dylu_steps_follow_speed() -> None:
    assert dylu_steps([2.0, 1.0, 0.3, None], 0, 20) == 20
    assert dylu_steps([2.0, 1.0, 0.3, None], 1, 20) == 10
    assert dylu_steps([2.0, 1.0, 0.3, None], 2, 20) == 3
    assert dylu_steps([2.0, 1.0, 0.01, None], 2, 20) == 1  # at least one step
    assert dylu_steps([2.0, 1.0, 0.3, None], 3, 20) == 20  # unknown speed: full H
    s = make(dylu=True)
    for w, pace in enumerate([1.0, 2.0, 4.0]):
        s.observe_speed(w, 1.0 / pace)
    assert [s.dispatch(w).steps for w in range(3)] == [8, 4, 2]
    assert make(dylu=False).dispatch(2).steps == 8


def test_diagnostics_per_update() -> None:
    s = make("heloco", k=2)
    s.submit(result(s, 0, scale=1.0))
    rec = s.submit(result(s, 1, scale=-0.5))  # anti-aligned with the momentum: shrink
    assert rec is not None
    assert rec.stats.cos_delta_momentum == pytest.approx(-1.0, abs=1e-5)
    assert rec.stats.frac_shrunk == 1.0 and rec.stats.mean_beta > 0
    assert rec.stats.correction_size > 0
    assert rec.stats.rho == pytest.approx(2**-0.5)


@pytest.mark.parametrize("method", ["heloco+ab", "dn", "sync"])
def test_state_dict_round_trip_through_json(method: str) -> None:
    sync = method == "sync"
    s = make(method, k=2, synchronous=sync, grace_window=0.0 if sync else 1.0)
    for w in (0, 1):
        s.submit(result(s, w, scale=0.3 * (w + 1)))
    s.flush()
    s.submit(result(s, 0, scale=0.7))  # leaves a buffered arrival in the checkpoint
    state = s.state_dict()
    meta = json.loads(json.dumps(state.meta))
    tensors = safetensors.torch.load(safetensors.torch.save(state.tensors))
    twin = make(method, k=2, synchronous=sync, grace_window=0.0 if sync else 1.0)
    twin.load_state_dict(type(state)(tensors, meta))
    assert twin.revision == s.revision and twin.pending_workers == s.pending_workers
    for srv in (s, twin):
        r = result(srv, 1, scale=-0.2)
        srv.submit(r)
        srv.flush()
    assert twin.revision == s.revision
    for k in s.params:
        assert torch.equal(s.params[k], twin.params[k])
    assert [r.revision for r in twin.log] == [r.revision for r in s.log]
    assert twin.check(r) == "duplicate"


@pytest.mark.parametrize("method", ["heloco", "async-nesterov", "dn"])
def test_a_kept_state_dict_does_not_drift_with_later_updates(method: str) -> None:
    """``state_dict()`` (copy=True) is a snapshot: θ and every optimizer tensor (momentum,
    DN's buffer) keep the values they had, however many updates follow."""
    s = make(method, k=2)
    s.submit(result(s, 0, scale=0.5))
    snap = s.state_dict()
    kept = {k: v.clone() for k, v in snap.tensors.items()}
    assert any(k.startswith("optimizer/") for k in kept)
    for w in (1, 0, 1):
        s.submit(result(s, w, scale=0.3 * (w + 1)))
    assert s.revision == 4
    for k, v in kept.items():
        assert torch.equal(snap.tensors[k], v), k
    live = s.state_dict(copy=False).tensors
    assert any(not torch.equal(live[k], v) for k, v in kept.items() if k.startswith("optimizer/"))
