"""benchmarks/transport.py's server-capacity window on a tiny model: pushes signed ahead and
queued to a 1- and a 2-shard server all come back applied, each a revision of its own."""

from __future__ import annotations

import importlib
from pathlib import Path

import pytest

BENCHMARKS = Path(__file__).resolve().parents[2] / "benchmarks"


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
    costs = bench.unit_costs(8000, 1)
    assert costs.u > 0 and costs.w > 0
