"""Views of one StepEstimate: a rich terminal report and the stable JSON document.

JSON schema `shardmeter.predict/1` (documented in docs/model.md): inputs (model, cluster,
plan) and outputs (times in s, memory in bytes, rates per s). Keys are only ever added.
"""

from __future__ import annotations

from typing import Any

from rich.console import Console
from rich.table import Table

from shardmeter.estimate.result import MEMORY_COMPONENTS, TIME_COMPONENTS, StepEstimate
from shardmeter.specs.hardware import Cluster, Link
from shardmeter.specs.model import TransformerSpec
from shardmeter.specs.plan import Plan

SCHEMA = "shardmeter.predict/1"

TIME_LABELS: dict[str, str] = {
    "compute": "compute (fwd + bwd)",
    "recompute": "recompute",
    "optimizer": "optimizer step",
    "bubble": "pipeline bubble",
    "tp_comm": "TP/SP collectives (exposed)",
    "pp_comm": "PP send/recv (exposed)",
    "dp_comm": "DP/ZeRO grad reduce (exposed)",
    "fsdp_comm": "ZeRO/FSDP param gather (exposed)",
    "cp_comm": "CP ring exchange (exposed)",
    "ep_comm": "EP all-to-all (exposed)",
}


def _link(link: Link) -> dict[str, Any]:
    return {
        "name": link.name,
        "bandwidth_gbps": link.bandwidth_gbps,
        "latency_us": link.latency_us,
        "efficiency": link.efficiency,
    }


def estimate_to_dict(
    est: StepEstimate, model: TransformerSpec, cluster: Cluster, plan: Plan
) -> dict[str, Any]:
    """The `--json` document of `shardmeter predict`."""
    return {
        "schema": SCHEMA,
        "model": {
            "name": model.name,
            "params_total": model.params_total,
            "params_active": model.params_active,
            "n_layers": model.n_layers,
            "hidden": model.hidden,
            "seq_len": model.seq_len,
        },
        "cluster": {
            "name": cluster.name,
            "accelerator": cluster.accelerator.name,
            "gpus_per_node": cluster.gpus_per_node,
            "nvlink_domain": cluster.nvlink_domain,
            "intra": _link(cluster.intra),
            "inter": _link(cluster.inter),
        },
        "plan": plan.model_dump(),
        "n_gpus": est.n_gpus,
        "step_time_s": est.step_time_s,
        "tokens_per_step": est.tokens_per_step,
        "tokens_per_s": est.tokens_per_s,
        "tokens_per_s_per_gpu": est.tokens_per_s_per_gpu,
        "mfu": est.mfu,
        "hfu": est.hfu,
        "time_breakdown_s": {k: est.time_breakdown[k] for k in TIME_COMPONENTS},
        "time_hidden_s": dict(est.time_hidden),
        "memory_breakdown_bytes": {k: est.memory_breakdown[k] for k in MEMORY_COMPONENTS},
        "memory_bytes": est.memory_bytes,
        "memory_allocated_bytes": est.memory_allocated_bytes,
        "memory_reserved_bytes": est.memory_reserved_bytes,
        "memory_total_bytes": est.memory_total_bytes,
        "memory_detail_bytes": dict(est.memory_detail),
        "hbm_bytes": est.hbm_bytes,
        "memory_headroom_bytes": est.memory_headroom_bytes,
        "fits": est.fits,
        "bottleneck": est.bottleneck,
        "regime": est.regime,
        "comm_bytes_per_gpu": dict(est.comm_bytes),
    }


def plan_summary(plan: Plan) -> str:
    """One line: degrees, batch, sharding, recompute, precision."""
    parts = [f"dp={plan.dp}", f"tp={plan.tp}", f"pp={plan.pp}"]
    if plan.vpp > 1:
        parts.append(f"vpp={plan.vpp}")
    if plan.cp > 1:
        parts.append(f"cp={plan.cp}")
    if plan.ep > 1:
        parts.append(f"ep={plan.ep}")
    if plan.sp:
        parts.append("sp")
    sharding: str = plan.sharding
    if plan.shard_degree is not None:
        sharding += f"(shard {plan.shard_degree})"
    parts += [
        f"micro-batch {plan.micro_batch}",
        f"global batch {plan.global_batch}",
        sharding,
        f"recompute {plan.recompute}",
        plan.precision,
    ]
    return ", ".join(parts)


