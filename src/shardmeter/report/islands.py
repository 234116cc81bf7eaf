"""Views of a TopologyEstimate: rich terminal tables and a JSON-ready mapping."""

from __future__ import annotations

import math
from typing import Any

from rich.console import Console
from rich.table import Table

from shardmeter.estimate.islands import IslandEstimate, TopologyEstimate
from shardmeter.report.jsonout import jsonable


def topology_json(est: TopologyEstimate) -> dict[str, Any]:
    """The whole estimate as a JSON-ready mapping (inf and nan become null)."""
    out: dict[str, Any] = jsonable(est)
    return out


def fmt_time(seconds: float) -> str:
    """Seconds in the largest sensible unit."""
    if not math.isfinite(seconds):
        return "∞"
    for unit, size in (
        ("y", 365.25 * 86400.0),
        ("d", 86400.0),
        ("h", 3600.0),
        ("min", 60.0),
        ("s", 1.0),
    ):
        if seconds >= size:
            return f"{seconds / size:.3g} {unit}"
    return f"{seconds * 1e3:.3g} ms"


def fmt_bytes(n: float) -> str:
    for unit, size in (("PB", 1e15), ("TB", 1e12), ("GB", 1e9), ("MB", 1e6)):
        if n >= size:
            return f"{n / size:.3g} {unit}"
    return f"{n:.3g} B"


def fmt_usd(x: float) -> str:
    return f"${x:,.0f}" if x >= 100 else f"${x:.3g}"


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
    t.add_column("what", style="bold")
    t.add_column("value")
    t.add_row("islands / GPUs", f"{len(est.islands)} / {est.n_gpus}")
    t.add_row("model parameters", f"{est.n_params / 1e9:.3g} B")
    given = [isl.name for isl in est.islands if isl.step_source == "given"]
    if given:
        t.add_row("inner step times", f"given for {', '.join(given)}; the others predicted")
    t.add_row(
        "tokens/s (total, per GPU)", f"{est.tokens_per_s:,.0f}  ({est.tokens_per_s_per_gpu:,.0f})"
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
    t.add_row(f"wall-clock to {est.tokens:.3g} tokens", fmt_time(est.wall_s))
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


def plan_label(isl: IslandEstimate) -> str:
    """Short plan text: 'HSDP8 mb2', 'FSDP tp2 mb1 rc:full'."""
    p = isl.plan
    if p is None:
        return "-"
    shard: str = "FSDP" if p.sharding == "zero3" else p.sharding
    if p.sharding != "none" and p.shard_degree not in (None, p.dp):
        shard = f"HSDP{p.shard_degree}"
    if p.sharding == "none":
        shard = "DDP"
    parts = [shard] + [f"{k}{v}" for k, v in (("tp", p.tp), ("pp", p.pp), ("cp", p.cp)) if v > 1]
    parts.append(f"mb{p.micro_batch}")
    if p.recompute != "none":
        parts.append(f"rc:{p.recompute[:3]}")
    return " ".join(parts)


def islands_table(est: TopologyEstimate) -> Table:
    """One row per island."""
    t = Table(title="per island", title_justify="left")
    heads: tuple[str, ...] = ("island", "GPUs", "plan", "step", "MFU", "H", "tok/s/GPU")
    heads = (*heads, "util", "wait", "WAN", "stale")
    widest = max(len(isl.name) for isl in est.islands)
    for col in (*heads, "$"):
        t.add_column(
            col,
            justify="left" if col in ("island", "GPUs", "plan") else "right",
            no_wrap=col == "island",
            min_width=widest if col == "island" else None,
        )
    for isl in est.islands:
        t.add_row(
            isl.name,
            f"{isl.n_gpus}× {isl.accelerator}",
            plan_label(isl),
            fmt_time(isl.step.step_time_s) + ("*" if isl.step_source == "given" else ""),
            f"{isl.step.mfu:.0%}",
            f"{isl.inner_steps:g}",
            f"{isl.tokens_per_s_per_gpu:,.0f}",
            f"{isl.utilization:.1%}",
            fmt_time(isl.straggler_s) if isl.straggler_s > 0 else "-",
            fmt_time(isl.wan_exposed_s) if isl.wan_exposed_s > 0 else "-",
            f"{isl.staleness:.2g}",
            fmt_usd(isl.gpu_cost_usd + isl.egress_cost_usd),
        )
    return t


def modes_table(ests: list[TopologyEstimate]) -> Table:
    """One row per outer mode: throughput, utilization, goodput, expected time and cost."""
    t = Table(title=f"{ests[0].name}: the outer modes compared", title_justify="left")
    for col in ("mode", "tokens/s", "util", "goodput", "time", "cost", "regime"):
        t.add_column(col, justify="left" if col in ("mode", "regime") else "right")
    for est in ests:
        t.add_row(
            est.mode,
            f"{est.tokens_per_s:,.0f}",
            f"{est.utilization:.1%}",
            f"{est.failures.goodput:.1%}",
            fmt_time(est.wall_s),
            fmt_usd(est.cost_usd),
            est.regime,
        )
    return t


def render_topology(est: TopologyEstimate, console: Console | None = None) -> None:
    """Print the summary and per-island tables."""
    out = console or Console()
    out.print(summary_table(est))
    out.print(islands_table(est))
