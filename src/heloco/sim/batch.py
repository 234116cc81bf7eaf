"""Batched rounds: the inner steps of many TinyGPT workers computed in one batched kernel.

Workers of one model shape (of one run, or of many runs simulated side by side) each own a
slot of stacked parameters. A worker's model is a TinyGPT whose parameters are views of its
slot, so the round boundary is the one every loop uses (:class:`heloco.rounds.Rounds` inside
:class:`heloco.worker.Worker`: loading the dispatch into the slot, resetting or keeping the
AdamW state, Δ, schedule and data position), and so are the sampler, the cosine rate, the
clipping and the fused AdamW step (``Worker.next_batch`` / ``Worker.apply_gradients``, one
optimizer per worker). Only the forward and backward pass run jointly, in
:func:`heloco.sim.stacked.stacked_losses`, whose per-model results are bit-identical to the
module's on the CPU.

A round is computed when some run needs it: every submitted round is computed then, in one
batch whose members drop out as they take their last step (workers may have different step
counts, rates and clipping). The simulated clock does not change: rounds only run earlier
than their arrival, never in another order for the same worker.
"""

from __future__ import annotations

from collections.abc import Sequence

import torch
from torch import nn

from heloco.model import ModelConfig, TinyGPT
from heloco.server import Dispatch
from heloco.sim.stacked import Stack, stacked_losses
from heloco.types import RoundResult
from heloco.worker import Worker


def slot_models(cfg: ModelConfig, slots: int, device: torch.device) -> tuple[Stack, list[TinyGPT]]:
    """Stacked parameter storage for ``slots`` models, and one TinyGPT per slot whose
    parameters are views of it (writes to a model land in the stack)."""
    with torch.device("meta"):
        shapes = {name: p.shape for name, p in TinyGPT(cfg).named_parameters()}
    storage = {name: torch.zeros((slots, *shape), device=device) for name, shape in shapes.items()}
    models = []
    for slot in range(slots):
        with torch.device("meta"):
            model = TinyGPT(cfg)
        for name in shapes:
            owner, _, leaf = name.rpartition(".")
            setattr(model.get_submodule(owner), leaf, nn.Parameter(storage[name][slot]))
        model.register_buffer("positions", torch.arange(cfg.seq_len, device=device), False)
        models.append(model)
    return storage, models


class BatchEngine:
    """Slots of stacked TinyGPT parameters, one per worker; computes submitted rounds together."""

    def __init__(self, cfg: ModelConfig, slots: int, device: torch.device | str = "cpu") -> None:
        self.cfg = cfg
        self.device = torch.device(device)
        self.storage, self.models = slot_models(cfg, slots, self.device)
        self.workers: list[Worker | None] = [None] * slots
        self.params: list[list[nn.Parameter]] = [list(m.parameters()) for m in self.models]
        self.pending: dict[int, Dispatch] = {}
        self.done: dict[int, RoundResult] = {}
        self.batches = 0  # batched steps taken
        self.rows = 0  # model-steps computed in them

    @property
    def slots(self) -> int:
        return len(self.models)

    def bind(self, slot: int, worker: Worker) -> None:
        """Attach the worker built on ``self.models[slot]``."""
        if worker.model is not self.models[slot]:
            raise ValueError(f"worker {worker.worker_id} is not built on the model of slot {slot}")
        self.workers[slot] = worker

    def submit(self, slot: int, dispatch: Dispatch) -> None:
        if slot in self.pending or slot in self.done:
            raise RuntimeError(f"slot {slot} already has a round in flight")
        self.pending[slot] = dispatch

    def ready(self, slot: int) -> bool:
        return slot in self.done

    def take(self, slot: int) -> RoundResult:
        return self.done.pop(slot)

    def cancel(self, slots: Sequence[int]) -> None:
        """Forget the rounds of ``slots`` (a run that stopped or failed)."""
        for s in slots:
            self.pending.pop(s, None)
            self.done.pop(s, None)

    def run(self) -> int:
        """Compute every submitted round; returns how many."""
        slots = sorted(self.pending)
        workers = [self._worker(s) for s in slots]
        for s, w in zip(slots, workers, strict=True):
            w.boundary.begin(self.pending.pop(s))
            w.model.train()
        while True:
            active = [i for i, w in enumerate(workers) if not w.boundary.finished]
            if not active:
                break
            self._step([slots[i] for i in active], [workers[i] for i in active])
        for s, w in zip(slots, workers, strict=True):
            w.optimizer.zero_grad(set_to_none=True)
            self.done[s] = w.boundary.end()
        return len(slots)

    def _worker(self, slot: int) -> Worker:
        w = self.workers[slot]
        if w is None:
            raise RuntimeError(f"slot {slot} has no worker")
        return w

    def _leaves(self, slots: list[int]) -> Stack:
        """The slots' parameters as autograd leaves: views when the slots are contiguous."""
        first, last = slots[0], slots[-1]
        if last - first + 1 == len(slots):
            return {
                n: t[first : last + 1].detach().requires_grad_() for n, t in self.storage.items()
            }
        index = torch.tensor(slots, device=self.device)
        return {n: t.index_select(0, index).requires_grad_() for n, t in self.storage.items()}

    def _step(self, slots: list[int], workers: list[Worker]) -> None:
        """One inner step of each worker: joint forward/backward, then each worker's own
        clipping and AdamW step on its slice of the gradients."""
        batches = [w.next_batch() for w in workers]
        inputs = torch.stack([b[0] for b in batches])
        targets = torch.stack([b[1] for b in batches])
        leaves = self._leaves(slots)
        losses = stacked_losses(self.cfg, leaves, inputs, targets)
        losses.backward(torch.ones_like(losses))
        grads = [leaf.grad for leaf in leaves.values()]
        for j, (s, w) in enumerate(zip(slots, workers, strict=True)):
            for p, g in zip(self.params[s], grads, strict=True):
                assert g is not None
                p.grad = g[j]
            w.apply_gradients()
            w.boundary.record_step(w.sampler.tokens_per_batch, losses[j].detach())
        self.batches += 1
        self.rows += len(slots)


class BatchedRounds:
    """One run's view of a :class:`BatchEngine`: its workers are slots ``offset..offset+K-1``."""

    def __init__(self, engine: BatchEngine, offset: int, workers: int) -> None:
        self.engine, self.offset, self.workers = engine, offset, workers

    def submit(self, dispatch: Dispatch, arrival: float) -> None:
        self.engine.submit(self.offset + dispatch.worker, dispatch)

    def ready(self, worker: int) -> bool:
        return self.engine.ready(self.offset + worker)

    def take(self, worker: int) -> RoundResult:
        return self.engine.take(self.offset + worker)

    def cancel(self) -> None:
        self.engine.cancel(range(self.offset, self.offset + self.workers))
