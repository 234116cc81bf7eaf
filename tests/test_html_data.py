"""`--html` pages without a browser: what each page embeds and draws is the result it shows.

The page's JSON (``<script id="sm-data">``) and figure specs (``sm-figures``) are read back
from the written file and checked against the result objects; the timeline derivation of
`heloco report --html` is checked on hand-made events. tests/test_html_pages.py opens the
same pages in Chromium.
"""

from __future__ import annotations

import json
import math
import re
import subprocess
import sys
from collections.abc import Callable
from pathlib import Path
from typing import Any

import pytest

from heloco.report import RunData
from heloco.timeline import RoundEvent, RunEvents, UpdateEvent, read_events, timelines
from shardmeter.cli import main as shardmeter
from shardmeter.report import htmlpage
from shardmeter.report.htmlpage import Page, script_json

pytestmark = pytest.mark.skipif(
    not htmlpage.plotly_available(), reason="the html extra (plotly) is not installed"
)


def embedded(path: Path, ident: str) -> Any:
    """The JSON of ``<script type="application/json" id=ident>`` in a written page."""
    text = path.read_text(encoding="utf-8")
    match = re.search(rf'<script type="application/json" id="{ident}">(.*?)</script>', text, re.S)
    assert match is not None, ident
    return json.loads(match.group(1))


@pytest.fixture(scope="module")
def plan_page(tmp_path_factory: pytest.TempPathFactory) -> Path:
    path = tmp_path_factory.mktemp("html") / "plan.html"
    argv = ["plan", "--cluster", "dgx-h100", "--gpus", "16", "--model", "llama-3.1-8b",
            "--top", "5", "--no-progress", "--html", str(path)]  # fmt: skip
    assert shardmeter(argv) == 0
    return path


def test_plan_page_embeds_the_search_and_maps_points_to_plans(plan_page: Path) -> None:
    doc = embedded(plan_page, "sm-data")
    figs = embedded(plan_page, "sm-figures")
    extra = embedded(plan_page, "sm-extra")
    assert doc["schema"] == "shardmeter.plan/1"
    cands = doc["candidates"]
    assert len(cands) == len(doc["ranked"]) + len(doc["pareto"]) == len(extra["views"])
    # Each island's memory components add up to its peak memory per GPU.
    for c in cands:
        for island in c["islands"]:
            parts = island["memory_breakdown_bytes"]
            assert sum(parts.values()) == pytest.approx(island["memory_bytes"], rel=1e-9)
    front = figs["sm-front"]["data"]
    by_kind = {t.get("meta", {}).get("kind"): t for t in front}
    for kind, plans in (("ranked", doc["ranked"]), ("front", doc["pareto"])):
        trace = by_kind[kind]
        assert len(trace["x"]) == len(plans)
        for x, y, k in zip(trace["x"], trace["y"], trace["customdata"], strict=True):
            assert x * 86400 == pytest.approx(cands[k]["wall_s"])  # the point is its plan
            assert y == pytest.approx(cands[k]["cost_usd"])
    # The $/Mtok button's y values are each plan's USD per million tokens.
    button = figs["sm-front"]["layout"]["updatemenus"][0]["buttons"][1]
    k = front.index(by_kind["front"])
    mtok = button["args"][0]["y"][k]
    for y, c in zip(mtok, by_kind["front"]["customdata"], strict=True):
        assert y == pytest.approx(cands[c]["usd_per_mtok"])
    # The selected plan's bars: one bar per island per non-zero term, the exposed ones stacked
    # to the step, the hidden ones (hatched, beside it) each collective's time under compute.
    view = extra["views"][0]
    islands = cands[0]["islands"]
    exposed = [t for t in view["time"]["data"] if t["meta"]["kind"] == "exposed"]
    hidden = [t for t in view["time"]["data"] if t["meta"]["kind"] == "hidden"]
    steps = [sum(t["y"][i] for t in exposed) for i in range(len(islands))]
    assert steps == pytest.approx([i["step_time_s"] for i in islands], rel=1e-9)
    tops = [t["base"][i] + t["y"][i] for t in exposed[-1:] for i in range(len(islands))]
    assert tops == pytest.approx(steps, rel=1e-9)  # each stacked on the terms before it
    assert {t["offsetgroup"] for t in exposed} == {"exposed"}
    assert hidden, "the best plan overlaps some collective"
    for t in hidden:
        assert t["marker"]["pattern"]["shape"] == "/" and t["offsetgroup"] == "hidden"
        want = [i["time_hidden_s"][t["meta"]["term"]] for i in islands]
        assert t["y"] == pytest.approx(want, rel=1e-12) and max(want) > 0
    assert {t["meta"]["term"] for t in hidden} == {
        k for i in islands for k, v in i["time_hidden_s"].items() if v > 0
    }


