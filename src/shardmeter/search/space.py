"""The inner-plan search space of one island, laid out so the estimator sees broadcast grids.

A plan = a *shape* (tp, pp, vpp, cp, ep, dp, micro-batch, recompute, precision: everything
that sets the per-micro-batch compute) × a *sync* choice (ZeRO stage and HSDP shard group,
which depend on dp) × a global batch. Shapes are rows; sync choices are grid columns; the
estimator is called on a (K sync choices, R shapes) grid whose columns broadcast, so work that
depends only on the shape runs once per row, not once per plan (design doc C.11: enumerate,
prune by divisibility and memory, evaluate analytically).

The plan rules are `specs.rules.RULES` (tp | heads, pp·vpp | layers unless uneven stages are
allowed, cp | seq, ep | experts and dp, dp·micro-batch | global batch, interleaving needs pp | m,
shard group | dp): enumeration (`_model_options`, `sync_choices`) only generates layouts that
can pass, `enumerate_shapes` keeps the shapes some batch can run by the table, and `grid_valid`
evaluates the table on the grid.
"""

from __future__ import annotations

import itertools
from dataclasses import dataclass, fields
from typing import Any

import numpy as np
from numpy.typing import NDArray

from shardmeter.estimate.plan_arrays import (
    PRECISION_CODES,
    RECOMPUTE_CODES,
    SHARDING_CODES,
    PlanArrays,
    plan_columns,
)
from shardmeter.search.options import SpaceOptions
from shardmeter.specs.hardware import Cluster
from shardmeter.specs.model import TransformerSpec
from shardmeter.specs.plan import Plan
from shardmeter.specs.rules import PlanColumns, rules_hold

IntArray = NDArray[np.int64]
BoolArray = NDArray[np.bool_]

SHARDING_NAMES: tuple[str, ...] = tuple(SHARDING_CODES)
RECOMPUTE_NAMES: tuple[str, ...] = tuple(RECOMPUTE_CODES)
PRECISION_NAMES: tuple[str, ...] = tuple(PRECISION_CODES)
# rules the search relaxes: pp·vpp need not divide the layers (`SpaceOptions.uneven_layers`
# decides at enumeration; the estimate takes the fullest stage)
SEARCH_RELAXES: tuple[str, ...] = ("layers_per_chunk",)


