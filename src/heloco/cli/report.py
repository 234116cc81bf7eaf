"""`heloco report RUN_DIR...`: compare runs in a table and plot their loss curves.

Each RUN_DIR is a run folder (events.jsonl, summary.json) or a folder holding run folders
(e.g. a grid's ``runs/``). Plots of loss vs tokens, loss vs time and per-language loss are
written as PNG and SVG to --out (default: ``report/`` beside the first run).
"""

from __future__ import annotations

import argparse
import json
import sys
from pathlib import Path
from typing import Any

from rich.table import Table

from heloco.config import atomic_write_text
from heloco.report import (
    TABLE_HEADER,
    common_budget,
    comparison_rows,
    language_table,
    load_runs,
    markdown_table,
    plot_runs,
    row_cells,
    runs_to_json,
)
from shardmeter.report.step import console_for


def add_parser(sub: Any) -> None:
    p = sub.add_parser(
        "report",
        help="tables and plots comparing run folders",
        description="Compare runs at their common token and time budgets; plot loss vs "
        "tokens, vs time and per language (PNG and SVG).",
    )
    p.add_argument("runs", nargs="+", type=Path, metavar="RUN_DIR")
    p.add_argument("--out", type=Path, help="folder for plots and table.md")
    p.add_argument("--no-plots", action="store_true", help="tables only")
    p.add_argument("--json", action="store_true", help="print the comparison as JSON")


def run(args: argparse.Namespace) -> int:
    runs = load_runs(args.runs)
    out: Path = args.out or runs[0].path.parent / "report"
    out.mkdir(parents=True, exist_ok=True)
    atomic_write_text(out / "table.md", markdown_table(runs))
    plots = [] if args.no_plots else plot_runs(runs, out)
    payload = runs_to_json(runs) | {"files": [str(p) for p in plots]}
    atomic_write_text(out / "report.json", json.dumps(payload, indent=2) + "\n")
    if args.json:
        print(json.dumps(payload, indent=2))
        return 0
    console = console_for(sys.stdout.isatty())
    tok, sec = common_budget(runs, "tokens"), common_budget(runs, "time")
    table = Table(title=f"{len(runs)} run(s); common budget {tok:,.0f} tokens, {sec:,.1f} s")
    for name in TABLE_HEADER:
        table.add_column(name, justify="left" if name in ("run", "method", "paces") else "right")
    for row in comparison_rows(runs):
        table.add_row(*row_cells(row))
    console.print(table)
    header, rows = language_table(runs)
    langs = Table(title="final validation loss per language")
    for name in header:
        langs.add_column(name, justify="left" if name == "run" else "right")
    for cells in rows:
        langs.add_row(*cells)
    console.print(langs)
    console.print(f"wrote {out / 'table.md'}" + "".join(f"\nwrote {p}" for p in plots))
    return 0
