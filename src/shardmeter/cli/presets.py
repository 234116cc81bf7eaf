"""`shardmeter presets [KIND] [--json]` lists shipped presets; `presets show NAME` prints one."""

from __future__ import annotations

import argparse
import difflib
import json
import sys
from dataclasses import asdict
from typing import Any

from rich.console import Console
from rich.table import Table

from shardmeter.errors import UserInputError
from shardmeter.report.terminal import add_wide_flag, console_for
from shardmeter.specs.hardware import Accelerator, Cluster
from shardmeter.specs.loader import (
    KINDS,
    list_presets,
    load_accelerator,
    load_cluster,
    load_model,
    normalize_kind,
    preset_data,
    preset_names,
    split_meta,
)
from shardmeter.specs.model import TransformerSpec

Rows = list[tuple[str, str]]


def add_parser(subparsers: Any) -> None:
    parser = subparsers.add_parser(
        "presets",
        help="list shipped models, accelerators, clusters and topologies",
        description="List shipped presets (`presets [KIND]`) or print one (`presets show NAME`).",
    )
    parser.add_argument(
        "what",
        nargs="?",
        default="all",
        metavar="KIND|show",
        help=f"one of {', '.join(KINDS)}, 'all' (default), or 'show' followed by a preset name",
    )
    parser.add_argument("name", nargs="?", help="preset name (with `show`)")
    parser.add_argument("--json", action="store_true", help="machine-readable output")
    add_wide_flag(parser)


def run(args: argparse.Namespace) -> int:
    console = console_for(sys.stdout.isatty(), args.wide, highlight=False)
    if args.what == "show":
        if not args.name:
            raise UserInputError(
                "presets show", None, "give a preset name, e.g. `presets show h100-sxm`"
            )
        return _show(args.name, as_json=args.json, console=console)
    if args.name:
        raise UserInputError("presets", args.name, "a name only goes with `presets show NAME`")
    kinds = KINDS if args.what == "all" else (normalize_kind(args.what),)
    infos = [info for kind in kinds for info in list_presets(kind)]
    if args.json:
        print(json.dumps([asdict(info) for info in infos], indent=2))
        return 0
    for kind in kinds:
        table = Table(title=f"{kind} ({len(preset_names(kind))})", title_justify="left")
        table.add_column("name", style="bold", no_wrap=True)
        table.add_column("summary")
        for info in infos:
            if info.kind == kind:
                table.add_row(info.name, info.summary)
        console.print(table)
    return 0


# --- show ---------------------------------------------------------------------------------------
def _show(name: str, *, as_json: bool, console: Console) -> int:
    kinds = [kind for kind in KINDS if name in preset_names(kind)]
    if not kinds:
        every = [n for kind in KINDS for n in preset_names(kind)]
        close = difflib.get_close_matches(name, every, n=4, cutoff=0.5)
        hint = f"close matches: {', '.join(close)}; " if close else ""
        raise UserInputError(
            "preset", name, f"unknown preset; {hint}list all with `shardmeter presets`"
        )
    views = [_view(kind, name) for kind in kinds]
    if as_json:
        payload = [
            {"kind": kind, "name": name, **data}
            for kind, (data, _) in zip(kinds, views, strict=True)
        ]
        print(json.dumps(payload[0] if len(payload) == 1 else payload, indent=2))
        return 0
    for kind, (_, rows) in zip(kinds, views, strict=True):
        table = Table(title=f"{kind[:-1]} preset {name}", title_justify="left", show_header=False)
        table.add_column("field", style="bold", no_wrap=True)
        table.add_column("value")
        for key, value in rows:
            table.add_row(key, value)
        console.print(table)
    return 0


def _view(kind: str, name: str) -> tuple[dict[str, Any], Rows]:
    """JSON-ready data and display rows for one preset."""
    _, meta = split_meta(preset_data(kind, name))
    if kind == "models":
        model = load_model(name)
        data, rows = _model_view(model)
    elif kind == "accelerators":
        accel = load_accelerator(name)
        data, rows = accel.model_dump(), _accelerator_rows(accel)
    elif kind == "clusters":
        cluster = load_cluster(name)
        data, rows = cluster.model_dump(), _cluster_rows(cluster)
    else:
        data, _ = split_meta(preset_data(kind, name))
        rows = [(key, json.dumps(value)) for key, value in data.items()]
    rows += [(f"preset.{key}", str(value)) for key, value in meta.items()]
    return {**data, "preset": meta}, rows


