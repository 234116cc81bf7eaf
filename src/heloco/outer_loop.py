"""HeLoCo around the user's own training loop: one object, any module, any inner optimizer.

::

    link = heloco.connect("tcp://server:5555", worker=0, key_folder="keys/worker0")
    with heloco.OuterLoop(model, optimizer, link, tokens_per_step=B * T) as outer:
        while not outer.done:
            loss = loss_fn(model(x), y)
            loss.backward()
            optimizer.step()          # hooked: every H-th step pushes Δ and loads the next θ
            optimizer.zero_grad()
            outer.record_loss(loss)   # optional: the server logs the round's mean loss

The object hooks ``optimizer.step`` (torchft ``local_sgd.DiLoCo`` style) or, with
``hook=False``, counts a step when :meth:`OuterLoop.step` is called. At the first step it
pulls a dispatch; after each dispatch's H_w steps it ends the round (Δ against the dispatched
parameters, see :class:`heloco.rounds.Rounds`), pushes it, pulls the next dispatch (the
look-ahead point for HeLoCo: the server decides what it sends) and loads it; the inner
optimizer's state is cleared or kept as ``reset_optimizer`` says. Inside a data-parallel
island (``torch.distributed`` initialised, e.g. under torchrun with DDP or FSDP2) only rank 0
uses the link; it broadcasts every dispatch to the other ranks (:class:`heloco.island.Island`).

With ``exchange="overlapped"`` the push and the next pull run in a background thread while
the next round trains from the newest dispatch with the worker's own Δ applied eagerly
(:mod:`heloco.overlap` defines the scheme; the simulator runs the same one). With
``exchange="streaming"`` each round is a sub-round of H/P steps whose push carries one
fragment's Δ, in the background, and the returned fragment is merged with ``alpha``
(:mod:`heloco.streaming`; the simulator drives the same :class:`~heloco.streaming.Stream`).

A :class:`Link` is how the worker reaches its server: :class:`heloco.net.link.NetLink` over
ZeroMQ (what ``heloco work`` uses) or :class:`LocalLink` to a :class:`heloco.server.Server` in
the same process (tests, notebooks). ``heloco work`` drives this same class with the
reference loop (:class:`heloco.worker.Worker`), so there is one worker logic.
"""

from __future__ import annotations

import threading
import time
from collections.abc import Callable
from dataclasses import replace
from pathlib import Path
from typing import Any, Protocol

import torch
from torch import nn

from heloco.codecs import feedback_for
from heloco.island import Island, IslandMode
from heloco.overlap import EXCHANGES, overlapped_dispatch
from heloco.rounds import DataPosition, Rounds, StateDict
from heloco.server import Server, SubmissionRejected
from heloco.streaming import Stream, begin_sub_round, end_sub_round, fragments_of
from heloco.types import Dispatch, PushOutcome, RoundResult
from heloco.worker_state import load_states, pick_state, save_states
from shardmeter.errors import UserInputError


class Link(Protocol):
    """How a worker reaches its server (used by the island's rank 0 only)."""

    @property
    def worker(self) -> int: ...

    def join(self) -> dict[str, Any]:
        """Say hello; the welcome carries ``worker_steps`` (the slot's accepted inner steps)
        and, over the network, ``run`` (the run config)."""
        ...

    def pull(self) -> Dispatch | None:
        """The next dispatch, waiting while the server has none yet; None once training is
        over."""
        ...

    def push(self, result: RoundResult, compute_s: float) -> PushOutcome: ...

    def close(self) -> None: ...


