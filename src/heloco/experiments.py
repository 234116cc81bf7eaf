"""Grid runner: many simulated runs (cells), run in parallel processes, resumable.

A cell is (regime preset, worker paces, data split, method, seed). Every cell runs to the
regime's token budget T, so each costs the same compute; its fixed-time budget is
    S = T / (b · Σ_i 1/p_i)        (seconds; b = tokens per inner step, p_i = s/step of worker i)
the simulated time at which a fully asynchronous method has trained on T tokens (each worker
contributes 1/p_i steps per second). Every method reaches both points in one run: an
asynchronous run's completed tokens never exceed b·t·Σ 1/p_i, and a synchronous run is slower,
so both pass S before (or at) reaching T.

Each loss is read twice (spec §3 "Metrics"; the brief's cycle average):
  * at the budget point, linearly interpolated between the evaluations around it (for a
    synchronous method, whose model changes only at round ends and which is evaluated after
    every round, the last evaluation at or before it);
  * averaged over the last full cycle of the slowest worker before it — the time window
    W = H·max_i p_i for the time budget, the token window W·T/S (the tokens the asynchronous
    system trains on in W) for the token budget — as the mean of the piecewise-linear loss
    curve over the window (trapezoid rule).
Results go to ``<out>/runs/<cell key>/`` (events.jsonl, summary.json, config.json, cell.json)
and to ``<out>/results.jsonl`` / ``results.csv``; a cell whose cell.json exists is skipped.
"""

from __future__ import annotations

import csv
import functools
import io
import json
import math
import shutil
import statistics
import time
from collections.abc import Callable, Iterable, Mapping, Sequence
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Any

from heloco.config import RunConfig, atomic_write_text, load_config, method_policy
from heloco.curve import value_at
from heloco.executors import Executor, run_tasks
from heloco.metrics import EvalPoint, atomic_write_json
from heloco.runfolder import CONFIG_FILE
from heloco.sim import RunResult
from shardmeter.errors import UserInputError

CELL_FILE = "cell.json"
RESULTS_JSONL = "results.jsonl"
RESULTS_CSV = "results.csv"


@dataclass(frozen=True)
class Split:
    """How data is assigned to workers: one language each, or a Dirichlet(α) mixture."""

    assignment: str = "language"
    alpha: float | None = None

    @property
    def label(self) -> str:
        return self.assignment if self.alpha is None else f"{self.assignment}-a{self.alpha:g}"


@dataclass(frozen=True)
class Cell:
    """One run of a grid."""

    regime: str  # preset name (``heloco/configs/<regime>.toml``)
    paces: tuple[float, ...]
    method: str
    seed: int
    split: Split = Split()
    payload: str = ""  # a payload row's label (fp32, int8, topk:fraction=0.01, sign); "" none

    @property
    def paces_label(self) -> str:
        return "-".join(f"{p:g}" for p in self.paces)

    @property
    def key(self) -> str:
        """A folder-safe unique name: ``regime/p1-1-2/language/heloco+ab/s0``; a payload row
        ``regime/p1-1-2/language/heloco@sign-s0``, every payload run of a setting side by side
        in one folder (what ``shardmeter plan --quality-from`` reads)."""
        method = self.method.replace("+", "_")
        where = f"{self.regime}/p{self.paces_label}/{self.split.label}"
        if self.payload:
            slug = self.payload.replace(":", "-").replace("=", "").replace(",", "-")
            return f"{where}/{method}@{slug}-s{self.seed}"
        return f"{where}/{method}/s{self.seed}"


@dataclass(frozen=True)
class CellResult:
    """What one cell produced (the row of results.jsonl / results.csv)."""

    regime: str
    paces: list[float]
    split: str
    method: str
    seed: int
    token_budget: int
    time_budget: float
    cycle_seconds: float
    loss_at_tokens: float
    loss_at_time: float
    cycle_loss_at_tokens: float
    cycle_loss_at_time: float
    initial_loss: float
    per_language_at_tokens: dict[str, float]
    per_language_at_time: dict[str, float]
    tokens: int
    sim_time: float
    updates: int
    worker_shares: list[float]
    language_shares: dict[str, float]
    staleness_mean: list[float | None]
    staleness_max: list[int | None]
    correction: dict[str, float | None]
    wall_seconds: float
    run_dir: str = ""
    payload: str = ""  # the cell's payload row label ("" for the plain grid)

    @property
    def paces_label(self) -> str:
        return "-".join(f"{p:g}" for p in self.paces)


