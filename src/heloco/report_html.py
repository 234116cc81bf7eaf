"""The interactive HTML page of `heloco report --html`: runs compared, per-worker timelines.

A view of the run folders `heloco.report` reads: loss vs tokens and vs time per run and per
language, the comparison table, and per run a timeline of each worker's rounds (receive,
compute, send, idle) with the staleness of each arrival, each worker's link use where the
rounds carry bytes (beside each link's set rate, for a shaped run's ``wan.json``), the correction statistics over time and the run's config (collapsed).
The timelines come from ``events.jsonl`` through :mod:`heloco.timeline` (measured times
where the round events carry them, else derived from the run's settings), the same data the
PNG/SVG Gantt chart of `heloco report` draws.
"""

from __future__ import annotations

import math
from collections.abc import Sequence
from dataclasses import asdict
from typing import Any

from heloco import __version__
from heloco.metrics import EVENTS_FILE
from heloco.net.wanfile import read_settings
from heloco.report import (
    RunData,
    common_budget,
    comparison_rows,
    runs_to_json,
)
from heloco.timeline import COLORS as TIMELINE_COLORS
from heloco.timeline import (
    KINDS,
    LABELS,
    STAT_FIELDS,
    GanttChart,
    UpdateEvent,
    WorkerTimeline,
    gantt_chart,
    read_events,
    timelines,
)
from shardmeter.report.htmlpage import COLORS, Cell, Page, esc


def timeline_figure(chart: GanttChart) -> dict[str, Any]:
    """Horizontal bars per worker lane, one trace per segment kind (receive, compute, send,
    derived communication, idle), and the staleness of each applied arrival as a marker
    where the round arrives (:func:`heloco.timeline.gantt_chart`)."""
    traces: list[dict[str, Any]] = []
    for kind in KINDS:
        bars = [b for b in chart.bars if b.kind == kind]
        if not bars:
            continue
        name = LABELS[kind]
        traces.append(
            {
                "type": "bar",
                "orientation": "h",
                "name": name,
                "y": [b.lane for b in bars],
                "x": [b.width for b in bars],
                "base": [b.start for b in bars],
                "customdata": ["-" if b.round_id is None else b.round_id for b in bars],
                "marker": {"color": TIMELINE_COLORS[kind], "line": {"width": 0.5, "color": "#fff"}},
                "hovertemplate": "%{y}, round %{customdata}: %{x:.4g} s from %{base:.4g} s"
                f"<extra>{esc(name)}</extra>",
                "meta": {"kind": kind},
            }
        )
    if chart.arrivals:
        traces.append(
            {
                "type": "scatter",
                "mode": "markers+text",
                "name": "staleness at arrival",
                "x": [a.time for a in chart.arrivals],
                "y": [a.lane for a in chart.arrivals],
                "text": [str(a.staleness) for a in chart.arrivals],
                "textposition": "top center",
                "textfont": {"size": 9},
                "marker": {
                    "symbol": "triangle-down",
                    "size": 8,
                    "color": [a.staleness for a in chart.arrivals],
                    "colorscale": "Reds",
                    "cmin": 0,
                    "line": {"width": 0.5, "color": "#000"},
                },
                "hovertemplate": "%{y} arrives at %{x:.4g} s, staleness %{text}<extra></extra>",
                "meta": {"kind": "staleness"},
            }
        )
    title = esc(chart.title)
    if chart.total_rounds > chart.shown_rounds:
        title += "; the JSON holds all"
    return {
        "data": traces,
        "layout": {
            "barmode": "overlay",
            "title": {"text": title},
            "xaxis": {"title": {"text": "time (s, the run's clock)"}},
            "yaxis": {"categoryorder": "array", "categoryarray": list(reversed(chart.lanes))},
            "legend": {"orientation": "h", "y": -0.3},
            "margin": {"l": 130, "r": 20, "t": 40, "b": 90},
        },
    }


def link_figure(label: str, chart: GanttChart) -> dict[str, Any]:
    """Bytes per second on each worker's link over time, sent (solid) and received (dashed),
    and each link's set rate (dotted) for a shaped run."""
    traces = [
        {
            "type": "scatter",
            "mode": "lines",
            "name": f"worker {use.worker} {use.direction}",
            "x": use.times,
            "y": [r / 1e6 for r in use.rates],
            "line": {
                "shape": "hv",
                "width": 1.2,
                "color": COLORS[use.worker % len(COLORS)],
                "dash": "solid" if use.direction == "send" else "dash",
            },
            "meta": {"kind": f"link-{use.direction}"},
        }
        for use in chart.link
    ]
    span = [min(u.times[0] for u in chart.link), max(u.times[-1] for u in chart.link)]
    traces += [
        {
            "type": "scatter",
            "mode": "lines",
            "name": rate.label,
            "x": span,
            "y": [rate.bytes_per_s / 1e6] * 2,
            "line": {
                "width": 1.2,
                "color": "#000000" if rate.worker is None else COLORS[rate.worker % len(COLORS)],
                "dash": "dot" if rate.direction != "receive" else "dashdot",
            },
            "meta": {"kind": "set-rate"},
        }
        for rate in chart.set_rates
    ]
    return {
        "data": traces,
        "layout": {
            "title": {"text": f"{esc(label)}: link use per worker"},
            "xaxis": {"title": {"text": "time (s, the run's clock)"}},
            "yaxis": {"title": {"text": "MB/s"}},
            "legend": {"orientation": "h", "y": -0.3},
        },
    }


