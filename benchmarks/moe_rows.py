"""Where the time of the published Mixture-of-Experts runs goes, measured against predicted.

    python benchmarks/moe_rows.py            # the tables, shipped presets, about a second
    python benchmarks/moe_rows.py --cv cv.csv  # Table 1 with each row's held-out error too
    python benchmarks/moe_rows.py --launch-fit  # also Table 7, the fit loss per source

Table 1: every MoE row of the calibration and holdout files (a row is MoE when it has
experts), per layer and micro-batch on the stage the schedule waits on: the measured step
divided by the layer-micro-batches that stage runs, against the prediction split into GPU work
(forward + backward of one layer), the host launches serialised after the dropless dispatch's
host sync, the exposed expert all-to-all and the rest (head, pipeline, optimizer, bubble).

With `--cv` (a CSV that `calibration.py --cv --cv-out` wrote), Table 1 also shows each row's
signed error held out (its source left out of the fit), where the CSV has the row.

Table 4: the 16 H100 of H1 run 1016 in other published layouts of the same model. Megatron-Bridge's
later 16-GPU recipe drops the pipeline for EP 16 (`recipes/qwen/h100/qwen3_moe.py`,
`qwen3_30b_a3b_pretrain_16gpu_h100_bf16_config`: TP 1, PP 1, EP 16, MBS 1, GBS 1024, BF16,
4,096 tokens), and Megatron-Bridge PR #5225 reports it at 299.352 model TFLOP/s per GPU with
HybridEP (one copy per token and node over RDMA, fanned out over NVLink: the model's
`ep_dedup`), and an "overlap-only causal A/B" of 244.039 -> 287.305 (expert all-to-all not
overlapped, then overlapped; its dispatcher is not named, so the model prices that pair with the
plain all-to-all, `overlap_ep` off and on). Model TFLOP/s become tokens/s at Megatron-Bridge's own count for this
model, 23.0 GFLOP per token (the 25.11 table's two columns: 547 / 23,766 on GB200, 214 / 9,299
on B200, 121 / 5,275 on H100).

Table 2: Megatron-Core's interleaved 1F1B schedule replayed event by event (warm-up
`2·(p−1−r) + (v−1)·N` forwards on rank r, then one forward and one backward alternately, then
the cool-down; forwards in the schedule table's order, chunk-major in groups of N micro-batches,
backwards in the same order with the chunks reversed: Megatron-Core `schedules.py`
`get_schedule_table`, `get_pp_rank_microbatches`), with a point-to-point hop of `t_p` seconds on
every edge between ranks (a transfer overlapped with compute, Megatron's `overlap_p2p_comm`):
how much of each hop the step exposes per chunk-micro-batch, for the plan of H1 run 1016
(p = 2, v = 24 one-layer chunks, 32 micro-batches) and for deeper pipelines. The model charges
`2·(p−1)` exposed hops per step (docs/model.md, Communication); the replay exposes
`2·(p·v−1)`, one per edge between the `p·v` virtual stages each way, while a hop is shorter than
a chunk's forward and its backward (m a multiple of p; BENCHMARKS.md, Session 9).

Table 5: every interleaved row with at most two layers per chunk (runs.csv and the holdout
file, with `runs_corrections.csv` applied, as the fit sees them): the seconds per
chunk-micro-batch the prediction misses, (measured step − predicted step) / (m·v). A cost per
chunk-micro-batch (point-to-point hop, schedule host work) would show as the same positive
figure on every such row.

Table 6: the MoE rows' in-sample error with the host cost per kernel launch
(`kernel_launch_us`, the only host cost the model has) set to each value: how far the exposed
host time after the dropless dispatch's sync would have to grow to explain run 1016, and what
that does to the other rows with the same 16 local experts.

Table 7 (`--launch-fit`): the source-weighted fit loss (mean |log error|, the fit's objective,
shipped presets otherwise) at each `kernel_launch_us`, in all and per source, with DeepSpeed's
list-gather shard views (`step.VIEW_OPS_PER_RANK` host ops per rank, priced per launch) and
without them: which sources set the fitted launch cost.

Table 3: Megatron-Core's non-interleaved 1F1B with its blocking point-to-point calls replayed
the same way (a transfer starts when both ranks have posted it): the hops a step exposes,
against the `2·m` the model charges.
"""

from __future__ import annotations

import argparse
import sys
from collections.abc import Callable, Sequence
from dataclasses import dataclass, replace
from pathlib import Path

import numpy as np

