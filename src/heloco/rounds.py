"""The round boundary of a HeLoCo worker, around any ``nn.Module`` and its inner optimizer.

A round (heloco-spec.md §1.2; DiLoCo, Douillard et al. 2023, arXiv 2311.08105, Algorithm 1):

- :meth:`Rounds.begin` loads the dispatched parameters θ_0 into the model in place (every name
  and shape checked), keeps θ_0 as the round's start, and clears the inner optimizer's state
  when the method resets it each round (the paper's default);
- the caller takes inner steps however it likes and reports each one with
  :meth:`Rounds.record_step` (which advances the schedule position);
- :meth:`Rounds.end` returns the pseudo-gradient Δ = θ_0 − θ_H (fp32, CPU) as a
  :class:`~heloco.types.RoundResult`; with a compressed payload
  (:class:`heloco.codecs.ErrorFeedback`) Δ is compressed there, its residual kept in the state.

No loop, no clock, no transport: the simulator's reference loop (:class:`heloco.worker.Worker`),
the networked worker and a user's own training loop (:class:`heloco.outer_loop.OuterLoop`) all
call this one object, so a worker behaves the same whatever drives it. Its state (schedule
position, round count, inner optimizer state when kept, and the data position of an attached
source) is tensors plus JSON, never pickle.

Parameters held as DTensors (FSDP2 ``fully_shard``) are loaded shard by shard and gathered
for Δ; the gather is a collective, so every rank of the mesh calls :meth:`Rounds.end`.
"""

from __future__ import annotations

import math
from collections.abc import Iterable
from typing import Any, Protocol

import torch
from torch import nn

from heloco.codecs import Compressor
from heloco.handoff import keep
from heloco.types import Dispatch, Params, RoundResult
from shardmeter.errors import UserInputError

StateDict = dict[str, Any]
"""``{"meta": JSON-able dict, "tensors": {name: Tensor}}`` (safetensors + JSON, no pickle)."""


class DataPosition(Protocol):
    """A data source whose read position is part of the worker's state (sampler, stream)."""

    def state_dict(self) -> StateDict: ...

    def load_state_dict(self, state: StateDict) -> None: ...


def _is_dtensor(t: torch.Tensor) -> bool:
    return type(t).__name__ == "DTensor" and hasattr(t, "full_tensor")


def full_tensor(p: torch.Tensor) -> torch.Tensor:
    """The whole value of a parameter: itself, or the gathered DTensor (a collective that
    every rank of its mesh joins; no autograd).

    FSDP2's layout (one mesh dimension, ``Shard(d)`` or ``Replicate``) is gathered into
    buffers held by :mod:`heloco.handoff`, so an island can leave safely right after
    gathering (:func:`heloco.island.leave_island`); other layouts take DTensor's own gather.
    """
    if not _is_dtensor(p):
        return p
    return _gather(p)