def test_page_is_self_contained(plan_page: Path) -> None:
    text = plan_page.read_text(encoding="utf-8")
    assert "<script src" not in text and "<link" not in text and "<img" not in text
    assert "default-src 'none'" in text  # the browser itself refuses any request
    assert 'id="sm-command">shardmeter plan --cluster dgx-h100' in text
    assert 'id="sm-download"' in text and "0.1.0" in text


def test_script_json_cannot_close_its_element(tmp_path: Path) -> None:
    nasty = {"label": "</script><script>alert(1)</script> & <!--"}
    assert "</" not in script_json(nasty) and "<!--" not in script_json(nasty)
    page = Page("t", tool="x", version="0", command="c", data=nasty, json_name="t.json")
    path = page.write(tmp_path / "t.html")
    assert embedded(path, "sm-data") == nasty


def test_html_flag_refusals(
    tmp_path: Path,
    cli_error: Callable[[Callable[[list[str]], int], list[str]], str],
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    err = cli_error(shardmeter, ["predict", "--html", str(tmp_path / "x.txt")])
    assert "--html" in err and "x.txt" in err and ".html" in err
    monkeypatch.setattr(htmlpage, "plotly_available", lambda: False)
    for argv in (
        ["predict", "--html", str(tmp_path / "p.html")],
        ["plan", "--cluster", "dgx-h100", "--gpus", "8", "--html", str(tmp_path / "p.html")],
        ["sweep", "--topology", "two-clouds", "--html", str(tmp_path / "p.html")],
        ["predict", "--topology", "two-clouds", "--html", str(tmp_path / "p.html")],
    ):
        err = cli_error(shardmeter, argv)
        assert "pip install -e '.[html]'" in err, err
    assert not (tmp_path / "p.html").exists()


def test_core_import_does_not_load_plotly() -> None:
    code = (
        "import sys, shardmeter, shardmeter.cli, shardmeter.cli.plan, shardmeter.report.html; "
        "shardmeter.cli.build_parser(); print([m for m in sys.modules if 'plotly' in m])"
    )
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True)
    assert out.stdout.strip() == "[]"


def test_topology_and_sweep_pages(tmp_path: Path) -> None:
    topo, sweep = tmp_path / "topo.html", tmp_path / "sweep.html"
    assert shardmeter(["predict", "--topology", "two-clouds", "--html", str(topo)]) == 0
    doc = embedded(topo, "sm-data")
    figs = embedded(topo, "sm-figures")
    util = figs["sm-topo-util"]["data"][0]
    assert util["y"] == pytest.approx([i["utilization"] for i in doc["islands"]])
    cost = figs["sm-topo-cost"]["data"]
    assert [a + b for a, b in zip(cost[0]["y"], cost[1]["y"], strict=True)] == pytest.approx(
        [i["gpu_cost_usd"] + i["egress_cost_usd"] for i in doc["islands"]]
    )
    # Each island's round of WAN bytes crosses the one path: busy = bytes / bandwidth / round.
    (busy,) = figs["sm-topo-linkload"]["data"][0]["y"]
    sent = max(i["wan_bytes_per_round"] for i in doc["islands"])
    assert busy == pytest.approx(sent / (doc["wan_gbit"] * 1e9 / 8) / doc["round_s"])
    argv = ["sweep", "--topology", "two-clouds", "--over", "inner_steps", "--no-plots"]
    assert shardmeter([*argv, "--out", str(tmp_path), "--html", str(sweep)]) == 0
    doc = embedded(sweep, "sm-data")
    traces = embedded(sweep, "sm-figures")["sm-sweep-0"]["data"]
    (result,) = doc["sweeps"]
    knees = [k["value"] for k in result["knees"] if k["value"] is not None]
    assert knees, "two-clouds has a regime flip in H"
    marked = {t["x"][0] for t in traces if t.get("meta", {}).get("kind") == "knee"}
    assert marked == set(knees)
    curves = [t for t in traces if t.get("meta", {}).get("kind") == "curve"]
    assert curves[0]["y"] == pytest.approx([p["tokens_per_s"] for p in result["points"]])


