"""The pieces `shardmeter validate` and `validate --memory` share: the one reading of
`--source`, and the absolute-percentage-error summary table both print."""

from __future__ import annotations

from collections.abc import Sequence

from rich.table import Table

from shardmeter.calibrate import ErrorSummary


def pct(x: float) -> str:
    """A fraction as a percentage with one decimal."""
    return f"{100 * x:.1f}%"


def only_sources(rows: list[dict[str, str]], sources: list[str] | None) -> list[dict[str, str]]:
    """The rows whose `source_id` is one of `sources` (all of them when none is named): the one
    reading of `--source`, for the throughput and the memory CSVs alike."""
    if not sources:
        return rows
    return [r for r in rows if (r.get("source_id") or "").strip() in set(sources)]


def ape_table(groups: Sequence[tuple[str, ErrorSummary]]) -> Table:
    """The absolute-percentage-error summary, one row per (label, summary): n, median, mean and
    p90 as percentages; `validate` and `validate --memory` print the same table."""
    table = Table(title="absolute percentage error", title_justify="left")
    for name in ("rows", "n", "median", "mean", "p90"):
        table.add_column(name, justify="left" if name == "rows" else "right")
    for label, s in groups:
        table.add_row(label, str(s.n), pct(s.median_ape), pct(s.mean_ape), pct(s.p90_ape))
    return table