CSV_COLUMNS = (
    "regime",
    "paces",
    "split",
    "method",
    "seed",
    "loss_at_tokens",
    "loss_at_time",
    "cycle_loss_at_tokens",
    "cycle_loss_at_time",
    "initial_loss",
    "tokens",
    "sim_time",
    "time_budget",
    "updates",
    "wall_seconds",
)


# -- budgets and curve readings -------------------------------------------------------------
def time_budget_for(token_budget: int, paces: Sequence[float], step_tokens: int) -> float:
    """S = T / (b · Σ 1/p_i): when asynchronous workers have trained on T tokens (seconds)."""
    return token_budget / (step_tokens * sum(1.0 / p for p in paces))


def interpolate(xs: Sequence[float], ys: Sequence[float], x: float, step: bool = False) -> float:
    """y(x) on sorted ``xs``: piecewise linear, or (``step``) the last value at or before x —
    exact for a synchronous run, whose model only changes when a round ends and which is
    evaluated after every round. Clamps outside the range (linear: `heloco.curve.value_at`)."""
    if not step:
        return value_at(xs, ys, x, "clamp")
    if x <= xs[0]:
        return ys[0]
    for i in range(1, len(xs)):
        if x < xs[i]:
            return ys[i - 1]
        if x == xs[i] and (i + 1 == len(xs) or xs[i + 1] > x):
            return ys[i]
    return ys[-1]


def window_mean(
    xs: Sequence[float], ys: Sequence[float], end: float, width: float, step: bool = False
) -> float:
    """Mean of the curve over [end − width, end], exact for a piecewise-linear (trapezoid rule)
    or step curve; the window is clipped at the first point."""
    start = max(xs[0], end - width)
    if end - start <= 1e-12 * max(1.0, abs(end)):  # empty (or denormal) window: the point
        return interpolate(xs, ys, end, step)
    knots = [start] + [x for x in xs if start < x < end] + [end]
    vals = [interpolate(xs, ys, x, step) for x in knots]
    if step:
        area = sum((knots[i + 1] - knots[i]) * vals[i] for i in range(len(knots) - 1))
    else:
        area = sum(
            (knots[i + 1] - knots[i]) * (vals[i] + vals[i + 1]) / 2 for i in range(len(knots) - 1)
        )
    return area / (end - start)


def _axis(points: Sequence[EvalPoint], key: str) -> list[float]:
    return [float(getattr(p, key)) for p in points]


def language_losses_at(
    points: Sequence[EvalPoint], key: str, x: float, step: bool = False
) -> dict[str, float]:
    """Per-language loss at ``x`` along ``key``."""
    xs = _axis(points, key)
    langs = points[0].per_language.keys()
    return {
        lang: interpolate(xs, [p.per_language[lang] for p in points], x, step) for lang in langs
    }


def cycle_seconds(inner_steps: int, paces: Sequence[float]) -> float:
    """W = H · max_i p_i: one round of the slowest worker without DyLU (same for every method
    of a setting, so windows are comparable)."""
    return inner_steps * max(paces)


def readings(
    points: Sequence[EvalPoint],
    token_budget: int,
    time_budget: float,
    cycle: float,
    step: bool = False,
) -> dict[str, Any]:
    """Loss at T and at S, and their cycle averages, from an eval curve (``step`` for a
    synchronous run)."""
    if len(points) < 2:
        raise ValueError("a curve needs at least two evaluations")
    tok, sec = _axis(points, "tokens"), _axis(points, "time")
    loss = [p.loss for p in points]
    if tok[-1] < token_budget or sec[-1] < time_budget:
        raise ValueError(
            f"run stopped at {tok[-1]:.0f} tokens / {sec[-1]:.1f} s, before the budgets "
            f"({token_budget} tokens / {time_budget:.1f} s)"
        )
    token_window = cycle * token_budget / time_budget
    return {
        "loss_at_tokens": interpolate(tok, loss, token_budget, step),
        "loss_at_time": interpolate(sec, loss, time_budget, step),
        "cycle_loss_at_tokens": window_mean(tok, loss, token_budget, token_window, step),
        "cycle_loss_at_time": window_mean(sec, loss, time_budget, cycle, step),
        "per_language_at_tokens": language_losses_at(points, "tokens", token_budget, step),
        "per_language_at_time": language_losses_at(points, "time", time_budget, step),
        "initial_loss": loss[0],
    }


