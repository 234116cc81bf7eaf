"""Regenerate the sweep plots shipped in docs/img/ (used by docs/islands.md).

Run: `.venv/bin/python benchmarks/islands_plots.py` (a few seconds). Each plot is the
`shardmeter sweep` of one shipped topology; the knees it states are printed.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

from shardmeter.analysis import plot_sweep, sweep
from shardmeter.specs.topology import load_topology

OUT = Path(__file__).resolve().parents[1] / "docs" / "img"

# (topology, knob, run overrides): the three pictures docs/islands.md discusses.
PLOTS: tuple[tuple[str, str, dict[str, Any]], ...] = (
    ("two-clouds", "island_size", {"mode": "sync"}),
    ("two-clouds", "bandwidth", {}),
    ("four-regions", "inner_steps", {}),
)


def main() -> None:
    for name, knob, overrides in PLOTS:
        result = sweep(load_topology(name), knob, **overrides)
        for path in plot_sweep(result, OUT, formats=("png",)):
            print(f"wrote {path.relative_to(OUT.parents[1])} ({path.stat().st_size // 1024} KiB)")
        for knee in result.knees:
            print(f"  {knee.text}")


if __name__ == "__main__":
    main()
