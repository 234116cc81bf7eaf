"""Each worker's rounds on the run's clock: receive, compute, send and idle, the staleness of
each arrival, and the bytes per second on each worker's link (beside each link's set rate,
for a run over an emulated WAN that saved its settings: ``wan.json``, heloco.net.wanfile).

Read from ``events.jsonl`` as written (docs/heloco-metrics.md): a ``round`` event holds its
dispatch (``start``) and arrival (``time``) and, where the loop measured them, when it
received its dispatch, computed and sent its push, and the bytes each way
(``recv_start`` … ``send_end``, ``bytes_sent``/``bytes_received``; the simulator and the
networked worker record them). An ``update`` event holds the staleness of each arrival it
applied.

An event file written before the timing fields existed still draws: the round is split into
compute and one undivided *communication* segment, derived from the run's settings. With
``comm_delays`` in the config, communication is that delay (the simulator's round = H·pace +
comm, sim/clock.py ``round_seconds``) and compute the rest; with only paces, compute is steps
× pace (capped at the round) and communication the rest; with neither, the whole round is
compute.

Idle is every part of a worker's time, from its first dispatch to its last arrival, that none
of its rounds' receive, compute, send or communication covers: a synchronous barrier, a grace
window, loading a dispatch. In an overlapped exchange a round's send and receive run beside
the next round's compute; such a worker's exchange is drawn in a lane of its own.

:func:`gantt_chart` turns the timelines into bars, markers and link-rate steps, the one data
structure both the HTML page (``heloco.report_html``) and the PNG/SVG Gantt chart
(:func:`plot_timeline`) draw.
"""

from __future__ import annotations

import math
from bisect import bisect_right
from collections import defaultdict
from collections.abc import Sequence
from dataclasses import dataclass, field, replace
from functools import cached_property
from pathlib import Path
from typing import Annotated, Any, Literal

from pydantic import BaseModel, ConfigDict, Field, ValidationError

from heloco.metrics import RunStats
from heloco.net.wanfile import WanSettings, read_settings
from heloco.report import RunData, iter_events, save_figure
from shardmeter.errors import from_pydantic

Seconds = Annotated[float, Field(ge=0, allow_inf_nan=False)]
Count = Annotated[int, Field(ge=0, le=2**62)]
Kind = Literal["receive", "compute", "send", "communication", "idle"]
KINDS: tuple[Kind, ...] = ("receive", "compute", "send", "communication", "idle")
LABELS: dict[Kind, str] = {
    "receive": "receive (dispatch)",
    "compute": "compute (inner steps)",
    "send": "send (push, until acknowledged)",
    "communication": "communication (receive + send, derived)",
    "idle": "idle",
}
COLORS: dict[Kind, str] = {
    "receive": "#2ca02c",
    "compute": "#1f77b4",
    "send": "#ff7f0e",
    "communication": "#9467bd",
    "idle": "#c7c7c7",
}
STAT_FIELDS: tuple[str, ...] = (*RunStats.STAT_FIELDS, "rho")  # update diagnostics
MAX_ROUNDS = 3000  # rounds drawn per run; the JSON holds them all
LABELLED_ARRIVALS = 200  # the PNG/SVG chart writes each staleness as text up to this many
RASTER_BARS = 2000  # above this many bars the SVG holds them as one image (seconds, not minutes)
TIMING_FIELDS = ("recv_start", "recv_end", "compute_start", "compute_end", "send_start",
                 "send_end")  # fmt: skip


class RoundEvent(BaseModel):
    """The fields of a ``round`` event the timeline reads."""

    model_config = ConfigDict(extra="ignore", strict=True)

    worker: Count
    round_id: Count = 0
    steps: Count = 0
    tokens: Count = 0
    start: Seconds | None = None  # dispatch time; runs written before it existed lack it
    time: Seconds
    recv_start: Seconds | None = None
    recv_end: Seconds | None = None
    compute_start: Seconds | None = None
    compute_end: Seconds | None = None
    send_start: Seconds | None = None
    send_end: Seconds | None = None
    bytes_sent: Count | None = None
    bytes_received: Count | None = None

    @property
    def measured(self) -> bool:
        """Whether the event carries every receive/compute/send time."""
        return all(getattr(self, k) is not None for k in TIMING_FIELDS)


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