# -- one cell -------------------------------------------------------------------------------
def cell_overrides(cell: Cell, data_dir: Path | None) -> dict[str, Any]:
    """Dotted-key overrides that turn the regime preset into this cell's config."""
    out: dict[str, Any] = {
        "method": cell.method,
        "seed": cell.seed,
        "workers": len(cell.paces),
        "paces": list(cell.paces),
        "data.assignment": cell.split.assignment,
    }
    if cell.split.alpha is not None:
        out["data.dirichlet_alpha"] = cell.split.alpha
    if data_dir is not None:
        out["data.data_dir"] = str(data_dir)
    return out


def cell_config(
    cell: Cell, out_root: Path, data_dir: Path | None, extra: Mapping[str, Any] | None = None
) -> RunConfig:
    """The run config of a cell (regime preset + cell overrides + extra overrides)."""
    values = {**cell_overrides(cell, data_dir), **(extra or {})}
    values["out_dir"] = str(out_root / "runs" / cell.key)
    values["time_budget"] = "null"
    return load_config(preset=cell.regime, overrides=values)


def summarize_cell(cell: Cell, cfg: RunConfig, result: RunResult) -> CellResult:
    """Budget readings and diagnostics of a finished run."""
    assert cfg.token_budget is not None
    s = result.summary
    tbud = time_budget_for(cfg.token_budget, cell.paces, cfg.inner.tokens_per_step)
    synchronous = method_policy(cell.method).synchronous
    cyc = cycle_seconds(cfg.inner_steps, cell.paces)
    return CellResult(
        regime=cell.regime,
        paces=list(cell.paces),
        split=cell.split.label,
        method=cell.method,
        seed=cell.seed,
        token_budget=cfg.token_budget,
        time_budget=tbud,
        cycle_seconds=cyc,
        **readings(result.evals, cfg.token_budget, tbud, cyc, step=synchronous),
        tokens=s.tokens,
        sim_time=s.time,
        updates=s.updates,
        worker_shares=list(s.worker_shares),
        language_shares=dict(s.language_shares),
        staleness_mean=list(s.staleness_mean),
        staleness_max=list(s.staleness_max),
        correction=asdict(s.correction),
        wall_seconds=s.wall_seconds,
        run_dir=str(cfg.out_dir),
        payload=cell.payload,
    )


def run_cells(
    cells: Sequence[Cell],
    out_root: Path,
    data_dir: Path | None,
    extras: Sequence[Mapping[str, Any]] | None = None,
) -> list[CellResult | Exception]:
    """Run cells from scratch, simulated side by side in this process (their rounds batched
    together where they share a model shape; see :func:`heloco.sim.run_simulations`).
    Half-written run folders are cleared first; a failing cell gives its exception."""
    from heloco.sim import run_simulations

    extras = extras or [{}] * len(cells)
    outcomes: list[CellResult | Exception] = [ValueError("not run")] * len(cells)
    todo: list[tuple[int, RunConfig]] = []
    for i, (cell, extra) in enumerate(zip(cells, extras, strict=True)):
        try:
            cfg = cell_config(cell, out_root, data_dir, extra)
        except Exception as exc:  # reported per cell
            outcomes[i] = exc
            continue
        assert cfg.out_dir is not None
        if cfg.out_dir.exists():
            shutil.rmtree(cfg.out_dir)
        todo.append((i, cfg))
    results = run_simulations([cfg for _, cfg in todo]) if todo else []
    for (i, cfg), result in zip(todo, results, strict=True):
        try:
            if isinstance(result, Exception):
                raise result
            assert cfg.out_dir is not None
            row = summarize_cell(cells[i], cfg, result)
            atomic_write_json(cfg.out_dir / CELL_FILE, asdict(row))
            outcomes[i] = row
        except Exception as exc:  # reported per cell
            outcomes[i] = exc
    return outcomes


def run_cell(
    cell: Cell, out_root: Path, data_dir: Path | None, extra: Mapping[str, Any] | None = None
) -> CellResult:
    """Run one cell from scratch (a half-written run folder is cleared first)."""
    outcome = run_cells([cell], out_root, data_dir, [extra or {}])[0]
    if isinstance(outcome, Exception):
        raise outcome
    return outcome


def load_cell_result(path: Path) -> CellResult:
    return CellResult(**json.loads(path.read_text(encoding="utf-8")))


