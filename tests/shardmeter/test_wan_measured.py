"""The transfer model against the transfers measured over emulated links
(benchmarks/results/wan_collectives.json, written by benchmarks/wan_collectives.py as root):
the prediction of every saved row, as `--load` prints it, meets the issue's targets."""

from __future__ import annotations

import json
import statistics
from pathlib import Path

from shardmeter.estimate.wan import TcpPath, pattern_s

SAVED = Path(__file__).resolve().parents[2] / "benchmarks" / "results" / "wan_collectives.json"


def errors() -> list[float]:
    rows = json.loads(SAVED.read_text())["rows"]
    out = []
    for r in rows:
        path = TcpPath(link_Bps=r["bw"] / 8.0, rtt_s=r["rtt"], mtu_bytes=r["mtu"])
        transport = "zmq" if r["op"].startswith("heloco") else "gloo"
        predicted = float(pattern_s(r["op"], r["nbytes"], r["n"], path, transport))
        out.append(predicted / r["measured_s"] - 1.0)
    return out


def test_saved_measurements_are_predicted_within_the_targets() -> None:
    e = [abs(x) for x in errors()]
    assert len(e) >= 60
    assert statistics.median(e) <= 0.08
    assert max(e) <= 0.25
