"""Views of a PlanSearchResult: rich tables, the JSON document (schema below), the plot.

JSON schema `shardmeter.plan/1` (stable; fields are only ever added):
  schema, kind ("cluster"|"topology"), model, target, tokens, constraints{deadline_s,
  budget_usd, memory_headroom, max_gpus_per_island}, stats{space, pruned_memory, pruned_bound,
  evaluated, runnable, fitting, outer_combinations, elapsed_s, eval_cpu_s, evals_per_cpu_s,
  jobs}, best{time, cost, usd_per_mtok} (candidates or null), ranked[] (candidates meeting the
  constraints, fastest first, `rank` from 1), pareto[] (time-cost front, fastest first),
  explanation{speedup, terms[{term, winner, runner_up}] (s per million tokens), plan_diffs[],
  text} or null, infeasible{binding, closest, text} or null.
  A candidate: n_gpus, tokens_per_s, wall_s, cost_usd, usd_per_mtok, mfu, utilization, meets,
  outer{mode, inner_steps, bits, fragments, overlap_steps} or null, islands[{name,
  accelerator, n_gpus, plan{Plan fields}, step_time_s, tokens_per_s, mfu, memory_bytes,
  hbm_bytes, time_breakdown_s{...} (exposed), time_hidden_s{...} (each collective's seconds
  hidden under compute), bottleneck, regime}].
"""

from __future__ import annotations

import math
from collections.abc import Sequence
from pathlib import Path
from typing import Any

import numpy as np
from numpy.typing import NDArray
from rich.console import Console
from rich.table import Table

from shardmeter.io import atomic_savefig
from shardmeter.report.plotfiles import check_plot_path
from shardmeter.report.step import plan_label
from shardmeter.report.terminal import Col, duration, fit_table, pct, si, usd
from shardmeter.search.pareto import pareto_front
from shardmeter.search.result import Candidate, PlanSearchResult

SCHEMA = "shardmeter.plan/1"


def _num(x: float) -> float | None:
    return x if math.isfinite(x) else None


def candidate_json(c: Candidate, rank: int | None = None) -> dict[str, Any]:
    """One candidate as plain JSON values (see the module docstring)."""
    out: dict[str, Any] = {} if rank is None else {"rank": rank}
    out.update(
        n_gpus=c.n_gpus,
        tokens_per_s=_num(c.tokens_per_s),
        wall_s=_num(c.wall_s),
        cost_usd=_num(c.cost_usd),
        usd_per_mtok=_num(c.usd_per_mtok),
        mfu=_num(c.mfu),
        utilization=_num(c.utilization),
        meets=c.meets,
        outer=None if c.outer is None else dict(c.outer.__dict__),
        islands=[
            {
                "name": i.name,
                "accelerator": i.accelerator,
                "n_gpus": i.n_gpus,
                "plan": i.plan.model_dump(),
                "step_time_s": i.step.step_time_s,
                "tokens_per_s": i.step.tokens_per_s,
                "mfu": i.step.mfu,
                "memory_bytes": i.step.memory_bytes,
                "hbm_bytes": i.step.hbm_bytes,
                "time_breakdown_s": dict(i.step.time_breakdown),
                "time_hidden_s": dict(i.step.time_hidden),
                "bottleneck": i.step.bottleneck,
                "regime": i.step.regime,
            }
            for i in c.islands
        ],
    )
    return out


def result_json(res: PlanSearchResult) -> dict[str, Any]:
    """The whole search result as a JSON-ready mapping."""
    st = res.stats
    con = res.constraints

    def opt(c: Candidate | None) -> dict[str, Any] | None:
        return None if c is None else candidate_json(c)

    exp = res.explanation
    inf = res.infeasible
    return {
        "schema": SCHEMA,
        "kind": res.kind,
        "model": res.model,
        "target": res.target,
        "tokens": res.tokens,
        "constraints": {
            "deadline_s": con.deadline_s,
            "budget_usd": con.budget_usd,
            "memory_headroom": con.memory_headroom,
            "max_gpus_per_island": con.max_gpus_per_island,
        },
        "stats": {
            "space": st.space,
            "pruned_memory": st.pruned_memory,
            "pruned_bound": st.pruned_bound,
            "evaluated": st.evaluated,
            "runnable": st.runnable,
            "fitting": st.fitting,
            "outer_combinations": st.outer_combinations,
            "elapsed_s": st.elapsed_s,
            "eval_cpu_s": st.eval_cpu_s,
            "evals_per_cpu_s": _num(st.evals_per_cpu_s),
            "jobs": st.jobs,
        },
        "best": {
            "time": opt(res.best_time),
            "cost": opt(res.best_cost),
            "usd_per_mtok": opt(res.best_usd_per_mtok),
        },
        "ranked": [candidate_json(c, k + 1) for k, c in enumerate(res.ranked)],
        "pareto": [candidate_json(c) for c in res.pareto],
        "explanation": None
        if exp is None
        else {
            "speedup": exp.speedup,
            "terms": [
                {"term": t.term, "winner": t.winner, "runner_up": t.runner_up} for t in exp.terms
            ],
            "plan_diffs": list(exp.plan_diffs),
            "text": exp.text,
        },
        "infeasible": None
        if inf is None
        else {"binding": inf.binding, "closest": opt(inf.closest), "text": inf.text},
    }