Interval = tuple[float, float]


@dataclass(frozen=True)
class RoundSpan:
    """One worker round, seconds of the run's clock: its dispatch (``start``), arrival, and
    the intervals it received, computed and sent (``communication``: receive + send undivided,
    for event files without timing; None where a part is not known)."""

    worker: int
    round_id: int
    start: float
    arrival: float
    compute: Interval
    receive: Interval | None = None
    send: Interval | None = None
    communication: Interval | None = None
    staleness: int | None = None  # of the arrival when applied (None: never applied)
    bytes_sent: int | None = None
    bytes_received: int | None = None

    def busy(self) -> list[tuple[Kind, Interval]]:
        """The round's non-idle segments of positive length."""
        parts: list[tuple[Kind, Interval | None]] = [
            ("receive", self.receive),
            ("compute", self.compute),
            ("send", self.send),
            ("communication", self.communication),
        ]
        return [(k, iv) for k, iv in parts if iv is not None and iv[1] > iv[0]]


@dataclass(frozen=True)
class WorkerTimeline:
    """A worker's rounds in order and the intervals it was idle."""

    worker: int
    rounds: list[RoundSpan]
    idle: list[Interval]

    @cached_property
    def overlapped(self) -> bool:
        """Whether a receive or send overlaps a compute (an overlapped exchange) by more than
        a nanosecond. A worker's computes do not overlap each other, so sorted by start they
        are sorted by end: each exchange is checked against the computes from the first that
        ends after it starts."""
        computes = sorted(r.compute for r in self.rounds if r.compute[1] > r.compute[0])
        ends = [c[1] for c in computes]
        for r in self.rounds:
            for iv in (r.receive, r.send):
                if iv is None:
                    continue
                k = bisect_right(ends, iv[0])
                while k < len(computes) and computes[k][0] < iv[1]:
                    if min(iv[1], computes[k][1]) - max(iv[0], computes[k][0]) > 1e-9:
                        return True
                    k += 1
        return False

    def seconds(self, kind: Kind) -> float:
        """Total seconds of ``kind`` (the union for overlapping segments is not taken)."""
        if kind == "idle":
            return sum(b - a for a, b in self.idle)
        return sum(iv[1] - iv[0] for r in self.rounds for k, iv in r.busy() if k == kind)


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


def uncovered(lo: float, hi: float, busy: Sequence[Interval]) -> list[Interval]:
    """The parts of [lo, hi] that no interval of ``busy`` covers, in order."""
    gaps: list[Interval] = []
    at = lo
    for a, b in sorted(busy):
        if a > at:
            gaps.append((at, min(a, hi)))
        at = max(at, b)
        if at >= hi:
            break
    if at < hi:
        gaps.append((at, hi))
    return [(a, b) for a, b in gaps if b > a]


def _span(r: RoundEvent, comm: list[float] | None, paces: list[float] | None) -> RoundSpan:
    """One round's segments: as measured, else derived from the run's settings."""
    start = r.start if r.start is not None else r.time
    if r.measured:
        return RoundSpan(
            r.worker, r.round_id, start, r.time,
            compute=(r.compute_start, r.compute_end),  # type: ignore[arg-type]
            receive=(r.recv_start, r.recv_end),  # type: ignore[arg-type]
            send=(r.send_start, r.send_end),  # type: ignore[arg-type]
            bytes_sent=r.bytes_sent, bytes_received=r.bytes_received,
        )  # fmt: skip
    dur = max(0.0, r.time - start)
    if comm is not None:
        comm_s = min(comm[r.worker], dur)
    elif paces is not None:
        comm_s = max(0.0, dur - r.steps * paces[r.worker])
    else:
        comm_s = 0.0
    split = start + dur - comm_s
    return RoundSpan(
        r.worker, r.round_id, start, r.time, compute=(start, split),
        communication=(split, r.time) if comm_s > 0 else None,
    )  # fmt: skip


