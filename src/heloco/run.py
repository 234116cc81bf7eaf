"""A run's policy, written once: when it stops, when a grace window closes, when it starts.

:class:`RunControl` owns the budget (training tokens of accepted rounds, seconds, outer
updates), the tokens counted against it, the open grace window and the start barrier, and
its own :meth:`RunControl.state_dict`. It knows no clock and no transport: its caller passes
``now`` in the run's own seconds. The simulated clock (:mod:`heloco.sim.loop`, simulated
seconds) and the network coordinator (:mod:`heloco.net.coordinator`, wall seconds since the
start) drive the same object, so both stop, batch and start by the same rules:

- a run stops at the first budget reached; a round that arrives after the time budget
  (``now > seconds``) is not taken;
- an asynchronous arrival that the server buffers opens a grace window of
  ``grace_window`` seconds, unless one is open; the window closes before the first arrival
  after its end (``now > end``), and at the budget;
- with ``wait_for_workers_s > 0`` a fresh run starts when every worker slot has asked for
  work, or that many seconds after the first one did.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any


@dataclass(frozen=True)
class Budget:
    """When a run stops: training tokens of accepted rounds, seconds, outer updates.

    The run ends at the first budget reached; ``None`` means unlimited.
    """

    tokens: int | None = None
    seconds: float | None = None
    revisions: int | None = None


class RunControl:
    """Budget, tokens, grace window and start barrier of one run (see the module doc)."""

    def __init__(
        self,
        budget: Budget,
        grace_window: float = 0.0,
        workers: int = 1,
        wait_for_workers_s: float = 0.0,
    ) -> None:
        self.budget = budget
        self.grace_window = grace_window
        self.workers = workers
        self.wait_for_workers_s = wait_for_workers_s
        self.tokens = 0  # training tokens of the accepted rounds
        self.grace_end: float | None = None  # end of the open grace window (None: none open)
        self.started = wait_for_workers_s <= 0
        self.ready: set[int] = set()  # workers that asked for work before the start
        self.first_request: float | None = None

    # -- budget -----------------------------------------------------------------------------
    def count(self, tokens: int) -> None:
        """Count an accepted round's training tokens."""
        self.tokens += tokens

    def tokens_reached(self) -> bool:
        """Whether the token budget is used up."""
        return self.budget.tokens is not None and self.tokens >= self.budget.tokens

    def past_time(self, now: float) -> bool:
        """Whether ``now`` lies after the time budget (a round arriving then is not taken)."""
        return self.budget.seconds is not None and now > self.budget.seconds

    def reached(self, now: float, revision: int) -> bool:
        """Whether any budget is used up at ``now`` after ``revision`` outer updates."""
        revisions = self.budget.revisions
        return (
            self.tokens_reached()
            or self.past_time(now)
            or (revisions is not None and revision >= revisions)
        )

    # -- grace windows ----------------------------------------------------------------------
    def open_grace(self, now: float) -> float:
        """A buffered arrival at ``now``: open a window unless one is open; returns its end."""
        if self.grace_end is None:
            self.grace_end = now + self.grace_window
        return self.grace_end

    def grace_closes_before(self, now: float | None) -> bool:
        """Whether the open window closes before an arrival at ``now`` (None: no more
        arrivals, so it closes)."""
        return self.grace_end is not None and (now is None or now > self.grace_end)

    def close_grace(self) -> None:
        """The window's buffered arrivals were applied."""
        self.grace_end = None

    # -- start barrier ----------------------------------------------------------------------
    def request(self, worker: int, now: float) -> bool:
        """Worker ``worker`` asks for work at ``now``; whether the run has started (it starts
        now when every slot has asked, or ``wait_for_workers_s`` after the first did)."""
        if self.started:
            return True
        self.ready.add(worker)
        self.first_request = now if self.first_request is None else self.first_request
        if len(self.ready) == self.workers or now - self.first_request >= self.wait_for_workers_s:
            self.started = True
        return self.started

    # -- state ------------------------------------------------------------------------------
    def state_dict(self) -> dict[str, Any]:
        """What a restarted run continues from (JSON): the tokens counted so far. A grace
        window does not outlive its process: its buffered arrivals are in the server's
        checkpoint, and the restarted run opens a new window for them (see
        :func:`heloco.net.endpoint.load_coordinator_meta`)."""
        return {"tokens": self.tokens}

    def load_state_dict(self, state: dict[str, Any]) -> None:
        """Restore :meth:`state_dict` output into this object (its holders see it)."""
        self.tokens = int(state["tokens"])
        self.grace_end = None
