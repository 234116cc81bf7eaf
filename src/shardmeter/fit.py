"""Will it fit: the layouts of one model on N GPUs of one kind that fit in memory, cheapest first.

`fit_layouts` enumerates tensor, pipeline and data parallelism with every ZeRO stage and
recompute mode (micro-batch 1, the memory setup the caller states), evaluates them in one
vectorized call and keeps those whose device total (`memory_total_bytes`: reserved + CUDA
context + NCCL buffers) is within the card's memory. On a fixed GPU count the cheapest layout
is the fastest, so they are ranked by tokens/s per GPU. `largest_micro_batch` and
`largest_seq_len` push one plan to its limit; `what_would_fit` names the changes that make a
model fit when nothing does (offload, a smaller optimizer, more GPUs).
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

import numpy as np

from shardmeter.errors import UserInputError
from shardmeter.estimate.plan_arrays import PlanArrays
from shardmeter.estimate.result import StepEstimate
from shardmeter.estimate.step import estimate_step, estimate_step_arrays, plan_validity, view
from shardmeter.specs.hardware import Cluster
from shardmeter.specs.model import TransformerSpec
from shardmeter.specs.plan import Plan

SHARDINGS = ("none", "zero1", "zero2", "zero3")
RECOMPUTES = ("none", "selective", "full")
MAX_PP = 64
MAX_MICRO_BATCH = 4096
SEQ_STEP = 128  # sequence lengths are searched in multiples of this many tokens


@dataclass(frozen=True)
class FitOption:
    """One layout that fits, with its estimate (memory breakdown, throughput)."""

    plan: Plan
    estimate: StepEstimate


@dataclass(frozen=True)
class Suggestion:
    """A change that makes the model fit, and the fastest layout it allows."""

    change: str  # e.g. "offload=optimizer" or "gpus=16"
    option: FitOption


def _divisors(n: int) -> list[int]:
    return [d for d in range(1, n + 1) if n % d == 0]


def candidate_plans(
    model: TransformerSpec, n_gpus: int, gpus_per_node: int, setup: dict[str, Any],
    global_batch: int | None = None,
) -> list[Plan]:  # fmt: skip
    """Every tp (within a node, dividing the heads) × pp (dividing the layers) × ZeRO stage ×
    recompute mode on `n_gpus`, micro-batch 1, with the memory-setup fields `setup`."""
    plans: list[Plan] = []
    for tp in _divisors(min(n_gpus, gpus_per_node)):
        if model.n_heads % tp or n_gpus % tp:
            continue
        for pp in _divisors(n_gpus // tp):
            if pp > MAX_PP or model.n_layers % pp:
                continue
            dp = n_gpus // (tp * pp)
            batch = global_batch or dp * (4 * pp if pp > 1 else 1)
            if batch % dp:
                continue
            for sharding in SHARDINGS if dp > 1 else ("none",):
                for recompute in RECOMPUTES:
                    fields = dict(
                        dp=dp, tp=tp, pp=pp, sp=tp > 1, sharding=sharding, recompute=recompute,
                        micro_batch=1, global_batch=batch,
                    )  # fmt: skip
                    plans.append(Plan(**{**fields, **setup}))
    return plans


def fit_layouts(
    model: TransformerSpec, cluster: Cluster, n_gpus: int, setup: dict[str, Any] | None = None,
    global_batch: int | None = None,
) -> list[FitOption]:  # fmt: skip
    """The layouts that fit, fastest (cheapest) first; [] when none does."""
    plans = candidate_plans(model, n_gpus, cluster.gpus_per_node, setup or {}, global_batch)
    if not plans:
        return []
    arrays = PlanArrays.from_plans(plans)
    est = estimate_step_arrays(model, cluster, arrays)
    ok = plan_validity(model, arrays) & np.asarray(est.fits, dtype=bool).reshape(-1)
    rate = np.asarray(est.tokens_per_s_per_gpu, dtype=float).reshape(-1)
    memory = np.asarray(est.memory_bytes, dtype=float).reshape(-1)
    order = sorted(np.flatnonzero(ok), key=lambda i: (-rate[i], memory[i]))
    return [FitOption(plans[i], view(est, int(i), cluster, plans[i])) for i in order]


def _fits(model: TransformerSpec, cluster: Cluster, plan: Plan) -> bool:
    try:
        return estimate_step(model, cluster, plan, check_layers=False).fits
    except UserInputError:
        return False


def _with_micro_batch(plan: Plan, micro: int) -> Plan:
    steps = plan.micro_batches  # keep the micro-batches per step (the pipeline's fill)
    return plan.model_copy(
        update={"micro_batch": micro, "global_batch": plan.dp * micro * max(steps, 1)}
    )


def largest_micro_batch(model: TransformerSpec, cluster: Cluster, plan: Plan) -> int:
    """The largest micro-batch that fits (0 if even 1 does not): one more does not fit."""
    if not _fits(model, cluster, _with_micro_batch(plan, 1)):
        return 0
    low, high = 1, 2
    while high <= MAX_MICRO_BATCH and _fits(model, cluster, _with_micro_batch(plan, high)):
        low, high = high, high * 2
    high = min(high, MAX_MICRO_BATCH + 1)
    while high - low > 1:  # fits at low, not at high
        mid = (low + high) // 2
        if _fits(model, cluster, _with_micro_batch(plan, mid)):
            low = mid
        else:
            high = mid
    return low


def largest_seq_len(
    model: TransformerSpec, cluster: Cluster, plan: Plan, limit: int = 1 << 22
) -> int:  # fmt: skip
    """The longest sequence, in multiples of SEQ_STEP·cp tokens, that fits with the plan's
    micro-batch (0 if even one step does not)."""
    step = SEQ_STEP * plan.cp

    def fits(tokens: int) -> bool:
        return _fits(model.model_copy(update={"seq_len": tokens}), cluster, plan)

    if not fits(step):
        return 0
    low, high = 1, 2  # in steps
    while high * step <= limit and fits(high * step):
        low, high = high, high * 2
    high = min(high, limit // step + 1)
    while high - low > 1:
        mid = (low + high) // 2
        if fits(mid * step):
            low = mid
        else:
            high = mid
    return low * step


def what_would_fit(
    model: TransformerSpec, cluster: Cluster, n_gpus: int, setup: dict[str, Any] | None = None,
    global_batch: int | None = None,
) -> list[Suggestion]:  # fmt: skip
    """When nothing fits: offloading the optimizer (then also the gradients, as ZeRO-Offload,
    then the parameters), 8-bit AdamW without a master copy, and the smallest of 2, 4, ..., 64
    times the GPUs that fits."""
    setup = dict(setup or {})
    tries: list[tuple[str, dict[str, Any], int]] = [
        ("offload=optimizer", {**setup, "offload": "optimizer"}, n_gpus),
        ("offload=grads+optimizer", {**setup, "offload": "grads+optimizer"}, n_gpus),
        ("offload=params+optimizer", {**setup, "offload": "params+optimizer"}, n_gpus),
        ("optimizer=adamw8bit, master_weights=none",
         {**setup, "optimizer": "adamw8bit", "master_weights": "none"}, n_gpus),
    ]  # fmt: skip
    found: list[Suggestion] = []
    for change, trial, gpus in tries:
        options = fit_layouts(model, cluster, gpus, trial, global_batch)
        if options:
            found.append(Suggestion(change, options[0]))
    factor = 2
    while factor <= 64:
        options = fit_layouts(model, cluster, n_gpus * factor, setup, global_batch)
        if options:
            found.append(Suggestion(f"gpus={n_gpus * factor}", options[0]))
            break
        factor *= 2
    return found
