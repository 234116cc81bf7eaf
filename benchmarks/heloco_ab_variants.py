"""How arrival balancing was made stable: its variants against HeLoCo at the
same tuning budget, on the paper grid's heterogeneous pace settings.

Each variant is a method plus config overrides, run on the regime presets of
``benchmarks/heloco_paper.py`` (5 workers, one language each):
  * HeLoCo at outer lr η = 0.7 (Table 3), 0.35 and 0.175 — three settings, as many as ``+ab``;
  * ``heloco+ab`` with its default (weights clipped at 1), with γ = ½, with ``max``
    normalisation, and the first version (``mean``: expected lr kept, slow workers amplified);
  * sync DiLoCo for reference.
Losses are read at the fixed simulated time S (and the token budget T) exactly as in the grid.

    python benchmarks/heloco_ab_variants.py                  # seed 0, three pace settings
    python benchmarks/heloco_ab_variants.py --seeds 0,1,2
    python benchmarks/heloco_ab_variants.py --report-only
"""

from __future__ import annotations

import argparse
import sys
import time
from collections.abc import Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from heloco.config import atomic_write_text
from heloco.experiments import Cell, CellResult, GridRun, read_results, run_grid, spread
from shardmeter.paths import missing_shared_reason, shared_path

REGIMES = ("paper-regime", "converged")
PACES = ((1, 1, 1, 2, 2), (1, 6, 6, 6, 6), (1, 15, 15, 15, 15))
SETTINGS = tuple((r, p) for r in REGIMES for p in PACES)  # reading order of the tables
REFERENCE = "heloco η=0.7"


@dataclass(frozen=True)
class Variant:
    """A method and the config overrides that make this variant."""

    label: str
    method: str
    overrides: dict[str, Any] = field(default_factory=dict)

    @property
    def slug(self) -> str:
        """A folder name: the label in ASCII letters, digits and dashes (η written eta)."""
        text = self.label.replace("η", "eta").replace("γ", "gamma")
        keep = "".join(c if c.isascii() and c.isalnum() else "-" for c in text)
        return "-".join(part for part in keep.split("-") if part)


VARIANTS = (
    Variant("sync", "sync"),
    Variant(REFERENCE, "heloco"),
    Variant("heloco η=0.35", "heloco", {"outer.lr": 0.35}),
    Variant("heloco η=0.175", "heloco", {"outer.lr": 0.175}),
    Variant("+ab clip (default)", "heloco+ab"),
    Variant("+ab clip γ=0.5", "heloco+ab", {"outer.ab_power": 0.5}),
    Variant("+ab max", "heloco+ab", {"outer.ab_normalize": "max"}),
    Variant(
        "+ab mean (first version)",
        "heloco+ab",
        {"outer.ab_normalize": "mean", "outer.ab_data": "workers"},
    ),
)


def cells_for(v: Variant, seeds: Sequence[int]) -> list[Cell]:
    return [Cell(r, p, v.method, s) for s in seeds for r, p in SETTINGS]


def setting(r: CellResult) -> tuple[str, str]:
    return (r.regime, r.paces_label)


def pct(values: list[float]) -> str:
    s = spread(values)
    return s.fmt(".1f", 100.0, "%") if s.n else "-"


def table(results: dict[str, list[CellResult]], metric: str) -> list[str]:
    """One row per variant: loss per setting, and its improvement over HeLoCo η=0.7 and sync."""
    order = {(r, "-".join(f"{x:g}" for x in p)): i for i, (r, p) in enumerate(SETTINGS)}
    settings = sorted({setting(r) for rows in results.values() for r in rows}, key=order.get)
    header = ["variant"] + [f"{reg[:9]} [{p.replace('-', ',')}]" for reg, p in settings]
    out = ["| " + " | ".join(header) + " |", "|" + "---|" * len(header)]

    def by_seed(label: str, key: tuple[str, str]) -> dict[int, float]:
        return {
            r.seed: float(getattr(r, metric)) for r in results.get(label, []) if setting(r) == key
        }

    for v in VARIANTS:
        row = [v.label]
        for key in settings:
            mine = by_seed(v.label, key)
            if not mine:
                row.append("-")
                continue
            cell = f"{spread(mine.values()).mean:.4f}"
            for ref in (REFERENCE, "sync"):
                base = by_seed(ref, key)
                pairs = [(base[s] - x) / base[s] for s, x in mine.items() if s in base]
                if ref != v.label and pairs:
                    cell += f" ({'H' if ref == REFERENCE else 'S'} {pct(pairs)})"
            row.append(cell)
        out.append("| " + " | ".join(row) + " |")
    return [*out, ""]


