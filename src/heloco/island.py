"""A worker that is a data-parallel island: ranks of one ``torch.distributed`` process group.

Only rank 0 talks to the server. It broadcasts the welcome and every dispatch to the other
ranks (JSON as length + UTF-8 bytes, parameters as one flat fp32 tensor: no pickle), and the
island's round result is reduced onto it before the push:

- ``grads``: every inner step's gradients are averaged (DDP semantics, by the user's own
  ``DistributedDataParallel``/FSDP or by :func:`average_grads_each_step`), so every rank ends
  the round with the same parameters and the same Δ;
- ``deltas``: the ranks train independently and their Δ are averaged at the round's end.

Either way the island's tokens are the sum over ranks and its loss the mean.

Every tensor handed to a collective here is held by :mod:`heloco.handoff` until the backend
has let go of it, and :func:`leave_island` waits for that: a backend thread that frees a
tensor while the interpreter finalises aborts the process.
"""

from __future__ import annotations

import json
import os
import warnings
from dataclasses import dataclass, replace
from typing import Any, Literal

import torch
import torch.distributed as dist
from torch import nn

from heloco.handoff import keep, settle
from heloco.types import Dispatch, Params, RoundResult
from shardmeter.errors import UserInputError

IslandMode = Literal["grads", "deltas"]
ISLAND_MODES: tuple[str, ...] = ("grads", "deltas")


def world() -> tuple[int, int]:
    """(rank, world size) of the default process group, (0, 1) outside one."""
    if dist.is_available() and dist.is_initialized():
        return dist.get_rank(), dist.get_world_size()
    return 0, 1


def init_island(device: str) -> tuple[int, int]:
    """Join the island's process group when run under torchrun (gloo on CPU, NCCL on GPU)."""
    if int(os.environ.get("WORLD_SIZE", "1")) > 1 and not dist.is_initialized():
        dist.init_process_group("nccl" if device.startswith("cuda") else "gloo")
    return world()


def leave_island() -> None:
    """Leave the island's process group together, when this process joined one; call it last
    on every rank. A barrier, so that no rank exits while another still uses the group; a
    wait until the backend's threads have dropped every tensor heloco handed them (one freed
    by such a thread once the interpreter finalises aborts the process, see
    :mod:`heloco.handoff`); then the group destroyed (torch asks for it before exit)."""
    if dist.is_available() and dist.is_initialized():
        dist.barrier()
        if not settle():
            warnings.warn(
                "heloco.leave_island: a tensor handed to a collective is still referenced "
                "(a view of a dispatch or Δ kept past the loop?); leaving anyway",
                RuntimeWarning,
                stacklevel=2,
            )
        dist.destroy_process_group()


def average_grads_each_step(model: nn.Module) -> None:
    """DDP semantics without wrapping: all_reduce-average every gradient as it is accumulated."""
    _, size = world()

    def hook(p: torch.Tensor) -> None:
        assert p.grad is not None
        dist.all_reduce(p.grad)
        p.grad.div_(size)

    for p in model.parameters():
        if p.requires_grad:
            p.register_post_accumulate_grad_hook(hook)


@dataclass(frozen=True)
class Island:
    """The collectives of one island; ``device`` is where they run (NCCL needs GPU tensors)."""

    rank: int = 0
    size: int = 1
    mode: IslandMode = "grads"
    device: str = "cpu"

    def __post_init__(self) -> None:
        if self.mode not in ISLAND_MODES:
            raise UserInputError("island_mode", self.mode, "'grads' or 'deltas'")

    @classmethod
    def current(cls, mode: IslandMode = "grads", device: str = "cpu") -> Island:
        """The island of the default process group (a single rank outside one)."""
        rank, size = world()
        return cls(rank, size, mode, device)

    @property
    def leader(self) -> bool:
        """Rank 0: the one rank that talks to the server."""
        return self.rank == 0

    def broadcast_json(self, payload: dict[str, Any] | None) -> dict[str, Any]:
        """Rank 0's JSON object on every rank (length, then UTF-8 bytes; no pickle)."""
        if self.size == 1:
            assert payload is not None
            return payload
        raw = json.dumps(payload).encode() if self.leader else b""
        size = torch.tensor([len(raw)], dtype=torch.int64, device=self.device)
        keep(size)
        dist.broadcast(size, 0)
        buf = torch.zeros(int(size.item()), dtype=torch.uint8, device=self.device)
        if self.leader:
            buf.copy_(torch.frombuffer(bytearray(raw), dtype=torch.uint8))
        keep(buf)
        dist.broadcast(buf, 0)
        return dict(json.loads(bytes(buf.cpu().tolist())))

    def broadcast_params(self, params: Params | None, like: Params) -> Params:
        """Rank 0's parameters on every rank, as one flat fp32 broadcast; ``like`` gives the
        names, order and shapes (the model's)."""
        names = list(like)
        if self.leader and params is not None:
            flat = torch.cat([params[n].reshape(-1).to(self.device, torch.float32) for n in names])
        else:
            numel = sum(like[n].numel() for n in names)
            flat = torch.empty(numel, dtype=torch.float32, device=self.device)
        dist.broadcast(flat, 0)
        out: Params = {}
        offset = 0
        for n in names:
            numel = like[n].numel()
            out[n] = flat[offset : offset + numel].view(like[n].shape).cpu()
            offset += numel
        keep(flat, out.values())
        return out

    def broadcast_dispatch(self, dispatch: Dispatch | None, like: Params) -> Dispatch | None:
        """Rank 0's dispatch (or None: training is over) on every rank."""
        if self.size == 1:
            return dispatch
        head = torch.zeros(5, dtype=torch.int64)
        if self.leader and dispatch is not None:
            d = dispatch
            head = torch.tensor([1, d.revision, d.steps, d.round_id, d.worker])
        head = head.to(self.device)
        keep(head)
        dist.broadcast(head, 0)
        kind, revision, steps, round_id, worker = (int(x) for x in head.tolist())
        if kind == 0:
            return None
        params = self.broadcast_params(dispatch.params if dispatch is not None else None, like)
        return Dispatch(params, revision, steps, round_id, worker)

    def reduce(self, result: RoundResult) -> RoundResult:
        """The island's round: tokens summed, loss averaged, Δ averaged in ``deltas`` mode
        (one flat all-reduce). The result stays fp32 on the CPU."""
        if self.size == 1:
            return result
        loss = torch.tensor([result.mean_loss], dtype=torch.float64, device=self.device)
        keep(loss)
        dist.all_reduce(loss)
        delta = result.delta
        if self.mode == "deltas":
            names = list(delta)
            flat = torch.cat([delta[n].reshape(-1) for n in names]).to(self.device)
            dist.all_reduce(flat)
            host = flat.div_(self.size).cpu()
            delta, offset = {}, 0
            for n in names:
                numel = result.delta[n].numel()
                delta[n] = host[offset : offset + numel].view(result.delta[n].shape)
                offset += numel
            keep(flat, delta.values())
        return replace(
            result,
            delta=delta,
            tokens=result.tokens * self.size,
            mean_loss=float(loss.item()) / self.size,
        )
