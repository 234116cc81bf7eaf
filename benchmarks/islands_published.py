"""Published DiLoCo-family figures reproduced with the `shardmeter` CLI from topology files alone.

Sources (figures transcribed from the papers' tables):
- Streaming DiLoCo (Douillard et al. 2025, arXiv 2501.18512), Table 4: Gbit/s to reach a compute
  utilization of 50/80/90/95/99% for Data-Parallel, DiLoCo, Streaming DiLoCo, with overlapped
  communication, with overlapped FP4 communication; 1B/10B/100B models (0.1/0.8/4.9 s steps),
  H = 100, fragments of 3 layers.
- Eager Updates (Kale et al. 2025, arXiv 2502.12996), Table 5: the same for 1-inner-step and
  1-outer-step (eager) overlap of FP4 Streaming DiLoCo at H = 30 and 100.
- Both papers' Table 1: hours for a 1B model on 25B tokens with infinite vs 1 Gbit/s bandwidth
  (compute utilization = the ratio) for Data-Parallel and overlapped FP4 Streaming DiLoCo
  (1-inner-step; 1-outer-step in Kale et al.).

Each figure runs `shardmeter predict --topology benchmarks/published/<size>.toml <method flags>
--threshold CU --json` (the bandwidth of the WAN link at which utilization reaches CU) and
`shardmeter sweep ... --over bandwidth --values W` (utilization at a bandwidth), in process.
The published bandwidths sit on a geometric grid (ratio 1.207: 0.1·10^(4k/49) Gbit/s), the
first grid point that reaches CU; so a figure W means the threshold lies in (W/1.207, W]. Two
errors are reported: the relative error of our exact threshold against W, and in utilization
points how far our utilization at W and at W/1.207 falls outside [CU, ...) and [..., CU).
A figure whose WAN bytes per round cannot cross the link in a round at the published bandwidth
(utilization bounded by H·T·W / bytes < CU) is flagged physically impossible and not scored.

Run: .venv/bin/python benchmarks/islands_published.py [--markdown] [--only SIZE]
"""

from __future__ import annotations

import argparse
import contextlib
import io
import json
import statistics
import time
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from shardmeter.cli import main

HERE = Path(__file__).resolve().parent / "published"
GRID_RATIO = 10 ** (4 / 49)  # the papers' bandwidth grid step (0.1 .. 1000 Gbit/s, 50 points)
CUS = (0.5, 0.8, 0.9, 0.95, 0.99)
STEP_S = {"1b": 0.1, "10b": 0.8, "100b": 4.9}
FRAGMENTS = {"1b": 8, "10b": 16, "100b": 36}  # 3 layers per fragment: 24, 48, 108 layers

