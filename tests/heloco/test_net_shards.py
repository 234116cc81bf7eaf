"""The sharded server in one process: the shard plan, the parallel outer step (bit for bit the
serial one), and a 3-shard endpoint driven by real clients over loopback: fetch, stage, push,
refusals, copy on write of a dispatch being fetched, and the same model as one shard."""

from __future__ import annotations

import threading
from collections.abc import Iterator
from functools import partial
from pathlib import Path
from typing import Any

import pytest
import torch
from hypothesis import given, settings
from hypothesis import strategies as st
from torch import nn

from heloco.net import wire
from heloco.net.client import Client, ClientConfig, ServerUnreachable
from heloco.net.coordinator import Budget, Coordinator
from heloco.net.endpoint import CoordinatorBuilder, Endpoint, EndpointConfig
from heloco.net.keys import ClientKeys, ServerKeys, new_keypair
from heloco.net.link import NetLink
from heloco.net.shards import GroupRunner, plan_shards
from heloco.outer import OuterConfig, build_optimizer
from heloco.outer.base import Arrival
from heloco.outer_loop import OuterLoop
from heloco.server import Server, ServerConfig
from heloco.types import Params, RoundResult, clone_params
from shardmeter.errors import UserInputError

SECRET = b"shards-test-secret-0123456789abcdef"


@settings(max_examples=80, deadline=None, derandomize=True)
@given(sizes=st.lists(st.integers(0, 10_000), min_size=0, max_size=30), n=st.integers(1, 6))
def test_plan_covers_every_tensor_once_balanced_by_bytes(sizes: list[int], n: int) -> None:
    named = {f"t{i}": b for i, b in enumerate(sizes)}
    plan = plan_shards(named, n)
    assert len(plan) == n
    assert sorted(k for shard in plan for k in shard) == sorted(named)
    order = list(named)
    for shard in plan:
        assert shard == sorted(shard, key=order.index)  # model order within a shard
    loads = [sum(named[k] for k in shard) for shard in plan]
    if sizes:
        assert max(loads) <= sum(sizes) / n + max(sizes)  # greedy LPT bound


def model(seed: int = 0) -> Params:
    g = torch.Generator().manual_seed(seed)
    shapes = {
        "emb": (50, 8),
        "a.w": (8, 8),
        "a.b": (8,),
        "b.w": (8, 8),
        "b.b": (8,),
        "head": (8, 50),
    }
    return {k: torch.randn(s, generator=g) for k, s in shapes.items()}


@pytest.mark.parametrize(
    "method", ["heloco", "async-nesterov", "dn", "mla", "sync", "heloco+ab", "heloco-uncorrected"]
)
def test_parallel_outer_step_is_the_serial_one_bit_for_bit(method: str) -> None:
    init = model()
    cfg = OuterConfig()
    serial = build_optimizer(method, init, cfg, 2)
    sharded = build_optimizer(method, init, cfg, 2)
    runner = GroupRunner(plan_shards({k: v.numel() for k, v in init.items()}, 3))
    sharded.runner = runner
    a, b = clone_params(init), clone_params(init)
    g = torch.Generator().manual_seed(1)
    for step in range(4):
        deltas = [{k: torch.randn(v.shape, generator=g) for k, v in init.items()} for _ in range(2)]
        arrivals = [Arrival(d, w, step % 2) for w, d in enumerate(deltas)]
        if method != "sync":
            arrivals = arrivals[step % 2 : step % 2 + 1]
        assert serial.step(a, arrivals) == sharded.step(b, arrivals)
        for k in init:
            assert torch.equal(a[k], b[k]), k
        assert all(
            torch.equal(x, y)
            for x, y in zip(
                serial.state_dict().tensors.values(),
                sharded.state_dict().tensors.values(),
                strict=True,
            )
        )
    runner.close()


def coordinator(method: str = "async-nesterov", workers: int = 2) -> CoordinatorBuilder:
    """What builds a coordinator of ``method`` (an endpoint builds it with its storage)."""
    init = model()
    opt = build_optimizer(method, init, OuterConfig(), workers)
    return partial(Coordinator, Server(init, opt, ServerConfig(n_workers=workers)), Budget())


class Served:
    """An endpoint serving in a thread, stopped at the end."""

    def __init__(self, build: CoordinatorBuilder, shards: int, **cfg: Any) -> None:
        self.endpoint = Endpoint(build, SECRET, EndpointConfig(shards=shards, poll_ms=5, **cfg))
        self.restored = self.endpoint.restore()
        self.address = self.endpoint.open()
        self.thread = threading.Thread(target=self.endpoint.serve, daemon=True)
        self.thread.start()

    def link(self, worker: int, codec: str = "fp32") -> NetLink:
        cfg = ClientConfig(self.address, timeout_s=5, deadline_s=10)
        return NetLink(cfg, SECRET, worker, codec)  # type: ignore[arg-type]

    def client(self, shard: int = 0) -> Client:
        address = self.endpoint.listeners[shard].address
        return Client(ClientConfig(address, timeout_s=5, deadline_s=10), SECRET)

    def close(self) -> None:
        self.endpoint.stop.set()
        self.thread.join(10)


