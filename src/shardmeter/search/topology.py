"""Plan search across islands: which islands, how many GPUs each, their inner plans, the outer mode.

Factorisation (Sailor/Metis-style, design doc C.11): the outer composition of C.9 gets worse
when any island's inner step gets slower (sync, DiLoCo and Streaming pace on max_i T_i; async
rounds are max(H·T_i, exchange)), and the GPU cost of a fixed allocation grows with wall time,
so for each (island, GPU count, batch) only the fastest fitting inner plan can be part of a
best or Pareto-optimal plan. Each island type gets one inner search (`BestPolicy`); then every
island subset × GPU counts (node multiples) × outer mode × H × bits × fragments × τ is composed
on arrays with `estimate.outer.outer_round` and priced, failures included, by
`estimate.islands.compose_arrays`, the formula `predict_topology` evaluates for one topology,
so the ranking counts failure losses.
Caveat: with an overloaded async parameter server a faster small island can take server
capacity from larger ones; that case is not covered by the factorisation.
"""

from __future__ import annotations

import itertools
import math
import time
from collections.abc import Callable, Hashable, Sequence
from dataclasses import dataclass, field, replace
from typing import Any

import numpy as np
from numpy.typing import ArrayLike, NDArray

from shardmeter.estimate.churn import island_mtbf_s
from shardmeter.estimate.islands import (
    IslandInput,
    TopologyEstimate,
    compose,
    compose_arrays,
    run_payload,
    schedule_of,
)
from shardmeter.estimate.outer import outer_opt_seconds, outer_round
from shardmeter.estimate.payload import Payload, resolve_payload
from shardmeter.estimate.result import StepEstimate
from shardmeter.estimate.step import estimate_step
from shardmeter.estimate.wan import WanPaths, wan_paths
from shardmeter.search.evaluate import (
    EvalJob,
    PlanTable,
    Progress,
    SearchCounts,
    Work,
    evaluate_parallel,
    plan_work,
)
from shardmeter.search.explain import explain, infeasibility
from shardmeter.search.options import Constraints, OuterOptions, SpaceOptions
from shardmeter.search.pareto import pareto_front
from shardmeter.search.result import (
    CLOUD_POINTS,
    Candidate,
    Infeasibility,
    IslandChoice,
    OuterChoice,
    PlanSearchResult,
)
from shardmeter.specs.hardware import Cluster
from shardmeter.specs.model import TransformerSpec
from shardmeter.specs.plan import Plan
from shardmeter.specs.topology import OuterSpec, Topology, resolve_cluster, resolve_model

FloatArray = NDArray[np.float64]
IntArray = NDArray[np.int64]
DEFAULT_BATCH_PER_GPU = 8
MODE_LABELS = {"single": "one island", "sync": "sync DP over the WAN"}


@dataclass
class BestPolicy:
    """Keep the fastest fitting plan per (GPU count, global batch); prune rows whose lower
    bound is already slower than it."""

    best: dict[tuple[int, int], float] = field(default_factory=dict)
    pool: PlanTable = field(default_factory=PlanTable.empty)

    def fresh(self) -> BestPolicy:
        return BestPolicy()

    def prunable(self, bound_s: FloatArray, n_gpus: int, global_batch: int) -> NDArray[np.bool_]:
        return np.asarray(bound_s > self.best.get((n_gpus, global_batch), math.inf))

    def offer(self, table: PlanTable) -> None:
        if not len(table):
            return
        self._reduce(PlanTable.concat([self.pool, table]))

    def merge(self, other: BestPolicy) -> None:
        self._reduce(PlanTable.concat([self.pool, other.pool]))

    def _reduce(self, pool: PlanTable) -> None:
        key = pool.n_gpus * (1 << 32) + pool.global_batch
        order = np.lexsort((pool.step_time_s, key))
        first = np.ones(order.size, dtype=np.bool_)
        first[1:] = key[order][1:] != key[order][:-1]
        self.pool = pool.take(order[first])
        self.best = {
            (int(n), int(g)): float(t)
            for n, g, t in zip(
                self.pool.n_gpus, self.pool.global_batch, self.pool.step_time_s, strict=True
            )
        }


