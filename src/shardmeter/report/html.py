"""Interactive HTML pages of `shardmeter predict`, `plan`, `sweep` and `predict --topology`.

Views of the same result objects the terminal tables and `--json` show (`StepEstimate`,
`PlanSearchResult`, `TopologyEstimate`, `SweepResult`); the page embeds the command's JSON
document and draws from it. Page machinery (plotly.js inlined, no network): `htmlpage.py`.
"""

from __future__ import annotations

import math
from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any

import numpy as np

from shardmeter.analysis import SweepResult
from shardmeter.estimate.islands import TopologyEstimate
from shardmeter.estimate.result import MEMORY_COMPONENTS, TIME_COMPONENTS, StepEstimate
from shardmeter.estimate.wan import wan_paths
from shardmeter.report.htmlpage import COLORS, Cell, Page, esc, fill_layout
from shardmeter.report.islands import topology_json, wan_text
from shardmeter.report.jsonout import jsonable
from shardmeter.report.plan import candidate_json, candidate_label, front_line, result_json
from shardmeter.report.step import TIME_LABELS, estimate_to_dict, plan_label, plan_summary
from shardmeter.report.terminal import duration, nbytes, pct, si, usd
from shardmeter.search.result import Candidate, PlanSearchResult
from shardmeter.specs.hardware import Cluster
from shardmeter.specs.model import TransformerSpec
from shardmeter.specs.plan import Plan
from shardmeter.specs.topology import Topology
from shardmeter.version import __version__

DAY = 86400.0
FIGURE_HEIGHT = 400  # px, the selected plan's two bar charts
GB = 1e9
MEMORY_LABELS: dict[str, str] = {
    "weights": "weights",
    "gradients": "gradients",
    "optimizer_states": "optimizer states",
    "activations": "activations",
    "buffers": "buffers (gathers, buckets, logits)",
    "overhead": "overhead (context, NCCL, fragmentation)",
}


def _finite(x: float) -> float | None:
    return float(x) if math.isfinite(x) else None


def _num(x: float) -> Cell:
    return Cell(si(x), _finite(x))


# -- one island's step: breakdown words and stacked bars ------------------------------------
def per_island(names: Sequence[str]) -> str:
    """' per island' in a title when there are several bars."""
    return " per island" if len(names) > 1 else ""


def step_words(step: StepEstimate) -> str:
    """The step in one sentence: its time, compute share, largest other cost, regime, memory."""
    total = step.step_time_s
    others = {k: v for k, v in step.time_breakdown.items() if k != "compute" and v > 0}
    compute = step.time_breakdown.get("compute", 0.0)
    text = f"A step takes {duration(total)}: compute {pct(compute / total)}"
    if others:
        worst = max(others, key=lambda k: others[k])
        label = TIME_LABELS.get(worst, worst)
        text += f"; the largest other term is {label}, {pct(others[worst] / total)}"
    verdict = "fits" if step.fits else "does NOT fit"
    return (
        f"{text}. Regime: {step.regime}; bottleneck: {step.bottleneck}. Memory per GPU "
        f"{nbytes(step.memory_bytes)} of {nbytes(step.hbm_bytes)} ({verdict})."
    )


def step_time_figure(names: Sequence[str], steps: Sequence[StepEstimate]) -> dict[str, Any]:
    """Per island two bars side by side: the exposed step-time components stacked (they add up
    to the step), and, hatched, the seconds each collective runs hidden under compute (on the
    wire, not in the step). Stacked within each group by explicit bases."""
    traces = []
    for group, times, suffix in (
        ("exposed", [s.time_breakdown for s in steps], ""),
        ("hidden", [s.time_hidden for s in steps], " (hidden)"),
    ):
        base = [0.0] * len(steps)
        for k, key in enumerate(TIME_COMPONENTS):
            ys = [t.get(key, 0.0) for t in times]
            if not any(y > 0 for y in ys):
                continue
            marker: dict[str, Any] = {"color": COLORS[k % len(COLORS)]}
            if group == "hidden":
                marker |= {"opacity": 0.55, "pattern": {"shape": "/"}}
            traces.append(
                {
                    "type": "bar",
                    "name": TIME_LABELS.get(key, key).replace(" (exposed)", "") + suffix,
                    "x": list(names),
                    "y": ys,
                    "base": list(base),
                    "offsetgroup": group,
                    "marker": marker,
                    "hovertemplate": f"%{{x}}: %{{y:.4g}} s {group}<extra>%{{fullData.name}}"
                    "</extra>",
                    "meta": {"kind": group, "term": key},
                }
            )
            base = [b + y for b, y in zip(base, ys, strict=True)]
    return {
        "data": traces,
        "layout": {
            "barmode": "group",
            "title": {
                "text": f"Step time{per_island(names)}: exposed (left), hidden (right, hatched)"
            },
            "yaxis": {"title": {"text": "seconds per step"}},
            "xaxis": {"tickangle": -30, "automargin": True},
        },
    }


