"""A networked run (ZeroMQ over loopback) and a simulated run of one config give the same curve.

The server runs ``heloco.net.session.Session`` in a thread and the workers run
``heloco.net.worker_loop.NetWorker`` in threads, talking over real TCP sockets on 127.0.0.1.
Where the arrival order is deterministic (one async worker; a sync barrier) the two runs apply
the same updates in the same order, so the validation losses agree to float tolerance:
``ONE_WORKER_TOL`` (identical in practice: same ops, same seeds, fp32 on the wire) and
``SYNC_TOL`` (a sync barrier sums the K deltas in arrival order, which over the network is
not the simulator's order; fp32 addition is not associative).
"""

from __future__ import annotations

import itertools
import json
import threading
from collections.abc import Callable
from pathlib import Path
from typing import Any

import pytest

from heloco.net.client import ClientConfig
from heloco.net.endpoint import EndpointConfig
from heloco.net.session import Session
from heloco.net.worker_loop import NetWorker, WorkerOptions, WorkerReport
from heloco.sim import parse_sim_config, run_simulation

pytestmark = [pytest.mark.slow, pytest.mark.timeout(120)]

SECRET = b"equivalence-test-secret-0123456789"
ONE_WORKER_TOL = 1e-6
SYNC_TOL = 1e-4
ROUND_TOKENS = 2 * 2 * 32


@pytest.fixture
def config(tiny_net_values: Callable[..., dict[str, Any]]) -> Callable[..., Any]:
    """One async HeLoCo worker for 6 rounds, evaluated every 2; keywords override."""

    def make(**over: Any) -> Any:
        values = tiny_net_values(
            method="heloco",
            workers=1,
            token_budget=6 * ROUND_TOKENS,
            eval_every=2 * ROUND_TOKENS,
        )
        values.update(over)
        return parse_sim_config(values)

    return make


def networked(
    cfg: Any, tmp: Path, codec: str = "fp32", shards: int = 1
) -> tuple[Session, list[WorkerReport]]:
    endpoint = EndpointConfig(checkpoint_dir=tmp / "ck", drain_s=2.0, shards=shards)
    session = Session(cfg, SECRET, endpoint, out_dir=tmp)
    server, address = session.serve_in_thread()
    reports: list[WorkerReport] = []

    def work(w: int) -> None:
        client = ClientConfig(address, timeout_s=20, deadline_s=60)
        reports.append(NetWorker(client, SECRET, WorkerOptions(worker=w, codec=codec)).run())  # type: ignore[arg-type]

    threads = [threading.Thread(target=work, args=(w,), daemon=True) for w in range(cfg.workers)]
    for t in threads:
        t.start()
    for t in threads:
        t.join(90)
    server.join(30)
    assert not server.is_alive() and len(reports) == cfg.workers
    return session, reports


_SIM_CACHE: dict[str, list[tuple[int, float]]] = {}


def curves(session: Session, cfg: Any) -> tuple[list[tuple[int, float]], list[tuple[int, float]]]:
    """(networked, simulated) eval curves as (tokens, loss); one simulation per config."""
    key = cfg.model_dump_json()
    if key not in _SIM_CACHE:
        _SIM_CACHE[key] = [(e.tokens, e.loss) for e in run_simulation(cfg).evals]
    return [(e.tokens, e.loss) for e in session.traj.evals], _SIM_CACHE[key]


@pytest.mark.parametrize("shards", [1, 3])
def test_one_async_worker_matches_simulator(
    tmp_path: Path, config: Callable[..., Any], shards: int
) -> None:
    """Also with the tensors split over 3 shards (fetch, stage, push, parallel outer step)."""
    cfg = config()
    session, reports = networked(cfg, tmp_path, shards=shards)
    assert session.coord.counters.accepted == len(reports[0].acked) == 6
    net, sim = curves(session, cfg)
    assert [t for t, _ in net] == [t for t, _ in sim] == [0, 256, 512, 768]
    assert max(abs(a - b) for (_, a), (_, b) in zip(net, sim, strict=True)) <= ONE_WORKER_TOL
    assert sim[-1][1] < sim[0][1]  # it trained
    assert (tmp_path / "summary.json").is_file() and (tmp_path / "events.jsonl").is_file()


@pytest.mark.parametrize("shards", [1, 2])
def test_sync_two_workers_match_simulator(
    tmp_path: Path, config: Callable[..., Any], shards: int
) -> None:
    cfg = config(
        method="sync", workers=2, token_budget=8 * ROUND_TOKENS, eval_every=2 * ROUND_TOKENS
    )
    session, reports = networked(cfg, tmp_path, shards=shards)
    net, sim = curves(session, cfg)
    assert [t for t, _ in net] == [t for t, _ in sim]
    assert max(abs(a - b) for (_, a), (_, b) in zip(net, sim, strict=True)) <= SYNC_TOL
    assert session.side.server.revision == 4 and all(len(r.acked) == 4 for r in reports)


def test_int8_uplink_stays_close_to_fp32(tmp_path: Path, config: Callable[..., Any]) -> None:
    """Blockwise int8 pseudo-gradients: the curve moves by far less than the training signal."""
    cfg = config()
    session, reports = networked(cfg, tmp_path, codec="int8")
    net, sim = curves(session, cfg)
    drift = max(abs(a - b) for (_, a), (_, b) in zip(net, sim, strict=True))
    assert drift < 0.1 * (sim[0][1] - sim[-1][1])
    assert reports[0].sent_bytes < 0.4 * reports[0].recv_bytes  # int8 up, fp32 down


