"""In-process tests of the server's message logic and the endpoint's auth/replay/size checks."""

from __future__ import annotations

import ast
from pathlib import Path
from typing import Any

import pytest
import torch
from hypothesis import given, settings
from hypothesis import strategies as st

from heloco.net import wire
from heloco.net.coordinator import Budget, Coordinator, measured_timing
from heloco.net.endpoint import Endpoint, EndpointConfig
from heloco.outer import OuterConfig, build_optimizer
from heloco.server import Server, ServerConfig
from heloco.types import RoundTiming

SECRET = b"coordinator-test-secret-0123456789"


def make_coord(
    method: str = "async-nesterov", workers: int = 2, budget: Budget | None = None, **wiring: Any
) -> Coordinator:
    """A coordinator (``wiring``: the storage and persistence an endpoint builds it with)."""
    init = {"w": torch.zeros(3, 4), "b": torch.zeros(5)}
    opt = build_optimizer(method, init, OuterConfig(), workers)
    server = Server(
        init, opt, ServerConfig(n_workers=workers, inner_steps=3, synchronous=method == "sync")
    )
    return Coordinator(server, budget or Budget(revisions=100), **wiring)


def pull(coord: Coordinator, w: int) -> wire.Message:
    return coord.handle(wire.make("pull", {"worker": w, "incarnation": "a"}))


def push(
    coord: Coordinator,
    w: int,
    d: wire.Message,
    delta: dict[str, torch.Tensor] | None = None,
    codec: str = "fp32",
    extra: dict[str, float] | None = None,
) -> wire.Message:
    body: dict[str, object] = {
        "worker": w,
        "incarnation": "a",
        "round_id": d.body["round_id"],
        "steps": 3,
        "tokens": 30,
        "base_revision": d.body["revision"],
        "mean_loss": 1.0,
        "compute_s": 0.1,
    } | (extra or {})
    delta = (
        delta if delta is not None else {"w": torch.full((3, 4), 0.1), "b": torch.full((5,), 0.1)}
    )
    msg = wire.make("push", body, delta, codec=codec)  # type: ignore[arg-type]
    # Through the wire format, as the endpoint would see it.
    return coord.handle(wire.decode(wire.encode(msg, SECRET), SECRET))


def consistent(coord: Coordinator) -> None:
    """Revision = updates in the log; accepted rounds = rounds in the log + rounds buffered."""
    s = coord.status()
    assert s["revision"] == s["log_length"] == len(coord.server.log)
    assert coord.counters.accepted == s["logged_rounds"] + len(s["pending"])
    rounds = [(a.worker, a.round_id) for r in coord.server.log for a in r.arrivals]
    assert len(rounds) == len(set(rounds))


def test_pull_push_exactly_once_and_duplicates_acknowledged() -> None:
    coord = make_coord()
    d = pull(coord, 0)
    assert d.type == "dispatch" and d.body["revision"] == 0 and set(d.tensors) == {"w", "b"}
    first = push(coord, 0, d)
    assert first.type == "ack" and first.body["revision"] == 1 and not first.body["duplicate"]
    again = push(coord, 0, d)  # a retry after a lost ack: acknowledged, not applied
    assert again.type == "ack" and again.body["duplicate"] and coord.server.revision == 1
    assert coord.counters.duplicate == 1
    consistent(coord)


def test_nonfinite_and_wrong_shape_rejected_never_applied() -> None:
    coord = make_coord()
    d = pull(coord, 0)
    nan = {"w": torch.full((3, 4), float("nan")), "b": torch.zeros(5)}
    for codec in ("fp32", "bf16", "int8"):
        reply = push(coord, 0, d, nan, codec)
        assert reply.type == "error" and reply.body["reason"] == "bad_update"
    inf = {"w": torch.zeros(3, 4), "b": torch.tensor([0, 0, float("inf"), 0, 0])}
    assert push(coord, 0, d, inf).body["reason"] == "bad_update"
    wrong = {"w": torch.zeros(4, 3), "b": torch.zeros(5)}
    assert push(coord, 0, d, wrong).body["reason"] == "bad_update"
    missing = {"w": torch.zeros(3, 4)}
    assert push(coord, 0, d, missing).body["reason"] == "bad_update"
    assert coord.server.revision == 0 and coord.counters.bad_update == 6
    assert push(coord, 0, d).type == "ack"  # the round itself is still good
    consistent(coord)


