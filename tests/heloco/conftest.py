"""Fixtures shared by the HeLoCo tests: one torch thread, the tiny networked-run config, and a
simulated run's arrivals checked for rounds applied twice."""

from __future__ import annotations

import os
from collections.abc import Callable, Iterator
from typing import Any

import pytest
import torch

from heloco.config import RunConfig
from heloco.server import ArrivalRecord
from heloco.sim import build_run, parse_sim_config
from heloco.sim.build import ClockSetup
from heloco.sim.loop import simulate
from shardmeter.errors import UserInputError

TinyNetValues = Callable[..., dict[str, Any]]

os.environ.setdefault("HF_HUB_OFFLINE", "1")  # nothing may reach the internet (transformers)


@pytest.fixture
def one_thread() -> Iterator[None]:
    """Tiny models run fastest (and steadiest on a shared machine) on one intra-op thread."""
    before = torch.get_num_threads()
    torch.set_num_threads(1)
    yield
    torch.set_num_threads(before)


@pytest.fixture
def tiny_net_values() -> TinyNetValues:
    """Factory of the smallest run config the networked tests share, as a raw dict.

    Tiny model, 2 inner steps of 2 × 32 tokens (128 tokens a round), a 4000-character synthetic
    corpus per language; ``total_steps`` is the inner cosine horizon (steps) and every other
    keyword sets a top-level key (callers give method, workers, token_budget).
    """

    def make(*, total_steps: int = 50, **over: Any) -> dict[str, Any]:
        values: dict[str, Any] = {
            "inner_steps": 2,
            "model": "tiny",
            "eval_windows": 2,
            "eval_batch_size": 8,
            "data": {
                "seq_len": 32,
                "synthetic_chars_per_language": 4000,
                "val_chars_per_language": 1000,
            },
            "inner": {"batch_size": 2, "seq_len": 32, "total_steps": total_steps},
        }
        values.update(over)
        return values

    return make


@pytest.fixture
def arrivals_once() -> Callable[[RunConfig], list[ArrivalRecord]]:
    """Simulate a run and return the arrivals its server applied, in order, after checking
    that no round was applied twice and that the run's tokens are exactly those rounds'."""

    def run(cfg: RunConfig) -> list[ArrivalRecord]:
        parts = build_run(cfg)
        traj = simulate(
            parts.server,
            [parts.worker(w) for w in range(cfg.workers)],
            ClockSetup.of(cfg).build(parts.paces, parts.comm, parts.links),
            parts.evaluate,
        )
        arrivals = [a for r in parts.server.log for a in r.arrivals]
        seen = [(a.worker, a.round_id) for a in arrivals]
        assert len(seen) == len(set(seen)), "a round applied twice"
        assert sum(a.tokens for a in arrivals) == traj.tokens
        return arrivals

    return run


@pytest.fixture
def refused(
    values: Callable[..., dict[str, Any]],
) -> Callable[[list[tuple[dict[str, Any], str]]], None]:
    """Check that each (overrides, field) run file is refused in one line naming the field."""

    def check(cases: list[tuple[dict[str, Any], str]]) -> None:
        for over, field in cases:
            with pytest.raises(UserInputError) as err:
                parse_sim_config(values(**over))
            text = str(err.value)
            assert field in text and "\n" not in text, text

    return check


@pytest.fixture
def outer_loop_run() -> Callable[..., list[ArrivalRecord]]:
    """Run a one-worker config through OuterLoop over a LocalLink (the background exchange in
    a thread, no sockets), check that it ends with the simulator's parameters bit for bit,
    and return the server's arrivals. Keyword arguments go to OuterLoop."""
    from heloco.outer_loop import LocalLink, OuterLoop
    from heloco.sim import run_simulation

    def run(cfg: RunConfig, **loop: Any) -> list[ArrivalRecord]:
        want = run_simulation(cfg).params
        parts = build_run(cfg)
        worker = parts.worker(0)
        link = LocalLink(parts.server, 0, token_budget=cfg.token_budget)
        outer = OuterLoop(
            worker.model, worker.optimizer, link, hook=False, rounds=worker.boundary, **loop
        )
        with outer:
            while not outer.done:
                outer.step(worker.inner_step(), worker.sampler.tokens_per_batch)
        got = parts.server.params
        assert all(torch.equal(got[k], want[k]) for k in want)
        return [a for r in parts.server.log for a in r.arrivals]

    return run
