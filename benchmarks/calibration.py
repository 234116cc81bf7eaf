"""Accuracy of ShardMeter against published measured runs, and the fit of its free parameters.

    python benchmarks/calibration.py              # error table with the shipped presets
    python benchmarks/calibration.py --fit        # refit, print parameters and the new table
    python benchmarks/calibration.py --fit --write  # also store them in the preset TOML files
    python benchmarks/calibration.py --cv         # leave-one-source-out cross-validation over
                                                  # runs.csv and benchmarks/holdout_runs.csv
    python benchmarks/calibration.py --cv --cv-out out/cv.csv  # also every held-out row, for
                                                  # benchmarks/cv_residuals.py

The fit (runs.csv and the holdout file together) minimises the source-weighted mean
|log(predicted/measured)| over few, physical parameters: matmul efficiency per accelerator
family with runs (families without runs take the mean of the fitted families), the GEMM
half-efficiency time, attention/matmul ratio, HBM efficiency, FP8 speed-up, NVLink and IB/RoCE
efficiency, overlap slowdown and the MoE host dispatch cost per local expert. No per-row or
per-model factors. `--cv` is the accuracy claim: every source predicted by a fit that never saw
it.
"""

from __future__ import annotations

import argparse
import datetime as dt
import re
import sys
from collections.abc import Sequence
from pathlib import Path

import numpy as np

from shardmeter.calibrate import (
    FAMILIES,
    NIC_PREFIXES,
    NVLINK_PREFIXES,
    PRIOR_EXCLUDED,
    Calibration,
    RowResult,
    RunSpec,
    apply_corrections,
    families_of,
    fit,
    free_parameters,
    leave_one_source_out,
    predictions,
    read_corrections,
    read_rows,
    run_from_row,
    summarize,
    summarize_results,
)
from shardmeter.errors import UserInputError
from shardmeter.io import atomic_write_text
from shardmeter.paths import shared_path
from shardmeter.specs.loader import load_accelerator

DATA = Path(__file__).resolve().parents[1] / "src" / "shardmeter" / "data"
TAIL_APE = 0.20  # --cv lists the held-out rows above this error
HOLDOUT = Path(__file__).resolve().parent / "holdout_runs.csv"
# Plan cells of published runs that the shared CSV leaves blank or to the framework default,
# set from the run's own published configuration (one quote per cell)
CORRECTIONS = Path(__file__).resolve().parent / "runs_corrections.csv"


def load_runs(
    path: Path, corrections: Path | None = CORRECTIONS
) -> tuple[list[RunSpec], list[RowResult]]:
    """Runs of a calibration CSV, with the cells `corrections` sets from each run's own
    published configuration (benchmarks/runs_corrections.csv: document and quote per cell)."""
    runs: list[RunSpec] = []
    skipped: list[RowResult] = []
    rows = read_rows(path)
    if corrections is not None:
        rows, _ = apply_corrections(rows, read_corrections(corrections))
    for row in rows:
        try:
            runs.append(run_from_row(row))
        except UserInputError as exc:
            skipped.append(
                RowResult(row.get("run_id", "?"), row.get("source_id", "?"), None, skipped=str(exc))
            )
    return runs, skipped


def results(runs: Sequence[RunSpec], calibration: Calibration | None) -> list[RowResult]:
    pred = predictions(runs, calibration)
    return [
        RowResult(r.run_id, r.source_id, r.measured, float(p), abs(float(p) / r.measured - 1.0))
        for r, p in zip(runs, pred, strict=True)
    ]


def print_table(runs: Sequence[RunSpec], rows: list[RowResult]) -> None:
    print(f"{'run':>4} {'src':<3} {'model':<34} {'gpu':<19} {'GPUs':>5} "
          f"{'predicted':>10} {'measured':>10} {'error':>8}")  # fmt: skip
    for run, r in zip(runs, rows, strict=True):
        assert r.predicted is not None and r.measured is not None
        print(
            f"{r.run_id:>4} {r.source_id:<3} {run.model.name[:34]:<34} "
            f"{run.cluster.accelerator.name:<19} {run.plan.n_gpus:>5} {r.predicted:>10.1f} "
            f"{r.measured:>10.1f} {100 * (r.predicted / r.measured - 1):>+7.1f}%"
        )
    overall, per_source = summarize_results(rows)
    print("\nAPE        n   median    mean     p90")
    for label, s in [("all", overall), *per_source.items()]:
        print(f"{label:<6} {s.n:>5} {100 * s.median_ape:>7.1f}% {100 * s.mean_ape:>6.1f}% "
              f"{100 * s.p90_ape:>6.1f}%")  # fmt: skip


