"""`heloco report RUN_DIR...`: compare runs in a table and plot their loss curves.

Each RUN_DIR is a run folder (events.jsonl, summary.json) or a folder holding run folders
(e.g. a grid's ``runs/``). Plots of loss vs tokens, loss vs time and per-language loss, and
each run's per-worker timeline as a Gantt chart (``timeline_<run>``: receive, compute, send,
idle, staleness per arrival, and each worker's link use where the rounds carry bytes), are
written as PNG and SVG to --out (default: ``report/`` beside the first run).
"""

from __future__ import annotations

import argparse
import json
import sys
from pathlib import Path
from typing import Any

from heloco.cli.common import add_out
from heloco.config import atomic_write_text
from heloco.report import (
    common_budget,
    comparison_rows,
    language_table,
    load_runs,
    markdown_table,
    plot_runs,
    row_cells,
    runs_to_json,
)
from heloco.timeline import plot_timelines
from shardmeter.report.htmlpage import add_html_flag, check_html_path, page_command
from shardmeter.report.terminal import Col, add_wide_flag, console_for, fit_table, si

# The comparison table on a terminal: row_cells order, short headers (table.md spells them
# out); the run, the final loss and the loss at the common token budget are never left out.
TERMINAL_COLUMNS: tuple[Col, ...] = (
    Col("run", "left"),
    Col("method", "left", drop=1),
    Col("paces", "left", drop=3),
    Col("tokens", drop=4),
    Col("time (s)", drop=5),
    Col("updates", drop=5),
    Col("start", drop=6),
    Col("end"),
    Col("@tokens"),
    Col("@time", drop=2),
    Col("cycle", drop=2),
)


def add_parser(sub: Any) -> None:
    p = sub.add_parser(
        "report",
        help="tables and plots comparing run folders",
        description="Compare runs at their common token and time budgets; plot loss vs "
        "tokens, vs time and per language, and each run's per-worker timeline as a Gantt "
        "chart (PNG and SVG).",
    )
    p.add_argument("runs", nargs="+", type=Path, metavar="RUN_DIR")
    add_out(p, "folder for plots, table.md and report.json (default: report/ beside the first run)")
    p.add_argument("--no-plots", action="store_true", help="tables only")
    p.add_argument("--json", action="store_true", help="print the comparison as JSON")
    add_html_flag(p)
    add_wide_flag(p)


def run(args: argparse.Namespace) -> int:
    check_html_path("--html", args.html)
    runs = load_runs(args.runs)
    out: Path = args.out or runs[0].path.parent / "report"
    out.mkdir(parents=True, exist_ok=True)
    atomic_write_text(out / "table.md", markdown_table(runs))
    plots = [] if args.no_plots else plot_runs(runs, out) + plot_timelines(runs, out)
    if args.html is not None:
        from heloco.report_html import report_page

        plots.append(report_page(runs, page_command("heloco", args)).write(args.html))
    payload = runs_to_json(runs) | {"files": [str(p) for p in plots]}
    atomic_write_text(out / "report.json", json.dumps(payload, indent=2) + "\n")
    if args.json:
        print(json.dumps(payload, indent=2))
        return 0
    console = console_for(sys.stdout.isatty(), args.wide)
    tok, sec = common_budget(runs, "tokens"), common_budget(runs, "time")
    title = (
        f"{len(runs)} run(s), validation loss; @tokens and @time: at the common budget "
        f"({si(tok)} tokens, {sec:,.1f} s), cycle: mean over the last slowest-worker cycle"
    )
    rows = [row_cells(row) for row in comparison_rows(runs)]
    console.print(fit_table(console, title, TERMINAL_COLUMNS, rows))
    header, cells = language_table(runs)
    langs = [Col(header[0], "left")] + [Col(name, drop=1) for name in header[1:]]
    console.print(fit_table(console, "final validation loss per language", langs, cells))
    console.print(f"wrote {out / 'table.md'}" + "".join(f"\nwrote {p}" for p in plots))
    return 0
