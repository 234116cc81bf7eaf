"""Planner speed: vectorized plan evaluations per second, complete searches, and the speed-up
over a plain Python loop of `predict`.

Run: .venv/bin/python benchmarks/search_speed.py
     .venv/bin/python benchmarks/search_speed.py --turns   # only section 4, a few seconds
"Per CPU-second" divides by the process's CPU time (`time.process_time`), i.e. the rate on one
dedicated core; wall-clock rates are printed too (they drop when the machine is shared).
"""

from __future__ import annotations

import os
import sys
import time

import numpy as np

from shardmeter.predict import predict
from shardmeter.search import SpaceOptions, plan
from shardmeter.search.cluster import FrontPolicy
from shardmeter.search.evaluate import EvalJob, evaluate_work, plan_work
from shardmeter.search.options import Constraints
from shardmeter.search.space import make_plan
from shardmeter.specs.loader import load_cluster, load_model

MODEL = "llama-3.1-405b"
CLUSTER = "dgx-h100"
GPUS = 16384
BATCH = 2048  # sequences of 8192 tokens: Llama 3.1's 16M-token batch (Dubey et al. 2024, §3.4)
SPACE = SpaceOptions(precisions=("bf16", "fp8"))


def machine_check() -> None:
    """How fast this machine runs one numpy element-wise op right now (context for rates)."""
    a, b = np.random.rand(32768), np.random.rand(32768)
    c0 = time.process_time()
    for _ in range(2000):
        np.multiply(a, b)
    ns = (time.process_time() - c0) / (2000 * a.size) * 1e9
    load = os.getloadavg()[0] if hasattr(os, "getloadavg") else float("nan")
    print(
        f"0. Machine: np.multiply on 32k float64 takes {ns:.2f} ns/element per CPU-second "
        f"(load average {load:.1f} on {os.cpu_count()} cores)"
    )
    print()


def raw_rate(repeats: int = 7) -> float:
    """Every plan of the 405B space at three batches, no pruning: estimator throughput.
    Repeated; the median and best of the repeats are printed (the machine is shared)."""
    model, cluster = load_model(MODEL), load_cluster(CLUSTER)
    batches = (1024, 2048, 4096)
    budget = cluster.accelerator.hbm_gb * 1e9
    work, _ = plan_work(model, cluster, [GPUS], batches, SPACE, budget)
    job = EvalJob(model, cluster, False, budget, prune=False)
    cpu_rates, wall_rates, loop_rates = [], [], []
    for _ in range(repeats):
        policy = FrontPolicy(1e12, model.seq_len, cluster.price_per_gpu_hour, 20, Constraints())
        c0 = time.process_time()
        counts = evaluate_work(job, work, policy)
        loop_rates.append(counts.runnable / (time.process_time() - c0))
        cpu_rates.append(counts.runnable / counts.eval_cpu_s)
        wall_rates.append(counts.runnable / counts.eval_wall_s)
    print("1. Vectorized evaluation (estimate_step_arrays on broadcast grids, no pruning)")
    print(f"   {MODEL} on {GPUS} × {CLUSTER}, batches {batches}, bf16+fp8, {repeats} repeats")
    print(f"   plans evaluated per repeat  {counts.evaluated:>12,}")
    print(f"   {'':28}{'median':>12} {'best':>12}")
    for label, rates in (
        ("evals / CPU-s (estimator)", cpu_rates),
        ("evals / wall-s (estimator)", wall_rates),
        ("plans / CPU-s (whole loop)", loop_rates),
    ):
        print(f"   {label:<28}{np.median(rates):>12,.0f} {max(rates):>12,.0f}")
    print()
    return float(np.median(cpu_rates))


def complete_searches() -> None:
    print("2. Complete searches (enumerate, bound, evaluate, rank, front, explain)")
    for label, kwargs in (
        (
            f"{MODEL} on {GPUS} × H100 (one cluster), batch {BATCH}, bf16+fp8",
            dict(model=MODEL, cluster=CLUSTER, gpus=GPUS, global_batch=BATCH, options=SPACE),
        ),
        (
            "eight-heterogeneous islands (llama-3-8b, 184 GPUs, 4 outer modes)",
            dict(topology="eight-heterogeneous"),
        ),
    ):
        w0, c0 = time.perf_counter(), time.process_time()
        res = plan(**kwargs)  # type: ignore[arg-type]
        wall, cpu = time.perf_counter() - w0, time.process_time() - c0
        st = res.stats
        best = res.best_time
        print(f"   {label}")
        print(
            f"     space {st.space:,}; pruned memory {st.pruned_memory:,}, bound "
            f"{st.pruned_bound:,}; evaluated {st.evaluated:,}; outer combos {st.outer_combinations:,}"
        )
        print(f"     wall {wall:.2f} s, CPU {cpu:.2f} s")
        if best is not None:
            print(
                f"     fastest: {best.wall_s / 86400:.1f} days, ${best.cost_usd:,.0f}, MFU {best.mfu:.1%}"
            )
    print()


