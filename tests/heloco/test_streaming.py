"""The streaming exchange: fragments, the worker's merge, the server's per-fragment outer step,
the simulator's sub-rounds and their timing, the same losses through OuterLoop, the wire.

Tiny runs (one or two workers, H = 4 inner steps, P = 2 fragments: sub-rounds of 2 steps)."""

from __future__ import annotations

import json
from collections.abc import Callable
from pathlib import Path
from typing import Any

import pytest
import torch
from hypothesis import given, settings
from hypothesis import strategies as st

from heloco.config import RunConfig
from heloco.net import wire
from heloco.net.coordinator import Budget, Coordinator
from heloco.outer import OuterConfig, build_optimizer
from heloco.outer_loop import LocalLink, OuterLoop
from heloco.server import ArrivalRecord, Server, ServerConfig, SubmissionRejected
from heloco.sim import build_run, parse_sim_config, run_simulation
from heloco.streaming import Stream, fragment_for_round, fragments_of, merge
from heloco.types import Dispatch, RoundResult
from shardmeter.errors import UserInputError

ROUND_TOKENS = 2 * 2 * 32  # one sub-round: 2 steps of 2 x 32 tokens


@pytest.fixture
def values(tiny_net_values: Callable[..., dict[str, Any]]) -> Callable[..., dict[str, Any]]:
    def make(**over: Any) -> dict[str, Any]:
        v = tiny_net_values(method="heloco", workers=1, token_budget=8 * ROUND_TOKENS)
        v.update(inner_steps=4, exchange="streaming", fragments=2)
        v.update(over)
        return v

    return make


# -- fragments ----------------------------------------------------------------------------------
def test_layers_are_strided_and_the_rest_balanced() -> None:
    shapes = {
        "emb.w": (10, 4),  # 40, largest non-layer tensor first
        "blocks.0.a": (8,),
        "blocks.1.a": (8,),
        "blocks.2.a": (8,),
        "head.b": (3,),
    }
    parts = fragments_of(shapes, 2)
    # layers 0, 2 -> fragment 0 (16); layer 1 -> fragment 1 (8); emb (40) -> the lighter, 1;
    # head (3) -> then the lighter, 0
    assert parts == [["blocks.0.a", "blocks.2.a", "head.b"], ["emb.w", "blocks.1.a"]]
    assert fragments_of(shapes, 1) == [list(shapes)]
    with pytest.raises(UserInputError, match="fragments"):
        fragments_of(shapes, 6)  # a fragment would be empty
    with pytest.raises(UserInputError, match="fragments"):
        fragments_of(shapes, 0)


def test_push_fragment_follows_the_planner_offsets() -> None:
    """Fragment p goes after inner steps p·H/P (mod H): round r ends at (r+1)·H/P."""
    assert [fragment_for_round(r, 4) for r in range(6)] == [1, 2, 3, 0, 1, 2]


def test_merge_mixes_with_alpha() -> None:
    local, arrived = torch.tensor([1.0, 3.0]), torch.tensor([3.0, -1.0])
    assert torch.equal(merge(local, arrived, 0.0), arrived)
    assert torch.equal(merge(local, arrived, 0.5), torch.tensor([2.0, 1.0]))
    assert torch.equal(merge(local, arrived, 0.25), torch.tensor([2.5, 0.0]))


def test_stream_measures_against_the_anchor_and_merges_one_fragment() -> None:
    parts = [["a"], ["b"]]
    s = Stream(parts, alpha=0.5)
    full = Dispatch({"a": torch.tensor([1.0]), "b": torch.tensor([2.0])}, 3, 2, 0, 0, 1)
    s.reset(full)
    delta, base = s.finish({"a": torch.tensor([0.5]), "b": torch.tensor([1.0])}, 1)
    assert base == 3 and list(delta) == ["b"] and torch.equal(delta["b"], torch.tensor([1.0]))
    s.merge(Dispatch({"a": torch.tensor([0.0])}, 4, 2, 1, 0, 0))  # θ_a = 0.5·0.5 + 0.5·0
    assert torch.equal(s.local["a"], torch.tensor([0.25])) and s.revisions == [4, 3]
    assert torch.equal(s.anchor["a"], torch.tensor([0.0]))
    assert torch.equal(s.local["b"], torch.tensor([1.0]))  # the other fragment trains on
    delta, base = s.finish({"a": torch.tensor([-1.0]), "b": torch.tensor([1.0])}, 0)
    assert base == 4 and torch.equal(delta["a"], torch.tensor([1.0]))
    with pytest.raises(UserInputError, match="dispatch"):
        s.merge(Dispatch({"a": torch.tensor([0.0]), "x": torch.tensor([0.0])}, 5, 2, 2, 0, 1))
    with pytest.raises(UserInputError, match=r"dispatch\.fragment"):
        s.fragment_of(Dispatch({}, 5, 2, 2, 0, 2))


