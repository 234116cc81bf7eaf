"""Every `--html` page in headless Chromium: it loads offline with no console error and no
request, draws what its data holds (traces, markers, bars, table rows, read from the rendered
SVG and DOM), and answers a click. Screenshots for a person go to ``out/html-pages/`` (not
committed). Chromium is the distribution's package (`make test` installs it where it can);
without it these tests skip and say so.
"""

from __future__ import annotations

import json
import re
from collections.abc import Callable
from pathlib import Path
from types import ModuleType
from typing import Any

import pytest

from shardmeter.report.htmlpage import plotly_available

REPO = Path(__file__).resolve().parents[1]
OUT = REPO / "out" / "html-pages"
pytestmark = [
    pytest.mark.slow,  # two tiny simulated runs, five commands, one browser: ~1 min on 2 cores
    pytest.mark.skipif(not plotly_available(), reason="the html extra (plotly) is not installed"),
]


def embedded(path: Path, ident: str) -> Any:
    text = path.read_text(encoding="utf-8")
    match = re.search(rf'<script type="application/json" id="{ident}">(.*?)</script>', text, re.S)
    assert match is not None
    return json.loads(match.group(1))


def expected_marks(spec: dict[str, Any]) -> tuple[int, int, int]:
    """(visible traces, scatter markers, bars) a figure spec asks plotly to draw."""
    traces = markers = bars = 0
    for t in spec["data"]:
        if t.get("visible", True) is not True:
            continue
        traces += 1
        if t["type"] == "bar":
            bars += len(t["x"])
        elif "markers" in t.get("mode", "markers"):
            markers += sum(y is not None for y in t["y"])
    return traces, markers, bars


@pytest.fixture(scope="module")
def pages(
    load_benchmark: Callable[[str], ModuleType], tmp_path_factory: pytest.TempPathFactory
) -> dict[str, Any]:
    """Every page built by its command, opened in Chromium, with the plan page clicked."""
    hp = load_benchmark("html_pages")
    binary = hp.find_chromium()
    if binary is None:
        pytest.skip("no Chromium on PATH (Debian: apt-get install chromium; `make test` does it)")
    OUT.mkdir(parents=True, exist_ok=True)
    runs = hp.make_runs(tmp_path_factory.mktemp("runs"))
    built: dict[str, Path] = {}
    for kind, (prog, argv) in hp.page_commands(OUT, runs).items():
        hp.run_cli(prog, argv)
        built[kind] = Path(argv[argv.index("--html") + 1])

    def click_plan(browser: Any, session: str) -> dict[str, Any]:
        # The last point of the Pareto front, clicked with the mouse.
        point = (
            "(function(){var gd=document.getElementById('sm-front');"
            "var k=gd.data.findIndex(function(t){return t.meta&&t.meta.kind==='front';});"
            "var pts=gd.querySelectorAll('.scatterlayer g.trace')[k].querySelectorAll('path.point');"
            "return pts[pts.length-1];})()"
        )
        want = browser.evaluate(
            session,
            "(function(){var gd=document.getElementById('sm-front');var t=gd.data.find("
            "function(t){return t.meta&&t.meta.kind==='front';});"
            "return t.customdata[t.customdata.length-1];})()",
        )
        assert hp.click_element(browser, session, point)
        got = browser.wait_for(
            session,
            f"document.getElementById('sm-selected').getAttribute('data-selected')==='{want}'"
            " && document.getElementById('sm-selected').textContent",
            timeout_s=20,
        )
        bars = browser.evaluate(
            session, "document.querySelectorAll('#sm-time .barlayer g.point').length"
        )
        # Sort the table by cost with a click on its header.
        hp.click_element(
            browser, session, "document.querySelector('#sm-ranked th[data-col=\"5\"]')"
        )
        costs = browser.evaluate(
            session,
            "Array.prototype.map.call(document.querySelectorAll('#sm-ranked tbody tr'),"
            "function(r){return parseFloat(r.cells[5].getAttribute('data-v'));})",
        )
        return {"selected": int(want), "text": got, "bars": bars, "costs": costs}

    checks = {}
    with hp.Chromium(binary) as browser:
        for kind, path in built.items():
            interact = click_plan if kind == "plan" else None
            checks[kind] = hp.check_page(browser, path, OUT / f"{kind}.png", interact)
    return {"paths": built, "checks": checks}


KINDS = ("predict", "plan", "topology", "sweep", "report")