def test_superseded_round_rejected() -> None:
    coord = make_coord()
    old = pull(coord, 1)
    new = pull(coord, 1)  # a replacement worker pulled again
    assert push(coord, 1, old).body["reason"] == "superseded"
    assert push(coord, 1, new).type == "ack"
    consistent(coord)


def test_sync_barrier_waits_then_applies_once() -> None:
    coord = make_coord("sync", workers=2)
    d0, d1 = pull(coord, 0), pull(coord, 1)
    a0 = push(coord, 0, d0)
    assert a0.type == "ack" and not a0.body["applied"] and coord.server.revision == 0
    assert pull(coord, 0).type == "wait"
    assert push(coord, 1, d1).body["applied"] and coord.server.revision == 1
    assert pull(coord, 0).type == "dispatch"
    consistent(coord)


def test_budget_stops_dispatch_and_rejects_late_pushes() -> None:
    coord = make_coord(budget=Budget(tokens=30))
    d0, d1 = pull(coord, 0), pull(coord, 1)
    assert push(coord, 0, d0).type == "ack"
    assert coord.done and pull(coord, 0).type == "done"
    late = push(coord, 1, d1)
    assert late.type == "rejected" and late.body["reason"] == "done"
    consistent(coord)


def test_eviction_and_rejoin() -> None:
    now = [100.0]
    coord = make_coord()
    coord.clock = lambda: now[0]
    coord.evict_after_s = 5.0
    coord.handle(wire.make("hello", {"worker": 0, "incarnation": "x"}))
    now[0] += 6
    assert coord.evict_silent() == [0] and coord.active_workers() == []
    coord.handle(wire.make("hello", {"worker": 0, "incarnation": "y"}))
    assert coord.active_workers() == [0] and coord.counters.rejoins == 1


def test_sync_eviction_shrinks_the_barrier_and_a_late_push_is_rejected() -> None:
    now = [100.0]
    coord = make_coord("sync", workers=3)
    coord.clock = lambda: now[0]
    coord.evict_after_s = 5.0
    updates: list[int] = []
    coord.on_update = lambda e: updates.append(len(e.record.arrivals))
    ds = [pull(coord, w) for w in range(3)]
    assert push(coord, 0, ds[0]).body["applied"] is False
    assert push(coord, 2, ds[2]).body["applied"] is False
    assert pull(coord, 0).type == "wait"  # the barrier waits for worker 1
    now[0] += 3
    coord.handle(wire.make("heartbeat", {"worker": 0, "incarnation": "a"}))
    coord.handle(wire.make("heartbeat", {"worker": 2, "incarnation": "a"}))
    now[0] += 3  # worker 1 silent for 6 s
    assert coord.evict_silent() == [1]
    assert updates == [2] and coord.server.revision == 1  # the barrier of {0, 2} was applied
    late = push(coord, 1, ds[1])
    assert late.type == "rejected" and late.body["reason"] == "evicted"
    # Worker 1 comes back: its next pull puts it into the barrier again.
    ds = [pull(coord, w) for w in range(3)]
    assert all(d.type == "dispatch" and d.body["revision"] == 1 for d in ds)
    assert [push(coord, w, ds[w]).body["applied"] for w in range(3)] == [False, False, True]
    assert updates == [2, 3]
    consistent(coord)