# -- the server ---------------------------------------------------------------------------------
def _server(workers: int = 1, method: str = "heloco") -> Server:
    init = {"blocks.0.w": torch.zeros(4), "blocks.1.w": torch.zeros(4)}
    opt = build_optimizer(method, init, OuterConfig(), workers)
    return Server(init, opt, ServerConfig(n_workers=workers, inner_steps=4, fragments=2))


def _push(d: Dispatch, base: int, value: float = 1.0) -> RoundResult:
    f = d.fragment
    assert f is not None
    names = ["blocks.0.w"] if f == 0 else ["blocks.1.w"]
    delta = {n: torch.full((4,), value) for n in names}
    return RoundResult(d.worker, delta, d.steps, 8, 1.0, base, d.round_id, f)


def test_server_steps_one_fragment_and_answers_with_it() -> None:
    s = _server()
    d0 = s.dispatch(0)
    assert set(d0.params) == {"blocks.0.w", "blocks.1.w"} and (d0.steps, d0.fragment) == (2, 1)
    s.submit(_push(d0, 0))
    assert torch.equal(s.params["blocks.0.w"], torch.zeros(4))  # the other fragment untouched
    assert not torch.equal(s.params["blocks.1.w"], torch.zeros(4))
    assert s.log[-1].arrivals[0].fragment == 1
    d1 = s.dispatch(0)  # answers the push of fragment 1: carries fragment 1 only
    assert list(d1.params) == ["blocks.1.w"] and d1.fragment == 0 and d1.revision == 1
    with pytest.raises(SubmissionRejected, match="revision_mismatch"):
        s.submit(_push(d1, 1))  # fragment 0's anchor is still the full dispatch's, revision 0
    with pytest.raises(SubmissionRejected, match="bad_fragment"):
        s.submit(RoundResult(0, {"blocks.1.w": torch.ones(4)}, 2, 8, 1.0, 1, 1, 1))
    with pytest.raises(SubmissionRejected, match="bad_delta"):
        s.submit(RoundResult(0, {"blocks.1.w": torch.ones(4)}, 2, 8, 1.0, 0, 1, 0))
    s.submit(_push(d1, 0))
    assert s.log[-1].arrivals[0].staleness == 0  # fragment 0 had no update since its anchor
    d2 = s.dispatch(0)
    assert list(d2.params) == ["blocks.0.w"] and d2.fragment == 1
    s.restart(0)  # a new process: a full dispatch, every anchor moves
    d3 = s.dispatch(0)
    assert set(d3.params) == {"blocks.0.w", "blocks.1.w"}
    s.evict(0)
    assert set(s.dispatch(0).params) == {"blocks.0.w", "blocks.1.w"}


def test_fragment_staleness_counts_only_that_fragments_updates() -> None:
    """Worker 1's update of fragment 1 ages worker 0's fragment-1 anchor, not fragment 0's."""
    s = _server(workers=2, method="async-nesterov")
    a, b = s.dispatch(0), s.dispatch(1)
    s.submit(_push(b, 0))  # fragment 1, revision 1
    s.submit(_push(a, 0))  # worker 0's fragment 1: one update since its anchor
    assert [x.staleness for r in s.log for x in r.arrivals] == [0, 1]
    a1 = s.dispatch(0)  # fragment 1 back; worker 0 pushes fragment 0 next, anchor revision 0
    s.submit(_push(a1, 0))
    assert s.log[-1].arrivals[0].staleness == 0  # fragment 0 untouched since revision 0
    state = s.state_dict()
    restored = _server(workers=2, method="async-nesterov")
    restored.load_state_dict(state)
    assert restored._anchors == s._anchors and restored._answer == s._answer
    assert restored._fragment_updates == s._fragment_updates == [1, 2]
    assert list(restored.dispatch(0).params) == ["blocks.0.w"]
    json.dumps(state.meta)


