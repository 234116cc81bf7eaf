"""Per-worker timelines from round events with measured receive/compute/send times: the
segments, idle, the overlapped lane, link use, and the Gantt chart `heloco report` writes."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from heloco.cli import main as heloco
from heloco.metrics import MetricsWriter, round_event
from heloco.net.wan import EmulatedWan, LinkSpec
from heloco.net.wanfile import WAN_FILE, LinkSetting, WanSettings, read_settings, write_settings
from heloco.report import RunData
from heloco.report_html import link_figure
from heloco.timeline import (
    RoundEvent,
    RunEvents,
    SetRate,
    UpdateEvent,
    gantt_chart,
    link_use,
    rate_steps,
    set_rates,
    timelines,
    uncovered,
)
from heloco.types import RoundTiming
from shardmeter.errors import UserInputError

RUN = RunData(Path("run"), "run", [], {}, {"comm_delays": [9.0, 9.0]})  # measured times win


def measured(w: int, rid: int, t: list[float], sent: int = 100, received: int = 400) -> RoundEvent:
    """A round dispatched at t[0], arriving at t[5], receive t[0..1], compute t[2..3], send
    t[4..5]."""
    timing = RoundTiming(*t, bytes_sent=sent, bytes_received=received)
    return RoundEvent(worker=w, round_id=rid, start=t[0], time=t[5], **timing.event_fields())


def test_blocking_rounds_keep_receive_compute_send_and_idle_apart() -> None:
    events = RunEvents(
        [
            measured(0, 0, [0, 1, 1.5, 4, 4, 5]),  # 0.5 s between receive and compute: idle
            measured(0, 1, [6, 7, 7, 9, 9, 10]),  # dispatched 1 s after the arrival: idle
            measured(1, 0, [0, 2, 2, 8, 8, 10]),
        ],
        [UpdateEvent(revision=1, time=5, workers=[0], staleness=[0]),
         UpdateEvent(revision=2, time=10, workers=[0, 1], staleness=[1, 1])],
    )  # fmt: skip
    w0, w1 = timelines(RUN, events)
    first = w0.rounds[0]
    assert (first.receive, first.compute, first.send) == ((0, 1), (1.5, 4), (4, 5))
    assert first.communication is None and (first.bytes_sent, first.bytes_received) == (100, 400)
    assert w0.idle == [(1, 1.5), (5, 6)] and w1.idle == []
    assert (w0.seconds("receive"), w0.seconds("send"), w0.seconds("idle")) == (2, 2, 1.5)
    assert not w0.overlapped and [s.staleness for s in w0.rounds] == [0, 1]
    chart = gantt_chart("run", [w0, w1])
    assert chart.lanes == ["worker 0", "worker 1"]
    assert [chart.count(k) for k in ("receive", "compute", "send", "idle")] == [3, 3, 3, 2]
    assert chart.count("communication") == 0 and len(chart.arrivals) == 3
    assert {(b.kind, b.start, b.width) for b in chart.bars if b.lane == "worker 1"} == {
        ("receive", 0, 2), ("compute", 2, 6), ("send", 8, 2)
    }  # fmt: skip


def test_an_overlapped_exchange_gets_its_own_lane_and_is_not_idle() -> None:
    # Round 1 computes from 3 while round 0's push (3..5) and round 1's dispatch (3..4) travel.
    events = RunEvents([measured(0, 0, [0, 1, 1, 3, 3, 5]), measured(0, 1, [3, 4, 3, 6, 6, 7])], [])
    (w,) = timelines(RUN, events)
    assert w.overlapped and w.idle == []
    chart = gantt_chart("run", [w])
    assert chart.lanes == ["worker 0", "worker 0 exchange"]
    lanes = {(b.lane, b.kind) for b in chart.bars}
    assert lanes == {("worker 0", "compute"), ("worker 0 exchange", "receive"),
                     ("worker 0 exchange", "send")}  # fmt: skip


def test_link_use_is_bytes_over_each_transfer_and_overlaps_add() -> None:
    assert rate_steps([(0, 2, 100), (1, 3, 50)]) == ([0, 1, 2, 3], [50, 75, 25, 0])
    events = RunEvents([measured(0, 0, [0, 1, 1, 3, 3, 5], sent=300, received=400)], [])
    uses = {u.direction: u for u in link_use(timelines(RUN, events))}
    assert (uses["receive"].times, uses["receive"].rates) == ([0, 1], [400, 0])
    assert (uses["send"].times, uses["send"].rates) == ([3, 5], [150, 0])
    assert uncovered(0, 10, [(2, 3), (1, 5), (8, 12)]) == [(0, 1), (5, 8)]


def test_heloco_report_writes_each_runs_gantt_chart(tmp_path: Path) -> None:
    run = tmp_path / "runs" / "a"
    with MetricsWriter(run) as writer:
        for w in (0, 1):
            t = RoundTiming(0, 1, 1, 3 + w, 3 + w, 4 + w, bytes_sent=10, bytes_received=20)
            writer.event(round_event(w, 0, 2, 64, 3.0, 0, 4 + w, t))
        update = {"type": "update", "revision": 1, "time": 4.0, "workers": [0], "staleness": [0]}
        writer.event(update)
        writer.event({"type": "eval", "tokens": 64, "time": 5.0, "revision": 1, "loss": 3.0})
    (run / "config.json").write_text(json.dumps({"paces": [1.0, 2.0]}))
    out = tmp_path / "report"
    assert heloco(["report", str(run), "--out", str(out), "--json"]) == 0
    files = json.loads((out / "report.json").read_text())["files"]
    for fmt in ("png", "svg"):
        assert str(out / f"timeline_a.{fmt}") in files
        assert (out / f"timeline_a.{fmt}").stat().st_size > 5_000
    svg = (out / "timeline_a.svg").read_text()
    assert "link use (MB/s)" in svg  # the rounds carry bytes: the link panel is drawn


@pytest.mark.parametrize("swap", [False, True])
def test_receive_and_send_are_not_confused(swap: bool) -> None:
    # Receive 2 s, send 1 s: the page's totals and bars name each by its own interval.
    t = [0, 2, 2, 5, 5, 6] if not swap else [0, 1, 1, 4, 4, 6]
    (w,) = timelines(RUN, RunEvents([measured(0, 0, t)], []))
    assert (w.seconds("receive"), w.seconds("send")) == ((2, 1) if not swap else (1, 2))


# -- the set rate of a shaped run's links (wan.json) ------------------------------------------
MBIT = 1e6
SHAPED = WanSettings(
    mtu=1500,
    shared=True,
    server=LinkSetting(up_bps=10 * MBIT, down_bps=10 * MBIT),
    workers=[
        LinkSetting(up_bps=20 * MBIT, down_bps=20 * MBIT, rtt_s=0.02),
        LinkSetting(up_bps=8 * MBIT, down_bps=16 * MBIT),
    ],
)


def test_set_rates_are_each_paths_slower_end_in_bytes() -> None:
    # worker 0: min(20, 10) both ways; worker 1: pushes at its own 8 up, dispatches at the
    # server's 10 up (its 16 down is faster); the shared server link: 10 both ways.
    assert set_rates(SHAPED, [0, 1]) == [
        SetRate(0, "both", 10 * MBIT / 8),
        SetRate(1, "send", 8 * MBIT / 8),
        SetRate(1, "receive", 10 * MBIT / 8),
        SetRate(None, "both", 10 * MBIT / 8),
    ]
    unshared = SHAPED.model_copy(update={"shared": False, "server": LinkSetting()})
    assert set_rates(unshared, [0]) == [SetRate(0, "both", 20 * MBIT / 8)]
    assert set_rates(None, [0, 1]) == []


def test_wan_settings_round_trip_and_a_bad_file_names_its_field(tmp_path: Path) -> None:
    links = [LinkSpec(), LinkSpec(50 * MBIT, 50 * MBIT, 0.04), LinkSpec(20 * MBIT, 5 * MBIT)]
    wan = EmulatedWan(["server", "worker0", "worker1"], links)  # not started: no root needed
    write_settings(tmp_path, wan)
    got = read_settings(tmp_path)
    assert got is not None and not got.shared and got.mtu == wan.mtu
    assert got.workers[0] == LinkSetting(up_bps=50 * MBIT, down_bps=50 * MBIT, rtt_s=0.04)
    assert (got.path_bps(1, "send"), got.path_bps(1, "receive")) == (20 * MBIT, 5 * MBIT)
    assert read_settings(tmp_path / "none") is None  # a folder without the file: no set rates
    doc = json.loads((tmp_path / WAN_FILE).read_text())
    doc["workers"][0]["up_bps"] = -1
    (tmp_path / WAN_FILE).write_text(json.dumps(doc))
    with pytest.raises(UserInputError, match="up_bps"):
        read_settings(tmp_path)


def test_the_link_charts_draw_the_set_rate() -> None:
    events = RunEvents([measured(0, 0, [0, 1, 1, 3, 3, 5], sent=300, received=400)], [])
    chart = gantt_chart("run", timelines(RUN, events), SHAPED)
    assert [r.label for r in chart.set_rates] == [
        "worker 0 set rate",
        "server link (shared) set rate",
    ]
    fig = link_figure("run", chart)
    lines = [t for t in fig["data"] if t["meta"]["kind"] == "set-rate"]
    assert [t["y"] for t in lines] == [[1.25, 1.25], [1.25, 1.25]]  # MB/s
    assert lines[0]["x"] == [0, 5]  # across the link use drawn
    assert gantt_chart("run", timelines(RUN, events)).set_rates == []  # old folder: none


def test_heloco_report_draws_a_shaped_runs_set_rate(tmp_path: Path) -> None:
    run = tmp_path / "runs" / "a"
    with MetricsWriter(run) as writer:
        t = RoundTiming(0, 1, 1, 3, 3, 4, bytes_sent=10, bytes_received=20)
        writer.event(round_event(0, 0, 2, 64, 3.0, 0, 4, t))
        writer.event({"type": "eval", "tokens": 64, "time": 5.0, "revision": 1, "loss": 3.0})
    (run / "config.json").write_text(json.dumps({"paces": [1.0]}))
    (run / WAN_FILE).write_text(SHAPED.model_dump_json())
    out = tmp_path / "report"
    assert heloco(["report", str(run), "--out", str(out)]) == 0
    svg = (out / "timeline_a.svg").read_text()
    assert "worker 0 set rate" in svg and "server link (shared) set rate" in svg