def memory_figure(names: Sequence[str], steps: Sequence[StepEstimate]) -> dict[str, Any]:
    """Stacked bars of memory per GPU (GB) by component, and each island's HBM capacity."""
    traces: list[dict[str, Any]] = []
    for k, key in enumerate(MEMORY_COMPONENTS):
        traces.append(
            {
                "type": "bar",
                "name": MEMORY_LABELS.get(key, key),
                "x": list(names),
                "y": [s.memory_breakdown.get(key, 0.0) / GB for s in steps],
                "marker": {"color": COLORS[(k + 2) % len(COLORS)]},
                "hovertemplate": "%{x}: %{y:.3g} GB<extra>%{fullData.name}</extra>",
            }
        )
    traces.append(
        {
            "type": "scatter",
            "mode": "markers",
            "name": "HBM per GPU",
            "x": list(names),
            "y": [s.hbm_bytes / GB for s in steps],
            "marker": {"symbol": "line-ew-open", "size": 40, "line": {"width": 3}},
            "hovertemplate": "%{x}: HBM %{y:.3g} GB<extra></extra>",
        }
    )
    return {
        "data": traces,
        "layout": {
            "barmode": "stack",
            "title": {"text": f"Memory per GPU (peak){per_island(names)} and HBM capacity"},
            "yaxis": {"title": {"text": "GB per GPU"}},
            "xaxis": {"tickangle": -30, "automargin": True},
        },
    }


# -- plan ------------------------------------------------------------------------------------
def candidate_doc(c: Candidate, rank: int | None = None) -> dict[str, Any]:
    """`candidate_json` plus each island's memory breakdown (bytes per GPU)."""
    doc = candidate_json(c, rank)
    for island, choice in zip(doc["islands"], c.islands, strict=True):
        island["memory_breakdown_bytes"] = dict(choice.step.memory_breakdown)
    return doc


def _outer_text(c: Candidate) -> str:
    o = c.outer
    if o is None or o.mode == "single":
        return "one cluster" if o is None else "one island, no outer loop"
    if o.mode == "sync":
        return "synchronous data parallelism across islands"
    text = f"{o.mode}, H = {o.inner_steps} inner steps, {o.bits}-bit pseudo-gradients"
    if o.mode == "streaming":
        text += f", P = {o.fragments} fragments, τ = {o.overlap_steps}"
    return text


def candidate_view(
    c: Candidate, title: str, topo_est: TopologyEstimate | None = None
) -> dict[str, Any]:
    """What the page shows for one selected plan: a summary (HTML), two stacked-bar figures."""
    names = [i.name for i in c.islands]
    steps = [i.step for i in c.islands]
    rows = "".join(
        f"<tr><td>{esc(i.name)}</td><td>{esc(i.accelerator)}</td><td>{i.n_gpus}</td>"
        f"<td>{esc(duration(i.step.step_time_s))}</td><td>{esc(pct(i.step.mfu))}</td>"
        f"<td>{esc(i.step.bottleneck)}</td><td>{esc(i.step.regime)}</td>"
        f"<td>{esc(plan_label(i.plan))}</td></tr>"
        for i in c.islands
    )
    words = [step_words(i.step) if len(c.islands) == 1 else "" for i in c.islands[:1]]
    if len(c.islands) > 1:
        slowest = max(c.islands, key=lambda i: i.step.step_time_s)
        words = [
            f"The islands spend {pct(c.utilization)} of the wall-clock in inner steps; the "
            f"slowest inner step is {slowest.name}'s ({duration(slowest.step.step_time_s)}, "
            f"{slowest.step.regime}, bottleneck {slowest.step.bottleneck})."
        ]
    if topo_est is not None:
        b = topo_est.bottleneck
        words.append(
            f"Across islands the run is {topo_est.regime}: bottleneck island {b.island}, link "
            f"{b.link}, phase {b.phase}. WAN exchange: {wan_text(topo_est)}."
        )
    summary = (
        f"<h3>{esc(title)}: {esc(candidate_label(c))}</h3>"
        f"<p>{c.n_gpus} GPUs · {esc(si(c.tokens_per_s))} tokens/s · "
        f"{esc(duration(c.wall_s))} · {esc(usd(c.cost_usd))} · "
        f"{esc(usd(c.usd_per_mtok))} per M tokens · MFU {esc(pct(c.mfu))} · "
        f"{esc(_outer_text(c))}{'' if c.meets else ' · misses the deadline or budget'}</p>"
        f'<p class="words">{"<br>".join(esc(w) for w in words if w)}</p>'
        "<table><thead><tr><th>island</th><th>GPU</th><th>GPUs</th><th>step</th><th>MFU</th>"
        "<th>bottleneck</th><th>regime</th><th>inner plan</th></tr></thead>"
        f"<tbody>{rows}</tbody></table>"
    )
    time_fig, memory_fig = step_time_figure(names, steps), memory_figure(names, steps)
    return {
        "title": title,
        "html": summary,
        "time": {**time_fig, "layout": fill_layout(time_fig["layout"], FIGURE_HEIGHT)},
        "memory": {**memory_fig, "layout": fill_layout(memory_fig["layout"], FIGURE_HEIGHT)},
    }