def _model_view(model: TransformerSpec) -> tuple[dict[str, Any], Rows]:
    derived = {
        "params_total": model.params_total,
        "params_active": model.params_active,
        "params_non_embedding": model.params_non_embedding,
        "params_embedding": model.embedding_params,
        "matmul_flops_per_token_fwd": model.matmul_flops_per_token(),
        "attention_flops_per_token_fwd": model.attention_flops_per_token(),
        "training_flops_per_token": model.training_flops_per_token(),
    }
    rows: Rows = [
        ("layers × hidden", f"{model.n_layers} × {model.hidden}"),
        ("heads (q / kv) × head_dim", f"{model.n_heads} / {model.kv_heads} × {model.dim_head}"),
        ("ffn / mlp", f"{model.ffn} / {model.mlp}"),
        ("vocab / seq_len", f"{model.vocab} / {model.seq_len}"),
        ("tied embeddings", str(model.tied_embeddings)),
    ]
    if model.moe is not None:
        moe = model.moe
        rows.append(
            (
                "moe",
                f"{moe.experts} experts, top-{moe.top_k}, {moe.shared_experts} shared, "
                f"expert ffn {model.expert_ffn}, {moe.dense_layers} dense layers (ffn {model.dense_ffn})",
            )
        )
    rows += [
        ("parameters (total)", f"{model.params_total / 1e9:.3f} B"),
        ("parameters (active/token)", f"{model.params_active / 1e9:.3f} B"),
        ("  of which embeddings", f"{model.embedding_params / 1e9:.3f} B"),
        ("fwd matmul FLOPs/token", f"{model.matmul_flops_per_token() / 1e9:.2f} GFLOP"),
        (
            f"fwd attention FLOPs/token (seq {model.seq_len}, causal)",
            f"{model.attention_flops_per_token() / 1e9:.2f} GFLOP",
        ),
        ("training FLOPs/token (3 × fwd)", f"{model.training_flops_per_token() / 1e9:.2f} GFLOP"),
    ]
    return {**model.model_dump(), "derived": derived}, rows


def _accelerator_rows(accel: Accelerator) -> Rows:
    peaks = ", ".join(f"{dtype} {value:g}" for dtype, value in accel.peak_tflops.items())
    ridge = accel.peak("bf16") * 1e12 / (accel.hbm_gbps * 1e9)
    eff = accel.efficiency
    return [
        ("dense peak TFLOP/s", peaks),
        ("HBM", f"{accel.hbm_gb:g} GB at {accel.hbm_gbps:g} GB/s"),
        ("bf16 ridge point", f"{ridge:.0f} FLOP/byte"),
        ("TDP", "-" if accel.tdp_w is None else f"{accel.tdp_w:g} W"),
        (
            "efficiency",
            f"matmul_max {eff.matmul_max:g}, half at {eff.matmul_half_gflop:g} GFLOP, "
            f"memory {eff.memory:g}, attention {eff.attention:g}, fp8 speedup {eff.fp8_speedup:g}",
        ),
        ("source", accel.source),
    ]


def _cluster_rows(cluster: Cluster) -> Rows:
    def link(kind: str, value: Any) -> tuple[str, str]:
        return (
            kind,
            f"{value.name}: {value.bandwidth_gbps:g} GB/s per GPU per direction, "
            f"{value.latency_us:g} µs, efficiency {value.efficiency:g}",
        )

    return [
        (
            "accelerator",
            f"{cluster.accelerator.name} ({cluster.accelerator.peak('bf16'):g} TFLOP/s bf16)",
        ),
        ("GPUs per node / NVLink domain", f"{cluster.gpus_per_node} / {cluster.nvlink_domain}"),
        link("intra", cluster.intra),
        link("inter", cluster.inter),
        ("nodes", "as many as the plan needs" if cluster.n_nodes is None else str(cluster.n_nodes)),
        ("price", f"{cluster.price_per_gpu_hour:g} USD per GPU-hour (indicative)"),
        ("source", cluster.source),
    ]