@pytest.mark.parametrize("kind", KINDS)
def test_page_loads_offline_and_draws_its_data(pages: dict[str, Any], kind: str) -> None:
    check = pages["checks"][kind]
    path = pages["paths"][kind]
    assert check.ready == "1"
    assert check.errors == [], check.errors
    assert check.requests == [], check.requests
    assert check.download.startswith("blob:")  # the JSON behind the page, from the page
    assert check.command.startswith(("shardmeter ", "heloco ")) and str(path) in check.command
    specs = embedded(path, "sm-figures")
    extra = embedded(path, "sm-extra")
    for ident, drawn in check.figures.items():
        spec = specs[ident]
        if not spec["data"] and "views" in extra:  # the plan page's selected-plan figures
            spec = extra["views"][0]["time" if ident == "sm-time" else "memory"]
        traces, markers, bars = expected_marks(spec)
        assert (drawn["svg_traces"], drawn["markers"], drawn["bars"]) == (traces, markers, bars), (
            ident
        )
        assert traces > 0 and markers + bars + drawn["lines"] > 0, ident
    assert check.screenshot is not None and check.screenshot.stat().st_size > 10_000


def test_plan_page_content_and_click(pages: dict[str, Any]) -> None:
    check = pages["checks"]["plan"]
    doc = embedded(pages["paths"]["plan"], "sm-data")
    assert check.tables["sm-ranked"] == len(doc["ranked"]) > 1
    front = check.figures["sm-front"]
    kinds = front["kinds"]
    assert front["trace_points"][kinds.index("front")] == len(doc["pareto"])
    assert front["trace_points"][kinds.index("ranked")] == len(doc["ranked"])
    picked = doc["candidates"][check.extra["selected"]]
    assert check.extra["selected"] == len(doc["candidates"]) - 1  # the last front point
    n_islands = len(picked["islands"])
    assert check.extra["bars"] % n_islands == 0 and check.extra["bars"] > 0
    assert f"{picked['n_gpus']} GPUs" in check.extra["text"]
    costs = check.extra["costs"]
    assert costs == sorted(costs) and len(costs) == len(doc["ranked"])


def test_island_pages_content(pages: dict[str, Any]) -> None:
    topo = pages["checks"]["topology"]
    doc = embedded(pages["paths"]["topology"], "sm-data")
    n = len(doc["islands"])
    assert topo.tables["sm-topo-islands"] == n
    assert topo.tables["sm-topo-links"] == n * (n - 1) // 2
    assert topo.figures["sm-topo-util"]["bars"] == n
    sweep = pages["checks"]["sweep"]
    doc = embedded(pages["paths"]["sweep"], "sm-data")
    for k, result in enumerate(doc["sweeps"]):
        fig = sweep.figures[f"sm-sweep-{k}"]
        assert fig["kinds"].count("curve") == 4
        assert fig["kinds"].count("knee") == 4 * sum(
            x["value"] is not None for x in result["knees"]
        )
        assert sweep.tables[f"sm-sweep-{k}-table"] == len(result["points"])


def test_report_page_content(pages: dict[str, Any]) -> None:
    check = pages["checks"]["report"]
    doc = embedded(pages["paths"]["report"], "sm-data")
    assert check.tables["hl-runs"] == len(doc["runs"]) == 2
    assert check.figures["hl-loss-tokens"]["svg_traces"] == 2
    for n, run in enumerate(doc["runs"]):
        fig = check.figures[f"hl-timeline-{n}"]
        rounds = run["rounds"]
        segments = {
            kind: sum(r[kind] is not None and r[kind][1] > r[kind][0] for r in rounds)
            for kind in ("receive", "compute", "send", "communication")
        }
        segments["idle"] = sum(len(v) for v in run["idle"].values())
        assert fig["bars"] == sum(segments.values())
        # The simulator records each round's receive and send: both drawn, none derived.
        assert segments["receive"] == segments["send"] == segments["compute"] == len(rounds)
        assert segments["communication"] == 0
        drawn = [k for k in fig["kinds"] if k != "staleness"]
        assert drawn == [k for k in ("receive", "compute", "send", "idle") if segments[k]]
        applied = [r for r in rounds if r["staleness"] is not None]
        assert fig["markers"] == len(applied) > 0
        assert f"hl-correction-{n}" in check.figures
        link = check.figures[f"hl-link-{n}"]  # bytes recorded: each worker's link use
        workers = {r["worker"] for r in rounds}
        assert sorted(link["kinds"]) == ["link-receive"] * len(workers) + ["link-send"] * len(
            workers
        )
        assert link["lines"] == 2 * len(workers)
    sync = doc["runs"][[r["method"] for r in doc["runs"]].index("sync")]
    assert any(sync["idle"].values())  # the barrier shows as idle
