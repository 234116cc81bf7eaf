"""The same topology in every outer mode: the comparison table of docs/islands.md.

Run: `.venv/bin/python benchmarks/islands_modes.py [TOPOLOGY]` (default two-clouds; prints
Markdown).
"""

from __future__ import annotations

import sys
from typing import Any

from shardmeter.estimate.islands import predict_topology
from shardmeter.specs.topology import load_topology

MODES: tuple[tuple[str, dict[str, Any]], ...] = (
    ("sync DP (bf16 gradients)", {"mode": "sync"}),
    ("DiLoCo, blocking", {"mode": "diloco"}),
    ("DiLoCo, eager", {"mode": "diloco", "outer_overlap": True}),
    ("Streaming DiLoCo P=4, τ=2", {"mode": "streaming", "fragments": 4, "overlap_steps": 2}),
    ("async parameter server", {"mode": "async"}),
)


def main(name: str) -> None:
    topo = load_topology(name)
    run = topo.run
    print(
        f"{name}: H = {run.inner_steps}, {run.bits}-bit pseudo-gradients, {run.tokens:.3g} tokens\n"
    )
    print(
        "| mode | tokens/s | utilization | regime | time | cost | of which egress | compute-bound at |"
    )
    print("|---|---|---|---|---|---|---|---|")
    for label, overrides in MODES:
        est = predict_topology(topo, **overrides)
        at = [f"H ≥ {est.min_inner_steps}"] if est.min_inner_steps is not None else []
        if est.min_wan_gbit is not None:
            at.append(f"{est.min_wan_gbit:.3g} Gbit/s")
        regime = est.regime.split(" (")[0]
        print(
            f"| {label} | {est.tokens_per_s:,.0f} | {est.utilization:.1%} | {regime} | "
            f"{est.wall_s / 86400:.1f} d | ${est.cost_usd:,.0f} | ${est.egress_cost_usd:,.0f} | "
            f"{'; '.join(at) or '-'} |"
        )


if __name__ == "__main__":
    main(sys.argv[1] if len(sys.argv) > 1 else "two-clouds")
