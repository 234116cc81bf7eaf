"""INTELLECT-1 worked example: which WAN bandwidth gives the published compute utilization?

INTELLECT-1 (Jaghouar et al. 2024, arXiv 2412.01152) trained a 10B Llama-3-style model on up
to 14 nodes of 8x H100 (FSDP inside a node, 128 sequences of 8192 tokens per node step) with
DiLoCo across nodes: H = 100 inner steps, int8 pseudo-gradients, ring all-reduce. It reports
96% compute utilization with US-only nodes and 83% across three continents, at 36.2-41.4%
MFU. This script finds the uniform per-link WAN bandwidth at which ShardMeter's predicted
utilization reaches each published figure (the effective per-link rate, after any TCP window
cap), for two inner-step models:

- "ShardMeter": the inner step predicted by the single-island estimator (auto FSDP plan);
- "published MFU": the same step rescaled to the inner MFU implied by the paper
  (end-to-end MFU / compute utilization), so only the WAN model is being tested.

Run: `.venv/bin/python benchmarks/intellect1.py` (prints a Markdown table; about a second).
"""

from __future__ import annotations

import dataclasses
from dataclasses import dataclass
from typing import Any

from shardmeter.estimate.islands import IslandInput, compose, island_inputs
from shardmeter.estimate.wan import DEFAULT_WINDOW_BYTES, ring_allreduce_s, wan_paths
from shardmeter.specs.topology import Topology, load_topology, resolve_model


@dataclass(frozen=True)
class Scenario:
    name: str
    utilization: float  # published compute utilization
    mfu: float  # published end-to-end MFU taken for this scenario
    rtt_ms: float  # assumed round-trip time of the slowest ring edge


SCENARIOS = (
    Scenario("US only", 0.96, 0.414, 60.0),
    Scenario("three continents", 0.83, 0.362, 200.0),
)


def rescaled(isl: IslandInput, inner_mfu: float) -> IslandInput:
    """The island with its inner step stretched to run at `inner_mfu`."""
    step = isl.step
    seconds = step.step_time_s * step.mfu / inner_mfu
    new = dataclasses.replace(
        step,
        step_time_s=seconds,
        mfu=inner_mfu,
        hfu=step.hfu * step.mfu / inner_mfu,
        tokens_per_s=step.tokens_per_step / seconds,
        tokens_per_s_per_gpu=step.tokens_per_step / seconds / step.n_gpus,
    )
    return dataclasses.replace(isl, step=new)


def with_link(topo: Topology, **link: Any) -> Topology:
    """The topology with its uniform WAN link's fields replaced."""
    assert topo.wan.default is not None
    default = topo.wan.default.model_copy(update=link)
    return topo.model_copy(update={"wan": topo.wan.model_copy(update={"default": default})})


# (streams, window MB) per column: Linux's default (one stream, DEFAULT_WINDOW_BYTES), a
# stated 16 MB window, eight such streams, and a window so large the link is the only cap
TCP_COLUMNS = ((None, None), (1, 16.0), (8, 16.0), (1, 1e6))


def tcp_table(base: Topology, inputs: list[IslandInput], n_params: int) -> None:
    """Utilization on a 10 Gbit/s link when TCP windows cap it: streams · window / RTT
    (RFC 7323 sec. 1.1; shardmeter.estimate.wan.link_Bps)."""
    print(
        "\n| scenario | 10 Gbit/s, Linux default (1 stream, "
        f"{DEFAULT_WINDOW_BYTES / 1e6:.2f} MB) | 1 stream x 16 MB | 8 streams x 16 MB "
        "| no window cap |"
    )
    print("|---|---|---|---|---|")
    for sc in SCENARIOS:
        cells = []
        for streams, window in TCP_COLUMNS:
            topo = with_link(
                base, bandwidth_gbit=10.0, latency_ms=sc.rtt_ms, streams=streams, window_mb=window
            )
            est = compose(inputs, wan_paths(topo), n_params, topo.run, topo.run.tokens)
            cells.append(f"{est.utilization:.1%}")
        print(f"| {sc.name} (RTT {sc.rtt_ms:.0f} ms) | " + " | ".join(cells) + " |")


def main() -> None:
    base = load_topology("intellect1")
    model = resolve_model(base.run)
    n_params = model.params_total
    predicted = island_inputs(base, model)
    n = len(predicted)
    exchange_bytes = n_params * base.run.bits / 8
    print(
        f"INTELLECT-1 model: {n_params / 1e9:.2f} B parameters; {n} islands of 8x H100; "
        f"H = {base.run.inner_steps}; int{base.run.bits} pseudo-gradients = "
        f"{exchange_bytes / 1e9:.1f} GB; each node sends {2 * (n - 1) / n * exchange_bytes / 1e9:.1f}"
        " GB per ring all-reduce.\n"
    )
    print(
        "| scenario | published util | inner step | inner MFU | H x step | RTT | "
        "WAN per link for that util | ring all-reduce at it |"
    )
    print("|---|---|---|---|---|---|---|---|")
    for sc in SCENARIOS:
        topo = with_link(base, latency_ms=sc.rtt_ms)
        wan = wan_paths(topo)
        run = topo.run.model_copy(update={"compute_bound_threshold": sc.utilization})
        for label, inputs in (
            ("ShardMeter", predicted),
            ("published MFU", [rescaled(i, sc.mfu / sc.utilization) for i in predicted]),
        ):
            est = compose(inputs, wan, n_params, run, run.tokens, name=topo.name)
            step = inputs[0].step
            gbit = est.min_wan_gbit
            if gbit is None:
                need, ar = "unreachable", "-"
            else:
                # one-way latency per ring step (Thakur et al. 2005 sec. 2): RTT / 2
                lat = sc.rtt_ms * 1e-3 / 2.0
                t = float(ring_allreduce_s(exchange_bytes, n, gbit * 1e9 / 8, lat))
                need, ar = f"{gbit:.2f} Gbit/s", f"{t:.0f} s"
            print(
                f"| {sc.name} ({label}) | {sc.utilization:.0%} | {step.step_time_s:.1f} s | "
                f"{step.mfu:.1%} | {run.inner_steps * step.step_time_s / 60:.1f} min | "
                f"{sc.rtt_ms:.0f} ms | {need} | {ar} |"
            )
    tcp_table(base, predicted, n_params)


if __name__ == "__main__":
    main()
