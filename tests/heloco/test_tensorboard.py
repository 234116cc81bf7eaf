"""`heloco tensorboard`: a run's events.jsonl as TensorBoard scalars."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from heloco.cli import main
from heloco.tensorboard import Scalars, convert
from shardmeter.errors import UserInputError

EVENTS = [
    {
        "type": "eval",
        "tokens": 0,
        "loss": 5.5,
        "cycle_loss": 5.5,
        "per_language": {"en": 5.4},
        "worker_shares": [0.0, 0.0],
        "weight_shares": [0.0, 0.0],
    },
    {"type": "round", "worker": 1, "tokens": 100, "train_loss": 5.0, "start": 1.0, "time": 3.0},
    {
        "type": "update",
        "revision": 1,
        "time": 3.0,
        "tokens": 100,
        "workers": [1],
        "staleness": [2],
        "delta_norm": 0.5,
        "cos_delta_momentum": None,
        "frac_kept": 1.0,
    },
    {"type": "worker", "event": "joined", "worker": 0, "time": 0.1},
    {
        "type": "eval",
        "tokens": 100,
        "loss": 5.0,
        "per_language": {"en": 4.9},
        "worker_shares": [0.0, 1.0],
        "weight_shares": [0.0, 1.0],
    },
]


class Recorder:
    def __init__(self) -> None:
        self.scalars: list[tuple[str, float, int]] = []
        self.closed = False

    def add_scalar(self, tag: str, scalar_value: float, global_step: int) -> None:
        self.scalars.append((tag, scalar_value, global_step))

    def flush(self) -> None:
        pass

    def close(self) -> None:
        self.closed = True


def test_events_map_to_tagged_scalars(tmp_path: Path) -> None:
    (tmp_path / "events.jsonl").write_text("".join(json.dumps(e) + "\n" for e in EVENTS) + "{torn")
    rec = Recorder()
    n = convert(tmp_path, writer=rec)
    got = {tag: (value, step) for tag, value, step in rec.scalars}
    assert n == len(rec.scalars) and rec.closed
    assert got["train/loss/worker_1"] == (5.0, 100)
    assert got["train/tokens_per_s/worker_1"] == (50.0, 100)
    assert got["update/staleness/worker_1"] == (2.0, 100)
    assert got["update/delta_norm"] == (0.5, 100) and "update/cos_delta_momentum" not in got
    assert got["eval/loss"] == (5.0, 100) and got["eval/loss/en"] == (4.9, 100)
    assert got["arrivals/share/worker_1"] == (1.0, 100)
    assert Scalars().tokens == 0


def test_writes_event_files_and_rejects_a_non_run(tmp_path: Path) -> None:
    pytest.importorskip("tensorboard")
    (tmp_path / "events.jsonl").write_text("".join(json.dumps(e) + "\n" for e in EVENTS))
    assert main(["tensorboard", str(tmp_path)]) == 0
    assert list((tmp_path / "tensorboard").glob("events.out.tfevents.*"))
    with pytest.raises(UserInputError, match=r"events\.jsonl"):
        convert(tmp_path / "nope")
