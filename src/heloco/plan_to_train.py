"""Time and cost to a target loss: simulated loss curves on predicted wall-clock and dollars.

A run simulated with paces from a topology (heloco.topology) has a clock whose seconds are
`scale` real seconds of the planned run. Each eval of its events.jsonl becomes a point with

    wall_s      = simulated time × scale                                      (heloco.topology)
    usd         = wall_s · Σ_i n_i·price_i / 3600 + Σ_rounds≤t egress_w       (design doc C.10)
    real_tokens = Σ_rounds≤t steps_w · tokens_per_step_w                      (planned model)

where the sums run over the rounds (round events) that finished by the eval, every island is
rented for the whole run, and egress_w prices worker w's push + pull on its path to the hub.
The time, cost and real tokens to a target loss are linearly interpolated between the two
evals that bracket its first crossing (as heloco.metrics.loss_at does for budgets).
"""

from __future__ import annotations

import itertools
import json
import math
from collections.abc import Sequence
from dataclasses import asdict, dataclass
from pathlib import Path
from typing import Any, Literal

from heloco.metrics import EVENTS_FILE, SUMMARY_FILE, atomic_write_json
from heloco.topology import PaceMap, read_pace_map
from shardmeter.errors import UserInputError
from shardmeter.io import atomic_path

RESULT_FILE = "plan_to_train.json"
PLOT_STEM = "plan_to_train"
LossKey = Literal["loss", "cycle_loss"]


@dataclass(frozen=True)
class CurvePoint:
    """One evaluation placed on the planned run's clock and bill."""

    sim_time: float  # simulated seconds
    wall_s: float  # predicted real seconds
    usd: float  # predicted dollars spent so far
    sim_tokens: float  # tokens the small simulated model trained on
    real_tokens: float  # tokens the planned model would have trained on
    loss: float  # validation loss, nats/token


@dataclass(frozen=True)
class MethodCurve:
    """A method's loss curve on predicted wall-clock and dollars."""

    method: str
    run_dir: Path
    points: tuple[CurvePoint, ...]

    @property
    def final(self) -> CurvePoint:
        """The last point of the curve."""
        return self.points[-1]


@dataclass(frozen=True)
class TargetOutcome:
    """What reaching the target loss costs one method (inf where never reached)."""

    method: str
    target_loss: float
    reached: bool
    wall_s: float
    cost_usd: float
    real_tokens: float
    sim_tokens: float
    tokens_per_s: float  # real tokens / wall-clock up to the crossing
    final_loss: float
    run_tokens_per_s: float  # real tokens / wall-clock over the whole run

    @property
    def hours(self) -> float:
        """Wall-clock time to the target, in hours."""
        return self.wall_s / 3600.0


@dataclass(frozen=True)
class PlanToTrain:
    """Every method's outcome at one target loss, fastest first, with the curves behind it."""

    topology: str
    planned_model: str
    scale: float  # real seconds per simulated second
    target_loss: float
    outcomes: tuple[TargetOutcome, ...]
    curves: tuple[MethodCurve, ...]


def _read_events(run_dir: Path) -> list[dict[str, Any]]:
    path = run_dir / EVENTS_FILE
    if not path.is_file():
        raise UserInputError("run", str(run_dir), "a run folder with events.jsonl")
    out = []
    for n, line in enumerate(path.read_text(encoding="utf-8").splitlines(), 1):
        if not line.strip():
            continue
        try:
            out.append(json.loads(line))
        except json.JSONDecodeError:
            raise UserInputError(f"{path}:{n}", line[:40], "one JSON object per line") from None
    return out


def _method(run_dir: Path) -> str:
    path = run_dir / SUMMARY_FILE
    if not path.is_file():
        raise UserInputError("run", str(run_dir), "a finished run folder (summary.json)")
    return str(json.loads(path.read_text(encoding="utf-8"))["method"])