def _set_keys(text: str, table: str, values: dict[str, object]) -> str:
    """Replace `key = value` lines inside `[table]` of a TOML text (comments elsewhere kept)."""
    start = text.index(f"[{table}]")
    nxt = re.search(r"^\[", text[start + 1 :], flags=re.M)
    end = start + 1 + nxt.start() if nxt else len(text)
    section = text[start:end]
    for key, entry in values.items():
        value, comment = entry if isinstance(entry, tuple) else (entry, None)
        literal = f'"{value}"' if isinstance(value, str) else f"{value:.4g}"
        if comment:
            literal += f"  # {comment}"
        pattern = re.compile(rf"^{re.escape(key)}\s*=.*$", flags=re.M)
        if pattern.search(section):
            section = pattern.sub(f"{key} = {literal}", section)
        else:
            section = section.rstrip("\n") + f"\n{key} = {literal}\n"
    return text[:start] + section + text[end:]


def _accelerator_values(name: str, cal: Calibration, note: str) -> dict[str, object]:
    """[efficiency] entries of one accelerator preset under the calibration, with provenance:
    its family's fitted matmul_max, or the mean over fitted families for a family without runs."""
    acc = load_accelerator(name)
    eff = cal.efficiency(acc)
    family = FAMILIES.get(name, "")
    if family in cal.matmul_max:
        src = f"{family} family {note}"
    else:
        fitted = ", ".join(f for f in sorted(cal.matmul_max) if f not in PRIOR_EXCLUDED)
        src = (
            f"no runs of the {family or name} family: matmul_max = mean achieved/peak of the "
            f"fitted families ({fitted}); shared terms {note}"
        )
    values: dict[str, object] = {
        "matmul_max": round(eff.matmul_max, 4),
        "matmul_half_gflop": round(eff.matmul_half_gflop, 4),
        "memory": round(eff.memory, 4),
        "kernel_launch_us": round(eff.kernel_launch_us, 2),
        "speed_cv": round(eff.speed_cv, 4),
        "attention": round(eff.attention, 4),
        "source": src,
    }
    if "fp8" in acc.peak_tflops:
        values["fp8_speedup"] = round(eff.fp8_speedup, 4)
    return values


def _set_top_level(text: str, key: str, value: float, comment: str) -> str:
    """Set a top-level `key = value  # comment` line (before the first table header)."""
    line = f"{key} = {value:.4g}  # {comment}"
    first_table = re.search(r"^\[", text, flags=re.M)
    head_end = first_table.start() if first_table else len(text)
    head, rest = text[:head_end], text[head_end:]
    pattern = re.compile(rf"^{re.escape(key)}\s*=.*$", flags=re.M)
    if pattern.search(head):
        return pattern.sub(line, head) + rest
    return head.rstrip("\n") + "\n" + line + "\n\n" + rest


def write_presets(cal: Calibration, note: str) -> list[Path]:
    """Store fitted efficiencies in the accelerator [efficiency] tables, the NVLink and
    IB/RoCE link efficiencies and the overlap slowdown of the cluster presets (with a
    provenance comment)."""
    written: list[Path] = []
    for path in sorted((DATA / "accelerators").glob("*.toml")):
        text = path.read_text()
        values = _accelerator_values(path.stem, cal, note)
        atomic_write_text(path, _set_keys(text, "efficiency", values))
        written.append(path)
    for path in sorted((DATA / "clusters").glob("*.toml")):
        text = path.read_text()
        new = text
        for table, prefixes, value in (
            ("intra", NVLINK_PREFIXES, cal.nvlink_efficiency),
            ("inter", NIC_PREFIXES, cal.nic_efficiency),
        ):
            m = re.search(rf"^\[{table}\]\s*\nname\s*=\s*\"([^\"]+)\"", new, re.M)
            if m and m.group(1).startswith(prefixes):
                new = _set_keys(new, table, {"efficiency": (round(value, 4), note)})
        new = _set_top_level(new, "overlap_slowdown", round(cal.overlap_slowdown, 4), note)
        if new != text:
            atomic_write_text(path, new)
            written.append(path)
    return written


CV_COLUMNS: tuple[str, ...] = (
    "run_id", "source_id", "framework", "model", "gpu", "n_gpus", "params_b", "seq_len", "tp",
    "pp", "vpp", "cp", "dp", "ep", "experts", "sharding", "recompute", "precision", "micro_batch",
    "measured", "predicted", "signed_error", "global_batch", "n_layers", "attention",
)  # fmt: skip


