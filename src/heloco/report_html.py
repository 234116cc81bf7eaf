"""The interactive HTML page of `heloco report --html`: runs compared, per-worker timelines.

A view of the run folders `heloco.report` reads: loss vs tokens and vs time per run and per
language, the comparison table, and per run a timeline of each worker's rounds (compute,
communication, idle) with the staleness of each arrival, the correction statistics over
time and the run's config (collapsed). What the timeline shows comes from ``events.jsonl``
as written (docs/heloco-metrics.md): a ``round`` event holds its dispatch (``start``) and
arrival (``time``), an ``update`` event the staleness of each arrival it applied.

The split of a round into compute and communication is not recorded; it is derived from the
run's settings: with ``comm_delays`` in the config, communication is that delay (the
simulator's round = H·pace + comm, sim/clock.py ``round_seconds``) and compute the rest; with
only paces, compute is steps × pace (capped at the round) and communication the rest; with
neither, the whole round is shown as compute. Pulling the model and pushing the
pseudo-gradient are one communication segment, as the simulator charges them together.
Idle is the gap between a worker's arrival and its next dispatch (a synchronous barrier, a
grace window).
"""

from __future__ import annotations

import math
from collections import defaultdict
from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Annotated, Any

from pydantic import BaseModel, ConfigDict, Field, ValidationError

from heloco import __version__
from heloco.metrics import EVENTS_FILE, RunStats
from heloco.report import (
    RunData,
    common_budget,
    comparison_rows,
    iter_events,
    runs_to_json,
)
from shardmeter.errors import from_pydantic
from shardmeter.report.htmlpage import COLORS, Cell, Page, esc

# Correction diagnostics of an ``update`` event, plotted over time (docs/heloco-metrics.md).
STAT_FIELDS: tuple[str, ...] = (*RunStats.STAT_FIELDS, "rho")
TIMELINE_ROUNDS = 3000  # rounds drawn per run; the JSON holds them all
Seconds = Annotated[float, Field(ge=0, allow_inf_nan=False)]
Count = Annotated[int, Field(ge=0, le=2**62)]


class RoundEvent(BaseModel):
    """The fields of a ``round`` event the timeline reads."""

    model_config = ConfigDict(extra="ignore", strict=True)

    worker: Count
    round_id: Count = 0
    steps: Count = 0
    tokens: Count = 0
    start: Seconds | None = None  # dispatch time; runs written before it existed lack it
    time: Seconds


class UpdateEvent(BaseModel):
    """The fields of an ``update`` event the page reads (statistics may be null)."""

    model_config = ConfigDict(extra="ignore", strict=False)

    revision: Count
    time: Seconds
    workers: list[Count]
    staleness: list[Count]
    cos_delta_momentum: float | None = None
    frac_kept: float | None = None
    frac_shrunk: float | None = None
    frac_rotated: float | None = None
    correction_size: float | None = None
    tensor_correction_size: float | None = None
    mean_lambda: float | None = None
    mean_beta: float | None = None
    rho: float | None = None


@dataclass(frozen=True)
class RoundSpan:
    """One worker round on the timeline, seconds of the run's clock."""

    worker: int
    round_id: int
    start: float
    compute_s: float
    comm_s: float
    arrival: float
    idle_s: float  # until the worker's next dispatch (0 for its last round)
    staleness: int | None  # of the arrival when applied (None: never applied)


@dataclass(frozen=True)
class RunEvents:
    """The rounds and updates of one run."""

    rounds: list[RoundEvent]
    updates: list[UpdateEvent]


def read_events(path: Path) -> RunEvents:
    """``round`` and ``update`` events of an events.jsonl (torn lines skipped by
    :func:`heloco.report.iter_events`); a malformed event is a one-line error naming the file
    and line."""
    rounds: list[RoundEvent] = []
    updates: list[UpdateEvent] = []
    for number, event in iter_events(path):
        kind = event.get("type")
        try:
            if kind == "round":
                rounds.append(RoundEvent.model_validate(event))
            elif kind == "update":
                updates.append(UpdateEvent.model_validate(event))
        except ValidationError as exc:
            raise from_pydantic(exc, f"{path}:{number}", whole=f"{kind} event") from None
    return RunEvents(rounds, updates)


