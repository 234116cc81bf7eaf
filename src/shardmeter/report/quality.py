"""Terminal table of plans ranked by time to a target loss (`shardmeter plan --quality-from`)."""

from __future__ import annotations

from collections.abc import Sequence

from rich.console import Console

from shardmeter.quality import QualityFactors, RankedPlan
from shardmeter.report.terminal import Col, duration, fit_table, si, usd


def render_ranked(
    ranked: Sequence[RankedPlan],
    quality: QualityFactors,
    top: int = 10,
    console: Console | None = None,
) -> None:
    """Print the quality-ranked plans as a table that fits the console."""
    console = console or Console()
    title = (
        f"Plans by time to loss {quality.target_loss:.4f} (q = tokens to it relative to the "
        f"{quality.reference!r} run in {quality.source})"
    )
    cols = (
        Col("#"),
        Col("mode", "left"),
        Col("method", "left", drop=2),
        Col("isl", drop=3),
        Col("GPUs"),
        Col("q", drop=1),
        Col("tokens/s", drop=3),
        Col("wall", drop=2),
        Col("to target"),
        Col("cost to target"),
    )
    rows = [
        [
            str(k),
            r.mode,
            r.method,
            str(len(getattr(r.candidate, "islands", ()))),
            str(r.candidate.n_gpus),
            f"{r.quality_factor:.3f}",
            si(r.candidate.tokens_per_s),
            duration(r.candidate.wall_s),
            duration(r.time_to_target_s),
            usd(r.cost_to_target_usd),
        ]
        for k, r in enumerate(ranked[:top], 1)
    ]
    console.print(fit_table(console, title, cols, rows))
