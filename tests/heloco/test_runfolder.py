"""Run folders hold one run: refusing a used folder, --overwrite, --resume, and the run ids
that let a reader tell two runs apart."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from heloco import runfolder
from heloco.metrics import EVENTS_FILE, MetricsWriter
from heloco.report import read_evals
from shardmeter.errors import UserInputError


def test_a_new_or_empty_folder_is_taken_as_it_is(tmp_path: Path) -> None:
    runfolder.prepare("--out", tmp_path / "new", overwrite=False)
    (tmp_path / "empty").mkdir()
    runfolder.prepare("--out", tmp_path / "empty", overwrite=False)


def test_a_used_folder_is_refused_in_one_line_naming_the_flags(tmp_path: Path) -> None:
    (tmp_path / "notes.txt").write_text("mine")
    with pytest.raises(UserInputError) as exc:
        runfolder.prepare("--out", tmp_path, overwrite=False)
    assert "--overwrite" in str(exc.value) and "--resume" not in str(exc.value)
    (tmp_path / "events.jsonl").write_text("{}\n")
    with pytest.raises(UserInputError) as exc:
        runfolder.prepare("--out", tmp_path, overwrite=False, resume=False, server=True)
    assert "--overwrite" in str(exc.value) and "--resume" in str(exc.value)
    assert len(str(exc.value).splitlines()) == 1


def test_overwrite_removes_only_the_run_and_resume_keeps_it(tmp_path: Path) -> None:
    for name in ("events.jsonl", "summary.json", "launch-config.toml", "notes.txt"):
        (tmp_path / name).write_text("x")
    for folder in ("checkpoints", "keys"):
        (tmp_path / folder).mkdir()
    runfolder.prepare("--out", tmp_path, overwrite=False, resume=True, server=True)
    assert (tmp_path / "events.jsonl").exists()  # resumed: left as it is
    runfolder.prepare("--out", tmp_path, overwrite=True, resume=False, server=True)
    # a server's overwrite keeps what a launcher put there (keys, its config)
    assert sorted(p.name for p in tmp_path.iterdir()) == ["keys", "launch-config.toml", "notes.txt"]
    runfolder.prepare("--out", tmp_path, overwrite=True)
    assert sorted(p.name for p in tmp_path.iterdir()) == ["notes.txt"]


def test_a_launchers_keys_and_logs_are_not_a_servers_run(tmp_path: Path) -> None:
    (tmp_path / "keys").mkdir()
    (tmp_path / "logs").mkdir()
    runfolder.prepare("--out", tmp_path, overwrite=False, resume=False, server=True)


def eval_line(tokens: int) -> dict[str, object]:
    return {"type": "eval", "tokens": tokens, "time": float(tokens), "loss": 3.0}


def test_events_of_two_runs_in_one_file_are_refused(tmp_path: Path) -> None:
    with MetricsWriter(tmp_path) as w:
        w.event(eval_line(0))
        w.event(eval_line(10))
        first = w.run_id
    assert [p.tokens for p in read_evals(tmp_path / EVENTS_FILE)] == [0, 10]
    with MetricsWriter(tmp_path, run_id=first, append=True) as w:  # the same run, resumed
        w.event(eval_line(20))
    assert len(read_evals(tmp_path / EVENTS_FILE)) == 3
    with (tmp_path / EVENTS_FILE).open("a") as fh:  # another run appended, as before ids
        fh.write(json.dumps(eval_line(0) | {"run": runfolder.new_run_id()}) + "\n")
    with pytest.raises(UserInputError) as exc:
        read_evals(tmp_path / EVENTS_FILE)
    assert "one run" in str(exc.value) and "line 4" in str(exc.value)
    assert runfolder.run_ids([{"run": "a"}, {}, {"run": "b"}, {"run": "a"}]) == ["a", "b"]
