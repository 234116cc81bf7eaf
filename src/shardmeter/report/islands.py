"""Views of a TopologyEstimate: rich terminal tables and a JSON-ready mapping."""

from __future__ import annotations

import math
from typing import Any

from rich.console import Console
from rich.table import Table

from shardmeter.estimate.islands import TopologyEstimate
from shardmeter.report.jsonout import jsonable
from shardmeter.report.step import plan_label
from shardmeter.report.terminal import Col, duration, fit_table, nbytes, si, usd


def topology_json(est: TopologyEstimate) -> dict[str, Any]:
    """The whole estimate as a JSON-ready mapping (inf and nan become null)."""
    out: dict[str, Any] = jsonable(est)
    return out


# The shared compact formats (report/terminal.py) under the names this module's callers use.
fmt_time = duration
fmt_bytes = nbytes
fmt_usd = usd


def schedule_text(est: TopologyEstimate) -> str:
    """'P = 8 fragments', or the listed schedule 'fragments at steps 0, 50 (8, 24 layers)'."""
    frags = est.settings.fragments
    if isinstance(frags, int):
        return f"P = {frags} fragments"
    steps = ", ".join(str(f.offset) for f in frags)
    layers = ", ".join(str(f.layers) for f in frags)
    return f"fragments at steps {steps} ({layers} layers)"


def _overlaps(est: TopologyEstimate) -> str:
    """What the exchange may hide behind: the backward, τ steps, the next round."""
    s = est.settings
    parts = ["backward overlap"] if s.backward_overlap else ["no backward overlap"]
    if s.outer_overlap and est.mode in ("diloco", "streaming"):
        parts.append("eager (hidden behind the next round)")
    elif s.overlap_steps and est.mode in ("diloco", "streaming"):
        parts.append(f"τ = {s.overlap_steps}")
    return ", ".join(parts)


def _mode_line(est: TopologyEstimate) -> str:
    s = est.settings
    reduce = "object storage" if s.reduce == "bucket" else f"{s.reduce} all-reduce"
    if est.mode == "sync":
        return f"sync DP across islands, {est.payload} gradients, {reduce}, {_overlaps(est)}"
    base = f"H = {s.inner_steps}, {est.payload} pseudo-gradients"
    if s.balance_steps and est.mode in ("diloco", "streaming"):
        base += " (H_i balanced to island speed)"
    if est.mode == "diloco":
        return f"DiLoCo, {base}, {reduce}, {_overlaps(est)}"
    if est.mode == "streaming":
        return f"Streaming DiLoCo, {base}, {schedule_text(est)}, {_overlaps(est)}"
    return f"asynchronous parameter server, {base}"


def wan_text(est: TopologyEstimate) -> str:
    """'3.85 s per round: 3.85 s hidden, 0 s exposed' (the pacing island's exchange)."""
    exposed = max(0.0, est.wan_comm_s - est.wan_hidden_s)
    return (
        f"{fmt_time(est.wan_comm_s)} per round: {fmt_time(est.wan_hidden_s)} hidden under "
        f"compute, {fmt_time(exposed)} exposed"
    )


def failure_text(est: TopologyEstimate) -> str:
    """Failures in one line: rate, goodput, checkpoint interval and its Young/Daly optimum."""
    f = est.failures
    every = "never" if f.checkpoint_interval_s == math.inf else fmt_time(f.checkpoint_interval_s)
    best = "none" if f.optimal_interval_s == math.inf else fmt_time(f.optimal_interval_s)
    scope = "a failure stalls every island" if f.shared_stall else "a failure stops its island"
    return (
        f"{f.failures_per_day:.3g} per day, goodput {f.goodput:.1%} ({scope}); checkpoint "
        f"every {every} (Young/Daly: {best})"
    )