import shardmeter.estimate.step as step_module
from shardmeter.calibrate import (
    Calibration,
    RunSpec,
    families_of,
    predict_run,
    predictions,
    read_csv_rows,
    read_rows,
    run_from_row,
    source_weights,
)
from shardmeter.errors import UserInputError
from shardmeter.estimate.compute import (
    BWD_ATTN,
    BWD_ELEMENTWISE,
    BWD_GEMM,
    layer_forward,
    stage_layers,
)
from shardmeter.estimate.plan_arrays import PlanArrays
from shardmeter.paths import shared_path

sys.path.insert(0, str(Path(__file__).resolve().parent))
from calibration import load_runs

HOLDOUT = Path(__file__).resolve().parent / "holdout_runs.csv"
LAUNCH_US = (13.14, 18.14, 25.0, 40.0, 60.0, 80.0)  # Table 6
FIT_LAUNCH_US = (8.0, 10.0, 13.14, 16.0, 18.14, 22.0)  # Table 7


def moe_runs(paths: Sequence[Path]) -> list[RunSpec]:
    """The rows of `paths` whose model has routed experts, as ShardMeter inputs."""
    runs: list[RunSpec] = []
    for path in paths:
        for row in read_rows(path):
            if int(row.get("moe_experts") or 0) <= 0:
                continue
            try:
                runs.append(run_from_row(row))
            except UserInputError as exc:
                print(f"skipped {row.get('run_id')}: {exc}", file=sys.stderr)
    return runs


def held_out_errors(path: str | Path) -> dict[str, float]:
    """Signed held-out error (predicted / measured − 1) per run id of a cross-validation CSV
    (`calibration.py --cv --cv-out`); a missing file or column is a one-line UserInputError."""
    rows = read_csv_rows(path, ("run_id", "signed_error"), "cross-validation CSV")
    out: dict[str, float] = {}
    for row in rows:
        try:
            out[row["run_id"]] = float(row["signed_error"])
        except ValueError:
            raise UserInputError("signed_error", row["signed_error"], "a number") from None
    return out


def per_layer_table(runs: Sequence[RunSpec], held_out: dict[str, float] | None = None) -> None:
    """Table 1: measured and predicted milliseconds per layer-micro-batch of the busiest stage,
    and the in-sample error; with `held_out`, each row's held-out error as well."""
    print("per layer and micro-batch on the critical stage (ms; predicted split: GPU work of one")
    print("MoE layer, time it waits on host launches, exposed expert all-to-all, the rest)")
    head = f"{'run':>5} {'src':4} {'gpu':9} {'plan':24} {'measured':>9} {'predicted':>9}"
    tail = f" {'held out':>8}" if held_out is not None else ""
    print(head + f" {'GPU':>6} {'host':>7} {'EP':>6} {'rest':>6} {'error':>7}" + tail)
    for run in runs:
        est = predict_run(run)
        plan = run.plan
        arrays = PlanArrays.scalar(plan)
        m = plan.global_batch // (plan.dp * plan.micro_batch)
        split = stage_layers(run.model, arrays)
        layers = max(float(split.first), float(split.last), float(split.mid))
        lmb = layers * m
        measured_step = est.tokens_per_step / (run.measured * est.n_gpus)
        moe = layer_forward(run.model, arrays, run.cluster.accelerator, moe=True)
        attn_bwd = (
            BWD_ATTN * moe.attention_s if moe.attention_bwd_s is None else moe.attention_bwd_s
        )
        gpu_bwd = (
            BWD_GEMM * moe.gemm_s + attn_bwd + BWD_ELEMENTWISE * (moe.elementwise_s + moe.cast_s)
        )
        gpu = float(moe.gpu_forward_s) + float(gpu_bwd + moe.quant_bwd_s)
        host = float(moe.forward_s) + float(moe.backward_s) - gpu  # waiting on launches
        ep = est.time_breakdown.get("ep_comm", 0.0) / lmb
        rest = est.step_time_s / lmb - gpu - host - ep
        name = f"tp{plan.tp} pp{plan.pp} v{plan.vpp} ep{plan.ep} mb{plan.micro_batch} m{m}"
        err = est.tokens_per_s_per_gpu / run.measured - 1.0
        print(
            f"{run.run_id:>5} {run.source_id:4} {run.cluster.accelerator.name[:9]:9} {name:24}"
            f" {1e3 * measured_step / lmb:9.2f} {1e3 * est.step_time_s / lmb:9.2f}"
            f" {1e3 * gpu:6.2f} {1e3 * host:7.2f} {1e3 * ep:6.2f} {1e3 * rest:6.2f} {err:+7.1%}"
            + _held_out_cell(held_out, run.run_id)
        )


