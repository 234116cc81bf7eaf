"""`shardmeter plan`: search every valid plan for one cluster or a topology of islands."""

from __future__ import annotations

import argparse
import dataclasses
import json
import re
import sys
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from pathlib import Path
from typing import Any

from rich.console import Console
from rich.progress import BarColumn, MofNCompleteColumn, Progress, TextColumn, TimeElapsedColumn

from shardmeter.cli import quality
from shardmeter.clikit import bounded, nonneg_int, positive_float, positive_int
from shardmeter.errors import UserInputError
from shardmeter.estimate.islands import with_run
from shardmeter.estimate.outer import MODES
from shardmeter.predict import resolve_cluster
from shardmeter.report.htmlpage import add_html_flag, args_json, check_html_path, page_command
from shardmeter.report.plan import plot_result, render_result, result_json
from shardmeter.report.plotfiles import check_plot_path
from shardmeter.report.terminal import console_for
from shardmeter.search.api import node_multiples, plan
from shardmeter.search.options import (
    PRECISIONS,
    RECOMPUTES,
    SHARDINGS,
    Constraints,
    OuterOptions,
    SpaceOptions,
)
from shardmeter.search.result import PlanSearchResult
from shardmeter.specs.framework import FRAMEWORKS
from shardmeter.specs.topology import Topology, load_topology

ALL_PLANS = 10**12  # --top 0: keep every feasible plan (no time-bound pruning of the ranking)
DURATION_UNITS = {"s": 1.0, "min": 60.0, "h": 3600.0, "d": 86400.0, "w": 7 * 86400.0}


def add_parser(subparsers: Any) -> None:
    p = subparsers.add_parser(
        "plan",
        help="search every valid plan; rank by time, cost and $/Mtok; Pareto front",
        description="Enumerate every valid plan (divisibility and memory rules), evaluate them "
        "with the vectorized estimator, and print the best by wall-clock, cost and $ per "
        "million tokens, the time-cost Pareto front, and why the top plan wins.",
    )
    where = p.add_argument_group("what to plan for")
    where.add_argument("--model", help="model preset or file (topology: overrides run.model)")
    where.add_argument("--cluster", help="cluster preset or file (one island)")
    where.add_argument("--gpus", help="GPU count N, a list N1,N2 or a range A:B (node × 2^k)")
    where.add_argument("--topology", metavar="FILE", help="topology TOML or shipped example")
    where.add_argument(
        "--tokens",
        type=bounded(float, 0, 1e18, low_open=True),
        help="token budget (default 1e12 / the file's)",
    )
    where.add_argument("--global-batch", help="sequences per step: N, N1,N2 or A:B (powers of two)")
    where.add_argument("--batch-per-gpu", help="islands: sequences per GPU per inner step, list")
    con = p.add_argument_group("constraints")
    con.add_argument("--deadline", help="wall-clock limit, e.g. 30d, 720h, 1w (plain: seconds)")
    con.add_argument("--budget", type=positive_float, help="dollar budget (USD)")
    con.add_argument(
        "--headroom", type=bounded(float, 0, 1), default=0.0, help="HBM fraction kept free"
    )
    con.add_argument(
        "--max-gpus-per-island", type=positive_int, help="use at most this many per island"
    )
    space = p.add_argument_group("search space")
    space.add_argument("--modes", default=",".join(MODES), help="allowed outer modes")
    space.add_argument("--precision", default="bf16", help=f"allowed: {','.join(PRECISIONS)}")
    space.add_argument("--recompute", default=",".join(RECOMPUTES), help="allowed modes")
    space.add_argument("--sharding", default=",".join(SHARDINGS), help="allowed ZeRO stages")
    space.add_argument("--micro-batches", default="1,2,4,8,16", help="micro-batch sizes")
    space.add_argument("--max-tp", type=positive_int, help="default: the NVLink domain")
    space.add_argument("--max-pp", type=positive_int, help="default: n_layers")
    space.add_argument("--max-vpp", type=positive_int, default=8)
    space.add_argument("--max-cp", type=positive_int, default=16)
    space.add_argument("--even-layers", action="store_true", help="pp·vpp must divide layers")
    space.add_argument("--no-hsdp", action="store_true", help="shard over all of dp only")
    space.add_argument("--overlap-tp", action="store_true", help="framework overlaps TP comms")
    space.add_argument(
        "--framework",
        choices=tuple(FRAMEWORKS),
        help="plan for this training stack: its documented defaults set the features the "
        "search does not vary (as predict --framework)",
    )
    space.add_argument("--inner-steps", help="islands: H values (default: the file's)")
    space.add_argument("--bits", help="islands: pseudo-gradient bits (default: the file's)")
    space.add_argument("--fragments", default="1,2,4,8", help="Streaming DiLoCo P values")
    space.add_argument("--overlap-steps", help="Streaming DiLoCo τ values")
    space.add_argument(
        "--payload",
        metavar="KIND[:KEY=VALUE,...]",
        help="islands: what crosses the WAN, as predict --payload (default: the file's)",
    )
    space.add_argument(
        "--no-overlap",
        action="store_true",
        help="islands: pessimistic planning, no WAN exchange hides under compute (backward, "
        "eager and τ overlaps off)",
    )
    out = p.add_argument_group("output")
    out.add_argument(
        "--top",
        type=nonneg_int,
        default=20,
        help="plans in the ranked list (0: every feasible plan; 1: only the fastest, no table)",
    )
    out.add_argument("--json", action="store_true", help="print the result as JSON")
    out.add_argument(
        "--plot", type=Path, help="write the Pareto front and plan cloud (.png, .svg or .pdf)"
    )
    add_html_flag(out)
    out.add_argument("--jobs", type=nonneg_int, default=1, help="processes (0: all cores)")
    out.add_argument("--no-prune", action="store_true", help="evaluate every plan")
    out.add_argument("--no-progress", action="store_true", help="no progress bar")
    out.add_argument(
        "--wide",
        action="store_true",
        help="every table column, 25 plans of the Pareto front and 10 ranks (default: fit "
        "the terminal or 80 columns, 8 and 5)",
    )
    quality.add_arguments(p)