# -- config -------------------------------------------------------------------------------------
def test_bad_streaming_configs_name_field_value_and_rule(
    refused: Callable[[list[tuple[dict[str, Any], str]]], None],
) -> None:
    cases: list[tuple[dict[str, Any], str]] = [
        (dict(method="sync"), "exchange"),
        (dict(method="dn"), "exchange"),
        (dict(method="decoupled"), "exchange"),
        (dict(grace_window=1.0), "exchange"),
        (dict(payload="sign"), "payload"),
        (dict(fragments=3), "fragments"),
        (dict(fragments=1), "fragments"),
        (dict(stream_alpha=1.5), "stream_alpha"),
    ]
    refused(cases)


# -- the simulator --------------------------------------------------------------------------------
def _rounds(out: Path) -> list[dict[str, Any]]:
    lines = (out / "events.jsonl").read_text().splitlines()
    return [e for e in map(json.loads, lines) if e.get("type") == "round"]


def test_simulated_sub_rounds_push_one_fragment_on_the_link_clock(
    values: Callable[..., dict[str, Any]], tmp_path: Path
) -> None:
    """Pace 1 s, sub-rounds of 2 steps; each push and fragment dispatch moves one fragment's
    fp32 bytes: the first sub-round waits for the whole model, later ones overlap."""
    cfg = parse_sim_config(values())
    parts = build_run(cfg)
    sizes = [sum(4 * parts.server.params[n].numel() for n in f) for f in parts.server.fragments]
    whole = sum(sizes)
    mbit = whole * 8 / 1e6  # the whole model in 1 s
    run_simulation(parse_sim_config(values(link_mbit=[mbit], out_dir=tmp_path)))
    rounds = _rounds(tmp_path)
    assert len(rounds) == 8
    assert [r["bytes_sent"] for r in rounds] == [sizes[(i + 1) % 2] for i in range(8)]
    first, second = rounds[0], rounds[1]
    assert first["bytes_received"] == whole and second["bytes_received"] == whole
    assert rounds[2]["bytes_received"] == sizes[1]  # the answer to the push of fragment 1
    assert (first["recv_start"], first["recv_end"]) == pytest.approx((0.0, 1.0))
    assert first["send_end"] == pytest.approx(3.0 + sizes[1] / whole)
    # sub-round 1 trains from its boundary at 3 s while push 0 and its answer travel
    assert (second["compute_start"], second["compute_end"]) == pytest.approx((3.0, 5.0))
    got = first["send_end"] + sizes[1] / whole  # its answer's way down
    assert second["send_start"] == pytest.approx(max(5.0, got))


def test_streaming_simulation_is_deterministic_and_trains(
    values: Callable[..., dict[str, Any]],
) -> None:
    a = run_simulation(parse_sim_config(values(workers=2, paces=[1.0, 1.5])))
    b = run_simulation(parse_sim_config(values(workers=2, paces=[1.0, 1.5])))
    assert a.losses == b.losses and a.losses[-1] < a.losses[0]
    alpha0 = run_simulation(parse_sim_config(values(workers=2, paces=[1.0, 1.5], stream_alpha=0)))
    assert alpha0.losses[-1] != a.losses[-1]


def test_streaming_kill_applies_every_accepted_push_once(
    values: Callable[..., dict[str, Any]],
    arrivals_once: Callable[[RunConfig], list[ArrivalRecord]],
) -> None:
    """A worker killed mid-stream loses the sub-round in flight; it comes back from a full
    dispatch, and every accepted fragment push is applied exactly once."""
    cfg = parse_sim_config(
        values(
            workers=2,
            paces=[1.0, 1.5],
            token_budget=16 * ROUND_TOKENS,
            failures=[{"worker": 1, "at": 5.5, "down": 3.0}],
        )
    )
    w1 = [a.round_id for a in arrivals_once(cfg) if a.worker == 1]
    assert w1 == sorted(w1) and len(w1) >= 3