@dataclass(frozen=True)
class IslandOptions:
    """One island's resolved cluster and its fastest inner plan per (GPUs, batch per GPU)."""

    name: str
    cluster: Cluster
    gpu_counts: tuple[int, ...]
    plans: dict[tuple[int, int], Plan]  # (GPUs, batch per GPU) -> fastest fitting plan
    steps: dict[tuple[int, int], StepEstimate]  # ... and its estimate
    mtbf_hours: float | None = None  # the island's own MTBF (else the run's failure settings)


def island_gpu_counts(cluster: Cluster, n_nodes: int, cap: int | None) -> tuple[int, ...]:
    """Whole-node GPU counts up to the island's size (and the per-island cap)."""
    gpn = cluster.gpus_per_node
    limit = n_nodes * gpn if cap is None else min(n_nodes * gpn, cap)
    return tuple(k * gpn for k in range(1, n_nodes + 1) if k * gpn <= limit)


def batches_per_gpu(topo: Topology, outer: OuterOptions) -> tuple[int, ...]:
    """Sequences per GPU per inner step: the options, else those the file implies."""
    if outer.batch_per_gpu:
        return tuple(sorted(set(outer.batch_per_gpu)))
    found = set()
    for i, island in enumerate(topo.islands):
        batch = island.global_batch or topo.run.global_batch
        gpus = island.n_nodes * resolve_cluster(island, i).gpus_per_node
        if batch is not None and batch % gpus == 0:
            found.add(batch // gpus)
    return tuple(sorted(found)) or (DEFAULT_BATCH_PER_GPU,)


def _cluster_key(cluster: Cluster) -> str:
    return cluster.model_copy(update={"name": "", "n_nodes": None}).model_dump_json()


def inner_searches(
    model: TransformerSpec,
    topo: Topology,
    per_gpu: Sequence[int],
    options: SpaceOptions,
    constraints: Constraints,
    prune: bool,
    jobs: int,
    progress: Progress | None,
    on_space: Progress | None,
    counts: SearchCounts,
) -> list[IslandOptions]:
    """Fastest fitting inner plan of every island type for each GPU count and batch. All
    spaces are enumerated first, so `on_space` gets the total before evaluation starts."""
    clusters = [resolve_cluster(spec, i) for i, spec in enumerate(topo.islands)]
    gpu_sets = [
        island_gpu_counts(c, spec.n_nodes, constraints.max_gpus_per_island)
        for c, spec in zip(clusters, topo.islands, strict=True)
    ]
    pending: dict[str, tuple[EvalJob, list[Work]]] = {}
    for cluster, gpus in zip(clusters, gpu_sets, strict=True):
        key = _cluster_key(cluster)
        budget = constraints.memory_budget(cluster.accelerator.hbm_bytes)
        job, work = pending.get(
            key,
            (
                EvalJob(
                    model,
                    cluster,
                    options.overlap_tp,
                    budget,
                    prune=prune,
                    framework=options.framework,
                ),
                [],
            ),
        )
        done = {w.rows.n_gpus for w in work}
        for n in gpus:
            if n in done:
                continue
            w, c = plan_work(model, cluster, [n], [b * n for b in per_gpu], options, budget)
            counts.add(c)
            work.extend(w)
            if progress is not None:
                progress(c.pruned_memory)
        pending[key] = (job, work)
    if on_space is not None:
        on_space(counts.space)
    policies: dict[str, BestPolicy] = {}
    for key, (job, work) in pending.items():
        policies[key] = BestPolicy()
        counts.add(evaluate_parallel(job, work, policies[key], jobs, progress))
    islands: list[IslandOptions] = []
    for spec, cluster, gpus in zip(topo.islands, clusters, gpu_sets, strict=True):
        pool = policies[_cluster_key(cluster)].pool
        plans: dict[tuple[int, int], Plan] = {}
        steps: dict[tuple[int, int], StepEstimate] = {}
        for j in range(len(pool)):
            n, g = int(pool.n_gpus[j]), int(pool.global_batch[j])
            if n in gpus and g % n == 0 and g // n in per_gpu:
                plan = pool.plan(j, options.overlap_tp, options.framework)
                plans[(n, g // n)] = plan
                steps[(n, g // n)] = estimate_step(model, cluster, plan, check_layers=False)
        islands.append(IslandOptions(spec.name, cluster, gpus, plans, steps, spec.mtbf_hours))
    return islands


@dataclass(frozen=True)
class OuterGrid:
    """Outer settings of one mode, flattened (length S each)."""

    inner_steps: IntArray
    bits: IntArray
    fragments: IntArray
    overlap_steps: IntArray


def outer_grid(mode: str, run: OuterSpec, outer: OuterOptions) -> OuterGrid:
    """H × q (× P × τ for streaming) allowed for `mode`; sync has one setting."""
    hs = outer.inner_steps or (run.inner_steps,)
    qs = outer.bits or (run.bits,)
    if mode in ("sync", "single"):
        combos: list[tuple[int, int, int, int]] = [(1, int(run.grad_bits), 1, 0)]
    elif mode == "streaming":
        taus = outer.overlap_steps or (max(run.overlap_steps, 1),)
        listed = run.fragments if isinstance(run.fragments, list) else None
        ps = (len(listed),) if listed else outer.fragments
        first = 1 + max(f.offset for f in listed) if listed else 1
        combos = [
            (h, q, p, t)
            for h, q, p, t in itertools.product(hs, qs, ps, taus)
            if t <= h and h >= first
        ]
    else:
        combos = [(h, q, 1, run.overlap_steps) for h, q in itertools.product(hs, qs)]
        combos = [c for c in combos if c[3] <= c[0]]
    arr = np.asarray(combos, dtype=np.int64).reshape(-1, 4)
    return OuterGrid(arr[:, 0], arr[:, 1], arr[:, 2], arr[:, 3])


@dataclass(frozen=True)
class Block:
    """Composed plans of one island subset, batch per GPU and mode: (C GPU combos, S settings)."""

    members: tuple[int, ...]  # island indices
    gpus: IntArray  # (C, k) GPUs per member
    per_gpu: int
    mode: str
    grid: OuterGrid
    wall_s: FloatArray  # (C, S)
    cost_usd: FloatArray
    tokens_per_s: FloatArray
    utilization: FloatArray
    mfu: FloatArray


@dataclass(frozen=True)
class Combos:
    """Every GPU-count combination of an island subset at one batch per GPU (C rows, k cols)."""

    members: tuple[int, ...]
    per_gpu: int
    gpus: IntArray  # (C, k)
    inner_s: FloatArray  # fastest inner step of each member at its GPU count
    backward_s: FloatArray  # ... and its last micro-batch's backward (overlap window)
    buckets: FloatArray  # layers per pipeline stage
    mfu: FloatArray
    outer_opt_s: FloatArray  # full outer-optimizer step per island (C.2 roofline)
    price: FloatArray  # (k,) USD per GPU-hour
    mtbf_hours: FloatArray  # (k,) each member's own MTBF (inf: the run's failure settings)


def combos(
    members: tuple[int, ...], islands: Sequence[IslandOptions], model: TransformerSpec, per_gpu: int
) -> Combos | None:
    """The cross product of each member's GPU counts that have a fitting plan."""
    opts = [[n for n in islands[i].gpu_counts if (n, per_gpu) in islands[i].steps] for i in members]
    if any(not o for o in opts):
        return None
    index = np.stack(
        [g.reshape(-1) for g in np.meshgrid(*[np.arange(len(o)) for o in opts], indexing="ij")],
        axis=-1,
    )

    def column(j: int, values: list[float]) -> FloatArray:
        return np.asarray(values, dtype=np.float64)[index[:, j]]

    steps = [
        [islands[i].steps[(n, per_gpu)] for n in o] for i, o in zip(members, opts, strict=True)
    ]
    k = range(len(members))
    gpus = np.stack([np.asarray(opts[j], dtype=np.int64)[index[:, j]] for j in k], axis=-1)
    accs = [islands[i].cluster.accelerator for i in members]
    hbm = np.array([a.hbm_bytes_per_s for a in accs])
    return Combos(
        members=members,
        per_gpu=per_gpu,
        gpus=gpus,
        inner_s=np.stack([column(j, [st.step_time_s for st in steps[j]]) for j in k], axis=-1),
        backward_s=np.stack(
            [column(j, [st.backward_window_s for st in steps[j]]) for j in k], axis=-1
        ),
        buckets=np.stack(
            [
                column(j, [max(1, model.n_layers // islands[i].plans[(n, per_gpu)].pp) for n in o])
                for j, (i, o) in enumerate(zip(members, opts, strict=True))
            ],
            axis=-1,
        ),
        mfu=np.stack([column(j, [st.mfu for st in steps[j]]) for j in k], axis=-1),
        outer_opt_s=outer_opt_seconds(model.params_total, gpus.astype(np.float64), hbm),
        price=np.array([islands[i].cluster.price_per_gpu_hour for i in members]),
        mtbf_hours=np.array(
            [math.inf if islands[i].mtbf_hours is None else islands[i].mtbf_hours for i in members]
        ),
    )


def dense_overheads(run: OuterSpec, model: TransformerSpec, bits: NDArray[Any]) -> FloatArray:
    """Bytes of HeLoCo's push beyond N·q/8 (header, tag) for a dense payload of each `bits`:
    the codec, and so the header, changes with q (`payload.push_bytes`)."""
    if run.payload.kind != "dense":
        return np.zeros(len(bits))
    return np.array(
        [resolve_payload(run.payload, float(b), model).push_overhead_bytes for b in bits]
    )


def compose_block(
    cb: Combos,
    wan: WanPaths,
    model: TransformerSpec,
    run: OuterSpec,
    mode: str,
    grid: OuterGrid,
    tokens: float,
    payload: Payload,
    grid_overheads: FloatArray,
) -> Block:
    """Every GPU-count combination under every setting in `grid`, composed, priced and charged
    for failures by `estimate.islands.compose_arrays`, the formula `compose` evaluates for one
    topology (C.9, C.10). A dense payload takes the grid's bits, and `grid_overheads` (bytes,
    one per grid bits: `dense_overheads`) its message overhead at each."""
    outer_mode = "sync" if mode == "single" else mode
    dense = payload.kind == "dense"
    bits = grid.bits[None, :] if dense else payload.bits_per_param
    overhead: ArrayLike = grid_overheads[None, :] if dense else payload.push_overhead_bytes
    if outer_mode == "sync" and dense:
        bits = float(run.grad_bits)
    window = cb.backward_s if run.backward_overlap else 0.0 * cb.backward_s
    rnd = outer_round(
        outer_mode,  # type: ignore[arg-type]
        cb.inner_s[:, None, :],
        wan,
        model.params_total,
        inner_steps=grid.inner_steps[None, :],
        bits=bits,
        gathered=payload.gathered,
        collective_rounds=payload.rounds,
        outer_opt_s=cb.outer_opt_s[:, None, :],
        reduce=run.reduce,
        overlap=run.outer_overlap,
        fragments=grid.fragments[None, :],
        schedule=schedule_of(run) if outer_mode == "streaming" else None,
        overlap_steps=grid.overlap_steps[None, :],
        backward_s=window[:, None, :],
        buckets=cb.buckets[:, None, :],
        balance=run.balance_steps,
        exchange=run.exchange,
        link_slots=run.link_slots,
        # overlapped turns: the search by the mean-value analysis, the chosen plan by the
        # schedule (estimate.islands._round)
        turn_schedule=run.exchange == "blocking",
        push_overhead_bytes=overhead,
        pull_bytes=payload.pull_bytes,
    )
    gpus = cb.gpus[:, None, :]
    run_s = compose_arrays(
        rnd,
        gpus * cb.per_gpu * model.seq_len,
        gpus,
        cb.price,
        island_mtbf_s(run.failures, gpus.astype(np.float64), cb.mtbf_hours),
        run.failures,
        tokens,
        asynchronous=outer_mode == "async",
    )
    n_all = gpus.sum(axis=-1).astype(np.float64)
    mfu_total = (run_s.utilization * cb.mfu[:, None, :] * gpus).sum(axis=-1) / n_all
    return Block(
        cb.members,
        cb.gpus,
        cb.per_gpu,
        mode,
        grid,
        run_s.wall_s,
        run_s.cost_usd,
        run_s.tokens_per_s,
        run_s.total_utilization,
        mfu_total,
    )


def _meets(wall: FloatArray, cost: FloatArray, con: Constraints) -> NDArray[np.bool_]:
    ok = np.isfinite(wall)
    if con.deadline_s is not None:
        ok &= wall <= con.deadline_s
    if con.budget_usd is not None:
        ok &= cost <= con.budget_usd
    return ok


def _island_inputs(
    model: TransformerSpec,
    islands: Sequence[IslandOptions],
    members: Sequence[int],
    gpus: Sequence[int],
    per_gpu: int,
) -> list[IslandInput]:
    out = []
    for i, n in zip(members, gpus, strict=True):
        isl = islands[i]
        key = (int(n), per_gpu)
        plan = isl.plans[key]
        layers = max(1, model.n_layers // plan.pp)
        base = IslandInput.on(isl.name, isl.cluster, plan, isl.steps[key], buckets=layers)
        out.append(replace(base, mtbf_hours=isl.mtbf_hours))
    return out


def _settings(run: OuterSpec, block: Block, s: int) -> OuterSpec:
    mode = "sync" if block.mode == "single" else block.mode
    return run.model_copy(
        update={
            "mode": mode,
            "inner_steps": int(block.grid.inner_steps[s]) if mode != "sync" else run.inner_steps,
            "bits": int(block.grid.bits[s]) if mode != "sync" else run.bits,
            "fragments": int(block.grid.fragments[s]),
            "overlap_steps": int(block.grid.overlap_steps[s]),
        }
    )


def _candidate(
    islands: Sequence[IslandOptions],
    block: Block,
    c: int,
    s: int,
    tokens: float,
    con: Constraints,
) -> Candidate:
    gpus = [int(n) for n in block.gpus[c]]
    choices = tuple(
        IslandChoice(
            islands[i].name,
            islands[i].cluster.accelerator.name,
            n,
            islands[i].plans[(n, block.per_gpu)],
            islands[i].steps[(n, block.per_gpu)],
        )
        for i, n in zip(block.members, gpus, strict=True)
    )
    wall, cost = float(block.wall_s[c, s]), float(block.cost_usd[c, s])
    return Candidate(
        islands=choices,
        outer=OuterChoice(
            block.mode,
            int(block.grid.inner_steps[s]),
            int(block.grid.bits[s]),
            int(block.grid.fragments[s]),
            int(block.grid.overlap_steps[s]),
        ),
        n_gpus=sum(gpus),
        tokens_per_s=float(block.tokens_per_s[c, s]),
        wall_s=wall,
        cost_usd=cost,
        usd_per_mtok=cost / (tokens / 1e6),
        mfu=float(block.mfu[c, s]),
        utilization=float(block.utilization[c, s]),
        meets=bool(_meets(np.asarray([wall]), np.asarray([cost]), con)[0]),
    )


def compose_candidate(
    model: TransformerSpec,
    islands: Sequence[IslandOptions],
    wan_all: WanPaths,
    run: OuterSpec,
    block: Block,
    c: int,
    s: int,
    tokens: float,
    name: str,
) -> TopologyEstimate:
    """The full TopologyEstimate of one composed plan (islands' own compose)."""
    gpus = [int(n) for n in block.gpus[c]]
    inputs = _island_inputs(model, islands, block.members, gpus, block.per_gpu)
    wan = wan_all.subset(list(block.members))
    settings = _settings(run, block, s)
    return compose(
        inputs,
        wan,
        model.params_total,
        settings,
        tokens,
        name=name,
        payload=run_payload(settings, model),
    )


def _terms(est: TopologyEstimate) -> dict[str, float]:
    """Wall seconds per million tokens by phase (GPU-weighted time shares × wall)."""
    per = est.wall_s / (est.tokens / 1e6)
    return {k: v * per for k, v in est.time_shares.items()}


def search_topology(
    topo: Topology,
    *,
    options: SpaceOptions,
    outer: OuterOptions,
    constraints: Constraints,
    tokens: float | None = None,
    top_k: int = 20,
    prune: bool = True,
    jobs: int = 1,
    progress: Progress | None = None,
    on_space: Progress | None = None,
) -> PlanSearchResult:
    """Search island subsets, GPUs per island, inner plans and outer settings of `topo`."""
    start = time.perf_counter()
    model = resolve_model(topo.run)
    budget_tokens = float(tokens if tokens is not None else topo.run.tokens)
    wan_all = wan_paths(topo)
    per_gpu = batches_per_gpu(topo, outer)
    counts = SearchCounts()
    islands = inner_searches(
        model, topo, per_gpu, options, constraints, prune, jobs, progress, on_space, counts
    )
    blocks: list[Block] = []
    n_isl = len(islands)
    grids = {mode: outer_grid(mode, topo.run, outer) for mode in ("single", *outer.modes)}
    payload = run_payload(topo.run, model)
    overheads = {m: dense_overheads(topo.run, model, g.bits) for m, g in grids.items()}
    for size in range(1, n_isl + 1):
        for members in itertools.combinations(range(n_isl), size):
            wan = wan_all.subset(list(members))
            modes = ("single",) if size == 1 else outer.modes
            for b in per_gpu:
                cb = combos(members, islands, model, b)
                if cb is None:
                    continue
                for mode in modes:
                    if grids[mode].inner_steps.size:
                        blocks.append(
                            compose_block(
                                cb,
                                wan,
                                model,
                                topo.run,
                                mode,
                                grids[mode],
                                budget_tokens,
                                payload,
                                overheads[mode],
                            )
                        )
    return _topology_result(
        topo,
        model,
        islands,
        wan_all,
        blocks,
        counts,
        constraints,
        budget_tokens,
        top_k,
        start,
        jobs,
    )


def _topology_result(
    topo: Topology,
    model: TransformerSpec,
    islands: Sequence[IslandOptions],
    wan_all: WanPaths,
    blocks: Sequence[Block],
    counts: SearchCounts,
    con: Constraints,
    tokens: float,
    top_k: int,
    start: float,
    jobs: int,
) -> PlanSearchResult:
    if not blocks:
        return _no_fit(topo, model, counts, con, tokens, start, jobs)
    wall = np.concatenate([b.wall_s.reshape(-1) for b in blocks])
    cost = np.concatenate([b.cost_usd.reshape(-1) for b in blocks])
    sizes = np.array([b.wall_s.size for b in blocks])
    offsets = np.concatenate(([0], np.cumsum(sizes)))

    def locate(flat: int) -> tuple[Block, int, int]:
        k = int(np.searchsorted(offsets, flat, side="right") - 1)
        blk = blocks[k]
        c, s = divmod(flat - int(offsets[k]), blk.wall_s.shape[1])
        return blk, c, s

    def cand(flat: int) -> Candidate:
        blk, c, s = locate(int(flat))
        return _candidate(islands, blk, c, s, tokens, con)

    meets = _meets(wall, cost, con)
    ok = np.flatnonzero(meets)
    order = ok[np.argsort(wall[ok], kind="stable")]
    ranked = tuple(cand(i) for i in order[:top_k])
    finite = np.flatnonzero(np.isfinite(wall))
    front_idx = finite[pareto_front(wall[finite], cost[finite])]
    front_all = tuple(cand(i) for i in front_idx)
    pareto = tuple(c for c in front_all if c.meets)
    best_cost = min(pareto, key=lambda c: c.cost_usd) if pareto else None
    top_est = None
    explanation = None
    if order.size:
        blk, c, s = locate(int(order[0]))
        top_est = compose_candidate(model, islands, wan_all, topo.run, blk, c, s, tokens, topo.name)

        def layout(flat: int) -> Hashable:
            b, c, _ = locate(flat)
            return (b.mode, b.members, tuple(b.gpus[c]), b.per_gpu)

        runner = _runner_up(order, layout)
        if runner is not None:
            rblk, rc, rs = locate(int(runner))
            r_est = compose_candidate(
                model, islands, wan_all, topo.run, rblk, rc, rs, tokens, topo.name
            )
            explanation = explain(ranked[0], cand(runner), _terms(top_est), _terms(r_est))
    infeasible = None
    if not ranked:
        infeasible = infeasibility(
            front_all, con, bool(finite.size), f"{model.name} on {topo.name}"
        )
    stats = counts.stats(start, jobs, outer_combinations=int(wall.size))
    stride = max(1, wall.size // CLOUD_POINTS)  # a sample, plus the front (the plot's line)
    labels = tuple(dict.fromkeys(b.mode for b in blocks))
    group = np.concatenate(
        [np.full(b.wall_s.size, labels.index(b.mode), dtype=np.int64) for b in blocks]
    )
    return PlanSearchResult(
        kind="topology",
        model=model.name,
        target=topo.name,
        tokens=tokens,
        constraints=con,
        ranked=ranked,
        pareto=pareto,
        best_cost=best_cost,
        explanation=explanation,
        infeasible=infeasible,
        stats=stats,
        top_estimate=top_est,
        cloud_wall_s=np.concatenate([wall[finite][::stride], wall[front_idx]]),
        cloud_cost_usd=np.concatenate([cost[finite][::stride], cost[front_idx]]),
        cloud_group=np.concatenate([group[finite][::stride], group[front_idx]]),
        cloud_labels=tuple(MODE_LABELS.get(m, m) for m in labels),
    )


def _no_fit(
    topo: Topology,
    model: TransformerSpec,
    counts: SearchCounts,
    con: Constraints,
    tokens: float,
    start: float,
    jobs: int,
) -> PlanSearchResult:
    """No island has an inner plan that fits: the memory constraint binds."""
    stats = counts.stats(start, jobs)
    text = (
        f"No runnable plan fits in memory: no island of {topo.name} can hold {model.name} "
        "with the allowed sharding and recompute; add nodes, allow zero3/full recompute or "
        "lower --headroom."
    )
    return PlanSearchResult(
        kind="topology",
        model=model.name,
        target=topo.name,
        tokens=tokens,
        constraints=con,
        ranked=(),
        pareto=(),
        best_cost=None,
        explanation=None,
        infeasible=Infeasibility("memory", None, text),
        stats=stats,
    )


def _runner_up(order: IntArray, layout: Callable[[int], Hashable]) -> int | None:
    """The fastest plan after the winner with a different layout (islands, GPU counts, mode):
    neighbours that differ only in a setting differ by a hair and explain nothing. Falls back
    to the second fastest."""
    if order.size < 2:
        return None
    top = layout(int(order[0]))
    for flat in order[1 : min(order.size, 10000)]:
        if layout(int(flat)) != top:
            return int(flat)
    return int(order[1])
