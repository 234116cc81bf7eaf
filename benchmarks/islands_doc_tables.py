"""Every table of docs/islands.md sections 4 and 6 (the worked examples), from the shipped
topologies, and the figures its sentences quote; `--check` says which rows of the doc are stale.

Run: `.venv/bin/python benchmarks/islands_doc_tables.py [--check]` (about 30 s). The tables
depend on the single-island estimator's calibration: after it changes, run this and paste.
"""

from __future__ import annotations

import argparse
import sys
from collections.abc import Callable
from pathlib import Path
from typing import Any

from shardmeter.estimate.islands import predict_topology, with_step_times, with_wan
from shardmeter.report.terminal import duration, nbytes
from shardmeter.specs.topology import Topology, load_topology

DOC = Path(__file__).resolve().parents[1] / "docs" / "islands.md"
DAY = 86400.0


def row(*cells: str) -> str:
    return "| " + " | ".join(cells) + " |"


def gbit(value: float | None) -> str:
    return "unreachable" if value is None else f"{value:.3g} Gbit/s"


def days(seconds: float) -> str:
    return f"{seconds / DAY:.3g} d"


def modes(two: Topology) -> list[str]:
    """Section 4: the same hardware in every mode (also benchmarks/islands_modes.py)."""
    out = [
        "| mode | tokens/s | utilization | regime | time | cost | of which egress | "
        "compute-bound at |"
    ]
    for label, over in (
        ("sync DP (bf16 gradients)", {"mode": "sync"}),
        ("DiLoCo, blocking", {"mode": "diloco"}),
        ("DiLoCo, eager", {"mode": "diloco", "outer_overlap": True}),
        ("Streaming DiLoCo P=4, τ=2", {"mode": "streaming", "fragments": 4, "overlap_steps": 2}),
        ("async parameter server", {"mode": "async"}),
    ):
        est = predict_topology(two, **over)
        at = [f"H ≥ {est.min_inner_steps}"] if est.min_inner_steps is not None else []
        if est.min_wan_gbit is not None:
            at.append(f"{est.min_wan_gbit:.3g} Gbit/s")
        out.append(
            row(
                label,
                f"{est.tokens_per_s:,.0f}",
                f"{est.utilization:.1%}",
                est.regime.split(" (")[0],
                f"{est.wall_s / DAY:.1f} d",
                f"${est.cost_usd:,.0f}",
                f"${est.egress_cost_usd:,.0f}",
                "; ".join(at) or "-",
            )
        )
    return out


def overlap(two: Topology) -> list[str]:
    """Section 6.1: each overlap on and off."""
    out = ["| setting | utilization | WAN exchange per round | hidden | utilization ≥ 90% at |"]
    for label, over in (
        ("sync DP, no overlap", {"mode": "sync", "backward_overlap": False}),
        ("sync DP, backward overlap", {"mode": "sync"}),
        ("Streaming P = 8, τ = 0", {"mode": "streaming", "fragments": 8}),
        ("Streaming P = 8, τ = 1", {"mode": "streaming", "fragments": 8, "overlap_steps": 1}),
        ("DiLoCo, eager", {"outer_overlap": True}),
    ):
        est = predict_topology(two, **over)
        hidden = duration(est.wan_hidden_s) if est.wan_hidden_s > 0 else "0"
        out.append(
            row(
                label,
                f"{est.utilization:.1%}",
                duration(est.wan_comm_s),
                hidden,
                gbit(est.min_wan_gbit),
            )
        )
    sync = predict_topology(two, mode="sync")
    isl = sync.islands[0]
    plan = isl.plan
    micro = None if plan is None else plan.global_batch // (plan.dp * plan.micro_batch)
    out.append(
        f"sync DP: {micro} micro-batches per GPU, backward window "
        f"{duration(isl.step.backward_window_s)} of a {duration(isl.step.step_time_s)} step"
    )
    return out


def schedules(two: Topology) -> list[str]:
    """Section 6.2: four consecutive-layer fragments against eight strided ones."""
    listed = predict_topology(
        two, mode="streaming", fragments="0:8,25:8,50:8,75:8", overlap_steps=1
    )
    even = predict_topology(two, mode="streaming", fragments=8, overlap_steps=1)
    return [
        f"listed 0:8,25:8,50:8,75:8, τ = 1: {gbit(listed.min_wan_gbit)} for 90%; "
        f"P = 8 strided: {gbit(even.min_wan_gbit)}"
    ]


def given(two: Topology) -> list[str]:
    """Section 6.3: the European island measured at 9.5 s."""
    predicted = predict_topology(two, mode="sync")
    measured = predict_topology(with_step_times(two, "neocloud-eu-west=9.5"), mode="sync")
    p, m = predicted.islands[1], measured.islands[1]
    return [
        f"neocloud-eu-west given 9.5 s (predicted {duration(p.step.step_time_s)}): MFU "
        f"{m.step.mfu:.1%} instead of {p.step.mfu:.1%}; pacing island "
        f"{measured.bottleneck.island}; {days(measured.wall_s)} instead of "
        f"{days(predicted.wall_s)}"
    ]