def write_cv_rows(path: Path, runs: Sequence[RunSpec], rows: Sequence[RowResult]) -> None:
    """Every held-out row with the inputs the residual analysis groups by (one CSV, atomic)."""
    by_id = {r.run_id: r for r in runs}
    lines = [",".join(CV_COLUMNS)]
    for row in rows:
        if row.predicted is None or row.measured is None:
            continue
        run = by_id[row.run_id]
        plan = run.plan
        values = (
            row.run_id, row.source_id, run.framework, run.model.name, run.cluster.accelerator.name,
            plan.n_gpus, f"{run.model.params_total / 1e9:.3f}", run.model.seq_len, plan.tp,
            plan.pp, plan.vpp, plan.cp, plan.dp, plan.ep,
            run.model.moe.experts if run.model.moe else 0, plan.sharding, plan.recompute,
            plan.precision, plan.micro_batch, f"{row.measured:.6g}", f"{row.predicted:.6g}",
            f"{row.predicted / row.measured - 1.0:.5f}", plan.global_batch, run.model.n_layers,
            plan.attention,
        )  # fmt: skip
        lines.append(",".join('"' + str(v).replace('"', "'") + '"' for v in values))
    path.parent.mkdir(parents=True, exist_ok=True)
    atomic_write_text(path, "\n".join(lines) + "\n")


def print_cv(
    runs: Sequence[RunSpec],
    iterations: int,
    only: Sequence[str] | None,
    out: Path | None = None,
    start_iterations: int = 0,
    start: Calibration | None = None,
) -> None:
    """Leave-one-source-out table: each source predicted by a fit on all the others. With
    `start_iterations`, every fold starts from a fit on all the runs (that many iterations)
    instead of the shipped starts: the protocol's "from the new all-data fit" for a model
    change whose refit is not written yet; `start`, such a fit read back (`read_fit`)."""
    if start is not None:
        print("folds start from the given fit")
    elif start_iterations > 0:
        start, loss = fit(runs, iterations=start_iterations)
        print(f"folds start from an all-data fit ({start_iterations} iterations, loss {loss:.4f})")
    folds = leave_one_source_out(runs, iterations=iterations, only=only, start=start)
    print("leave-one-source-out cross-validation (fit on the other sources, predict this one)")
    print(f"{'held out':<9} {'n':>4} {'median':>8} {'mean':>7} {'p90':>7} {'signed median':>14}")
    every: list[RowResult] = []
    for fold in folds:
        apes = [r.ape for r in fold.rows if r.ape is not None]
        signed = [100 * (r.predicted / r.measured - 1) for r in fold.rows
                  if r.predicted is not None and r.measured]  # fmt: skip
        s = summarize(apes)
        print(f"{fold.source_id:<9} {s.n:>4} {100 * s.median_ape:>7.1f}% {100 * s.mean_ape:>6.1f}% "
              f"{100 * s.p90_ape:>6.1f}% {sorted(signed)[len(signed) // 2]:>+13.1f}%")  # fmt: skip
        every.extend(fold.rows)
    per_source = [summarize([r.ape for r in f.rows if r.ape is not None]) for f in folds]
    overall = summarize([r.ape for r in every if r.ape is not None])
    print(f"{'all rows':<9} {overall.n:>4} {100 * overall.median_ape:>7.1f}% "
          f"{100 * overall.mean_ape:>6.1f}% {100 * overall.p90_ape:>6.1f}%")  # fmt: skip
    medians = sorted(s.median_ape for s in per_source)
    print(f"median of the {len(medians)} per-source medians: "
          f"{100 * medians[len(medians) // 2]:.1f}%; worst source median "
          f"{100 * medians[-1]:.1f}%")  # fmt: skip
    names = {r.run_id: r.model.name for r in runs}
    tail = sorted((r for r in every if r.ape is not None and r.ape > TAIL_APE),
                  key=lambda r: -(r.ape or 0.0))  # fmt: skip
    print(f"\nheld-out rows over {100 * TAIL_APE:.0f}% ({len(tail)} of {len(every)}):")
    for r in tail:
        assert r.predicted is not None and r.measured is not None
        print(f"  {r.run_id:>5} {r.source_id:<3} {names.get(r.run_id, '')[:34]:<34} "
              f"{100 * (r.predicted / r.measured - 1):+7.1f}%")  # fmt: skip
    if out is not None:
        write_cv_rows(out, runs, every)
        print(f"\nwrote every held-out row to {out}")
    shared, floor = identical_input_floor(runs, every)
    print(f"\nnoise floor: {shared} rows repeat another row's inputs; predicted at their "
          f"group's measured median, the all-rows p90 would be {100 * floor:.1f}%")  # fmt: skip