def _per_worker(value: Any, n: int) -> list[float] | None:
    """A list of ``n`` finite numbers >= 0 from a config/summary field, else None."""
    if not isinstance(value, list) or len(value) < n:
        return None
    out = []
    for v in value[:n]:
        if isinstance(v, bool) or not isinstance(v, int | float) or not math.isfinite(v) or v < 0:
            return None
        out.append(float(v))
    return out


def timeline(run: RunData, events: RunEvents) -> list[RoundSpan]:
    """Each round's compute, communication and idle time and its staleness at arrival."""
    n = 1 + max((r.worker for r in events.rounds), default=-1)
    comm = _per_worker(run.config.get("comm_delays"), n)
    paces = _per_worker(run.summary.get("paces") or run.config.get("paces"), n)
    # Staleness of each worker's applied arrivals, in the order the server applied them.
    applied: dict[int, list[tuple[float, int]]] = defaultdict(list)
    for u in sorted(events.updates, key=lambda u: u.revision):
        for w, stale in zip(u.workers, u.staleness, strict=False):
            applied[w].append((u.time, stale))
    by_worker: dict[int, list[RoundEvent]] = defaultdict(list)
    for r in events.rounds:
        if r.start is not None:  # without its dispatch time a round has no place on it
            by_worker[r.worker].append(r)
    spans: list[RoundSpan] = []
    for w, rounds in sorted(by_worker.items()):
        rounds.sort(key=lambda r: (r.time, r.round_id))
        queue = applied.get(w, [])
        k = 0
        for i, r in enumerate(rounds):
            start = r.start if r.start is not None else r.time
            dur = max(0.0, r.time - start)
            if comm is not None:
                comm_s = min(comm[w], dur)
            elif paces is not None:
                comm_s = max(0.0, dur - r.steps * paces[w])
            else:
                comm_s = 0.0
            later = rounds[i + 1].start if i + 1 < len(rounds) else None
            nxt = later if later is not None else r.time
            tau: int | None = None
            while k < len(queue) and queue[k][0] < r.time - 1e-9:
                k += 1  # an update before this arrival belongs to an earlier round
            if k < len(queue):
                tau = queue[k][1]
                k += 1
            spans.append(
                RoundSpan(
                    worker=w,
                    round_id=r.round_id,
                    start=start,
                    compute_s=dur - comm_s,
                    comm_s=comm_s,
                    arrival=r.time,
                    idle_s=max(0.0, nxt - r.time),
                    staleness=tau,
                )
            )
    return spans


