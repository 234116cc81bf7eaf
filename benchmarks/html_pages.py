"""The `--html` pages in a real browser: build each kind, open it in headless Chromium, check it.

    python benchmarks/html_pages.py                         # table: size, generation time
    python benchmarks/html_pages.py --screenshots docs/img  # also the PNGs docs/reports.md shows
                                                            # (and a run's PNG Gantt chart)

For each page kind (`shardmeter predict`, `plan`, `predict --topology`, `sweep`, and
`heloco report` over two tiny simulated runs) it times the command without and with
`--html`, best of --reps runs, each a new process (`cmd s`, `+html s`). It also times the
page's own cost directly: the seconds spent in the page builder and `Page.write` (render and
write) during the command, in this process with the imports paid (`page s`). It records
the page size, then opens the page in headless Chromium through the DevTools protocol over
a pipe (`--remote-debugging-pipe`, no port, no extra package). It reports console errors,
network requests, and what was drawn: traces and points per figure, rows per table.
tests/test_html_pages.py uses the same `Chromium` and `check_page`.
"""

from __future__ import annotations

import argparse
import base64
import contextlib
import io
import json
import os
import select
import shutil
import subprocess
import sys
import tempfile
import time
from collections.abc import Callable, Iterator, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

CHROMIUM_NAMES = ("chromium", "chromium-browser", "google-chrome", "chrome")
FLAGS = (
    "--headless",
    "--no-sandbox",
    "--disable-gpu",
    "--disable-background-networking",
    "--disable-component-update",
    "--disable-sync",
    "--disable-default-apps",
    "--disable-extensions",
    "--no-first-run",
    "--no-default-browser-check",
    "--mute-audio",
    "--hide-scrollbars",
    "--remote-debugging-pipe",
)
LOCAL_SCHEMES = ("file:", "data:", "blob:", "about:", "chrome-error:")

# What the page drew, read from the DOM after `data-ready` (SVG elements plotly rendered).
COUNT_JS = r"""
(function(){
  var figs={};
  document.querySelectorAll('div.fig').forEach(function(d){
    figs[d.id]={traces:+(d.getAttribute('data-traces')||-1),
      points:+(d.getAttribute('data-points')||-1),
      svg_traces:d.querySelectorAll('g.trace').length,
      markers:d.querySelectorAll('.scatterlayer path.point').length,
      bars:d.querySelectorAll('.barlayer g.point').length,
      lines:d.querySelectorAll('.scatterlayer path.js-line').length,
      kinds:(d.data||[]).map(function(t){return (t.meta&&t.meta.kind)||t.type;}),
      trace_points:(d.data||[]).map(function(t){return (t.x||[]).length;})};
  });
  var tables={};
  document.querySelectorAll('table.sortable').forEach(function(t){
    tables[t.id]=t.tBodies[0].rows.length;});
  return JSON.stringify({ready:document.body.getAttribute('data-ready'),
    figures:figs,tables:tables,title:document.title,
    download:(document.getElementById('sm-download')||{}).href||'',
    command:(document.getElementById('sm-command')||{}).textContent||''});
})()
"""


def find_chromium() -> str | None:
    """The Chromium binary on PATH (the distribution's package), or None."""
    for name in CHROMIUM_NAMES:
        path = shutil.which(name)
        if path:
            return path
    return None


