"""Plan search on one homogeneous cluster: rank by wall-clock, cost and $/Mtok; time-cost front.

Wall-clock for D tokens is D/(tokens per step / step time) and cost is n·price·wall (design
doc C.10). `FrontPolicy` keeps the K fastest plans that meet the constraints and the
time-cost front of all fitting plans, and prunes a row when its lower-bound wall-clock is
slower than the K-th fastest *and* than the runner-up layout at its GPU count and batch *and*
its lower-bound (time, cost) is dominated by the front, so pruning never changes the top K,
the front, the cheapest plan, or the runner-up the explanation compares with.
"""

from __future__ import annotations

import math
import time
from collections.abc import Sequence
from dataclasses import dataclass, field

import numpy as np
from numpy.typing import NDArray

from shardmeter.estimate.result import TIME_COMPONENTS, StepEstimate
from shardmeter.estimate.step import estimate_step
from shardmeter.search.evaluate import (
    EvalJob,
    PlanTable,
    Progress,
    SearchCounts,
    evaluate_parallel,
    plan_work,
)
from shardmeter.search.explain import explain, infeasibility
from shardmeter.search.options import Constraints, SpaceOptions
from shardmeter.search.pareto import dominated, pareto_front
from shardmeter.search.result import (
    CLOUD_POINTS,
    Candidate,
    IslandChoice,
    PlanSearchResult,
)
from shardmeter.specs.hardware import Cluster
from shardmeter.specs.model import TransformerSpec

FloatArray = NDArray[np.float64]
CLOUD_PER_OFFER = 256  # plans sampled from each evaluated chunk for the plot's cloud


def layout_key(t: PlanTable) -> NDArray[np.int64]:
    """One integer per (tp, pp, vpp, cp, ep): 12 + 12 + 6 + 12 + 12 bits."""
    key = ((t.tp * 4096 + t.pp) * 64 + t.vpp) * 4096 + t.cp
    return np.asarray(key * 4096 + t.ep, dtype=np.int64)