def _candidate_hover(c: Candidate, title: str) -> str:
    return (
        f"<b>{esc(title)}</b><br>{esc(candidate_label(c)[:90])}<br>{c.n_gpus} GPUs, "
        f"{esc(duration(c.wall_s))}, {esc(usd(c.cost_usd))} ({esc(usd(c.usd_per_mtok))}/Mtok)"
        "<br>click: show its breakdown"
    )


def pareto_figure(
    res: PlanSearchResult, picks: Sequence[tuple[str, Candidate]], ranked_n: int
) -> dict[str, Any]:
    """Time vs cost of the evaluated plans (a sample), the top plans and the Pareto front;
    buttons switch the y axis between cost and $ per million tokens."""
    per_mtok = 1e6 / res.tokens
    traces: list[dict[str, Any]] = []
    wall, cost = res.cloud_wall_s, res.cloud_cost_usd
    ok = np.isfinite(wall) & np.isfinite(cost)
    groups = res.cloud_labels or ("evaluated plans",)
    for g, label in enumerate(groups):
        sel = ok & (res.cloud_group == g) if res.cloud_labels else ok
        if not np.any(sel):
            continue
        traces.append(
            {
                "type": "scatter",
                "mode": "markers",
                "name": f"{label} (sample)",
                "x": (wall[sel] / DAY).round(6).tolist(),
                "y": cost[sel].round(4).tolist(),
                "marker": {"size": 4, "opacity": 0.35, "color": COLORS[g % len(COLORS)]},
                # No hover: a click near the front must pick the front's plan, not a sample point
                # without a plan behind it.
                "hoverinfo": "skip",
                "meta": {"kind": "cloud"},
            }
        )
    ranked = [(k, c) for k, (_, c) in enumerate(picks[:ranked_n])]
    front = [(k, c) for k, (_, c) in enumerate(picks) if k >= ranked_n]
    for name, items, style in (
        ("top plans (ranked)", ranked, {"symbol": "circle-open", "size": 9, "color": "#d62728"}),
        ("Pareto front", front, {"symbol": "circle", "size": 7, "color": "#000"}),
    ):
        if not items:
            continue
        traces.append(
            {
                "type": "scatter",
                "mode": "lines+markers" if name == "Pareto front" else "markers",
                "name": f"{name} ({len(items)})",
                "x": [c.wall_s / DAY for _, c in items],
                "y": [c.cost_usd for _, c in items],
                "customdata": [k for k, _ in items],
                "hovertext": [_candidate_hover(c, picks[k][0]) for k, c in items],
                "hoverinfo": "text",
                "marker": style,
                "line": {"color": "#000", "width": 1},
                "meta": {"kind": "front" if name == "Pareto front" else "ranked"},
            }
        )
    con = res.constraints
    ys = [y for t in traces for y in t["y"]]
    if con.deadline_s is not None and ys:
        traces.append(
            {
                "type": "scatter",
                "mode": "lines",
                "name": f"deadline {duration(con.deadline_s)}",
                "x": [con.deadline_s / DAY, con.deadline_s / DAY],
                "y": [min(ys), max(ys)],
                "line": {"dash": "dash", "color": "#1f77b4"},
                "hoverinfo": "name",
            }
        )
    costs_y = [list(t["y"]) for t in traces]
    mtok_y = [[y * per_mtok for y in t["y"]] for t in traces]
    line_w, _ = front_line(res)
    return {
        "data": traces,
        "layout": {
            "title": {
                "text": f"{esc(res.model)} on {esc(res.target)}, {si(res.tokens)} tokens: "
                f"{line_w.size} plans on the front of the sample",
                "y": 0.98,
            },
            "margin": {"l": 70, "r": 20, "t": 80, "b": 60},
            "xaxis": {"type": "log", "title": {"text": "wall-clock (days)"}},
            "yaxis": {"type": "log", "title": {"text": "cost (USD)"}},
            "updatemenus": [
                {
                    "type": "buttons",
                    "direction": "right",
                    "x": 0.0,
                    "xanchor": "left",
                    "y": 1.02,
                    "yanchor": "bottom",
                    "buttons": [
                        {
                            "label": "cost",
                            "method": "update",
                            "args": [{"y": costs_y}, {"yaxis.title.text": "cost (USD)"}],
                        },
                        {
                            "label": "$/Mtok",
                            "method": "update",
                            "args": [
                                {"y": mtok_y},
                                {"yaxis.title.text": "USD per million tokens"},
                            ],
                        },
                    ],
                }
            ],
        },
    }