def test_endpoint_drops_bad_mac_and_replays(tmp_path: Path) -> None:
    ep = Endpoint(make_coord, SECRET, EndpointConfig(checkpoint_dir=tmp_path, max_bytes=10_000))
    coord = ep.coord
    msg = wire.make("status")
    frames = wire.encode(msg, SECRET)
    assert ep.handle_frames(list(frames)) is not None
    assert ep.handle_frames(list(frames)) is None and coord.counters.replay == 1
    assert ep.handle_frames(wire.encode(wire.make("status"), b"wrong-secret-0123456789")) is None
    assert coord.counters.bad_mac == 1
    big = wire.make("push", {"worker": 0}, {"w": torch.zeros(3000)})
    reply = ep.handle_frames(wire.encode(big, SECRET))
    assert reply is not None and reply.body["reason"] == "too_large" and reply.re == big.id
    old = wire.Message("status", id=wire.new_id(), ts=msg.ts - 10_000)
    assert ep.handle_frames(wire.encode(old, SECRET)) is None and coord.counters.stale == 1


def drop_each_kind(ep: Endpoint) -> None:
    """One message of every kind the listener drops before the coordinator sees it."""
    msg = wire.make("status")
    frames = wire.encode(msg, SECRET)
    assert ep.handle_frames(list(frames)) is not None
    assert ep.handle_frames(list(frames)) is None  # replay
    assert ep.handle_frames(wire.encode(wire.make("status"), b"wrong-secret-0123456789")) is None
    big = wire.make("push", {"worker": 0}, {"w": torch.zeros(3000)})
    assert ep.handle_frames(wire.encode(big, SECRET)) is not None  # too_large: an error reply
    old = wire.Message("status", id=wire.new_id(), ts=msg.ts - 10_000)
    assert ep.handle_frames(wire.encode(old, SECRET)) is None  # stale
    assert ep.handle_frames([b"not a header"]) is None  # malformed


DROPS = ("bad_mac", "replay", "stale", "too_large", "malformed")


def test_restarted_server_still_counts_every_drop(tmp_path: Path) -> None:
    """After a restore, drops are counted where ``status`` and the ``net`` event read them,
    on top of the counts the checkpoint holds."""
    first = Endpoint(make_coord, SECRET, EndpointConfig(checkpoint_dir=tmp_path, max_bytes=10_000))
    push(first.coord, 0, pull(first.coord, 0))
    drop_each_kind(first)
    before = first.coord.status()["counters"]
    assert all(before[k] == 1 for k in DROPS)
    assert first.save_checkpoint() is not None
    ep = Endpoint(make_coord, SECRET, EndpointConfig(checkpoint_dir=tmp_path, max_bytes=10_000))
    assert ep.restore()
    assert ep.coord.status()["counters"] == before
    drop_each_kind(ep)
    after = ep.coord.status()["counters"]
    assert {k: after[k] for k in DROPS} == {k: 2 for k in DROPS}
    assert ep.listeners[0].counters is ep.coord.counters


def test_the_endpoint_builds_a_complete_coordinator(tmp_path: Path) -> None:
    """The endpoint hands its coordinator the storage (always) and the persistence (durable
    only) at construction, and zero-copy dispatch follows from the storage."""
    plain = Endpoint(make_coord, SECRET, EndpointConfig())
    assert plain.coord.storage is plain and plain.coord.persistence is None
    durable = Endpoint(make_coord, SECRET, EndpointConfig(checkpoint_dir=tmp_path, durable=True))
    assert durable.coord.storage is durable and durable.coord.persistence is durable
    for coord, shares in ((plain.coord, True), (make_coord(), False)):
        sent = pull(coord, 0).tensors["w"]
        coord.server.params["w"].add_(1.0)  # a write behind the transport's back
        assert (
            bytes(sent.data)
            == (torch.ones(3, 4) if shares else torch.zeros(3, 4)).numpy().tobytes()
        )


def test_nothing_outside_the_coordinator_sets_its_attributes() -> None:
    """A coordinator is complete when built: no module assigns ``coord.<name>`` (or
    ``self.coord.<name>``) outside :mod:`heloco.net.coordinator`."""
    src = Path(__file__).resolve().parents[2] / "src" / "heloco"
    found = []
    for path in src.rglob("*.py"):
        if path.name == "coordinator.py":
            continue
        for node in ast.walk(ast.parse(path.read_text(encoding="utf-8"))):
            targets = node.targets if isinstance(node, ast.Assign) else []
            if isinstance(node, ast.AugAssign | ast.AnnAssign):
                targets = [node.target]
            for t in targets:
                owner = t.value if isinstance(t, ast.Attribute) else None
                named = isinstance(owner, ast.Name) and owner.id == "coord"
                if named or (isinstance(owner, ast.Attribute) and owner.attr == "coord"):
                    found.append(f"{path.name}:{node.lineno}")
    assert not found, f"attributes of a coordinator set from outside: {found}"


