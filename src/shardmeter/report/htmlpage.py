"""One self-contained interactive HTML page: plotly.js inlined, the data embedded, no network.

A `Page` collects sections (text, sortable tables, plotly figures given as plain
``{"data": [...], "layout": {...}}`` specs) and renders one file that opens offline: the
plotly.js bundle of the optional ``html`` extra is written into the page, the JSON behind the
page sits in a ``<script type="application/json">`` and a link on the page downloads it (a
Blob URL). After plotting, the page's script writes what it drew into DOM attributes
(``data-traces`` and ``data-points`` on each figure, ``data-rows`` on each table,
``data-ready`` on ``<body>``), so a headless browser can check the content.

Figures are plain JSON specs, not plotly's Python objects: importing ``plotly.graph_objects``
costs about a second, reading the bundled ``plotly.min.js`` a few milliseconds.
"""

from __future__ import annotations

import html
import importlib.resources
import importlib.util
import json
import re
import shlex
import sys
from collections.abc import Sequence
from dataclasses import dataclass
from datetime import datetime, timezone
from pathlib import Path
from typing import Any

from shardmeter.errors import UserInputError
from shardmeter.io import atomic_write_text
from shardmeter.report.jsonout import jsonable

INSTALL_HINT = "the html extra: pip install -e '.[html]' (plotly, for its plotly.js)"
HTML_SUFFIXES = (".html", ".htm")
# Series colours (matplotlib's tab10), so pages match the PNG plots.
COLORS: tuple[str, ...] = (
    "#1f77b4",
    "#ff7f0e",
    "#2ca02c",
    "#d62728",
    "#9467bd",
    "#8c564b",
    "#e377c2",
    "#7f7f7f",
    "#bcbd22",
    "#17becf",
)


def plotly_available() -> bool:
    """Whether the optional ``plotly`` package (which ships plotly.js) is installed."""
    return importlib.util.find_spec("plotly") is not None


def check_html_path(flag: str, path: Path | None) -> Path | None:
    """``path`` if it ends in .html and plotly is installed; else a one-line error naming
    ``flag`` (checked before any work, so a long search never ends in a refusal)."""
    if path is None:
        return None
    if path.suffix.lower() not in HTML_SUFFIXES:
        raise UserInputError(flag, str(path), "a file ending in .html")
    if path.is_dir():
        raise UserInputError(flag, str(path), "a file path, not a folder")
    if not plotly_available():
        raise UserInputError(flag, str(path), f"needs {INSTALL_HINT}")
    return path


def add_html_flag(parser: Any) -> None:
    """``--html FILE``: one self-contained interactive page (needs the ``html`` extra)."""
    parser.add_argument(
        "--html",
        type=Path,
        metavar="FILE",
        help="also write one self-contained interactive HTML page (pip install -e '.[html]')",
    )


def args_json(args: Any) -> dict[str, Any]:
    """The parsed command-line options as plain JSON values (paths as text), for a page's
    inputs section."""
    out: dict[str, Any] = {}
    for key, value in sorted(vars(args).items()):
        if key in ("argv", "topology_foreign_defaults") or callable(value):
            continue
        plain = jsonable(value)
        try:
            json.dumps(plain, allow_nan=False)
        except (TypeError, ValueError):
            plain = str(value)
        out[key] = plain
    return out


def page_command(prog: str, args: Any) -> str:
    """The exact command of a parsed ``args`` (``clikit.parse_args`` records its argv)."""
    return command_line(prog, getattr(args, "argv", None))


def plotly_js() -> str:
    """The minified plotly.js bundle that the ``plotly`` package ships."""
    try:
        bundle = importlib.resources.files("plotly") / "package_data" / "plotly.min.js"
        return bundle.read_text(encoding="utf-8")
    except ModuleNotFoundError:
        raise UserInputError("--html", None, f"needs {INSTALL_HINT}") from None
    except FileNotFoundError:  # a plotly whose layout moved the bundle
        from plotly.offline import get_plotlyjs

        return str(get_plotlyjs())


def plotly_js_version(js: str) -> str:
    """``3.1.0`` from the bundle's banner (``plotly.js v3.1.0``), or ``?``."""
    match = re.search(r"plotly\.js v(\d+\.\d+\.\d+)", js[:600])
    return match.group(1) if match else "?"