def done_result(cell: Cell, out_root: Path, cfg: RunConfig | None = None) -> CellResult | None:
    """The stored result of a finished cell, or None. With ``cfg`` (the config the cell would
    run now), a cell run with another config is refused in one line: a grid folder holds one
    grid, so its results never mix runs of different settings."""
    path = out_root / "runs" / cell.key / CELL_FILE
    if not path.is_file():
        return None
    stored = path.parent / CONFIG_FILE
    if cfg is not None and stored.is_file():
        ran = json.loads(stored.read_text(encoding="utf-8"))
        if ran != json.loads(json.dumps(cfg.model_dump(mode="json"))):
            differ = sorted(k for k in cfg.model_dump(mode="json") if ran.get(k) != _json(cfg, k))
            raise UserInputError(
                "--out",
                str(out_root),
                f"a folder of this grid's settings (cell {cell.key} ran with other values of "
                f"{', '.join(differ[:4]) or 'its config'}); use a new folder or remove "
                f"{path.parent}",
            )
    return load_cell_result(path)


def _json(cfg: RunConfig, key: str) -> Any:
    """One key of ``cfg`` as its config.json holds it."""
    return json.loads(json.dumps(cfg.model_dump(mode="json")[key]))


# -- the grid -------------------------------------------------------------------------------
@dataclass
class GridRun:
    """Settings shared by every cell of one grid invocation."""

    out_root: Path
    data_dir: Path | None
    jobs: int = 2
    extra: dict[str, Any] = field(default_factory=dict)  # overrides applied to every cell
    regime_extra: dict[str, dict[str, Any]] = field(default_factory=dict)  # per regime, on top
    # per regime and payload row label, on top of both (a payload row's codec and link delays)
    payload_extra: dict[str, dict[str, dict[str, Any]]] = field(default_factory=dict)
    batch_cells: int = 1  # cells of one (regime, paces, split) simulated side by side per task
    executor: Executor = "local"
    ray_address: str | None = None  # None: a local Ray with ``jobs`` CPUs

    def overrides_for(self, cell: Cell) -> dict[str, Any]:
        payload = self.payload_extra.get(cell.regime, {}).get(cell.payload, {})
        return {**self.extra, **self.regime_extra.get(cell.regime, {}), **payload}


def _init_worker() -> None:
    """Grid-process setup: a small cache of built data (each cell sets its own thread count,
    ``threads`` of its config, so a cell gives the same losses in a pool or in process).

    Tokenising the corpus is the largest fixed cost of a short cell, and every method of a
    (regime, paces, seed) setting builds identical data (it depends only on the data config,
    the worker count and the seed; samplers are created per worker from the frozen streams).
    Cells of one task share their data already; across tasks, ``build_data`` is wrapped in an
    LRU cache here, in the grid's own processes only.
    """
    import heloco.sim.build

    if not hasattr(heloco.sim.build.build_data, "cache_info"):
        heloco.sim.build.build_data = functools.lru_cache(maxsize=4)(heloco.sim.build.build_data)


Task = tuple[tuple[Cell, ...], Path, Path | None, tuple[dict[str, Any], ...]]


def _run_task(task: Task) -> list[tuple[Cell, CellResult | str]]:
    cells, out_root, data_dir, extras = task
    outcomes = run_cells(cells, out_root, data_dir, extras)
    return [
        (c, o if isinstance(o, CellResult) else f"{type(o).__name__}: {o}")
        for c, o in zip(cells, outcomes, strict=True)
    ]


def grid_tasks(cells: Sequence[Cell], grid: GridRun) -> list[Task]:
    """Cells of one (regime, paces, split) in chunks of ``batch_cells``, ordered by their first
    cell's place in ``cells`` (so a seed-major grid still finishes whole seeds first)."""
    groups: dict[tuple[str, tuple[float, ...], Split], list[tuple[int, Cell]]] = {}
    for i, c in enumerate(cells):
        groups.setdefault((c.regime, c.paces, c.split), []).append((i, c))
    size = max(1, grid.batch_cells)
    chunks = [g[j : j + size] for g in groups.values() for j in range(0, len(g), size)]
    chunks.sort(key=lambda chunk: chunk[0][0])
    out_root = grid.out_root.resolve()
    data_dir = None if grid.data_dir is None else grid.data_dir.resolve()
    return [
        (
            tuple(c for _, c in chunk),
            out_root,
            data_dir,
            tuple(grid.overrides_for(c) for _, c in chunk),
        )
        for chunk in chunks
    ]


