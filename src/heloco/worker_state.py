"""A worker's state on its own disk, so a restarted worker process continues its data exactly.

Before each push the worker writes two states atomically (one safetensors file, JSON in its
metadata): the one at the round's start and the one at its end, each keyed by the slot's
accepted inner steps at that point (``S`` and ``S + H``). A restarted worker asks the server
(the welcome's ``worker_steps``) how many steps of its slot were accepted and loads the state
with that key: if the crash lost the push, the round's data is read again (it never reached
the model); if the push was applied, the worker continues after it. Data that reached the
model is never replayed, and none is skipped.
"""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import torch
from safetensors.torch import load_file, save_file

from heloco.rounds import StateDict
from shardmeter.io import atomic_path

META_KEY = "heloco.worker_state"


def save_states(path: Path, states: dict[int, StateDict]) -> None:
    """Write ``{accepted_steps: state}`` to ``path`` atomically (temp file + os.replace)."""
    tensors: dict[str, torch.Tensor] = {}
    meta: dict[str, Any] = {}
    for steps, state in states.items():
        meta[str(steps)] = state["meta"]
        for name, t in state["tensors"].items():
            tensors[f"{steps}/{name}"] = t.detach().contiguous().cpu()
    with atomic_path(path, fsync=True) as tmp:
        save_file(tensors, str(tmp), metadata={META_KEY: json.dumps(meta)})


def load_states(path: Path) -> dict[int, StateDict]:
    """What :func:`save_states` wrote (empty if the file does not exist)."""
    if not path.is_file():
        return {}
    from safetensors import safe_open

    with safe_open(str(path), "pt") as fh:
        raw = (fh.metadata() or {}).get(META_KEY)
    if raw is None:
        raise ValueError(f"{path} is not a heloco worker state")
    tensors = load_file(str(path))
    states: dict[int, StateDict] = {}
    for key, meta in json.loads(raw).items():
        prefix = f"{key}/"
        own = {k[len(prefix) :]: v for k, v in tensors.items() if k.startswith(prefix)}
        states[int(key)] = {"meta": meta, "tensors": own}
    return states


def pick_state(states: dict[int, StateDict], accepted_steps: int) -> StateDict | None:
    """The state saved at ``accepted_steps``; else the latest one not past it (a lost round
    is read again rather than skipped); None if there is none."""
    if accepted_steps in states:
        return states[accepted_steps]
    earlier = [k for k in states if k <= accepted_steps]
    return states[max(earlier)] if earlier else None
