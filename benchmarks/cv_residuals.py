"""Residuals of the leave-one-source-out cross-validation, grouped by scale and by mechanism.

    python benchmarks/calibration.py --cv --cv-out out/cv.csv   # ~8 min: every held-out row
    python benchmarks/cv_residuals.py out/cv.csv                # the tables below, in seconds
    python benchmarks/cv_residuals.py out/cv.csv --before out/cv_before.csv  # side by side
    python benchmarks/cv_residuals.py out/cv.csv --sources S1,S5,S7,S8       # some sources
    python benchmarks/cv_residuals.py out/cv.csv --features   # signed error per plan feature

A bias that grows with scale shows as a slope of the signed log error against log2(GPUs)
(least squares, per source and over all rows) and as a drift of the signed median across the
GPU, pipeline-depth, recompute, model-size and accelerator bins (a source whose bias sits on
one of its chips points at that chip's parameters, not at its framework). The mechanism table groups rows by the
plan features each mechanism of docs/model.md acts on (a row can be in several groups).
`--features` prints, for every plan feature (framework, model size, sequence, micro-batch,
micro-batches per step, tokens per GPU and micro-batch, tp, pp, vpp, layers per chunk, cp, dp,
GPUs, precision, recompute, sharding, attention kernel), the signed median error per bucket:
a trend across one feature's buckets names a missing or mis-sized cost.
"""

from __future__ import annotations

import argparse
import csv
import itertools
import math
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from pathlib import Path

import numpy as np


@dataclass(frozen=True)
class Row:
    """One held-out prediction with the plan features the tables group by."""

    run_id: str
    source: str
    gpu: str
    n_gpus: int
    params_b: float
    seq_len: int
    tp: int
    pp: int
    vpp: int
    cp: int
    dp: int
    ep: int
    experts: int  # routed experts (0: dense)
    sharding: str
    recompute: str
    precision: str
    signed: float  # predicted / measured − 1
    micro_batch: int = 1
    framework: str = ""
    global_batch: int = 0  # sequences per step (0: not in the file)
    n_layers: int = 0  # decoder layers (0: not in the file)
    attention: str = ""  # attention kernel (blank: not in the file)

    @property
    def ape(self) -> float:
        return abs(self.signed)

    @property
    def log_error(self) -> float:
        return math.log1p(self.signed)


def _row(r: dict[str, str]) -> Row:
    return Row(
        run_id=r["run_id"], source=r["source_id"], gpu=r["gpu"], n_gpus=int(r["n_gpus"]),
        params_b=float(r["params_b"]), seq_len=int(r["seq_len"]), tp=int(r["tp"]),
        pp=int(r["pp"]), vpp=int(r["vpp"]), cp=int(r["cp"]), dp=int(r["dp"]), ep=int(r["ep"]),
        experts=int(r["experts"]), sharding=r["sharding"], recompute=r["recompute"],
        precision=r["precision"], signed=float(r["signed_error"]),
        micro_batch=int(r.get("micro_batch") or 1), framework=r.get("framework", ""),
        global_batch=int(r.get("global_batch") or 0), n_layers=int(r.get("n_layers") or 0),
        attention=r.get("attention", ""),
    )  # fmt: skip


def read(path: Path) -> list[Row]:
    with open(path, newline="", encoding="utf-8") as fh:
        return [_row(r) for r in csv.DictReader(fh)]


def stats(rows: Sequence[Row]) -> str:
    """n, mean, median, p90 of |error| and the signed median, as one table line."""
    if not rows:
        return f"{0:>4} {'':>7} {'':>7} {'':>7} {'':>8}"
    ape = np.array([r.ape for r in rows])
    signed = float(np.median([r.signed for r in rows]))
    return (
        f"{len(rows):>4} {100 * ape.mean():>6.1f}% {100 * np.median(ape):>6.1f}% "
        f"{100 * np.percentile(ape, 90):>6.1f}% {100 * signed:>+7.1f}%"
    )


def slope(rows: Sequence[Row]) -> float:
    """Least-squares slope of log(predicted/measured) per doubling of GPUs (NaN if one scale)."""
    x = np.array([math.log2(r.n_gpus) for r in rows])
    if len(rows) < 3 or float(np.ptp(x)) == 0.0:
        return float("nan")
    y = np.array([r.log_error for r in rows])
    return float(np.polyfit(x, y, 1)[0])