def candidate_label(c: Candidate) -> str:
    """One short line: the inner plan (one cluster), or the outer settings and islands used."""
    if c.outer is None:
        return plan_label(c.islands[0].plan)
    o = c.outer
    if o.mode == "single":
        return ", ".join(f"{i.name}×{i.n_gpus}" for i in c.islands)
    if o.mode == "sync":
        head = "sync DP"
    else:
        head = f"{o.mode} H={o.inner_steps} q={o.bits}"
        if o.mode == "streaming":
            head += f" P={o.fragments} τ={o.overlap_steps}"
    if len(c.islands) <= 2:
        return head + ": " + ", ".join(f"{i.name}×{i.n_gpus}" for i in c.islands)
    return f"{head}, {len(c.islands)} islands"


ISLAND_COLUMNS: tuple[Col, ...] = (
    Col("island", "left"),
    Col("GPU", "left", drop=2),
    Col("GPUs"),
    Col("step"),
    Col("MFU", drop=1),
    Col("inner plan", "left"),
)
CANDIDATE_COLUMNS: tuple[Col, ...] = (
    Col(""),
    Col("GPUs"),
    Col("tokens/s", drop=2),
    Col("MFU", drop=3),
    Col("time"),
    Col("cost"),
    Col("$/Mtok", drop=1),
    Col("plan", "left"),
)


def islands_table(c: Candidate, console: Console) -> Table:
    """The islands of one candidate: GPUs, inner plan, step time and MFU."""
    rows = [
        [
            i.name,
            i.accelerator,
            str(i.n_gpus),
            duration(i.step.step_time_s),
            pct(i.step.mfu),
            plan_label(i.plan),
        ]
        for i in c.islands
    ]
    return fit_table(console, "Islands of the fastest plan", ISLAND_COLUMNS, rows)


def _table(console: Console, title: str, rows: list[tuple[str, Candidate]]) -> Table:
    cells = [
        [
            label,
            str(c.n_gpus),
            si(c.tokens_per_s),
            pct(c.mfu),
            duration(c.wall_s),
            usd(c.cost_usd),
            usd(c.usd_per_mtok),
            candidate_label(c),
        ]
        for label, c in rows
    ]
    return fit_table(console, title, CANDIDATE_COLUMNS, cells)


def spread(items: Sequence[Candidate], k: int) -> list[Candidate]:
    """At most ``k`` items evenly spaced along the list, the first and the last included."""
    if k <= 1:
        return list(items[: max(k, 0)])
    if len(items) <= k:
        return list(items)
    picks = sorted({round(i * (len(items) - 1) / (k - 1)) for i in range(k)})
    return [items[i] for i in picks]


def stats_line(res: PlanSearchResult) -> str:
    st = res.stats
    line = (
        f"Searched {st.space:,} plans in {st.elapsed_s:.2f} s: {st.pruned_memory:,} pruned by the "
        f"memory bound, {st.pruned_bound:,} by the time bound, {st.evaluated:,} evaluated "
        f"({st.fitting:,} fit in memory)"
    )
    if st.outer_combinations:
        line += f"; {st.outer_combinations:,} island/outer combinations composed"
    return line + "."