def command_line(prog: str, argv: Sequence[str] | None) -> str:
    """The command as typed, shell-quoted: ``shardmeter plan --topology x --html p.html``."""
    words = list(sys.argv[1:] if argv is None else argv)
    return shlex.join([prog, *words])


def script_json(obj: Any) -> str:
    """Strict JSON safe inside a ``<script>`` element: ``<``, ``>`` and ``&`` are escaped as
    ``\\u003c`` etc., which JSON strings allow and which cannot close the element."""
    try:  # plain data goes straight through; jsonable walks it only when it must
        text = json.dumps(obj, allow_nan=False, separators=(",", ":"))
    except (TypeError, ValueError):
        text = json.dumps(jsonable(obj), allow_nan=False, separators=(",", ":"))
    return text.replace("<", "\\u003c").replace(">", "\\u003e").replace("&", "\\u0026")


def esc(text: Any) -> str:
    """HTML-escaped text."""
    return html.escape(str(text), quote=True)


@dataclass(frozen=True)
class Cell:
    """A table cell: what is shown and the value it sorts by (a number or text)."""

    text: str
    sort: float | str | None = None


def cell(text: str, sort: float | str | None = None) -> Cell:
    return Cell(text, sort)


def _sort_attr(value: float | str | None) -> str:
    if value is None:
        return ""
    if isinstance(value, float) and value != value:  # nan sorts last
        return ' data-v=""'
    return f' data-v="{esc(value)}"'


def fill_layout(layout: dict[str, Any], height: int) -> dict[str, Any]:
    """A figure layout with the page's defaults for what it leaves out (size, margins, font,
    tool bar on the right, title on the left)."""
    out = {
        "height": height,
        "margin": {"l": 70, "r": 20, "t": 40, "b": 60},
        "font": {"family": "DejaVu Sans, Arial, sans-serif", "size": 12},
        "hovermode": "closest",
        "legend": {"font": {"size": 11}},
        "modebar": {"orientation": "v"},  # on the right edge, clear of the title
        **layout,
    }
    if isinstance(out.get("title"), dict):
        out["title"] = {"x": 0.01, "xanchor": "left", **out["title"]}
    return out


