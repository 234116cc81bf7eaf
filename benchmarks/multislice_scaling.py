"""How measured TPU multislice steps grow with the slice count, against the model.

    python benchmarks/multislice_scaling.py            # shipped presets, no fit (a second)

For every model of a TPU source published at more than one slice count (H8: MaxText on v5e-256
slices over DCN, 1-32 slices; H4: v5p, 1-2 slices), per slice count: the measured step (s, from
tokens/s per chip), the model's step, the model's DCN hand-off stall (`dcn_stall`, the
cross-slice all-reduce's host hand-offs, docs/model.md), and both steps' growth over the
one-slice step in ms per decoder layer. The last lines fit that growth, for 2 slices and more,
as `a + b·(slices − 1)` per layer (least squares): `b` is ms per layer and added slice.
"""

from __future__ import annotations

import sys
from collections import defaultdict
from pathlib import Path

import numpy as np

sys.path.insert(0, str(Path(__file__).resolve().parent))

from calibration import HOLDOUT, load_runs
from shardmeter.calibrate import Calibration, RunSpec, families_of, predict_run
from shardmeter.estimate.memory import end_stage_tables, shard_divisors
from shardmeter.estimate.plan_arrays import PlanArrays
from shardmeter.estimate.step import dcn_stall_time
from shardmeter.specs.hardware import Cluster


def measured_step_s(run: RunSpec, tokens_per_step: float) -> float:
    """Seconds per step from the published tokens/s per chip."""
    return tokens_per_step / (run.measured * run.plan.n_gpus)


def stall_s(run: RunSpec, cluster: Cluster) -> float:
    """The model's DCN hand-off stall of the run's step, s (one stage: pp = 1 in these rows)."""
    plans = PlanArrays.scalar(run.plan)
    layers = run.model.n_layers / run.plan.pp
    tables = end_stage_tables(run.model, plans)
    return float(dcn_stall_time(run.model, cluster, plans, shard_divisors(plans), layers, tables))


def main() -> int:
    runs, _ = load_runs(HOLDOUT)
    calibration = Calibration.start(families_of(runs))
    groups: dict[tuple[str, str], list[RunSpec]] = defaultdict(list)
    for run in runs:
        if run.cluster.ici_axes is not None:
            groups[(run.source_id, run.model.name)].append(run)
    print(f"{'src':<4}{'model':<22}{'slices':>6}{'meas s':>8}{'model s':>8}{'stall s':>8}"
          f"{'meas ms/L':>10}{'model ms/L':>11}")  # fmt: skip
    fits: list[tuple[str, str, float, float, float, float]] = []
    for (source, name), group in sorted(groups.items()):
        slices = sorted({r.plan.n_gpus // r.cluster.nvlink_domain for r in group})
        if len(slices) < 2:
            continue
        group.sort(key=lambda r: r.plan.n_gpus)
        rows = []
        for run in group:
            cluster = calibration.apply(run.cluster)
            est = predict_run(run, cluster)
            rows.append((run.plan.n_gpus // run.cluster.nvlink_domain,
                         measured_step_s(run, est.tokens_per_step), est.step_time_s,
                         stall_s(run, cluster)))  # fmt: skip
        layers = group[0].model.n_layers
        meas1, model1 = rows[0][1], rows[0][2]
        for s, meas, model, stall in rows:
            print(f"{source:<4}{name[:21]:<22}{s:>6}{meas:>8.2f}{model:>8.2f}{stall:>8.2f}"
                  f"{1e3 * (meas - meas1) / layers:>10.1f}{1e3 * (model - model1) / layers:>11.1f}")  # fmt: skip
        many = [(s, m, p) for s, m, p, _ in rows if s >= 2]
        if len(many) >= 2:
            x = np.array([s - 1.0 for s, _, _ in many])
            design = np.vstack([np.ones_like(x), x]).T
            meas_d = np.array([1e3 * (m - meas1) / layers for _, m, _ in many])
            model_d = np.array([1e3 * (p - model1) / layers for _, _, p in many])
            (a_m, b_m), *_ = np.linalg.lstsq(design, meas_d, rcond=None)
            (a_p, b_p), *_ = np.linalg.lstsq(design, model_d, rcond=None)
            fits.append((source, name, a_m, b_m, a_p, b_p))
    print("\ngrowth per layer over one slice, 2+ slices: a + b·(slices − 1), ms")
    print(f"{'src':<4}{'model':<22}{'meas a':>8}{'meas b':>8}{'model a':>9}{'model b':>9}")
    for source, name, a_m, b_m, a_p, b_p in fits:
        print(f"{source:<4}{name[:21]:<22}{a_m:>8.1f}{b_m:>8.2f}{a_p:>9.1f}{b_p:>9.2f}")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
