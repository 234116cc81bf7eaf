"""The worker's inner loop: H AdamW steps from the dispatched model -> pseudo-gradient.

θ_0 = dispatched start; θ_{h+1} = AdamW step on a batch of the worker's stream; after H steps
the worker returns Δ = θ_0 − θ_H (heloco-spec.md §1.2, the DiLoCo inner loop of Douillard et
al. 2023, arXiv 2311.08105, Algorithm 1). As in the paper's prototype, the inner AdamW is
fresh every round by default, and the cosine learning-rate schedule position is tracked per
worker across rounds (spec §1.2).

The loop is kept as tight as a plain PyTorch training loop: one index gather per batch,
``zero_grad(set_to_none=True)``, foreach/fused AdamW, and no host sync inside a round's steps
(the loss is summed on device and read once, at the round's end, when Δ is also copied to the
host one tensor at a time: :func:`heloco.rounds.pseudo_gradient`).
"""

from __future__ import annotations

import math
from collections.abc import Callable
from dataclasses import replace

import torch
from torch import nn

from heloco.codecs import Compressor
from heloco.config import InnerConfig
from heloco.data.packed import PackedStream
from heloco.data.seeding import derive_seed
from heloco.data.stream import TokenStream
from heloco.data.validation import LossFn, token_cross_entropy
from heloco.rounds import Rounds, StateDict
from heloco.types import Dispatch, Params, RoundResult
from shardmeter.errors import UserInputError

SAMPLER_KEY = 2  # derive_seed key of a worker's batch sampler


def check_device(device: str) -> None:
    """Raise a one-line error for a device torch cannot parse or this machine does not have."""
    try:
        kind = torch.device(device).type
    except RuntimeError:
        raise UserInputError("device", device, "a torch device such as cpu or cuda:0") from None
    if kind == "cuda" and not torch.cuda.is_available():
        raise UserInputError("device", device, "cpu (no CUDA device is available here)")


def cosine_lr(step: int, cfg: InnerConfig) -> float:
    """Learning rate at schedule position ``step`` (0-based): linear warmup to ``lr`` over
    ``warmup_steps``, then cosine decay to ``min_lr`` at ``total_steps`` (Loshchilov & Hutter
    2017, SGDR, Eq. 5, one cycle), constant ``min_lr`` afterwards."""
    if step < cfg.warmup_steps:
        return cfg.lr * (step + 1) / cfg.warmup_steps
    decay_steps = max(1, cfg.total_steps - cfg.warmup_steps)
    progress = min(1.0, (step - cfg.warmup_steps) / decay_steps)
    return cfg.min_lr + 0.5 * (cfg.lr - cfg.min_lr) * (1.0 + math.cos(math.pi * progress))