# method -> (CLI flags, H); {P} is the size's fragment count
METHODS: dict[str, tuple[str, int]] = {
    "Data-Parallel": ("--mode sync --grad-bits 16", 1),
    "DiLoCo H=100": ("--mode diloco -H 100 --bits 16", 100),
    "Streaming DiLoCo": ("--mode streaming -H 100 --fragments {P}", 100),
    "+ overlapped com.": ("--mode streaming -H 100 --fragments {P} --overlap-steps 1", 100),
    "+ overlapped FP4 com.": (
        "--mode streaming -H 100 --fragments {P} --overlap-steps 1 --bits 4",
        100,
    ),
    "1-inner-step FP4, H=30": (
        "--mode streaming -H 30 --fragments {P} --overlap-steps 1 --bits 4",
        30,
    ),
    "1-outer-step FP4, H=30": (
        "--mode streaming -H 30 --fragments {P} --outer-overlap --bits 4",
        30,
    ),
    "1-outer-step FP4, H=100": (
        "--mode streaming -H 100 --fragments {P} --outer-overlap --bits 4",
        100,
    ),
}
STREAMING = "Streaming DiLoCo, arXiv 2501.18512, Table 4"
EAGER = "Eager Updates, arXiv 2502.12996, Table 5"
PUBLISHED: dict[tuple[str, str], tuple[str, tuple[float, ...]]] = {
    ("1b", "Data-Parallel"): (STREAMING, (86.8, 152.6, 184.2, 222.3, 569.0)),
    ("1b", "DiLoCo H=100"): (STREAMING, (1.4, 6.2, 13.3, 23.3, 86.8)),
    ("1b", "Streaming DiLoCo"): (STREAMING, (1.4, 5.2, 9.1, 16.0, 28.1)),
    ("1b", "+ overlapped com."): (STREAMING, (1.4, 4.3, 6.2, 9.1, 11.0)),
    ("1b", "+ overlapped FP4 com."): (STREAMING, (0.4, 0.9, 1.7, 2.0, 3.0)),
    ("10b", "Data-Parallel"): (STREAMING, (104.8, 222.3, 222.3, 268.3, 471.5)),
    ("10b", "DiLoCo H=100"): (STREAMING, (1.7, 7.5, 16.0, 33.9, 104.8)),
    ("10b", "Streaming DiLoCo"): (STREAMING, (1.7, 5.2, 9.1, 13.3, 19.3)),
    ("10b", "+ overlapped com."): (STREAMING, (1.7, 3.6, 5.2, 6.2, 7.5)),
    ("10b", "+ overlapped FP4 com."): (STREAMING, (0.4, 0.9, 1.4, 1.4, 1.7)),
    ("100b", "Data-Parallel"): (STREAMING, (184.2, 323.8, 390.7, 390.7, 471.5)),
    ("100b", "DiLoCo H=100"): (STREAMING, (3.0, 11.0, 23.3, 49.4, 184.2)),
    ("100b", "Streaming DiLoCo"): (STREAMING, (2.4, 6.2, 9.1, 11.0, 19.3)),
    ("100b", "+ overlapped com."): (STREAMING, (1.7, 3.6, 4.3, 5.2, 5.2)),
    ("100b", "+ overlapped FP4 com."): (STREAMING, (0.5, 0.9, 1.1, 1.1, 1.4)),
    ("1b", "1-inner-step FP4, H=30"): (EAGER, (2.4, 3.6, 4.3, 4.3, 4.3)),
    ("1b", "1-outer-step FP4, H=30"): (EAGER, (1.1, 2.0, 2.0, 2.0, 2.4)),
    ("1b", "1-outer-step FP4, H=100"): (EAGER, (0.1, 0.2, 0.2, 0.2, 0.2)),
    ("10b", "1-inner-step FP4, H=30"): (EAGER, (1.4, 2.4, 2.4, 3.0, 3.0)),
    ("10b", "1-outer-step FP4, H=30"): (EAGER, (0.7, 1.1, 1.4, 1.4, 1.4)),
    ("10b", "1-outer-step FP4, H=100"): (EAGER, (0.1, 0.2, 0.2, 0.3, 0.3)),
    ("100b", "1-inner-step FP4, H=30"): (EAGER, (0.9, 1.7, 2.0, 2.0, 2.0)),
    ("100b", "1-outer-step FP4, H=30"): (EAGER, (0.5, 0.8, 0.9, 0.9, 0.9)),
    ("100b", "1-outer-step FP4, H=100"): (EAGER, (0.2, 0.3, 0.3, 0.3, 0.4)),
}
# Table 1 (both papers): hours for 25B tokens at +inf and at 1 Gbit/s -> utilization
TABLE1 = "Streaming DiLoCo / Eager Updates, Table 1 (1B, 25B tokens, 1 Gbit/s)"
UTILIZATION: dict[str, float] = {
    "Data-Parallel": 0.67 / 109,
    "+ overlapped FP4 com.": 0.67 / 0.88,
    "1-outer-step FP4, H=100": 0.67 / 0.67,
}


@dataclass(frozen=True)
class Figure:
    source: str
    size: str
    method: str
    cu: float
    published_gbit: float
    ours_gbit: float | None
    cu_at_published: float
    cu_below: float
    bound_at_published: float  # link-capacity limit on utilization at the published bandwidth

    @property
    def impossible(self) -> bool:
        return self.bound_at_published < self.cu - 1e-9

    @property
    def bandwidth_error(self) -> float:
        if self.ours_gbit is None:
            return float("inf")
        return abs(self.ours_gbit - self.published_gbit) / self.published_gbit

    @property
    def points_error(self) -> float:
        """Utilization points outside the published grid cell (0 when our threshold is in it)."""
        return 100 * (max(0.0, self.cu - self.cu_at_published) + max(0.0, self.cu_below - self.cu))


def cli_json(argv: list[str]) -> Any:
    out = io.StringIO()
    with contextlib.redirect_stdout(out):
        code = main(argv)
    if code != 0:
        raise SystemExit(f"shardmeter {' '.join(argv)} exited {code}")
    return json.loads(out.getvalue())


def flags_for(size: str, method: str) -> list[str]:
    flags, _ = METHODS[method]
    return flags.replace("{P}", str(FRAGMENTS[size])).split()


def topology(size: str) -> str:
    return str(HERE / f"streaming-diloco-{size}.toml")


def measure(size: str, method: str) -> list[Figure]:
    source, published = PUBLISHED[(size, method)]
    base = ["--topology", topology(size), *flags_for(size, method)]
    below = [w / GRID_RATIO for w in published]
    values = ",".join(f"{w:.6g}" for w in (*published, *below))
    sweep = cli_json(["sweep", *base, "--over", "bandwidth", "--values", values, "--json"])
    points = sweep["sweeps"][0]["points"]
    util = {round(p["value"], 4): p["utilization"] for p in points}
    est = cli_json(["predict", *base, "--json"])
    h = METHODS[method][1]
    round_bytes = est["islands"][0]["wan_bytes_per_round"]
    figures = []
    for cu, w, wb in zip(CUS, published, below, strict=True):
        at = cli_json(["predict", *base, "--threshold", str(cu), "--json"])
        link_s = round_bytes * 8 / (w * 1e9)
        figures.append(
            Figure(
                source=source,
                size=size,
                method=method,
                cu=cu,
                published_gbit=w,
                ours_gbit=at["min_wan_gbit"],
                cu_at_published=util[round(float(f"{w:.6g}"), 4)],
                cu_below=util[round(float(f"{wb:.6g}"), 4)],
                bound_at_published=min(1.0, h * STEP_S[size] / link_s),
            )
        )
    return figures


