"""benchmarks/transport.py's server-capacity window on a tiny model: pushes signed ahead and
queued to a 1- and a 2-shard server all come back applied, each a revision of its own."""

from __future__ import annotations

import importlib
import os
from pathlib import Path

import pytest

BENCHMARKS = Path(__file__).resolve().parents[2] / "benchmarks"


@pytest.mark.slow
@pytest.mark.timeout(240)
def test_queued_pushes_are_each_applied_once(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.syspath_prepend(str(BENCHMARKS))  # importable by name: the servers are spawned
    bench = importlib.import_module("transport")
    probe = bench.LimitProbe(8000, curve=False)
    try:
        rows = bench.bench(8000, False, [1, 2], ["int8"], 1, 1, 3, probe)
    finally:
        probe.close()
    assert [(r.shards, r.codec, r.workers) for r in rows] == [(1, "int8", 3), (2, "int8", 3)]
    for r in rows:
        assert r.queued_mb == pytest.approx(r.push_mb, rel=0.1)  # one push's wire bytes
        assert r.queued_updates_per_s > 0 and r.updates_per_s > 0
        assert r.push_cpu_s >= 0 and r.queued_cpu_s >= 0  # both processes' CPU was read
    costs = bench.unit_costs(8000, 1)
    assert costs.u > 0 and costs.w > 0 and costs.floor > 0


def test_cost_model_bounds(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.syspath_prepend(str(BENCHMARKS))
    bench = importlib.import_module("transport")
    costs = bench.UnitCosts(100, u=1.0, q=0.0, f=0.0, w=0.0)
    # c = 1 ns zmq + 1 ns tag per byte: (4c + u) / (4(c + u)) = 9 / 12
    assert costs.ratio(bench.Limit(1000.0, 1000.0), False) == pytest.approx(0.75)
    # a setting that kept 1 of the machine's cores busy could at most go cores times faster
    assert bench.ceiling(0.5, 1.0) == pytest.approx(0.5 * (os.cpu_count() or 1))
