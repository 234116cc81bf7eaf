"""Regenerate the sweep and comparison plots shipped in docs/img/ (used by docs/islands.md).

Run: `.venv/bin/python benchmarks/islands_plots.py` (about a minute). Each plot is one or more
`shardmeter sweep`s of a shipped topology; the knees they state are printed.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

from shardmeter.analysis import plot_compare, plot_sweep, sweep
from shardmeter.specs.topology import load_topology

OUT = Path(__file__).resolve().parents[1] / "docs" / "img"
BANDWIDTHS = [0.1, 0.2, 0.5, 1, 2, 5, 10, 20, 50, 100, 200, 500, 1000]
MTBFS = [300, 1e3, 3e3, 1e4, 3e4, 1e5, 3e5]

# (topology, knob, run overrides): single sweeps docs/islands.md discusses.
PLOTS: tuple[tuple[str, str, dict[str, Any]], ...] = (
    ("two-clouds", "island_size", {"mode": "sync"}),
    ("two-clouds", "bandwidth", {}),
    ("four-regions", "inner_steps", {}),
)

# (file stem, title, topology, knob, values, metrics, [(label, run overrides)])
COMPARE: tuple[
    tuple[str, str, str, str, list[float], tuple[str, ...], list[tuple[str, dict[str, Any]]]], ...
] = (
    (
        "two-clouds-overlap",
        "two clouds: what each overlap hides",
        "two-clouds",
        "bandwidth",
        BANDWIDTHS,
        ("utilization", "cost_usd"),
        [
            ("sync DP, no overlap", {"mode": "sync", "backward_overlap": False}),
            ("sync DP, backward overlap", {"mode": "sync"}),
            ("DiLoCo H=100, blocking", {"mode": "diloco", "backward_overlap": False}),
            ("Streaming P=8, τ=0", {"mode": "streaming", "fragments": 8}),
            ("Streaming P=8, τ=1", {"mode": "streaming", "fragments": 8, "overlap_steps": 1}),
            ("DiLoCo H=100, eager", {"mode": "diloco", "outer_overlap": True}),
        ],
    ),
    (
        "two-clouds-payloads",
        "two clouds, sync DP: payload families",
        "two-clouds",
        "bandwidth",
        BANDWIDTHS,
        ("utilization", "cost_usd"),
        [
            ("dense bf16", {"mode": "sync"}),
            ("low-rank, rank 4", {"mode": "sync", "payload": "lowrank:rank=4"}),
            ("sign + scale per 128", {"mode": "sync", "payload": "sign"}),
            ("top-1% + int32 index", {"mode": "sync", "payload": "topk:fraction=0.01"}),
            ("DCT top-1/64 (DeMo)", {"mode": "sync", "payload": "dct_topk:fraction=0.015625"}),
        ],
    ),
    (
        "eight-heterogeneous-churn",
        "eight islands: failures, restarts (10 min) and checkpoints (2 min)",
        "eight-heterogeneous",
        "gpu_mtbf",
        MTBFS,
        ("goodput", "wall_s", "cost_usd"),
        [
            ("sync DP", {"mode": "sync", "failures": "restart_s=600,checkpoint_s=120"}),
            (
                "DiLoCo H=100 (a failure stalls all)",
                {"mode": "diloco", "failures": "restart_s=600,checkpoint_s=120"},
            ),
            (
                "DiLoCo, quorum 6 of 8, 60 s grace",
                {
                    "mode": "diloco",
                    "failures": "restart_s=600,checkpoint_s=120,quorum=6,grace_s=60",
                },
            ),
            ("async", {"mode": "async", "failures": "restart_s=600,checkpoint_s=120"}),
        ],
    ),
)


def main() -> None:
    for name, knob, overrides in PLOTS:
        result = sweep(load_topology(name), knob, **overrides)
        for path in plot_sweep(result, OUT, formats=("png",)):
            print(f"wrote {path.relative_to(OUT.parents[1])} ({path.stat().st_size // 1024} KiB)")
        for knee in result.knees:
            print(f"  {knee.text}")
    for stem, title, topo, knob, values, metrics, lines in COMPARE:
        results = [
            (label, sweep(load_topology(topo), knob, values, **overrides))
            for label, overrides in lines
        ]
        path = plot_compare(results, OUT / f"{stem}.png", title=title, metrics=metrics)
        print(f"wrote {path.relative_to(OUT.parents[1])} ({path.stat().st_size // 1024} KiB)")
        for label, res in results:
            print(f"  {label}: {res.knees[-1].text}")


if __name__ == "__main__":
    main()
