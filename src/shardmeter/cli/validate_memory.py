"""`shardmeter validate --memory [CSV] [--json]`: predicted vs measured memory per GPU.

Each row is compared with the kind it reports (allocated, reserved or device total), with the
predicted breakdown (weights, gradients, optimizer states, activations, buffers, allocator
fragmentation); then median, mean and p90 of the absolute percentage error overall, per
source and per kind, and the OOM verdict on every row that reports a fit or an OOM. `--json`
prints {"rows": [...], "summary": {...}, "per_source": {...}, "per_kind": {...},
"verdicts": {...}, "skipped": [...]}; sizes in bytes, APE as fractions.
"""

from __future__ import annotations

import argparse
import sys
from typing import Any

from rich.console import Console

from shardmeter.calibrate import skipped_json
from shardmeter.cli.error_table import ape_table, only_sources
from shardmeter.memcheck import (
    DEFAULT_MEMORY_CSV,
    MemoryResult,
    evaluate_memory_rows,
    read_memory_rows,
    summarize_memory,
)
from shardmeter.report.jsonout import print_json
from shardmeter.report.terminal import Col, console_for, fit_table

BREAKDOWN = ("weights", "gradients", "optimizer_states", "activations", "buffers")


def memory_results_to_dict(results: list[MemoryResult]) -> dict[str, Any]:
    """The `--json` document."""
    summary = summarize_memory(results)
    rows = []
    for r in results:
        if r.estimate is None:
            continue
        est = r.estimate
        rows.append(
            {
                "run_id": r.run_id,
                "source_id": r.source_id,
                "kind": r.kind,
                "outcome": r.outcome,
                "measured_bytes": r.measured,
                "predicted_bytes": r.predicted,
                "ape": r.ape,
                "verdict_ok": r.verdict_ok,
                "breakdown_bytes": {
                    **{k: est.memory_breakdown[k] for k in BREAKDOWN},
                    **{
                        k: est.memory_detail.get(k, 0.0)
                        for k in ("fragmentation", "cuda_context", "nccl_buffers")
                    },
                },
                "allocated_bytes": est.memory_allocated_bytes,
                "reserved_bytes": est.memory_reserved_bytes,
                "total_bytes": est.memory_total_bytes,
                "hbm_bytes": est.hbm_bytes,
            }
        )
    return {
        "rows": rows,
        "summary": summary.overall.as_json(),
        "per_source": {k: v.as_json() for k, v in summary.per_source.items()},
        "per_kind": {k: v.as_json() for k, v in summary.per_kind.items()},
        "verdicts": {"judged": summary.verdicts, "right": summary.verdicts_right},
        "skipped": skipped_json(results),
    }


def _gib(x: float) -> str:
    return f"{x / 2**30:.1f}"


def render_memory(console: Console, results: list[MemoryResult]) -> None:
    """Rows (GiB), then the error summaries and the OOM verdict count."""
    cols = [
        Col("run"), Col("src", "left", drop=3), Col("kind", "left"), Col("measured"),
        Col("predicted"), Col("error"), Col("verdict", "left"), Col("W", drop=2),
        Col("G", drop=2), Col("O", drop=2), Col("A", drop=1), Col("B", drop=1),
        Col("frag", drop=2), Col("total/HBM", drop=1),
    ]  # fmt: skip
    rows = []
    for r in results:
        if r.estimate is None or r.predicted is None:
            continue
        b, d = r.estimate.memory_breakdown, r.estimate.memory_detail
        verdict = ("fits" if r.estimate.fits else "OOM") + (" ok" if r.verdict_ok else " WRONG")
        rows.append(
            [
                r.run_id,
                r.source_id,
                r.kind,
                (r.outcome if r.measured is None else _gib(r.measured)).replace("oom", "OOM"),
                _gib(r.predicted),
                "" if r.measured is None else f"{100 * (r.predicted / r.measured - 1):+.1f}%",
                verdict,
                *(_gib(b[k]) for k in BREAKDOWN),
                _gib(d.get("fragmentation", 0.0)),
                f"{_gib(r.estimate.memory_total_bytes)}/{_gib(r.estimate.hbm_bytes)}",
            ]
        )
    title = "predicted vs measured memory per GPU (GiB; W G O A B: weights, grads, optimizer, "
    console.print(fit_table(console, title + "activations, buffers)", cols, rows))
    summary = summarize_memory(results)
    groups = [("all", summary.overall)]
    groups += [(f"source {k}", v) for k, v in summary.per_source.items()]
    groups += [(f"kind {k}", v) for k, v in summary.per_kind.items()]
    console.print(ape_table(groups))
    console.print(
        f"OOM verdict right on {summary.verdicts_right} of {summary.verdicts} rows "
        "reporting a fit or an OOM",
        markup=False,
    )
    for r in results:
        if r.skipped is not None:
            console.print(f"skipped {r.run_id} ({r.source_id}): {r.skipped}", markup=False)


def run_memory(args: argparse.Namespace) -> int:
    path = args.memory or DEFAULT_MEMORY_CSV
    results = evaluate_memory_rows(only_sources(read_memory_rows(path), args.source))
    if args.json:
        print_json(memory_results_to_dict(results))
    else:
        render_memory(console_for(sys.stdout.isatty(), args.wide), results)
    return 0
