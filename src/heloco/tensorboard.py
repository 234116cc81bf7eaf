"""TensorBoard scalars from a run's ``events.jsonl`` (which stays the canonical record).

``heloco tensorboard RUN_DIR`` converts a finished run, or follows a live one (``--follow``),
into TensorBoard event files under ``RUN_DIR/tensorboard`` (``--out`` elsewhere). The x axis
is training tokens; tags:

- ``train/loss/worker_<w>``: each round's mean inner loss; ``train/tokens_per_s/worker_<w>``
  the round's tokens over its seconds (simulated or wall, as the run's clock);
- ``eval/loss`` and ``eval/loss/<language>``; ``eval/cycle_loss``;
- ``update/staleness/worker_<w>``, ``update/<statistic>`` for every correction statistic of
  the outer step (``delta_norm``, ``cos_delta_momentum``, ``frac_kept``, ...);
- ``arrivals/share/worker_<w>`` and ``arrivals/weight_share/worker_<w>`` at each evaluation.

Needs the optional ``tensorboard`` extra (``pip install -e .[tensorboard]``).
"""

from __future__ import annotations

import json
import time
from collections.abc import Iterator
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Protocol

from shardmeter.errors import UserInputError

EVENTS_FILE = "events.jsonl"
NOT_STATS = {"type", "revision", "time", "tokens", "workers", "staleness"}


class ScalarWriter(Protocol):
    """The part of ``torch.utils.tensorboard.SummaryWriter`` used here."""

    def add_scalar(self, tag: str, scalar_value: float, global_step: int) -> None: ...

    def flush(self) -> None: ...

    def close(self) -> None: ...


@dataclass
class Scalars:
    """Maps event lines to (tag, value, tokens) scalars; keeps the token count it has seen."""

    tokens: int = 0
    seen: dict[str, int] = field(default_factory=dict)

    def of(self, event: dict[str, Any]) -> Iterator[tuple[str, float, int]]:
        """The scalars of one event line (none for kinds it does not plot)."""
        kind = event.get("type")
        if kind == "round":
            yield from self._round(event)
        elif kind == "update":
            yield from self._update(event)
        elif kind == "eval":
            yield from self._eval(event)

    def _round(self, e: dict[str, Any]) -> Iterator[tuple[str, float, int]]:
        self.tokens += int(e.get("tokens", 0))
        w = e.get("worker")
        if isinstance(e.get("train_loss"), int | float):
            yield f"train/loss/worker_{w}", float(e["train_loss"]), self.tokens
        seconds = float(e.get("time", 0.0)) - float(e.get("start", 0.0))
        if seconds > 0:
            yield f"train/tokens_per_s/worker_{w}", int(e.get("tokens", 0)) / seconds, self.tokens

    def _update(self, e: dict[str, Any]) -> Iterator[tuple[str, float, int]]:
        step = int(e.get("tokens", self.tokens))
        for w, s in zip(e.get("workers", []), e.get("staleness", []), strict=False):
            yield f"update/staleness/worker_{w}", float(s), step
        for key, value in e.items():
            if key not in NOT_STATS and isinstance(value, int | float):
                yield f"update/{key}", float(value), step

    def _eval(self, e: dict[str, Any]) -> Iterator[tuple[str, float, int]]:
        step = int(e.get("tokens", self.tokens))
        for key in ("loss", "cycle_loss"):
            if isinstance(e.get(key), int | float):
                yield f"eval/{key}", float(e[key]), step
        for lang, value in (e.get("per_language") or {}).items():
            if isinstance(value, int | float):
                yield f"eval/loss/{lang}", float(value), step
        for name, tag in (("worker_shares", "share"), ("weight_shares", "weight_share")):
            for w, value in enumerate(e.get(name) or []):
                yield f"arrivals/{tag}/worker_{w}", float(value), step


def summary_writer(log_dir: Path) -> ScalarWriter:
    """A TensorBoard writer, or a one-line error naming the extra to install."""
    try:
        from torch.utils.tensorboard import SummaryWriter
    except ImportError:
        raise UserInputError(
            "tensorboard", "not installed", "pip install -e '.[tensorboard]' (optional extra)"
        ) from None
    return SummaryWriter(log_dir=str(log_dir))


def _lines(path: Path, follow: bool, idle_s: float, poll_s: float) -> Iterator[str]:
    """Complete lines of ``path``; with ``follow``, wait for new ones until the run writes
    ``summary.json`` or nothing is appended for ``idle_s`` seconds."""
    with path.open("r", encoding="utf-8") as fh:
        buffered, quiet_since = "", time.monotonic()
        while True:
            chunk = fh.readline()
            if chunk:
                buffered += chunk
                if buffered.endswith("\n"):
                    yield buffered
                    buffered, quiet_since = "", time.monotonic()
                continue
            finished = (path.parent / "summary.json").is_file()
            if not follow or finished or time.monotonic() - quiet_since > idle_s:
                return
            time.sleep(poll_s)


def convert(
    run_dir: Path,
    log_dir: Path | None = None,
    follow: bool = False,
    idle_s: float = 600.0,
    poll_s: float = 1.0,
    writer: ScalarWriter | None = None,
) -> int:
    """Write the run's scalars to TensorBoard event files; returns how many were written."""
    path = run_dir / EVENTS_FILE
    if not path.is_file():
        raise UserInputError("RUN_DIR", str(run_dir), f"a run folder holding {EVENTS_FILE}")
    out = writer or summary_writer(log_dir or run_dir / "tensorboard")
    scalars, count = Scalars(), 0
    try:
        for line in _lines(path, follow, idle_s, poll_s):
            try:
                event = json.loads(line)
            except ValueError:
                continue  # a torn last line of a crashed run
            for tag, value, step in scalars.of(event):
                out.add_scalar(tag, value, step)
                count += 1
            if follow:
                out.flush()
    finally:
        out.close()
    return count