# -- one worker logic: OuterLoop in process gives the simulator's parameters ----------------------
@pytest.mark.parametrize("alpha", [0.5, 0.0])
def test_outer_loop_in_process_matches_simulator(
    values: Callable[..., dict[str, Any]],
    outer_loop_run: Callable[..., list[ArrivalRecord]],
    alpha: float,
) -> None:
    cfg = parse_sim_config(values(stream_alpha=alpha))
    arrivals = outer_loop_run(
        cfg, exchange="streaming", fragments=cfg.fragments, alpha=cfg.stream_alpha
    )
    assert [a.fragment for a in arrivals] == [1, 0] * 4
    assert [a.staleness for a in arrivals] == [0] * 8  # one worker: no fragment ages


def test_sub_rounds_keep_the_inner_optimizer_until_a_full_dispatch(
    values: Callable[..., dict[str, Any]],
) -> None:
    """The method resets AdamW each round; a streaming sub-round continues the worker's own
    model, so only a full dispatch resets it."""
    from heloco.streaming import begin_sub_round, end_sub_round

    parts = build_run(parse_sim_config(values()))
    worker = parts.worker(0)
    assert worker.cfg.reset_each_round
    stream = Stream(parts.server.fragments, 0.5)
    d0 = parts.server.dispatch(0)
    stream.reset(d0)
    begin_sub_round(worker.boundary, stream, 2, full=True)
    worker.train_round()
    end_sub_round(worker.boundary, stream, d0)
    assert worker.optimizer.state
    begin_sub_round(worker.boundary, stream, 2, full=False)
    assert worker.optimizer.state  # kept
    worker.train_round()
    end_sub_round(worker.boundary, stream, d0)
    begin_sub_round(worker.boundary, stream, 2, full=True)
    assert not worker.optimizer.state  # reset


def test_outer_loop_restarts_from_a_full_dispatch_mid_stream(
    values: Callable[..., dict[str, Any]],
) -> None:
    """The server forgets the worker (a restart) while a push travels: the next dispatch is
    full, the sub-round in training is dropped and no later push is refused."""
    cfg = parse_sim_config(values(token_budget=10 * ROUND_TOKENS))
    parts = build_run(cfg)
    worker = parts.worker(0)
    reasons: list[str] = []

    class Forgetting(LocalLink):
        def push(self, result: RoundResult, compute_s: float) -> Any:
            out = super().push(result, compute_s)
            if self.rounds == 3:
                self.server.restart(0)
            reasons.append(out.reason)
            return out

    link = Forgetting(parts.server, 0, token_budget=cfg.token_budget)
    outer = OuterLoop(
        worker.model, worker.optimizer, link, hook=False, rounds=worker.boundary,
        exchange="streaming", fragments=2,
    )  # fmt: skip
    with outer:
        while not outer.done:
            outer.step(worker.inner_step(), worker.sampler.tokens_per_batch)
    assert set(reasons) == {""} and len(reasons) == 10
    rids = [a.round_id for r in parts.server.log for a in r.arrivals]
    assert len(rids) == len(set(rids)) == 10


def test_outer_loop_refuses_streaming_settings_it_cannot_run(
    values: Callable[..., dict[str, Any]],
) -> None:
    parts = build_run(parse_sim_config(values()))
    worker = parts.worker(0)
    link = LocalLink(parts.server, 0)
    with pytest.raises(UserInputError, match="fragments"):
        OuterLoop(worker.model, worker.optimizer, link, exchange="streaming", fragments=1)
    with pytest.raises(UserInputError, match="payload"):
        OuterLoop(worker.model, worker.optimizer, link, exchange="streaming", payload="sign")
    with pytest.raises(UserInputError, match="exchange"):
        OuterLoop(worker.model, worker.optimizer, link, exchange="sideways")


# -- the wire -------------------------------------------------------------------------------------
SECRET = b"streaming-test-secret-0123456789"


def _coord(fragments: int = 2) -> Coordinator:
    s = _server() if fragments else None
    if s is None:
        init = {"blocks.0.w": torch.zeros(4), "blocks.1.w": torch.zeros(4)}
        opt = build_optimizer("heloco", init, OuterConfig(), 1)
        s = Server(init, opt, ServerConfig(n_workers=1, inner_steps=4))
    return Coordinator(s, Budget(revisions=100), max_tokens_per_step=64)