PLAN_JS = r"""
function smSelect(k){
  var v=SM_EXTRA.views[k];if(!v)return;
  document.getElementById('sm-selected').innerHTML=v.html;
  document.getElementById('sm-selected').setAttribute('data-selected',String(k));
  Array.prototype.forEach.call(document.querySelectorAll('#sm-ranked tbody tr'),function(tr){
    tr.className=(tr.getAttribute('data-cand')===String(k))?'sel':'';});
  return Promise.all([smPlot('sm-time',v.time),smPlot('sm-memory',v.memory)]);
}
var SM_EXTRA=null;
function smAfter(figs,data,extra){
  SM_EXTRA=extra;
  var front=document.getElementById('sm-front');
  front.on('plotly_click',function(ev){
    var p=ev.points&&ev.points[0];if(p&&p.customdata!==undefined)smSelect(p.customdata);});
  Array.prototype.forEach.call(document.querySelectorAll('#sm-ranked tbody tr'),function(tr){
    tr.addEventListener('click',function(){smSelect(parseInt(tr.getAttribute('data-cand'),10));});});
  return smSelect(0);
}
"""


def plan_page(
    res: PlanSearchResult, command: str, inputs: Any = None, topology: Topology | None = None
) -> Page:
    """The plan search: words, the Pareto front (click a point), the ranked table (sortable,
    click a row), and the selected plan's step-time and memory bars per island."""
    doc = result_json(res)
    picks: list[tuple[str, Candidate]] = [(f"#{k + 1}", c) for k, c in enumerate(res.ranked)]
    if not picks and res.infeasible is not None and res.infeasible.closest is not None:
        picks = [("Closest plan (misses the constraints)", res.infeasible.closest)]
    n_top = len(picks)
    picks += [(f"Pareto front {k + 1}", c) for k, c in enumerate(res.pareto)]
    doc["candidates"] = [candidate_doc(c) for _, c in picks]
    page = Page(
        f"shardmeter plan: {res.model} on {res.target}",
        tool="shardmeter",
        version=__version__,
        command=command,
        data=doc,
        json_name="shardmeter-plan.json",
        inputs=inputs,
    )
    st = res.stats
    page.heading("What the search found", anchor="summary")
    lines = [
        f"Searched {st.space:,} plans in {st.elapsed_s:.2f} s: {st.evaluated:,} evaluated, "
        f"{st.fitting:,} fit in memory"
        + (
            f"; {st.outer_combinations:,} island/outer combinations"
            if st.outer_combinations
            else ""
        )
        + "."
    ]
    if res.infeasible is not None:
        lines.append(res.infeasible.text)
    for name, c in (
        ("Fastest", res.best_time),
        ("Cheapest (also lowest $ per million tokens)", res.best_cost),
    ):
        if c is not None:
            lines.append(
                f"{name}: {candidate_label(c)}, {c.n_gpus} GPUs, {duration(c.wall_s)}, "
                f"{usd(c.cost_usd)} ({usd(c.usd_per_mtok)} per M tokens)."
            )
    if res.best_time is not None:
        top = res.top_estimate
        if top is not None:
            lines.append(f"The fastest plan is {top.regime}; bottleneck: {top.bottleneck.phase}.")
        else:
            lines.append("The fastest plan: " + step_words(res.best_time.islands[0].step))
    if res.explanation is not None:
        lines.append("Why #1 wins: " + res.explanation.text)
    page.raw('<div class="words">' + "<br>".join(esc(x) for x in lines) + "</div>")

    page.heading("Time-cost Pareto front", anchor="front")
    page.para(
        "The coloured clouds are a sample of the evaluated plans (one colour per outer mode or "
        "GPU count); red circles are the top plans, the black line the Pareto front. Hover a "
        "circle or a front point for its plan, click it to show its breakdown below; the "
        "buttons switch the y axis to $ per million tokens.",
        "note",
    )
    page.figure("sm-front", pareto_figure(res, picks, n_top), height=520)

    page.heading("Selected plan", anchor="selected")
    page.raw('<div class="panel" id="sm-selected"></div>')
    page.raw('<div class="row">')
    page.figure("sm-time", {"data": [], "layout": {}}, height=FIGURE_HEIGHT)
    page.figure("sm-memory", {"data": [], "layout": {}}, height=FIGURE_HEIGHT)
    page.raw("</div>")

    page.heading("Top plans by wall-clock", anchor="ranked")
    page.para("Click a header to sort, a row to show its breakdown above.", "note")
    headers = ("#", "GPUs", "tokens/s", "MFU", "time", "cost", "$/Mtok", "mode", "plan")
    rows = [
        [
            Cell(str(k + 1), k + 1),
            Cell(str(c.n_gpus), c.n_gpus),
            _num(c.tokens_per_s),
            Cell(pct(c.mfu), _finite(c.mfu)),
            Cell(duration(c.wall_s), _finite(c.wall_s)),
            Cell(usd(c.cost_usd), _finite(c.cost_usd)),
            Cell(usd(c.usd_per_mtok), _finite(c.usd_per_mtok)),
            Cell("cluster" if c.outer is None else c.outer.mode),
            Cell(candidate_label(c)),
        ]
        for k, c in enumerate(res.ranked)
    ]
    page.table(
        "sm-ranked", headers, rows, row_attrs=[{"data-cand": str(k)} for k in range(len(rows))]
    )
    if topology is not None:
        page.details("Topology (islands, WAN, run settings)", topology.model_dump(mode="json"))
    page.extra = {
        "views": [
            candidate_view(c, title, res.top_estimate if k == 0 else None)
            for k, (title, c) in enumerate(picks)
        ]
    }
    page.script = PLAN_JS
    return page


