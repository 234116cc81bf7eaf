"""`shardmeter sweep`: sweep a topology over island size, H, WAN bandwidth, islands, batch."""

from __future__ import annotations

import argparse
import math
import sys
from pathlib import Path
from typing import Any

from rich.console import Console
from rich.table import Table

from shardmeter.analysis import SWEEP_PARAMS, SweepResult, plot_sweep, sweep
from shardmeter.cli.topology_predict import add_arguments, overrides_from, topology_from
from shardmeter.errors import UserInputError
from shardmeter.report.htmlpage import add_html_flag, check_html_path, page_command
from shardmeter.report.jsonout import jsonable, print_json
from shardmeter.report.plotfiles import PLOT_FORMATS, parse_formats
from shardmeter.report.terminal import Col, console_for, duration, fit_table, pct, si, usd


def add_parser(subparsers: Any) -> None:
    p = subparsers.add_parser(
        "sweep",
        help="sweep a topology over island size, H, WAN bandwidth, island count or batch",
        description="Sweep a multi-island topology over one or more knobs: prints tables, "
        "states the knees in words and writes PNG and SVG plots.",
    )
    p.add_argument(
        "--over",
        default=",".join(SWEEP_PARAMS),
        help=f"comma-separated knobs from {', '.join(SWEEP_PARAMS)} (default: all)",
    )
    p.add_argument(
        "--values", help="comma-separated values for a single --over knob (default: a grid)"
    )
    p.add_argument(
        "--out", type=Path, default=Path("sweep-plots"), help="plot folder (default: sweep-plots)"
    )
    p.add_argument("--no-plots", action="store_true", help="print tables only")
    p.add_argument(
        "--formats",
        default="png,svg",
        help=f"plot formats from {','.join(PLOT_FORMATS)} (default: png,svg)",
    )
    add_html_flag(p)
    add_arguments(p)


def _values(text: str | None, knobs: list[str]) -> list[float] | None:
    if text is None:
        return None
    if len(knobs) != 1:
        raise UserInputError("--values", text, "needs exactly one --over knob")
    try:
        values = [float(v) for v in text.split(",") if v.strip()]
    except ValueError:
        raise UserInputError("--values", text, "comma-separated numbers") from None
    if not values or not all(math.isfinite(v) for v in values):
        raise UserInputError("--values", text, "comma-separated finite numbers")
    return values


SWEEP_COLUMNS: tuple[Col, ...] = (
    Col("value"),
    Col("GPUs", drop=2),
    Col("tokens/s", drop=1),
    Col("tok/s/GPU", drop=3),
    Col("util"),
    Col("time"),
    Col("cost"),
    Col("$/Mtok", drop=2),
    Col("regime", "left", drop=1),
)


def sweep_table(result: SweepResult, console: Console) -> Table:
    """One row per swept value, the columns that fit ``console``."""
    rows = [
        [
            f"{p.value:g}",
            str(p.n_gpus),
            si(p.tokens_per_s),
            si(p.tokens_per_s_per_gpu),
            pct(p.utilization),
            duration(p.wall_s),
            usd(p.cost_usd),
            usd(p.usd_per_mtok),
            p.regime,
        ]
        for p in result.points
    ]
    title = f"{result.topology} ({result.mode}): {result.label}"
    return fit_table(console, title, SWEEP_COLUMNS, rows)


def run(args: argparse.Namespace) -> int:
    if args.topology is None:
        raise UserInputError("--topology", None, "a topology file or shipped example name")
    knobs = [k.strip() for k in args.over.split(",") if k.strip()]
    for knob in knobs:
        if knob not in SWEEP_PARAMS:
            raise UserInputError("--over", knob, f"choose from {', '.join(SWEEP_PARAMS)}")
    values = _values(args.values, knobs)
    formats = parse_formats("--formats", args.formats)
    check_html_path("--html", args.html)
    topo = topology_from(args)
    overrides = overrides_from(args)
    results = [sweep(topo, knob, values, **overrides) for knob in knobs]
    if args.html is not None:
        from shardmeter.estimate.islands import predict_topology
        from shardmeter.report.html import sweep_page

        base = predict_topology(topo, **overrides)
        page = sweep_page(results, topo, base, page_command("shardmeter", args), overrides)
        page.write(args.html)
    plots: list[Path] = []
    if not args.no_plots:
        for result in results:
            plots.extend(plot_sweep(result, args.out, formats=formats))
    if getattr(args, "json", False):
        doc = {"sweeps": jsonable(results), "plots": [str(p) for p in plots]}
        print_json(doc)
        return 0
    console = console_for(sys.stdout.isatty(), args.wide)
    for result in results:
        console.print(sweep_table(result, console))
        for knee in result.knees:
            console.print(f"  • {knee.text}")
        for skip in result.skipped:
            console.print(f"  (skipped {skip})", style="dim")
        console.print()
    for path in [*plots, *([args.html] if args.html is not None else [])]:
        console.print(f"wrote {path}")
    return 0
