"""Run folders hold one run each: a command refuses a folder that already holds files unless
told to replace them (``--overwrite``) or, where a run can continue, to continue it
(``--resume``).

Every event a run writes carries the run's id (``run``, :func:`new_run_id`), so a folder whose
events come from two runs is recognised when it is read (:func:`run_ids`).
"""

from __future__ import annotations

import shutil
import uuid
from collections.abc import Iterable
from pathlib import Path

from shardmeter.errors import UserInputError

RUN_ID_FIELD = "run"  # the key of the run id in every event of events.jsonl
CONFIG_FILE = "config.json"  # the run file, as JSON (heloco.config.RunConfig), of every run

# What a server (and a simulated run) writes into its run folder.
SERVER_FILES = (
    "events.jsonl",
    "summary.json",
    CONFIG_FILE,
    "config.toml",
    "status.json",
    "address.txt",
    "topology.json",
)
SERVER_DIRS = ("checkpoints",)
# ... and what `heloco launch` adds around it: --overwrite of a launch removes all of these.
RUN_FILES = (*SERVER_FILES, "launch-config.toml", "wan.json")
RUN_DIRS = (*SERVER_DIRS, "workers", "logs", "keys")


def new_run_id() -> str:
    """A fresh run id: 12 hex digits, random (two runs never share one in practice)."""
    return uuid.uuid4().hex[:12]


def holds_run(
    path: Path, files: tuple[str, ...] = RUN_FILES, dirs: tuple[str, ...] = RUN_DIRS
) -> bool:
    """Whether ``path`` holds one of ``files`` or ``dirs`` (what a heloco run writes)."""
    return any((path / name).exists() for name in (*files, *dirs))


def is_nonempty(path: Path) -> bool:
    """Whether ``path`` is a folder with anything in it."""
    return path.is_dir() and any(path.iterdir())


def clear_run(
    path: Path, files: tuple[str, ...] = RUN_FILES, dirs: tuple[str, ...] = RUN_DIRS
) -> None:
    """Remove ``files`` and ``dirs`` (what a heloco run writes) from ``path``; nothing else in
    it is touched."""
    for name in files:
        (path / name).unlink(missing_ok=True)
    for name in dirs:
        if (path / name).is_dir():
            shutil.rmtree(path / name)


def prepare(
    flag: str, path: Path, overwrite: bool, resume: bool | None = None, server: bool = False
) -> None:
    """Make ``path`` ready for a new run, or refuse in one line.

    A folder that is not empty (``server``: that holds a server's files, since a launcher puts
    its keys and logs there first) is refused unless ``overwrite`` (the run's files are removed
    first; a server's only, for ``server``) or ``resume`` (left as it is; None: the command
    cannot resume, and the message names only ``--overwrite``).
    """
    files, dirs = (SERVER_FILES, SERVER_DIRS) if server else (RUN_FILES, RUN_DIRS)
    taken = path.is_dir() and holds_run(path, files, dirs) if server else is_nonempty(path)
    if not taken or resume:
        return
    if not overwrite:
        also = " or --resume to continue its run" if resume is not None else ""
        raise UserInputError(
            flag,
            str(path),
            f"an empty or new folder (this one holds files); add --overwrite to replace its "
            f"run{also}",
        )
    clear_run(path, files, dirs)


def run_ids(events: Iterable[dict[str, object]]) -> list[str]:
    """The distinct run ids of ``events`` in order of first appearance (events written before
    runs had ids count as none)."""
    seen: dict[str, None] = {}
    for event in events:
        rid = event.get(RUN_ID_FIELD)
        if isinstance(rid, str):
            seen.setdefault(rid, None)
    return list(seen)
