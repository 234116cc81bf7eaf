"""`shardmeter validate [RUNS.csv] [--json]`: predicted vs measured tokens/s per GPU;
`--memory [CSV]`: predicted vs measured memory per GPU (`cli/validate_memory.py`).

Reads a CSV in the calibration schema (default: the shared calibration runs), prints each
row's prediction and absolute percentage error, then median, mean and p90 overall and per
source. `--json` prints {"rows": [...], "summary": {...}, "per_source": {...}, "skipped": [...]};
APE values there are fractions (0.1 = 10%).
"""

from __future__ import annotations

import argparse
import sys
from pathlib import Path
from typing import Any

from rich.console import Console

from shardmeter.calibrate import (
    RowResult,
    evaluate_rows,
    read_rows,
    skipped_json,
    summarize_results,
)
from shardmeter.cli.error_table import ape_table, only_sources, pct
from shardmeter.errors import UserInputError
from shardmeter.paths import missing_shared_reason, shared_path
from shardmeter.report.jsonout import print_json
from shardmeter.report.terminal import Col, add_wide_flag, console_for, fit_table, si

DEFAULT_RUNS = ("calibration", "runs.csv")


def add_parser(subparsers: Any) -> None:
    p = subparsers.add_parser(
        "validate",
        help="compare predictions with measured runs (calibration CSV schema)",
        description="Predict every row of a runs CSV and report the error against the measured "
        "tokens/s per GPU (default: the shared calibration runs).",
    )
    p.add_argument("runs", nargs="?", help="CSV in the calibration schema")
    p.add_argument("--json", action="store_true", help="print JSON (APE as fractions)")
    p.add_argument("--source", action="append", help="only rows of this source_id (repeatable)")
    p.add_argument(
        "--memory",
        nargs="?",
        const="",
        metavar="CSV",
        help="compare predicted with measured memory per GPU instead (default CSV: the "
        "memory measurements that ship with shardmeter)",
    )
    add_wide_flag(p)


def results_to_dict(results: list[RowResult]) -> dict[str, Any]:
    """The `--json` document."""
    overall, per_source = summarize_results(results)
    return {
        "rows": [
            {
                "run_id": r.run_id,
                "predicted_tokens_per_sec_per_gpu": r.predicted,
                "measured_tokens_per_sec_per_gpu": r.measured,
                "ape": r.ape,
            }
            for r in results
            if r.ape is not None
        ],
        "summary": overall.as_json(),
        "per_source": {k: v.as_json() for k, v in per_source.items()},
        "skipped": skipped_json(results),
    }


def render(console: Console, results: list[RowResult]) -> None:
    cols = [
        Col("run"),
        Col("source", "left", drop=2),
        Col("model", "left", drop=1),
        Col("gpu", "left", drop=3),
        Col("GPUs", drop=3),
        Col("predicted"),
        Col("measured"),
        Col("error"),
        Col("APE", drop=4),
    ]
    rows = [
        [
            r.run_id,
            r.source_id,
            r.run.model.name,
            r.run.cluster.accelerator.name,
            str(r.run.plan.n_gpus),
            si(r.predicted),
            si(r.measured),
            f"{100 * (r.predicted / r.measured - 1):+.1f}%",
            pct(r.ape),
        ]
        for r in results
        if r.ape is not None and r.predicted is not None and r.measured is not None and r.run
    ]
    console.print(fit_table(console, "predicted vs measured tokens/s per GPU", cols, rows))
    overall, per_source = summarize_results(results)
    console.print(ape_table([("all", overall), *per_source.items()]))
    skipped = [r for r in results if r.skipped is not None]
    for r in skipped:
        console.print(f"skipped run {r.run_id} ({r.source_id}): {r.skipped}", markup=False)


def run(args: argparse.Namespace) -> int:
    if args.memory is not None:
        from shardmeter.cli.validate_memory import run_memory

        return run_memory(args)
    path: Path | None = Path(args.runs) if args.runs else shared_path(*DEFAULT_RUNS)
    if path is None:
        raise UserInputError("runs", None, missing_shared_reason(*DEFAULT_RUNS))
    results = evaluate_rows(only_sources(read_rows(path), args.source))
    if args.json:
        print_json(results_to_dict(results))
    else:
        render(console_for(sys.stdout.isatty(), args.wide), results)
    return 0
