"""Speed of the estimator: one prediction, and 100,000 plans in one vectorized call.

    python benchmarks/predict_speed.py [--plans 100000] [--repeat 200]

Prints the median wall-clock of `estimate_step` (one plan, Python scalars) and of
`estimate_step_arrays` on N random plans (numpy arrays), and the median CPU time (the rate on
one dedicated core; wall-clock grows when the machine is shared). Targets: < 1 ms and < 1 s.
"""

from __future__ import annotations

import argparse
import statistics
import time
from collections.abc import Callable, Sequence

import numpy as np

from shardmeter.estimate.plan_arrays import PlanArrays
from shardmeter.estimate.step import estimate_step, estimate_step_arrays, plan_validity
from shardmeter.specs.loader import load_cluster, load_model
from shardmeter.specs.plan import Plan


def timed(fn: Callable[[], object], repeat: int) -> tuple[float, float]:
    """Median wall-clock and median CPU seconds of `repeat` calls after one warm-up call."""
    fn()
    wall, cpu = [], []
    for _ in range(repeat):
        start, start_cpu = time.perf_counter(), time.process_time()
        fn()
        wall.append(time.perf_counter() - start)
        cpu.append(time.process_time() - start_cpu)
    return statistics.median(wall), statistics.median(cpu)


def random_plans(n: int, seed: int = 0) -> PlanArrays:
    """N plans over the usual degrees, batches, sharding, recompute and precision choices."""
    rng = np.random.default_rng(seed)
    dp = rng.choice([1, 2, 4, 8, 16, 32, 64, 128], n)
    micro = rng.choice([1, 2, 4], n)
    return PlanArrays.from_columns(
        dp=dp,
        tp=rng.choice([1, 2, 4, 8], n),
        pp=rng.choice([1, 2, 4, 8], n),
        cp=rng.choice([1, 2], n),
        vpp=1,
        sp=rng.integers(0, 2, n).astype(bool),
        sharding=rng.integers(0, 4, n),
        micro_batch=micro,
        global_batch=dp * micro * rng.choice([1, 4, 16], n),
        recompute=rng.integers(0, 3, n),
        precision=rng.integers(0, 3, n),
    )


def main(argv: Sequence[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--plans", type=int, default=100_000)
    parser.add_argument("--repeat", type=int, default=200)
    args = parser.parse_args(argv)
    model = load_model("llama-3.1-70b")
    cluster = load_cluster("dgx-h100")
    plan = Plan(dp=8, tp=4, pp=4, sp=True, sharding="zero1", global_batch=128)
    one, one_cpu = timed(lambda: estimate_step(model, cluster, plan), args.repeat)
    plans = random_plans(args.plans)
    many, many_cpu = timed(
        lambda: estimate_step_arrays(model, cluster, plans), max(3, args.repeat // 50)
    )
    valid = int(plan_validity(model, plans).sum())
    print(
        f"one prediction (estimate_step):            {one * 1e3:8.3f} ms   (target < 1 ms; "
        f"CPU {one_cpu * 1e3:.3f} ms)"
    )
    print(
        f"{args.plans:,} plans (estimate_step_arrays):  {many:8.3f} s    (target < 1 s; "
        f"CPU {many_cpu:.3f} s; {valid:,} valid, {many / args.plans * 1e6:.2f} µs per plan)"
    )
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
