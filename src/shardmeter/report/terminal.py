"""Terminal output both CLIs share: compact numbers and tables that fit the width.

- Numbers: ``si(3.04e6)`` -> ``3.04M``, ``usd(67138)`` -> ``$67.1k``, ``duration(3600)`` ->
  ``1 h``, ``nbytes(16.1e9)`` -> ``16.1 GB``: three significant digits, never cut.
- Tables: :func:`fit_table` keeps every row on one line. Columns carry a priority; when the
  table is wider than the console, the least important columns are left out (a caption names
  them) instead of being squeezed to ``3,040,2…``. ``--wide`` (:func:`add_wide_flag`) prints
  every column.
- Consoles: :func:`console_for` is the terminal's width on a terminal, ``$COLUMNS`` or 80 when
  piped, and unbounded with ``--wide``.
"""

from __future__ import annotations

import argparse
import math
import os
from collections.abc import Sequence
from dataclasses import dataclass
from typing import Literal

from rich.cells import cell_len
from rich.console import Console
from rich.table import Table
from rich.text import Text

PIPED_WIDTH = 80  # columns when output is not a terminal and $COLUMNS is unset
WIDE_WIDTH = 10_000  # "unbounded": --wide never leaves a column out or wraps a cell
SI_PREFIXES = ((1e15, "P"), (1e12, "T"), (1e9, "B"), (1e6, "M"), (1e3, "k"))


# -- numbers -------------------------------------------------------------------------------------
def sig3(x: float) -> str:
    """Three significant digits without an exponent below 1e15 (``1.5e+03`` is never shown)."""
    if not math.isfinite(x):
        return "∞" if x > 0 else ("-∞" if x < 0 else "nan")
    if x == 0:
        return "0"
    digits = max(0, 2 - math.floor(math.log10(abs(x))))
    text = f"{x:.{digits}f}"
    return text.rstrip("0").rstrip(".") if "." in text else text


def si(x: float, unit: str = "") -> str:
    """``3040215`` -> ``3.04M``; k, M, B (1e9), T, P; three significant digits."""
    if not math.isfinite(x):
        return sig3(x)
    for size, prefix in SI_PREFIXES:
        if abs(x) >= size * 0.9995:  # 999,600 rounds to 1.00M, not 1000k
            return f"{sig3(x / size)}{prefix}{unit}"
    return f"{sig3(x)}{unit}"


def usd(x: float) -> str:
    """``67138`` -> ``$67.1k``; ``0.0961`` -> ``$0.0961``."""
    return "-" + usd(-x) if x < 0 else "$" + si(x)


def duration(seconds: float) -> str:
    """Seconds in the largest sensible unit: ``7.53 d``, ``12.7 min``, ``248 ms``."""
    if not math.isfinite(seconds):
        return "∞"
    for unit, size in (
        ("y", 365.25 * 86400.0),
        ("d", 86400.0),
        ("h", 3600.0),
        ("min", 60.0),
        ("s", 1.0),
    ):
        if seconds >= size:
            return f"{sig3(seconds / size)} {unit}"
    return f"{sig3(seconds * 1e3)} ms"


def nbytes(n: float) -> str:
    """Bytes in decimal units: ``16.1 GB``, ``38.3 TB``."""
    for unit, size in (("PB", 1e15), ("TB", 1e12), ("GB", 1e9), ("MB", 1e6), ("kB", 1e3)):
        if n >= size:
            return f"{sig3(n / size)} {unit}"
    return f"{sig3(n)} B"


def pct(x: float, digits: int = 1) -> str:
    """A fraction as a percentage: ``0.4953`` -> ``49.5%``."""
    return f"{x:.{digits}%}" if math.isfinite(x) else "-"


# -- consoles ------------------------------------------------------------------------------------
def add_wide_flag(parser: argparse.ArgumentParser) -> None:
    """``--wide``: every table column, whatever the width."""
    parser.add_argument(
        "--wide",
        action="store_true",
        help="print every table column (default: fit the terminal, or 80 columns when piped)",
    )


