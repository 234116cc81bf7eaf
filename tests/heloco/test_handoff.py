"""Tensors handed to a collective outlive the backend's hold on them (heloco.handoff).

A gloo worker thread drops a finished collective's tensors a moment after the collective
completed. If the tensor's Python object died first, that thread must take the GIL to free
it, and once the interpreter finalises that aborts the process ("terminate called without an
active exception"). The backend here completes each collective at once and keeps a C++-only
reference (a view) to its tensors until released, as gloo's worker thread does; every Python
object the island handed over must still be alive while it holds them.
"""

from __future__ import annotations

import weakref
from collections.abc import Iterator
from typing import Any

import pytest
import torch
import torch.distributed as dist

from heloco import handoff
from heloco.island import Island
from heloco.types import Dispatch, RoundResult


class LateReleasingBackend:
    """Stands in for ``dist.broadcast`` / ``dist.all_reduce``: done at once, tensors held."""

    def __init__(self) -> None:
        self.handed: list[weakref.ref[torch.Tensor]] = []
        self.holds: list[torch.Tensor] = []

    def collective(self, tensor: torch.Tensor, *_: Any, **__: Any) -> None:
        self.handed.append(weakref.ref(tensor))
        self.holds.append(tensor.view_as(tensor))  # holds the C++ tensor, not its Python object

    def release(self) -> None:
        self.holds.clear()


@pytest.fixture
def backend(monkeypatch: pytest.MonkeyPatch) -> Iterator[LateReleasingBackend]:
    fake = LateReleasingBackend()
    monkeypatch.setattr(dist, "broadcast", fake.collective)
    monkeypatch.setattr(dist, "all_reduce", fake.collective)
    yield fake
    fake.release()
    assert handoff.settle(timeout_s=0.0)


def island_traffic(island: Island) -> None:
    """One round of an island's collectives; every result is dropped on return."""
    like = {"w": torch.zeros(2, 3), "b": torch.zeros(3)}
    params = {"w": torch.ones(2, 3), "b": torch.full((3,), 2.0)}
    island.broadcast_json({"worker_steps": 4})
    got = island.broadcast_dispatch(Dispatch(params, 1, 2, 0, 0), like)
    assert got is not None and torch.equal(got.params["w"], params["w"])
    delta = {"w": torch.ones(2, 3), "b": torch.ones(3)}
    island.reduce(RoundResult(0, delta, 2, 64, 1.5, 1, 0))


def test_handed_tensors_outlive_the_backends_hold(backend: LateReleasingBackend) -> None:
    island_traffic(Island(rank=0, size=2, mode="deltas"))
    assert len(backend.handed) == 6  # size, JSON, head, parameters, loss, Δ
    assert not handoff.settle(timeout_s=0.0)  # the backend still holds them
    backend.release()  # gloo's worker thread lets go: no Python object may die there
    assert all(ref() is not None for ref in backend.handed)
    assert handoff.settle(timeout_s=0.0)
    assert all(ref() is None for ref in backend.handed)  # freed by this thread, with the GIL


def test_views_handed_on_do_not_count_as_a_hold(backend: LateReleasingBackend) -> None:
    flat = torch.arange(6.0)
    views = [flat[:2], flat[2:].view(2, 2)]
    extra = views[1][0]
    handoff.keep(flat, views)
    del flat
    assert handoff.held() == 1  # a view made elsewhere is indistinguishable from a backend's
    del extra
    assert handoff.held() == 0  # the views handed on are not a hold
    assert views[0].tolist() == [0.0, 1.0]


class FakeMesh:
    """A one-dimensional device mesh of ``world`` ranks, in rank order."""

    ndim = 1

    def __init__(self, world: int) -> None:
        self.mesh = torch.arange(world)

    def get_group(self) -> None:
        return None


class FakeDTensor:
    """Rank ``rank``'s view of ``whole`` sharded on ``dim`` the way DTensor and FSDP2 split
    it (torch.chunk: the last ranks may hold fewer rows, or none)."""

    def __init__(self, whole: torch.Tensor, dim: int, rank: int, world: int) -> None:
        from torch.distributed.tensor import Shard

        chunks = list(whole.chunk(world, dim))
        empty = whole.narrow(dim, 0, 0)
        self.local = (chunks + [empty] * world)[rank]
        self.device_mesh = FakeMesh(world)
        self.placements = (Shard(dim),)
        self.shape, self.ndim = whole.shape, whole.ndim

    def to_local(self) -> torch.Tensor:
        return self.local


@pytest.mark.parametrize(
    ("shape", "dim", "world"), [((5, 3), 0, 4), ((3, 6), 1, 4), ((2, 3), 0, 3)]
)
def test_full_tensor_gathers_uneven_shards(
    monkeypatch: pytest.MonkeyPatch, shape: tuple[int, int], dim: int, world: int
) -> None:
    from heloco import rounds

    whole = torch.arange(float(shape[0] * shape[1])).view(shape)
    sent: dict[int, torch.Tensor] = {}

    def gather_from(rank: int) -> torch.Tensor:
        def all_gather(out: torch.Tensor, send: torch.Tensor, group: Any = None) -> None:
            sent[rank] = send.clone()
            if len(sent) == world:
                out.copy_(torch.cat([sent[r] for r in range(world)]))

        monkeypatch.setattr(dist, "all_gather_single", all_gather)
        return rounds._gather(FakeDTensor(whole, dim, rank, world))

    for rank in range(world):  # the first pass sends every rank's padded rows
        gather_from(rank)
    for rank in range(world):
        assert torch.equal(gather_from(rank), whole), rank
    assert handoff.settle(timeout_s=0.0)