def timelines(run: RunData, events: RunEvents) -> list[WorkerTimeline]:
    """Each worker's rounds (receive, compute, send or derived communication), its idle
    intervals and the staleness of each of its arrivals, in worker order."""
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
    out: list[WorkerTimeline] = []
    for w, rounds in sorted(by_worker.items()):
        rounds.sort(key=lambda r: (r.time, r.round_id))
        queue = applied.get(w, [])
        k = 0
        spans: list[RoundSpan] = []
        for r in rounds:
            tau: int | None = None
            while k < len(queue) and queue[k][0] < r.time - 1e-9:
                k += 1  # an update before this arrival belongs to an earlier round
            if k < len(queue):
                tau = queue[k][1]
                k += 1
            span = _span(r, comm, paces)
            spans.append(replace(span, staleness=tau))
        lo = min(s.start for s in spans)
        hi = max(s.arrival for s in spans)
        busy = [iv for s in spans for _, iv in s.busy()]
        out.append(WorkerTimeline(w, spans, uncovered(lo, hi, busy)))
    return out


# -- the chart's data ---------------------------------------------------------------------------
@dataclass(frozen=True)
class Bar:
    """One horizontal bar: a segment of ``kind`` in lane ``lane`` (a round's, or idle)."""

    lane: str
    kind: Kind
    start: float
    width: float
    round_id: int | None  # None: idle, which belongs to the worker, not to a round


@dataclass(frozen=True)
class Arrival:
    """A round's arrival and its staleness when applied (a marker on the chart)."""

    lane: str
    time: float
    staleness: int
    round_id: int


@dataclass(frozen=True)
class LinkUse:
    """Bytes per second on one worker's link in one direction over time, as steps: between
    ``times[i]`` and ``times[i + 1]`` the rate is ``rates[i]`` (bytes/s)."""

    worker: int
    direction: Literal["send", "receive"]
    times: list[float]
    rates: list[float]


@dataclass(frozen=True)
class SetRate:
    """A link's set rate (bytes/s) on the link-use panel: worker ``worker``'s path to the
    server in ``direction`` (its pushes: ``send``; its dispatches: ``receive``), or, with
    ``worker`` None, the server's own link that every worker shares."""

    worker: int | None
    direction: Literal["send", "receive", "both"]
    bytes_per_s: float

    @property
    def label(self) -> str:
        who = "server link (shared)" if self.worker is None else f"worker {self.worker}"
        way = "" if self.direction == "both" else f" {self.direction}"
        return f"{who}{way} set rate"


def set_rates(wan: WanSettings | None, workers: Sequence[int]) -> list[SetRate]:
    """The set rates of a shaped run's links (``wan.json``, :mod:`heloco.net.wanfile`) for
    ``workers``: each worker's path one line per direction (one, ``both``, where the two
    are equal), and the shared server link's; none for an unshaped path or run. Bytes/s =
    the set bit/s / 8 (the link use is drawn in bytes)."""
    if wan is None:
        return []
    out: list[SetRate] = []

    def add(worker: int | None, send: float | None, receive: float | None) -> None:
        if send is not None and send == receive:
            out.append(SetRate(worker, "both", send / 8.0))
            return
        for way, bps in (("send", send), ("receive", receive)):
            if bps is not None:
                out.append(SetRate(worker, way, bps / 8.0))  # type: ignore[arg-type]

    for w in workers:
        if 0 <= w < len(wan.workers):
            add(w, wan.path_bps(w, "send"), wan.path_bps(w, "receive"))
    if wan.shared:
        add(None, wan.server_bps("send"), wan.server_bps("receive"))
    return out


@dataclass(frozen=True)
class GanttChart:
    """What a timeline chart draws: lanes top to bottom, bars, staleness markers, link use
    and, for a shaped run, each link's set rate."""

    title: str
    lanes: list[str]
    bars: list[Bar]
    arrivals: list[Arrival]
    link: list[LinkUse] = field(default_factory=list)
    shown_rounds: int = 0
    total_rounds: int = 0
    set_rates: list[SetRate] = field(default_factory=list)

    def count(self, kind: Kind) -> int:
        """Bars of ``kind``."""
        return sum(b.kind == kind for b in self.bars)