class Worker:
    """The reference inner loop: H AdamW steps on the worker's own stream per round.

    Works with any ``nn.Module``; the default loss is next-token cross-entropy on ``(B, T, V)``
    logits, ``loss_fn(model, inputs, targets)`` replaces it. ``on_step(i)``, if given, is
    called after the ``i``-th inner step of a round (0-based), e.g. to pace a slower machine.
    ``feedback``, if given, compresses each round's Δ (top-k, sign; :mod:`heloco.codecs`).
    Batches are seeded by ``(seed, worker_id)``. Several workers may share one model object:
    each round loads its start point first, and each worker keeps its own optimiser state.

    The round boundary (load the dispatch, reset or keep AdamW, Δ, schedule and data
    position) is :class:`heloco.rounds.Rounds`, the same object a user's own loop drives
    through :class:`heloco.outer_loop.OuterLoop`; this class adds only the sampler, the cosine
    learning rate and the loss.
    """

    def __init__(
        self,
        worker_id: int,
        model: nn.Module,
        stream: TokenStream | PackedStream,
        cfg: InnerConfig,
        seed: int,
        loss_fn: LossFn = token_cross_entropy,
        on_step: Callable[[int], None] | None = None,
        feedback: Compressor | None = None,
    ) -> None:
        self.worker_id = worker_id
        self.model = model
        self.cfg = cfg
        self.loss_fn = loss_fn
        self.on_step = on_step
        self.sampler = stream.sampler(
            cfg.batch_size, cfg.seq_len, seed=derive_seed(seed, SAMPLER_KEY, worker_id)
        )
        self._trainable = [p for p in model.parameters() if p.requires_grad]
        self.boundary = Rounds(
            worker_id,
            model,
            self.new_optimizer(),
            reset_optimizer=cfg.reset_each_round,
            data=self.sampler,
            feedback=feedback,
        )
        self._on_cpu = self.boundary.device.type == "cpu"

    @property
    def step(self) -> int:
        """Position in the cosine schedule (inner steps taken so far)."""
        return self.boundary.step

    @step.setter
    def step(self, value: int) -> None:
        self.boundary.step = value

    @property
    def rounds(self) -> int:
        """Rounds completed."""
        return self.boundary.rounds

    @property
    def optimizer(self) -> torch.optim.Optimizer:
        """The inner AdamW (its state is cleared each round unless ``reset_each_round`` is off)."""
        assert self.boundary.optimizer is not None
        return self.boundary.optimizer

    def new_optimizer(self) -> torch.optim.AdamW:
        """A fresh AdamW over the trainable parameters (fused kernel where available)."""
        cfg = self.cfg
        kind = {"fused": True} if cfg.fused else {"foreach": True}
        return torch.optim.AdamW(
            self._trainable,
            lr=cosine_lr(0, cfg),
            betas=cfg.betas,
            eps=cfg.eps,
            weight_decay=cfg.weight_decay,
            **kind,
        )

    def inner_step(self) -> torch.Tensor:
        """One AdamW step at the schedule's current rate on the next batch; returns the loss
        (on the device, not synchronised). Does not count the step: the caller does."""
        inputs, targets = self.next_batch()
        loss = self.loss_fn(self.model, inputs, targets)
        self.optimizer.zero_grad(set_to_none=True)
        loss.backward()
        self.apply_gradients()
        return loss

    def next_batch(self) -> tuple[torch.Tensor, torch.Tensor]:
        """Set the schedule's rate for the coming step; its batch, on the model's device.

        The first half of :meth:`inner_step`; the simulator's batched path calls it for each
        worker, computes the gradients of many workers at once, then :meth:`apply_gradients`.
        """
        lr = cosine_lr(self.boundary.step, self.cfg)
        for group in self.optimizer.param_groups:
            group["lr"] = lr
        inputs, targets = self.sampler.next()
        if not self._on_cpu:
            inputs = inputs.to(self.boundary.device, non_blocking=True)
            targets = targets.to(self.boundary.device, non_blocking=True)
        return inputs, targets

    def apply_gradients(self) -> None:
        """Clip the gradients in ``.grad`` (if configured) and take the AdamW step."""
        if self.cfg.grad_clip is not None:
            nn.utils.clip_grad_norm_(self._trainable, self.cfg.grad_clip, foreach=True)
        self.optimizer.step()

    def train_round(self) -> None:
        """Take the begun round's remaining steps (the loop the simulator and `heloco work`
        share; :meth:`run_round` wraps it between the round's begin and end)."""
        boundary, on_step = self.boundary, self.on_step
        self.model.train()
        i = boundary.steps_done
        while not boundary.finished:
            loss = self.inner_step()
            boundary.record_step(self.sampler.tokens_per_batch, loss)
            if on_step is not None:
                on_step(i)
            i += 1
        self.optimizer.zero_grad(set_to_none=True)

    def run_round(
        self, start: Params, steps: int, base_revision: int, round_id: int | None = None
    ) -> RoundResult:
        """Load ``start``, take ``steps`` inner steps, return Δ = start − end (fp32, CPU).

        A round of 0 steps returns a zero delta and a NaN mean loss.
        """
        if steps < 0:
            raise UserInputError("steps", steps, "an integer >= 0")
        rid = -1 if round_id is None else round_id
        self.boundary.begin(Dispatch(start, base_revision, steps, rid, self.worker_id))
        self.train_round()
        result = self.boundary.end()
        return result if round_id is not None else replace(result, round_id=None)

    def state_dict(self) -> StateDict:
        """``{"meta": JSON-able dict, "tensors": {name: Tensor}}``: schedule position, round
        count, sampler RNG and (when kept across rounds) the inner AdamW moments. No pickle:
        the tensors can go to safetensors and the meta to JSON."""
        return self.boundary.state_dict()

    def load_state_dict(self, state: StateDict) -> None:
        """Restore what :meth:`state_dict` saved."""
        self.boundary.load_state_dict(state)