class Chromium:
    """Headless Chromium driven through the DevTools protocol on fds 3/4 (NUL-separated JSON).

    One browser per instance; `open` loads a page in a fresh tab and records its console
    errors, exceptions and every request it made.
    """

    def __init__(self, binary: str, timeout_s: float = 60.0) -> None:
        self.timeout_s = timeout_s
        self.profile = tempfile.mkdtemp(prefix="html-chromium-")
        to_child_r, self._to_child = os.pipe()
        self._from_child, from_child_w = os.pipe()

        def wire() -> None:  # runs in the child before exec: its fds 3 and 4 are the pipe
            read_end, write_end = os.dup(to_child_r), os.dup(from_child_w)  # not 3 or 4 now
            os.dup2(read_end, 3)  # dup2 makes them inheritable
            os.dup2(write_end, 4)

        self.log = open(os.path.join(self.profile, "stderr.log"), "wb")  # noqa: SIM115
        self.proc = subprocess.Popen(
            [binary, *FLAGS, f"--user-data-dir={self.profile}", "about:blank"],
            stdin=subprocess.DEVNULL,
            stdout=subprocess.DEVNULL,
            stderr=self.log,
            close_fds=False,  # keep the inheritable fds 3 and 4 made in `wire`
            preexec_fn=wire,
        )
        os.close(to_child_r)
        os.close(from_child_w)
        self._buf = b""
        self._next = 0
        self.events: list[dict[str, Any]] = []

    # -- protocol -----------------------------------------------------------------------------
    def _read_message(self, deadline: float) -> dict[str, Any]:
        while b"\0" not in self._buf:
            left = deadline - time.monotonic()
            if left <= 0:
                raise TimeoutError("no answer from Chromium")
            ready, _, _ = select.select([self._from_child], [], [], left)
            if ready:
                chunk = os.read(self._from_child, 1 << 20)
                if not chunk:
                    raise RuntimeError("Chromium closed the DevTools pipe")
                self._buf += chunk
        raw, _, self._buf = self._buf.partition(b"\0")
        message: dict[str, Any] = json.loads(raw)
        return message

    def send(self, method: str, params: dict[str, Any] | None = None, session: str = "") -> Any:
        """Call one DevTools method and return its result (events seen meanwhile are kept)."""
        self._next += 1
        msg: dict[str, Any] = {"id": self._next, "method": method, "params": params or {}}
        if session:
            msg["sessionId"] = session
        os.write(self._to_child, json.dumps(msg).encode() + b"\0")
        deadline = time.monotonic() + self.timeout_s
        while True:
            reply = self._read_message(deadline)
            if reply.get("id") == self._next:
                if "error" in reply:
                    raise RuntimeError(f"{method}: {reply['error']}")
                return reply.get("result", {})
            self.events.append(reply)

    def pump(self, seconds: float) -> None:
        """Collect events for ``seconds``."""
        deadline = time.monotonic() + seconds
        while True:
            try:
                self.events.append(self._read_message(deadline))
            except TimeoutError:
                return

    def evaluate(self, session: str, expression: str) -> Any:
        result = self.send(
            "Runtime.evaluate",
            {"expression": expression, "returnByValue": True, "awaitPromise": True},
            session,
        )
        if "exceptionDetails" in result:
            raise RuntimeError(f"page script failed: {result['exceptionDetails']}")
        return result.get("result", {}).get("value")

    def open(self, url: str, width: int = 1280, height: int = 900) -> str:
        """A new tab with every domain the checks read enabled; returns its session id."""
        target = self.send("Target.createTarget", {"url": "about:blank"})["targetId"]
        session = str(
            self.send("Target.attachToTarget", {"targetId": target, "flatten": True})["sessionId"]
        )
        for domain in ("Page", "Runtime", "Log", "Network"):
            self.send(f"{domain}.enable", {}, session)
        self.send(
            "Emulation.setDeviceMetricsOverride",
            {"width": width, "height": height, "deviceScaleFactor": 1, "mobile": False},
            session,
        )
        self.events.clear()
        self.send("Page.navigate", {"url": url}, session)
        return session

    def wait_for(self, session: str, expression: str, timeout_s: float = 60.0) -> Any:
        """Poll ``expression`` until it is truthy; returns its value."""
        deadline = time.monotonic() + timeout_s
        while time.monotonic() < deadline:
            try:
                value = self.evaluate(session, expression)
            except RuntimeError:
                value = None
            if value:
                return value
            self.pump(0.1)
        raise TimeoutError(f"{expression} never became true")

    def screenshot(
        self, session: str, path: Path, max_height: int = 4000, scale: float = 1.0
    ) -> Path:
        """A PNG of the whole page (up to ``max_height`` CSS pixels tall), ``scale`` × size."""
        metrics = self.send("Page.getLayoutMetrics", {}, session)
        size = metrics.get("cssContentSize") or metrics["contentSize"]
        height = min(int(size["height"]) + 1, max_height)
        width = int(size["width"])
        shot = self.send(
            "Page.captureScreenshot",
            {
                "format": "png",
                "captureBeyondViewport": True,
                "clip": {"x": 0, "y": 0, "width": width, "height": height, "scale": scale},
            },
            session,
        )
        path.parent.mkdir(parents=True, exist_ok=True)
        path.write_bytes(base64.b64decode(shot["data"]))
        return path

    def close(self) -> None:
        with contextlib.suppress(RuntimeError, TimeoutError, OSError):
            self.send("Browser.close")
        try:
            self.proc.wait(timeout=10)
        except subprocess.TimeoutExpired:
            self.proc.kill()
            self.proc.wait()
        for fd in (self._to_child, self._from_child):
            with contextlib.suppress(OSError):
                os.close(fd)
        self.log.close()
        shutil.rmtree(self.profile, ignore_errors=True)

    def __enter__(self) -> Chromium:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()