PAYLOADS: tuple[tuple[str, str | None], ...] = (
    ("dense bf16", None),
    ("low-rank, rank 4", "lowrank:rank=4"),
    ("sign, fp16 scale per 128", "sign"),
    ("top-1% + int32 index", "topk:fraction=0.01"),
    ("DCT top-1/64 + int16 index", "dct_topk:fraction=0.015625"),
)


def payloads(two: Topology) -> list[str]:
    """Section 6.4: sync DP with each payload family."""
    out = [
        "| payload | bits/param | per exchange | utilization | time | cost | of which egress | "
        "residual per GPU |"
    ]
    for label, spec in PAYLOADS:
        est = predict_topology(two, mode="sync", payload=spec)
        per_exchange = est.payload_bits_per_param * est.n_params / 8
        out.append(
            row(
                label,
                f"{est.payload_bits_per_param:.3g}",
                nbytes(per_exchange),
                f"{est.utilization:.1%}",
                days(est.wall_s),
                f"${est.cost_usd:,.0f}",
                f"${est.egress_cost_usd:,.0f}",
                nbytes(est.islands[0].payload_memory_bytes),
            )
        )
    return out


def bucket(two: Topology) -> list[str]:
    """Section 6.5: top-1% DiLoCo through a bucket against the ring."""
    ring = predict_topology(two, payload="topk:fraction=0.01")
    store = with_wan(two, bucket="bandwidth_gbit=10,latency_ms=30,egress_usd_per_gb=0.09")
    via = predict_topology(store, payload="topk:fraction=0.01", reduce="bucket")
    return [
        f"top-1% DiLoCo: bucket {duration(via.wan_comm_s)} per round, "
        f"{nbytes(via.wan_bytes_per_round)} per round; ring {duration(ring.wan_comm_s)}, "
        f"{nbytes(ring.wan_bytes_per_round)}"
    ]


CHURN: tuple[tuple[str, dict[str, Any]], ...] = (
    ("sync DP", {"mode": "sync"}),
    ("DiLoCo H = 100", {"mode": "diloco"}),
    ("DiLoCo, quorum 6 of 8, 60 s grace", {"mode": "diloco", "quorum": "quorum=6,grace_s=60,"}),
    ("async", {"mode": "async"}),
)


def churn(eight: Topology) -> list[str]:
    """Section 6.6: eight heterogeneous islands, GPU MTBF 5,000 h, 10-minute restarts,
    2-minute checkpoints."""
    out = [
        "| mode | tokens/s | utilization | goodput | time | cost | without failures | "
        "checkpoint every (Young/Daly) |"
    ]
    for label, over in CHURN:
        failures = f"{over.get('quorum', '')}gpu_mtbf_hours=5000,restart_s=600,checkpoint_s=120"
        est = predict_topology(eight, mode=over["mode"], failures=failures)
        f = est.failures
        out.append(
            row(
                label,
                f"{est.tokens_per_s:,.0f}",
                f"{est.utilization:.1%}",
                f"{f.goodput:.1%}",
                days(est.wall_s),
                f"${est.cost_usd:,.0f}",
                days(f.wall_s_failure_free),
                duration(f.optimal_interval_s),
            )
        )
    est = predict_topology(eight, mode="sync", failures="gpu_mtbf_hours=5000")
    out.append(f"{est.failures.failures_per_day:.2g} failures a day over {est.n_gpus} GPUs")
    return out


def balance(eight: Topology) -> list[str]:
    """Section 2: balanced inner steps on eight-heterogeneous."""
    plain = predict_topology(eight, mode="diloco")
    balanced = predict_topology(eight, mode="diloco", balance_steps=True)
    return [
        f"eight-heterogeneous DiLoCo: {plain.utilization:.1%}, with --balance-steps "
        f"{balanced.utilization:.1%}"
    ]


def sections() -> list[tuple[str, Callable[[Topology], list[str]], Topology]]:
    two, eight = load_topology("two-clouds"), load_topology("eight-heterogeneous")
    return [
        ("2. balanced steps", balance, eight),
        ("4. every mode", modes, two),
        ("6.1 overlap", overlap, two),
        ("6.2 schedules", schedules, two),
        ("6.3 given step times", given, two),
        ("6.4 payload families", payloads, two),
        ("6.5 object storage", bucket, two),
        ("6.6 failures and churn", churn, eight),
    ]


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument(
        "--check", action="store_true", help="exit 1 if a table row is not in docs/islands.md"
    )
    args = parser.parse_args()
    doc = DOC.read_text()
    stale = []
    for title, make, topo in sections():
        print(f"## {title}")
        for line in make(topo):
            print(line)
            if line.startswith("| ") and line not in doc:
                stale.append(f"{title}: {line}")
        print()
    if args.check:
        for line in stale:
            print(f"stale in docs/islands.md: {line}", file=sys.stderr)
        return 1 if stale else 0
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
