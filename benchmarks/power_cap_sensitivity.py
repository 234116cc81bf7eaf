"""How the held-out error of a power-capped accelerator's source depends on the capped/uncapped
matmul ratio the model assumes for it (S7: torchtitan on the 500 W H100).

    python benchmarks/power_cap_sensitivity.py                    # S7, ~1 CPU-minute
    python benchmarks/power_cap_sensitivity.py --ratios 0.894,0.8 --iterations 100

Fits every other source (runs.csv and the holdout file, 100 Nelder-Mead iterations from the
Bound starts, as `calibration.py --cv`), then predicts the held-out source with the capped
family's matmul_max set to r × its parent's for each ratio r, and prints median, mean, p90 of
|error| and the signed median, over the source and per accelerator. The default ratios: the
DVFS cube law (P_cap / P_max)^(1/3), the model's own choice (`shardmeter.calibrate.POWER_CAPPED`);
the all-data fit's ratio (the shipped starts); the measured GEMM-loop ratio; a clock linear in
power (a voltage floor).
"""

from __future__ import annotations

import argparse
import sys
from collections.abc import Sequence
from pathlib import Path

import numpy as np

sys.path.insert(0, str(Path(__file__).resolve().parent))
import calibration as bench
from shardmeter import calibrate
from shardmeter.paths import shared_path

CUBE_LAW = (500.0 / 700.0) ** (1.0 / 3.0)  # 0.894
# BF16 GEMM loop, TFLOP/s: the 500 W H100 at 8192³ (FBGEMM PR #2546, 2024-04, "H100 500W"),
# the 700 W H100 SXM at its best shape (ml-engineering MAMF table, CUDA 12.1). Dimensionless.
GEMM_LOOP = 585.23 / 792.1  # 0.739
FITTED = calibrate.FAMILY_START["hopper-500w"] / calibrate.FAMILY_START["hopper"]
RATIOS = (CUBE_LAW, FITTED, GEMM_LOOP, 500.0 / 700.0)


def line(label: str, errors: np.ndarray) -> str:
    ape = np.abs(errors)
    return (f"{label:<26} {len(errors):>3} {100 * np.median(ape):>6.1f}% {100 * ape.mean():>6.1f}% "
            f"{100 * np.percentile(ape, 90):>6.1f}% {100 * np.median(errors):>+7.1f}%")  # fmt: skip


def main(argv: Sequence[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--source", default="S7", help="the held-out source")
    parser.add_argument("--family", default="hopper-500w", help="the power-capped family")
    parser.add_argument("--ratios", default=",".join(f"{r:.3f}" for r in RATIOS))
    parser.add_argument("--iterations", type=int, default=100)
    args = parser.parse_args(argv)
    runs, _ = bench.load_runs(shared_path("calibration", "runs.csv"))
    extra, _ = bench.load_runs(bench.HOLDOUT)
    every = runs + extra
    train = [r for r in every if r.source_id != args.source]
    test = [r for r in every if r.source_id == args.source]
    fold, _ = calibrate.fit(train, iterations=args.iterations)
    parent, _ = calibrate.POWER_CAPPED[args.family]
    chips = sorted({r.cluster.accelerator.name for r in test})
    print(
        f"{args.source} held out; {args.family} matmul_max = r × {parent}'s "
        f"({fold.matmul_max[parent]:.4f})"
    )
    print(f"{'r / accelerator':<26} {'n':>3} {'median':>7} {'mean':>7} {'p90':>7} {'signed':>8}")
    for ratio in (float(x) for x in args.ratios.split(",")):
        calibrate.POWER_CAPPED[args.family] = (parent, ratio**3)
        predicted = calibrate.predictions(test, fold)
        errors = np.array([p / r.measured - 1.0 for p, r in zip(predicted, test, strict=True)])
        print(line(f"r = {ratio:.3f}", errors))
        for chip in chips:
            mine = np.array([e for e, r in zip(errors, test, strict=True)
                             if r.cluster.accelerator.name == chip])  # fmt: skip
            print(line(f"  {chip}", mine))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