@dataclass
class PageCheck:
    """What a page did in the browser."""

    path: Path
    ready: str | None
    errors: list[str]
    requests: list[str]  # URLs that are not the file itself or data:/blob: URIs
    figures: dict[str, dict[str, Any]]
    tables: dict[str, int]
    title: str
    download: str
    command: str
    load_s: float
    screenshot: Path | None = None
    extra: dict[str, Any] = field(default_factory=dict)


def problems(events: Sequence[dict[str, Any]], page_url: str) -> tuple[list[str], list[str]]:
    """(console errors and exceptions, network requests) among DevTools events."""
    errors, requests = [], []
    for ev in events:
        method, params = ev.get("method"), ev.get("params", {})
        if method == "Runtime.consoleAPICalled" and params.get("type") in ("error", "assert"):
            args = params.get("args", [])
            errors.append("console: " + " ".join(str(a.get("value", a)) for a in args))
        elif method == "Runtime.exceptionThrown":
            details = params.get("exceptionDetails", {})
            errors.append("exception: " + str(details.get("exception", details)))
        elif method == "Log.entryAdded" and params.get("entry", {}).get("level") == "error":
            entry = params["entry"]
            errors.append(f"log: {entry.get('text')} {entry.get('url', '')}".strip())
        elif method == "Network.requestWillBeSent":
            url = params.get("request", {}).get("url", "")
            if url != page_url and not url.startswith(LOCAL_SCHEMES[1:]):
                requests.append(url)
        elif method == "Network.loadingFailed":
            errors.append(f"load failed: {params.get('errorText')}")
    return errors, requests


def check_page(
    browser: Chromium,
    path: Path,
    screenshot: Path | None = None,
    interact: Callable[[Chromium, str], dict[str, Any]] | None = None,
    shot: tuple[int, float] = (4000, 1.0),
) -> PageCheck:
    """Open ``path``, wait for the page to draw, read what it drew, optionally act on it
    (``interact(browser, session)``) and take a screenshot."""
    url = path.resolve().as_uri()
    t0 = time.monotonic()
    session = browser.open(url)
    browser.wait_for(session, "document.body && document.body.getAttribute('data-ready')")
    load_s = time.monotonic() - t0
    counts = json.loads(browser.evaluate(session, COUNT_JS))
    extra = interact(browser, session) if interact is not None else {}
    browser.pump(0.3)  # late console messages and requests
    png = None if screenshot is None else browser.screenshot(session, screenshot, *shot)
    errors, requests = problems(browser.events, url)
    return PageCheck(
        path=path,
        ready=counts["ready"],
        errors=errors,
        requests=requests,
        figures=counts["figures"],
        tables=counts["tables"],
        title=counts["title"],
        download=counts["download"],
        command=counts["command"],
        load_s=load_s,
        screenshot=png,
        extra=extra,
    )


def click_element(browser: Chromium, session: str, selector_js: str) -> bool:
    """A real mouse click (move, press, release) at the centre of the element ``selector_js``
    evaluates to, after scrolling it into view; False if there is no such element."""
    rect = browser.evaluate(
        session,
        f"(function(){{var e={selector_js};if(!e)return null;e.scrollIntoView({{block:'center'}});"
        "var r=e.getBoundingClientRect();return [r.left+r.width/2,r.top+r.height/2];})()",
    )
    if not rect:
        return False
    x, y = rect
    for kind in ("mouseMoved", "mousePressed", "mouseReleased"):
        params = {"type": kind, "x": x, "y": y, "button": "left", "clickCount": 1}
        if kind == "mouseMoved":
            params = {"type": kind, "x": x, "y": y}
        browser.send("Input.dispatchMouseEvent", params, session)
        browser.pump(0.05)
    return True