def render_result(
    res: PlanSearchResult, console: Console | None = None, top: int = 5, front: int = 8
) -> None:
    """Best plans by each objective, ``front`` plans spread along the Pareto front, the
    ``top`` ranks, the fastest plan's islands, and why it wins."""
    console = console or Console()
    console.print(f"[bold]{res.model}[/] on [bold]{res.target}[/], {si(res.tokens)} tokens")
    console.print(stats_line(res))
    if res.infeasible is not None:
        console.print(f"[bold red]{res.infeasible.text}[/]")
        if res.infeasible.closest is not None:
            closest = [("closest", res.infeasible.closest)]
            console.print(_table(console, "Closest plan", closest))
        return
    best = [
        (name, c)
        for name, c in (
            ("fastest", res.best_time),
            ("cheapest", res.best_cost),
            ("$/Mtok", res.best_usd_per_mtok),
        )
        if c is not None
    ]
    console.print(_table(console, "Best plans", best))
    shown = spread(res.pareto, front)
    title = "Time-cost Pareto front"
    if len(shown) < len(res.pareto):
        title += f" ({len(shown)} of {len(res.pareto)} plans, evenly spaced; --json lists all)"
    console.print(_table(console, title, [("", c) for c in shown]))
    if top > 1:  # rank 1 is the fastest plan above
        ranked = [(f"#{k + 1}", c) for k, c in enumerate(res.ranked[:top])]
        console.print(_table(console, "Ranked by wall-clock", ranked))
    if res.best_time is not None and res.best_time.outer is not None:
        console.print(islands_table(res.best_time, console))
    if res.explanation is not None:
        console.print(f"[bold]Why #1 wins:[/] {res.explanation.text}")


def front_line(res: PlanSearchResult) -> tuple[NDArray[np.float64], NDArray[np.float64]]:
    """(wall s, cost USD) of the Pareto line the plot draws: the front of the plotted points
    within the deadline and budget (the search puts its whole front among them), fastest
    first, so the line joins plotted points only."""
    w, c = res.cloud_wall_s, res.cloud_cost_usd
    con = res.constraints
    ok = np.isfinite(w) & np.isfinite(c)
    if con.deadline_s is not None:
        ok &= w <= con.deadline_s
    if con.budget_usd is not None:
        ok &= c <= con.budget_usd
    idx = np.flatnonzero(ok)
    front = idx[pareto_front(w[idx], c[idx])]
    front = front[np.argsort(w[front], kind="stable")]
    return w[front], c[front]


def plot_result(res: PlanSearchResult, path: Path) -> Path:
    """Scatter the evaluated plans (time vs cost), draw the Pareto front and mark the bests."""
    check_plot_path("--plot", path)
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    day = 86400.0
    fig, ax = plt.subplots(figsize=(7.5, 5))
    groups = res.cloud_labels or ("evaluated plans",)
    colors = plt.get_cmap("tab10" if len(groups) <= 10 else "viridis")
    for g, label in enumerate(groups):
        sel = res.cloud_group == g if res.cloud_labels else slice(None)
        if not np.any(res.cloud_wall_s[sel].size):
            continue
        ax.scatter(
            res.cloud_wall_s[sel] / day,
            res.cloud_cost_usd[sel],
            s=4,
            color=colors(g / max(len(groups) - 1, 1)) if len(groups) > 10 else colors(g),
            alpha=0.35,
            label=label,
            rasterized=True,
        )
    line_w, line_c = front_line(res)
    if line_w.size:
        ax.plot(
            line_w / day,
            line_c,
            "o-",
            color="black",
            ms=4,
            label=f"Pareto front ({line_w.size} plans)",
        )
    for c, marker, name in ((res.best_time, "*", "fastest"), (res.best_cost, "D", "cheapest")):
        if c is not None:
            ax.plot(
                c.wall_s / day,
                c.cost_usd,
                marker,
                color="black",
                ms=10,
                label=f"{name}: {candidate_label(c)[:60]}",
            )
    con = res.constraints
    if con.deadline_s is not None:
        ax.axvline(con.deadline_s / day, color="tab:blue", ls="--", lw=1, label="deadline")
    if con.budget_usd is not None:
        ax.axhline(con.budget_usd, color="tab:green", ls="--", lw=1, label="budget")
    ax.set_xscale("log")
    if res.cloud_cost_usd.size and float(res.cloud_cost_usd.min()) > 0:
        ax.set_yscale("log")
    ax.set_xlabel(f"wall-clock for {res.tokens:.3g} tokens (days)")
    ax.set_ylabel("cost (USD)")
    st = res.stats
    what = (
        f"{st.outer_combinations:,} composed plans"
        if st.outer_combinations
        else (f"{st.fitting:,} fitting plans")
    )
    ax.set_title(f"{res.model} on {res.target}: {what} ({res.cloud_wall_s.size:,} shown)")
    ax.grid(True, which="both", alpha=0.3)
    ax.legend(fontsize=7, loc="best")
    atomic_savefig(fig, path, format=path.suffix[1:], dpi=110, bbox_inches="tight")
    plt.close(fig)
    return path
