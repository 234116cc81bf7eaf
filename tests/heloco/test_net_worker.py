"""Worker-side pieces that need no server: the pacer that emulates slower machines."""

from __future__ import annotations

import time

from heloco.net.worker_loop import Pacer


def run_steps(pacer: Pacer, steps: int, compute_s: float) -> float:
    """A round of ``steps`` steps of ``compute_s`` each, paced by the worker's on_step hook."""
    t0 = time.perf_counter()
    pacer.start_round()
    for i in range(steps):
        time.sleep(compute_s)
        pacer(i)
    return time.perf_counter() - t0


def test_pace_multiplies_every_step() -> None:
    # 4 steps of >= 20 ms compute at pace 3 last >= 4 * 60 ms (sleep 2x each step, last one too).
    elapsed = run_steps(Pacer(pace=3.0, seconds_per_step=None), 4, 0.02)
    assert elapsed >= 4 * 0.06 * 0.98


def test_seconds_per_step_sets_a_floor() -> None:
    elapsed = run_steps(Pacer(pace=1.0, seconds_per_step=0.05), 4, 0.0)
    assert elapsed >= 4 * 0.05 * 0.98


def test_time_between_rounds_is_not_paced() -> None:
    # The idle gap before a round (pull, network) is not part of its first step.
    pacer = Pacer(pace=10.0, seconds_per_step=None)
    time.sleep(0.05)
    assert run_steps(pacer, 1, 0.0) < 0.05
