"""Every ShardMeter prediction on the calibration set and on the shipped topologies, saved and
compared: a refactor of the estimator must leave each number equal to 1e-12 (relative).

    python benchmarks/prediction_snapshot.py save before.json   # on the old tree
    python benchmarks/prediction_snapshot.py compare before.json  # on the new tree

What is recorded: every numeric field of the step estimate of each calibration row
(`$SHARED_DIR/calibration/runs.csv`, as `shardmeter validate` predicts it); every numeric field
of `predict_topology` of each shipped topology in each outer mode, without and with failures
(a GPU MTBF of 50,000 h, 600 s restarts); and the ranked plans of a small topology search
(`search_topology` over each shipped topology's islands, top 10 by wall time, without and with
failures). `compare` prints each key that moved by more than 1e-12 relative, then a count.
"""

from __future__ import annotations

import argparse
import dataclasses
import json
import math
import os
import sys
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT / "src"))

import shardmeter as sm  # noqa: E402
from shardmeter.calibrate import evaluate_rows, read_rows  # noqa: E402
from shardmeter.estimate.islands import with_run  # noqa: E402
from shardmeter.search.options import Constraints, OuterOptions, SpaceOptions  # noqa: E402
from shardmeter.search.topology import search_topology  # noqa: E402

SHARED = Path(os.environ.get("SHARED_DIR", ROOT.parent / "shared"))
MODES = ("sync", "diloco", "streaming", "async")
FAILURES = "gpu_mtbf_hours=50000,restart_s=600"


def flatten(value: Any, prefix: str, out: dict[str, float]) -> None:
    """Every number inside `value` (dataclasses, mappings, sequences) under a dotted key."""
    if isinstance(value, bool | int | float):
        out[prefix] = float(value)
    elif dataclasses.is_dataclass(value) and not isinstance(value, type):
        for f in dataclasses.fields(value):
            flatten(getattr(value, f.name), f"{prefix}.{f.name}", out)
    elif isinstance(value, dict):
        for k, v in value.items():
            flatten(v, f"{prefix}.{k}", out)
    elif isinstance(value, list | tuple):
        for i, v in enumerate(value):
            flatten(v, f"{prefix}[{i}]", out)


def snapshot(search: bool) -> dict[str, float]:
    out: dict[str, float] = {}
    for res in evaluate_rows(read_rows(SHARED / "calibration" / "runs.csv")):
        if res.estimate is not None:
            flatten(res.estimate, f"calibration.{res.run_id}", out)
    for name in ("two-clouds", "four-regions", "eight-heterogeneous", "intellect1"):
        topo = sm.load_topology(name)
        for mode in MODES:
            for label, failures in (("", None), ("+failures", FAILURES)):
                try:
                    est = sm.predict_topology(topo, mode=mode, failures=failures)
                except sm.UserInputError as exc:
                    out[f"topology.{name}.{mode}{label}.error:{exc}"] = 0.0
                    continue
                flatten(est, f"topology.{name}.{mode}{label}", out)
        if not search:
            continue
        for label, failures in (("", None), ("+failures", FAILURES)):
            t = topo if failures is None else with_run(topo, failures=failures)
            res = search_topology(
                t,
                options=SpaceOptions(),
                outer=OuterOptions(inner_steps=(50, 500), bits=(4, 16)),
                constraints=Constraints(),
                top_k=10,
            )
            for i, cand in enumerate(res.ranked):
                key = f"search.{name}{label}[{i}]"
                for f in ("wall_s", "cost_usd", "tokens_per_s", "utilization", "mfu"):
                    out[f"{key}.{f}"] = float(getattr(cand, f))
                out[f"{key}.mode:{cand.outer.mode}"] = 0.0
                out[f"{key}.gpus:{[c.n_gpus for c in cand.islands]}"] = 0.0
    return out


def compare(before: dict[str, float], after: dict[str, float]) -> int:
    moved = 0
    for key in sorted(set(before) | set(after)):
        a, b = before.get(key), after.get(key)
        if a is None or b is None:
            print(f"{'only before' if b is None else 'only after'}: {key}")
            moved += 1
            continue
        same = (math.isnan(a) and math.isnan(b)) or a == b
        if not same and not (abs(a - b) <= 1e-12 * max(abs(a), abs(b))):
            print(f"{key}: {a!r} -> {b!r} ({(b - a) / a if a else math.inf:+.3e})")
            moved += 1
    print(f"{len(before)} before, {len(after)} after, {moved} moved beyond 1e-12")
    return 1 if moved else 0


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("action", choices=("save", "compare"))
    ap.add_argument("path")
    ap.add_argument("--no-search", action="store_true", help="skip the topology searches")
    args = ap.parse_args()
    now = snapshot(search=not args.no_search)
    if args.action == "save":
        Path(args.path).write_text(json.dumps(now, indent=0, sort_keys=True))
        print(f"{len(now)} numbers saved to {args.path}")
        return 0
    return compare(json.loads(Path(args.path).read_text()), now)


if __name__ == "__main__":
    raise SystemExit(main())