def _held_out_cell(held_out: dict[str, float] | None, run_id: str) -> str:
    if held_out is None:
        return ""
    return f" {held_out[run_id]:+8.1%}" if run_id in held_out else f" {'-':>8}"


# Model FLOPs per token Megatron-Bridge counts for Qwen3-30B-A3B at 4,096 tokens (its 25.11
# performance table: 547 model TFLOP/s at 23,766 tokens/s per GPU on GB200, 214 at 9,299 on B200).
QWEN3_30B_FLOP_PER_TOKEN = 23.0e9


@dataclass(frozen=True)
class Layout:
    """One published layout of run 1016's model on its 16 H100: the plan cells that differ
    from the row, and the published model TFLOP/s per GPU."""

    name: str
    cells: dict[str, str]
    tflops: float


EP16 = {"pp": "1", "vpp": "1", "ep": "16", "dp": "16", "micro_batch": "1", "global_batch": "1024"}
# Megatron-Bridge recipes/qwen/h100/qwen3_moe.py (16-GPU BF16 recipe) and PR #5225's figures.
LAYOUTS = (
    Layout("25.11 table: pp2 v24 ep8 mb2 fp8", {}, 121.0),
    Layout("ep16 mb1 bf16, A/B: not overlapped", {**EP16, "precision": "bf16"}, 244.039),
    Layout(
        "ep16 mb1 bf16, A/B: EP comm overlapped",
        {**EP16, "precision": "bf16", "overlap_ep": "yes"},
        287.305,
    ),
    Layout("ep16 mb1 bf16, HybridEP", {**EP16, "precision": "bf16", "ep_dedup": "yes"}, 299.352),
)


def layout_rows(row: dict[str, str]) -> list[tuple[Layout, float]]:
    """(layout, predicted model TFLOP/s per GPU) for each of LAYOUTS applied to `row`."""
    out: list[tuple[Layout, float]] = []
    for layout in LAYOUTS:
        est = predict_run(run_from_row({**row, **layout.cells}))
        out.append((layout, est.tokens_per_s_per_gpu * QWEN3_30B_FLOP_PER_TOKEN / 1e12))
    return out


def layout_table(row: dict[str, str]) -> None:
    """Table 4: run 1016's chips and model in each published layout, predicted and published."""
    print("\nH1 run 1016's 16 H100 in other published layouts (model TFLOP/s per GPU at")
    print(f"{QWEN3_30B_FLOP_PER_TOKEN / 1e9:.1f} GFLOP per token)")
    print(f"{'layout':38} {'published':>9} {'predicted':>9} {'error':>7}")
    for layout, predicted in layout_rows(row):
        err = predicted / layout.tflops - 1.0
        print(f"{layout.name:38} {layout.tflops:9.1f} {predicted:9.1f} {err:+7.1%}")


@dataclass(frozen=True)
class Schedule:
    """Pipeline ranks p, chunks per rank v, micro-batches m, chunk group N."""

    p: int
    v: int
    m: int
    n: int


