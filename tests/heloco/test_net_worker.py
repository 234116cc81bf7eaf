"""Worker-side pieces that need no server: the pacer that emulates slower machines."""

from __future__ import annotations

import time

import torch
from torch import nn

from heloco.net.worker_loop import Pacer


def slow_loss(seconds: float):  # type: ignore[no-untyped-def]
    def loss(model: nn.Module, inputs: torch.Tensor, targets: torch.Tensor) -> torch.Tensor:
        time.sleep(seconds)
        return torch.zeros(())

    return loss


def run_steps(pacer: Pacer, steps: int) -> float:
    t0 = time.perf_counter()
    for _ in range(steps):
        pacer(nn.Identity(), torch.zeros(1), torch.zeros(1))
    pacer.end_round()
    return time.perf_counter() - t0


def test_pace_multiplies_every_step() -> None:
    # 4 steps of >= 20 ms compute at pace 3 last >= 4 * 60 ms (sleep 2x each step, last one too).
    elapsed = run_steps(Pacer(slow_loss(0.02), pace=3.0, seconds_per_step=None), 4)
    assert elapsed >= 4 * 0.06 * 0.98


def test_seconds_per_step_sets_a_floor() -> None:
    elapsed = run_steps(Pacer(slow_loss(0.0), pace=1.0, seconds_per_step=0.05), 4)
    assert elapsed >= 4 * 0.05 * 0.98


def test_end_round_without_steps_is_free() -> None:
    pacer = Pacer(slow_loss(0.0), pace=10.0, seconds_per_step=None)
    t0 = time.perf_counter()
    pacer.end_round()
    assert time.perf_counter() - t0 < 0.05