@pytest.fixture
def served() -> Iterator[Any]:
    started: list[Served] = []

    def start(shards: int = 3, checkpoint_dir: Path | None = None, **kw: Any) -> Served:
        s = Served(coordinator(**kw), shards, checkpoint_dir=checkpoint_dir)
        started.append(s)
        return s

    yield start
    for s in started:
        s.close()


def round_of(link: NetLink, seed: int) -> tuple[RoundResult, Params]:
    d = link.pull()
    assert d is not None
    g = torch.Generator().manual_seed(seed)
    delta = {k: torch.randn(d.params[k].shape, generator=g) * 1e-2 for k in model()}
    result = RoundResult(link.worker, delta, 2, 128, 1.0, d.revision, d.round_id)
    return result, {k: v.clone() for k, v in d.params.items()}


@pytest.mark.timeout(60)
def test_sharded_server_applies_the_same_updates_as_one_shard(served: Any) -> None:
    """Two workers' rounds through 3 shards (fp32 and int8) end in the same model as through
    one shard; the dispatches carry every tensor; status reports the shards."""
    finals = []
    for shards in (1, 3):
        server = served(shards)
        links = [server.link(0), server.link(1, "int8")]
        for link in links:
            link.join()
        for i in range(3):
            for w, link in enumerate(links):
                result, start = round_of(link, 10 * i + w)
                assert set(start) == set(model())
                assert link.push(result, 0.1).accepted
        status = server.endpoint.coord.status()
        finals.append(clone_params(server.endpoint.coord.server.params))
        for link in links:
            link.close()
        if shards == 3:
            assert [s["tensors"] for s in status["shards"]] == [1, 1, 4]  # emb | head | rest
            assert all(s["counters"]["staged"] == 6 for s in status["shards"])
    for k in finals[0]:
        assert torch.equal(finals[0][k], finals[1][k]), k


@pytest.mark.timeout(60)
def test_refusals(served: Any) -> None:
    """A part with NaN, a part with the wrong tensors, a push before every shard has staged,
    a fetch of a superseded dispatch: each is refused with a reason and changes nothing."""
    server = served(3)
    link = server.link(0)
    link.join()
    result, _ = round_of(link, 0)
    me = link.ident | {"round_id": result.round_id}
    plan = server.endpoint.state.plan
    shard1 = server.client(1)
    nan = {k: result.delta[k].clone() for k in plan[1]}
    next(iter(nan.values())).view(-1)[0] = float("nan")
    reply = shard1.call(wire.make("stage", me, nan))
    assert reply.type == "error" and reply.body["reason"] == "bad_update"
    wrong = shard1.call(wire.make("stage", me, {k: result.delta[k] for k in plan[2]}))
    assert wrong.body["reason"] == "bad_update"
    assert shard1.call(wire.make("push", me)).body["reason"] == "wrong_shard"
    body = me | {"base_revision": result.base_revision, "steps": 2, "tokens": 128}
    leader = server.client(0)
    unstaged = leader.call(wire.make("push", body))
    assert unstaged.type == "error" and unstaged.body["reason"] == "unstaged"
    assert link.push(result, 0.1).accepted  # staged on every shard, then pushed
    stale = shard1.call(wire.make("fetch", me))
    assert stale.type == "error" and stale.body["reason"] == "superseded"
    coord = server.endpoint.coord
    assert coord.server.revision == 1 and coord.counters.accepted == 1
    for c in (shard1, leader):
        c.close()
    link.close()


@pytest.mark.timeout(60)
def test_dispatch_being_fetched_keeps_its_values_through_an_update(served: Any) -> None:
    """Worker 0 is dispatched but fetches only after worker 1's update was applied: it still
    gets the model it was dispatched (the update wrote fresh copies), and θ moved on."""
    server = served(2)
    a, b = server.link(0), server.link(1)
    a.join()
    b.join()
    coord = server.endpoint.coord
    dispatched = clone_params(coord.server.params)
    leader = server.client(0)
    pulled = leader.call(wire.make("pull", a.ident))
    assert pulled.type == "dispatch" and not pulled.tensors
    result, _ = round_of(b, 5)
    assert b.push(result, 0.1).accepted and coord.server.revision == 1
    assert any(not torch.equal(dispatched[k], coord.server.params[k]) for k in dispatched)
    got = {}
    for shard in range(2):
        client = server.client(shard)
        part = client.call(wire.make("fetch", a.ident | {"round_id": pulled.body["round_id"]}))
        assert part.type == "slice" and part.body["revision"] == 0
        got.update(part.params())
        client.close()
    assert set(got) == set(dispatched)
    for k, v in dispatched.items():
        assert torch.equal(got[k], v), k
    leader.close()
    a.close()
    b.close()