def test_endpoint_checkpoint_restore_roundtrip(tmp_path: Path) -> None:
    ep = Endpoint(make_coord, SECRET, EndpointConfig(checkpoint_dir=tmp_path))
    coord = ep.coord
    for _ in range(3):
        d = pull(coord, 0)
        push(coord, 0, d)
    ep.save_checkpoint()
    ep2 = Endpoint(make_coord, SECRET, EndpointConfig(checkpoint_dir=tmp_path))
    fresh = ep2.coord
    assert ep2.restore()
    assert fresh.server.revision == 3 and fresh.counters.accepted == 3 and fresh.tokens == 90
    assert torch.equal(fresh.server.params["w"], coord.server.params["w"])
    # The restored revision log still recognises the last accepted round as a duplicate.
    assert push(fresh, 0, d).body["duplicate"]
    consistent(fresh)


def test_older_process_is_fenced_newer_takes_over() -> None:
    coord = make_coord()
    assert coord.handle(wire.make("hello", {"worker": 0, "incarnation": "0002"})).type == "welcome"
    stale = coord.handle(wire.make("pull", {"worker": 0, "incarnation": "0001"}))
    assert stale.type == "error" and stale.body["reason"] == "replaced"
    newer = coord.handle(wire.make("pull", {"worker": 0, "incarnation": "0003"}))
    assert newer.type == "dispatch" and coord.workers[0].incarnation == "0003"
    assert coord.counters.fenced == 1 and coord.counters.rejoins == 1


_value = st.none() | st.booleans() | st.integers(-3, 3) | st.floats() | st.text(max_size=3)


@settings(max_examples=120, deadline=None)
@given(
    kind=st.sampled_from(["hello", "pull", "push", "heartbeat", "bye", "status", "nope"]),
    body=st.dictionaries(
        st.sampled_from(
            [
                "worker",
                "incarnation",
                "round_id",
                "base_revision",
                "steps",
                "tokens",
                "mean_loss",
                "compute_s",
            ]
        ),
        _value,
    ),
)
def test_any_authenticated_request_gets_a_reply_and_keeps_state_consistent(
    kind: str, body: dict[str, object]
) -> None:
    coord = make_coord()
    reply = coord.handle(wire.make(kind, body, {"w": torch.zeros(3, 4), "b": torch.zeros(5)}))
    assert isinstance(reply, wire.Message) and reply.type
    consistent(coord)


@pytest.mark.parametrize("compute_s", [float("inf"), float("nan"), -1.0, 0.0, "x", 10**400])
def test_bad_compute_time_is_refused_and_the_round_stays_good(compute_s: object) -> None:
    coord = make_coord()
    d = pull(coord, 0)
    body = {
        "worker": 0,
        "incarnation": "a",
        "round_id": d.body["round_id"],
        "steps": 3,
        "tokens": 30,
        "base_revision": 0,
        "compute_s": compute_s,
    }
    delta = {"w": torch.zeros(3, 4), "b": torch.zeros(5)}
    reply = coord.handle(wire.make("push", body, delta))
    assert reply.type == "error" and reply.body["reason"] == "malformed"
    assert "compute_s" in reply.body["detail"]
    assert coord.server.speeds[0] is None and coord.server.revision == 0
    ok = coord.handle(wire.make("push", body | {"compute_s": None}, delta))
    assert ok.type == "ack" and coord.server.speeds[0] is None
    consistent(coord)


