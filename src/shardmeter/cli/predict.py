"""`shardmeter predict`: one plan on one island (or, with --topology, several islands).

With no arguments it predicts Llama-3.1-8B on one 8×H100 DGX node with FSDP.
"""

from __future__ import annotations

import argparse
import json
import sys
from typing import Any, get_args

from shardmeter.cli import topology_predict
from shardmeter.cli.memory_flags import add_memory_flags, memory_fields
from shardmeter.clikit import positive_int
from shardmeter.errors import UserInputError
from shardmeter.estimate.step import estimate_step
from shardmeter.predict import (
    DEFAULT_CLUSTER,
    DEFAULT_GPUS,
    DEFAULT_MODEL,
    PredictInputs,
    cluster_for_gpu,
    default_plan,
    prepare,
    resolve_cluster,
    resolve_model,
)
from shardmeter.report.htmlpage import add_html_flag, check_html_path, page_command
from shardmeter.report.step import estimate_to_dict, render_step
from shardmeter.report.terminal import add_wide_flag, console_for
from shardmeter.specs.framework import FRAMEWORKS
from shardmeter.specs.loader import load_plan
from shardmeter.specs.plan import Fp8Scaling

PLAN_INT_FLAGS: dict[str, str] = {
    "dp": "data-parallel degree (default: the GPUs left by tp*pp*cp)",
    "tp": "tensor-parallel degree",
    "pp": "pipeline stages",
    "vpp": "virtual pipeline chunks per stage (interleaved 1F1B)",
    "cp": "context-parallel degree",
    "ep": "expert-parallel degree (inside dp)",
    "shard_degree": "HSDP sharding-group size (default: all of dp)",
    "micro_batch": "sequences per micro-batch per GPU (default 1)",
    "global_batch": "sequences per optimizer step (default dp*micro_batch, x4*pp with pp)",
}


def add_parser(subparsers: Any) -> None:
    p = subparsers.add_parser(
        "predict",
        help="predict step time, throughput, MFU and memory of one plan",
        description="Predict one training step. With no arguments: "
        f"{DEFAULT_MODEL} on {DEFAULT_GPUS} GPUs of {DEFAULT_CLUSTER} with FSDP.",
    )
    p.add_argument("--model", help=f"model preset or file (default {DEFAULT_MODEL})")
    p.add_argument("--cluster", help=f"cluster preset or file (default {DEFAULT_CLUSTER})")
    p.add_argument("--gpu", help="accelerator preset; alone it picks that GPU's reference cluster")
    p.add_argument("--gpus", type=positive_int, help=f"GPUs in the job (default {DEFAULT_GPUS})")
    p.add_argument("--seq-len", type=positive_int, help="override the model's sequence length")
    p.add_argument("--plan", metavar="FILE", help="plan TOML/JSON; flags below override it")
    plan = p.add_argument_group("plan")
    for name, text in PLAN_INT_FLAGS.items():
        plan.add_argument(f"--{name.replace('_', '-')}", type=positive_int, dest=name, help=text)
    plan.add_argument("--sp", action=argparse.BooleanOptionalAction, help="sequence parallelism")
    plan.add_argument(
        "--sharding",
        choices=("none", "zero1", "zero2", "zero3"),
        help="ZeRO stage (zero3 = FSDP); default zero3, zero1 with tp or pp",
    )
    plan.add_argument(
        "--recompute",
        choices=("none", "selective", "full", "auto"),
        help="activation recompute (auto: lightest that fits; default auto without --plan)",
    )
    plan.add_argument("--precision", choices=("bf16", "fp16", "fp8"), help="default bf16")
    plan.add_argument(
        "--framework", choices=tuple(FRAMEWORKS),
        help="training stack whose documented defaults fill the unstated plan fields",
    )  # fmt: skip
    plan.add_argument(
        "--no-overlap-dp", dest="overlap_dp", action="store_false", default=None,
        help="do not overlap gradient reduction with backward",
    )  # fmt: skip
    plan.add_argument(
        "--no-overlap-param-gather", dest="overlap_param_gather", action="store_false",
        default=None, help="do not prefetch ZeRO/FSDP parameter all-gathers",
    )  # fmt: skip
    plan.add_argument(
        "--overlap-tp", action=argparse.BooleanOptionalAction, default=None,
        help="overlap TP collectives with GEMMs",
    )  # fmt: skip
    plan.add_argument(
        "--tp-async", action=argparse.BooleanOptionalAction, default=None,
        help="async TP: each TP collective decomposed with its own GEMM (torchtitan)",
    )  # fmt: skip
    plan.add_argument(
        "--fp8-scaling", choices=get_args(Fp8Scaling),
        help="FP8 scales per tensor (default) or per row along each GEMM's K axis",
    )  # fmt: skip
    add_memory_flags(p)
    p.add_argument("--json", action="store_true", help="print the JSON document (docs/model.md)")
    add_html_flag(p)
    add_wide_flag(p)
    topology_predict.add_arguments(p)


def _plan_fields(args: argparse.Namespace) -> dict[str, Any]:
    fields: dict[str, Any] = {name: getattr(args, name) for name in PLAN_INT_FLAGS}
    for name in ("sp", "sharding", "precision", "overlap_dp", "overlap_param_gather", "framework"):
        fields[name] = getattr(args, name)
    fields["overlap_tp"] = args.overlap_tp
    fields["tp_async"] = args.tp_async
    fields["fp8_scaling"] = args.fp8_scaling
    if args.recompute not in (None, "auto"):
        fields["recompute"] = args.recompute
    fields.update(memory_fields(args))
    return {k: v for k, v in fields.items() if v is not None}


def inputs_from_args(args: argparse.Namespace) -> PredictInputs:
    """Resolve CLI flags to model, cluster and plan (UserInputError on bad input)."""
    model = resolve_model(args.model)
    if args.seq_len is not None:
        if args.seq_len < 1:
            raise UserInputError("--seq-len", args.seq_len, "must be a positive integer")
        model = model.model_copy(update={"seq_len": args.seq_len})
    cluster = cluster_for_gpu(args.gpu, args.cluster) if args.gpu else resolve_cluster(args.cluster)
    fields = _plan_fields(args)
    if args.plan:
        plan = load_plan(args.plan, **fields)
        auto = args.recompute == "auto"
    else:
        degrees = [fields.get(k, 1) for k in ("dp", "tp", "pp", "cp")]
        n = args.gpus or (
            degrees[0] * degrees[1] * degrees[2] * degrees[3] if "dp" in fields else DEFAULT_GPUS
        )
        plan = default_plan(n, **fields)
        auto = args.recompute in (None, "auto")
    return prepare(model, cluster, plan, n_gpus=args.gpus, recompute_auto=auto)


def run(args: argparse.Namespace) -> int:
    check_html_path("--html", args.html)
    if getattr(args, "topology", None):
        return int(topology_predict.run_topology(args))
    inputs = inputs_from_args(args)
    est = estimate_step(inputs.model, inputs.cluster, inputs.plan)
    if args.html is not None:
        from shardmeter.report.html import predict_page

        page = predict_page(
            est, inputs.model, inputs.cluster, inputs.plan, page_command("shardmeter", args)
        )
        page.write(args.html)
    if args.json:
        doc = estimate_to_dict(est, inputs.model, inputs.cluster, inputs.plan)
        json.dump(doc, sys.stdout, indent=2)
        sys.stdout.write("\n")
        return 0
    console = console_for(sys.stdout.isatty(), args.wide)
    render_step(console, est, inputs.model, inputs.cluster, inputs.plan)
    if args.html is not None:
        console.print(f"wrote {args.html}")
    return 0
