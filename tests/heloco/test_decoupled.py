"""The Decoupled DiLoCo baseline (quorum, grace window, token-weighted merge) and failures on
the simulated clock (kill and rejoin), with goodput."""

from __future__ import annotations

from typing import Any

import pytest
import torch

from heloco.net import wire
from heloco.net.coordinator import Budget, Coordinator
from heloco.outer import OuterConfig, build_optimizer
from heloco.server import Server, ServerConfig
from heloco.sim import parse_sim_config, run_simulation
from heloco.types import RoundResult
from shardmeter.errors import UserInputError

LR, MU = 0.7, 0.9


def _server(quorum: int, grace: float = 0.0, workers: int = 3) -> Server:
    init = {"w": torch.zeros(4)}
    opt = build_optimizer("decoupled", init, OuterConfig(), workers)
    cfg = ServerConfig(n_workers=workers, inner_steps=2, quorum=quorum, grace_window=grace)
    return Server(init, opt, cfg)


def _round(server: Server, w: int, value: float, tokens: int) -> RoundResult:
    d = server.dispatch(w)
    return RoundResult(w, {"w": torch.full((4,), value)}, 2, tokens, 1.0, d.revision, d.round_id)


def test_quorum_merges_every_buffered_round_token_weighted_once() -> None:
    """Two rounds of worker 0, then worker 1: one outer step on Σ tokens·Δ / Σ tokens."""
    s = _server(quorum=2)
    assert s.submit(_round(s, 0, 1.0, 100)) is None
    assert s.pending_workers == [0] and not s.holds_workers  # worker 0 goes on at once
    assert s.submit(_round(s, 0, 2.0, 100)) is None  # still one distinct worker
    record = s.submit(_round(s, 1, 4.0, 200))
    assert record is not None and s.revision == 1 and not s.pending_workers
    assert [a.worker for a in record.arrivals] == [0, 0, 1]
    g = (100 * 1.0 + 100 * 2.0 + 200 * 4.0) / 400  # the token-weighted mean Δ
    assert torch.allclose(s.params["w"], torch.full((4,), -LR * (1 + MU) * g))


def test_grace_window_waits_and_the_budget_merges_below_quorum() -> None:
    s = _server(quorum=2, grace=5.0)
    assert s.submit(_round(s, 0, 1.0, 10)) is None
    assert not s.window_ready() and s.flush() == []  # no quorum: nothing to merge yet
    assert s.submit(_round(s, 1, 1.0, 10)) is None  # quorum met, but the window is open
    assert s.window_ready()
    assert len(s.flush()) == 1 and s.revision == 1
    assert s.submit(_round(s, 2, 1.0, 10)) is None
    assert s.flush() == [] and len(s.flush(final=True)) == 1 and s.revision == 2


def test_coordinator_dispatches_a_buffered_worker_at_once() -> None:
    init = {"w": torch.zeros(4)}
    opt = build_optimizer("decoupled", init, OuterConfig(), 2)
    server = Server(init, opt, ServerConfig(n_workers=2, inner_steps=2, quorum=2))
    coord = Coordinator(server, Budget(revisions=10))
    ident = {"worker": 0, "incarnation": "a"}
    d = coord.handle(wire.make("pull", ident))
    body = ident | {
        "round_id": d.body["round_id"],
        "base_revision": 0,
        "steps": 2,
        "tokens": 8,
    }
    ack = coord.handle(wire.make("push", body, {"w": torch.ones(4)}))
    assert ack.type == "ack" and not ack.body["applied"]
    again = coord.handle(wire.make("pull", ident))
    assert again.type == "dispatch"  # not "wait": learners never wait for the merge


TINY: dict[str, Any] = {
    "workers": 3,
    "paces": [1.0, 1.0, 3.0],
    "inner_steps": 2,
    "token_budget": 1536,
    "eval_windows": 2,
    "eval_batch_size": 4,
    "data": {"synthetic_chars_per_language": 4000, "val_chars_per_language": 1000, "seq_len": 32},
    "inner": {"batch_size": 2, "seq_len": 32},
}


def _run(**over: Any) -> Any:
    return run_simulation(parse_sim_config(TINY | over))


def test_decoupled_simulates_deterministically_with_its_quorum(one_thread: None) -> None:
    a, b = _run(method="decoupled"), _run(method="decoupled")
    assert a.losses == b.losses and a.summary.updates > 0
    q3 = _run(method="decoupled", quorum=3)
    assert q3.summary.updates < a.summary.updates  # a larger quorum merges more per step
    assert a.summary.goodput is not None and 0 < a.summary.goodput <= 1


def test_goodput_closed_forms(one_thread: None) -> None:
    """Goodput = compute of accepted (or in-flight) rounds / (workers × simulated time). With
    no link delay and no failures an asynchronous worker never idles: 1. Sync rounds of H = 2
    at paces 1, 1, 3 last 6 s, of which the workers compute 2 + 2 + 6 s: 10 / 18."""
    assert _run(method="heloco").summary.goodput == pytest.approx(1.0)
    assert _run(method="decoupled").summary.goodput == pytest.approx(1.0)
    assert _run(method="sync").summary.goodput == pytest.approx(10 / 18)


@pytest.mark.parametrize("method", ["heloco", "decoupled", "sync"])
def test_a_killed_worker_loses_its_round_and_rejoins(method: str, one_thread: None) -> None:
    """Worker 2 (6 s rounds) dies at 4 s, mid-round, for 1 s: that round's compute is lost, so
    goodput drops; it contributes again after it rejoins; the budget is still reached."""
    clean = _run(method=method, token_budget=3072)
    hit = _run(method=method, token_budget=3072, failures=[{"worker": 2, "at": 4.0, "down": 1.0}])
    assert hit.summary.goodput < clean.summary.goodput
    assert hit.summary.worker_shares[2] > 0  # back after the downtime
    assert hit.summary.tokens >= 3072


def test_bad_quorum_and_failures_are_one_line_errors() -> None:
    with pytest.raises(UserInputError, match="quorum"):
        parse_sim_config(TINY | {"method": "heloco", "quorum": 2})
    with pytest.raises(UserInputError, match="quorum"):
        parse_sim_config(TINY | {"method": "decoupled", "quorum": 4})
    with pytest.raises(UserInputError, match=r"failures\.worker"):
        parse_sim_config(TINY | {"failures": [{"worker": 3, "at": 1.0, "down": 1.0}]})
