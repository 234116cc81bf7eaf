"""The run's policy, written once: budgets, grace windows and the start barrier, driven by the
simulated clock and by the network coordinator alike."""

from __future__ import annotations

import pytest
import torch

from heloco.data import ValLoss
from heloco.net import wire
from heloco.net.coordinator import Coordinator
from heloco.outer import OuterConfig, build_optimizer
from heloco.run import Budget, RunControl
from heloco.server import Server, ServerConfig
from heloco.sim import Clock, simulate
from heloco.types import Params, RoundResult


def test_first_budget_reached_stops_the_run() -> None:
    c = RunControl(Budget(tokens=100, seconds=10.0, revisions=5))
    assert not c.reached(0.0, 0)
    c.count(99)
    assert not c.tokens_reached() and not c.reached(10.0, 4)  # at the time budget: not past
    assert c.past_time(10.5) and c.reached(10.5, 0)
    assert c.reached(0.0, 5)
    c.count(1)
    assert c.tokens_reached() and c.reached(0.0, 0)
    assert not RunControl(Budget()).reached(1e12, 10**9)  # None: unlimited


def test_a_grace_window_opens_once_and_closes_after_its_end() -> None:
    c = RunControl(Budget(), grace_window=2.0)
    assert not c.grace_closes_before(100.0)  # none open
    assert c.open_grace(3.0) == 5.0
    assert c.open_grace(4.0) == 5.0  # a later arrival joins the open window
    assert not c.grace_closes_before(5.0)  # an arrival at the end still joins it
    assert c.grace_closes_before(5.5) and c.grace_closes_before(None)
    c.close_grace()
    assert c.grace_end is None and c.open_grace(6.0) == 8.0


def test_start_barrier_opens_when_all_asked_or_after_the_wait() -> None:
    c = RunControl(Budget(), workers=3, wait_for_workers_s=5.0)
    assert not c.request(0, 1.0) and not c.request(0, 2.0) and not c.request(1, 3.0)
    assert c.request(2, 3.5) and c.ready == {0, 1, 2}
    late = RunControl(Budget(), workers=3, wait_for_workers_s=5.0)
    assert not late.request(1, 10.0) and late.request(1, 15.0)  # 5 s after the first
    assert RunControl(Budget()).started  # no wait: started from the outset


def test_state_dict_restores_in_place() -> None:
    c = RunControl(Budget(tokens=10), grace_window=1.0)
    c.count(7)
    state = c.state_dict()
    holder = RunControl(Budget(tokens=10), grace_window=1.0)
    same = holder  # another part holding the object sees the restore
    holder.open_grace(1.0)
    holder.load_state_dict(state)
    assert same.tokens == 7 and same.grace_end is None and not same.tokens_reached()


def tiny_server(workers: int = 2) -> Server:
    init = {"w": torch.zeros(3, 4)}
    opt = build_optimizer("async-nesterov", init, OuterConfig(), workers)
    return Server(init, opt, ServerConfig(n_workers=workers, inner_steps=2))


class Fixed:
    """A worker whose every round is the same small pseudo-gradient."""

    def __init__(self, worker: int) -> None:
        self.worker = worker

    def run_round(
        self, start: Params, steps: int, base_revision: int, round_id: int | None = None
    ) -> RoundResult:
        return RoundResult(
            self.worker, {"w": torch.full((3, 4), 0.1)}, steps, 10 * steps, 1.0, base_revision,
            round_id,
        )  # fmt: skip


def test_the_simulator_and_the_coordinator_both_count_through_run_control(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    counted: list[int] = []
    count = RunControl.count

    def spy(self: RunControl, tokens: int) -> None:
        counted.append(tokens)
        count(self, tokens)

    monkeypatch.setattr(RunControl, "count", spy)
    clock = Clock([1.0, 2.0], [0.0, 0.0], 0.0, 0, token_budget=100, time_budget=None, eval_every=0)
    traj = simulate(tiny_server(), [Fixed(0), Fixed(1)], clock, lambda p: ValLoss(1.0, {}))
    assert sum(counted) == traj.tokens >= 100 and traj.stopped_by == "tokens"
    counted.clear()
    coord = Coordinator(tiny_server(), Budget(tokens=20))
    d = coord.handle(wire.make("pull", {"worker": 0, "incarnation": "a"}))
    body = {
        "worker": 0, "incarnation": "a", "round_id": d.body["round_id"], "steps": 2,
        "tokens": 20, "base_revision": d.body["revision"], "mean_loss": 1.0,
    }  # fmt: skip
    ack = coord.handle(wire.make("push", body, {"w": torch.full((3, 4), 0.1)}))
    assert ack.type == "ack" and counted == [20] and coord.tokens == 20 and coord.done