# -- building the pages ----------------------------------------------------------------------
TINY_RUN = [
    "simulate", "--inner-steps", "2", "--token-budget", "3072", "--threads", "1", "--quiet",
    "--eval-every", "1024", "--set", "eval_windows=4", "--set", "workers=3",
    "--set", "data.synthetic_chars_per_language=30000", "--set", "data.val_chars_per_language=5000",
    "--paces", "1,1,2",
]  # fmt: skip


def make_runs(root: Path) -> list[Path]:
    """Two tiny simulated runs with link delays (HeLoCo asynchronous, sync DiLoCo)."""
    from heloco.cli import main as heloco

    runs = []
    for method, extra in (
        ("heloco", ["--set", "comm_delays=[0.3,0.3,0.6]"]),
        ("sync", ["--set", "comm_delays=[0.5,0.5,1.0]"]),
    ):
        out = root / method
        if not (out / "summary.json").is_file():
            with contextlib.redirect_stdout(io.StringIO()):  # its summary table
                rc = heloco([*TINY_RUN, *extra, "--method", method, "--out", str(out)])
            assert rc == 0, f"heloco simulate --method {method} exited {rc}"
        runs.append(out)
    return runs


def page_commands(out: Path, runs: Sequence[Path]) -> dict[str, tuple[str, list[str]]]:
    """Page kind -> (program, argv with --html)."""
    report = [*(str(r) for r in runs), "--out", str(out / "report-files"), "--no-plots"]
    return {
        "predict": ("shardmeter", ["predict", "--html", str(out / "predict.html")]),
        "plan": (
            "shardmeter",
            [
                "plan",
                "--topology",
                "eight-heterogeneous",
                "--no-progress",
                "--html",
                str(out / "plan.html"),
            ],
        ),
        "topology": (
            "shardmeter",
            ["predict", "--topology", "two-clouds", "--html", str(out / "topology.html")],
        ),
        "sweep": (
            "shardmeter",
            [
                "sweep",
                "--topology",
                "two-clouds",
                "--over",
                "bandwidth,inner_steps",
                "--no-plots",
                "--html",
                str(out / "sweep.html"),
            ],
        ),
        "report": ("heloco", ["report", *report, "--html", str(out / "report.html")]),
    }


def run_cli(prog: str, argv: list[str]) -> float:
    """Wall seconds of ``prog argv`` as a user runs it: a new process (imports included),
    the console script beside this interpreter, its output discarded."""
    exe = Path(sys.executable).parent / prog
    t0 = time.perf_counter()
    done = subprocess.run([str(exe), *argv], capture_output=True, text=True, check=False)
    elapsed = time.perf_counter() - t0
    if done.returncode not in (0, 1):
        raise RuntimeError(f"{prog} {' '.join(argv)} exited {done.returncode}: {done.stderr}")
    return elapsed


PAGE_FUNCTIONS = (
    ("shardmeter.report.html", ("plan_page", "predict_page", "topology_page", "sweep_page")),
    ("heloco.report_html", ("report_page",)),
    ("shardmeter.report.htmlpage", ("Page.write",)),
)


@contextlib.contextmanager
def page_timer() -> Iterator[list[float]]:
    """Time spent in the page builders and `Page.write` (render + write) while the block
    runs, summed into the yielded one-element list (seconds)."""
    import importlib

    spent = [0.0]
    undo = []
    for module_name, names in PAGE_FUNCTIONS:
        module = importlib.import_module(module_name)
        for name in names:
            owner: Any = module
            attr = name
            if "." in name:
                cls, attr = name.split(".")
                owner = getattr(module, cls)
            original = getattr(owner, attr)

            def timed(*a: Any, _f: Any = original, **k: Any) -> Any:
                t0 = time.perf_counter()
                try:
                    return _f(*a, **k)
                finally:
                    spent[0] += time.perf_counter() - t0

            setattr(owner, attr, timed)
            undo.append((owner, attr, original))
    try:
        yield spent
    finally:
        for owner, attr, original in undo:
            setattr(owner, attr, original)