def rate_steps(intervals: Sequence[tuple[float, float, int]]) -> tuple[list[float], list[float]]:
    """Bytes/s over time from transfers (start s, end s, bytes): each moves its bytes at a
    constant rate bytes / (end − start) over its interval, and overlapping transfers add.
    Returns step times and the rate from each time to the next (the last rate is 0)."""
    change: dict[float, float] = defaultdict(float)
    for a, b, n in intervals:
        if b > a and n > 0:
            change[a] += n / (b - a)
            change[b] -= n / (b - a)
    times = sorted(change)
    rates: list[float] = []
    level = 0.0
    for t in times:
        level += change[t]
        rates.append(max(0.0, level) if abs(level) > 1e-9 * (1 + abs(change[t])) else 0.0)
    return times, rates


def link_use(workers: Sequence[WorkerTimeline], until: float = math.inf) -> list[LinkUse]:
    """Each worker's send and receive rates over time, from the measured intervals and their
    bytes, for the rounds dispatched before ``until`` (empty where the events carry no
    bytes)."""
    out: list[LinkUse] = []
    for wt in workers:
        rounds = [r for r in wt.rounds if r.start < until]
        sends = [(r.send[0], r.send[1], r.bytes_sent or 0) for r in rounds if r.send]
        recvs = [(r.receive[0], r.receive[1], r.bytes_received or 0) for r in rounds if r.receive]
        for direction, ivs in (("send", sends), ("receive", recvs)):
            times, rates = rate_steps(ivs)
            if times:
                out.append(LinkUse(wt.worker, direction, times, rates))  # type: ignore[arg-type]
    return out


def gantt_chart(
    label: str, workers: Sequence[WorkerTimeline], wan: WanSettings | None = None
) -> GanttChart:
    """The bars, staleness markers and link use of a run's timelines: per worker one lane
    (``worker w``), plus an ``worker w exchange`` lane for its receives and sends where they
    overlap its compute. At most :data:`MAX_ROUNDS` rounds (the earliest) are drawn. ``wan``
    (a shaped run's ``wan.json``) adds each link's set rate to the link use."""
    spans = sorted((s for wt in workers for s in wt.rounds), key=lambda s: s.start)
    shown = spans[:MAX_ROUNDS]
    horizon = max((s.arrival for s in shown), default=0.0)
    keep = {(s.worker, s.round_id, s.start) for s in shown}
    lanes: list[str] = []
    bars: list[Bar] = []
    arrivals: list[Arrival] = []
    for wt in workers:
        lane = f"worker {wt.worker}"
        exchange = f"worker {wt.worker} exchange" if wt.overlapped else lane
        lanes += [lane] if exchange == lane else [lane, exchange]
        for s in wt.rounds:
            if (s.worker, s.round_id, s.start) not in keep:
                continue
            for kind, (a, b) in s.busy():
                where = exchange if kind in ("receive", "send") else lane
                bars.append(Bar(where, kind, a, b - a, s.round_id))
            if s.staleness is not None:
                arrivals.append(Arrival(lane, s.arrival, s.staleness, s.round_id))
        bars += [Bar(lane, "idle", a, b - a, None) for a, b in wt.idle if a < horizon]
    title = f"{label}: rounds per worker"
    if len(spans) > len(shown):
        title += f" (the first {len(shown)} of {len(spans)} rounds)"
    link = link_use(workers, until=horizon)
    rates = set_rates(wan, [wt.worker for wt in workers]) if link else []
    return GanttChart(title, lanes, bars, arrivals, link, len(shown), len(spans), rates)