def correction_figure(label: str, updates: Sequence[UpdateEvent]) -> dict[str, Any]:
    """Each correction diagnostic of the updates against the run's clock."""
    traces = []
    for k, name in enumerate(STAT_FIELDS):
        points = [(u.time, getattr(u, name)) for u in updates if getattr(u, name) is not None]
        if not points:
            continue
        traces.append(
            {
                "type": "scatter",
                "mode": "lines+markers" if len(points) < 200 else "lines",
                "name": name,
                "x": [t for t, _ in points],
                "y": [v for _, v in points],
                "marker": {"size": 4},
                "line": {"color": COLORS[k % len(COLORS)], "width": 1.2},
                "visible": True if name in ("cos_delta_momentum", "frac_kept") else "legendonly",
            }
        )
    return {
        "data": traces,
        "layout": {
            "title": {"text": f"{esc(label)}: correction statistics per update (legend: show)"},
            "xaxis": {"title": {"text": "time (s)"}},
            "legend": {"orientation": "h", "y": -0.25},
        },
    }


def loss_figure(runs: Sequence[RunData], key: str, xlabel: str) -> dict[str, Any]:
    """Validation loss of every run against tokens or time."""
    traces = [
        {
            "type": "scatter",
            "mode": "lines+markers",
            "name": r.label,
            "x": [getattr(p, key) for p in r.evals],
            "y": [p.loss if math.isfinite(p.loss) else None for p in r.evals],
            "marker": {"size": 5},
            "line": {"color": COLORS[k % len(COLORS)]},
        }
        for k, r in enumerate(runs)
    ]
    return {
        "data": traces,
        "layout": {
            "title": {"text": f"Validation loss vs {xlabel}"},
            "xaxis": {"title": {"text": xlabel}},
            "yaxis": {"title": {"text": "loss (nats/token)"}},
        },
    }


def language_figure(runs: Sequence[RunData]) -> dict[str, Any]:
    """One panel per language: every run's loss on it against tokens."""
    langs = sorted({lang for r in runs for lang in r.languages})
    cols = min(3, max(1, len(langs)))
    nrows = max(1, math.ceil(len(langs) / cols))
    traces: list[dict[str, Any]] = []
    layout: dict[str, Any] = {
        "grid": {"rows": nrows, "columns": cols, "pattern": "independent"},
        "title": {"text": "Validation loss per language vs tokens"},
        "annotations": [],
    }
    for n, lang in enumerate(langs):
        ax = "" if n == 0 else str(n + 1)
        for k, r in enumerate(runs):
            pts = [p for p in r.evals if lang in p.per_language]
            traces.append(
                {
                    "type": "scatter",
                    "mode": "lines",
                    "name": r.label,
                    "legendgroup": r.label,
                    "showlegend": n == 0,
                    "x": [p.tokens for p in pts],
                    "y": [p.per_language[lang] for p in pts],
                    "xaxis": f"x{ax}",
                    "yaxis": f"y{ax}",
                    "line": {"color": COLORS[k % len(COLORS)]},
                    "hovertemplate": f"{esc(lang)}: %{{y:.4f}} at %{{x}} tokens"
                    f"<extra>{esc(r.label)}</extra>",
                }
            )
        layout["annotations"].append(
            {
                "text": esc(lang),
                "xref": f"x{ax} domain",
                "yref": f"y{ax} domain",
                "x": 0.5,
                "y": 1.0,
                "yanchor": "bottom",
                "showarrow": False,
                "font": {"size": 12},
            }
        )
    return {"data": traces, "layout": layout}


def worker_line(wt: WorkerTimeline) -> str:
    """A worker's rounds in words: the share of its time in each kind, its staleness."""
    seconds = {k: wt.seconds(k) for k in KINDS}
    total = sum(seconds.values())
    head = f"worker {wt.worker}: {len(wt.rounds)} rounds"
    if total <= 0:
        return head
    shares = ", ".join(f"{k} {v / total:.0%}" for k, v in seconds.items() if v > 0)
    taus = [s.staleness for s in wt.rounds if s.staleness is not None]
    stale = f"; staleness mean {sum(taus) / len(taus):.2f}, max {max(taus)}" if taus else ""
    overlap = " (exchange overlapped with compute)" if wt.overlapped else ""
    return f"{head}{overlap}; {shares}{stale}"


