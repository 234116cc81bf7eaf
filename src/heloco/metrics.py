"""Run metrics: JSONL events and a summary.json, independent of the clock that drives the run.

The simulator passes simulated seconds as ``time``; the network runtime passes wall seconds.
Schema: docs/heloco-metrics.md. Events are written one JSON object per line (line-buffered),
each with the run's id; the summary is written atomically (temp file + os.replace).
"""

from __future__ import annotations

import json
import math
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import IO, Any

from heloco.curve import value_at
from heloco.runfolder import RUN_ID_FIELD, new_run_id
from heloco.server import UpdateRecord
from heloco.types import RoundTiming
from shardmeter.io import write_atomic

EVENTS_FILE = "events.jsonl"
SUMMARY_FILE = "summary.json"
SCHEMA_VERSION = 1


@dataclass(frozen=True)
class EvalPoint:
    """Validation loss (nats/token) of the server model at one point of the run."""

    tokens: int
    steps: int
    time: float
    revision: int
    loss: float
    per_language: dict[str, float]
    cycle_loss: float


@dataclass(frozen=True)
class CorrectionSummary:
    """Means over updates of the optimizer diagnostics (nan-free means; None if no data)."""

    cos_delta_momentum: float | None
    frac_kept: float | None
    frac_shrunk: float | None
    frac_rotated: float | None
    correction_size: float | None
    tensor_correction_size: float | None
    mean_lambda: float | None
    mean_beta: float | None


@dataclass(frozen=True)
class RunSummary:
    """What summary.json holds (see docs/heloco-metrics.md)."""

    method: str
    n_workers: int
    final_loss: float | None
    final_per_language: dict[str, float]
    loss_at_token_budget: float | None
    loss_at_time_budget: float | None
    cycle_loss: float | None
    tokens: int
    steps: int
    time: float
    updates: int
    wall_seconds: float
    train_tokens_per_second: float
    worker_shares: list[float]
    language_shares: dict[str, float]
    staleness_mean: list[float | None]
    staleness_max: list[int | None]
    correction: CorrectionSummary
    paces: list[float] = field(default_factory=list)
    weight_shares: list[float] = field(default_factory=list)
    goodput: float | None = None  # accepted rounds' compute / (workers × simulated seconds)
    payload: str = "dense"  # what the workers sent (heloco.codecs; shardmeter.quality reads it)
    codec: str = "fp32"  # a dense payload's uplink codec (fp32, bf16, int8; shardmeter.quality)
    schema_version: int = SCHEMA_VERSION


class RunStats:
    """Accumulates per-worker arrival counts, staleness and correction diagnostics."""

    STAT_FIELDS = (
        "cos_delta_momentum",
        "frac_kept",
        "frac_shrunk",
        "frac_rotated",
        "correction_size",
        "tensor_correction_size",
        "mean_lambda",
        "mean_beta",
    )

    def __init__(self, n_workers: int, worker_languages: list[dict[str, float]] | None = None):
        self.n_workers = n_workers
        self.worker_languages = worker_languages
        self.arrivals = [0] * n_workers
        self.weights = [0.0] * n_workers
        self.staleness_sum = [0] * n_workers
        self.staleness_max: list[int | None] = [None] * n_workers
        self.updates = 0
        self._sums = dict.fromkeys(self.STAT_FIELDS, 0.0)
        self._counts = dict.fromkeys(self.STAT_FIELDS, 0)

    def add(self, record: UpdateRecord) -> None:
        """Count one outer update: arrivals, ρ weight shares, staleness and correction stats."""
        self.updates += 1
        per_arrival = record.stats.rho / len(record.arrivals)
        for a in record.arrivals:
            self.arrivals[a.worker] += 1
            self.weights[a.worker] += per_arrival
            self.staleness_sum[a.worker] += a.staleness
            prev = self.staleness_max[a.worker]
            self.staleness_max[a.worker] = a.staleness if prev is None else max(prev, a.staleness)
        for name in self.STAT_FIELDS:
            value = getattr(record.stats, name)
            if math.isfinite(value):
                self._sums[name] += value
                self._counts[name] += 1

    def worker_shares(self) -> list[float]:
        """Fraction of applied arrivals that came from each worker."""
        total = sum(self.arrivals)
        return [a / total if total else 0.0 for a in self.arrivals]

    def weight_shares(self) -> list[float]:
        """Fraction of the total applied weight (ρ·balancing weight) that came from each worker:
        each worker's effective contribution to the outer momentum."""
        total = sum(self.weights)
        return [w / total if total else 0.0 for w in self.weights]

    def language_shares(self) -> dict[str, float]:
        """Σ_w share_w · mixture_w[language]: how much each language fed the updates."""
        if self.worker_languages is None:
            return {}
        out: dict[str, float] = {}
        for share, mix in zip(self.worker_shares(), self.worker_languages, strict=True):
            for lang, weight in mix.items():
                out[lang] = out.get(lang, 0.0) + share * weight
        return out

    def staleness_mean(self) -> list[float | None]:
        """Mean staleness (revisions) of each worker's arrivals; None for a worker with none."""
        return [
            s / n if n else None for s, n in zip(self.staleness_sum, self.arrivals, strict=True)
        ]

    def correction(self) -> CorrectionSummary:
        """Run means of the correction diagnostics (None where never recorded)."""
        means = {
            k: (self._sums[k] / self._counts[k] if self._counts[k] else None)
            for k in self.STAT_FIELDS
        }
        return CorrectionSummary(**means)