# -- the PNG/SVG chart ------------------------------------------------------------------------
def plot_timeline(chart: GanttChart, out_dir: Path, stem: str) -> list[Path]:
    """``out_dir/stem.png`` and ``.svg``: the Gantt chart (lanes top to bottom, one color per
    segment kind, a triangle with the staleness at each applied arrival) and, where the
    rounds carry bytes, each worker's link use below it (MB/s sent and received), with each
    link's set rate as a dotted line for a shaped run."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    with_link = bool(chart.link)
    height = 1.2 + 0.45 * len(chart.lanes)
    fig, axes = plt.subplots(
        2 if with_link else 1,
        1,
        figsize=(10, height + (2.6 if with_link else 0)),
        sharex=True,
        squeeze=False,
        gridspec_kw={"height_ratios": [height, 2.6] if with_link else [1]},
    )
    ax = axes[0][0]
    row = {lane: len(chart.lanes) - 1 - i for i, lane in enumerate(chart.lanes)}
    raster = len(chart.bars) > RASTER_BARS  # the SVG embeds the bars as an image
    for kind in KINDS:
        mine = [b for b in chart.bars if b.kind == kind]
        for lane in chart.lanes:
            spans = [(b.start, b.width) for b in mine if b.lane == lane]
            if spans:
                ax.broken_barh(spans, (row[lane] - 0.4, 0.8), facecolors=COLORS[kind],
                               edgecolor="white", linewidth=0.3, rasterized=raster)  # fmt: skip
        if mine:
            ax.bar(0, 0, color=COLORS[kind], label=LABELS[kind])  # legend entry only
    if chart.arrivals:
        xs = [a.time for a in chart.arrivals]
        ys = [row[a.lane] + 0.45 for a in chart.arrivals]
        ax.scatter(xs, ys, marker="v", s=18, c="#d62728", zorder=3, label="arrival (staleness)")
        if len(chart.arrivals) <= LABELLED_ARRIVALS:
            for a, y in zip(chart.arrivals, ys, strict=True):
                ax.annotate(str(a.staleness), (a.time, y), xytext=(0, 3),
                            textcoords="offset points", ha="center", fontsize=6)  # fmt: skip
    ax.set_yticks([row[lane] for lane in chart.lanes], chart.lanes)
    ax.set_ylim(-0.6, len(chart.lanes) - 0.2)
    ax.set_title(chart.title, fontsize=10)
    ax.legend(fontsize="x-small", ncol=3, loc="upper center", bbox_to_anchor=(0.5, -0.12 if not
              with_link else -0.02), frameon=False)  # fmt: skip
    ax.grid(axis="x", alpha=0.3)
    if with_link:
        lx = axes[1][0]
        for use in chart.link:
            style = "-" if use.direction == "send" else "--"
            lx.step(use.times, [r / 1e6 for r in use.rates], where="post", linestyle=style,
                    linewidth=1, color=f"C{use.worker % 10}",
                    label=f"worker {use.worker} {use.direction}")  # fmt: skip
        for rate in chart.set_rates:
            color = "black" if rate.worker is None else f"C{rate.worker % 10}"
            dots = ":" if rate.direction != "receive" else "-."
            lx.axhline(rate.bytes_per_s / 1e6, linestyle=dots, linewidth=1.2, color=color,
                       label=rate.label)  # fmt: skip
        if chart.set_rates:  # headroom above the set rates for the legend
            top = max([r.bytes_per_s for r in chart.set_rates]
                      + [x for u in chart.link for x in u.rates]) / 1e6  # fmt: skip
            lx.set_ylim(0, 1.6 * top)
        lx.set_ylabel("link use (MB/s)")
        lx.grid(alpha=0.3)
        lx.legend(fontsize="x-small", ncol=4)
    axes[-1][0].set_xlabel("time (s, the run's clock)")
    fig.tight_layout()
    written = save_figure(fig, out_dir, stem)
    plt.close(fig)
    return written


def timeline_stem(label: str) -> str:
    """A file stem for a run label (``runs/a b`` → ``timeline_runs-a-b``)."""
    safe = "".join(c if c.isalnum() or c in "._-" else "-" for c in label).strip("-.")
    return f"timeline_{safe or 'run'}"


def plot_timelines(runs: Sequence[RunData], out_dir: Path) -> list[Path]:
    """Each run's Gantt chart (:func:`plot_timeline`) as ``timeline_<run>.png`` and ``.svg``
    (with the set rates of a shaped run's ``wan.json``); a run whose rounds carry no dispatch
    times has none."""
    from heloco.metrics import EVENTS_FILE

    out_dir.mkdir(parents=True, exist_ok=True)
    written: list[Path] = []
    for run in runs:
        workers = timelines(run, read_events(run.path / EVENTS_FILE))
        if workers:
            chart = gantt_chart(run.label, workers, read_settings(run.path))
            written += plot_timeline(chart, out_dir, timeline_stem(run.label))
    return written
