"""The worker's inner loop: H AdamW steps from the dispatched model -> pseudo-gradient.

θ_0 = dispatched start; θ_{h+1} = AdamW step on a batch of the worker's stream; after H steps
the worker returns Δ = θ_0 − θ_H (heloco-spec.md §1.2, the DiLoCo inner loop of Douillard et
al. 2023, arXiv 2311.08105, Algorithm 1). As in the paper's prototype, the inner AdamW is
fresh every round by default, and the cosine learning-rate schedule position is tracked per
worker across rounds (spec §1.2).

The loop is kept as tight as a plain PyTorch training loop: one index gather per batch,
``zero_grad(set_to_none=True)``, foreach/fused AdamW, and a single host sync per round (the
loss is summed on device and read once).
"""

from __future__ import annotations

import math
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

import torch
from torch import nn

from heloco.data.seeding import derive_seed
from heloco.data.stream import TokenStream
from heloco.data.validation import LossFn, token_cross_entropy
from heloco.types import Params, RoundResult
from shardmeter.errors import UserInputError

SAMPLER_KEY = 2  # derive_seed key of a worker's batch sampler
ADAMW_STATE_KEYS = ("step", "exp_avg", "exp_avg_sq")


def check_device(device: str) -> None:
    """Raise a one-line error for a device torch cannot parse or this machine does not have."""
    try:
        kind = torch.device(device).type
    except RuntimeError:
        raise UserInputError("device", device, "a torch device such as cpu or cuda:0") from None
    if kind == "cuda" and not torch.cuda.is_available():
        raise UserInputError("device", device, "cpu (no CUDA device is available here)")