def update_event(record: UpdateRecord, time: float, tokens: int) -> dict[str, Any]:
    """One ``update`` line: revision, who arrived, staleness and the optimizer diagnostics."""
    return {
        "type": "update",
        "revision": record.revision,
        "time": time,
        "tokens": tokens,
        "workers": [a.worker for a in record.arrivals],
        "staleness": [a.staleness for a in record.arrivals],
        **{k: _finite(v) for k, v in asdict(record.stats).items()},
    }


def round_event(
    worker: int,
    round_id: int,
    steps: int,
    tokens: int,
    train_loss: float,
    start: float,
    end: float,
    timing: RoundTiming | None = None,
) -> dict[str, Any]:
    """One ``round`` line: a worker's round, its inner loss, its start/finish times and, where
    the loop measured them, when it received, computed and sent (:class:`RoundTiming`)."""
    return {
        "type": "round",
        "worker": worker,
        "round_id": round_id,
        "steps": steps,
        "tokens": tokens,
        "train_loss": _finite(train_loss),
        "start": start,
        "time": end,
        **(timing.event_fields() if timing is not None else {}),
    }


def eval_event(point: EvalPoint, stats: RunStats) -> dict[str, Any]:
    """One ``eval`` line: validation loss overall/per language and the shares so far."""
    return {
        "type": "eval",
        **{k: (_finite(v) if isinstance(v, float) else v) for k, v in asdict(point).items()},
        "worker_shares": stats.worker_shares(),
        "weight_shares": stats.weight_shares(),
        "language_shares": stats.language_shares(),
    }


def cycle_average(points: list[EvalPoint], now: float, cycle: float, loss: float) -> float:
    """Mean loss over evals in (now − cycle, now] plus the current one (window of evals)."""
    window = [p.loss for p in points if now - cycle < p.time <= now] + [loss]
    return sum(window) / len(window)


def loss_at(points: list[EvalPoint], budget: float, key: str) -> float | None:
    """Validation loss at ``budget`` along ``key`` ('tokens' or 'time'), linearly interpolated
    between the two evals that bracket it; None if the run never reached it
    (`heloco.curve.value_at`)."""
    xs = [float(getattr(p, key)) for p in points]
    return value_at(xs, [p.loss for p in points], budget, "none")


class MetricsWriter:
    """Writes events to ``events.jsonl`` and ``summary.json``; no-op without a dir.

    Every event carries the run's id (``run``): ``run_id``, or a fresh one. A new writer
    starts the events file afresh; ``append`` continues it (a server resuming its run, which
    then sets :attr:`run_id` to the id its checkpoint holds)."""

    def __init__(
        self, out_dir: Path | None, run_id: str | None = None, append: bool = False
    ) -> None:
        self.out_dir = out_dir
        self.run_id = run_id if run_id is not None else new_run_id()
        self._fh: IO[str] | None = None
        if out_dir is not None:
            out_dir.mkdir(parents=True, exist_ok=True)
            mode = "a" if append else "w"
            self._fh = (out_dir / EVENTS_FILE).open(mode, buffering=1, encoding="utf-8")

    def event(self, payload: dict[str, Any]) -> None:
        """Append one JSON line, with the run id, to the events file (no-op without a folder)."""
        if self._fh is not None:
            line = {**payload, RUN_ID_FIELD: self.run_id}
            self._fh.write(json.dumps(line, allow_nan=False) + "\n")

    def write_summary(self, summary: RunSummary) -> None:
        """Write summary.json atomically (no-op without an output folder)."""
        if self.out_dir is not None:
            atomic_write_json(self.out_dir / SUMMARY_FILE, summary_to_json(summary))

    def close(self) -> None:
        """Close the events file."""
        if self._fh is not None:
            self._fh.close()
            self._fh = None

    def __enter__(self) -> MetricsWriter:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()


def summary_to_json(summary: RunSummary) -> dict[str, Any]:
    """The summary as strict JSON (non-finite floats become null)."""
    return _scrub(asdict(summary))


def atomic_write_json(path: Path, payload: dict[str, Any]) -> None:
    """Write JSON atomically (``shardmeter.io.write_atomic``: temp file + os.replace)."""
    write_atomic(path, json.dumps(payload, indent=2, allow_nan=False) + "\n")


def _finite(x: float) -> float | None:
    return x if math.isfinite(x) else None


def _scrub(x: Any) -> Any:
    """Replace non-finite floats by None anywhere in a JSON-able structure."""
    if isinstance(x, float):
        return _finite(x)
    if isinstance(x, dict):
        return {k: _scrub(v) for k, v in x.items()}
    if isinstance(x, list | tuple):
        return [_scrub(v) for v in x]
    return x