def _wire_push(
    coord: Coordinator, fragment: object, names: list[str] | None = None
) -> wire.Message:
    d = coord.handle(wire.make("pull", {"worker": 0, "incarnation": "a"}))
    assert d.type == "dispatch"
    body: dict[str, object] = {
        "worker": 0,
        "incarnation": "a",
        "round_id": d.body["round_id"],
        "steps": d.body["steps"],
        "tokens": 8,
        "base_revision": d.body["revision"],
        "compute_s": 0.1,
    }
    if fragment == "auto":  # the fragment the dispatch names, with its tensors
        fragment = d.body["fragment"]
        names = [f"blocks.{fragment}.w"]
    if fragment is not None:
        body["fragment"] = fragment
    want = names if names is not None else ["blocks.1.w"]
    msg = wire.make("push", body, {n: torch.full((4,), 0.1) for n in want})
    return coord.handle(wire.decode(wire.encode(msg, SECRET), SECRET))


def test_dispatch_and_push_carry_the_fragment() -> None:
    coord = _coord()
    d = coord.handle(wire.make("pull", {"worker": 0, "incarnation": "a"}))
    assert d.body["fragment"] == 1 and set(d.tensors) == {"blocks.0.w", "blocks.1.w"}
    coord = _coord()
    assert _wire_push(coord, 1).type == "ack"
    d = coord.handle(wire.make("pull", {"worker": 0, "incarnation": "a"}))
    assert d.body["fragment"] == 0 and list(d.tensors) == ["blocks.1.w"]
    # a new process of the slot, right after an accepted push, gets every tensor again
    coord = _coord()
    assert _wire_push(coord, 1).type == "ack"
    d = coord.handle(wire.make("pull", {"worker": 0, "incarnation": "b"}))
    assert set(d.tensors) == {"blocks.0.w", "blocks.1.w"}


@pytest.mark.parametrize(
    ("fragment", "names", "reason"),
    [
        (2, None, "malformed"),  # out of range for P = 2
        (None, None, "malformed"),  # a streaming server needs it
        (0, None, "rejected"),  # the dispatch named fragment 1
        (1, ["blocks.0.w"], "bad_update"),  # fragment 1's tensors are blocks.1.w
        (1, ["blocks.0.w", "blocks.1.w"], "bad_update"),
    ],
)
def test_bad_fragments_are_refused_and_nothing_is_applied(
    fragment: object, names: list[str] | None, reason: str
) -> None:
    coord = _coord()
    reply = _wire_push(coord, fragment, names)
    got = reply.type if reply.type == "rejected" else reply.body["reason"]
    assert got == reason, reply.body
    assert coord.server.revision == 0 and coord.counters.accepted == 0
    assert _wire_push(coord, "auto").type == "ack"  # the slot still works


def test_a_fragment_to_a_whole_model_server_is_refused() -> None:
    coord = _coord(fragments=0)
    reply = _wire_push(coord, 0, ["blocks.0.w", "blocks.1.w"])
    assert reply.type == "error" and reply.body["reason"] == "malformed"
    assert "fragment" in reply.body["detail"] and coord.server.revision == 0


@settings(max_examples=60, deadline=None)
@given(
    st.one_of(
        st.integers(min_value=-(2**70), max_value=2**70),
        st.floats(allow_nan=False, allow_infinity=False),  # the wire refuses NaN and inf itself
        st.booleans(),
        st.text(max_size=8).filter(lambda t: t != "auto"),
        st.none(),
        st.lists(st.integers(), max_size=3),
    )
)
def test_fuzzed_fragment_field_never_applies_a_bad_push(fragment: object) -> None:
    """Whatever the field holds, the push is applied only when it is exactly 1 (the fragment
    its dispatch named), and every other value gets one reply, never an exception."""
    coord = _coord()
    reply = _wire_push(coord, fragment)
    ok = type(fragment) is int and fragment == 1
    assert (reply.type == "ack") == ok, (fragment, reply.type, reply.body)
    assert coord.server.revision == (1 if ok else 0)