# -- predict ---------------------------------------------------------------------------------
def predict_page(
    est: StepEstimate, model: TransformerSpec, cluster: Cluster, plan: Plan, command: str
) -> Page:
    """One plan on one cluster: headline numbers, the step breakdown and memory, in words."""
    doc = estimate_to_dict(est, model, cluster, plan)
    page = Page(
        f"shardmeter predict: {model.name} on {est.n_gpus} × {cluster.accelerator.name}",
        tool="shardmeter",
        version=__version__,
        command=command,
        data=doc,
        json_name="shardmeter-predict.json",
        inputs={"model": doc["model"], "cluster": doc["cluster"], "plan": doc["plan"]},
    )
    page.heading("The step in words", anchor="summary")
    page.raw(
        '<div class="words">'
        + esc(f"Plan: {plan_summary(plan)}.")
        + "<br>"
        + esc(step_words(est))
        + "</div>"
    )
    headline = [
        ("step time", duration(est.step_time_s)),
        ("tokens/s per GPU", si(est.tokens_per_s_per_gpu)),
        ("tokens/s total", si(est.tokens_per_s)),
        ("MFU / HFU", f"{pct(est.mfu)} / {pct(est.hfu)}"),
        ("memory per GPU", f"{nbytes(est.memory_bytes)} of {nbytes(est.hbm_bytes)}"),
        ("regime", est.regime),
        ("bottleneck", est.bottleneck),
    ]
    page.table("sm-headline", ("what", "value"), [[Cell(a), Cell(b)] for a, b in headline])
    page.raw('<div class="row">')
    page.figure("sm-time", step_time_figure([cluster.name], [est]), height=400)
    page.figure("sm-memory", memory_figure([cluster.name], [est]), height=400)
    page.raw("</div>")
    page.heading("Step-time terms", anchor="terms")
    rows = [
        [
            Cell(TIME_LABELS.get(k, k)),
            Cell(f"{est.time_breakdown[k]:.4g}", est.time_breakdown[k]),
            Cell(pct(est.time_breakdown[k] / est.step_time_s), est.time_breakdown[k]),
            Cell(f"{est.time_hidden.get(k, 0.0):.4g}", est.time_hidden.get(k, 0.0)),
        ]
        for k in TIME_COMPONENTS
        if est.time_breakdown.get(k, 0.0) > 0 or est.time_hidden.get(k, 0.0) > 0
    ]
    headers = ("term", "exposed seconds", "share of the step", "hidden seconds (under compute)")
    page.table("sm-terms", headers, rows)
    if est.comm_bytes:
        rows = [[Cell(k), Cell(nbytes(v), v)] for k, v in est.comm_bytes.items()]
        page.table("sm-comm", ("communication", "bytes per GPU per step"), rows)
    return page