def parse_ints(field: str, text: str | None) -> tuple[int, ...]:
    """'8', '8,16,32' -> integers; raises UserInputError naming `field`."""
    if text is None or not text.strip():
        return ()
    try:
        values = tuple(int(float(v)) for v in text.split(",") if v.strip())
    except ValueError:
        raise UserInputError(field, text, "comma-separated integers") from None
    if any(v < 0 for v in values):
        raise UserInputError(field, text, "non-negative integers")
    return values


def parse_names(field: str, text: str, allowed: tuple[str, ...]) -> tuple[str, ...]:
    names = tuple(v.strip() for v in text.split(",") if v.strip())
    for name in names:
        if name not in allowed:
            raise UserInputError(field, name, f"allowed: {', '.join(allowed)}")
    return names


def parse_range(
    field: str, text: str | None, expand: Callable[[int, int], tuple[int, ...]]
) -> tuple[int, ...]:
    """'N', 'N1,N2' or 'A:B' (expanded by `expand`)."""
    if text is None:
        return ()
    if ":" in text:
        lo, _, hi = text.partition(":")
        a, b = parse_ints(field, lo), parse_ints(field, hi)
        if len(a) != 1 or len(b) != 1 or a[0] < 1 or b[0] < a[0]:
            raise UserInputError(field, text, "a range A:B with 1 ≤ A ≤ B")
        return expand(a[0], b[0])
    values = parse_ints(field, text)
    if not values or min(values) < 1:
        raise UserInputError(field, text, "positive integers")
    return values


def powers_of_two(lo: int, hi: int) -> tuple[int, ...]:
    out, n = [], 1
    while n <= hi:
        if n >= lo:
            out.append(n)
        n *= 2
    return tuple(out) or (lo,)


def parse_duration(text: str | None) -> float | None:
    """'30d', '720h', '90min', '1w', '3600' (seconds) -> seconds."""
    if text is None:
        return None
    match = re.fullmatch(r"\s*([0-9.eE+-]+)\s*(s|min|h|d|w)?\s*", text)
    if match is None:
        raise UserInputError("--deadline", text, "a number with unit s, min, h, d or w (e.g. 30d)")
    try:
        value = float(match.group(1))
    except ValueError:
        raise UserInputError("--deadline", text, "a number with unit s, min, h, d or w") from None
    return value * DURATION_UNITS[match.group(2) or "s"]


def options_from(args: argparse.Namespace) -> tuple[SpaceOptions, OuterOptions, Constraints]:
    space = SpaceOptions(
        precisions=parse_names("--precision", args.precision, PRECISIONS),
        recompute=parse_names("--recompute", args.recompute, RECOMPUTES),
        sharding=parse_names("--sharding", args.sharding, SHARDINGS),
        micro_batches=parse_ints("--micro-batches", args.micro_batches),
        max_tp=args.max_tp,
        max_pp=args.max_pp,
        max_vpp=args.max_vpp,
        max_cp=args.max_cp,
        hsdp=not args.no_hsdp,
        uneven_layers=not args.even_layers,
        overlap_tp=args.overlap_tp,
        framework=args.framework,
    )
    outer = OuterOptions(
        modes=parse_names("--modes", args.modes, MODES),
        inner_steps=parse_ints("--inner-steps", args.inner_steps),
        bits=parse_ints("--bits", args.bits),
        fragments=parse_ints("--fragments", args.fragments),
        overlap_steps=parse_ints("--overlap-steps", args.overlap_steps),
        batch_per_gpu=parse_ints("--batch-per-gpu", args.batch_per_gpu),
    )
    constraints = Constraints(
        deadline_s=parse_duration(args.deadline),
        budget_usd=args.budget,
        memory_headroom=args.headroom,
        max_gpus_per_island=args.max_gpus_per_island,
    )
    return space, outer, constraints


