"""`shardmeter predict --topology FILE`: the multi-island path of the predict command.

`cli/predict.py` calls `add_arguments(parser)` when it builds its parser and hands over to
`run_topology(args)` when `args.topology` is set.
"""

from __future__ import annotations

import argparse
import sys
from typing import Any

from shardmeter.analysis import compare_modes
from shardmeter.cli import quality
from shardmeter.clikit import bounded, nonneg_int, positive_float, positive_int
from shardmeter.estimate.islands import predict_topology, with_step_times, with_wan
from shardmeter.report.islands import modes_table, render_topology, topology_json
from shardmeter.report.jsonout import print_json
from shardmeter.report.terminal import console_for
from shardmeter.specs.topology import Topology, load_topology

# CLI flag -> RunSpec field overridden by it.
RUN_FLAGS: dict[str, str] = {
    "mode": "mode",
    "inner_steps": "inner_steps",
    "bits": "bits",
    "grad_bits": "grad_bits",
    "fragments": "fragments",
    "overlap_steps": "overlap_steps",
    "reduce": "reduce",
    "server": "server",
    "tokens": "tokens",
    "island_batch": "global_batch",
    "quality_factor": "quality_factor",
    "threshold": "compute_bound_threshold",
    "outer_overlap": "outer_overlap",
    "exchange": "exchange",
    "link_slots": "link_slots",
    "balance_steps": "balance_steps",
    "backward_overlap": "backward_overlap",
    "payload": "payload",
    "failures": "failures",
}


def _existing(parser: argparse.ArgumentParser, flags: tuple[str, ...]) -> argparse.Action | None:
    for action in parser._actions:
        if any(flag in action.option_strings for flag in flags):
            return action
    return None


def add_arguments(parser: argparse.ArgumentParser) -> None:
    """Topology flags. A flag the predict parser already has (`--json`, `--model`, ...) is
    reused rather than added twice."""
    group = parser.add_argument_group("multi-island (with --topology)")
    foreign: dict[str, Any] = {}  # dest -> default of a flag the parser already had

    def add(*flags: str, **kwargs: Any) -> None:
        action = _existing(parser, flags)
        if action is None:
            group.add_argument(*flags, **kwargs)
        else:
            foreign[action.dest] = action.default

    add("--topology", metavar="FILE", help="topology TOML file or a shipped example name")
    add("--mode", choices=("sync", "diloco", "streaming", "async"), help="outer mode")
    add("--inner-steps", "-H", type=positive_int, help="H: inner steps per outer round")
    add("--bits", type=int, choices=(32, 16, 8, 4), help="pseudo-gradient bits q")
    add("--grad-bits", type=int, choices=(32, 16, 8), help="sync DP gradient bits")
    add(
        "--fragments",
        metavar="P|OFFSET:LAYERS,...",
        help="Streaming DiLoCo schedule: P fragments at round(k·H/P), or an explicit list",
    )
    add("--overlap-steps", type=nonneg_int, help="Streaming DiLoCo overlap τ (inner steps)")
    add(
        "--outer-overlap",
        action="store_true",
        default=None,
        help="DiLoCo eager/delayed outer step: hide the exchange behind the next round",
    )
    add(
        "--exchange",
        choices=("duplex", "blocking", "overlapped", "streaming"),
        help="async: duplex (delta up and model down at once, hidden), or HeLoCo's push then "
        "pull between rounds (blocking), behind the next round (overlapped), or one fragment "
        "of --fragments P behind each H/P steps (streaming)",
    )
    add(
        "--link-slots",
        action="store_true",
        default=None,
        help="async, a shared server link: the workers take turns on it for their pushes, one "
        "at a time (HeLoCo's --link-slots; docs/wan.md)",
    )
    add(
        "--balance-steps",
        action="store_true",
        default=None,
        help="DiLoCo/Streaming: faster islands run more inner steps per round",
    )
    add(
        "--no-backward-overlap",
        dest="backward_overlap",
        action="store_false",
        default=None,
        help="the WAN exchange waits for the end of the step (no bucketed backward overlap)",
    )
    add(
        "--no-overlap",
        action="store_true",
        help="pessimistic: no backward overlap, no eager outer step, τ = 0",
    )
    add(
        "--payload",
        metavar="KIND[:KEY=VALUE,...]",
        help="what crosses the WAN: dense, topk:fraction=0.01, sign, lowrank:rank=4, "
        "dct_topk:fraction=0.05 (docs/islands.md)",
    )
    add(
        "--failures",
        metavar="KEY=VALUE,...",
        help="failures and churn, e.g. gpu_mtbf_hours=50000,restart_s=600,checkpoint_s=60",
    )
    add(
        "--step-time",
        metavar="SECONDS|ISLAND=SECONDS,...",
        help="given inner step time (measured or what-if), for every island or per island",
    )
    add(
        "--bucket",
        metavar="KEY=VALUE,...",
        help="object storage for --reduce bucket, e.g. bandwidth_gbit=10,egress_usd_per_gb=0.09",
    )
    add("--reduce", choices=("ring", "hub", "bucket"), help="outer collective pattern")
    add("--server", help="hub / parameter-server island")
    add("--tokens", type=bounded(float, 0, 1e18, low_open=True), help="token budget (e.g. 1e12)")
    add(
        "--island-batch",
        type=positive_int,
        help="default sequences per island per inner step (islands that set one keep theirs)",
    )
    add(
        "--quality-factor",
        type=positive_float,
        help="tokens needed relative to synchronous training",
    )
    add(
        "--threshold",
        type=bounded(float, 0, 1, low_open=True),
        help="utilization that counts as compute-bound",
    )
    add(
        "--compare-modes",
        action="store_true",
        help="also predict every outer mode (sync, diloco, streaming, async) and compare them",
    )
    add("--json", action="store_true", help="print JSON instead of tables")
    add("--wide", action="store_true", help="every table column (default: fit the terminal)")
    add("--model", help="model preset or file (overrides run.model)")
    quality.add_arguments(parser)
    parser.set_defaults(topology_foreign_defaults=foreign)


