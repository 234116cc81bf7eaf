"""Plan to train, end to end: which method reaches a target loss soonest and cheapest?

    python benchmarks/plan_to_train.py                    # eight-island topology, 3 methods
    python benchmarks/plan_to_train.py --out runs/p2t --steps-per-worker 60   # quicker

1. ShardMeter predicts each island's inner-step and pseudo-gradient exchange time for the
   planned model; heloco.topology turns them into simulated paces and comm delays.
2. HeLoCo, async Nesterov and sync DiLoCo are simulated (tiny model, same token budget) on the
   multilingual corpus (shared data/multilingual; the built-in synthetic corpus if absent).
3. heloco.plan_to_train puts each loss curve on predicted wall-clock and dollars: hours, cost
   and tokens/s to the target loss, plus a PNG/SVG plot.
4. shardmeter.quality reads the runs back as quality factors (tokens to the target relative to
   sync), and the planner's plans are re-ranked by predicted time to the target loss.
Outputs go to --out (default runs/plan_to_train): one folder per method, plan_to_train.json,
plan_to_train.png/.svg and quality_ranking.json.
"""

from __future__ import annotations

import argparse
import json
import sys
import time
from pathlib import Path
from typing import Any

import torch
from rich.console import Console
from rich.table import Table

from heloco.config import load_config
from heloco.metrics import atomic_write_json
from heloco.plan_to_train import plan_to_train, plot, render, write_result
from heloco.sim import run_simulation
from heloco.topology import PaceMap, pace_map, write_pace_map
from shardmeter.errors import UserInputError
from shardmeter.estimate.islands import predict_topology
from shardmeter.paths import missing_shared_reason, shared_path
from shardmeter.quality import (
    RankedPlan,
    quality_factors,
    ranked_json,
)
from shardmeter.report.quality import render_ranked
from shardmeter.search import OuterOptions
from shardmeter.search.to_target import plan_to_target
from shardmeter.specs.topology import load_topology

METHODS = ("heloco", "async-nesterov", "sync")
SEQ_TOKENS = 4 * 64  # default preset: batch 4 × 64 tokens per inner step
console = Console()


def pace_table(pm: PaceMap) -> Table:
    t = Table(title=f"Paces of {pm.topology} for {pm.planned_model} (scale {pm.scale:.3f} s/sim s)")
    for col in ("island", "accelerator", "GPUs", "T_inner s", "T_comm s", "pace", "delay"):
        t.add_column(col, justify="left" if col in ("island", "accelerator") else "right")
    for i in pm.islands:
        t.add_row(
            i.name,
            i.accelerator,
            str(i.n_gpus),
            f"{i.inner_step_s:.3f}",
            f"{i.comm_s:.2f}",
            f"{i.pace:.3f}",
            f"{i.comm_delay:.3f}",
        )
    return t