def versus_predict_loop(vec_rate: float, sample: int = 300) -> None:
    """The same plans through a Python loop of `predict` (one plan per call)."""
    model, cluster = load_model(MODEL), load_cluster(CLUSTER)
    opts = SpaceOptions(precisions=("bf16", "fp8"), uneven_layers=False)
    budget = cluster.accelerator.hbm_gb * 1e9
    work, _ = plan_work(model, cluster, [GPUS], (BATCH,), opts, budget)
    rng = np.random.default_rng(0)
    picks = []
    for _ in range(sample):
        w = work[int(rng.integers(len(work)))]
        r, k = int(rng.integers(len(w.rows))), int(rng.integers(len(w.sync)))
        if w.rows.dp[r] % w.sync.shard_group[k] == 0:
            picks.append(
                make_plan(
                    w.rows, r, int(w.sync.sharding[k]), int(w.sync.shard_group[k]), BATCH, False
                )
            )
    c0 = time.process_time()
    loop = [predict(model, cluster, p).step_time_s for p in picks]
    loop_cpu = time.process_time() - c0
    loop_rate = len(picks) / loop_cpu
    from shardmeter.estimate.plan_arrays import PlanArrays
    from shardmeter.estimate.step import estimate_step_arrays

    vec = estimate_step_arrays(model, cluster, PlanArrays.from_plans(picks)).step_time_s
    diff = float(np.max(np.abs(np.asarray(vec) / np.asarray(loop) - 1.0)))
    print(f"3. Side by side on {len(picks)} sampled plans of the same space")
    print(f"   Python loop over predict()  {loop_rate:>12,.0f} plans / CPU-s")
    print(f"   vectorized grid evaluation  {vec_rate:>12,.0f} plans / CPU-s (median of 1.)")
    print(f"   speed-up                    {vec_rate / loop_rate:>12,.0f}×")
    print(f"   max relative difference of step times: {diff:.2e}")


def turns_estimate() -> None:
    """docs/wan.md's four islands pushing an 8B model through one 1 Gbit/s hub link, taking
    turns, blocking and overlapped: every configuration the estimate's threshold searches
    evaluate runs the turns' event schedule (`convoy.turn_convoy`), which they therefore
    bisect."""
    import shardmeter.estimate.outer as outer
    from shardmeter.estimate.islands import predict_topology
    from shardmeter.specs.topology import topology_from_dict

    runs = [0]
    schedule = outer.turn_convoy

    def counted(*args: object, **kwargs: object) -> object:
        runs[0] += 1
        return schedule(*args, **kwargs)  # type: ignore[arg-type]

    outer.turn_convoy = counted  # type: ignore[assignment]
    print("4. One estimate with turns on a shared server link (docs/wan.md)")
    print(f"   {'exchange':<11}{'schedules':>10}{'wall s':>8}{'round s':>10}{'min H':>7}"
          f"{'Gbit/s bound':>14}{'hidden':>9}")  # fmt: skip
    for exchange in ("blocking", "overlapped"):
        topo = topology_from_dict({
            "run": {"model": "llama-3-8b", "global_batch": 64, "mode": "async",
                    "inner_steps": 10, "bits": 32, "exchange": exchange, "server": "s",
                    "step_time_s": 1.0, "link_slots": True},
            "islands": [{"name": n, "cluster": "dgx-h100"} for n in ("s", "a", "b", "c")],
            "wan": {"kind": "star", "hub": "s", "server_bandwidth_gbit": 1,
                    "default": {"bandwidth_gbit": 10, "latency_ms": 1}},
        })  # fmt: skip
        runs[0] = 0
        w0 = time.perf_counter()
        est = predict_topology(topo)
        wall = time.perf_counter() - w0
        hidden = "-" if est.hide_wan_gbit is None else f"{est.hide_wan_gbit:.1f}"
        bound = "-" if est.min_wan_gbit is None else f"{est.min_wan_gbit:.1f}"
        print(f"   {exchange:<11}{runs[0]:>10,}{wall:>8.1f}{est.round_s:>10.3f}"
              f"{est.min_inner_steps or '-':>7}{bound:>14}{hidden:>9}")  # fmt: skip
    outer.turn_convoy = schedule


if __name__ == "__main__":
    machine_check()
    if "--turns" not in sys.argv[1:]:
        rate = raw_rate()
        complete_searches()
        versus_predict_loop(rate)
    turns_estimate()