@torch.no_grad()
def _gather(p: Any) -> torch.Tensor:
    """A DTensor's whole value, through buffers the handoff holds (see :func:`full_tensor`)."""
    from torch.distributed import all_gather_single
    from torch.distributed.tensor import Replicate, Shard

    mesh, local = p.device_mesh, p.to_local()
    ranks = mesh.mesh.flatten().tolist()
    if mesh.ndim != 1 or ranks != sorted(ranks):
        return p.full_tensor()
    place = p.placements[0]
    if isinstance(place, Replicate):
        return local
    if type(place) is not Shard:
        return p.full_tensor()
    # torch.chunk's split (DTensor, FSDP2): rank i holds rows [i*c, (i+1)*c) of c = ceil(n/world)
    # rows, the last ones fewer or none; each sends its rows padded to c.
    dim = place.dim % p.ndim
    n, world = p.shape[dim], len(ranks)
    rows = -(-n // world)
    mine = local.movedim(dim, 0)
    send = mine.new_zeros((rows, *mine.shape[1:]))
    send[: mine.shape[0]].copy_(mine)
    out = mine.new_empty((world * rows, *mine.shape[1:]))
    whole = out[:n].movedim(0, dim)
    keep(send)
    keep(out, [whole])
    all_gather_single(out, send, group=mesh.get_group())
    return whole


def check_params(named: Iterable[tuple[str, torch.Tensor]], start: Params) -> None:
    """One-line error unless ``start`` has exactly the model's names and (full) shapes."""
    shapes = {name: tuple(p.shape) for name, p in named}  # a DTensor reports its global shape
    missing = [n for n in shapes if n not in start]
    extra = [n for n in start if n not in shapes]
    if missing or extra:
        raise UserInputError(
            "model",
            f"parameters missing from the server's model {missing[:3]}, unknown to it {extra[:3]}",
            "the same parameter names as the server's model (same architecture and config)",
        )
    for name, shape in shapes.items():
        if tuple(start[name].shape) != shape:
            raise UserInputError(
                f"model parameter {name!r}",
                f"shape {shape}",
                f"the server's shape {tuple(start[name].shape)}",
            )


@torch.no_grad()
def load_params(named: Iterable[tuple[str, torch.Tensor]], start: Params) -> None:
    """Copy ``start`` into the parameters in place (the local shard of a DTensor)."""
    for name, p in named:
        src = start[name]
        if _is_dtensor(p):
            from torch.distributed.tensor import distribute_tensor

            mesh, placements = p.device_mesh, p.placements  # type: ignore[attr-defined]
            local = distribute_tensor(
                src.to(p.device, p.dtype), mesh, placements, src_data_rank=None
            )
            p.to_local().copy_(local.to_local())  # type: ignore[attr-defined]
        else:
            p.copy_(src)


@torch.no_grad()
def pseudo_gradient(start: Params, named: Iterable[tuple[str, torch.Tensor]]) -> Params:
    """Δ = start − current, fp32 on the CPU, in the model's parameter order."""
    return {
        name: start[name].to(torch.float32) - full_tensor(p.detach()).to("cpu", torch.float32)
        for name, p in named
    }


def reset_optimizer_state(optimizer: torch.optim.Optimizer) -> None:
    """Forget the optimizer's per-parameter state (moments, step counts); a fresh optimizer
    of the same kind behaves identically from here on (state is created on the first step)."""
    optimizer.state.clear()


class Rounds:
    """Begin and end of a worker's rounds around ``model`` and its inner ``optimizer``.

    ``reset_optimizer``: clear the optimizer's state at every :meth:`begin` (the paper's
    default) or keep it across rounds. ``data``: an optional source whose read position joins
    :meth:`state_dict`. ``step`` is the schedule position: inner steps taken over the whole
    run (a rejoining worker sets it from the server's count of its accepted steps).
    ``feedback``: the compressed payload (top-k, sign) and its error-feedback residual, which
    joins :meth:`state_dict`; None sends Δ as it is.
    """

    def __init__(
        self,
        worker: int,
        model: nn.Module,
        optimizer: torch.optim.Optimizer | None = None,
        reset_optimizer: bool = True,
        data: DataPosition | None = None,
        feedback: Compressor | None = None,
    ) -> None:
        self.worker = worker
        self.model = model
        self.optimizer = optimizer
        self.reset_optimizer = reset_optimizer
        self.data = data
        self.feedback = feedback
        self.named = list(model.named_parameters())
        if not self.named:
            raise UserInputError("model", type(model).__name__, "a module with parameters")
        self.device = self.named[0][1].device
        self.step = 0
        self.rounds = 0
        self.dispatch: Dispatch | None = None
        self.steps_done = 0
        self.tokens = 0
        self._loss_sum = torch.zeros((), device=self.device)
        self._losses = 0

    # -- the boundary ---------------------------------------------------------------------
    def begin(self, dispatch: Dispatch, reset: bool = True) -> None:
        """Load ``dispatch.params`` into the model and start counting the round's steps.

        ``reset=False`` keeps the inner optimizer's state even when the method resets it each
        round (a streaming sub-round continues the worker's own model: :mod:`heloco.streaming`)."""
        if dispatch.steps < 0:
            raise UserInputError("steps", dispatch.steps, "an integer >= 0")
        check_params(self.named, dispatch.params)
        load_params(self.named, dispatch.params)
        if reset and self.reset_optimizer and self.optimizer is not None:
            reset_optimizer_state(self.optimizer)
        self.dispatch = dispatch
        self.steps_done = 0
        self.tokens = 0
        self._loss_sum = torch.zeros((), device=self.device)
        self._losses = 0

    def record_step(self, tokens: int, loss: torch.Tensor | float | None = None) -> bool:
        """Count one inner step of ``tokens`` training tokens (and its loss, kept on the
        device: no host sync); returns whether the round has taken all its steps."""
        self.steps_done += 1
        self.step += 1
        self.tokens += tokens
        if loss is not None:
            self._loss_sum += loss.detach() if isinstance(loss, torch.Tensor) else float(loss)
            self._losses += 1
        return self.finished

    @property
    def active(self) -> bool:
        """A round has begun and not ended."""
        return self.dispatch is not None

    @property
    def finished(self) -> bool:
        """The current round has taken the steps its dispatch asked for."""
        return self.dispatch is not None and self.steps_done >= self.dispatch.steps

    @torch.no_grad()
    def current(self) -> Params:
        """The model's parameters now: fp32 copies on the CPU, in the model's order."""
        return {
            name: full_tensor(p.detach()).to("cpu", torch.float32, copy=True)
            for name, p in self.named
        }

    def end(self, compress: bool = True, delta: bool = True) -> RoundResult:
        """Δ of the round (fp32, CPU) and its counts; a round of 0 steps has a zero Δ and a
        NaN mean loss. The one host sync of the round reads the summed loss. With a
        ``feedback`` payload Δ is compressed (``compress=False``: not yet, see
        :meth:`compress`, for an island that averages its ranks' Δ first). ``delta=False``:
        the counts only, Δ empty (a streaming sub-round measures its fragment's own)."""
        d = self.dispatch
        if d is None:
            raise RuntimeError("Rounds.end() without a round begun")
        delta_ = pseudo_gradient(d.params, self.named) if delta else {}
        mean_loss = float(self._loss_sum.item()) / self._losses if self._losses else math.nan
        self.dispatch = None
        self.rounds += 1
        result = RoundResult(
            worker=self.worker,
            delta=delta_,
            steps=self.steps_done,
            tokens=self.tokens,
            mean_loss=mean_loss,
            base_revision=d.revision,
            round_id=d.round_id,
        )
        return self.compress(result) if compress else result

    def compress(self, result: RoundResult) -> RoundResult:
        """``result`` with Δ compressed by the payload (its residual updated); as it is when
        the worker sends Δ uncompressed."""
        return result if self.feedback is None else self.feedback.compress_result(result)

    # -- state ------------------------------------------------------------------------------
    def state_dict(self) -> StateDict:
        """Schedule position, round count, the optimizer's state when it is kept across rounds,
        and the data position: ``{"meta": JSON-able, "tensors": {name: Tensor}}``."""
        tensors: dict[str, torch.Tensor] = {}
        kept = self.optimizer is not None and not self.reset_optimizer
        if kept:
            assert self.optimizer is not None
            for name, p in self.named:
                for key, value in self.optimizer.state.get(p, {}).items():
                    tensors[f"optimizer.{name}.{key}"] = (
                        torch.as_tensor(value).detach().cpu().clone()
                    )
        meta: dict[str, Any] = {
            "worker": self.worker,
            "step": self.step,
            "rounds": self.rounds,
            "has_optimizer": kept,
        }
        if self.data is not None:
            data = self.data.state_dict()
            meta["data"] = data["meta"]
            tensors.update({f"data.{k}": v for k, v in data["tensors"].items()})
        if self.feedback is not None:
            fb = self.feedback.state_dict()
            meta["feedback"] = fb["meta"]
            tensors.update({f"feedback.{k}": v for k, v in fb["tensors"].items()})
        return {"meta": meta, "tensors": tensors}

    def load_state_dict(self, state: StateDict) -> None:
        """Restore :meth:`state_dict` output (same worker slot, same model)."""
        meta, tensors = state["meta"], state["tensors"]
        if int(meta["worker"]) != self.worker:
            raise ValueError(f"state of worker {meta['worker']} loaded into worker {self.worker}")
        self.step = int(meta["step"])
        self.rounds = int(meta["rounds"])
        if self.optimizer is not None:
            reset_optimizer_state(self.optimizer)
            if meta["has_optimizer"]:
                self._load_optimizer(tensors)
        if self.data is not None and "data" in meta:
            data_tensors = {
                k.removeprefix("data."): v for k, v in tensors.items() if k.startswith("data.")
            }
            self.data.load_state_dict({"meta": meta["data"], "tensors": data_tensors})
        if self.feedback is not None:
            residual = {
                k.removeprefix("feedback."): v
                for k, v in tensors.items()
                if k.startswith("feedback.")
            }
            self.feedback.load_state_dict({"meta": meta.get("feedback", {}), "tensors": residual})

    def _load_optimizer(self, tensors: dict[str, torch.Tensor]) -> None:
        """Saved per-name moments back into the optimizer, through its own ``load_state_dict``
        (which puts each value on the device and dtype the optimizer expects)."""
        assert self.optimizer is not None
        saved = self.optimizer.state_dict()
        order = [id(p) for group in self.optimizer.param_groups for p in group["params"]]
        index = {pid: i for i, pid in enumerate(order)}
        per_param: dict[int, dict[str, torch.Tensor]] = {}
        for name, p in self.named:
            prefix = f"optimizer.{name}."
            for key, value in tensors.items():
                if key.startswith(prefix) and "." not in key[len(prefix) :] and id(p) in index:
                    per_param.setdefault(index[id(p)], {})[key[len(prefix) :]] = value
        self.optimizer.load_state_dict({"state": per_param, "param_groups": saved["param_groups"]})