def timeline_figure(label: str, spans: Sequence[RoundSpan]) -> dict[str, Any]:
    """Horizontal bars per worker: compute, communication and idle of each round, and the
    staleness of each arrival as a marker where the round arrives."""
    shown = sorted(spans, key=lambda s: s.start)[:TIMELINE_ROUNDS]
    traces: list[dict[str, Any]] = []
    for name, base, width, color in (
        ("compute", [s.start for s in shown], [s.compute_s for s in shown], "#1f77b4"),
        (
            "communication (receive + send)",
            [s.start + s.compute_s for s in shown],
            [s.comm_s for s in shown],
            "#ff7f0e",
        ),
        ("idle (waiting for the next dispatch)", [s.arrival for s in shown],
         [s.idle_s for s in shown], "#c7c7c7"),
    ):  # fmt: skip
        keep = [k for k, wdt in enumerate(width) if wdt > 0]
        if not keep:
            continue
        traces.append(
            {
                "type": "bar",
                "orientation": "h",
                "name": name,
                "y": [f"worker {shown[k].worker}" for k in keep],
                "x": [width[k] for k in keep],
                "base": [base[k] for k in keep],
                "customdata": [shown[k].round_id for k in keep],
                "marker": {"color": color, "line": {"width": 0.5, "color": "#fff"}},
                "hovertemplate": "%{y}, round %{customdata}: %{x:.4g} s from %{base:.4g} s"
                f"<extra>{esc(name)}</extra>",
            }
        )
    arrived = [s for s in shown if s.staleness is not None]
    if arrived:
        traces.append(
            {
                "type": "scatter",
                "mode": "markers+text",
                "name": "staleness at arrival",
                "x": [s.arrival for s in arrived],
                "y": [f"worker {s.worker}" for s in arrived],
                "text": [str(s.staleness) for s in arrived],
                "textposition": "top center",
                "textfont": {"size": 9},
                "marker": {
                    "symbol": "triangle-down",
                    "size": 8,
                    "color": [s.staleness for s in arrived],
                    "colorscale": "Reds",
                    "cmin": 0,
                    "line": {"width": 0.5, "color": "#000"},
                },
                "hovertemplate": "%{y} arrives at %{x:.4g} s, staleness %{text}<extra></extra>",
                "meta": {"kind": "staleness"},
            }
        )
    workers = sorted({s.worker for s in spans})
    title = f"{esc(label)}: rounds per worker"
    if len(spans) > len(shown):
        title += f" (the first {len(shown)} of {len(spans)} rounds; the JSON holds all)"
    return {
        "data": traces,
        "layout": {
            "barmode": "overlay",
            "title": {"text": title},
            "xaxis": {"title": {"text": "time (s, the run's clock)"}},
            "yaxis": {
                "categoryorder": "array",
                "categoryarray": [f"worker {w}" for w in reversed(workers)],
            },
            "legend": {"orientation": "h", "y": -0.3},
            "margin": {"l": 80, "r": 20, "t": 40, "b": 90},
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


def _f(x: float | None) -> Cell:
    return Cell("-" if x is None or not math.isfinite(x) else f"{x:.4f}", x)


def report_page(runs: Sequence[RunData], command: str) -> Page:
    """The whole comparison: loss curves, the table, and per run its timeline, correction
    statistics and config."""
    events = [read_events(r.path / EVENTS_FILE) for r in runs]
    spans = [timeline(r, e) for r, e in zip(runs, events, strict=True)]
    doc = runs_to_json(runs)
    for entry, run, ev, sp in zip(doc["runs"], runs, events, spans, strict=True):
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
        entry["rounds"] = [s.__dict__ for s in sp]
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
    for n, (run, ev, sp) in enumerate(zip(runs, events, spans, strict=True)):
        page.heading(f"Run {run.label} ({run.method})", anchor=f"run-{n}")
        stale = [s.staleness for s in sp if s.staleness is not None]
        workers = sorted({s.worker for s in sp})
        lines = []
        for w in workers:
            mine = [s for s in sp if s.worker == w]
            busy = sum(s.compute_s for s in mine)
            comm = sum(s.comm_s for s in mine)
            idle = sum(s.idle_s for s in mine)
            total = busy + comm + idle
            taus = [s.staleness for s in mine if s.staleness is not None]
            lines.append(
                f"worker {w}: {len(mine)} rounds; compute {busy / total:.0%}, communication "
                f"{comm / total:.0%}, idle {idle / total:.0%}"
                + (f"; staleness mean {sum(taus) / len(taus):.2f}, max {max(taus)}" if taus else "")
                if total > 0
                else f"worker {w}: {len(mine)} rounds"
            )
        if stale:
            lines.append(f"{len(stale)} arrivals applied in {len(ev.updates)} updates.")
        page.bullets(lines)
        if sp:
            height = 140 + 40 * len(workers)
            page.figure(f"hl-timeline-{n}", timeline_figure(run.label, sp), height=max(300, height))
        if ev.updates:
            page.figure(f"hl-correction-{n}", correction_figure(run.label, ev.updates), height=360)
        page.details(f"Config of {run.label} (config.json)", run.config)
        page.details(f"Summary of {run.label} (summary.json)", run.summary)
    return page
