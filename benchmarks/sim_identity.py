"""Are two source trees' simulated results bit-identical? Runs a handful of small simulations
that cover every branch of the simulated clock under both trees and compares them exactly.

    git archive BASE src | tar -x -C /tmp/base               # the tree to compare against
    python benchmarks/sim_identity.py --base /tmp/base/src   # this tree's src/ against it

Cases: asynchronous HeLoCo with a token budget and with a time budget (jittered paces), sync
DiLoCo with each budget, DN with DyLU, MLA with arrival balancing in grace windows, and async
Nesterov in grace windows with a time budget, one round at a time. Each is compared on every
evaluation (tokens, simulated time, loss) and a SHA-256 of the final parameters. Exit 1 if any
differs. A few seconds per tree on 2 cores.
"""

from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]

CASES: list[dict[str, object]] = [
    {"method": "heloco", "token_budget": 12000},
    {"method": "heloco", "time_budget": 40.0, "paces": [1, 2, 3, 1.5, 4], "pace_jitter": 0.3},
    {"method": "sync", "token_budget": 12000},
    {"method": "sync", "time_budget": 30.0, "paces": [1, 2, 3, 1.5, 4]},
    {"method": "dn-dylu", "token_budget": 12000, "paces": [1, 3, 3, 1, 2]},
    {"method": "mla+ab", "token_budget": 12000, "grace_window": 2.0, "paces": [1, 1, 2, 2, 3]},
    {
        "method": "async-nesterov",
        "time_budget": 25.0,
        "grace_window": 1.5,
        "paces": [1, 1, 2, 2, 3],
        "batch": "off",
    },
]
COMMON = {
    "inner_steps": 3,
    "eval_every": 600,
    "eval_windows": 4,
    "threads": 1,
    "data.synthetic_chars_per_language": 30000,
    "data.val_chars_per_language": 5000,
}

CHILD = """
import hashlib, json, sys
from heloco.config import load_config
from heloco.sim import run_simulation
out = []
for case in json.loads(sys.argv[1]):
    r = run_simulation(load_config(None, "default", case))
    h = hashlib.sha256()
    for k, v in r.params.items():
        h.update(k.encode())
        h.update(v.numpy().tobytes())
    out.append({"evals": [[e.tokens, e.time, e.loss] for e in r.evals], "params": h.hexdigest()})
print(json.dumps(out))
"""


def results(src: Path) -> list[dict[str, object]]:
    """Every case's evaluations and parameter digest, simulated by the tree at ``src``."""
    cases = json.dumps([COMMON | case for case in CASES])
    env = {**os.environ, "PYTHONPATH": str(src.resolve())}
    proc = subprocess.run(
        [sys.executable, "-c", CHILD, cases], env=env, capture_output=True, text=True, check=True
    )
    out: list[dict[str, object]] = json.loads(proc.stdout)
    return out


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--base", type=Path, required=True, help="the other tree's src/ folder")
    ap.add_argument("--src", type=Path, default=ROOT / "src", help="this tree's src/ folder")
    args = ap.parse_args()
    mine, base = results(args.src), results(args.base)
    differ = 0
    print(f"{'case':<58} {'evals':>5}  identical")
    for case, a, b in zip(CASES, mine, base, strict=True):
        same = a == b
        differ += not same
        label = ", ".join(f"{k}={v}" for k, v in case.items())
        print(f"{label[:58]:<58} {len(a['evals']):>5}  {'yes' if same else 'NO'}")  # type: ignore[arg-type]
    print(f"\n{differ} case(s) differ")
    return 1 if differ else 0


if __name__ == "__main__":
    raise SystemExit(main())