def topology_from(args: argparse.Namespace) -> Topology:
    """The --topology file with the flags that change islands or the WAN applied."""
    topo = load_topology(args.topology)
    topo = with_wan(topo, bucket=getattr(args, "bucket", None))
    return with_step_times(topo, getattr(args, "step_time", None))


def overrides_from(args: argparse.Namespace) -> dict[str, Any]:
    """RunSpec overrides from parsed flags. Flags not given are left out, and so is a shared
    flag (one the predict parser defined) still at that parser's default."""
    foreign: dict[str, Any] = getattr(args, "topology_foreign_defaults", {})
    out: dict[str, Any] = {}
    for flag, field in (*RUN_FLAGS.items(), ("model", "model")):
        value = getattr(args, flag, None)
        if value is None or (flag in foreign and value == foreign[flag]):
            continue
        out[field] = value
    if getattr(args, "no_overlap", False):
        out.update(backward_overlap=False, outer_overlap=False, overlap_steps=0)
    return out


def run_topology(args: argparse.Namespace) -> int:
    """Predict the topology in `args.topology` and print tables or JSON."""
    quality.apply(args)
    topo = topology_from(args)
    overrides = overrides_from(args)
    est = predict_topology(topo, **overrides)
    modes = compare_modes(topo, **overrides) if getattr(args, "compare_modes", False) else []
    html = getattr(args, "html", None)
    if html is not None:
        from shardmeter.report.html import topology_page
        from shardmeter.report.htmlpage import page_command

        topology_page(est, topo, page_command("shardmeter", args), modes, overrides).write(html)
    if getattr(args, "json", False):
        doc = topology_json(est)
        if modes:
            doc["modes"] = [topology_json(m) for m in modes]
        print_json(doc)
    else:
        console = console_for(sys.stdout.isatty(), getattr(args, "wide", False))
        render_topology(est, console)
        if modes:
            console.print(modes_table(modes, console))
        if html is not None:
            console.print(f"wrote {html}")
    return 0