def curve_from_events(
    method: str,
    run_dir: Path,
    events: Sequence[dict[str, Any]],
    pm: PaceMap,
    loss_key: LossKey = "loss",
) -> MethodCurve:
    """Place each eval event on the planned clock and bill (module docstring)."""
    n = len(pm.islands)
    tokens_per_step = [i.tokens_per_step for i in pm.islands]
    egress = pm.egress_usd_per_round
    rounds = sorted(
        (float(e["time"]), int(e["worker"]), int(e["steps"]))
        for e in events
        if e.get("type") == "round"
    )
    points: list[CurvePoint] = []
    k = 0
    real_tokens = 0.0
    egress_usd = 0.0
    for e in events:
        if e.get("type") != "eval" or e.get(loss_key) is None:
            continue
        t = float(e["time"])
        while k < len(rounds) and rounds[k][0] <= t:
            _, w, steps = rounds[k]
            if not 0 <= w < n:
                raise UserInputError("round.worker", w, f"0..{n - 1}: the pace map has {n} islands")
            real_tokens += steps * tokens_per_step[w]
            egress_usd += egress[w]
            k += 1
        wall = t * pm.scale
        points.append(
            CurvePoint(
                sim_time=t,
                wall_s=wall,
                usd=wall * pm.usd_per_s + egress_usd,
                sim_tokens=float(e["tokens"]),
                real_tokens=real_tokens,
                loss=float(e[loss_key]),
            )
        )
    if not points:
        raise UserInputError("run", str(run_dir), "a run with eval events")
    return MethodCurve(method, run_dir, tuple(points))


def load_curve(run_dir: Path, pm: PaceMap | None = None, loss_key: LossKey = "loss") -> MethodCurve:
    """A run folder's curve; the pace map defaults to the run's own topology.json."""
    pace = pm if pm is not None else read_pace_map(run_dir)
    if pace is None:
        raise UserInputError(
            "run", str(run_dir), "a run simulated with --topology (topology.json), or a pace map"
        )
    return curve_from_events(_method(run_dir), run_dir, _read_events(run_dir), pace, loss_key)


def _interp(a: CurvePoint, b: CurvePoint, frac: float) -> CurvePoint:
    def mix(x: float, y: float) -> float:
        return x + frac * (y - x)

    return CurvePoint(
        sim_time=mix(a.sim_time, b.sim_time),
        wall_s=mix(a.wall_s, b.wall_s),
        usd=mix(a.usd, b.usd),
        sim_tokens=mix(a.sim_tokens, b.sim_tokens),
        real_tokens=mix(a.real_tokens, b.real_tokens),
        loss=mix(a.loss, b.loss),
    )


def crossing(curve: MethodCurve, target: float) -> CurvePoint | None:
    """The point where the loss first reaches `target` (interpolated), None if never."""
    pts = curve.points
    if pts[0].loss <= target:
        return pts[0]
    for a, b in itertools.pairwise(pts):
        if b.loss <= target:
            frac = (a.loss - target) / (a.loss - b.loss) if a.loss != b.loss else 1.0
            return _interp(a, b, frac)
    return None


def loss_within(
    curve: MethodCurve, *, wall_s: float | None = None, usd: float | None = None
) -> float | None:
    """Validation loss when the wall-clock (or dollar) budget runs out, interpolated between
    evals; None when the run stopped before the budget."""
    if (wall_s is None) == (usd is None):
        raise UserInputError("budget", (wall_s, usd), "give exactly one of wall_s or usd")
    key, budget = ("wall_s", wall_s) if wall_s is not None else ("usd", usd)
    assert budget is not None
    pts = curve.points
    if budget < getattr(pts[0], key):
        return None
    for a, b in itertools.pairwise(pts):
        xa, xb = getattr(a, key), getattr(b, key)
        if xa <= budget <= xb:
            return b.loss if xb == xa else a.loss + (b.loss - a.loss) * (budget - xa) / (xb - xa)
    return pts[-1].loss if budget == getattr(pts[-1], key) else None


def outcome(curve: MethodCurve, target: float) -> TargetOutcome:
    """Time, dollars and tokens of `curve` to `target`, with the tokens/s behind them."""
    hit = crossing(curve, target)
    end = curve.final
    run_tps = end.real_tokens / end.wall_s if end.wall_s > 0 else 0.0
    if hit is None:
        inf = math.inf
        return TargetOutcome(
            curve.method, target, False, inf, inf, inf, inf, 0.0, end.loss, run_tps
        )
    tps = hit.real_tokens / hit.wall_s if hit.wall_s > 0 else 0.0
    return TargetOutcome(
        method=curve.method,
        target_loss=target,
        reached=True,
        wall_s=hit.wall_s,
        cost_usd=hit.usd,
        real_tokens=hit.real_tokens,
        sim_tokens=hit.sim_tokens,
        tokens_per_s=tps,
        final_loss=end.loss,
        run_tokens_per_s=run_tps,
    )


def default_target(curves: Sequence[MethodCurve]) -> float:
    """The lowest loss every curve reaches (as shardmeter.quality.default_target)."""
    return max(min(p.loss for p in c.points) for c in curves)


