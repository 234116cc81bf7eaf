"""Failures and churn: the share of wall time that still trains when islands fail, restart and
checkpoint (first-order model of Young 1974 and Daly 2006, FGCS 22(3)).

Per island i: failure rate λ_i = 1/MTBF_i (an island's MTBF is the run's per-GPU MTBF divided
by its GPUs unless given per island). A failure costs the failed island its restart R plus the
work since its last recovery point: the later of its last checkpoint and the last
synchronisation (peers hold the synchronised model, as torchft and INTELLECT-1 recover), half
that interval on average. Checkpoints cost C every τ_c of work (no cost given: no checkpoints,
recovery from the peers' copy).

- Synchronous modes stall every island for each failure anywhere: island i keeps
  g = 1 / ((1 + C/τ_c) · (1 + Σ_j λ_j (R + rework_j))).
- Asynchronous mode, and sync DiLoCo/Streaming with a quorum K < M, lose only the failed
  island's work; with a quorum the others wait the grace window per failure:
  g_i = 1 / ((1 + C/τ_c) · (1 + λ_i (R + rework_i) + Σ_{j≠i} λ_j · grace)).

The optimal checkpoint interval is Daly's first-order optimum τ* = √(2·C·M) − C for C < M/2
(else M), with M the MTBF of whatever stalls together (Daly 2006, eq. 20; Young 1974).
Units: seconds, failures per second.
"""

from __future__ import annotations

import math
from dataclasses import dataclass

import numpy as np
from numpy.typing import ArrayLike, NDArray

from shardmeter.specs.topology import FailureSpec

FloatArray = NDArray[np.float64]
HOUR = 3600.0


@dataclass(frozen=True)
class Churn:
    """What failures cost each island and the checkpoint interval. Per-island arrays have the
    island axis last; the intervals have the leading axes only (one value per topology)."""

    goodput: FloatArray  # (..., I) share of wall time that still trains
    failures_per_s: FloatArray  # (..., I) λ_i
    lost_per_failure_s: FloatArray  # (..., I) restart + expected rework of island i's failure
    checkpoint_interval_s: FloatArray  # (...) used (inf: never)
    optimal_interval_s: FloatArray  # (...) Young/Daly τ* for the group that stalls together
    shared_stall: bool  # True: a failure stalls every island


def island_mtbf_s(spec: FailureSpec, n_gpus: FloatArray, override_hours: FloatArray) -> FloatArray:
    """MTBF of each island in seconds: its own override, else the run's per-island figure,
    else the per-GPU figure over its GPUs; inf when none is given (no failures)."""
    base = math.inf
    if spec.island_mtbf_hours is not None:
        base = spec.island_mtbf_hours * HOUR
    per_island = np.full(n_gpus.shape, base)
    if spec.island_mtbf_hours is None and spec.gpu_mtbf_hours is not None:
        per_island = spec.gpu_mtbf_hours * HOUR / n_gpus
    return np.where(np.isfinite(override_hours), override_hours * HOUR, per_island)


def daly_interval_s(checkpoint_s: float, mtbf_s: ArrayLike) -> FloatArray:
    """Daly's first-order optimum checkpoint interval (2006, eq. 20), seconds of work, for each
    MTBF in `mtbf_s`: inf where nothing fails or no checkpoint cost is given (recovery from the
    peers' copy), the MTBF itself where C ≥ M/2."""
    m = np.asarray(mtbf_s, dtype=np.float64)
    if checkpoint_s <= 0:
        return np.full(m.shape, math.inf)
    with np.errstate(invalid="ignore"):
        tau = np.sqrt(2.0 * checkpoint_s * m) - checkpoint_s
    return np.where(~np.isfinite(m), math.inf, np.where(checkpoint_s >= m / 2, m, tau))


def churn(
    spec: FailureSpec,
    mtbf_s: FloatArray,
    sync_interval_s: FloatArray,
    *,
    asynchronous: bool,
) -> Churn:
    """Goodput per island, broadcast over any leading axes (island axis last).
    `sync_interval_s`: time between synchronisations of island i (its round); `asynchronous`:
    the async mode (no shared stall even without a quorum)."""
    lam = np.where(np.isfinite(mtbf_s), 1.0 / mtbf_s, 0.0)
    n = lam.shape[-1]
    quorum = spec.quorum is not None and spec.quorum < n
    shared = not (asynchronous or quorum)
    group_rate = lam.sum(axis=-1) if shared else lam.max(axis=-1, initial=0.0)
    with np.errstate(divide="ignore"):
        group_mtbf = np.where(group_rate > 0, 1.0 / group_rate, math.inf)
    optimal = daly_interval_s(spec.checkpoint_s, group_mtbf)
    interval = (
        optimal
        if spec.checkpoint_interval_s == "auto"
        else np.full(optimal.shape, float(spec.checkpoint_interval_s))
    )
    overhead = spec.checkpoint_s / interval if spec.checkpoint_s > 0 else np.zeros(interval.shape)
    recovery = np.minimum(interval[..., None] + spec.checkpoint_s, sync_interval_s)
    lost = spec.restart_s + recovery / 2.0
    if shared:
        waste = np.broadcast_to((lam * lost).sum(axis=-1, keepdims=True), lost.shape)
    else:
        grace = spec.grace_s if quorum else 0.0
        waste = lam * lost + (lam.sum(axis=-1, keepdims=True) - lam) * grace
    return Churn(
        goodput=1.0 / ((1.0 + overhead[..., None]) * (1.0 + waste)),
        failures_per_s=np.broadcast_to(lam, lost.shape),
        lost_per_failure_s=np.where(lam > 0, lost, 0.0),
        checkpoint_interval_s=interval,
        optimal_interval_s=optimal,
        shared_stall=shared,
    )
