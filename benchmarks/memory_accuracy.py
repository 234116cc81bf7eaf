"""Memory per GPU against published measurements, and how fast `shardmeter fit` answers.

    python benchmarks/memory_accuracy.py

Prints every row of `src/shardmeter/data/calibration/memory.csv` (predicted vs measured, of
the kind the row reports), the error distribution overall, per source and per kind, the OOM
verdicts, and the wall time of `fit_layouts` for Llama 3.1 70B on 64 H100s (best of 5).
"""

from __future__ import annotations

import time

from shardmeter.fit import fit_layouts
from shardmeter.memcheck import (
    DEFAULT_MEMORY_CSV,
    evaluate_memory_rows,
    read_memory_rows,
    summarize_memory,
)
from shardmeter.predict import cluster_for_gpu
from shardmeter.specs.loader import load_model


def main() -> None:
    results = evaluate_memory_rows(read_memory_rows(DEFAULT_MEMORY_CSV))
    print(
        f"{'row':<25}{'src':<5}{'kind':<11}{'measured GiB':>13}{'predicted':>10}{'error':>9}  verdict"
    )
    for r in results:
        if r.predicted is None:
            why = r.skipped or ""
            print(
                f"{r.run_id:<25}{r.source_id:<5}{why if why.startswith('excluded') else 'excluded: ' + why}"
            )
            continue
        meas = (
            {"oom": "OOM", "fit": "fits"}[r.outcome]
            if r.measured is None
            else f"{r.measured / 2**30:.1f}"
        )
        err = "" if r.measured is None else f"{100 * (r.predicted / r.measured - 1):+.1f}%"
        verdict = "right" if r.verdict_ok else "WRONG"
        print(
            f"{r.run_id:<25}{r.source_id:<5}{r.kind:<11}{meas:>13}{r.predicted / 2**30:>10.1f}{err:>9}  {verdict}"
        )
    s = summarize_memory(results)
    print(f"\n{'group':<18}{'n':>4}{'median':>9}{'mean':>9}{'p90':>9}")
    groups = [("all", s.overall), *((f"source {k}", v) for k, v in s.per_source.items()),
              *((f"kind {k}", v) for k, v in s.per_kind.items())]  # fmt: skip
    for name, e in groups:
        print(
            f"{name:<18}{e.n:>4}{100 * e.median_ape:>8.1f}%{100 * e.mean_ape:>8.1f}%{100 * e.p90_ape:>8.1f}%"
        )
    print(f"OOM verdict right on {s.verdicts_right} of {s.verdicts} rows reporting a fit or an OOM")
    model, cluster = load_model("llama-3.1-70b"), cluster_for_gpu("h100-sxm")
    best = float("inf")
    for _ in range(5):
        start = time.perf_counter()
        options = fit_layouts(model, cluster, 64)
        best = min(best, time.perf_counter() - start)
    print(
        f"fit_layouts(llama-3.1-70b, h100-sxm, 64 GPUs): {len(options)} layouts fit, {best * 1e3:.0f} ms"
    )


if __name__ == "__main__":
    main()