class LocalLink:
    """A :class:`Link` to a :class:`heloco.server.Server` in this process; training is over
    once ``token_budget`` accepted tokens (or ``max_rounds`` of this worker) are reached."""

    def __init__(
        self,
        server: Server,
        worker: int,
        token_budget: int | None = None,
        max_rounds: int | None = None,
    ) -> None:
        if not 0 <= worker < server.cfg.n_workers:
            raise UserInputError("worker", worker, f"an integer in [0, {server.cfg.n_workers})")
        self.server = server
        self._worker = worker
        self.token_budget = token_budget
        self.max_rounds = max_rounds
        self.tokens = 0
        self.rounds = 0
        self.accepted_steps = 0

    @property
    def worker(self) -> int:
        """The worker slot this link serves."""
        return self._worker

    def join(self) -> dict[str, Any]:
        """The welcome: this slot's accepted inner steps (its schedule position)."""
        return {"worker_steps": self.accepted_steps, "revision": self.server.revision}

    def _over(self) -> bool:
        return (self.token_budget is not None and self.tokens >= self.token_budget) or (
            self.max_rounds is not None and self.rounds >= self.max_rounds
        )

    def pull(self) -> Dispatch | None:
        """The server's next dispatch for this worker, or None once a budget is reached."""
        return None if self._over() else self.server.dispatch(self._worker)

    def push(self, result: RoundResult, compute_s: float) -> PushOutcome:
        """Submit the round; a rejected round is reported, not raised."""
        self.rounds += 1
        try:
            self.server.submit(result)
        except SubmissionRejected as exc:
            return PushOutcome(False, self.server.revision, exc.reason)
        if compute_s > 0 and result.steps > 0:
            self.server.observe_speed(self._worker, result.steps / compute_s)
        self.tokens += result.tokens
        self.accepted_steps += result.steps
        return PushOutcome(True, self.server.revision)

    def close(self) -> None:
        """Nothing to release."""


RoundHook = Callable[[RoundResult, float, PushOutcome | None], None]


class Exchange:
    """One push and the pull after it, run in a background thread (the overlapped exchange).

    :meth:`join` waits for both and returns (the push's outcome, the next dispatch or None
    once training is over); an error in the thread (the server unreachable, the slot
    replaced) is raised there, in the caller's thread."""

    def __init__(self, link: Link, result: RoundResult, compute_s: float) -> None:
        self.result, self.compute_s = result, compute_s
        self._link = link
        self._outcome: PushOutcome | None = None
        self._dispatch: Dispatch | None = None
        self._error: BaseException | None = None
        # A new thread starts with OpenMP's default thread count, not the one set for the run
        # (torch.set_num_threads is per thread there): reductions in a LocalLink's server
        # would change their order, and so their last bits.
        self._threads = torch.get_num_threads()
        self._thread = threading.Thread(target=self._run, name="heloco-exchange", daemon=True)
        self._thread.start()

    def _run(self) -> None:
        try:
            torch.set_num_threads(self._threads)
            self._outcome = self._link.push(self.result, self.compute_s)
            self._dispatch = self._link.pull()
        except BaseException as exc:  # re-raised by join, in the worker's own thread
            self._error = exc

    def join(self) -> tuple[PushOutcome, Dispatch | None]:
        """Wait for the push and the pull; their outcome and dispatch."""
        self._thread.join()
        if self._error is not None:
            raise self._error
        assert self._outcome is not None
        return self._outcome, self._dispatch