# -- heloco report: the timeline from events --------------------------------------------------
def _run(config: dict[str, Any], summary: dict[str, Any]) -> RunData:
    return RunData(Path("run"), "run", [], summary, config)


def _round(w: int, rid: int, start: float, end: float, steps: int = 2) -> RoundEvent:
    return RoundEvent(worker=w, round_id=rid, steps=steps, start=start, time=end)


def _update(rev: int, t: float, workers: list[int], stale: list[int]) -> UpdateEvent:
    return UpdateEvent(revision=rev, time=t, workers=workers, staleness=stale)


def test_timeline_sync_rounds_split_by_comm_delays_with_idle_at_the_barrier() -> None:
    # Two workers, paces 1 and 2 s/step, comm 0.5 and 1 s: rounds of 2.5 s and 5 s, barrier at 5.
    events = RunEvents(
        [_round(0, 0, 0, 2.5), _round(1, 0, 0, 5), _round(0, 1, 5, 7.5), _round(1, 1, 5, 10)],
        [_update(1, 5, [0, 1], [0, 0]), _update(2, 10, [0, 1], [0, 0])],
    )
    fast, slow = timelines(_run({"comm_delays": [0.5, 1.0]}, {"paces": [1.0, 2.0]}), events)
    first = fast.rounds[0]
    assert (first.compute, first.communication) == ((0.0, 2.0), (2.0, 2.5))
    assert (first.receive, first.send) == (None, None)  # not recorded: one derived segment
    assert slow.rounds[0].compute == (0.0, 4.0) and slow.rounds[0].communication == (4.0, 5.0)
    assert fast.idle == [(2.5, 5.0)] and slow.idle == []  # the barrier; the last round waits not
    assert (fast.seconds("compute"), fast.seconds("communication")) == (4.0, 1.0)
    assert [s.staleness for wt in (fast, slow) for s in wt.rounds] == [0, 0, 0, 0]


def test_timeline_from_paces_and_staleness_per_arrival() -> None:
    # Asynchronous: worker 1 (slow) arrives after three updates of worker 0.
    events = RunEvents(
        [_round(0, 0, 0, 2), _round(0, 1, 2, 4), _round(0, 2, 4, 6), _round(1, 0, 0, 6.5, 3)],
        [_update(1, 2, [0], [0]), _update(2, 4, [0], [2]), _update(3, 6, [0], [1]),
         _update(4, 6.5, [1], [3])],
    )  # fmt: skip
    fast, slow = timelines(_run({}, {"paces": [1.0, 2.0]}), events)
    r = slow.rounds[0]
    assert (r.compute, r.communication, r.staleness) == ((0.0, 6.0), (6.0, 6.5), 3)
    assert [s.staleness for s in fast.rounds] == [0, 2, 1]  # each its own update
    unknown = timelines(_run({}, {}), events)  # neither paces nor delays: all compute
    assert all(s.communication is None for wt in unknown for s in wt.rounds)


def test_read_events_names_a_malformed_round(tmp_path: Path) -> None:
    path = tmp_path / "events.jsonl"
    path.write_text(
        '{"type": "round", "worker": 0, "start": 0.0, "time": 1.0}\n'
        '{"type": "round", "worker": -1, "start": 0.0, "time": 1.0}\n'
    )
    with pytest.raises(ValueError, match=r"events.jsonl:2.*worker"):
        read_events(path)
    path.write_text('{"type": "round", "worker": 0, "start": 0.0, "time": 1.0}\n{"torn')
    assert len(read_events(path).rounds) == 1
    path.write_text('{"type": "round", "worker": 0, "time": 1.0}\n')  # no dispatch time
    assert timelines(_run({}, {}), read_events(path)) == []
    assert math.isfinite(read_events(path).rounds[0].time)


def test_infeasible_plan_page_shows_the_closest_plan(tmp_path: Path) -> None:
    path = tmp_path / "plan.html"
    argv = ["plan", "--cluster", "dgx-h100", "--gpus", "8", "--model", "llama-3.1-8b",
            "--deadline", "1s", "--no-progress", "--html", str(path)]  # fmt: skip
    assert shardmeter(argv) == 1  # no plan meets the deadline
    doc, extra = embedded(path, "sm-data"), embedded(path, "sm-extra")
    assert doc["ranked"] == [] and doc["infeasible"]["closest"] is not None
    assert extra["views"][0]["title"].startswith("Closest plan")
    assert doc["candidates"][0]["wall_s"] == pytest.approx(doc["infeasible"]["closest"]["wall_s"])