def divisors(n: int) -> list[int]:
    """Positive divisors of n, ascending."""
    small = [d for d in range(1, int(n**0.5) + 1) if n % d == 0]
    return sorted({*small, *(n // d for d in small)})


def powers_of_two_dividing(n: int, limit: int) -> list[int]:
    """1, 2, 4, ... up to `limit` that divide n."""
    out, p = [], 1
    while p <= limit and n % p == 0:
        out.append(p)
        p *= 2
    return out


@dataclass(frozen=True)
class Shapes:
    """Rows of the grid for one GPU count: one entry per shape (all int64 arrays, length R)."""

    n_gpus: int
    tp: IntArray
    pp: IntArray
    vpp: IntArray
    cp: IntArray
    ep: IntArray
    dp: IntArray
    micro_batch: IntArray
    recompute: IntArray
    precision: IntArray

    def __len__(self) -> int:
        return int(self.tp.shape[0])

    def take(self, index: IntArray) -> Shapes:
        cols = {f.name: getattr(self, f.name)[index] for f in fields(self) if f.name != "n_gpus"}
        return Shapes(n_gpus=self.n_gpus, **cols)

    def plan_arrays(
        self,
        global_batch: int,
        sharding: int = 0,
        overlap_tp: bool = False,
        framework: str | None = None,
    ) -> PlanArrays:
        """The rows as a 1-D PlanArrays (no ZeRO, shard group = dp) at one global batch, with
        the framework's fixed features."""
        return PlanArrays.from_columns(
            **framework_columns(framework),
            dp=self.dp,
            tp=self.tp,
            pp=self.pp,
            cp=self.cp,
            ep=self.ep,
            vpp=self.vpp,
            sp=self.tp > 1,
            sharding=sharding,
            shard_group=np.where(sharding > 0, self.dp, 1),
            micro_batch=self.micro_batch,
            global_batch=global_batch,
            recompute=self.recompute,
            precision=self.precision,
            overlap_tp=overlap_tp & (self.tp > 1),
        )


def _model_options(
    model: TransformerSpec, cluster: Cluster, n: int, opts: SpaceOptions
) -> list[tuple[int, int, int, int, int]]:
    """(tp, cp, pp, vpp, ep) layouts of n GPUs allowed by the model and the options."""
    max_tp = opts.max_tp or cluster.nvlink_domain
    tps = [t for t in divisors(model.n_heads) if t <= max_tp and n % t == 0]
    cps = powers_of_two_dividing(model.seq_len, opts.max_cp)
    layers = model.n_layers
    out: list[tuple[int, int, int, int, int]] = []
    for tp, cp in itertools.product(tps, cps):
        if n % (tp * cp):
            continue
        rest = n // (tp * cp)
        for pp in divisors(rest):
            if pp > min(opts.max_pp or layers, layers):
                break
            if not opts.uneven_layers and layers % pp:
                continue
            dp = rest // pp
            vpps = [1]
            if pp > 1:
                vpps += [v for v in range(2, opts.max_vpp + 1) if layers % (pp * v) == 0]
            experts = model.moe.experts if model.moe is not None else 1
            eps = [e for e in divisors(experts) if dp % e == 0 and e <= opts.max_ep]
            out.extend((tp, cp, pp, v, e) for v in vpps for e in eps)
    return out


def enumerate_shapes(
    model: TransformerSpec,
    cluster: Cluster,
    n_gpus: int,
    batches: tuple[int, ...],
    opts: SpaceOptions,
) -> Shapes:
    """Every shape of `n_gpus` GPUs that some global batch in `batches` can run."""
    layouts = np.asarray(_model_options(model, cluster, n_gpus, opts), dtype=np.int64)
    precisions = [
        p for p in opts.precisions if p != "fp8" or "fp8" in cluster.accelerator.peak_tflops
    ]
    extra = list(
        itertools.product(
            sorted(set(opts.micro_batches)),
            [RECOMPUTE_CODES[r] for r in opts.recompute],
            [PRECISION_CODES[p] for p in precisions],
        )
    )
    if layouts.size == 0 or not extra:
        empty = np.zeros(0, dtype=np.int64)
        return Shapes(n_gpus, *(empty,) * 9)
    ext = np.asarray(extra, dtype=np.int64)
    lay = np.repeat(layouts, len(ext), axis=0)
    ex = np.tile(ext, (len(layouts), 1))
    tp, cp, pp, vpp, ep = lay.T
    dp = n_gpus // (tp * cp * pp)
    mb = ex[:, 0]
    columns = PlanColumns(
        dp=dp[:, None],
        tp=tp[:, None],
        pp=pp[:, None],
        cp=cp[:, None],
        ep=ep[:, None],
        vpp=vpp[:, None],
        micro_batch=mb[:, None],
        global_batch=np.asarray(batches, dtype=np.int64)[None, :],
        sharding=0,
        shard_group=1,
    )
    keep = rules_hold(columns, model, relax=SEARCH_RELAXES).any(axis=1)
    return Shapes(
        n_gpus=n_gpus,
        tp=tp[keep],
        pp=pp[keep],
        vpp=vpp[keep],
        cp=cp[keep],
        ep=ep[keep],
        dp=dp[keep],
        micro_batch=mb[keep],
        recompute=ex[keep, 1],
        precision=ex[keep, 2],
    )


@dataclass(frozen=True)
class SyncChoices:
    """Grid columns for one dp: ZeRO stage codes and shard-group sizes (length K)."""

    sharding: IntArray
    shard_group: IntArray

    def __len__(self) -> int:
        return int(self.sharding.shape[0])


def sync_choices(dp: int, opts: SpaceOptions) -> SyncChoices:
    """No sharding, and each allowed ZeRO stage over all of dp or (HSDP) over every smaller
    power-of-two group of at least 2 that divides dp."""
    groups = [dp]
    if opts.hsdp:
        groups += [g for g in powers_of_two_dividing(dp, dp // 2) if g >= 2]
    stages, sizes = [], []
    for name in opts.sharding:
        code = SHARDING_CODES[name]
        for g in [1] if code == 0 else groups:
            stages.append(code)
            sizes.append(g)
    return SyncChoices(np.asarray(stages, np.int64), np.asarray(sizes, np.int64))


# Plan features the search does not vary; a framework's defaults set them (else Plan's).
FEATURE_COLUMNS: tuple[str, ...] = (
    "overlap_dp", "overlap_param_gather", "attention", "fused_ce", "gather_matrix",
    "overlap_ep", "ep_fp8", "ep_dedup", "graphs", "master_remainder", "compiled",
    "fused_elementwise", "params_fp32", "recompute_act", "recompute_norm",
    "recompute_qkv", "op_sac", "ce_eager", "ce_compiled", "eager_squared_relu",
)  # fmt: skip


def framework_columns(framework: str | None) -> dict[str, Any]:
    """The feature columns of plans made by `framework` (empty without one)."""
    if framework is None:
        return {}
    columns = plan_columns(Plan(framework=framework))
    return {name: columns[name] for name in FEATURE_COLUMNS}


def grid_plans(
    rows: Shapes, sync: SyncChoices, global_batch: int, overlap_tp: bool,
    framework: str | None = None,
) -> PlanArrays:  # fmt: skip
    """A (K, R) PlanArrays: sync choices down the first axis, shapes along the second.

    Shape columns are (1, R) and sync columns (K, 1): the estimator broadcasts them (and
    `PlanArrays.shape` is their broadcast shape), so per-shape compute runs R times, not K·R. Columns constant over the grid are Python
    scalars (as in `PlanArrays.scalar`), so the estimator's scalar fast paths skip them.
    """

    def row(a: NDArray[Any]) -> Any:
        return a[None, :]

    scalar: dict[str, Any] = {
        "global_batch": int(global_batch),
        "overlap_dp": True,
        "overlap_param_gather": True,
        "overlap_tp": row(rows.tp > 1) if overlap_tp else False,
        **framework_columns(framework),
    }
    return PlanArrays(
        dp=row(rows.dp),
        tp=row(rows.tp),
        pp=row(rows.pp),
        cp=row(rows.cp),
        ep=row(rows.ep),
        vpp=row(rows.vpp),
        sp=row(rows.tp > 1),
        sharding=sync.sharding[:, None],
        shard_group=sync.shard_group[:, None],
        micro_batch=row(rows.micro_batch),
        recompute=row(rows.recompute),
        precision=row(rows.precision),
        **scalar,
    )


def grid_valid(
    model: TransformerSpec, rows: Shapes, sync: SyncChoices, global_batch: int
) -> BoolArray:
    """(K, R) mask of runnable plans: every rule of `specs.rules.RULES` on the grid's columns,
    except `layers_per_chunk` (the search models uneven stages by the fullest one)."""
    columns = PlanColumns(
        dp=rows.dp[None, :],
        tp=rows.tp[None, :],
        pp=rows.pp[None, :],
        cp=rows.cp[None, :],
        ep=rows.ep[None, :],
        vpp=rows.vpp[None, :],
        micro_batch=rows.micro_batch[None, :],
        global_batch=int(global_batch),
        sharding=sync.sharding[:, None],
        shard_group=sync.shard_group[:, None],
    )
    ok = rules_hold(columns, model, relax=SEARCH_RELAXES)
    return np.asarray(np.broadcast_to(ok, (len(sync), len(rows))), dtype=np.bool_)


def make_plan(
    rows: Shapes, r: int, sharding: int, shard_group: int, global_batch: int, overlap_tp: bool,
    framework: str | None = None,
) -> Plan:  # fmt: skip
    """The Plan at row r with one sync choice (shard_degree None when it spans all of dp)."""
    dp = int(rows.dp[r])
    tp = int(rows.tp[r])
    return Plan(
        dp=dp,
        tp=tp,
        pp=int(rows.pp[r]),
        cp=int(rows.cp[r]),
        ep=int(rows.ep[r]),
        vpp=int(rows.vpp[r]),
        sp=tp > 1,
        sharding=SHARDING_NAMES[sharding],
        shard_degree=None if sharding == 0 or shard_group == dp else int(shard_group),
        micro_batch=int(rows.micro_batch[r]),
        global_batch=int(global_batch),
        recompute=RECOMPUTE_NAMES[int(rows.recompute[r])],
        precision=PRECISION_NAMES[int(rows.precision[r])],
        overlap_tp=overlap_tp and tp > 1,
        framework=framework,
    )