def summary_table(est: TopologyEstimate) -> Table:
    """Totals: throughput, utilization, time, cost, regime and thresholds."""
    t = Table(title=f"{est.name}: {_mode_line(est)}", show_header=False, title_justify="left")
    t.add_column("what", style="bold", no_wrap=True)
    t.add_column("value", overflow="fold")
    t.add_row("islands / GPUs", f"{len(est.islands)} / {est.n_gpus}")
    t.add_row("model parameters", si(est.n_params))
    given = [isl.name for isl in est.islands if isl.step_source == "given"]
    if given:
        t.add_row("inner step times", f"given for {', '.join(given)}; the others predicted")
    t.add_row(
        "tokens/s (total, per GPU)", f"{si(est.tokens_per_s)} ({si(est.tokens_per_s_per_gpu)})"
    )
    shares = ", ".join(f"{k} {v:.1%}" for k, v in est.time_shares.items() if v > 5e-4)
    t.add_row("compute utilization", f"{est.utilization:.1%}  ({shares})")
    t.add_row("round (slowest island)", fmt_time(est.round_s))
    t.add_row("WAN exchange", wan_text(est))
    t.add_row(
        "payload",
        f"{est.payload}: {est.payload_bits_per_param:.3g} bits per parameter, "
        f"{fmt_bytes(est.payload_bits_per_param * est.n_params / 8)} per exchange",
    )
    t.add_row(
        "WAN bytes per round / run",
        f"{fmt_bytes(est.wan_bytes_per_round)} / {fmt_bytes(est.wan_bytes_total)}",
    )
    t.add_row(f"wall-clock to {si(est.tokens)} tokens", fmt_time(est.wall_s))
    t.add_row(
        "cost (GPU + egress)",
        f"{fmt_usd(est.cost_usd)} = {fmt_usd(est.gpu_cost_usd)} + {fmt_usd(est.egress_cost_usd)}"
        f"  ({fmt_usd(est.usd_per_mtok)} per M tokens)",
    )
    if est.settings.failures.enabled:
        f = est.failures
        t.add_row("failures", failure_text(est))
        t.add_row(
            "without failures",
            f"{fmt_time(f.wall_s_failure_free)}, {fmt_usd(f.cost_usd_failure_free)}",
        )
    if est.quality_factor != 1.0:
        t.add_row(
            f"quality-adjusted (×{est.quality_factor:g} tokens)",
            f"{fmt_time(est.wall_s_adjusted)}, {fmt_usd(est.cost_usd_adjusted)}",
        )
    b = est.bottleneck
    t.add_row("regime", est.regime)
    t.add_row("bottleneck", f"island {b.island}; link {b.link}; phase {b.phase}")
    th = f"utilization ≥ {est.threshold:.0%}"
    if est.mode != "sync":
        h = "unreachable" if est.min_inner_steps is None else f"H ≥ {est.min_inner_steps}"
        t.add_row(f"compute-bound ({th}) at", h)
    if math.isfinite(est.wan_gbit):
        need = "unreachable" if est.min_wan_gbit is None else f"{est.min_wan_gbit:.3g} Gbit/s"
        t.add_row(
            f"WAN for {th}", f"{need} on {b.link} (now {est.wan_gbit:.3g} Gbit/s, others scaled)"
        )
    if est.hide_wan_gbit is not None:
        t.add_row("WAN to hide the exchange", f"{est.hide_wan_gbit:.3g} Gbit/s on {b.link}")
    return t


# Per-island columns; at 80 columns the plan, MFU, H, wait, WAN and staleness give way first.
ISLAND_COLUMNS: tuple[Col, ...] = (
    Col("island", "left"),
    Col("GPUs", "left"),
    Col("plan", "left", drop=3),
    Col("step", drop=1),
    Col("MFU", drop=4),
    Col("H", drop=4),
    Col("tok/s/GPU"),
    Col("util"),
    Col("wait", drop=2),
    Col("WAN", drop=2),
    Col("stale", drop=5),
    Col("$"),
)


def islands_table(est: TopologyEstimate, console: Console) -> Table:
    """One row per island, the columns that fit ``console`` (``--wide``: all)."""
    rows = [
        [
            isl.name,
            f"{isl.n_gpus}× {isl.accelerator}",
            "-" if isl.plan is None else plan_label(isl.plan, batch=False),
            fmt_time(isl.step.step_time_s) + ("*" if isl.step_source == "given" else ""),
            f"{isl.step.mfu:.0%}",
            f"{isl.inner_steps:g}",
            si(isl.tokens_per_s_per_gpu),
            f"{isl.utilization:.1%}",
            fmt_time(isl.straggler_s) if isl.straggler_s > 0 else "-",
            fmt_time(isl.wan_exposed_s) if isl.wan_exposed_s > 0 else "-",
            f"{isl.staleness:.2g}",
            fmt_usd(isl.gpu_cost_usd + isl.egress_cost_usd),
        ]
        for isl in est.islands
    ]
    return fit_table(console, "per island", ISLAND_COLUMNS, rows)


MODE_COLUMNS: tuple[Col, ...] = (
    Col("mode", "left"),
    Col("tokens/s"),
    Col("util"),
    Col("goodput", drop=2),
    Col("time"),
    Col("cost"),
    Col("regime", "left", drop=1),
)


def modes_table(ests: list[TopologyEstimate], console: Console) -> Table:
    """One row per outer mode: throughput, utilization, goodput, expected time and cost."""
    rows = [
        [
            est.mode,
            si(est.tokens_per_s),
            f"{est.utilization:.1%}",
            f"{est.failures.goodput:.1%}",
            fmt_time(est.wall_s),
            fmt_usd(est.cost_usd),
            est.regime,
        ]
        for est in ests
    ]
    return fit_table(console, f"{ests[0].name}: the outer modes compared", MODE_COLUMNS, rows)


def render_topology(est: TopologyEstimate, console: Console | None = None) -> None:
    """Print the summary and per-island tables."""
    out = console or Console()
    out.print(summary_table(est))
    out.print(islands_table(est, out))
