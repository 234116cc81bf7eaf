"""Tables and plots from run folders (``events.jsonl`` + ``summary.json`` + ``config.json``).

A run folder is what ``heloco simulate --out`` or ``heloco serve`` writes (schema in
docs/heloco-metrics.md). Comparing runs that stopped at different points is done at the
common budget: the largest token count (and simulated time) that every run reached, with the
loss linearly interpolated between evaluations.
"""

from __future__ import annotations

import json
import math
from collections.abc import Iterator, Sequence
from dataclasses import asdict, dataclass
from pathlib import Path
from typing import Annotated, Any

from pydantic import BaseModel, ConfigDict, Field, ValidationError

from heloco.curve import value_at
from heloco.metrics import EVENTS_FILE, SUMMARY_FILE, EvalPoint
from heloco.runfolder import CONFIG_FILE, run_ids
from shardmeter.errors import UserInputError, from_pydantic
from shardmeter.io import atomic_path

PLOT_FORMATS = ("png", "svg")
REPORT_FILES = ("report.json", "table.md")  # what `heloco report` writes into its --out


@dataclass(frozen=True)
class RunData:
    """One run folder, read back."""

    path: Path
    label: str
    evals: list[EvalPoint]
    summary: dict[str, Any]
    config: dict[str, Any]

    @property
    def method(self) -> str:
        return str(self.summary.get("method") or self.config.get("method") or "?")

    @property
    def languages(self) -> list[str]:
        return sorted(self.evals[-1].per_language) if self.evals else []


@dataclass(frozen=True)
class RunRow:
    """One line of the comparison table."""

    label: str
    method: str
    paces: str
    tokens: int
    time: float
    updates: int
    initial_loss: float
    final_loss: float
    loss_at_common_tokens: float
    loss_at_common_time: float
    cycle_loss: float | None


Loss = Annotated[float | None, Field(allow_inf_nan=True)]  # null: not measured
Count = Annotated[int, Field(ge=0, le=2**62)]


class EvalEvent(BaseModel):
    """The fields of an ``eval`` event the report reads (docs/heloco-metrics.md)."""

    model_config = ConfigDict(extra="ignore", strict=True)

    tokens: Count
    steps: Count = 0
    time: Annotated[float, Field(ge=0, allow_inf_nan=False)]
    revision: Count = 0
    loss: Loss
    per_language: dict[str, Loss] = {}
    cycle_loss: Loss = None

    def point(self) -> EvalPoint:
        def num(x: float | None) -> float:
            return math.nan if x is None else float(x)

        return EvalPoint(
            tokens=self.tokens,
            steps=self.steps,
            time=float(self.time),
            revision=self.revision,
            loss=num(self.loss),
            per_language={k: num(v) for k, v in self.per_language.items()},
            cycle_loss=num(self.cycle_loss),
        )


def iter_events(path: Path) -> Iterator[tuple[int, dict[str, Any]]]:
    """(line number, event) for each JSON object line of an events.jsonl; a line that is not
    JSON (a torn last line of a live run) or not an object is skipped."""
    with path.open(encoding="utf-8", errors="replace") as fh:
        for number, line in enumerate(fh, 1):
            try:
                event = json.loads(line)
            except (json.JSONDecodeError, RecursionError):
                continue
            if isinstance(event, dict):
                yield number, event


def read_evals(path: Path) -> list[EvalPoint]:
    """The ``eval`` events of an events.jsonl (:func:`iter_events`); an eval event with
    missing or malformed fields is a one-line error, and so is a file whose events carry two
    run ids (two runs written into one folder)."""
    points = []
    runs: dict[str, int] = {}  # run id -> first line
    for number, event in iter_events(path):
        for rid in run_ids([event]):
            runs.setdefault(rid, number)
        if len(runs) > 1:
            first, second = list(runs.items())[:2]
            raise UserInputError(
                "RUN_DIR",
                str(path.parent),
                f"a folder holding one run (events of run {first[0]} from line "
                f"{first[1]}, of run {second[0]} from line {second[1]}); rerun into a new "
                "folder or with --overwrite",
            )
        if event.get("type") != "eval":
            continue
        try:
            points.append(EvalEvent.model_validate(event).point())
        except ValidationError as exc:
            raise from_pydantic(exc, f"{path}:{number}", whole="eval event") from None
    return points


def _read_json(path: Path) -> dict[str, Any]:
    """A JSON object file, or {} when it is absent or not a JSON object (nothing to show)."""
    if not path.is_file():
        return {}
    try:
        data = json.loads(path.read_text(encoding="utf-8", errors="replace"))
    except (json.JSONDecodeError, RecursionError):
        return {}
    return data if isinstance(data, dict) else {}