def utilization_figures() -> list[tuple[str, float, float]]:
    """Table 1: (method, published utilization, ours) at 1 Gbit/s for the 1B model."""
    out = []
    for method, published in UTILIZATION.items():
        est = cli_json(
            ["predict", "--topology", topology("1b"), *flags_for("1b", method), "--json"]
        )
        out.append((method, published, est["utilization"]))
    return out


def print_per_method(figures: list[Figure]) -> None:
    """The per-method summary table of docs/islands.md section 7."""
    print(
        "| source | method | scored | median bandwidth error | median points outside the cell "
        "| impossible |"
    )
    print("|---|---|---|---|---|---|")
    for method in METHODS:
        mine = [f for f in figures if f.method == method]
        if not mine:
            continue
        scored = [f for f in mine if not f.impossible]
        bw = f"{statistics.median(f.bandwidth_error for f in scored):.0%}" if scored else ""
        pts = f"{statistics.median(f.points_error for f in scored):.1f}" if scored else ""
        table = "Table 4" if mine[0].source == STREAMING else "Table 5"
        print(f"| {table} | {method} | {len(scored)} | {bw} | {pts} | {len(mine) - len(scored)} |")
    scored = [f for f in figures if not f.impossible]
    if scored:
        bw = statistics.median(f.bandwidth_error for f in scored)
        pts = statistics.median(f.points_error for f in scored)
        print(
            f"| **all scored** | | **{len(scored)}** | **{bw:.1%}** | **{pts:.2f}** | "
            f"**{len(figures) - len(scored)}** |"
        )


def report(figures: list[Figure], table1: list[tuple[str, float, float]], markdown: bool) -> None:
    sep = " | "
    head = ("source", "size", "method", "CU", "published", "ours", "err", "pts", "note")
    print(("| " if markdown else "") + sep.join(head) + (" |" if markdown else ""))
    if markdown:
        print("|" + "---|" * len(head))
    for f in figures:
        note = (
            f"impossible: ≤ {f.bound_at_published:.0%} at {f.published_gbit:g} Gbit/s"
            if f.impossible
            else ""
        )
        ours = "-" if f.ours_gbit is None else f"{f.ours_gbit:.3g}"
        row = (
            "T4" if f.source == STREAMING else "T5",
            f.size.upper(),
            f.method,
            f"{f.cu:.0%}",
            f"{f.published_gbit:g}",
            ours,
            f"{f.bandwidth_error:.0%}",
            f"{f.points_error:.1f}",
            note,
        )
        print(("| " if markdown else "") + sep.join(row) + (" |" if markdown else ""))
    print()
    scored = [f for f in figures if not f.impossible]
    for name, subset in (
        ("all sources", scored),
        ("Streaming DiLoCo Table 4", [f for f in scored if f.source == STREAMING]),
        ("Eager Updates Table 5", [f for f in scored if f.source == EAGER]),
    ):
        if not subset:
            continue
        bw = statistics.median(f.bandwidth_error for f in subset)
        pts = statistics.median(f.points_error for f in subset)
        within = sum(f.points_error == 0 for f in subset)
        print(
            f"{name}: {len(subset)} figures, median bandwidth error {bw:.1%}, median "
            f"{pts:.2f} utilization points outside the published grid cell "
            f"({within} inside it)"
        )
    flagged = [f for f in figures if f.impossible]
    print(f"physically impossible under the stated assumptions (not scored): {len(flagged)}")
    print()
    print_per_method(figures)
    print()
    print(f"{TABLE1}:")
    for method, published, ours in table1:
        print(
            f"  {method}: published {published:.1%}, ours {ours:.1%} "
            f"({100 * abs(ours - published):.1f} points)"
        )
    print(
        "  median "
        f"{statistics.median(100 * abs(o - p) for _, p, o in table1):.1f} utilization points"
    )


def run() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--markdown", action="store_true", help="print a markdown table")
    parser.add_argument("--only", choices=sorted(STEP_S), help="one model size")
    args = parser.parse_args()
    start = time.perf_counter()
    figures: list[Figure] = []
    keys = [k for k in PUBLISHED if args.only is None or k[0] == args.only]
    for k, (size, method) in enumerate(keys, 1):
        print(f"[{k}/{len(keys)}] {size} {method}", flush=True)
        figures.extend(measure(size, method))
    report(figures, utilization_figures(), args.markdown)
    print(f"({time.perf_counter() - start:.0f} s)")


if __name__ == "__main__":
    run()
