"""Worker-side pieces that need no server: the pacer that emulates slower machines and stops
sleeping when the run is over, and the worker's own build (which holds no server)."""

from __future__ import annotations

import threading
import time
from typing import Any

import pytest
import torch

from heloco.net.client import ClientConfig
from heloco.net.worker_loop import NetWorker, Pacer, WorkerOptions
from heloco.server import Server
from heloco.sim import build_run, parse_sim_config


def run_steps(pacer: Pacer, steps: int, compute_s: float) -> float:
    """A round of ``steps`` steps of ``compute_s`` each, paced by the worker's on_step hook."""
    t0 = time.perf_counter()
    pacer.start_round()
    for i in range(steps):
        time.sleep(compute_s)
        pacer(i)
    return time.perf_counter() - t0


def test_pace_sets_a_floor_per_step() -> None:
    elapsed = run_steps(Pacer(pace=0.05), 4, 0.0)
    assert elapsed >= 4 * 0.05 * 0.98


def test_a_step_slower_than_the_pace_is_not_slowed_further() -> None:
    # 3 steps of 30 ms against a 10 ms floor: no sleep is added (generous bound).
    assert run_steps(Pacer(pace=0.01), 3, 0.03) < 3 * 0.03 + 0.5


def test_time_between_rounds_is_not_paced() -> None:
    # The idle gap before a round (pull, network) is not part of its first step.
    pacer = Pacer(pace=0.01)
    time.sleep(0.05)
    assert run_steps(pacer, 1, 0.0) < 0.05


def test_run_over_ends_the_sleep_at_once() -> None:
    over = threading.Event()
    pacer = Pacer(pace=30.0, over=over)  # without the stop, each step would last 30 s
    threading.Timer(0.05, over.set).start()
    assert run_steps(pacer, 3, 0.0) < 10


def test_a_worker_process_builds_no_server(
    monkeypatch: pytest.MonkeyPatch, tiny_net_values: Any
) -> None:
    """`heloco work` builds its worker from the welcome's run config through the same code as
    the simulator, but never constructs a Server (nor the outer optimizer's state); its first
    round is the simulator's, bit for bit."""
    cfg = parse_sim_config(tiny_net_values(method="heloco", workers=2, token_budget=1000))
    reference = build_run(cfg).worker(1).run_round(build_run(cfg).server.params, 2, 0, 0)
    built: list[str] = []

    def refuse(self: Server, *args: object, **kwargs: object) -> None:
        built.append("Server")
        raise AssertionError("a worker process built a Server")

    monkeypatch.setattr(Server, "__init__", refuse)
    opts = WorkerOptions(worker=1)
    net = NetWorker(ClientConfig("tcp://127.0.0.1:9"), b"worker-test-secret-0123456789", opts)
    try:
        worker = net._setup({"run": cfg.model_dump(mode="json") | {"out_dir": None}})
        start = {k: v.detach().clone() for k, v in worker.model.named_parameters()}
        mine = worker.run_round(start, 2, 0, 0)
    finally:
        if net.link is not None:
            net.link.close()
    assert built == []
    assert mine.mean_loss == reference.mean_loss
    assert all(torch.equal(mine.delta[k], reference.delta[k]) for k in reference.delta)
