"""`plan(...)`: the Python face of `shardmeter plan` (one cluster or a topology of islands)."""

from __future__ import annotations

import math
from pathlib import Path

from shardmeter.errors import UserInputError
from shardmeter.estimate.islands import with_run
from shardmeter.predict import ClusterRef, ModelRef, resolve_cluster, resolve_model
from shardmeter.search.cluster import search_cluster
from shardmeter.search.evaluate import Progress
from shardmeter.search.options import Constraints, OuterOptions, SpaceOptions
from shardmeter.search.result import PlanSearchResult
from shardmeter.search.topology import search_topology
from shardmeter.specs.hardware import Cluster
from shardmeter.specs.model import TransformerSpec
from shardmeter.specs.topology import Topology, load_topology

DEFAULT_TOKENS = 1e12
DEFAULT_BATCH_TOKENS = 4 * 2**20  # 4M tokens per step when no global batch is given


def default_global_batch(model: TransformerSpec) -> int:
    """The power-of-two number of sequences closest to 4M tokens per step."""
    return int(2 ** round(math.log2(max(DEFAULT_BATCH_TOKENS / model.seq_len, 1.0))))


def node_multiples(cluster: Cluster, lo: int, hi: int) -> tuple[int, ...]:
    """GPU counts between lo and hi: one node times powers of two, plus hi itself."""
    gpn = cluster.gpus_per_node
    out = {hi}
    n = gpn
    while n <= hi:
        if n >= lo:
            out.add(n)
        n *= 2
    return tuple(sorted(out))


def plan(
    model: ModelRef | None = None,
    cluster: ClusterRef | None = None,
    *,
    gpus: int | tuple[int, ...] | None = None,
    topology: Topology | str | Path | None = None,
    tokens: float | None = None,
    global_batch: int | tuple[int, ...] | None = None,
    constraints: Constraints | None = None,
    options: SpaceOptions | None = None,
    outer: OuterOptions | None = None,
    top_k: int = 20,
    prune: bool = True,
    jobs: int = 1,
    progress: Progress | None = None,
    on_space: Progress | None = None,
) -> PlanSearchResult:
    """Search every valid plan and rank it by wall-clock, cost and $/Mtok (C.10, C.11).

    One cluster: `model`, `cluster` and `gpus` (a count, or several counts to compare; the
    front then trades GPUs against time). Islands: `topology` (a Topology, a file or a shipped
    example name; its run.model is used unless `model` is given). `global_batch` (sequences
    per step) may be one value or several. Bad input raises UserInputError.
    """
    con = constraints or Constraints()
    opts = options or SpaceOptions()
    if top_k < 1:
        raise UserInputError("top", top_k, "must be ≥ 1")
    if tokens is not None and not (0 < tokens < math.inf):
        raise UserInputError("tokens", tokens, "a positive, finite token budget")
    if topology is not None:
        topo = topology if isinstance(topology, Topology) else load_topology(topology)
        if model is not None:
            name = model.name if isinstance(model, TransformerSpec) else str(model)
            topo = with_run(
                topo, model=model.model_dump() if isinstance(model, TransformerSpec) else name
            )
        return search_topology(
            topo,
            options=opts,
            outer=outer or OuterOptions(),
            constraints=con,
            tokens=tokens,
            top_k=top_k,
            prune=prune,
            jobs=jobs,
            progress=progress,
            on_space=on_space,
        )
    spec = resolve_model(model)
    island = resolve_cluster(cluster)
    counts = _gpu_counts(island, gpus, con)
    batches = _batches(spec, global_batch)
    return search_cluster(
        spec,
        island,
        counts,
        batches,
        tokens=float(tokens if tokens is not None else DEFAULT_TOKENS),
        options=opts,
        constraints=con,
        top_k=top_k,
        prune=prune,
        jobs=jobs,
        progress=progress,
        on_space=on_space,
    )


def _gpu_counts(
    cluster: Cluster, gpus: int | tuple[int, ...] | None, con: Constraints
) -> tuple[int, ...]:
    if gpus is None:
        gpus = cluster.n_gpus or cluster.gpus_per_node
    counts = (gpus,) if isinstance(gpus, int) else tuple(gpus)
    if not counts or any(int(n) != n or n < 1 for n in counts):
        raise UserInputError("gpus", gpus, "positive GPU counts")
    if cluster.n_gpus is not None and max(counts) > cluster.n_gpus:
        raise UserInputError(
            "gpus", max(counts), f"the cluster {cluster.name} has {cluster.n_gpus}"
        )
    if con.max_gpus_per_island is not None:
        counts = tuple(n for n in counts if n <= con.max_gpus_per_island)
        if not counts:
            raise UserInputError(
                "max_gpus_per_island", con.max_gpus_per_island, f"below every GPU count {gpus}"
            )
    return tuple(sorted(set(counts)))


def _batches(model: TransformerSpec, global_batch: int | tuple[int, ...] | None) -> tuple[int, ...]:
    if global_batch is None:
        return (default_global_batch(model),)
    batches = (global_batch,) if isinstance(global_batch, int) else tuple(global_batch)
    if not batches or any(int(b) != b or b < 1 for b in batches):
        raise UserInputError("global_batch", global_batch, "positive numbers of sequences")
    return tuple(sorted(set(batches)))