def _finite(x: Any) -> float | None:
    """A finite number from a summary field, else None (a hand-edited file is no crash)."""
    if isinstance(x, bool) or not isinstance(x, int | float):
        return None
    return float(x) if math.isfinite(x) else None


def is_run_dir(path: Path) -> bool:
    return (path / EVENTS_FILE).is_file()


def is_report_dir(path: Path) -> bool:
    """A folder `heloco report` wrote (no run of its own), e.g. ``runs/report`` of ``runs/*``."""
    return not is_run_dir(path) and any((path / name).is_file() for name in REPORT_FILES)


def find_run_dirs(paths: Sequence[Path]) -> list[Path]:
    """Run folders among ``paths``; a folder without events.jsonl is searched recursively.

    Report folders are skipped, so ``heloco report runs/*`` works again after its first run
    wrote ``runs/report``.
    """
    found: list[Path] = []
    for p in paths:
        if not p.is_dir():
            raise UserInputError("RUN_DIR", str(p), "an existing run folder (with events.jsonl)")
        if is_report_dir(p):
            continue
        if is_run_dir(p):
            found.append(p)
            continue
        nested = sorted(e.parent for e in p.rglob(EVENTS_FILE))
        if not nested:
            raise UserInputError("RUN_DIR", str(p), "a folder holding events.jsonl (a run folder)")
        found.extend(nested)
    if not found:
        names = ", ".join(str(p) for p in paths)
        raise UserInputError("RUN_DIR", names, "at least one run folder (these are reports)")
    return found


def short_labels(paths: Sequence[Path]) -> list[str]:
    """The shortest distinct trailing parts of the paths (``a/heloco/s0`` -> ``heloco/s0``)."""
    parts = [p.resolve().parts for p in paths]
    for n in range(1, max(len(x) for x in parts) + 1):
        labels = ["/".join(x[-n:]) for x in parts]
        if len(set(labels)) == len(labels):
            return labels
    return [str(p) for p in paths]


def load_runs(paths: Sequence[Path]) -> list[RunData]:
    """Read every run folder (recursively); each needs at least one evaluation."""
    dirs = find_run_dirs(paths)
    runs = []
    for d, label in zip(dirs, short_labels(dirs), strict=True):
        evals = read_evals(d / EVENTS_FILE)
        if not evals:
            raise UserInputError("RUN_DIR", str(d), "a run with at least one evaluation")
        runs.append(
            RunData(d, label, evals, _read_json(d / SUMMARY_FILE), _read_json(d / CONFIG_FILE))
        )
    return runs


def loss_at(points: Sequence[EvalPoint], x: float, key: str) -> float:
    """Loss at ``x`` along ``key`` ('tokens' or 'time'), linear between evals; nan if the run
    did not reach ``x`` (`heloco.curve.value_at`)."""
    xs = [float(getattr(p, key)) for p in points]
    return value_at(xs, [p.loss for p in points], x, "nan")


def common_budget(runs: Sequence[RunData], key: str) -> float:
    """The largest ``key`` value every run reached."""
    return min(float(getattr(r.evals[-1], key)) for r in runs)


def comparison_rows(runs: Sequence[RunData]) -> list[RunRow]:
    """One row per run; losses at the common token and time budgets."""
    tok, sec = common_budget(runs, "tokens"), common_budget(runs, "time")
    rows = []
    for r in runs:
        last = r.evals[-1]
        paces = r.summary.get("paces") or r.config.get("paces") or []
        numbers = [_finite(p) for p in paces] if isinstance(paces, list) else []
        updates = _finite(r.summary.get("updates"))
        rows.append(
            RunRow(
                label=r.label,
                method=r.method,
                paces=",".join(f"{p:g}" for p in numbers) if None not in numbers else "",
                tokens=last.tokens,
                time=last.time,
                updates=int(updates) if updates is not None else last.revision,
                initial_loss=r.evals[0].loss,
                final_loss=last.loss,
                loss_at_common_tokens=loss_at(r.evals, tok, "tokens"),
                loss_at_common_time=loss_at(r.evals, sec, "time"),
                cycle_loss=_finite(r.summary.get("cycle_loss")),
            )
        )
    return rows


TABLE_HEADER = (
    "run",
    "method",
    "paces",
    "tokens",
    "sim. time (s)",
    "updates",
    "loss start",
    "loss end",
    "loss @ common tokens",
    "loss @ common time",
    "last-cycle mean",
)