MECHANISMS: tuple[tuple[str, Callable[[Row], bool]], ...] = (
    ("FP8 GEMMs", lambda r: r.precision == "fp8"),
    ("ZeRO-3 / FSDP", lambda r: r.sharding == "zero3"),
    ("pipeline (pp > 1)", lambda r: r.pp > 1),
    ("interleaved (vpp > 1)", lambda r: r.vpp > 1),
    ("context parallel (cp > 1)", lambda r: r.cp > 1),
    ("tensor parallel (tp > 1)", lambda r: r.tp > 1),
    ("full recompute", lambda r: r.recompute == "full"),
    ("selective recompute", lambda r: r.recompute == "selective"),
    ("MoE", lambda r: r.experts > 0),
    ("long context (s >= 32K)", lambda r: r.seq_len >= 32768),
    ("TPU", lambda r: r.gpu.startswith("tpu")),
    ("> 1,000 GPUs", lambda r: r.n_gpus > 1000),
)

BINS: tuple[tuple[str, Callable[[Row], str]], ...] = (
    ("GPUs", lambda r: f"{2 ** int(math.log2(r.n_gpus) // 2 * 2):>5}-{2 ** (int(math.log2(r.n_gpus) // 2 * 2) + 2) - 1}"),
    ("pipeline depth", lambda r: "1" if r.pp == 1 else "2-8" if r.pp <= 8 else "9-64"),
    ("recompute", lambda r: r.recompute),
    ("model size", lambda r: "< 20B" if r.params_b < 20 else "20-100B" if r.params_b < 100 else ">= 100B"),
    ("accelerator", lambda r: r.gpu),  # one framework's rows split by chip: hardware or software?
)  # fmt: skip


def _pow2_bin(value: float, edges: Sequence[int]) -> str:
    """The bucket of `value` among increasing integer `edges`: '<=e0', then 'a-b' for
    e(i-1) < value <= e(i) (just 'b' when that holds one integer), then '>eN'."""
    if value <= edges[0]:
        return f"<={edges[0]}"
    for low, high in itertools.pairwise(edges):
        if value <= high:
            return f"{high}" if low + 1 == high else f"{low + 1}-{high}"
    return f">{edges[-1]}"


def _micro_batches(r: Row) -> float:
    return r.global_batch / max(r.dp * r.micro_batch, 1)


# (feature, bucket of a row or None when the file lacks what it needs)
FEATURES: tuple[tuple[str, Callable[[Row], str | None]], ...] = (
    ("framework", lambda r: r.framework.split(" ")[0][:14] or None),
    ("params (B)", lambda r: _pow2_bin(r.params_b, (10, 30, 100, 300))),
    ("sequence", lambda r: _pow2_bin(r.seq_len, (2048, 4096, 8192, 32768))),
    ("micro-batch (seq)", lambda r: _pow2_bin(r.micro_batch, (1, 2, 4))),
    ("tokens/GPU/micro-batch", lambda r: _pow2_bin(r.micro_batch * r.seq_len / r.cp, (2048, 4096, 8192, 16384))),
    ("micro-batches/step", lambda r: _pow2_bin(_micro_batches(r), (1, 8, 32, 128)) if r.global_batch else None),
    ("tp", lambda r: _pow2_bin(r.tp, (1, 2, 4, 8))),
    ("pp", lambda r: _pow2_bin(r.pp, (1, 4, 8, 16))),
    ("vpp", lambda r: _pow2_bin(r.vpp, (1, 4, 8))),
    ("layers/chunk", lambda r: _pow2_bin(r.n_layers / (r.pp * r.vpp), (1, 2, 4, 16)) if r.n_layers else None),
    ("cp", lambda r: _pow2_bin(r.cp, (1, 2, 4))),
    ("dp", lambda r: _pow2_bin(r.dp, (8, 64, 512))),
    ("GPUs", lambda r: _pow2_bin(r.n_gpus, (64, 512, 2048))),
    ("precision", lambda r: r.precision),
    ("recompute", lambda r: r.recompute),
    ("sharding", lambda r: r.sharding),
    ("attention kernel", lambda r: r.attention or None),
)  # fmt: skip


