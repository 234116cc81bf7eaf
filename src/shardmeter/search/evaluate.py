"""Chunked, bounded evaluation of an island's inner-plan space with the vectorized estimator.

Two phases. `plan_work` enumerates shapes per GPU count and global batch, computes for each a
lower bound on step time (compute + recompute + the bubble it implies, from the estimator's own
`compute_lower_bound`) and on memory (the most sharded allowed sync choice), drops shapes that cannot
fit, and groups the rest into rectangular grids (one dp, one batch). `evaluate_work` walks the
grids best bound first, in chunks of about `CHUNK` plans, skips rows a `Policy` proves useless,
and calls `estimate_step_arrays` on the rest: the same formula as `predict`, on arrays.
"""

from __future__ import annotations

import os
import time
from collections.abc import Callable, Sequence
from concurrent.futures import ProcessPoolExecutor
from dataclasses import dataclass, fields
from typing import Any, Protocol, TypeVar

import numpy as np
from numpy.typing import NDArray

from shardmeter.estimate.compute import compute_lower_bound
from shardmeter.estimate.memory import memory_breakdown
from shardmeter.estimate.plan_arrays import SHARDING_CODES
from shardmeter.estimate.step import estimate_step_arrays
from shardmeter.search.options import SpaceOptions
from shardmeter.search.result import SearchStats
from shardmeter.search.space import (
    Shapes,
    SyncChoices,
    enumerate_shapes,
    grid_plans,
    grid_valid,
    make_plan,
    sync_choices,
)
from shardmeter.specs.hardware import Cluster
from shardmeter.specs.model import TransformerSpec
from shardmeter.specs.plan import Plan

FloatArray = NDArray[np.float64]
IntArray = NDArray[np.int64]

CHUNK = 32768  # plans per estimator call: large enough to amortise numpy call overhead,
# small enough that every temporary stays in cache (measured in benchmarks/search_speed.py)

Progress = Callable[[int], None]


@dataclass(frozen=True)
class PlanTable:
    """Evaluated, runnable, memory-fitting plans as parallel columns (one entry per plan)."""

    n_gpus: IntArray
    tp: IntArray
    pp: IntArray
    vpp: IntArray
    cp: IntArray
    ep: IntArray
    dp: IntArray
    micro_batch: IntArray
    recompute: IntArray
    precision: IntArray
    sharding: IntArray
    shard_group: IntArray
    global_batch: IntArray
    step_time_s: FloatArray
    memory_bytes: FloatArray
    mfu: FloatArray

    def __len__(self) -> int:
        return int(self.step_time_s.shape[0])

    @classmethod
    def empty(cls) -> PlanTable:
        cols: dict[str, Any] = {
            f.name: np.zeros(0, np.float64 if f.type == "FloatArray" else np.int64)
            for f in fields(cls)
        }
        return cls(**cols)

    def take(self, index: IntArray | NDArray[np.bool_]) -> PlanTable:
        return PlanTable(**{f.name: getattr(self, f.name)[index] for f in fields(self)})

    @staticmethod
    def concat(tables: Sequence[PlanTable]) -> PlanTable:
        if not tables:
            return PlanTable.empty()
        return PlanTable(
            **{
                f.name: np.concatenate([getattr(t, f.name) for t in tables])
                for f in fields(PlanTable)
            }
        )

    def plan(self, i: int, overlap_tp: bool, framework: str | None = None) -> Plan:
        """Entry i as a Plan (made by `framework` when given)."""
        rows = Shapes(
            n_gpus=int(self.n_gpus[i]),
            tp=self.tp[i : i + 1],
            pp=self.pp[i : i + 1],
            vpp=self.vpp[i : i + 1],
            cp=self.cp[i : i + 1],
            ep=self.ep[i : i + 1],
            dp=self.dp[i : i + 1],
            micro_batch=self.micro_batch[i : i + 1],
            recompute=self.recompute[i : i + 1],
            precision=self.precision[i : i + 1],
        )
        return make_plan(
            rows,
            0,
            int(self.sharding[i]),
            int(self.shard_group[i]),
            int(self.global_batch[i]),
            overlap_tp,
            framework,
        )


@dataclass(frozen=True)
class Work:
    """One rectangular grid: shapes of one GPU count and dp, all sync choices, one batch.

    Rows are sorted by `bound_s`, a lower bound on each row's step time over every sync choice.
    """

    rows: Shapes
    sync: SyncChoices
    global_batch: int
    bound_s: FloatArray

    @property
    def size(self) -> int:
        return len(self.rows) * len(self.sync)