def interleaved_step(
    s: Schedule,
    fwd: Callable[[int, int], float],
    bwd: Callable[[int, int], float],
    hop: float,
    own_sends: bool = False,
) -> float:
    """Seconds of one step of Megatron-Core's interleaved 1F1B schedule: chunk c of rank r
    takes fwd(r, c) / bwd(r, c); every edge between ranks waits `hop` seconds. With
    `own_sends`, a rank also waits for its previous send of the same direction to arrive
    before its next forward (backward): overlap_p2p_comm's `req.wait()` on the send and
    receive handles before each step. The replay orders whole groups of N micro-batches
    (Megatron-Core's interleaved schedule asked for m divisible by the group size), so it
    refuses other m rather than replay a schedule that does not exist."""
    if s.m % s.n:
        raise ValueError(f"m: got {s.m}; a multiple of the group size N = {s.n}")
    table = [
        (i, c) for g in range(0, s.m, s.n) for c in range(s.v) for i in range(g, min(g + s.n, s.m))
    ]
    total = s.m * s.v
    orders: list[list[tuple[bool, int, int]]] = []
    for r in range(s.p):
        warm = min(2 * (s.p - 1 - r) + (s.v - 1) * s.n, total)
        fwds = [(True, i, c) for i, c in table]
        bwds = [(False, i, s.v - 1 - c) for i, c in table]
        order = fwds[:warm]
        for k in range(total - warm):
            order += [fwds[warm + k], bwds[k]]
        orders.append(order + bwds[total - warm :])
    done: dict[tuple[bool, int, int, int], float] = {}
    ptr, clock = [0] * s.p, [0.0] * s.p
    sent = [[0.0, 0.0] for _ in range(s.p)]  # per rank: arrival of its last bwd, fwd send
    last = s.p * s.v - 1
    moved = True
    while moved:
        moved = False
        for r in range(s.p):
            while ptr[r] < len(orders[r]):
                is_fwd, i, c = orders[r][ptr[r]]
                stage = c * s.p + r  # virtual stage: chunk-major over the ranks
                if is_fwd and stage == 0:
                    ready = 0.0
                elif is_fwd or stage != last:
                    src = stage - 1 if is_fwd else stage + 1
                    key = (is_fwd, i, src % s.p, src // s.p)
                    if key not in done:
                        break
                    ready = done[key] + (hop if src % s.p != r else 0.0)
                else:  # the last virtual stage turns its own forward into the backward
                    key = (True, i, r, c)
                    if key not in done:
                        break
                    ready = done[key]
                start = max(clock[r], ready, sent[r][is_fwd] if own_sends else 0.0)
                clock[r] = start + (fwd(r, c) if is_fwd else bwd(r, c))
                done[(is_fwd, i, r, c)] = clock[r]
                if (is_fwd and stage != last) or (not is_fwd and stage != 0):
                    sent[r][is_fwd] = clock[r] + hop
                ptr[r] += 1
                moved = True
    if any(ptr[r] < len(orders[r]) for r in range(s.p)):
        raise RuntimeError("the schedule deadlocked")
    return max(clock)


Transfer = tuple[int, int, str, int]  # sender, receiver, "F"/"B", its number on that edge


def blocking_1f1b_step(p: int, m: int, f: float, b: float, hop: float) -> float:
    """Seconds of one step of Megatron-Core's non-interleaved 1F1B schedule with its blocking
    point-to-point (`forward_backward_pipelining_without_interleaving`: `p−1−r` warm-up forwards
    on rank r, each after `recv_forward` and before `send_forward`; then `send_forward_recv_backward`
    and `send_backward_recv_forward` around each backward; the cool-down's `recv_backward`,
    backward, `send_backward`). A transfer starts once both ranks have posted it and takes `hop`
    seconds; a call returns when all of its transfers have arrived."""
    progs: list[list[tuple[float, list[tuple[str, int, str]]]]] = []
    for r in range(p):
        warm, head, tail = min(p - 1 - r, m), r == 0, r == p - 1
        rf = [] if head else [("recv", r - 1, "F")]
        sf = [] if tail else [("send", r + 1, "F")]
        rb = [] if tail else [("recv", r + 1, "B")]
        sb = [] if head else [("send", r - 1, "B")]
        prog = [(0.0, rf), (f, sf)] * warm  # (compute seconds, then this call)
        steady = m - warm
        if steady > 0:
            prog.append((0.0, rf))
        for i in range(steady):
            prog += [(f, sf + rb), (b, sb + (rf if i < steady - 1 else []))]
        prog += [(0.0, rb), (b, sb)] * warm
        progs.append(prog)
    posted: dict[tuple[Transfer, str], float] = {}
    counts: dict[tuple[int, str, int, str], int] = {}
    pending: list[list[Transfer] | None] = [None] * p
    ptr, clock = [0] * p, [0.0] * p
    moved = True
    while moved:
        moved = False
        for r in range(p):
            while ptr[r] < len(progs[r]):
                compute, calls = progs[r][ptr[r]]
                if pending[r] is None:
                    clock[r] += compute
                    mine: list[Transfer] = []
                    for side, peer, way in calls:
                        n = counts.get((r, side, peer, way), 0)
                        counts[(r, side, peer, way)] = n + 1
                        key = (r, peer, way, n) if side == "send" else (peer, r, way, n)
                        posted[(key, side)] = clock[r]
                        mine.append(key)
                    pending[r] = mine
                keys = pending[r] or []
                if any((k, "send") not in posted or (k, "recv") not in posted for k in keys):
                    break
                for k in keys:
                    clock[r] = max(clock[r], posted[(k, "send")] + hop, posted[(k, "recv")] + hop)
                pending[r] = None
                ptr[r] += 1
                moved = True
    if any(ptr[r] < len(progs[r]) for r in range(p)):
        raise RuntimeError("the schedule deadlocked")
    return max(clock)


def schedule_table(runs: Sequence[RunSpec]) -> None:
    """Table 2: the interleaved schedule with and without point-to-point hops."""
    run = next((r for r in runs if r.run_id == "1016"), None)
    print("\ninterleaved 1F1B replayed (Megatron-Core order); hop = point-to-point seconds")
    print(f"{'plan':26} {'hop/chunk':>9} {'step, no hop':>13} {'+ hops':>9} {'exposed/hop':>12}")
    cases: list[tuple[str, Schedule, float, float, float]] = []
    if run is not None:
        est = predict_run(run)
        arrays = PlanArrays.scalar(run.plan)
        moe = layer_forward(run.model, arrays, run.cluster.accelerator, moe=True)
        f, b = float(moe.forward_s), float(moe.backward_s)
        hop = est.time_hidden.get("pp_comm", 0.0) + est.time_breakdown.get("pp_comm", 0.0)
        m = run.plan.global_batch // (run.plan.dp * run.plan.micro_batch)
        sends = 2.0 * m * run.plan.vpp
        cases.append(("1016: p2 v24 m32 N2", Schedule(2, 24, m, 2), f, b, hop / sends))
    for p, v, m in ((2, 24, 32), (4, 2, 16), (8, 4, 32), (16, 8, 32)):
        cases.append((f"unit: p{p} v{v} m{m} N{p}", Schedule(p, v, m, p), 1.0, 2.0, 0.25))
    for name, sched, f, b, hop in cases:

        def fwd(r: int, c: int, f: float = f) -> float:
            return f

        def bwd(r: int, c: int, b: float = b) -> float:
            return b

        base = interleaved_step(sched, fwd, bwd, 0.0)
        with_hops = interleaved_step(sched, fwd, bwd, hop)
        chunk_mbs = sched.m * sched.v
        exposed = (with_hops - base) / chunk_mbs / hop if hop > 0 else 0.0
        print(f"{name:26} {hop / (f + b):9.3f} {base:13.3f} {with_hops:9.3f} {exposed:12.2f}")
    print("\nnon-interleaved 1F1B, blocking point-to-point; f = 1, b = 2, hop = 0.25")
    print(f"{'plan':12} {'step, no hop':>13} {'+ hops':>9} {'hops exposed':>13} {'2m':>5}")
    for p, m in ((2, 8), (4, 16), (8, 32), (16, 64)):
        base = blocking_1f1b_step(p, m, 1.0, 2.0, 0.0)
        with_hops = blocking_1f1b_step(p, m, 1.0, 2.0, 0.25)
        hops = (with_hops - base) / 0.25
        print(f"{f'p{p} m{m}':12} {base:13.3f} {with_hops:9.3f} {hops:13.1f} {2 * m:5d}")


def missed_per_chunk(run: RunSpec) -> tuple[float, float]:
    """(predicted seconds per chunk-micro-batch, seconds per chunk-micro-batch the prediction
    misses): step / (m·v) and (measured step − predicted step) / (m·v), m micro-batches of v
    chunks on each rank."""
    est = predict_run(run)
    plan = run.plan
    m = plan.global_batch // (plan.dp * plan.micro_batch)
    chunks = m * plan.vpp
    measured_step = est.tokens_per_step / (run.measured * est.n_gpus)
    return est.step_time_s / chunks, (measured_step - est.step_time_s) / chunks


def thin_chunk_table(runs: Sequence[RunSpec]) -> None:
    """Table 5: interleaved rows with at most two layers per chunk, the time per
    chunk-micro-batch the prediction misses."""
    print("\ninterleaved rows with <= 2 layers per chunk: time per chunk-micro-batch missed")
    print(f"{'run':>5} {'src':4} {'model':22} {'gpu':9} {'p':>3} {'v':>3} {'mb':>3}"
          f" {'layers/chunk':>12} {'error':>7} {'chunk ms':>9} {'missed ms':>9}")  # fmt: skip
    for run in runs:
        plan = run.plan
        if plan.pp <= 1 or plan.vpp <= 1 or run.model.n_layers > 2 * plan.pp * plan.vpp:
            continue
        chunk, missed = missed_per_chunk(run)
        err = predict_run(run).tokens_per_s_per_gpu / run.measured - 1.0
        print(
            f"{run.run_id:>5} {run.source_id:4} {run.model.name[:22]:22}"
            f" {run.cluster.accelerator.name[:9]:9} {plan.pp:3d} {plan.vpp:3d}"
            f" {plan.micro_batch:3d} {run.model.n_layers / (plan.pp * plan.vpp):12.2f}"
            f" {err:+7.1%} {1e3 * chunk:9.2f} {1e3 * missed:+9.2f}"
        )


def with_launch(run: RunSpec, launch_us: float) -> RunSpec:
    """`run` with its accelerator's host cost per kernel launch set to `launch_us`."""
    acc = run.cluster.accelerator
    eff = acc.efficiency.model_copy(update={"kernel_launch_us": launch_us})
    cluster = run.cluster.model_copy(
        update={"accelerator": acc.model_copy(update={"efficiency": eff})}
    )
    return replace(run, cluster=cluster)


def launch_table(runs: Sequence[RunSpec]) -> None:
    """Table 6: the MoE rows' in-sample error at each host cost per kernel launch."""
    print("\nMoE rows, in-sample error by host cost per kernel launch (kernel_launch_us)")
    print(f"{'launch us':>9} " + " ".join(f"{r.run_id:>7}" for r in runs))
    for launch_us in LAUNCH_US:
        errs = [
            predict_run(with_launch(r, launch_us)).tokens_per_s_per_gpu / r.measured - 1.0
            for r in runs
        ]
        print(f"{launch_us:9.2f} " + " ".join(f"{e:+7.1%}" for e in errs))


def loss_by_source(runs: Sequence[RunSpec], launch_us: float) -> tuple[float, dict[str, float]]:
    """The fit's objective (source-weighted mean |log error|) under the shipped presets with
    `kernel_launch_us = launch_us`: in all, and each source's share of it."""
    cal = Calibration.start(families_of(runs))
    cal = replace(cal, kernel_launch_us=launch_us)
    measured = np.array([r.measured for r in runs])
    terms = source_weights(runs) * np.abs(np.log(predictions(runs, cal) / measured))
    per: dict[str, float] = {}
    for run, term in zip(runs, terms, strict=True):
        per[run.source_id] = per.get(run.source_id, 0.0) + float(term)
    return float(terms.sum()), per


def launch_fit_table(runs: Sequence[RunSpec]) -> None:
    """Table 7: fit loss in all and per source at each kernel_launch_us, with DeepSpeed's
    list-gather shard views priced per launch (as shipped) and without them."""
    shipped = step_module.VIEW_OPS_PER_RANK
    for label, views in (("with", shipped), ("without", 0.0)):
        step_module.VIEW_OPS_PER_RANK = views
        try:
            rows = [(us, *loss_by_source(runs, us)) for us in FIT_LAUNCH_US]
        finally:
            step_module.VIEW_OPS_PER_RANK = shipped
        sources = sorted(rows[0][2])
        print(f"\nfit loss x 1e4 by kernel_launch_us, {label} DeepSpeed's shard views"
              " (per source: change from the first column)")  # fmt: skip
        print(f"{'launch us':>9} {'all':>6} " + " ".join(f"{s:>5}" for s in sources))
        first = rows[0][2]
        for us, total, per in rows:
            cells = " ".join(f"{1e4 * (per[s] - first[s]):+5.0f}" for s in sources)
            print(f"{us:9.2f} {1e4 * total:6.1f} {cells}")


def main(argv: Sequence[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--cv", metavar="CSV", help="held-out errors (calibration.py --cv-out)")
    parser.add_argument(
        "--launch-fit", action="store_true", help="Table 7: fit loss by kernel_launch_us"
    )
    args = parser.parse_args(argv)
    try:
        held_out = held_out_errors(args.cv) if args.cv else None
    except UserInputError as exc:
        print(f"error: {exc}", file=sys.stderr)
        return 2
    shared = shared_path("calibration", "runs.csv")
    runs = moe_runs([HOLDOUT] if shared is None else [shared, HOLDOUT])
    per_layer_table(runs, held_out)
    schedule_table(runs)
    row = next(r for r in read_rows(HOLDOUT) if r.get("run_id") == "1016")
    layout_table(row)
    paths = [HOLDOUT] if shared is None else [shared, HOLDOUT]
    # every row as the fit and the cross-validation see them (`runs_corrections.csv` applied)
    every = [run for path in paths for run in load_runs(path)[0]]
    thin_chunk_table(every)
    launch_table(runs)
    if args.launch_fit:
        launch_fit_table(every)
    return 0


if __name__ == "__main__":
    sys.exit(main())