# -- islands: predict --topology and sweep ---------------------------------------------------
def _topology_sections(page: Page, est: TopologyEstimate, topo: Topology, prefix: str) -> None:
    b = est.bottleneck
    words = [
        f"{est.name}: {est.mode}, {len(est.islands)} islands, {est.n_gpus} GPUs, "
        f"{si(est.tokens_per_s)} tokens/s; {duration(est.wall_s)} and {usd(est.cost_usd)} for "
        f"{si(est.tokens)} tokens ({usd(est.usd_per_mtok)} per M tokens).",
        f"Regime: {est.regime}. Bottleneck: island {b.island}, link {b.link}, phase {b.phase}.",
        f"Compute utilization {pct(est.utilization)}; WAN exchange {wan_text(est)}.",
    ]
    page.raw('<div class="words">' + "<br>".join(esc(w) for w in words) + "</div>")
    names = [i.name for i in est.islands]
    util = {
        "data": [
            {
                "type": "bar",
                "name": "utilization",
                "x": names,
                "y": [i.utilization for i in est.islands],
                "marker": {"color": "#2ca02c"},
                "hovertemplate": "%{x}: %{y:.1%}<extra></extra>",
            }
        ],
        "layout": {
            "title": {"text": "Compute utilization per island (inner-step share of wall time)"},
            "yaxis": {"tickformat": ".0%", "range": [0, 1.05]},
            "shapes": [
                {
                    "type": "line",
                    "xref": "paper",
                    "x0": 0,
                    "x1": 1,
                    "y0": est.threshold,
                    "y1": est.threshold,
                    "line": {"dash": "dot", "color": "#7f7f7f"},
                }
            ],
        },
    }
    round_parts = (
        ("inner steps", [i.busy_s for i in est.islands]),
        ("straggler wait", [i.straggler_s for i in est.islands]),
        ("WAN exposed", [i.wan_exposed_s for i in est.islands]),
        ("WAN hidden (under compute)", [i.wan_hidden_s for i in est.islands]),
        ("outer optimizer", [i.outer_opt_s for i in est.islands]),
    )
    rounds = {
        "data": [
            {
                "type": "bar",
                "name": name,
                "x": names,
                "y": ys,
                "marker": {
                    "color": COLORS[k],
                    **({"pattern": {"shape": "/"}} if "hidden" in name else {}),
                },
                "hovertemplate": "%{x}: %{y:.4g} s<extra>%{fullData.name}</extra>",
            }
            for k, (name, ys) in enumerate(round_parts)
            if any(y > 0 for y in ys)
        ],
        "layout": {
            "barmode": "stack",
            "title": {"text": "One round per island: where the time goes (hidden WAN overlaps)"},
            "yaxis": {"title": {"text": "seconds per round"}},
        },
    }
    cost = {
        "data": [
            {
                "type": "bar",
                "name": name,
                "x": names,
                "y": ys,
                "marker": {"color": color},
                "hovertemplate": "%{x}: $%{y:.4s}<extra>%{fullData.name}</extra>",
            }
            for name, ys, color in (
                ("GPU hours", [i.gpu_cost_usd for i in est.islands], "#1f77b4"),
                ("WAN egress", [i.egress_cost_usd for i in est.islands], "#ff7f0e"),
            )
        ],
        "layout": {
            "barmode": "stack",
            "title": {"text": f"Cost per island for {si(est.tokens)} tokens"},
            "yaxis": {"title": {"text": "USD"}},
        },
    }
    page.raw('<div class="row">')
    page.figure(f"{prefix}-util", util, height=360)
    page.figure(f"{prefix}-cost", cost, height=360)
    page.raw("</div>")
    page.figure(f"{prefix}-round", rounds, height=380)
    rows = [
        [
            Cell(i.name),
            Cell(f"{i.n_gpus}× {i.accelerator}", i.n_gpus),
            Cell(duration(i.step.step_time_s), i.step.step_time_s),
            Cell(f"{i.inner_steps:g}", i.inner_steps),
            Cell(si(i.tokens_per_s_per_gpu), i.tokens_per_s_per_gpu),
            Cell(pct(i.utilization), i.utilization),
            Cell(f"{i.staleness:.2g}", i.staleness),
            Cell(nbytes(i.wan_bytes_per_round), i.wan_bytes_per_round),
            Cell(usd(i.gpu_cost_usd + i.egress_cost_usd), i.gpu_cost_usd + i.egress_cost_usd),
            Cell("-" if i.plan is None else plan_label(i.plan, batch=False)),
        ]
        for i in est.islands
    ]
    page.table(
        f"{prefix}-islands",
        ("island", "GPUs", "step", "H", "tok/s/GPU", "util", "stale", "WAN/round", "cost", "plan"),
        rows,
    )
    loads = link_loads(est, topo)
    link_rows = [
        [
            Cell(load.name),
            Cell(f"{load.gbit:.3g}", _finite(load.gbit)),
            Cell(f"{load.rtt_ms:.3g}", load.rtt_ms),
            Cell(f"{load.egress_usd_per_gb:.3g}", load.egress_usd_per_gb),
            Cell(nbytes(load.bytes_per_round), load.bytes_per_round),
            Cell(pct(load.busy_share) if load.used else "-", load.busy_share),
            Cell(usd(load.egress_usd) if load.used else "-", load.egress_usd),
            Cell(", ".join(load.roles)),
        ]
        for load in loads
    ]
    used = [load for load in loads if load.used]
    if used:
        page.figure(
            f"{prefix}-linkload",
            {
                "data": [
                    {
                        "type": "bar",
                        "name": "busy share of a round",
                        "x": [load.name for load in used],
                        "y": [load.busy_share for load in used],
                        "marker": {"color": "#ff7f0e"},
                        "hovertemplate": "%{x}: %{y:.1%} of a round<extra></extra>",
                    }
                ],
                "layout": {
                    "title": {"text": "WAN paths: share of a round each carries the exchange"},
                    "yaxis": {"tickformat": ".2~%", "rangemode": "tozero"},
                    "xaxis": {"automargin": True},
                },
            },
            height=340,
        )
    page.table(
        f"{prefix}-links",
        ("WAN path", "Gbit/s", "RTT ms", "egress $/GB", "bytes/round", "busy", "egress $",
         "role"),
        link_rows,
        caption=f"The exchange takes {wan_text(est)} on the bottleneck link {b.link}; a round "
        f"of the slowest island takes {duration(est.round_s)}. Busy: the bytes sent over the "
        "path per round over its bandwidth, as a share of the round (latency left out).",
    )  # fmt: skip


