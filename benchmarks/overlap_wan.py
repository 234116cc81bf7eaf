"""Blocking vs overlapped (vs streaming) exchange in real runs over an emulated WAN:
utilization and loss.

    sudo python benchmarks/overlap_wan.py                      # 10 Mbit/s, 20 ms, 2 workers
    sudo python benchmarks/overlap_wan.py --wan "bw=5Mbit,rtt=40ms" --budget 51200
    sudo python benchmarks/overlap_wan.py --modes blocking,overlapped,streaming --seeds 0,1,2

Runs `heloco launch --wan SPEC --exchange MODE` once per mode and seed (root: network
namespaces and tc, docs/wan.md; streaming with `--fragments P`) on the default config with
paced workers, then reads each worker's `round`
events: its span (first round's start to last round's end, run seconds), the compute inside
it (the rounds' compute_start..compute_end), utilization = compute / span, and the run's
final validation loss at the same token budget (a streaming round is a sub-round of H/P
steps: one fragment's push). Wall-clock figures: they move with the
machine's load, so run it on a quiet machine and report `uptime` beside them.
"""

from __future__ import annotations

import argparse
import json
import shutil
import subprocess
import sys
import tempfile
from pathlib import Path


def worker_rows(out: Path) -> list[tuple[int, int, float, float]]:
    """(worker, rounds, span s, compute s) from a run folder's round events."""
    events = [json.loads(line) for line in (out / "events.jsonl").read_text().splitlines()]
    rounds = [e for e in events if e.get("type") == "round" and "compute_start" in e]
    rows = []
    for w in sorted({e["worker"] for e in rounds}):
        mine = [e for e in rounds if e["worker"] == w]
        span = mine[-1]["time"] - mine[0]["start"]
        compute = sum(e["compute_end"] - e["compute_start"] for e in mine)
        rows.append((w, len(mine), span, compute))
    return rows


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--wan", default="bw=10Mbit,rtt=20ms", help="link spec of every worker")
    ap.add_argument("--paces", default="0.05,0.05", help="seconds per inner step per worker")
    ap.add_argument("--budget", type=int, default=102400, help="token budget of each run")
    ap.add_argument(
        "--modes",
        default="blocking,overlapped",
        help="exchange modes, comma-separated: blocking, overlapped, streaming",
    )
    ap.add_argument("--fragments", type=int, default=2, help="streaming: fragments P")
    ap.add_argument("--seeds", default="", help="seeds, comma-separated (default: the config's)")
    args = ap.parse_args()
    modes = [m.strip() for m in args.modes.split(",") if m.strip()]
    for m in modes:
        if m not in ("blocking", "overlapped", "streaming"):
            print(f"overlap_wan: --modes: got {m!r}; blocking, overlapped or streaming")
            return 2
    seeds = [s.strip() for s in args.seeds.split(",") if s.strip()] or [None]
    heloco = shutil.which("heloco") or str(Path(sys.executable).with_name("heloco"))
    print(f"--wan {args.wan}, paces {args.paces}, token budget {args.budget}\n")
    print(f"{'mode':<11} {'seed':>4} {'worker':>6} {'rounds':>6} {'span s':>7} {'compute s':>9} "
          f"{'util':>5}  {'final loss':>10}")  # fmt: skip
    with tempfile.TemporaryDirectory() as tmp:
        for mode, seed in ((m, s) for s in seeds for m in modes):
            out = Path(tmp) / f"{mode}-{seed}"
            cmd = [heloco, "launch", "--workers", str(len(args.paces.split(","))),
                   "--paces", args.paces, "--set", f"token_budget={args.budget}",
                   "--set", "threads=1", "--wan", args.wan, "--exchange", mode,
                   "--quiet", "--out", str(out)]  # fmt: skip
            if mode == "streaming":
                cmd += ["--fragments", str(args.fragments)]
            if seed is not None:
                cmd += ["--set", f"seed={seed}"]
            done = subprocess.run(cmd, capture_output=True, text=True, check=False)
            if done.returncode != 0:
                print(f"{mode}: heloco launch failed: {done.stderr.strip()[-500:]}")
                return 1
            loss = json.loads((out / "summary.json").read_text())["final_loss"]
            for w, n, span, compute in worker_rows(out):
                util = compute / span if span > 0 else float("nan")
                print(f"{mode:<11} {seed or '-':>4} {w:>6} {n:>6} {span:>7.2f} {compute:>9.2f} "
                      f"{util:>5.2f}  {loss:>10.4f}")  # fmt: skip
    return 0


if __name__ == "__main__":
    sys.exit(main())
