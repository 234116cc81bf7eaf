"""`shardmeter fit --model M --gpu G --gpus N [--json]`: the layouts that fit, cheapest first.

Lists every tensor × pipeline × data-parallel layout, ZeRO stage and recompute mode (micro-batch
1) whose device total fits the card, fastest (cheapest per token) first, with its memory
breakdown and predicted throughput; then, for the best one (or `--plan`), the largest
micro-batch and sequence length that fit. When nothing fits it says so and names what would:
offload, an 8-bit optimizer, more GPUs. `--json` prints {"options": [...], "best": {...},
"suggestions": [...]}; bytes and tokens/s.
"""

from __future__ import annotations

import argparse
import sys
from typing import Any

from rich.console import Console

from shardmeter.cli.memory_flags import add_memory_flags, memory_fields
from shardmeter.clikit import positive_int
from shardmeter.errors import UserInputError
from shardmeter.fit import (
    FitOption,
    fit_layouts,
    largest_micro_batch,
    largest_seq_len,
    what_would_fit,
)
from shardmeter.predict import cluster_for_gpu, resolve_cluster, resolve_model
from shardmeter.report.jsonout import print_json
from shardmeter.report.terminal import Col, add_wide_flag, console_for, fit_table
from shardmeter.specs.loader import load_plan


def add_parser(subparsers: Any) -> None:
    p = subparsers.add_parser(
        "fit",
        help="which layouts fit in memory, cheapest first; the largest micro-batch and sequence",
        description="List the parallel layouts of a model on N GPUs that fit in memory, fastest "
        "(cheapest) first, with the memory breakdown and predicted throughput; then the "
        "largest micro-batch and sequence length that fit for the best one.",
    )
    p.add_argument("--model", required=True, help="model preset, TOML or HF config.json")
    p.add_argument("--gpu", help="accelerator preset (alone: its reference cluster)")
    p.add_argument("--cluster", help="cluster preset or file")
    p.add_argument("--gpus", type=positive_int, required=True, help="GPUs in the job")
    p.add_argument("--seq-len", type=positive_int, help="override the model's sequence length")
    p.add_argument("--global-batch", type=positive_int, help="sequences per optimizer step")
    p.add_argument("--plan", metavar="FILE", help="plan TOML/JSON to push to its limits instead")
    p.add_argument("--top", type=positive_int, default=10, help="layouts to list (default 10)")
    add_memory_flags(p)
    p.add_argument("--json", action="store_true", help="print JSON")
    add_wide_flag(p)


def _option(o: FitOption) -> dict[str, Any]:
    est = o.estimate
    return {
        "plan": o.plan.model_dump(),
        "tokens_per_s_per_gpu": est.tokens_per_s_per_gpu,
        "step_time_s": est.step_time_s,
        "memory_breakdown_bytes": dict(est.memory_breakdown),
        "memory_allocated_bytes": est.memory_allocated_bytes,
        "memory_reserved_bytes": est.memory_reserved_bytes,
        "memory_total_bytes": est.memory_total_bytes,
        "hbm_bytes": est.hbm_bytes,
    }


def _layout(o: FitOption) -> str:
    p = o.plan
    return f"dp={p.dp} tp={p.tp} pp={p.pp}"


def run(args: argparse.Namespace) -> int:
    model = resolve_model(args.model)
    if args.seq_len:
        model = model.model_copy(update={"seq_len": args.seq_len})
    if not (args.gpu or args.cluster):
        raise UserInputError("--gpu", None, "give --gpu or --cluster")
    cluster = cluster_for_gpu(args.gpu, args.cluster) if args.gpu else resolve_cluster(args.cluster)
    setup = memory_fields(args)
    options = fit_layouts(model, cluster, args.gpus, setup, args.global_batch)
    best = load_plan(args.plan, **setup) if args.plan else (options[0].plan if options else None)
    doc: dict[str, Any] = {"options": [_option(o) for o in options[: args.top]]}
    if best is not None:
        doc["best"] = {
            "plan": best.model_dump(),
            "largest_micro_batch": largest_micro_batch(model, cluster, best),
            "largest_seq_len": largest_seq_len(model, cluster, best),
        }
    suggestions = [] if options else what_would_fit(model, cluster, args.gpus, setup)
    doc["suggestions"] = [{"change": s.change, **_option(s.option)} for s in suggestions]
    if args.json:
        print_json(doc)
        return 0 if options else 1
    console = console_for(sys.stdout.isatty(), args.wide)
    _render(console, model.name, cluster.accelerator.name, args.gpus, options[: args.top], doc)
    return 0 if options else 1


def _render(
    console: Console, model: str, gpu: str, n: int, options: list[FitOption], doc: dict[str, Any]
) -> None:
    if not options:
        console.print(f"Nothing fits: {model} on {n} x {gpu} runs out of memory in every "
                      "layout, ZeRO stage and recompute mode.", markup=False)  # fmt: skip
        for s in doc["suggestions"]:
            p, gb = s["plan"], 1e9
            console.print(
                f"  would fit with {s['change']}: dp={p['dp']} tp={p['tp']} pp={p['pp']} "
                f"{p['sharding']}, recompute {p['recompute']}, "
                f"{s['memory_total_bytes'] / gb:.1f} of {s['hbm_bytes'] / gb:.1f} GB, "
                f"{s['tokens_per_s_per_gpu']:,.0f} tokens/s per GPU",
                markup=False,
            )
        if not doc["suggestions"]:
            console.print("  and nothing tried (offload, 8-bit AdamW, up to 64x the GPUs) fits")
        return
    cols = [
        Col("layout", "left"), Col("sharding", "left"), Col("recompute", "left"),
        Col("tokens/s/GPU"), Col("total GB"), Col("weights", drop=2), Col("grads", drop=2),
        Col("optimizer", drop=2), Col("activations", drop=1), Col("buffers", drop=1),
        Col("overhead", drop=3),
    ]  # fmt: skip
    rows = [
        [
            _layout(o),
            o.plan.sharding,
            o.plan.recompute,
            f"{o.estimate.tokens_per_s_per_gpu:,.0f}",
            f"{o.estimate.memory_total_bytes / 1e9:.1f}/{o.estimate.hbm_bytes / 1e9:.0f}",
            *(
                f"{o.estimate.memory_breakdown[k] / 1e9:.1f}"
                for k in (
                    "weights",
                    "gradients",
                    "optimizer_states",
                    "activations",
                    "buffers",
                    "overhead",
                )
            ),
        ]
        for o in options
    ]
    title = f"{model} on {n} x {gpu}: layouts that fit, cheapest first (GB per GPU)"
    console.print(fit_table(console, title, cols, rows))
    best = doc["best"]
    p = best["plan"]
    console.print(
        f"best plan (dp={p['dp']} tp={p['tp']} pp={p['pp']} {p['sharding']}, recompute "
        f"{p['recompute']}): largest micro-batch {best['largest_micro_batch']}, longest "
        f"sequence {best['largest_seq_len']:,} tokens at micro-batch {p['micro_batch']}",
        markup=False,
    )