@dataclass(frozen=True)
class LinkLoad:
    """One WAN path between two islands and what the exchange puts on it per round."""

    name: str
    gbit: float  # effective bandwidth per direction, Gbit/s
    rtt_ms: float
    egress_usd_per_gb: float
    bytes_per_round: float  # sent over the path per round, both directions
    busy_share: float  # the busier direction's bytes / bandwidth, over the round
    egress_usd: float  # egress charged on what its senders send, whole run
    used: bool
    roles: tuple[str, ...]  # "ring", "to the hub", "bottleneck"


def link_loads(est: TopologyEstimate, topo: Topology) -> list[LinkLoad]:
    """Each island pair's WAN path, and the exchange's bytes on it: in a ring each island
    sends its round's WAN bytes to its successor, with a hub (or asynchronous parameter
    server) to the centre (outer.py `collective`, design doc C.4); object storage uses no
    island-to-island path. Busy time of a direction = bytes / its bandwidth (s)."""
    paths = wan_paths(topo)
    by_name = {i.name: i for i in est.islands}
    hub = est.mode == "async" or est.settings.reduce == "hub"
    succ = paths.ring_successor
    sent: dict[tuple[int, int], list[tuple[float, float]]] = {}  # (i, j) -> (bytes, egress)
    if est.settings.reduce != "bucket" and paths.n > 1:
        for i, name in enumerate(paths.names):
            island = by_name.get(name)
            if island is None or island.wan_bytes_per_round <= 0:
                continue
            j = paths.center if hub else int(succ[i])
            if j == i:
                continue
            sent.setdefault((i, j), []).append((island.wan_bytes_per_round, island.egress_cost_usd))
    ring = set(paths.ring_edges) | {(b_, a_) for a_, b_ in paths.ring_edges}
    out = []
    for i in range(paths.n):
        for j in range(i + 1, paths.n):
            name = paths.path_name(i, j)
            busy, moved, egress = 0.0, 0.0, 0.0
            for a, c in ((i, j), (j, i)):
                for nbytes_, usd_ in sent.get((a, c), []):
                    bps = float(paths.bandwidth_Bps[a, c])
                    seconds = nbytes_ / bps if math.isfinite(bps) and bps > 0 else 0.0
                    busy = max(busy, seconds / est.round_s if est.round_s > 0 else 0.0)
                    moved += nbytes_
                    egress += usd_
            roles = []
            if (i, j) in ring and not hub and est.settings.reduce == "ring":
                roles.append("ring")
            if hub and paths.center in (i, j):
                roles.append("to the hub")
            if name == est.bottleneck.link:
                roles.append("bottleneck")
            out.append(
                LinkLoad(
                    name=name,
                    gbit=float(paths.bandwidth_Bps[i, j]) * 8 / 1e9,
                    rtt_ms=float(paths.rtt_s[i, j]) * 1e3,
                    egress_usd_per_gb=float(paths.egress_usd_per_byte[i, j]) * 1e9,
                    bytes_per_round=moved,
                    busy_share=busy,
                    egress_usd=egress,
                    used=moved > 0,
                    roles=tuple(roles),
                )
            )
    return out


def topology_page(
    est: TopologyEstimate,
    topo: Topology,
    command: str,
    modes: Sequence[TopologyEstimate] = (),
    overrides: dict[str, Any] | None = None,
) -> Page:
    """`predict --topology`: per island and link utilization and cost, regime in words."""
    doc = topology_json(est)
    if modes:
        doc["modes"] = [topology_json(m) for m in modes]
    page = Page(
        f"shardmeter predict --topology: {est.name}",
        tool="shardmeter",
        version=__version__,
        command=command,
        data=doc,
        json_name="shardmeter-topology.json",
        inputs={"topology": topo.model_dump(mode="json"), "overrides": overrides or {}},
    )
    page.heading("The run in words", anchor="summary")
    _topology_sections(page, est, topo, "sm-topo")
    if modes:
        page.heading("The outer modes compared", anchor="modes")
        rows = [
            [
                Cell(m.mode),
                _num(m.tokens_per_s),
                Cell(pct(m.utilization), m.utilization),
                Cell(duration(m.wall_s), _finite(m.wall_s)),
                Cell(usd(m.cost_usd), _finite(m.cost_usd)),
                Cell(m.regime),
            ]
            for m in modes
        ]
        page.table("sm-modes", ("mode", "tokens/s", "util", "time", "cost", "regime"), rows)
    return page