def read_fit(path: Path) -> Calibration:
    """The parameters a `--fit` printout lists ("  name  value  [low, high]" lines)."""
    pairs = re.findall(r"^\s+(\S+)\s+([0-9.eE+-]+)\s+\[", path.read_text(), flags=re.M)
    if not pairs:
        raise UserInputError("cv-start-from", str(path), "the printout of calibration.py --fit")
    return Calibration.from_values([n for n, _ in pairs], [float(v) for _, v in pairs])


def identical_input_floor(runs: Sequence[RunSpec], rows: Sequence[RowResult]) -> tuple[int, float]:
    """(rows in groups of identical inputs, all-rows p90 APE if every such group were predicted
    at its measured median): the part of the tail no deterministic model can remove."""
    key = {r.run_id: (r.model.model_dump_json(), r.cluster.model_dump_json(),
                      r.plan.model_dump_json()) for r in runs}  # fmt: skip
    groups: dict[tuple[str, str, str], list[float]] = {}
    for r in runs:
        groups.setdefault(key[r.run_id], []).append(r.measured)
    apes: list[float] = []
    shared = 0
    for row in rows:
        if row.ape is None or row.measured is None:
            continue
        measured = groups[key[row.run_id]]
        if len(measured) > 1:
            shared += 1
            apes.append(abs(float(np.median(measured)) / row.measured - 1.0))
        else:
            apes.append(row.ape)
    return shared, summarize(apes).p90_ape


def main(argv: Sequence[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("runs", nargs="?", help="CSV in the calibration schema")
    parser.add_argument("--fit", action="store_true", help="refit the free parameters")
    parser.add_argument(
        "--iterations", type=int, default=300, help="Nelder-Mead iterations (0: reuse the last fit)"
    )
    parser.add_argument("--write", action="store_true", help="store the fit in the presets")
    parser.add_argument(
        "--cv", action="store_true", help="leave-one-source-out cross-validation table"
    )
    parser.add_argument("--cv-sources", default="", help="only these held-out folds (S1,H4,...)")
    parser.add_argument("--cv-out", default="", help="--cv: write every held-out row to this CSV")
    parser.add_argument(
        "--cv-start-iterations",
        type=int,
        default=0,
        help="--cv: start every fold from an all-data fit of this many iterations (0: the "
        "shipped starts)",
    )
    parser.add_argument(
        "--cv-start-from", default="", help="--cv: start every fold from this saved --fit printout"
    )
    parser.add_argument(
        "--holdout", default=str(HOLDOUT), help="second CSV fitted and cross-validated ('' none)"
    )
    args = parser.parse_args(argv)
    path = Path(args.runs) if args.runs else shared_path("calibration", "runs.csv")
    if path is None:
        print("calibration runs not found (set SHARED_DIR)", file=sys.stderr)
        return 2
    runs, skipped = load_runs(path)
    for r in skipped:
        print(f"skipped run {r.run_id}: {r.skipped}")
    extra, _ = load_runs(Path(args.holdout)) if args.holdout else ([], [])
    if args.cv:
        only = args.cv_sources.split(",") if args.cv_sources else None
        out = Path(args.cv_out) if args.cv_out else None
        start = read_fit(Path(args.cv_start_from)) if args.cv_start_from else None
        print_cv(runs + extra, args.iterations, only, out, args.cv_start_iterations, start)
        return 0
    calibration = None
    fit_runs = runs + extra
    bounds = free_parameters(families_of(fit_runs))
    if args.fit and args.iterations == 0:
        calibration = Calibration.start(families_of(fit_runs))
        print("the last fit's values (the Bound starts), not refitted:")
    elif args.fit:
        calibration, loss = fit(fit_runs, iterations=args.iterations)
        print(f"fitted on {len(fit_runs)} runs (source-weighted mean |log error| {loss:.4f}):")
    if calibration is not None:
        fitted = dict(zip(calibration.names(), calibration.vector(), strict=True))
        for bound in bounds:
            value = fitted[bound.name]
            print(f"  {bound.name:<24} {value:.4f}   [{bound.low}, {bound.high}]")
        print(f"  prior matmul_max (families without runs) {calibration.prior_matmul_max:.4f}")
    if calibration is not None and args.write:
        note = (
            f"fitted on runs.csv {','.join(sorted({r.source_id for r in runs}))} + "
            f"benchmarks/holdout_runs.csv {','.join(sorted({r.source_id for r in extra}))} by "
            f"benchmarks/calibration.py --fit --write, {dt.date.today().isoformat()}"
        )
        for p in write_presets(calibration, note):
            print(f"wrote {p.relative_to(DATA.parents[2])}")
    print_table(runs, results(runs, calibration))
    if extra:
        print(f"\n{args.holdout}:")
        print_table(extra, results(extra, calibration))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