def plot(results: dict[str, list[CellResult]], out_dir: Path, stem: str) -> list[Path]:
    """Improvement over HeLoCo η=0.7 at S per setting, one bar per variant, one panel per regime."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    from heloco.report import save_figure

    fig, axes = plt.subplots(1, len(REGIMES), figsize=(12, 4.5), squeeze=False)
    shown = [v for v in VARIANTS if v.label != REFERENCE]
    width = 0.8 / len(shown)
    for ax, regime in zip(axes.flat, REGIMES, strict=True):
        for i, v in enumerate(shown):
            vals = []
            for paces in PACES:
                key = (regime, "-".join(f"{p:g}" for p in paces))
                ref = {r.seed: r.loss_at_time for r in results[REFERENCE] if setting(r) == key}
                mine = [
                    (ref[r.seed] - r.loss_at_time) / ref[r.seed]
                    for r in results.get(v.label, [])
                    if setting(r) == key and r.seed in ref
                ]
                vals.append(100 * spread(mine).mean if mine else 0.0)
            xs = [g + (i - (len(shown) - 1) / 2) * width for g in range(len(PACES))]
            ax.bar(xs, [max(-15.0, min(15.0, x)) for x in vals], width, label=v.label)
        ax.set_xticks(range(len(PACES)), [f"[{','.join(f'{p:g}' for p in ps)}]" for ps in PACES])
        ax.axhline(0, color="black", lw=0.8)
        ax.set_ylim(-16, 16)
        ax.set_title(f"{regime}: loss reduction vs HeLoCo η=0.7 at S (%, clipped at ±15)")
        ax.grid(axis="y", alpha=0.3)
    axes.flat[0].legend(fontsize="x-small", loc="lower left")
    fig.tight_layout()
    paths = save_figure(fig, out_dir, stem)
    plt.close(fig)
    return paths


def main(argv: Sequence[str] | None = None) -> int:
    p = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    p.add_argument("--seeds", default="0", help="comma list (default 0)")
    p.add_argument("--jobs", type=int, default=1, help="parallel processes")
    here = Path(__file__).resolve().parent / "results"
    p.add_argument("--out", type=Path, default=here / "heloco_ab_variants")
    p.add_argument("--report-only", action="store_true", help="only rewrite the tables")
    args = p.parse_args(argv)
    data_dir = shared_path("data", "multilingual")
    if data_dir is None:
        print(missing_shared_reason("data", "multilingual"), file=sys.stderr)
        return 2
    seeds = [int(s) for s in args.seeds.split(",") if s]
    t0 = time.perf_counter()
    results: dict[str, list[CellResult]] = {}
    for v in VARIANTS:
        root = args.out / v.slug
        if not args.report_only:
            grid = GridRun(out_root=root, data_dir=data_dir, jobs=args.jobs, extra=v.overrides)
            run_grid(cells_for(v, seeds), grid)
            print(f"[{time.perf_counter() - t0:,.0f}s] {v.label} done", flush=True)
        results[v.label] = read_results(root) if root.exists() else []
    lines = [
        "# Arrival balancing: variants at the same tuning budget as HeLoCo",
        "",
        f"`python benchmarks/heloco_ab_variants.py --seeds {args.seeds}`; cells as in "
        "heloco_paper.md (5 workers, one language each). Each cell: the loss, then in brackets "
        "the relative loss reduction against HeLoCo η=0.7 (H) and against sync (S), mean ± std "
        "over seeds; positive = lower loss than that baseline.",
        "",
        "## At the fixed simulated time S",
        "",
        *table(results, "loss_at_time"),
        "## At the token budget T",
        "",
        *table(results, "loss_at_tokens"),
    ]
    markdown = args.out.parent / f"{args.out.name}.md"
    atomic_write_text(markdown, "\n".join(lines))
    plots = plot(results, args.out.parent, args.out.name)
    print("\n".join(lines))
    print(f"markdown: {markdown}  plots: {', '.join(map(str, plots))}", file=sys.stderr)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