def sweep_figure(result: SweepResult) -> dict[str, Any]:
    """Four panels against the knob (tokens/s, utilization, days, cost); each knee is a red
    dashed vertical line in every panel (a trace, so it sits in data coordinates)."""
    xs = [p.value for p in result.points]
    panels = (
        ("tokens/s (total)", [p.tokens_per_s for p in result.points]),
        ("compute utilization", [p.utilization for p in result.points]),
        ("wall-clock (days)", [p.wall_s / DAY for p in result.points]),
        ("cost (USD)", [p.cost_usd for p in result.points]),
    )
    log_x = result.param in ("inner_steps", "bandwidth", "island_size", "batch", "gpu_mtbf")
    domains = (
        ([0.0, 0.45], [0.58, 1.0]),
        ([0.55, 1.0], [0.58, 1.0]),
        ([0.0, 0.45], [0.0, 0.42]),
        ([0.55, 1.0], [0.0, 0.42]),
    )
    knees = [k for k in result.knees if k.value is not None]
    data: list[dict[str, Any]] = []
    layout: dict[str, Any] = {}
    for k, ((title, ys), (dx, dy)) in enumerate(zip(panels, domains, strict=True)):
        ax = "" if k == 0 else str(k + 1)
        finite = [y for y in ys if math.isfinite(y)]
        data.append(
            {
                "type": "scatter",
                "mode": "lines+markers",
                "name": title,
                "x": xs,
                "y": [_finite(y) for y in ys],
                "xaxis": f"x{ax}",
                "yaxis": f"y{ax}",
                "marker": {"size": 6, "color": COLORS[k]},
                "hovertemplate": f"{esc(result.label)} %{{x:.4g}}: %{{y:.4g}}"
                f"<extra>{esc(title)}</extra>",
                "showlegend": False,
                "meta": {"kind": "curve"},
            }
        )
        for n, knee in enumerate(knees):
            data.append(
                {
                    "type": "scatter",
                    "mode": "lines",
                    "name": f"{knee.kind} at {knee.value:.3g}",
                    "x": [knee.value, knee.value],
                    "y": [min(finite), max(finite)] if finite else [0, 1],
                    "xaxis": f"x{ax}",
                    "yaxis": f"y{ax}",
                    "line": {"dash": "dash", "color": "#d62728", "width": 1.5},
                    "hovertext": esc(knee.text),
                    "hoverinfo": "text",
                    "showlegend": k == 0,
                    "legendgroup": f"knee{n}",
                    "meta": {"kind": "knee"},
                }
            )
        layout[f"xaxis{ax}"] = {
            "domain": dx,
            "anchor": f"y{ax}",
            "type": "log" if log_x else "linear",
            "title": {"text": result.label, "font": {"size": 11}},
        }
        layout[f"yaxis{ax}"] = {
            "domain": dy,
            "anchor": f"x{ax}",
            "title": {"text": title, "font": {"size": 11}},
            **({"tickformat": ".0%"} if title == "compute utilization" else {}),
        }
    layout.update(
        title={
            "text": f"{esc(result.topology)} ({esc(result.mode)}): sweep over {esc(result.label)}"
        },
        margin={"t": 60, "l": 70, "r": 20, "b": 60},
        legend={"orientation": "h", "y": -0.12},
    )
    return {"data": data, "layout": layout}


def sweep_page(
    results: Sequence[SweepResult],
    topo: Topology,
    base: TopologyEstimate,
    command: str,
    overrides: dict[str, Any] | None = None,
) -> Page:
    """`sweep`: the base run per island and link, then each sweep's curves, knees and table."""
    doc = {"sweeps": jsonable(list(results)), "base": topology_json(base)}
    page = Page(
        f"shardmeter sweep: {base.name}",
        tool="shardmeter",
        version=__version__,
        command=command,
        data=doc,
        json_name="shardmeter-sweep.json",
        inputs={"topology": topo.model_dump(mode="json"), "overrides": overrides or {}},
    )
    page.heading("The sweeps in words", anchor="summary")
    lines = [k.text for r in results for k in r.knees] or ["No knee found in the swept ranges."]
    page.raw('<div class="words">' + "<br>".join(esc(x) for x in lines) + "</div>")
    for n, result in enumerate(results):
        page.heading(f"Sweep over {result.label}", anchor=f"sweep-{result.param}")
        page.figure(f"sm-sweep-{n}", sweep_figure(result), height=560)
        rows = [
            [
                Cell(f"{p.value:g}", p.value),
                Cell(str(p.n_gpus), p.n_gpus),
                _num(p.tokens_per_s),
                Cell(pct(p.utilization), p.utilization),
                Cell(duration(p.wall_s), _finite(p.wall_s)),
                Cell(usd(p.cost_usd), _finite(p.cost_usd)),
                Cell(usd(p.usd_per_mtok), _finite(p.usd_per_mtok)),
                Cell(p.regime),
            ]
            for p in result.points
        ]
        page.table(
            f"sm-sweep-{n}-table",
            ("value", "GPUs", "tokens/s", "util", "time", "cost", "$/Mtok", "regime"),
            rows,
        )
        page.bullets([f"skipped {s}" for s in result.skipped])
    page.heading("The base run per island and link", anchor="base")
    _topology_sections(page, base, topo, "sm-base")
    return page