def feature_table(rows: Sequence[Row]) -> list[str]:
    """Signed median, median and mean |error| per bucket of every plan feature, one line per
    bucket, at most 80 columns."""
    lines = [f"{'feature':<22} {'bucket':<12} {'n':>4} {'signed':>7} {'median':>7} {'mean':>7}"]
    for name, key in FEATURES:
        buckets: dict[str, list[Row]] = {}
        for r in rows:
            label = key(r)
            if label is not None:
                buckets.setdefault(label, []).append(r)
        first = True
        for label, group in sorted(buckets.items(), key=lambda kv: _bucket_order(kv[0])):
            ape = [x.ape for x in group]
            lines.append(
                f"{name if first else '':<22} {label[:12]:<12} {len(group):>4} "
                f"{100 * float(np.median([x.signed for x in group])):>+6.1f}% "
                f"{100 * float(np.median(ape)):>6.1f}% {100 * float(np.mean(ape)):>6.1f}%"
            )
            first = False
    return lines


def _bucket_order(label: str) -> tuple[float, str]:
    """Numeric buckets in increasing order ('<=2048' < '2049-4096' < '>32768'), names after."""
    digits = label.lstrip("<=>").split("-")[0]
    if digits.isdigit():
        return (float(digits) + (0.5 if label.startswith(">") else 0.0), label)
    return (float("inf"), label)


HEADER = f"{'':<28} {'n':>4} {'mean':>7} {'median':>7} {'p90':>7} {'signed':>8}"


def report(rows: Sequence[Row]) -> None:
    print(f"held-out rows: {len(rows)}\n\nper source (slope: log error per doubling of GPUs)")
    print(HEADER + f" {'slope':>8}")
    for source in sorted({r.source for r in rows}):
        group = [r for r in rows if r.source == source]
        print(f"{source:<28} {stats(group)} {100 * slope(group):>+7.1f}%")
    print(f"{'all rows':<28} {stats(rows)} {100 * slope(rows):>+7.1f}%")
    medians = sorted(float(np.median([r.ape for r in rows if r.source == s]))
                     for s in {r.source for r in rows})  # fmt: skip
    print(f"worst source median {100 * medians[-1]:.1f}%")
    print("\nper mechanism (rows whose plan uses it)")
    print(HEADER)
    for name, member in MECHANISMS:
        print(f"{name:<28} {stats([r for r in rows if member(r)])}")
    for title, key in BINS:
        print(f"\nby {title}")
        print(HEADER)
        for label in sorted({key(r) for r in rows}):
            print(f"{label:<28} {stats([r for r in rows if key(r) == label])}")
    worst = sorted(rows, key=lambda r: -r.ape)[: max(1, len(rows) // 10)]
    print("\nworst decile")
    for r in worst:
        print(f"  {r.run_id:>5} {r.source:<4} {r.gpu:<19} {r.n_gpus:>6} GPUs pp {r.pp:<3} "
              f"cp {r.cp} {r.recompute:<9} {r.precision:<4} {100 * r.signed:+7.1f}%")  # fmt: skip


def main(argv: Sequence[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("cv_csv", help="the --cv-out file of benchmarks/calibration.py --cv")
    parser.add_argument("--before", default="", help="an earlier --cv-out file: its table first")
    parser.add_argument("--sources", default="", help="only these sources (S1,H4,...)")
    parser.add_argument(
        "--features", action="store_true", help="only the signed error per plan-feature bucket"
    )
    args = parser.parse_args(argv)
    keep = set(args.sources.split(",")) if args.sources else None

    def rows_of(path: str) -> list[Row]:
        return [r for r in read(Path(path)) if keep is None or r.source in keep]

    if args.features:
        for label, path in ((f"before: {args.before}", args.before), (args.cv_csv, args.cv_csv)):
            if path:
                rows = rows_of(path)
                print(f"== {label} ({len(rows)} rows)" if args.before else f"{len(rows)} rows")
                print("\n".join(feature_table(rows)))
        return 0
    if args.before:
        print(f"== before: {args.before}")
        report(rows_of(args.before))
        print(f"\n== after: {args.cv_csv}")
    report(rows_of(args.cv_csv))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