@dataclass
class FrontPolicy:
    """Keep the top-K by wall-clock (meeting the constraints) and the time-cost front."""

    tokens: float
    seq_len: int
    price_per_gpu_hour: float
    top_k: int
    constraints: Constraints
    pool: PlanTable = field(default_factory=PlanTable.empty)
    cloud: list[tuple[FloatArray, FloatArray, NDArray[np.int64]]] = field(default_factory=list)
    _threshold: float = math.inf
    _front_wall: FloatArray = field(default_factory=lambda: np.zeros(0))
    _front_cost: FloatArray = field(default_factory=lambda: np.zeros(0))
    # (GPUs, batch) -> the fastest plan of each of the two fastest layouts there (the winner's
    # runner-up for the explanation is the second of these at the winner's GPUs and batch)
    layouts: dict[tuple[int, int], PlanTable] = field(default_factory=dict)

    def fresh(self) -> FrontPolicy:
        return FrontPolicy(
            self.tokens, self.seq_len, self.price_per_gpu_hour, self.top_k, self.constraints
        )

    def wall_cost(
        self, step_s: FloatArray, n_gpus: NDArray[np.int64] | int, batch: NDArray[np.int64] | int
    ) -> tuple[FloatArray, FloatArray]:
        """Wall-clock for the token budget and its GPU cost (C.10)."""
        wall = self.tokens * step_s / (np.asarray(batch, np.float64) * self.seq_len)
        cost = np.asarray(n_gpus, np.float64) * self.price_per_gpu_hour * wall / 3600.0
        return np.asarray(wall, np.float64), np.asarray(cost, np.float64)

    def meets(self, wall: FloatArray, cost: FloatArray) -> NDArray[np.bool_]:
        ok = np.ones(wall.shape, dtype=np.bool_)
        if self.constraints.deadline_s is not None:
            ok &= wall <= self.constraints.deadline_s
        if self.constraints.budget_usd is not None:
            ok &= cost <= self.constraints.budget_usd
        return ok

    def prunable(self, bound_s: FloatArray, n_gpus: int, global_batch: int) -> NDArray[np.bool_]:
        wall, cost = self.wall_cost(bound_s, n_gpus, global_batch)
        second = self.layouts.get((n_gpus, global_batch))
        runner_up = math.inf
        if second is not None and len(second) >= 2:
            runner_up = float(np.max(self.wall_cost(second.step_time_s, n_gpus, global_batch)[0]))
        useless = (wall > self._threshold) & (wall > runner_up)
        return useless & dominated(wall, cost, self._front_wall, self._front_cost)

    def offer(self, table: PlanTable) -> None:
        if not len(table):
            return
        wall, cost = self.wall_cost(table.step_time_s, table.n_gpus, table.global_batch)
        stride = max(1, len(table) // CLOUD_PER_OFFER)
        self.cloud.append((wall[::stride], cost[::stride], table.n_gpus[::stride]))
        self._keep_layouts(table, self.meets(wall, cost))
        useful = (wall <= self._threshold) | ~dominated(
            wall, cost, self._front_wall, self._front_cost
        )
        self._reduce(PlanTable.concat([self.pool, table.take(useful)]))

    def merge(self, other: FrontPolicy) -> None:
        self.cloud.extend(other.cloud)
        self._reduce(PlanTable.concat([self.pool, other.pool]))
        for table in other.layouts.values():
            wall, cost = self.wall_cost(table.step_time_s, table.n_gpus, table.global_batch)
            self._keep_layouts(table, self.meets(wall, cost))

    def _keep_layouts(self, table: PlanTable, meets: NDArray[np.bool_]) -> None:
        """Update the two fastest layouts (tp, pp, vpp, cp, ep) per (GPUs, batch)."""
        pair = table.n_gpus * (1 << 32) + table.global_batch
        for p in np.unique(pair):
            n, g = int(p >> 32), int(p & ((1 << 32) - 1))
            old = self.layouts.get((n, g), PlanTable.empty())
            sel = meets & (pair == p)
            if len(old) >= 2:
                sel &= table.step_time_s < old.step_time_s.max()
            both = PlanTable.concat([old, table.take(np.flatnonzero(sel))])
            if not len(both):
                continue
            key = layout_key(both)
            order = np.lexsort((both.step_time_s, key))
            first = order[np.r_[True, key[order][1:] != key[order][:-1]]]
            best = first[np.argsort(both.step_time_s[first], kind="stable")[:2]]
            self.layouts[(n, g)] = both.take(best)

    def _reduce(self, pool: PlanTable) -> None:
        wall, cost = self.wall_cost(pool.step_time_s, pool.n_gpus, pool.global_batch)
        ok = np.flatnonzero(self.meets(wall, cost))
        top = ok[np.argsort(wall[ok], kind="stable")[: self.top_k]]
        front = pareto_front(wall, cost)
        keep = np.union1d(top, front)
        self.pool = pool.take(keep)
        wall, cost = wall[keep], cost[keep]
        if top.size >= self.top_k:
            self._threshold = float(np.sort(wall[self.meets(wall, cost)])[self.top_k - 1])
        order = pareto_front(wall, cost)
        self._front_wall, self._front_cost = wall[order], cost[order]


def step_terms(step: StepEstimate) -> dict[str, float]:
    """Step-time breakdown in seconds per million tokens."""
    per = 1e6 / step.tokens_per_step
    return {k: step.time_breakdown[k] * per for k in TIME_COMPONENTS}


def _candidate(
    model: TransformerSpec,
    cluster: Cluster,
    table: PlanTable,
    i: int,
    policy: FrontPolicy,
    overlap_tp: bool,
    framework: str | None = None,
) -> Candidate:
    plan = table.plan(i, overlap_tp, framework)
    step = estimate_step(model, cluster, plan, check_layers=False)
    wall = policy.tokens / step.tokens_per_s
    cost = plan.n_gpus * cluster.price_per_gpu_hour * wall / 3600.0
    return Candidate(
        islands=(IslandChoice(cluster.name, cluster.accelerator.name, plan.n_gpus, plan, step),),
        outer=None,
        n_gpus=plan.n_gpus,
        tokens_per_s=step.tokens_per_s,
        wall_s=wall,
        cost_usd=cost,
        usd_per_mtok=cost / (policy.tokens / 1e6),
        mfu=step.mfu,
        utilization=1.0,
        meets=bool(policy.meets(np.asarray([wall]), np.asarray([cost]))[0]),
    )


def _memory_note(model: TransformerSpec, cluster: Cluster, gpu_counts: Sequence[int]) -> str:
    return (
        f"{model.name} on up to {max(gpu_counts)} × {cluster.accelerator.name} "
        f"({cluster.accelerator.hbm_gb:g} GB) needs more GPUs, more sharding or recompute"
    )


def search_cluster(
    model: TransformerSpec,
    cluster: Cluster,
    gpu_counts: Sequence[int],
    batches: Sequence[int],
    *,
    tokens: float,
    options: SpaceOptions,
    constraints: Constraints,
    top_k: int = 20,
    prune: bool = True,
    jobs: int = 1,
    progress: Progress | None = None,
    on_space: Progress | None = None,
) -> PlanSearchResult:
    """Enumerate, prune and evaluate every inner plan on `cluster` for each GPU count and
    global batch; rank them and build the front. `on_space(n)` receives the space size first."""
    start = time.perf_counter()
    budget = constraints.memory_budget(cluster.accelerator.hbm_bytes)
    work, counts = plan_work(model, cluster, gpu_counts, batches, options, budget)
    if on_space is not None:
        on_space(counts.space)
    if progress is not None:
        progress(counts.pruned_memory)
    policy = FrontPolicy(
        tokens, model.seq_len, cluster.price_per_gpu_hour, max(top_k, 2), constraints
    )
    job = EvalJob(
        model, cluster, options.overlap_tp, budget, prune=prune, framework=options.framework
    )
    counts.add(evaluate_parallel(job, work, policy, jobs, progress))
    return _result(
        model, cluster, policy, counts, options, constraints, top_k, gpu_counts, start, jobs
    )


def _runner_up(policy: FrontPolicy, winner: PlanTable) -> PlanTable | None:
    """The fastest plan with other parallel degrees (tp, pp, vpp, cp, ep) at the winner's GPU
    count and batch: plans that differ only in ZeRO group or micro-batch differ by a hair and
    explain nothing. None when the winner's GPU count has a single layout."""
    best = policy.layouts.get((int(winner.n_gpus[0]), int(winner.global_batch[0])))
    if best is None or len(best) < 2:
        return None
    return best.take(np.asarray([1]))


def _result(
    model: TransformerSpec,
    cluster: Cluster,
    policy: FrontPolicy,
    counts: SearchCounts,
    options: SpaceOptions,
    constraints: Constraints,
    top_k: int,
    gpu_counts: Sequence[int],
    start: float,
    jobs: int,
) -> PlanSearchResult:
    pool = policy.pool
    wall, cost = policy.wall_cost(pool.step_time_s, pool.n_gpus, pool.global_batch)
    meets = policy.meets(wall, cost)
    order = np.flatnonzero(meets)[np.argsort(wall[meets], kind="stable")]

    def cand(i: int) -> Candidate:
        return _candidate(
            model, cluster, pool, int(i), policy, options.overlap_tp, options.framework
        )

    ranked = tuple(cand(i) for i in order[:top_k])
    front_idx = pareto_front(wall, cost)
    front_all = tuple(cand(i) for i in front_idx)
    pareto = tuple(c for c in front_all if c.meets)
    best_cost = min(pareto, key=lambda c: c.cost_usd) if pareto else None
    explanation = None
    runner = _runner_up(policy, pool.take(order[:1])) if order.size else None
    if runner is not None:
        w = cand(order[0])
        r = _candidate(model, cluster, runner, 0, policy, options.overlap_tp, options.framework)
        explanation = explain(w, r, step_terms(w.islands[0].step), step_terms(r.islands[0].step))
    infeasible = None
    if not ranked:
        infeasible = infeasibility(
            front_all, constraints, counts.fitting > 0, _memory_note(model, cluster, gpu_counts)
        )
    cloud_w = np.concatenate([c[0] for c in policy.cloud]) if policy.cloud else np.zeros(0)
    cloud_c = np.concatenate([c[1] for c in policy.cloud]) if policy.cloud else np.zeros(0)
    cloud_n = (
        np.concatenate([c[2] for c in policy.cloud]) if policy.cloud else np.zeros(0, np.int64)
    )
    step = max(1, cloud_w.size // CLOUD_POINTS)
    # The sample plus the whole front, so the plot's Pareto line joins plotted points only.
    cloud_w = np.concatenate([cloud_w[::step], wall[front_idx]])
    cloud_c = np.concatenate([cloud_c[::step], cost[front_idx]])
    cloud_n = np.concatenate([cloud_n[::step], pool.n_gpus[front_idx]])
    gpu_values, cloud_g = np.unique(cloud_n, return_inverse=True)
    stats = counts.stats(start, jobs)
    return PlanSearchResult(
        kind="cluster",
        model=model.name,
        target=cluster.name,
        tokens=policy.tokens,
        constraints=constraints,
        ranked=ranked,
        pareto=pareto,
        best_cost=best_cost,
        explanation=explanation,
        infeasible=infeasible,
        stats=stats,
        cloud_wall_s=cloud_w,
        cloud_cost_usd=cloud_c,
        cloud_group=cloud_g.reshape(-1).astype(np.int64),
        cloud_labels=tuple(f"{int(n)} GPUs" for n in gpu_values),
    )