@contextmanager
def progress_bar(
    enabled: bool,
) -> Iterator[tuple[Callable[[int], None] | None, Callable[[int], None] | None]]:
    """(advance, set_total) callbacks drawing a rich bar on stderr, or (None, None)."""
    if not enabled:
        yield None, None
        return
    console = Console(stderr=True)
    with Progress(
        TextColumn("[bold]searching"),
        BarColumn(),
        MofNCompleteColumn(),
        TimeElapsedColumn(),
        console=console,
        transient=True,
    ) as bar:
        task = bar.add_task("plans", total=None)

        def advance(n: int) -> None:
            bar.advance(task, n)

        def set_total(n: int) -> None:
            console.print(f"search space: {n:,} plans (before bounds)")
            bar.update(task, total=n)

        yield advance, set_total


def run(args: argparse.Namespace) -> int:
    space, outer, constraints = options_from(args)
    if args.plot is not None:
        check_plot_path("--plot", args.plot)
    check_html_path("--html", args.html)
    if args.topology is None and args.cluster is None:
        raise UserInputError("--cluster", None, "give --cluster NAME --gpus N, or --topology FILE")
    if args.topology is not None:
        for flag, value in (("--cluster", args.cluster), ("--gpus", args.gpus)):
            if value is not None:
                raise UserInputError(
                    flag, value, "not with --topology (islands come from the file)"
                )
        if args.global_batch is not None:
            raise UserInputError(
                "--global-batch", args.global_batch, "with --topology use --batch-per-gpu"
            )
    gpus: tuple[int, ...] | None = None
    if args.topology is None:
        cluster = resolve_cluster(args.cluster)
        gpus = (
            parse_range("--gpus", args.gpus, lambda lo, hi: node_multiples(cluster, lo, hi)) or None
        )
    batches = parse_range("--global-batch", args.global_batch, powers_of_two) or None
    show = not args.no_progress and not args.json and sys.stderr.isatty()
    # The search as the user asked for it; --quality-from re-ranks the same space.
    topology: Topology | str | None = args.topology
    for flag, value in (("--payload", args.payload), ("--no-overlap", args.no_overlap or None)):
        if args.topology is None and value is not None:
            raise UserInputError(flag, value, "only with --topology")
    if args.topology is not None and (args.payload is not None or args.no_overlap):
        run_overrides: dict[str, Any] = {"payload": args.payload}
        if args.no_overlap:
            if any(outer.overlap_steps):
                raise UserInputError("--overlap-steps", args.overlap_steps, "not with --no-overlap")
            run_overrides.update(backward_overlap=False, outer_overlap=False, overlap_steps=0)
            outer = dataclasses.replace(outer, overlap_steps=(0,))
        topology = with_run(load_topology(args.topology), **run_overrides)
    search: dict[str, Any] = {
        "model": args.model,
        "cluster": args.cluster,
        "gpus": gpus,
        "topology": topology,
        "tokens": args.tokens,
        "global_batch": batches,
        "constraints": constraints,
        "options": space,
        "outer": outer,
        "jobs": args.jobs,
    }
    with progress_bar(show) as (advance, set_total):
        res: PlanSearchResult = plan(
            **search,
            top_k=args.top if args.top > 0 else ALL_PLANS,
            prune=not args.no_prune,
            progress=advance,
            on_space=set_total,
        )
    shown = min(args.top, 10 if args.wide else 5) if args.top > 0 else 10
    ranked = quality.rank_from_args(args, shown, **search)
    if args.plot is not None:
        plot_result(res, args.plot)
    if args.html is not None:
        from shardmeter.report.html import plan_page

        topo = topology if isinstance(topology, Topology) else None
        if topo is None and args.topology is not None:
            topo = load_topology(args.topology)
        inputs: dict[str, Any] = {"options": args_json(args)}
        if topo is None:
            inputs["cluster"] = resolve_cluster(args.cluster).model_dump(mode="json")
        page = plan_page(res, page_command("shardmeter", args), inputs, topo)
        page.write(args.html)
    if args.json:
        doc = result_json(res)
        if ranked:
            doc["quality"] = quality.ranked_json(ranked, args.quality)
        json.dump(doc, sys.stdout, indent=2)
        sys.stdout.write("\n")
    else:
        console = console_for(sys.stdout.isatty(), args.wide)
        render_result(res, console, top=shown, front=25 if args.wide else 8)
        if ranked:
            quality.render_ranked(ranked, args.quality, console=console)
        for path in (args.plot, args.html):
            if path is not None:
                console.print(f"wrote {path}")
    return 0 if res.infeasible is None else 1