def page_seconds(prog: str, argv: list[str]) -> float:
    """Seconds ``prog argv`` spends building and writing its page, in this process."""
    from heloco.cli import main as heloco
    from shardmeter.cli import main as shardmeter

    main = shardmeter if prog == "shardmeter" else heloco
    with page_timer() as spent, contextlib.redirect_stdout(io.StringIO()):
        rc = main(argv)
    if rc not in (0, 1):
        raise RuntimeError(f"{prog} {' '.join(argv)} exited {rc}")
    return spent[0]


DOC_SHOT = (3000, 0.6)  # docs screenshots: the top 3000 CSS px of a page, at 60 % size


def shrink_png(path: Path) -> None:
    """Re-save a screenshot with a 256-colour palette (about a third of the bytes)."""
    try:
        from PIL import Image
    except ImportError:
        return
    with Image.open(path) as img:
        small = img.convert("RGB").quantize(colors=256, method=Image.Quantize.MEDIANCUT)
    small.save(path, optimize=True)


def without_html(argv: list[str]) -> list[str]:
    k = argv.index("--html")
    return argv[:k] + argv[k + 2 :]


def main(argv: Sequence[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--out", type=Path, default=Path("out/html-pages"))
    parser.add_argument("--reps", type=int, default=3, help="timed runs per command (best)")
    parser.add_argument("--screenshots", type=Path, help="write report-<kind>.png here")
    parser.add_argument("--no-browser", action="store_true", help="sizes and times only")
    args = parser.parse_args(argv)
    args.out.mkdir(parents=True, exist_ok=True)
    runs = make_runs(args.out / "runs")
    cmds = page_commands(args.out, runs)
    rows = []
    for kind, (prog, cli) in cmds.items():
        plain = min(run_cli(prog, without_html(cli)) for _ in range(args.reps))
        with_page = min(run_cli(prog, cli) for _ in range(args.reps))
        page_seconds(prog, cli)  # warm: imports paid before the page is timed
        page_s = min(page_seconds(prog, cli) for _ in range(args.reps))
        path = Path(cli[cli.index("--html") + 1])
        rows.append((kind, path, plain, with_page, page_s))
    binary = None if args.no_browser else find_chromium()
    checks: dict[str, PageCheck] = {}
    if binary is not None:
        with Chromium(binary) as browser:
            for kind, path, *_ in rows:
                shot = None if args.screenshots is None else args.screenshots / f"report-{kind}.png"
                checks[kind] = check_page(browser, path, shot, shot=DOC_SHOT)
                if shot is not None:
                    shrink_png(shot)
    print(f"{'page':<9} {'size MB':>8} {'cmd s':>7} {'+html s':>8} {'page s':>7} "
          f"{'figs':>5} {'traces':>7} {'rows':>5} {'errors':>7} {'requests':>9} {'load s':>7}")  # fmt: skip
    for kind, path, plain, with_page, page_s in rows:
        c = checks.get(kind)
        figs = traces = nrows = errs = reqs = "-"
        load = "-"
        if c is not None:
            figs = str(len(c.figures))
            traces = str(sum(f["svg_traces"] for f in c.figures.values()))
            nrows = str(sum(c.tables.values()))
            errs, reqs, load = str(len(c.errors)), str(len(c.requests)), f"{c.load_s:.2f}"
        print(
            f"{kind:<9} {path.stat().st_size / 1e6:>8.2f} {plain:>7.2f} {with_page:>8.2f} "
            f"{page_s:>7.2f} {figs:>5} {traces:>7} {nrows:>5} {errs:>7} {reqs:>9} "
            f"{load:>7}"
        )
    if binary is None and not args.no_browser:
        print("(no Chromium on PATH: browser columns left out)")
    if args.screenshots is not None:
        write_gantt(runs[-1], args.screenshots / "timeline-sync.png")
    return 0


def write_gantt(run: Path, dest: Path) -> None:
    """The PNG Gantt chart `heloco report` writes for ``run``, copied to ``dest``."""
    from heloco.report import load_runs
    from heloco.timeline import plot_timelines

    with tempfile.TemporaryDirectory() as tmp:
        png = next(p for p in plot_timelines(load_runs([run]), Path(tmp)) if p.suffix == ".png")
        shutil.copyfile(png, dest)
    shrink_png(dest)


if __name__ == "__main__":
    sys.exit(main())