class Page:
    """An HTML page under construction; `render` returns the whole file as text."""

    def __init__(
        self,
        title: str,
        *,
        tool: str,
        version: str,
        command: str,
        data: Any,
        json_name: str,
        inputs: Any = None,
        inputs_label: str = "Inputs (model, hardware, settings)",
    ) -> None:
        self.title = title
        self.tool = tool
        self.version = version
        self.command = command
        self.data = data
        self.json_name = json_name
        self.inputs = inputs
        self.inputs_label = inputs_label
        self.parts: list[str] = []
        self.figures: dict[str, dict[str, Any]] = {}
        self.extra: dict[str, Any] = {}  # page-specific data for `script`
        self.script = ""  # page-specific JavaScript, run after the figures are drawn

    # -- content --------------------------------------------------------------------------
    def raw(self, markup: str) -> None:
        """Markup the caller built (and escaped) itself."""
        self.parts.append(markup)

    def heading(self, text: str, level: int = 2, anchor: str | None = None) -> None:
        ident = f' id="{esc(anchor)}"' if anchor else ""
        self.parts.append(f"<h{level}{ident}>{esc(text)}</h{level}>")

    def para(self, text: str, cls: str = "") -> None:
        klass = f' class="{esc(cls)}"' if cls else ""
        self.parts.append(f"<p{klass}>{esc(text)}</p>")

    def bullets(self, items: Sequence[str]) -> None:
        if items:
            self.parts.append("<ul>" + "".join(f"<li>{esc(i)}</li>" for i in items) + "</ul>")

    def figure(self, ident: str, spec: dict[str, Any], height: int = 420) -> None:
        """A plotly figure ``{"data": [...], "layout": {...}}`` drawn into ``<div id=ident>``."""
        if ident in self.figures:
            raise ValueError(f"figure id {ident!r} used twice")
        layout = fill_layout(spec.get("layout", {}), height)
        self.figures[ident] = {"data": spec["data"], "layout": layout}
        self.parts.append(f'<div class="fig" id="{esc(ident)}" style="height:{height}px"></div>')

    def table(
        self,
        ident: str,
        headers: Sequence[str],
        rows: Sequence[Sequence[Cell | str]],
        *,
        row_attrs: Sequence[dict[str, str]] | None = None,
        caption: str | None = None,
    ) -> None:
        """A table whose columns sort on a click of their header (by each cell's sort value)."""
        head = "".join(f'<th data-col="{k}">{esc(h)}</th>' for k, h in enumerate(headers))
        body = []
        for r, row in enumerate(rows):
            attrs = "".join(
                f' {esc(k)}="{esc(v)}"' for k, v in (row_attrs[r] if row_attrs else {}).items()
            )
            tds = "".join(
                f"<td{_sort_attr(c.sort)}>{esc(c.text)}</td>"
                if isinstance(c, Cell)
                else f"<td>{esc(c)}</td>"
                for c in row
            )
            body.append(f"<tr{attrs}>{tds}</tr>")
        cap = f"<caption>{esc(caption)}</caption>" if caption else ""
        self.parts.append(
            f'<div class="tablewrap"><table class="sortable" id="{esc(ident)}">{cap}'
            f"<thead><tr>{head}</tr></thead><tbody>{''.join(body)}</tbody></table></div>"
        )

    def details(self, summary: str, obj: Any, open_: bool = False) -> None:
        """A collapsed block showing ``obj`` as indented JSON."""
        text = json.dumps(jsonable(obj), indent=2, allow_nan=False)
        flag = " open" if open_ else ""
        self.parts.append(
            f"<details{flag}><summary>{esc(summary)}</summary><pre>{esc(text)}</pre></details>"
        )

    # -- the file -------------------------------------------------------------------------
    def render(self) -> str:
        js = plotly_js()
        now = datetime.now(timezone.utc).strftime("%Y-%m-%d %H:%M UTC")
        header = (
            f"<header><h1>{esc(self.title)}</h1>"
            f'<p class="meta"><code class="cmd" id="sm-command">{esc(self.command)}</code></p>'
            f'<p class="meta">{esc(self.tool)} {esc(self.version)} · plotly.js '
            f"{esc(plotly_js_version(js))} · written {esc(now)} · "
            f'<a id="sm-download" href="#" download="{esc(self.json_name)}">download JSON</a>'
            " (everything this page shows)</p></header>"
        )
        inputs = ""
        if self.inputs is not None:
            text = json.dumps(jsonable(self.inputs), indent=2, allow_nan=False)
            inputs = (
                f'<details id="sm-inputs"><summary>{esc(self.inputs_label)}</summary>'
                f"<pre>{esc(text)}</pre></details>"
            )
        return (
            '<!DOCTYPE html>\n<html lang="en"><head><meta charset="utf-8">'
            '<meta name="viewport" content="width=device-width, initial-scale=1">'
            # No request may leave the page: scripts, styles, images and fetches only inline.
            '<meta http-equiv="Content-Security-Policy" content="default-src \'none\'; '
            "script-src 'unsafe-inline' 'unsafe-eval'; style-src 'unsafe-inline'; "
            "img-src data: blob:; font-src data:; connect-src 'none'\">"
            f"<title>{esc(self.title)}</title><style>{CSS}</style>"
            f"<script>{js}</script></head>\n<body>\n{header}<main>{inputs}"
            + "\n".join(self.parts)
            + "</main>\n"
            f'<script type="application/json" id="sm-data">{script_json(self.data)}</script>\n'
            f'<script type="application/json" id="sm-figures">{script_json(self.figures)}</script>'
            f'\n<script type="application/json" id="sm-extra">{script_json(self.extra)}</script>'
            f"\n<script>{PAGE_JS}\n{self.script}\nsmStart();</script>\n</body></html>\n"
        )

    def write(self, path: Path | str) -> Path:
        """Render and write the page atomically; returns its path."""
        target = Path(path)
        atomic_write_text(target, self.render())
        return target


