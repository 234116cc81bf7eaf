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

Rounds are computed when some run waits (:class:`heloco.sim.pool.RoundPool` chooses which:
each distinct round once, only rounds some run may take), in one batch whose members drop out
as they take their last step (workers may have different step counts, rates and clipping).
"""

from __future__ import annotations

from collections.abc import Hashable

import torch
from torch import nn

from heloco.model import ModelConfig, TinyGPT
from heloco.sim.pool import RoundPool
from heloco.sim.stacked import Stack, stacked_losses
from heloco.types import Dispatch, RoundResult
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


class BatchEngine(RoundPool):
    """A :class:`~heloco.sim.pool.RoundPool` whose slots hold stacked TinyGPT parameters, one
    per worker; the rounds it computes take their inner steps together."""

    def __init__(self, cfg: ModelConfig, slots: int, device: torch.device | str = "cpu") -> None:
        super().__init__(slots)
        self.cfg = cfg
        self.device = torch.device(device)
        self.storage, self.models = slot_models(cfg, slots, self.device)
        self.params: list[list[nn.Parameter]] = [list(m.parameters()) for m in self.models]
        self.batches = 0  # batched steps taken
        self.rows = 0  # model-steps computed in them

    def bind(self, slot: int, worker: Worker, identity: Hashable) -> None:
        """Attach the worker built on ``self.models[slot]``."""
        if worker.model is not self.models[slot]:
            raise ValueError(f"worker {worker.worker_id} is not built on the model of slot {slot}")
        super().bind(slot, worker, identity)

    def _compute(
        self, slots: list[int], workers: list[Worker], dispatches: list[Dispatch]
    ) -> list[RoundResult]:
        """The rounds, their inner steps batched; members drop out after their last step."""
        for w, d in zip(workers, dispatches, strict=True):
            w.boundary.begin(d)
            w.model.train()
        while True:
            active = [i for i, w in enumerate(workers) if not w.boundary.finished]
            if not active:
                break
            self._step([slots[i] for i in active], [workers[i] for i in active])
        results = []
        for w in workers:
            w.optimizer.zero_grad(set_to_none=True)
            results.append(w.boundary.end())
        return results

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