@dataclass(frozen=True)
class InnerConfig:
    """Inner optimiser and batch shape. Defaults: the authors' prototype (spec §1.8, §3):
    AdamW lr 2e-4, betas (0.9, 0.999), weight decay 1e-2, cosine decay to 1e-6, batch 2 × 128.

    ``total_steps`` is the length of one worker's cosine schedule (its inner steps over the
    whole run); after it the rate stays at ``min_lr``. ``grad_clip`` None disables clipping.
    ``fused`` picks torch's fused AdamW kernel where the device has one, else foreach.
    """

    lr: float = 2e-4
    weight_decay: float = 1e-2
    betas: tuple[float, float] = (0.9, 0.999)
    eps: float = 1e-8
    warmup_steps: int = 0
    min_lr: float = 1e-6
    total_steps: int = 2000
    batch_size: int = 2
    seq_len: int = 128
    grad_clip: float | None = None
    reset_each_round: bool = True
    fused: bool = True

    def __post_init__(self) -> None:
        if not (math.isfinite(self.lr) and self.lr > 0):
            raise UserInputError("inner.lr", self.lr, "a finite number > 0")
        if not 0 <= self.min_lr <= self.lr:
            raise UserInputError("inner.min_lr", self.min_lr, f"a number in [0, lr={self.lr}]")
        if not (math.isfinite(self.weight_decay) and self.weight_decay >= 0):
            raise UserInputError("inner.weight_decay", self.weight_decay, "a finite number >= 0")
        if len(self.betas) != 2 or not all(0 <= b < 1 for b in self.betas):
            raise UserInputError("inner.betas", self.betas, "two numbers in [0, 1)")
        if not self.eps > 0:
            raise UserInputError("inner.eps", self.eps, "a number > 0")
        if self.total_steps < 1:
            raise UserInputError("inner.total_steps", self.total_steps, "an integer >= 1")
        if not 0 <= self.warmup_steps <= self.total_steps:
            raise UserInputError(
                "inner.warmup_steps",
                self.warmup_steps,
                f"an integer in [0, total_steps={self.total_steps}]",
            )
        if self.batch_size < 1:
            raise UserInputError("inner.batch_size", self.batch_size, "an integer >= 1")
        if self.seq_len < 1:
            raise UserInputError("inner.seq_len", self.seq_len, "an integer >= 1")
        if self.grad_clip is not None and not self.grad_clip > 0:
            raise UserInputError(
                "inner.grad_clip", self.grad_clip, "a number > 0, or None to disable"
            )


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
    """Runs rounds of inner steps on its own stream and returns pseudo-gradients.

    Works with any ``nn.Module``; the default loss is next-token cross-entropy on ``(B, T, V)``
    logits, ``loss_fn(model, inputs, targets)`` replaces it. ``on_step(i)``, if given, is
    called after the ``i``-th inner step of a round (0-based), e.g. to pace a slower machine.
    Batches are seeded by ``(seed, worker_id)``. Several workers may share one model object: each round loads its
    start point first, and each worker keeps its own optimiser state.
    """

    def __init__(
        self,
        worker_id: int,
        model: nn.Module,
        stream: TokenStream,
        cfg: InnerConfig,
        seed: int,
        loss_fn: LossFn = token_cross_entropy,
        on_step: Callable[[int], None] | None = None,
    ) -> None:
        self.worker_id = worker_id
        self.model = model
        self.cfg = cfg
        self.loss_fn = loss_fn
        self.on_step = on_step
        self.sampler = stream.sampler(
            cfg.batch_size, cfg.seq_len, seed=derive_seed(seed, SAMPLER_KEY, worker_id)
        )
        self.step = 0  # position in the cosine schedule (inner steps taken so far)
        self.rounds = 0
        self._named = list(model.named_parameters())
        if not self._named:
            raise ValueError("the model has no parameters")
        self._trainable = [p for _, p in self._named if p.requires_grad]
        self._device = self._named[0][1].device
        self._optimizer: torch.optim.AdamW | None = None

    @property
    def optimizer(self) -> torch.optim.AdamW | None:
        """The inner AdamW of the current (or last) round; None before the first round."""
        return self._optimizer

    def new_optimizer(self) -> torch.optim.AdamW:
        """A fresh AdamW over the trainable parameters (fused kernel where available)."""
        cfg = self.cfg
        kind = {"fused": True} if cfg.fused else {"foreach": True}
        return torch.optim.AdamW(
            self._trainable,
            lr=cosine_lr(self.step, cfg),
            betas=cfg.betas,
            eps=cfg.eps,
            weight_decay=cfg.weight_decay,
            **kind,
        )

    def optimizer_for_round(self) -> torch.optim.AdamW:
        """Fresh state each round (paper default) or the one kept from earlier rounds."""
        if self.cfg.reset_each_round or self._optimizer is None:
            self._optimizer = self.new_optimizer()
        return self._optimizer

    @torch.no_grad()
    def load(self, start: Params) -> None:
        """Copy ``start`` into the model's parameters in place."""
        if len(start) != len(self._named) or any(name not in start for name, _ in self._named):
            missing = sorted({n for n, _ in self._named} ^ set(start))
            raise ValueError(
                f"start parameters do not match the model; differing names: {missing[:5]}"
            )
        for name, p in self._named:
            p.copy_(start[name])

    def run_round(
        self, start: Params, steps: int, base_revision: int, round_id: int | None = None
    ) -> RoundResult:
        """Load ``start``, take ``steps`` inner steps, return Δ = start − end (fp32, CPU).

        A round of 0 steps returns a zero delta and a NaN mean loss.
        """
        if steps < 0:
            raise UserInputError("steps", steps, "an integer >= 0")
        self.load(start)
        model, cfg, sampler = self.model, self.cfg, self.sampler
        opt = self.optimizer_for_round()
        model.train()
        loss_sum = torch.zeros((), device=self._device)
        on_cpu = self._device.type == "cpu"
        on_step = self.on_step
        for i in range(steps):
            lr = cosine_lr(self.step, cfg)
            for group in opt.param_groups:
                group["lr"] = lr
            inputs, targets = sampler.next()
            if not on_cpu:
                inputs = inputs.to(self._device, non_blocking=True)
                targets = targets.to(self._device, non_blocking=True)
            loss = self.loss_fn(model, inputs, targets)
            opt.zero_grad(set_to_none=True)
            loss.backward()
            if cfg.grad_clip is not None:
                nn.utils.clip_grad_norm_(self._trainable, cfg.grad_clip, foreach=True)
            opt.step()
            loss_sum += loss.detach()
            self.step += 1
            if on_step is not None:
                on_step(i)
        opt.zero_grad(set_to_none=True)
        self.rounds += 1
        with torch.no_grad():
            delta = {
                name: start[name].to(torch.float32) - p.detach().to("cpu", torch.float32)
                for name, p in self._named
            }
        return RoundResult(
            worker=self.worker_id,
            delta=delta,
            steps=steps,
            tokens=steps * sampler.tokens_per_batch,
            mean_loss=float(loss_sum.item()) / steps if steps else math.nan,
            base_revision=base_revision,
            round_id=round_id,
        )

    def state_dict(self) -> dict[str, Any]:
        """``{"meta": JSON-able dict, "tensors": {name: Tensor}}``: schedule position, round
        count, sampler RNG and (when kept across rounds) the inner AdamW moments. No pickle:
        the tensors can go to safetensors and the meta to JSON."""
        tensors: dict[str, torch.Tensor] = {"sampler_rng": self.sampler.get_state()}
        kept = None if self.cfg.reset_each_round else self._optimizer
        if kept is not None:
            for name, p in self._named:
                for key, value in kept.state.get(p, {}).items():
                    tensors[f"optimizer.{name}.{key}"] = (
                        torch.as_tensor(value).detach().cpu().clone()
                    )
        meta = {
            "worker": self.worker_id,
            "step": self.step,
            "rounds": self.rounds,
            "has_optimizer": kept is not None,
        }
        return {"meta": meta, "tensors": tensors}

    def load_state_dict(self, state: dict[str, Any]) -> None:
        """Restore what :meth:`state_dict` saved."""
        meta, tensors = state["meta"], state["tensors"]
        if int(meta["worker"]) != self.worker_id:
            raise ValueError(
                f"state of worker {meta['worker']} loaded into worker {self.worker_id}"
            )
        self.step = int(meta["step"])
        self.rounds = int(meta["rounds"])
        self.sampler.set_state(tensors["sampler_rng"])
        self._optimizer = None
        if meta["has_optimizer"]:
            opt = self.new_optimizer()
            index = {id(p): i for i, p in enumerate(self._trainable)}
            per_param: dict[int, dict[str, torch.Tensor]] = {}
            for name, p in self._named:
                for key in ADAMW_STATE_KEYS:
                    saved_tensor = tensors.get(f"optimizer.{name}.{key}")
                    if saved_tensor is not None:
                        per_param.setdefault(index[id(p)], {})[key] = saved_tensor
            saved = opt.state_dict()
            opt.load_state_dict({"state": per_param, "param_groups": saved["param_groups"]})
            self._optimizer = opt