class OuterLoop:
    """Turns a user's inner loop into a HeLoCo worker (see the module docstring).

    ``link``: the server (needed on rank 0; ignored on other ranks). ``tokens_per_step``:
    training tokens of one inner step on this rank (counted toward the run's token budget),
    or pass ``tokens`` to :meth:`step`. ``reset_optimizer``: clear the inner optimizer's state
    every round (the paper's default) or keep it. ``hook``: count steps from
    ``optimizer.step`` (default) or only from :meth:`step`. ``island``: the data-parallel
    island (default: the current ``torch.distributed`` group in ``island_mode``). ``data``:
    a source whose read position joins :meth:`state_dict`. ``rounds``: an existing
    :class:`Rounds` to drive instead of a new one (the reference loop passes its own).
    ``on_round(result, compute_s, outcome)`` is called after every round (outcome None on
    ranks that do not push). ``state_file``: where the worker keeps its state between
    process restarts (:mod:`heloco.worker_state`; one file per rank), so a restarted worker
    continues its data exactly after the server's last accepted round of its slot.
    ``payload``: send Δ compressed as ``shardmeter plan --payload`` names it (``topk:fraction=
    0.01``, ``sign``; :mod:`heloco.codecs`), its error-feedback residual in the state; ignored
    when ``rounds`` is given (that object's own payload applies). ``exchange``: ``"blocking"``
    (push, pull, then train) or ``"overlapped"`` (push and pull in the background while the
    next round trains from the newest dispatch minus ``eager`` times this worker's own last Δ;
    :mod:`heloco.overlap`; the server must run with ``exchange = "overlapped"``) or
    ``"streaming"`` (sub-rounds of H/P steps, each pushing one of ``fragments`` fragments in the
    background and merging the one returned with weight ``alpha``; :mod:`heloco.streaming`;
    the server must run with ``exchange = "streaming"`` and the same ``fragments``).
    """

    def __init__(
        self,
        model: nn.Module,
        optimizer: torch.optim.Optimizer | None,
        link: Link | None,
        *,
        tokens_per_step: int = 0,
        reset_optimizer: bool = True,
        hook: bool = True,
        island: Island | None = None,
        island_mode: IslandMode = "grads",
        data: DataPosition | None = None,
        rounds: Rounds | None = None,
        welcome: dict[str, Any] | None = None,
        on_round: RoundHook | None = None,
        state_file: Path | None = None,
        payload: str | None = None,
        exchange: str = "blocking",
        eager: float = 1.0,
        fragments: int = 2,
        alpha: float = 0.5,
    ) -> None:
        if exchange not in (*EXCHANGES, "streaming"):
            raise UserInputError("exchange", exchange, "'blocking', 'overlapped' or 'streaming'")
        if not 0.0 <= eager <= 1.0:
            raise UserInputError("eager", eager, "a number in [0, 1]")
        self.overlapped = exchange == "overlapped"
        self.eager = eager
        self._inflight: Exchange | None = None  # overlapped: the push and pull under way
        self._exchanging = False  # overlapped: an exchange began at the last boundary
        self._pushed: tuple[RoundResult, float] | None = None  # the round it pushes
        self._latest: Dispatch | None = None  # overlapped: the newest dispatch received
        self.island = island if island is not None else Island.current(island_mode)
        if self.island.leader and link is None:
            raise UserInputError("link", None, "a server link on rank 0 (heloco.connect(...))")
        if tokens_per_step < 0:
            raise UserInputError("tokens_per_step", tokens_per_step, "an integer >= 0")
        self.link = link if self.island.leader else None
        worker = link.worker if link is not None else 0
        feedback = feedback_for(payload)
        self.rounds = rounds or Rounds(worker, model, optimizer, reset_optimizer, data, feedback)
        self.optimizer = optimizer if rounds is None else rounds.optimizer
        self.tokens_per_step = tokens_per_step
        self.use_hook = hook
        self.welcome = welcome
        self.on_round = on_round
        self.state_file = state_file
        if state_file is not None and self.island.size > 1:
            self.state_file = state_file.with_name(
                f"{state_file.stem}-rank{self.island.rank}{state_file.suffix}"
            )
        self.accepted_steps = 0
        self._start_state: StateDict | None = None
        self.done = False
        self.started = False
        self._hook_handle: Any = None
        self._pending_loss: torch.Tensor | float | None = None
        self._round_t0 = 0.0
        self._like = {n: p.detach() for n, p in self.rounds.named}
        self.stream: Stream | None = None
        if exchange == "streaming":
            if self.island.size > 1:
                raise UserInputError(
                    "exchange", exchange, "'blocking' or 'overlapped' in an island of > 1 rank"
                )
            if self.rounds.feedback is not None:
                raise UserInputError("payload", payload, "dense with exchange = 'streaming'")
            if fragments < 2:
                raise UserInputError("fragments", fragments, "an integer >= 2")
            shapes = {n: tuple(p.shape) for n, p in self.rounds.named}
            self.stream = Stream(fragments_of(shapes, fragments), alpha)

    # -- context ----------------------------------------------------------------------------
    def __enter__(self) -> OuterLoop:
        self.start()
        if self.use_hook:
            if self.optimizer is None:
                raise UserInputError("optimizer", None, "an optimizer to hook (or hook=False)")
            self._hook_handle = self.optimizer.register_step_post_hook(self._after_step)
        return self

    def __exit__(self, *exc: object) -> None:
        if self._hook_handle is not None:
            self._hook_handle.remove()
            self._hook_handle = None
        try:
            self._settle()
        finally:
            if self.link is not None:
                self.link.close()

    def _settle(self) -> None:
        """Overlapped: wait for the exchange under way (its push is acknowledged and
        reported) before the link closes; the round in training when the run ended is
        never sent."""
        inflight, self._inflight = self._inflight, None
        if inflight is None:
            return
        outcome, _ = inflight.join()
        self._after_push(inflight.result, inflight.compute_s, outcome, outcome.accepted)

    def _after_step(self, *_: Any) -> None:
        self.step()

    # -- the loop ---------------------------------------------------------------------------
    def start(self) -> None:
        """Join (unless a welcome was given), take the schedule position, load the first
        dispatch. Called by ``with``; idempotent."""
        if self.started:
            return
        self.started = True
        welcome = self.welcome
        if welcome is None:
            welcome = self.island.broadcast_json(
                self.link.join() if self.link is not None else None
            )
            self.welcome = welcome
        self.rounds.step = int(welcome.get("worker_steps", self.rounds.step))
        self.accepted_steps = int(welcome.get("worker_steps", 0))
        if self.state_file is not None:
            saved = pick_state(load_states(self.state_file), self.accepted_steps)
            if saved is not None:
                step = self.rounds.step
                self.rounds.load_state_dict(saved)
                self.rounds.step = step  # the server's count of this slot's steps wins
        self._next_round()

    @property
    def step_count(self) -> int:
        """Schedule position: inner steps this worker slot has taken over the run (use it
        for your learning-rate schedule; a rejoining worker continues the slot's count)."""
        return self.rounds.step

    def record_loss(self, loss: torch.Tensor | float) -> None:
        """The loss of the step about to be counted (kept on the device; no sync)."""
        self._pending_loss = loss

    def step(self, loss: torch.Tensor | float | None = None, tokens: int | None = None) -> bool:
        """Count one inner step; at the round's last step, push and load the next dispatch.

        Returns whether a new round began (the model's parameters were replaced). After
        training is over (:attr:`done`) it does nothing.
        """
        if not self.started:
            self.start()
        if self.done:
            return False
        if loss is None:
            loss, self._pending_loss = self._pending_loss, None
        n = self.tokens_per_step if tokens is None else tokens
        if not self.rounds.record_step(n, loss):
            return False
        self._finish_round()
        return not self.done

    def _finish_round(self) -> None:
        if self.stream is not None:
            self._finish_streaming(self.stream)
            return
        result = self.rounds.compress(self.island.reduce(self.rounds.end(compress=False)))
        compute_s = time.perf_counter() - self._round_t0
        note = getattr(self.link, "note_round", None)  # a NetLink times the round's push
        if note is not None:
            note(self._round_t0, self._round_t0 + compute_s)
        if self.overlapped:
            self._finish_overlapped(result, compute_s)
            return
        if self.state_file is not None and self._start_state is not None:
            after = self.accepted_steps + result.steps
            save_states(
                self.state_file,
                {self.accepted_steps: self._start_state, after: self.rounds.state_dict()},
            )
        outcome = self.link.push(result, compute_s) if self.link is not None else None
        if self.state_file is not None:
            accepted = self.island.broadcast_json(
                {"accepted": outcome.accepted} if outcome is not None else None
            )["accepted"]
            self.accepted_steps += result.steps if accepted else 0
        if self.on_round is not None:
            self.on_round(result, compute_s, outcome)
        self._next_round()

    def _finish_overlapped(self, result: RoundResult, compute_s: float) -> None:
        """The boundary of an overlapped round (:mod:`heloco.overlap`): collect the exchange
        begun at the last boundary (its dispatch D_k, which this round's push answers), start
        this round's push and the next pull in the background, and begin the next round from
        D_k with this round's Δ applied eagerly."""
        latest = before = self._latest
        if self._exchanging:  # every rank: the leader's exchange, broadcast
            inflight, self._inflight = self._inflight, None
            outcome, arrived = inflight.join() if inflight is not None else (None, None)
            accepted = outcome is not None and outcome.accepted
            if self.state_file is not None:
                accepted = self.island.broadcast_json({"accepted": accepted})["accepted"]
            assert self._pushed is not None
            self._after_push(*self._pushed, outcome, accepted)
            evicted = outcome is not None and outcome.reason == "evicted"
            if self.island.size > 1:
                evicted = self.island.broadcast_json({"evicted": evicted})["evicted"]
            latest = self.island.broadcast_dispatch(arrived, self._like)
            if latest is None:  # the run is over: this round is never sent
                self.done = True
                return
            if evicted and before is not None and before.revision != latest.revision:
                # The server evicted this worker (it was silent too long) and answered with a
                # fresh dispatch, which takes only a round based on its own revision: this
                # round, based on an older one, would be refused. Start over as a first round.
                self._exchanging = False
                self._latest = latest
                self._begin(latest)
                return
            result = replace(result, round_id=latest.round_id)
        assert latest is not None
        self._latest = latest
        self._save_boundary(result)
        self._exchanging = True
        self._pushed = (result, compute_s)
        if self.link is not None:
            self._inflight = Exchange(self.link, result, compute_s)
        self._begin(overlapped_dispatch(latest, result.delta, self.eager))

    def _finish_streaming(self, stream: Stream) -> None:
        """The boundary of a streaming sub-round (:mod:`heloco.streaming`): collect the
        exchange begun at the last boundary (its dispatch D_k, which this sub-round's push
        answers), measure Δ of the fragment D_k names, merge the fragment D_k carries, start
        this push and the next pull in the background, and go on training from θ."""
        compute_s = time.perf_counter() - self._round_t0
        note = getattr(self.link, "note_round", None)
        if note is not None:
            note(self._round_t0, self._round_t0 + compute_s)
        answers = self._latest
        if self._exchanging:
            inflight, self._inflight = self._inflight, None
            outcome, arrived = inflight.join() if inflight is not None else (None, None)
            assert self._pushed is not None
            self._after_push(*self._pushed, outcome, outcome is not None and outcome.accepted)
            if arrived is None:  # the run is over: this sub-round is never sent
                self.done = True
                return
            if stream.is_full(arrived):
                # Not the answer to an accepted push (a restart, an eviction, a refused push):
                # every anchor moved, so this sub-round's Δ would be refused. Start over.
                self.rounds.end(compress=False, delta=False)
                self._exchanging = False
                self._start_stream(arrived)
                return
            answers = arrived
        assert answers is not None
        result = end_sub_round(self.rounds, stream, answers)
        if self._exchanging:
            stream.merge(answers)
        self._latest = answers
        self._save_boundary(result)
        self._exchanging = True
        self._pushed = (result, compute_s)
        if self.link is not None:
            self._inflight = Exchange(self.link, result, compute_s)
        self._begin_stream(answers.steps, full=False)

    def _start_stream(self, dispatch: Dispatch) -> None:
        """A full dispatch: load it and begin a first sub-round from it."""
        assert self.stream is not None
        self.stream.reset(dispatch)
        self._latest = dispatch
        self._begin_stream(dispatch.steps, full=True)

    def _begin_stream(self, steps: int, full: bool) -> None:
        assert self.stream is not None
        begin_sub_round(self.rounds, self.stream, steps, full)
        if self.state_file is not None:
            self._start_state = self.rounds.state_dict()
        self._round_t0 = time.perf_counter()

    def _save_boundary(self, result: RoundResult) -> None:
        """Keep the states of a restart at this boundary: the round's start (its push is lost)
        and its end (its push was accepted), by the accepted-step count each belongs to."""
        if self.state_file is not None and self._start_state is not None:
            after = self.accepted_steps + result.steps
            save_states(
                self.state_file,
                {self.accepted_steps: self._start_state, after: self.rounds.state_dict()},
            )

    def _after_push(
        self, result: RoundResult, compute_s: float, outcome: PushOutcome | None, accepted: bool
    ) -> None:
        """An overlapped push's ack arrived (on the leader; ``accepted`` on every rank):
        count its steps, report the round."""
        if self.state_file is not None:
            self.accepted_steps += result.steps if accepted else 0
        if self.on_round is not None:
            self.on_round(result, compute_s, outcome)

    def _begin(self, dispatch: Dispatch) -> None:
        self.rounds.begin(dispatch)
        if self.state_file is not None:
            self._start_state = self.rounds.state_dict()
        self._round_t0 = time.perf_counter()

    def _next_round(self) -> None:
        dispatch = self.link.pull() if self.link is not None else None
        dispatch = self.island.broadcast_dispatch(dispatch, self._like)
        if dispatch is None:
            self.done = True
            return
        if self.stream is not None:
            self._start_stream(dispatch)
            return
        if self.overlapped:
            self._latest = dispatch
        self.rounds.begin(dispatch)
        if self.state_file is not None:
            self._start_state = self.rounds.state_dict()
        self._round_t0 = time.perf_counter()
        if dispatch.steps == 0:
            # Never from a heloco server (DyLU gives every round >= 1 step; the wire refuses 0),
            # but a user's own Link may send one: push its zero Δ at once.
            self._finish_round()

    # -- state ------------------------------------------------------------------------------
    def state_dict(self) -> StateDict:
        """The worker's state for the user's checkpoint (see :meth:`Rounds.state_dict`)."""
        return self.rounds.state_dict()

    def load_state_dict(self, state: StateDict) -> None:
        """Restore :meth:`state_dict` output (before :meth:`start`)."""
        self.rounds.load_state_dict(state)