def _f(x: float | None) -> Cell:
    return Cell("-" if x is None or not math.isfinite(x) else f"{x:.4f}", x)


def report_page(runs: Sequence[RunData], command: str) -> Page:
    """The whole comparison: loss curves, the table, and per run its timeline, correction
    statistics and config."""
    events = [read_events(r.path / EVENTS_FILE) for r in runs]
    workers = [timelines(r, e) for r, e in zip(runs, events, strict=True)]
    doc = runs_to_json(runs)
    for entry, run, ev, wts in zip(doc["runs"], runs, events, workers, strict=True):
        entry["evals"] = [
            {
                "tokens": p.tokens,
                "time": p.time,
                "loss": p.loss if math.isfinite(p.loss) else None,
                "per_language": {
                    k: v if math.isfinite(v) else None for k, v in p.per_language.items()
                },
            }
            for p in run.evals
        ]
        entry["rounds"] = [asdict(s) for wt in wts for s in wt.rounds]
        entry["idle"] = {str(wt.worker): wt.idle for wt in wts}
        entry["updates"] = [u.model_dump() for u in ev.updates]
        entry["config"] = run.config
        entry["summary"] = run.summary
    page = Page(
        f"heloco report: {len(runs)} run(s)",
        tool="heloco",
        version=__version__,
        command=command,
        data=doc,
        json_name="heloco-report.json",
        inputs={"runs": [str(r.path) for r in runs]},
        inputs_label="Inputs (run folders)",
    )
    tok, sec = common_budget(runs, "tokens"), common_budget(runs, "time")
    rows = comparison_rows(runs)
    best = min(
        rows,
        key=lambda r: (
            r.loss_at_common_tokens if math.isfinite(r.loss_at_common_tokens) else math.inf
        ),
    )
    page.heading("The runs in words", anchor="summary")
    page.raw(
        '<div class="words">'
        + esc(
            f"{len(runs)} run(s); compared at the common budget of {tok:,.0f} tokens and "
            f"{sec:,.1f} s. Lowest loss at the common tokens: {best.label} ({best.method}), "
            f"{best.loss_at_common_tokens:.4f}."
        )
        + "</div>"
    )
    page.raw('<div class="row">')
    page.figure("hl-loss-tokens", loss_figure(runs, "tokens", "training tokens"), height=400)
    page.figure("hl-loss-time", loss_figure(runs, "time", "time (s)"), height=400)
    page.raw("</div>")
    langs = sorted({lang for r in runs for lang in r.languages})
    if langs:
        nrows = math.ceil(len(langs) / min(3, len(langs)))
        page.figure("hl-languages", language_figure(runs), height=260 * nrows + 80)
    page.heading("Comparison", anchor="table")
    headers = ("run", "method", "paces", "tokens", "time (s)", "updates", "loss start",
               "loss end", "@ common tokens", "@ common time", "last cycle")  # fmt: skip
    page.table(
        "hl-runs",
        headers,
        [
            [
                Cell(r.label),
                Cell(r.method),
                Cell(r.paces),
                Cell(f"{r.tokens:,}", r.tokens),
                Cell(f"{r.time:,.1f}", r.time),
                Cell(f"{r.updates:,}", r.updates),
                _f(r.initial_loss),
                _f(r.final_loss),
                _f(r.loss_at_common_tokens),
                _f(r.loss_at_common_time),
                _f(r.cycle_loss),
            ]
            for r in rows
        ],
    )
    for n, (run, ev, wts) in enumerate(zip(runs, events, workers, strict=True)):
        page.heading(f"Run {run.label} ({run.method})", anchor=f"run-{n}")
        lines = [worker_line(wt) for wt in wts]
        stale = sum(s.staleness is not None for wt in wts for s in wt.rounds)
        if stale:
            lines.append(f"{stale} arrivals applied in {len(ev.updates)} updates.")
        page.bullets(lines)
        if wts:
            chart = gantt_chart(run.label, wts, read_settings(run.path))
            height = max(300, 140 + 40 * len(chart.lanes))
            page.figure(f"hl-timeline-{n}", timeline_figure(chart), height=height)
            if chart.link:
                page.figure(f"hl-link-{n}", link_figure(run.label, chart), height=320)
        if ev.updates:
            page.figure(f"hl-correction-{n}", correction_figure(run.label, ev.updates), height=360)
        page.details(f"Config of {run.label} (config.json)", run.config)
        page.details(f"Summary of {run.label} (summary.json)", run.summary)
    return page