@dataclass
class SearchCounts:
    """How many plans each phase saw (plans = grid entries: shape × sync choice × batch)."""

    space: int = 0  # plans passing the enumeration's divisibility rules
    pruned_memory: int = 0  # shapes whose most-sharded choice already exceeds HBM
    pruned_bound: int = 0  # skipped: their step-time lower bound cannot matter (Policy)
    evaluated: int = 0  # passed to estimate_step_arrays
    runnable: int = 0  # evaluated and valid (grid_valid)
    fitting: int = 0  # runnable and within the memory budget
    eval_cpu_s: float = 0.0  # CPU seconds inside estimate_step_arrays
    eval_wall_s: float = 0.0

    def add(self, other: SearchCounts) -> None:
        for f in fields(self):
            setattr(self, f.name, getattr(self, f.name) + getattr(other, f.name))

    def stats(self, start: float, jobs: int, outer_combinations: int = 0) -> SearchStats:
        """These counts as a search's SearchStats, timed from `start` (a perf_counter reading)."""
        return SearchStats(
            space=self.space,
            pruned_memory=self.pruned_memory,
            pruned_bound=self.pruned_bound,
            evaluated=self.evaluated,
            runnable=self.runnable,
            fitting=self.fitting,
            elapsed_s=time.perf_counter() - start,
            eval_cpu_s=self.eval_cpu_s,
            outer_combinations=outer_combinations,
            jobs=jobs,
        )


PolicyT = TypeVar("PolicyT", bound="Policy")


class Policy(Protocol):
    """Decides which rows may be skipped and which evaluated plans to keep."""

    def prunable(self, bound_s: FloatArray, n_gpus: int, global_batch: int) -> NDArray[np.bool_]:
        """True for rows whose step-time lower bound proves them useless."""
        ...

    def offer(self, table: PlanTable) -> None:
        """Consider freshly evaluated fitting plans."""
        ...

    def merge(self: PolicyT, other: PolicyT) -> None:
        """Fold in what another worker kept."""
        ...

    def fresh(self: PolicyT) -> PolicyT:
        """A copy with the same settings and nothing kept (for a worker process)."""
        ...


def step_time_lower_bound(
    model: TransformerSpec,
    cluster: Cluster,
    rows: Shapes,
    global_batch: int,
    framework: str | None = None,
) -> FloatArray:
    """m·max_s(c_s) + (Σ_s c_s − max_s c_s)/v per row, of compute c_s alone (the estimator's
    `compute_lower_bound`, C.6); communication, the optimizer and overlap interference only
    add to it (C.7)."""
    plans = rows.plan_arrays(global_batch, framework=framework)
    bound = compute_lower_bound(model, plans, cluster.accelerator)
    return np.asarray(np.broadcast_to(bound, (len(rows),)), np.float64)


def memory_lower_bound(
    model: TransformerSpec, cluster: Cluster, rows: Shapes, global_batch: int, opts: SpaceOptions
) -> FloatArray:
    """Least memory of each row over its sync choices: the allowed ZeRO stages sharded over
    all of dp (a smaller HSDP group only holds more; C.3)."""
    best = np.full(len(rows), np.inf)
    for name in opts.sharding:
        code = SHARDING_CODES[name]
        plans = rows.plan_arrays(global_batch, sharding=code, framework=opts.framework)
        mem = memory_breakdown(model, cluster, plans).as_dict()
        total = sum((np.broadcast_to(v, (len(rows),)) for v in mem.values()), np.zeros(len(rows)))
        best = np.minimum(best, total)
    return best


