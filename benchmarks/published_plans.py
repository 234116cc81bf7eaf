"""Published plans vs the planner: for each measured run in the calibration CSV, search the
plans of that run's GPUs and global batch (same precision and framework features) and compare
the predicted tokens/s of the best found plan with that of the published plan.

Run: .venv/bin/python benchmarks/published_plans.py [--csv PATH] [--limit N]
The search space is widened where needed so it contains the published plan (its micro-batch,
tp, cp, pp, vpp, ep) and plans with the run's framework (its features the search does not
vary), so a gap < 0 would be a planner bug; a gap > 0 is a plan the model predicts to be
faster.
"""

from __future__ import annotations

import argparse
import time
from pathlib import Path

from shardmeter.calibrate import RunSpec, read_rows, run_from_row
from shardmeter.errors import UserInputError
from shardmeter.estimate.step import estimate_step
from shardmeter.paths import missing_shared_reason, shared_path
from shardmeter.report.step import plan_summary
from shardmeter.search import SpaceOptions, plan
from shardmeter.specs.plan import Plan


def space_for(run: RunSpec) -> SpaceOptions:
    """The default space widened to contain the published plan, at its precision."""
    p = run.plan
    d = SpaceOptions()
    return SpaceOptions(
        precisions=(p.precision,),
        micro_batches=tuple(sorted({*d.micro_batches, p.micro_batch})),
        max_tp=max(p.tp, run.cluster.nvlink_domain),
        max_pp=None,
        max_vpp=max(d.max_vpp, p.vpp),
        max_cp=max(d.max_cp, p.cp),
        max_ep=max(d.max_ep, p.ep),
        uneven_layers=True,
        overlap_tp=p.overlap_tp,
        framework=p.framework,
    )


def short(p: Plan) -> str:
    parts = [f"tp{p.tp}", f"pp{p.pp}"]
    if p.vpp > 1:
        parts.append(f"v{p.vpp}")
    if p.cp > 1:
        parts.append(f"cp{p.cp}")
    if p.ep > 1:
        parts.append(f"ep{p.ep}")
    parts.append(f"dp{p.dp}")
    parts.append(f"mb{p.micro_batch}")
    sh = {"none": "ddp", "zero1": "z1", "zero2": "z2", "zero3": "z3"}[p.sharding]
    if p.shard_degree is not None:
        sh += f"/{p.shard_degree}"
    parts.append(sh)
    parts.append({"none": "-", "selective": "sel", "full": "full"}[p.recompute])
    return " ".join(parts)


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__)
    ap.add_argument("--csv", type=Path, default=None)
    ap.add_argument("--limit", type=int, default=None)
    ap.add_argument("--verbose", action="store_true", help="print full plans")
    args = ap.parse_args()
    path = args.csv or shared_path("calibration", "runs.csv")
    if path is None or not Path(path).exists():
        raise SystemExit(missing_shared_reason("calibration", "runs.csv"))
    rows = read_rows(path)[: args.limit]
    head = f"{'run':>4} {'GPUs':>6} {'published plan':<36} {'tok/s/GPU':>9}  {'best found plan':<36} {'tok/s/GPU':>9} {'gap %':>7} {'s':>5}"
    print(head)
    print("-" * len(head))
    gaps: list[float] = []
    oom: list[str] = []
    t_all = time.perf_counter()
    for row in rows:
        try:
            run = run_from_row(row)
        except UserInputError as exc:
            print(f"{row.get('run_id', '?'):>4} skipped: {exc}")
            continue
        pub = estimate_step(run.model, run.cluster, run.plan, check_layers=False)
        cluster = run.cluster
        if not pub.fits:  # the run did fit: give the search the memory the model says it needs
            oom.append(run.run_id)
            acc = cluster.accelerator
            need = acc.model_copy(update={"hbm_gb": pub.memory_bytes / 1e9})
            cluster = cluster.model_copy(update={"accelerator": need})
        t0 = time.perf_counter()
        res = plan(
            run.model,
            cluster,
            gpus=run.plan.n_gpus,
            global_batch=run.plan.global_batch,
            options=space_for(run),
            top_k=1,
        )
        dt = time.perf_counter() - t0
        best = res.best_time
        if best is None:
            print(f"{run.run_id:>4} {run.plan.n_gpus:>6} {short(run.plan):<36} no plan fits")
            continue
        step = best.islands[0].step
        gap = 100.0 * (step.tokens_per_s_per_gpu / pub.tokens_per_s_per_gpu - 1.0)
        gaps.append(gap)
        mark = "" if pub.fits else " *"
        print(
            f"{run.run_id:>4} {run.plan.n_gpus:>6} {short(run.plan):<36} "
            f"{pub.tokens_per_s_per_gpu:>9,.0f}  {short(best.islands[0].plan):<36} "
            f"{step.tokens_per_s_per_gpu:>9,.0f} {gap:>7.1f} {dt:>5.1f}{mark}"
        )
        if args.verbose:
            print(f"      published: {plan_summary(run.plan)}")
            print(f"      best:      {plan_summary(best.islands[0].plan)}")
    print("-" * len(head))
    if gaps:
        worse = sum(g < -1e-9 for g in gaps)
        print(
            f"{len(gaps)} runs in {time.perf_counter() - t_all:.0f} s: best found is at least as fast "
            f"in {len(gaps) - worse}/{len(gaps)}; median gap {sorted(gaps)[len(gaps) // 2]:.1f}%, "
            f"max {max(gaps):.1f}%"
        )
        if oom:
            print(
                f"* {len(oom)} published plans the model predicts out of memory "
                f"({', '.join(oom)}): searched with HBM raised to the published plan's predicted "
                "need"
            )
        else:
            print("no published plan is predicted out of memory")


if __name__ == "__main__":
    main()