def test_budget_schedule_and_step_evals_match_simulator(
    tmp_path: Path, config: Callable[..., Any]
) -> None:
    """``inner_schedule="budget"`` (cosine as long as the worker's expected steps) is built by
    the network worker too, and ``eval_unit="steps"`` is honoured by the session: the curve
    matches the simulator's at the same step counts, not the fixed-length schedule's."""
    cfg = config(inner_schedule="budget", eval_unit="steps", eval_every=4)
    session, _ = networked(cfg, tmp_path)
    net, sim = curves(session, cfg)
    assert [e.steps for e in session.traj.evals] == [0, 4, 8, 12]
    assert [t for t, _ in net] == [t for t, _ in sim]
    assert max(abs(a - b) for (_, a), (_, b) in zip(net, sim, strict=True)) <= ONE_WORKER_TOL
    fixed = [e.loss for e in run_simulation(config(eval_unit="steps", eval_every=4)).evals]
    assert max(abs(a - b) for (_, a), b in zip(net, fixed, strict=True)) > 100 * ONE_WORKER_TOL
    summary = json.loads((tmp_path / "summary.json").read_text())
    assert summary["weight_shares"] == pytest.approx([1.0])


@pytest.mark.parametrize(("eager", "shards"), [(1.0, 1), (0.0, 1), (1.0, 2)])
def test_overlapped_worker_matches_simulator(
    tmp_path: Path, config: Callable[..., Any], eager: float, shards: int
) -> None:
    """The overlapped exchange (push and pull in the background, the next round from the
    newest dispatch minus λ·Δ): the networked worker runs heloco.overlap through OuterLoop, the
    simulator through its loop; same rounds, same bases, same losses (also with the tensors
    staged and fetched over 2 shards from the exchange thread)."""
    cfg = config(exchange="overlapped", overlap_eager=eager)
    session, reports = networked(cfg, tmp_path, shards=shards)
    net, sim = curves(session, cfg)
    assert [t for t, _ in net] == [t for t, _ in sim] == [0, 256, 512, 768]
    assert max(abs(a - b) for (_, a), (_, b) in zip(net, sim, strict=True)) <= ONE_WORKER_TOL
    blocking = curves(session, config())[1]
    assert abs(blocking[-1][1] - sim[-1][1]) > 100 * ONE_WORKER_TOL  # a different scheme
    assert session.coord.counters.accepted == len(reports[0].acked) == 6
    staleness = [a.staleness for r in session.side.server.log for a in r.arrivals]
    assert staleness == [0, 1, 1, 1, 1, 1]  # each round after the first: one round staler
    lines = (tmp_path / "events.jsonl").read_text().splitlines()
    rounds = [e for e in map(json.loads, lines) if e["type"] == "round"]
    keys = ("recv_start", "recv_end", "compute_start", "compute_end", "send_start", "send_end")
    assert len(rounds) == 6 and all(all(k in r for k in keys) for r in rounds), json.dumps(rounds)
    for r in rounds:  # on the run's clock, in order within the round
        assert r["recv_start"] <= r["recv_end"] <= r["compute_start"] <= r["compute_end"]
        assert r["compute_end"] <= r["send_start"] <= r["send_end"] == r["time"]
    # rounds 1.. start at their boundary, as the simulator shows them; from round 2 on they
    # trained from the dispatch before the one they answer, received before the last ack
    assert rounds[0]["start"] == rounds[0]["recv_start"]
    assert all(r["start"] == r["compute_start"] for r in rounds[1:])
    assert all(r["recv_start"] < p["send_end"] for p, r in itertools.pairwise(rounds[1:]))


@pytest.mark.parametrize("alpha", [0.5, 0.0])
def test_streaming_worker_matches_simulator(
    tmp_path: Path, config: Callable[..., Any], alpha: float
) -> None:
    """Streaming fragments (heloco.streaming): the networked worker drives its Stream through
    OuterLoop, the simulator through its StreamRounds; same sub-rounds, same fragments, same
    losses. Each push carries one fragment's tensors, a cycle of P pushes on average the
    per-fragment payload ShardMeter's streaming mode charges (N·32/8 / P, within 2%)."""
    from shardmeter.estimate.schedule import even_schedule

    cfg = config(exchange="streaming", inner_steps=4, fragments=2, stream_alpha=alpha)
    session, reports = networked(cfg, tmp_path)
    net, sim = curves(session, cfg)
    assert [t for t, _ in net] == [t for t, _ in sim] == [0, 256, 512, 768]
    assert max(abs(a - b) for (_, a), (_, b) in zip(net, sim, strict=True)) <= ONE_WORKER_TOL
    arrivals = [a for r in session.side.server.log for a in r.arrivals]
    assert [a.fragment for a in arrivals] == [1, 0] * 3 and {a.staleness for a in arrivals} == {0}
    server = session.side.server
    sizes = [sum(4 * server.params[n].numel() for n in f) for f in server.fragments]
    pushes = reports[0].push_bytes
    assert len(pushes) == 6
    for i, sent in enumerate(pushes):  # fragment (i + 1) mod 2, plus a header
        assert sizes[(i + 1) % 2] < sent < sizes[(i + 1) % 2] + 4096
    n = sum(v.numel() for v in server.params.values())
    charge = float(even_schedule(4, 2).shares[0]) * n * 32 / 8
    assert sum(pushes) / len(pushes) == pytest.approx(charge, rel=0.02)
    # each round event's dispatch bytes are those of the dispatch it trained from, as the
    # simulator's: the whole model twice (the first full dispatch), then the fragment each
    # fragment dispatch carried (the one the push before it sent)
    lines = (tmp_path / "events.jsonl").read_text().splitlines()
    rounds = [e for e in map(json.loads, lines) if e["type"] == "round"]
    whole = sum(sizes)
    assert [r["bytes_received"] for r in rounds] == [whole, whole, *[sizes[1], sizes[0]] * 2]