CSS = """
body{font-family:"DejaVu Sans",Arial,sans-serif;margin:0;color:#222;background:#fff}
header{background:#f4f6f8;border-bottom:1px solid #dde;padding:10px 24px}
h1{font-size:20px;margin:4px 0}h2{font-size:17px;margin:26px 0 8px;border-bottom:1px solid #eee}
h3{font-size:14px;margin:16px 0 6px}main{padding:4px 24px 40px;max-width:1400px}
.meta{margin:4px 0;font-size:12px;color:#555}.cmd{background:#fff;border:1px solid #ccd;
padding:2px 6px;border-radius:3px;font-size:12px;word-break:break-all}
.fig{width:100%;min-width:600px}.tablewrap{overflow-x:auto}
table{border-collapse:collapse;font-size:12px;margin:6px 0}
th,td{border:1px solid #dde;padding:3px 7px;text-align:right;white-space:nowrap}
td:last-child,th:last-child{text-align:left}th{background:#f4f6f8;cursor:pointer;user-select:none}
th[aria-sort=ascending]::after{content:" ▲"}th[aria-sort=descending]::after{content:" ▼"}
tr.sel td{background:#fff3c4}tbody tr:hover td{background:#eef4ff;cursor:pointer}
caption{text-align:left;font-size:12px;color:#555;padding:2px 0}
details{margin:8px 0}summary{cursor:pointer;color:#235}pre{background:#f8f8f8;padding:8px;
font-size:11px;max-height:420px;overflow:auto}.words{font-size:14px;line-height:1.45;
background:#f7fbf7;border-left:4px solid #2ca02c;padding:6px 12px}
.panel{border:1px solid #dde;padding:6px 12px;background:#fcfcff}.row{display:flex;gap:12px;
flex-wrap:wrap}.row>.fig{flex:1 1 560px}.note{font-size:12px;color:#555}
"""

# The page's own script: draw the figures, record what was drawn, sortable tables, the
# download link. Page builders add `smAfter(figs, data, extra)` for their own interaction.
PAGE_JS = r"""
function smJSON(id){return JSON.parse(document.getElementById(id).textContent);}
function smCount(div){
  var n=0;(div.data||[]).forEach(function(t){
    var xs=t.x||t.values||[];n+=(xs&&xs.length)||0;});
  div.setAttribute('data-traces',String((div.data||[]).length));
  div.setAttribute('data-points',String(n));
}
function smPlot(id,spec){
  var div=document.getElementById(id);
  var cfg={displaylogo:false,responsive:true,scrollZoom:false};
  return Plotly.react(div,spec.data,spec.layout,cfg).then(function(){smCount(div);return div;});
}
function smSortTable(table,col,th){
  var body=table.tBodies[0];var rows=Array.prototype.slice.call(body.rows);
  var asc=th.getAttribute('aria-sort')!=='ascending';
  rows.sort(function(a,b){
    var x=a.cells[col].getAttribute('data-v'),y=b.cells[col].getAttribute('data-v');
    if(x===null)x=a.cells[col].textContent;if(y===null)y=b.cells[col].textContent;
    var fx=parseFloat(x),fy=parseFloat(y),num=!isNaN(fx)&&!isNaN(fy)&&x!==''&&y!=='';
    var c;if(x===''&&y!=='')return 1;if(y===''&&x!=='')return -1;
    c=num?(fx-fy):String(x).localeCompare(String(y));return asc?c:-c;});
  rows.forEach(function(r){body.appendChild(r);});
  Array.prototype.forEach.call(table.tHead.rows[0].cells,function(h){h.removeAttribute('aria-sort');});
  th.setAttribute('aria-sort',asc?'ascending':'descending');
}
function smTables(){
  Array.prototype.forEach.call(document.querySelectorAll('table.sortable'),function(t){
    t.setAttribute('data-rows',String(t.tBodies[0].rows.length));
    Array.prototype.forEach.call(t.tHead.rows[0].cells,function(th,k){
      th.addEventListener('click',function(){smSortTable(t,k,th);});});});
}
function smDownload(){
  var a=document.getElementById('sm-download');
  var blob=new Blob([document.getElementById('sm-data').textContent],{type:'application/json'});
  a.href=URL.createObjectURL(blob);
}
function smStart(){
  var body=document.body;
  try{
    smDownload();smTables();
    var figs=smJSON('sm-figures'),data=smJSON('sm-data'),extra=smJSON('sm-extra');
    var ids=Object.keys(figs);
    Promise.all(ids.map(function(id){return smPlot(id,figs[id]);})).then(function(){
      if(typeof smAfter==='function')return smAfter(figs,data,extra);
    }).then(function(){
      body.setAttribute('data-figures',String(ids.length));body.setAttribute('data-ready','1');
    }).catch(function(e){body.setAttribute('data-ready','error');console.error(e);});
  }catch(e){body.setAttribute('data-ready','error');console.error(e);}
}
"""