def simulate(method: str, pm: PaceMap, args: argparse.Namespace, data_dir: Path | None) -> Path:
    """One simulated run on the topology's paces; returns its run folder."""
    k = len(pm.islands)
    out = args.out / method
    overrides: dict[str, Any] = {
        "method": method,
        "workers": k,
        "paces": pm.paces,
        "comm_delays": pm.comm_delays,
        "inner_steps": args.inner_steps,
        "token_budget": k * args.steps_per_worker * SEQ_TOKENS,
        "eval_every": k * args.inner_steps * SEQ_TOKENS,
        "eval_windows": args.eval_windows,
        "data.data_dir": None if data_dir is None else str(data_dir),
        "inner.total_steps": 2 * args.steps_per_worker,
        "seed": args.seed,
        "out_dir": str(out),
    }
    cfg = load_config(None, "default", overrides)
    write_pace_map(pm, out)
    t0 = time.perf_counter()
    result = run_simulation(cfg)
    s = result.summary
    console.print(
        f"  {method:15s} loss {result.evals[0].loss:.3f} -> {s.final_loss:.3f}, "
        f"{s.updates} updates, simulated {s.time:,.0f} s, {time.perf_counter() - t0:.0f} s real"
    )
    return out


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawTextHelpFormatter)
    ap.add_argument("--topology", default="eight-heterogeneous")
    ap.add_argument("--planned-model", help="ShardMeter model preset (default: the topology's)")
    ap.add_argument("--methods", default=",".join(METHODS))
    ap.add_argument("--inner-steps", type=int, default=10, help="H of the simulation and plans")
    ap.add_argument("--steps-per-worker", type=int, default=120, help="token budget / (K·batch)")
    ap.add_argument("--eval-windows", type=int, default=24, help="validation windows per language")
    ap.add_argument("--target-loss", type=float, help="default: the lowest loss every run reaches")
    ap.add_argument(
        "--loss-key",
        choices=("loss", "cycle_loss"),
        default="loss",
        help="eval field raced to the target (cycle_loss smooths async oscillation)",
    )
    ap.add_argument("--seed", type=int, default=42)
    ap.add_argument("--threads", type=int, default=1)
    ap.add_argument("--out", type=Path, default=Path("runs/plan_to_train"))
    args = ap.parse_args(argv)
    torch.set_num_threads(args.threads)
    methods = tuple(m.strip() for m in args.methods.split(",") if m.strip())
    if "sync" not in methods:
        raise UserInputError("--methods", args.methods, "must include 'sync' (the reference)")

    pm = pace_map(args.topology, args.planned_model)
    console.print(pace_table(pm))
    data_dir = shared_path("data", "multilingual")
    if data_dir is None:
        console.print(
            f"[yellow]NOTE: {missing_shared_reason('data', 'multilingual')}; "
            "using the built-in synthetic corpus instead.[/]"
        )
    else:
        console.print(f"corpus: {data_dir} (one language per worker, non-IID)")

    console.print(f"simulating {', '.join(methods)} on {len(pm.islands)} workers:")
    run_dirs = [simulate(m, pm, args, data_dir) for m in methods]

    result = plan_to_train(run_dirs, pm, args.target_loss, args.loss_key)
    render(result)
    write_result(result, args.out)
    for path in plot(result, args.out):
        console.print(f"plot: {path}")

    topo = load_topology(args.topology)
    predicted = predict_topology(topo, mode="async", inner_steps=args.inner_steps)
    simulated = {o.method: o.run_tokens_per_s for o in result.outcomes}
    console.print(
        f"cross-check: ShardMeter async throughput {predicted.tokens_per_s:,.0f} tokens/s; "
        + ", ".join(f"{m} on the simulated clock {v:,.0f}" for m, v in simulated.items())
    )

    quality = quality_factors(args.out, result.target_loss, loss_key=args.loss_key)

    def search(mode: str, method: str | None) -> list[RankedPlan]:
        outer = OuterOptions(modes=(mode,), inner_steps=(args.inner_steps,))
        return plan_to_target(quality, method, top_k=3, topology=args.topology, outer=outer)

    ranked = search("diloco", None)  # synchronous: the reference run, q = 1
    for method in methods:
        if method != "sync":
            ranked += search("async", method)
    ranked.sort(key=lambda r: (r.time_to_target_s, r.cost_to_target_usd))
    render_ranked(ranked, quality, top=12)
    atomic_write_json(args.out / "quality_ranking.json", ranked_json(ranked, quality))
    by_tps = max(ranked, key=lambda r: r.candidate.tokens_per_s)
    console.print(
        f"fastest in tokens/s: {by_tps.mode} ({by_tps.method}); "
        f"fastest to loss {quality.target_loss:.4f}: {ranked[0].mode} ({ranked[0].method})"
    )
    used = {i.name for i in getattr(ranked[0].candidate, "islands", ())}
    dropped = [i.name for i in pm.islands if i.name not in used]
    console.print(f"the top plan leaves out: {', '.join(dropped) or 'no island'}")
    console.print(json.dumps({"out": str(args.out)}))
    return 0


if __name__ == "__main__":
    try:
        sys.exit(main())
    except UserInputError as exc:
        print(f"plan_to_train: error: {exc}", file=sys.stderr)
        sys.exit(2)