def run_grid(
    cells: Sequence[Cell],
    grid: GridRun,
    on_result: Callable[[Cell, CellResult | str, bool], None] | None = None,
) -> list[CellResult]:
    """Run the cells not yet done on ``grid.executor`` (``jobs`` processes or Ray CPUs; each
    task simulates ``batch_cells`` cells side by side, each cell with its config's threads);
    rewrite results.jsonl/csv after each finished task. Returns every finished result. The
    files are the same whichever executor ran a cell, so a grid resumes on any of them."""
    grid.out_root.mkdir(parents=True, exist_ok=True)
    results: dict[str, CellResult] = {}
    todo: list[Cell] = []
    for cell in cells:
        prev = None
        if (grid.out_root / "runs" / cell.key / CELL_FILE).is_file():
            now = cell_config(cell, grid.out_root, grid.data_dir, grid.overrides_for(cell))
            prev = done_result(cell, grid.out_root, now)
        if prev is None:
            todo.append(cell)
        else:
            results[cell.key] = prev
            if on_result is not None:
                on_result(cell, prev, True)
    tasks = grid_tasks(todo, grid)
    runs = run_tasks(_run_task, tasks, grid.executor, grid.jobs, _init_worker, grid.ray_address)
    for outcomes in runs:
        for cell, outcome in outcomes:
            if isinstance(outcome, CellResult):
                results[cell.key] = outcome
        write_results(grid.out_root, [results[c.key] for c in cells if c.key in results])
        if on_result is not None:
            for cell, outcome in outcomes:
                on_result(cell, outcome, False)
    return [results[c.key] for c in cells if c.key in results]


def write_results(out_root: Path, rows: Sequence[CellResult]) -> None:
    """results.jsonl (full rows) and results.csv (headline columns), both atomically."""
    jsonl = "".join(json.dumps(asdict(r), allow_nan=False) + "\n" for r in rows)
    atomic_write_text(out_root / RESULTS_JSONL, jsonl)
    buf = io.StringIO()
    writer = csv.writer(buf)
    writer.writerow(CSV_COLUMNS)
    for r in rows:
        writer.writerow([r.paces_label if c == "paces" else getattr(r, c) for c in CSV_COLUMNS])
    atomic_write_text(out_root / RESULTS_CSV, buf.getvalue())


def read_results(out_root: Path) -> list[CellResult]:
    """Every finished cell under ``out_root/runs`` (the source of truth, not the CSV)."""
    return [load_cell_result(p) for p in sorted((out_root / "runs").rglob(CELL_FILE))]


# -- aggregation ----------------------------------------------------------------------------
@dataclass(frozen=True)
class Spread:
    """Mean ± sample standard deviation over seeds (std 0 with one seed)."""

    mean: float
    std: float
    n: int

    def fmt(self, spec: str = ".4f", scale: float = 1.0, suffix: str = "") -> str:
        if self.n == 0 or not math.isfinite(self.mean):
            return "-"
        m, s = self.mean * scale, self.std * scale
        if self.n == 1:
            return f"{m:{spec}}{suffix}"
        return f"{m:{spec}} ± {s:{spec}}{suffix}"


def spread(values: Iterable[float]) -> Spread:
    xs = [v for v in values if math.isfinite(v)]
    if not xs:
        return Spread(math.nan, math.nan, 0)
    return Spread(statistics.fmean(xs), statistics.stdev(xs) if len(xs) > 1 else 0.0, len(xs))


def relative_improvement(baseline: float, method: float) -> float:
    """(L_base − L_method) / L_base: positive when ``method`` has the lower loss."""
    return (baseline - method) / baseline


def paired_improvement(
    rows: Sequence[CellResult], method: str, baseline: str, metric: str
) -> Spread:
    """Per-seed relative improvement of ``method`` over ``baseline`` (same setting)."""
    by_seed: dict[str, dict[int, float]] = {method: {}, baseline: {}}
    for r in rows:
        if r.method in by_seed:
            by_seed[r.method][r.seed] = float(getattr(r, metric))
    seeds = sorted(set(by_seed[method]) & set(by_seed[baseline]))
    return spread(relative_improvement(by_seed[baseline][s], by_seed[method][s]) for s in seeds)


def elapsed(t0: float) -> str:
    return f"{time.perf_counter() - t0:,.0f} s"
