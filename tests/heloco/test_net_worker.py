"""Worker-side pieces that need no server: the pacer that emulates slower machines and stops
sleeping when the run is over."""

from __future__ import annotations

import threading
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