def plan_to_train(
    run_dirs: Sequence[Path],
    pm: PaceMap | None = None,
    target_loss: float | None = None,
    loss_key: LossKey = "loss",
) -> PlanToTrain:
    """Predicted hours and dollars to `target_loss` (default: the lowest every run reaches)
    for each run, fastest first."""
    if not run_dirs:
        raise UserInputError("runs", [], "at least one run folder")
    if target_loss is not None and not (math.isfinite(target_loss) and target_loss > 0):
        raise UserInputError("target_loss", target_loss, "a finite loss > 0 (nats/token)")
    curves = tuple(load_curve(Path(d), pm, loss_key) for d in run_dirs)
    pace = pm if pm is not None else read_pace_map(Path(run_dirs[0]))
    assert pace is not None  # load_curve raised otherwise
    target = default_target(curves) if target_loss is None else float(target_loss)
    outcomes = sorted((outcome(c, target) for c in curves), key=lambda o: (o.wall_s, o.cost_usd))
    return PlanToTrain(
        topology=pace.topology,
        planned_model=pace.planned_model,
        scale=pace.scale,
        target_loss=target,
        outcomes=tuple(outcomes),
        curves=curves,
    )


def result_json(result: PlanToTrain) -> dict[str, Any]:
    """JSON view (non-finite numbers as null); curves included for re-plotting."""

    def clean(x: Any) -> Any:
        if isinstance(x, float) and not math.isfinite(x):
            return None
        if isinstance(x, dict):
            return {k: clean(v) for k, v in x.items()}
        if isinstance(x, list | tuple):
            return [clean(v) for v in x]
        if isinstance(x, Path):
            return str(x)
        return x

    out: dict[str, Any] = clean(asdict(result))
    return out


def write_result(result: PlanToTrain, out_dir: Path) -> Path:
    """Write the result JSON atomically into ``out_dir``; returns its path."""
    out_dir.mkdir(parents=True, exist_ok=True)
    path = out_dir / RESULT_FILE
    atomic_write_json(path, result_json(result))
    return path


def render(result: PlanToTrain) -> None:
    """Print the outcomes as a rich table."""
    from rich.console import Console
    from rich.table import Table

    table = Table(
        title=f"Time and cost to validation loss {result.target_loss:.4f}: {result.planned_model} "
        f"on {result.topology} (1 simulated s = {result.scale:.3g} s)"
    )
    cols = ("method", "hours", "dollars", "real tokens", "tokens/s", "run tokens/s", "final loss")
    for col in cols:
        table.add_column(col, justify="left" if col == "method" else "right")
    for o in result.outcomes:
        if not o.reached:
            row = ("not reached", "-", "-", "-")
        else:
            row = (
                f"{o.hours:,.2f}",
                f"${o.cost_usd:,.0f}",
                f"{o.real_tokens:.3g}",
                f"{o.tokens_per_s:,.0f}",
            )
        table.add_row(o.method, *row, f"{o.run_tokens_per_s:,.0f}", f"{o.final_loss:.4f}")
    Console().print(table)


def plot(result: PlanToTrain, out_dir: Path, stem: str = PLOT_STEM) -> list[Path]:
    """Loss against predicted hours and against dollars, one line per method (PNG + SVG)."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    fig, (ax_t, ax_c) = plt.subplots(1, 2, figsize=(11, 4.2), sharey=True)
    for curve in result.curves:
        hours = [p.wall_s / 3600.0 for p in curve.points]
        usd = [p.usd for p in curve.points]
        loss = [p.loss for p in curve.points]
        (line,) = ax_t.plot(hours, loss, marker=".", label=curve.method)
        ax_c.plot(usd, loss, marker=".", color=line.get_color(), label=curve.method)
        hit = crossing(curve, result.target_loss)
        if hit is not None:
            ax_t.plot(hit.wall_s / 3600.0, hit.loss, "o", color=line.get_color(), mfc="none")
            ax_c.plot(hit.usd, hit.loss, "o", color=line.get_color(), mfc="none")
    for ax in (ax_t, ax_c):
        ax.axhline(result.target_loss, color="grey", ls="--", lw=0.8, label="target")
        ax.grid(alpha=0.3)
    ax_t.set_xlabel("predicted wall-clock (hours)")
    ax_c.set_xlabel("predicted cost (USD)")
    ax_t.set_ylabel("validation loss (nats/token)")
    ax_c.legend(loc="upper right")
    fig.suptitle(f"{result.planned_model} on {result.topology}: loss vs predicted time and cost")
    fig.tight_layout()
    out_dir.mkdir(parents=True, exist_ok=True)
    paths = []
    for ext in ("png", "svg"):
        path = out_dir / f"{stem}.{ext}"
        with atomic_path(path) as tmp:
            fig.savefig(tmp, format=ext, dpi=120)
        paths.append(path)
    plt.close(fig)
    return paths