def test_a_push_checks_the_revision_log_once(monkeypatch: pytest.MonkeyPatch) -> None:
    coord = make_coord()
    calls: list[int] = []
    check = coord.server.check

    def counted(*args: object, **kwargs: object) -> object:
        calls.append(1)
        return check(*args, **kwargs)  # type: ignore[arg-type]

    monkeypatch.setattr(coord.server, "check", counted)
    ack = push(coord, 0, pull(coord, 0))
    assert ack.type == "ack" and ack.body["applied"] and len(calls) == 1
    replayed = push(coord, 1, pull(coord, 1))
    assert replayed.type == "ack" and len(calls) == 2


def test_buffered_arrivals_of_a_checkpoint_get_a_new_grace_window(tmp_path: Path) -> None:
    now = [1000.0]

    def graced(**wiring: Any) -> Coordinator:
        init = {"w": torch.zeros(3, 4), "b": torch.zeros(5)}
        opt = build_optimizer("async-nesterov", init, OuterConfig(), 2)
        cfg = ServerConfig(n_workers=2, inner_steps=3, grace_window=5.0)
        server = Server(init, opt, cfg)
        return Coordinator(server, Budget(revisions=100), clock=lambda: now[0], t0=now[0], **wiring)

    first = Endpoint(graced, SECRET, EndpointConfig(checkpoint_dir=tmp_path))
    ack = push(first.coord, 0, pull(first.coord, 0))
    assert ack.type == "ack" and not ack.body["applied"] and first.coord.server.pending_workers
    assert first.save_checkpoint() is not None
    ep = Endpoint(graced, SECRET, EndpointConfig(checkpoint_dir=tmp_path))
    assert ep.restore() and ep.coord.server.pending_workers == [0]
    assert ep.coord.flush_due() == []  # the new window is open
    now[0] += 6.0
    assert [e.record.revision for e in ep.coord.flush_due()] == [1]
    assert ep.coord.server.pending_workers == []


def test_a_push_with_timing_places_receive_compute_send_on_the_run_clock() -> None:
    now = [100.0]
    coord = make_coord()
    coord.clock, coord.t0 = (lambda: now[0]), 100.0
    seen: list[tuple[float, float, RoundTiming | None]] = []
    coord.on_round = lambda *a: seen.append((a[5], a[6], a[7]))
    now[0] = 110.0
    d = pull(coord, 0)  # dispatched at 10 s
    now[0] = 113.0  # the push is in at 13 s: receive 0.5 s, compute 1.2 s, push began at 2 s
    body = {"recv_s": 0.5, "lead_s": 2.0, "compute_s": 1.2}
    assert push(coord, 0, d, extra=body).type == "ack"
    start, end, t = seen[-1]
    assert (start, end) == (10.0, 13.0) and t is not None
    assert (t.recv_start, t.recv_end) == (10.0, 10.5)
    assert (t.compute_start, t.compute_end) == pytest.approx((10.8, 12.0))
    assert (t.send_start, t.send_end) == (12.0, 13.0)
    assert t.bytes_received == t.bytes_sent == 17 * 4  # θ and Δ: 17 fp32 values each
    d = pull(coord, 0)
    push(coord, 0, d, codec="int8")  # no timing from the worker: none recorded
    assert seen[-1][2] is None


def test_measured_timing_keeps_every_segment_inside_the_round_and_in_order() -> None:
    # A worker clock that ran ahead of the server's: offsets past the round are clamped.
    t = measured_timing(5.0, 6.0, recv_s=2.0, lead_s=3.0, compute_s=0.5, bytes_received=8,
                        bytes_sent=None)  # fmt: skip
    assert (t.recv_start, t.recv_end, t.compute_start, t.compute_end) == (5.0, 6.0, 6.0, 6.0)
    assert (t.send_start, t.send_end, t.bytes_sent) == (6.0, 6.0, None)
    t = measured_timing(5.0, 9.0, recv_s=0.1, lead_s=3.0, compute_s=10.0, bytes_received=8,
                        bytes_sent=4)  # fmt: skip
    assert (t.recv_end, t.compute_start, t.compute_end, t.send_start) == (5.1, 5.1, 8.0, 8.0)