def plan_work(
    model: TransformerSpec,
    cluster: Cluster,
    gpu_counts: Sequence[int],
    batches: Sequence[int],
    opts: SpaceOptions,
    memory_budget: float,
) -> tuple[list[Work], SearchCounts]:
    """Enumerate, bound and group the space; drop rows that cannot fit in `memory_budget`."""
    counts = SearchCounts()
    work: list[Work] = []
    for n in sorted(set(gpu_counts)):
        shapes = enumerate_shapes(model, cluster, n, tuple(batches), opts)
        if not len(shapes):
            continue
        for g in sorted(set(batches)):
            step = shapes.dp * shapes.micro_batch
            at_g = (g % step == 0) & ((shapes.vpp == 1) | ((g // step) % shapes.pp == 0))
            rows = shapes.take(np.flatnonzero(at_g))
            if not len(rows):
                continue
            syncs = {int(dp): sync_choices(int(dp), opts) for dp in np.unique(rows.dp)}
            k_of_row = np.array([len(syncs[int(d)]) for d in rows.dp], dtype=np.int64)
            counts.space += int(k_of_row.sum())
            mem = memory_lower_bound(model, cluster, rows, g, opts)
            fits = mem <= memory_budget
            counts.pruned_memory += int(k_of_row[~fits].sum())
            rows = rows.take(np.flatnonzero(fits))
            if not len(rows):
                continue
            bound = step_time_lower_bound(model, cluster, rows, g, opts.framework)
            for dp, sync in syncs.items():
                sel = np.flatnonzero(rows.dp == dp)
                if sel.size:
                    sel = sel[np.argsort(bound[sel], kind="stable")]
                    work.append(Work(rows.take(sel), sync, g, bound[sel]))
    work.sort(key=lambda w: float(w.bound_s[0]))
    return work, counts


def _evaluate_chunk(
    model: TransformerSpec,
    cluster: Cluster,
    rows: Shapes,
    sync: SyncChoices,
    global_batch: int,
    overlap_tp: bool,
    memory_budget: float,
    counts: SearchCounts,
    framework: str | None = None,
) -> PlanTable:
    """Estimate a (K, R) grid and return its runnable plans that fit in memory."""
    plans = grid_plans(rows, sync, global_batch, overlap_tp, framework)
    valid = grid_valid(model, rows, sync, global_batch)
    t0, c0 = time.perf_counter(), time.process_time()
    est = estimate_step_arrays(model, cluster, plans)
    counts.eval_wall_s += time.perf_counter() - t0
    counts.eval_cpu_s += time.process_time() - c0
    shape = valid.shape
    mem = np.broadcast_to(est.memory_bytes, shape)
    ok = valid & (mem <= memory_budget)
    counts.evaluated += valid.size
    counts.runnable += int(valid.sum())
    counts.fitting += int(ok.sum())
    kk, rr = np.nonzero(ok)

    def at(a: NDArray[np.float64]) -> FloatArray:
        return np.asarray(np.broadcast_to(a, shape)[kk, rr], dtype=np.float64)

    step = at(est.step_time_s)
    peak = at(est.peak_flops_per_gpu) * at(est.n_gpus)
    return PlanTable(
        n_gpus=np.full(kk.size, rows.n_gpus, dtype=np.int64),
        tp=rows.tp[rr],
        pp=rows.pp[rr],
        vpp=rows.vpp[rr],
        cp=rows.cp[rr],
        ep=rows.ep[rr],
        dp=rows.dp[rr],
        micro_batch=rows.micro_batch[rr],
        recompute=rows.recompute[rr],
        precision=rows.precision[rr],
        sharding=sync.sharding[kk],
        shard_group=sync.shard_group[kk],
        global_batch=np.full(kk.size, global_batch, dtype=np.int64),
        step_time_s=step,
        memory_bytes=at(mem),
        mfu=at(est.model_flops_per_step) / (step * peak),
    )


@dataclass(frozen=True)
class EvalJob:
    """Everything one worker needs to evaluate a list of grids."""

    model: TransformerSpec
    cluster: Cluster
    overlap_tp: bool
    memory_budget: float
    chunk: int = CHUNK
    prune: bool = True
    framework: str | None = None  # features of the plans (SpaceOptions.framework)


def evaluate_work(
    job: EvalJob, work: Sequence[Work], policy: Policy, progress: Progress | None = None
) -> SearchCounts:
    """Evaluate grids in order, chunk by chunk, skipping rows the policy can prune."""
    counts = SearchCounts()
    for w in work:
        k = len(w.sync)
        per_chunk = max(1, job.chunk // k)
        for start in range(0, len(w.rows), per_chunk):
            idx = np.arange(start, min(start + per_chunk, len(w.rows)))
            bound = w.bound_s[idx]
            if job.prune:
                skip = policy.prunable(bound, w.rows.n_gpus, w.global_batch)
                counts.pruned_bound += int(skip.sum()) * k
                idx = idx[~skip]
            if idx.size:
                table = _evaluate_chunk(
                    job.model,
                    job.cluster,
                    w.rows.take(idx),
                    w.sync,
                    w.global_batch,
                    job.overlap_tp,
                    job.memory_budget,
                    counts,
                    job.framework,
                )
                policy.offer(table)
            if progress is not None:
                progress(int(bound.size) * k)
    return counts


def _worker(args: tuple[EvalJob, list[Work], PolicyT]) -> tuple[SearchCounts, PolicyT]:
    job, work, policy = args
    counts = evaluate_work(job, work, policy)
    return counts, policy


def evaluate_parallel(
    job: EvalJob,
    work: Sequence[Work],
    policy: PolicyT,
    jobs: int,
    progress: Progress | None = None,
) -> SearchCounts:
    """`evaluate_work` on `jobs` processes (grids dealt round-robin in bound order, so each
    worker starts with promising plans); results merge into `policy`. jobs ≤ 0: all cores."""
    n_jobs = (os.cpu_count() or 1) if jobs <= 0 else jobs
    if n_jobs <= 1 or len(work) < 2:
        return evaluate_work(job, work, policy, progress)
    parts = [list(work[i::n_jobs]) for i in range(n_jobs)]
    counts = SearchCounts()
    with ProcessPoolExecutor(max_workers=n_jobs) as pool:
        for part_counts, part_policy in pool.map(
            _worker, [(job, p, policy.fresh()) for p in parts if p]
        ):
            counts.add(part_counts)
            policy.merge(part_policy)
            if progress is not None:
                progress(part_counts.evaluated + part_counts.pruned_bound)
    return counts