@pytest.mark.slow
@pytest.mark.timeout(60)
def test_every_shard_holds_curve_and_the_worker_keys_to_their_slots() -> None:
    """CURVE on: a worker key pushes an fp32 tensor larger than the header cap (libzmq checks
    the encrypted frame size against MAXMSGSIZE), a stranger without a key gets nothing from
    any shard, and worker 1's key may not stage for worker 0 on a data shard."""
    server_pair, keys0, keys1 = new_keypair(), new_keypair(), new_keypair()
    allowed = {keys0.public: "worker0", keys1.public: "worker1"}
    init = {"big": torch.zeros(400_000), "small": torch.zeros(10)}  # 1.6 MB > 1 MiB
    opt = build_optimizer("async-nesterov", init, OuterConfig(), 2)
    build = partial(Coordinator, Server(init, opt, ServerConfig(n_workers=2)), Budget())
    cfg = EndpointConfig(shards=2, poll_ms=5, keys=ServerKeys(server_pair, allowed))
    endpoint = Endpoint(build, SECRET, cfg)
    endpoint.open()
    thread = threading.Thread(target=endpoint.serve, daemon=True)
    thread.start()
    try:

        def config(keys: Any, shard: int = 0, patience: float = 5) -> ClientConfig:
            at = endpoint.listeners[shard].address
            curve = None if keys is None else ClientKeys(server_pair.public, keys)
            return ClientConfig(at, timeout_s=patience, deadline_s=2 * patience, keys=curve)

        link = NetLink(config(keys0), SECRET, 0)
        link.join()
        result, _ = round_of_model(link, init)
        assert link.push(result, 0.1).accepted and endpoint.coord.server.revision == 1
        link.close()
        for shard in (0, 1):
            stranger = Client(config(None, shard, 0.5), SECRET)
            with pytest.raises(ServerUnreachable):
                stranger.request("status")
            stranger.close()
        impostor = Client(config(keys1, 1), SECRET)
        me = {"worker": 0, "incarnation": "x", "round_id": 1}
        part = {k: torch.zeros(init[k].shape) for k in endpoint.state.plan[1]}
        refused = impostor.call(wire.make("stage", me, part))
        assert refused.type == "error" and refused.body["reason"] == "forbidden"
        impostor.close()
    finally:
        endpoint.stop.set()
        thread.join(10)


def round_of_model(link: NetLink, like: Params) -> tuple[RoundResult, Params]:
    d = link.pull()
    assert d is not None and set(d.params) == set(like)
    delta = {k: torch.full(v.shape, 1e-3) for k, v in like.items()}
    return RoundResult(link.worker, delta, 2, 128, 1.0, d.revision, d.round_id), d.params


def module_like(params: Params) -> nn.Module:
    """A module whose parameters have these (dotted) names and values."""
    root = nn.Module()
    for name, value in params.items():
        *path, leaf = name.split(".")
        owner = root
        for part in path:
            if not hasattr(owner, part):
                owner.add_module(part, nn.Module())
            owner = getattr(owner, part)
        owner.register_parameter(leaf, nn.Parameter(value.clone()))
    return root


@pytest.mark.timeout(60)
@pytest.mark.parametrize("shards", [1, 2])
def test_a_model_unlike_the_servers_is_a_one_line_error(served: Any, shards: int) -> None:
    """A user's loop whose module has another parameter's shape (or other names) joins a
    live server: the first dispatch, assembled from every shard, is refused in one line that
    names the parameter and both shapes; nothing reaches the server's model."""
    server = served(shards)
    wrong_shape = module_like(model() | {"head": torch.zeros(8, 51)})
    cases = [
        (wrong_shape, r"model parameter 'head': got 'shape \(8, 51\)'.*shape \(8, 50\)"),
        (nn.Linear(8, 8), "parameters missing from the server's model"),
    ]
    for worker, (module, message) in enumerate(cases):
        link = server.link(worker)
        with (
            pytest.raises(UserInputError, match=message) as exc,
            OuterLoop(module, None, link, hook=False),
        ):
            pass
        link.close()  # __exit__ does not run when __enter__ raises
        assert "\n" not in str(exc.value)
    coord = server.endpoint.coord
    assert coord.server.revision == 0 and coord.counters.accepted == 0


@pytest.mark.timeout(60)
def test_a_sharded_checkpoint_resumes_with_any_shard_count(served: Any, tmp_path: Path) -> None:
    """A 2-shard server's checkpoint (one file set, one revision for the whole model) is
    restored by a server of 1 shard, and that one's by a server of 3: the same θ and revision,
    and the next round of a worker goes through every shard of the new layout."""
    first = served(2, tmp_path)
    assert not first.restored
    link = first.link(0)
    link.join()
    for i in range(2):
        result, _ = round_of(link, i)
        assert link.push(result, 0.1).accepted
    link.close()
    first.close()  # the final checkpoint
    theta, revision = clone_params(first.endpoint.coord.server.params), 2
    for shards in (1, 3):  # each resumes from the checkpoint of the one before
        again = served(shards, tmp_path)
        coord = again.endpoint.coord
        assert again.restored and coord.server.revision == revision
        for k, v in theta.items():
            assert torch.equal(coord.server.params[k], v), k
        link = again.link(0)
        link.join()
        result, start = round_of(link, 7)
        assert all(torch.equal(start[k], v) for k, v in theta.items())
        assert link.push(result, 0.1).revision == revision + 1
        link.close()
        again.close()
        theta, revision = clone_params(coord.server.params), revision + 1
