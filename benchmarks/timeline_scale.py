"""What a long run's timeline costs `heloco report`: events read into timelines, the chart's
data, the page's figures, and the PNG + SVG Gantt chart.

    python benchmarks/timeline_scale.py                  # 3 workers x 300, 1000, 5000 rounds

Each run is synthetic: W workers, worker w taking 1 + w seconds of compute per round with a
0.2 s receive and a 0.3 s send (blocking), 0.1 s idle between rounds, 4 MB down and 1 MB up,
one update per arrival (staleness 1). Seconds are the best of --reps in this process.
"""

from __future__ import annotations

import argparse
import tempfile
import time
from collections.abc import Callable, Sequence
from functools import partial
from pathlib import Path
from typing import Any

from heloco.report import RunData
from heloco.report_html import link_figure, timeline_figure
from heloco.timeline import (
    RoundEvent,
    RunEvents,
    UpdateEvent,
    gantt_chart,
    plot_timeline,
    timelines,
)


def synthetic(workers: int, rounds: int) -> RunEvents:
    """The events of the run described in the module docstring."""
    events: list[RoundEvent] = []
    arrivals: list[tuple[float, int]] = []
    for w in range(workers):
        t = 0.0
        for r in range(rounds):
            c = 1.0 + w
            events.append(
                RoundEvent(
                    worker=w, round_id=r, start=t, time=t + c + 0.5, recv_start=t,
                    recv_end=t + 0.2, compute_start=t + 0.2, compute_end=t + 0.2 + c,
                    send_start=t + 0.2 + c, send_end=t + c + 0.5, bytes_sent=10**6,
                    bytes_received=4 * 10**6,
                )
            )  # fmt: skip
            arrivals.append((t + c + 0.5, w))
            t += c + 0.6
    arrivals.sort()
    updates = [
        UpdateEvent(revision=k + 1, time=at, workers=[w], staleness=[1])
        for k, (at, w) in enumerate(arrivals)
    ]
    return RunEvents(events, updates)


def best(fn: Callable[[], Any], reps: int) -> tuple[float, Any]:
    """(best seconds of ``reps`` calls, the last result)."""
    out, secs = None, float("inf")
    for _ in range(reps):
        t0 = time.perf_counter()
        out = fn()
        secs = min(secs, time.perf_counter() - t0)
    return secs, out


def main(argv: Sequence[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--workers", type=int, default=3)
    parser.add_argument("--rounds", default="300,1000,5000", help="rounds per worker, a list")
    parser.add_argument("--reps", type=int, default=2)
    args = parser.parse_args(argv)
    run = RunData(Path("synthetic"), "synthetic", [], {}, {})
    print(f"{'rounds':>7} {'bars':>6} {'timelines s':>12} {'chart+figs s':>13} {'png+svg s':>10}"
          f" {'png KB':>7} {'svg KB':>7}")  # fmt: skip
    for n in (int(x) for x in args.rounds.split(",")):
        events = synthetic(args.workers, n)
        t_tl, wts = best(partial(timelines, run, events), args.reps)

        def figures(w: Any = wts) -> Any:
            chart = gantt_chart("synthetic", w)
            timeline_figure(chart)
            link_figure("synthetic", chart)
            return chart

        t_fig, chart = best(figures, args.reps)
        with tempfile.TemporaryDirectory() as tmp:
            t_plot, files = best(partial(plot_timeline, chart, Path(tmp), "t"), args.reps)
            kb = {p.suffix: p.stat().st_size / 1e3 for p in files}
        print(f"{args.workers * n:>7} {len(chart.bars):>6} {t_tl:>12.2f} {t_fig:>13.2f} "
              f"{t_plot:>10.2f} {kb['.png']:>7.0f} {kb['.svg']:>7.0f}")  # fmt: skip
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
