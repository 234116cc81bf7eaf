"""Exact reproducibility: one config and seed give bit-identical losses whichever path runs it.

The paths: in this process (whose torch thread count differs from the config's), a spawned
process pool, a resumed grid (its last cell runs in process), and the network worker of
`heloco work` against the server of `heloco serve`. Every path sets torch's thread count from
the config (``threads``) before any work, so all of them sum in the same order.
"""

from __future__ import annotations

import json
import threading
from collections.abc import Iterator
from dataclasses import asdict
from pathlib import Path
from typing import Any

import pytest
import torch

from heloco.experiments import Cell, CellResult, GridRun, cell_config, run_grid
from heloco.net.client import ClientConfig
from heloco.net.endpoint import EndpointConfig
from heloco.net.session import Session
from heloco.net.worker_loop import NetWorker, WorkerOptions
from heloco.sim import SimConfig, run_simulation

pytestmark = [pytest.mark.slow, pytest.mark.timeout(300)]

CELL_EXTRA: dict[str, Any] = {
    "inner_steps": 2,
    "token_budget": 1536,
    "eval_every": 512,
    "eval_windows": 4,
    "threads": 1,
    "data.synthetic_chars_per_language": 30000,
    "data.val_chars_per_language": 5000,
}
CELLS = [Cell("default", (1.0, 2.0), "heloco", 0), Cell("default", (1.0, 2.0), "sync", 0)]
SECRET = b"reproducibility-test-secret-0123456789"
# Fields of a grid row that describe the process rather than the run.
VOLATILE = ("wall_seconds", "run_dir")


@pytest.fixture
def two_threads() -> Iterator[None]:
    """The caller runs with 3 threads: not the config's 1, nor a spawned process's default."""
    before = torch.get_num_threads()
    torch.set_num_threads(3)
    yield
    torch.set_num_threads(before)


def eval_losses(run_dir: Path) -> list[float]:
    lines = (run_dir / "events.jsonl").read_text(encoding="utf-8").splitlines()
    return [e["loss"] for e in map(json.loads, lines) if e["type"] == "eval"]


def row(r: CellResult) -> dict[str, Any]:
    return {k: v for k, v in asdict(r).items() if k not in VOLATILE}


def test_in_process_pool_and_resumed_grid_are_bit_identical(
    tmp_path: Path, two_threads: None
) -> None:
    cfg = cell_config(CELLS[0], tmp_path / "direct", None, CELL_EXTRA)
    direct = run_simulation(cfg).losses
    assert torch.get_num_threads() == 3  # the caller's count is restored

    fresh = run_grid(CELLS, GridRun(tmp_path / "pool", None, jobs=2, extra=CELL_EXTRA))
    pooled = eval_losses(tmp_path / "pool" / "runs" / CELLS[0].key)
    assert pooled == direct

    resumed_root = tmp_path / "resumed"
    run_grid(CELLS[1:], GridRun(resumed_root, None, jobs=1, extra=CELL_EXTRA))
    resumed = run_grid(CELLS, GridRun(resumed_root, None, jobs=2, extra=CELL_EXTRA))
    assert eval_losses(resumed_root / "runs" / CELLS[0].key) == direct
    assert [row(r) for r in resumed] == [row(r) for r in fresh]


def networked_losses(cfg: SimConfig, out: Path) -> list[float]:
    session = Session(
        cfg, SECRET, EndpointConfig(checkpoint_dir=out / "ck", drain_s=2.0), out_dir=out
    )
    server, address = session.serve_in_thread()
    client = ClientConfig(address, timeout_s=20, deadline_s=60)
    worker = threading.Thread(
        target=lambda: NetWorker(client, SECRET, WorkerOptions(worker=0)).run(), daemon=True
    )
    worker.start()
    worker.join(90)
    server.join(30)
    assert not server.is_alive() and not worker.is_alive()
    return [e.loss for e in session.traj.evals]


def test_network_worker_is_bit_identical_to_the_simulator(
    tmp_path: Path, two_threads: None
) -> None:
    values = {**CELL_EXTRA, "workers": 1, "paces": [1.0]}
    cfg = cell_config(CELLS[0], tmp_path / "sim", None, values)
    simulated = run_simulation(cfg).losses
    net_cfg = cfg.model_copy(update={"out_dir": None})
    assert networked_losses(net_cfg, tmp_path / "net") == simulated