def _f(x: float | None, spec: str = ".4f") -> str:
    return "-" if x is None or not math.isfinite(x) else format(x, spec)


def row_cells(r: RunRow) -> list[str]:
    return [
        r.label,
        r.method,
        r.paces,
        f"{r.tokens:,}",
        f"{r.time:,.0f}",
        f"{r.updates:,}",
        _f(r.initial_loss),
        _f(r.final_loss),
        _f(r.loss_at_common_tokens),
        _f(r.loss_at_common_time),
        _f(r.cycle_loss),
    ]


def markdown_table(runs: Sequence[RunData]) -> str:
    """The comparison table as GitHub markdown, with the common budgets in a caption line."""
    tok, sec = common_budget(runs, "tokens"), common_budget(runs, "time")
    lines = [
        f"Common budgets: {tok:,.0f} tokens, {sec:,.1f} s (simulated or wall, as the runs "
        "recorded).",
        "",
        "| " + " | ".join(TABLE_HEADER) + " |",
        "|" + "---|" * len(TABLE_HEADER),
    ]
    lines += ["| " + " | ".join(row_cells(r)) + " |" for r in comparison_rows(runs)]
    return "\n".join(lines) + "\n"


def language_table(runs: Sequence[RunData]) -> tuple[list[str], list[list[str]]]:
    """Final per-language loss of each run (header, rows)."""
    langs = sorted({lang for r in runs for lang in r.languages})
    rows = [[r.label] + [_f(r.evals[-1].per_language.get(lg)) for lg in langs] for r in runs]
    return ["run", *langs], rows


# -- plots ----------------------------------------------------------------------------------
def save_figure(fig: Any, out_dir: Path, stem: str) -> list[Path]:
    """``out_dir/stem.png`` and ``.svg``, each written atomically."""
    paths = []
    for fmt in PLOT_FORMATS:
        path = out_dir / f"{stem}.{fmt}"
        with atomic_path(path) as tmp:
            fig.savefig(tmp, format=fmt, dpi=120, bbox_inches="tight")
        paths.append(path)
    return paths


def plot_runs(runs: Sequence[RunData], out_dir: Path) -> list[Path]:
    """Loss vs tokens, loss vs time, and per-language loss vs tokens; each as PNG and SVG."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    out_dir.mkdir(parents=True, exist_ok=True)
    written: list[Path] = []
    for key, xlabel, stem in (
        ("tokens", "training tokens", "loss_vs_tokens"),
        ("time", "time (s)", "loss_vs_time"),
    ):
        fig, ax = plt.subplots(figsize=(7, 4.5))
        for r in runs:
            ax.plot([getattr(p, key) for p in r.evals], [p.loss for p in r.evals], label=r.label)
        ax.set_xlabel(xlabel)
        ax.set_ylabel("validation loss (nats/token)")
        ax.grid(alpha=0.3)
        ax.legend(fontsize="small")
        written += save_figure(fig, out_dir, stem)
        plt.close(fig)
    langs = sorted({lang for r in runs for lang in r.languages})
    if langs:
        cols = min(3, len(langs))
        nrows = math.ceil(len(langs) / cols)
        fig, axes = plt.subplots(nrows, cols, figsize=(4.2 * cols, 3.2 * nrows), squeeze=False)
        for ax, lang in zip(axes.flat, langs, strict=False):
            for r in runs:
                pts = [p for p in r.evals if lang in p.per_language]
                ax.plot([p.tokens for p in pts], [p.per_language[lang] for p in pts], label=r.label)
            ax.set_title(lang)
            ax.set_xlabel("training tokens")
            ax.grid(alpha=0.3)
        for ax in list(axes.flat)[len(langs) :]:
            ax.axis("off")
        axes.flat[0].set_ylabel("validation loss")
        axes.flat[0].legend(fontsize="x-small")
        fig.tight_layout()
        written += save_figure(fig, out_dir, "loss_per_language")
        plt.close(fig)
    return written


def runs_to_json(runs: Sequence[RunData]) -> dict[str, Any]:
    """The comparison as a JSON-able dict (non-finite numbers as null)."""

    def clean(x: Any) -> Any:
        return None if isinstance(x, float) and not math.isfinite(x) else x

    rows = comparison_rows(runs)
    return {
        "common_tokens": common_budget(runs, "tokens"),
        "common_time": common_budget(runs, "time"),
        "runs": [
            {k: clean(v) for k, v in {**asdict(r), "path": str(run.path)}.items()}
            | {"final_per_language": run.evals[-1].per_language}
            for r, run in zip(rows, runs, strict=True)
        ],
    }