def console_for(
    stream_is_tty: bool, wide: bool = False, *, stderr: bool = False, highlight: bool = True
) -> Console:
    """The console a command prints its tables on (see the module docstring)."""
    if wide:
        return Console(width=WIDE_WIDTH, stderr=stderr, highlight=highlight)
    if stream_is_tty:
        return Console(stderr=stderr, highlight=highlight)
    columns = os.environ.get("COLUMNS", "")
    width = int(columns) if columns.isdigit() and int(columns) > 0 else PIPED_WIDTH
    return Console(width=width, stderr=stderr, highlight=highlight)


# -- tables --------------------------------------------------------------------------------------
@dataclass(frozen=True)
class Col:
    """One table column. ``drop`` 0 is never left out; higher numbers are left out first when narrow.
    ``wrap`` lets a text column wrap at spaces instead of widening the table."""

    name: str
    justify: Literal["left", "right"] = "right"
    drop: int = 0
    wrap: bool = False


def _width(cell: str) -> int:
    return cell_len(Text.from_markup(cell).plain)


def _min_width(col: Col, cells: Sequence[str]) -> int:
    """Narrowest the column can be without cutting a cell (a wrap column: its longest word)."""
    head = _width(col.name) if not col.wrap else max(map(_width, col.name.split() or [""]))
    if col.wrap:
        words = [w for c in cells for w in Text.from_markup(c).plain.split()]
        return max([head, *map(cell_len, words)])
    return max([head, *map(_width, cells)])


def table_width(widths: Sequence[int]) -> int:
    """Width of a rich Table with the default box and padding: cells + 3 per column + 1."""
    return sum(widths) + 3 * len(widths) + 1


def fit_table(
    console: Console,
    title: str | None,
    cols: Sequence[Col],
    rows: Sequence[Sequence[str]],
    *,
    show_header: bool = True,
) -> Table:
    """A rich Table of ``rows`` that fits ``console.width``, one line per row.

    Columns are left out, highest ``drop`` first (the rightmost of equals first), until the
    rest fits; then any left-out column that fits is put back, the more important first. The
    caption names what was left out and that ``--wide`` shows it.
    """
    columns = [[row[i] for row in rows] for i in range(len(cols))]
    mins = [_min_width(c, cells) for c, cells in zip(cols, columns, strict=True)]
    shown = list(range(len(cols)))
    droppable = sorted(
        (i for i, c in enumerate(cols) if c.drop > 0), key=lambda i: (cols[i].drop, i)
    )
    dropped: list[int] = []
    while table_width([mins[i] for i in shown]) > console.width and droppable:
        dropped.append(droppable.pop())
        shown.remove(dropped[-1])
    for i in reversed(dropped):  # the more important first: back in where it still fits
        if table_width([mins[j] for j in shown] + [mins[i]]) <= console.width:
            shown = sorted([*shown, i])
    left_out = [cols[i].name for i in range(len(cols)) if i not in shown]
    caption = None
    if left_out:
        caption = f"not shown at {console.width} columns: {', '.join(left_out)} (--wide shows all)"
    table = Table(
        title=title,
        title_justify="left",
        caption=caption,
        caption_justify="left",
        show_header=show_header,
    )
    for i in shown:
        c = cols[i]
        table.add_column(c.name, justify=c.justify, no_wrap=not c.wrap, overflow="fold")
    for row in rows:
        table.add_row(*(row[i] for i in shown))
    return table


def key_value_table(title: str | None, rows: Sequence[tuple[str, str]]) -> Table:
    """Two columns, quantity and value; the value wraps at spaces on a narrow console."""
    table = Table(title=title, title_justify="left", show_header=False)
    table.add_column("quantity", style="bold", no_wrap=True)
    table.add_column("value", overflow="fold")
    for key, value in rows:
        table.add_row(key, value)
    return table