def plan_label(plan: Plan, batch: bool = True) -> str:
    """A short plan for table cells: ``FSDP dp8 mb1 gb8``, ``ZeRO1 dp4 tp8 pp2v2 sp mb1 gb512
    rc:sel fp8``, ``HSDP8 dp32 mb2`` (``batch=False`` leaves out the global batch)."""
    names = {"none": "DDP", "zero1": "ZeRO1", "zero2": "ZeRO2", "zero3": "FSDP"}
    shard = names[plan.sharding]
    if plan.sharding != "none" and plan.shard_degree not in (None, plan.dp):
        shard = (
            f"HSDP{plan.shard_degree}"
            if plan.sharding == "zero3"
            else f"{shard}/{plan.shard_degree}"
        )
    parts = [shard, f"dp{plan.dp}"]
    parts += [f"{k}{v}" for k, v in (("tp", plan.tp), ("cp", plan.cp), ("ep", plan.ep)) if v > 1]
    if plan.pp > 1:
        parts.append(f"pp{plan.pp}" + (f"v{plan.vpp}" if plan.vpp > 1 else ""))
    if plan.sp:
        parts.append("sp")
    parts.append(f"mb{plan.micro_batch}")
    if batch:
        parts.append(f"gb{plan.global_batch}")
    if plan.recompute != "none":
        parts.append(f"rc:{plan.recompute[:3]}")
    if plan.precision != "bf16":
        parts.append(plan.precision)
    return " ".join(parts)


def render_step(
    console: Console, est: StepEstimate, model: TransformerSpec, cluster: Cluster, plan: Plan
) -> None:
    """Headline numbers, the step-time breakdown and the memory breakdown."""
    acc = cluster.accelerator
    console.print(
        f"[bold]{model.name}[/] ({model.params_total / 1e9:.2f}B params, seq {model.seq_len}) "
        f"on {est.n_gpus} x {acc.name} ({cluster.name}: {cluster.intra.name} in groups of "
        f"{cluster.nvlink_domain}, {cluster.inter.name} across)"
    )
    console.print(f"plan: {plan_summary(plan)}")

    head = Table(show_header=False, box=None, pad_edge=False)
    head.add_column(style="bold")
    head.add_column(justify="right")
    head.add_row("step time", f"{est.step_time_s:.3f} s")
    head.add_row("tokens/s per GPU", f"{est.tokens_per_s_per_gpu:,.0f}")
    head.add_row("tokens/s total", f"{est.tokens_per_s:,.0f}")
    head.add_row("MFU / HFU", f"{est.mfu:.1%} / {est.hfu:.1%}")
    head.add_row("regime", est.regime)
    head.add_row("bottleneck", est.bottleneck)
    verdict = "fits" if est.fits else "[red]OUT OF MEMORY[/]"
    head.add_row(
        "memory",
        f"{est.memory_bytes / 1e9:.1f} / {est.hbm_bytes / 1e9:.0f} GB ({verdict}, "
        f"headroom {est.memory_headroom_bytes / 1e9:+.1f} GB)",
    )
    console.print(head)

    times = Table(title="step time breakdown", title_justify="left")
    times.add_column("component")
    times.add_column("seconds", justify="right")
    times.add_column("share", justify="right")
    for key in TIME_COMPONENTS:
        value = est.time_breakdown[key]
        if value > 0:
            share = value / est.step_time_s
            times.add_row(TIME_LABELS[key], f"{value:.4f}", f"{share:.1%}")
    console.print(times)

    memory = Table(title="memory per GPU", title_justify="left")
    memory.add_column("component")
    memory.add_column("GB", justify="right")
    for key in MEMORY_COMPONENTS:
        memory.add_row(key.replace("_", " "), f"{est.memory_breakdown[key] / 1e9:.2f}")
    detail = est.memory_detail
    if detail:
        for key in ("fragmentation", "cuda_context", "nccl_buffers"):
            memory.add_row(f"  of which {key.replace('_', ' ')}", f"{detail[key] / 1e9:.2f}")
        memory.add_row(
            "allocated (max_memory_allocated)", f"{est.memory_allocated_bytes / 1e9:.2f}"
        )
        memory.add_row("reserved (max_memory_reserved)", f"{est.memory_reserved_bytes / 1e9:.2f}")
        if detail.get("host", 0.0) > 0:
            memory.add_row("host (offloaded, paged)", f"{detail['host'] / 1e9:.2f}")
    memory.add_row("[bold]device total[/]", f"[bold]{est.memory_bytes / 1e9:.2f}[/]")
    console.print(memory)