# -- bytes per push: the fragment's share, as ShardMeter's streaming mode charges ----------------
def test_push_bytes_are_the_fragment_share_shardmeter_charges(
    values: Callable[..., dict[str, Any]],
) -> None:
    """Each push's encoded message holds its fragment's fp32 tensors (plus a header), and a
    cycle of P pushes averages to ShardMeter's per-fragment payload, N·32/8 · 1/P
    (shardmeter.estimate.schedule.even_schedule shares), within 2%."""
    from shardmeter.estimate.schedule import even_schedule

    p = 4
    cfg = parse_sim_config(values(inner_steps=8, fragments=p))
    server = build_run(cfg).server
    n = sum(v.numel() for v in server.params.values())
    charge = float(even_schedule(8, p).shares[0]) * n * 32 / 8
    sizes = []
    for f, names in enumerate(server.fragments):
        body = {"worker": 0, "round_id": f, "base_revision": 0, "steps": 2, "tokens": 8}
        body["fragment"] = f
        delta = {k: torch.zeros_like(server.params[k]) for k in names}
        frames = wire.encode(wire.make("push", body, delta), SECRET)
        size = sum(len(fr) for fr in frames)
        tensor = sum(4 * server.params[k].numel() for k in names)
        assert tensor <= size <= tensor + 4096  # one fragment's tensors and a header
        sizes.append(size)
    assert sum(sizes) / p == pytest.approx(charge, rel=0.02)


def test_worker_checks_the_dispatch_fragment_too() -> None:
    """A dispatch reply's fragment is bounded by the message model, then by the worker's P."""
    from heloco.net import messages
    from heloco.net.link import ProtocolError, reply_body

    ok = wire.make("dispatch", {"revision": 0, "steps": 2, "round_id": 0, "fragment": 1})
    assert reply_body(ok, messages.DispatchBody).fragment == 1
    for bad in (-1, 2**40, True, 1.0, "1"):
        body = {"revision": 0, "steps": 2, "round_id": 0, "fragment": bad}
        with pytest.raises(ProtocolError, match="fragment"):
            reply_body(wire.make("dispatch", body), messages.DispatchBody)
    stream = Stream([["a"], ["b"]], 0.5)
    with pytest.raises(UserInputError, match=r"dispatch\.fragment"):
        stream.fragment_of(Dispatch({}, 0, 2, 0, 0, 5))  # within the wire's bound, not P's


def test_cli_flags_reach_the_config_and_errors_are_one_line(
    capsys: pytest.CaptureFixture[str], tmp_path: Path
) -> None:
    from heloco.cli import build_parser, main
    from heloco.cli.launch import run_config

    assert main(["simulate", "--exchange", "streaming", "--fragments", "4", "--print-config"]) == 0
    out = capsys.readouterr().out
    assert 'exchange = "streaming"' in out and "fragments = 4" in out
    assert main(["simulate", "--exchange", "streaming", "--fragments", "3", "--quiet"]) == 2
    err = capsys.readouterr().err.strip()
    assert err.count("\n") == 0 and "fragments" in err and "inner_steps = 20" in err
    args = build_parser().parse_args(["launch", "--out", "x", "--exchange", "streaming",
                                      "--fragments", "4"])  # fmt: skip
    assert run_config(args).fragments == 4
    out_dir = str(tmp_path / "run")
    assert main(["launch", "--out", out_dir, "--exchange", "streaming", "--shards", "2"]) == 2
    err = capsys.readouterr().err.strip()
    assert err.count("\n") == 0 and "--shards" in err


def test_sharded_server_refuses_streaming_in_one_line(tmp_path: Path) -> None:
    """`heloco serve --shards 2` of a streaming run: a fragment push goes whole to one server,
    so the session refuses it, naming the flag, the value and what is allowed."""
    from heloco.net.endpoint import EndpointConfig
    from heloco.net.session import Session

    cfg = parse_sim_config({"exchange": "streaming", "fragments": 2, "inner_steps": 2,
                            "model": "tiny", "token_budget": 1024, "out_dir": str(tmp_path)})  # fmt: skip
    with pytest.raises(UserInputError) as err:
        Session(cfg, b"0" * 32, EndpointConfig(shards=2))
    assert str(err.value).count("\n") == 0
    assert "--shards" in str(err.value) and "2" in str(err.value) and "streaming" in str(err.value)
