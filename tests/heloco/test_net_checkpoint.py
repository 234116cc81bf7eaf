"""Server checkpoints: atomic, checksummed, newest valid first, and a full disk is survived.

A corrupt newest checkpoint does not block the start (the previous one is used, with a
warning), and a poisoned value can neither be pushed nor loaded.
"""

from __future__ import annotations

import errno
import json
from functools import partial
from pathlib import Path
from typing import Any

import pytest
import torch

from heloco.net import checkpoint, wire
from heloco.net.coordinator import Budget, Coordinator
from heloco.net.endpoint import CoordinatorBuilder, Endpoint, EndpointConfig
from heloco.outer import OuterConfig, build_optimizer
from heloco.server import Server, ServerConfig
from shardmeter.errors import UserInputError

SECRET = b"checkpoint-test-secret-0123456789"


def make_coord(workers: int = 2, **wiring: Any) -> Coordinator:
    """A coordinator (``wiring``: the storage and persistence an endpoint builds it with)."""
    init = {"w": torch.zeros(3, 4), "b": torch.zeros(5)}
    opt = build_optimizer("async-nesterov", init, OuterConfig(), workers)
    server = Server(init, opt, ServerConfig(n_workers=workers, inner_steps=3))
    return Coordinator(server, Budget(revisions=100), **wiring)


def push_round(coord: Coordinator, w: int = 0, **over: Any) -> wire.Message:
    d = coord.handle(wire.make("pull", {"worker": w, "incarnation": "a"}))
    body = {
        "worker": w,
        "incarnation": "a",
        "round_id": d.body["round_id"],
        "steps": 3,
        "tokens": 30,
        "base_revision": d.body["revision"],
        "mean_loss": 1.0,
        "compute_s": 0.1,
    } | over
    delta = {"w": torch.full((3, 4), 0.1), "b": torch.full((5,), 0.1)}
    return coord.handle(wire.make("push", body, delta))


def endpoint(root: Path, build: CoordinatorBuilder = make_coord, **cfg: Any) -> Endpoint:
    return Endpoint(build, SECRET, EndpointConfig(checkpoint_dir=root, **cfg))


def saved_at(root: Path, revisions: list[int]) -> Endpoint:
    """An endpoint that checkpointed after each revision in ``revisions``."""
    ep = endpoint(root, keep_checkpoints=5)
    for _ in range(max(revisions)):
        assert push_round(ep.coord).type == "ack"
        if ep.coord.server.revision in revisions:
            assert ep.save_checkpoint() is not None
    return ep


def test_save_is_atomic_named_and_pruned(tmp_path: Path) -> None:
    assert checkpoint.latest(tmp_path) is None
    for rev in (3, 5, 9, 9):
        checkpoint.save(tmp_path, rev, {"w": torch.full((2,), float(rev))}, {"r": rev}, keep=3)
    (tmp_path / ".tmp-ckpt-000000010-0000-1").mkdir()  # a crashed half-written one is ignored
    names = [p.name for p in checkpoint.checkpoints(tmp_path)]
    # A second save at revision 9 is a new checkpoint, never a replacement of the first.
    assert names == ["ckpt-000000005-0000", "ckpt-000000009-0000", "ckpt-000000009-0001"]
    ck = checkpoint.load(tmp_path / names[-1])
    assert ck.state == {"r": 9} and torch.equal(ck.tensors["w"], torch.full((2,), 9.0))
    sums = json.loads((tmp_path / names[-1] / checkpoint.CHECKSUMS_FILE).read_text())
    assert set(sums) == {checkpoint.TENSORS_FILE, checkpoint.STATE_FILE}
    assert (tmp_path / checkpoint.LATEST_FILE).read_text().strip() == names[-1]


def test_checkpoint_written_before_checksums_still_loads(tmp_path: Path) -> None:
    checkpoint.save(tmp_path, 1, {"w": torch.ones(2)}, {"r": 1})
    path = checkpoint.latest(tmp_path)
    assert path is not None
    (path / checkpoint.CHECKSUMS_FILE).unlink()
    assert checkpoint.load(path).state == {"r": 1}


@pytest.mark.parametrize(
    "damage", ["truncate_tensors", "flip_tensor_byte", "truncate_state", "delete_tensors"]
)
def test_corrupt_newest_checkpoint_falls_back_to_the_previous(
    tmp_path: Path, damage: str, capsys: pytest.CaptureFixture[str]
) -> None:
    """A truncated (or bit-flipped) newest checkpoint is skipped with a warning."""
    ep = saved_at(tmp_path, [2, 4])
    newest = checkpoint.checkpoints(tmp_path)[-1]
    tensors, state = newest / checkpoint.TENSORS_FILE, newest / checkpoint.STATE_FILE
    if damage == "truncate_tensors":
        tensors.write_bytes(tensors.read_bytes()[:100])
    elif damage == "flip_tensor_byte":
        raw = bytearray(tensors.read_bytes())
        raw[-1] ^= 0xFF  # same size, parses as safetensors: only the checksum sees it
        tensors.write_bytes(bytes(raw))
    elif damage == "truncate_state":
        state.write_text(state.read_text()[:50])
    else:
        tensors.unlink()
    fresh = endpoint(tmp_path)
    assert fresh.restore()
    assert fresh.coord.server.revision == 2 and fresh.coord.counters.accepted == 2
    assert fresh.restored_from is not None and fresh.restored_from.name.startswith("ckpt-000000002")
    assert [s.path for s in fresh.skipped] == [newest]
    err = capsys.readouterr().err
    assert "warning: skipping checkpoint" in err and newest.name in err
    assert push_round(fresh.coord).type == "ack"  # and it serves on from revision 2
    assert fresh.coord.server.revision == 3 and ep.coord.server.revision == 4


def test_no_usable_checkpoint_refuses_to_start(tmp_path: Path) -> None:
    saved_at(tmp_path, [1])
    only = checkpoint.checkpoints(tmp_path)[-1]
    (only / checkpoint.TENSORS_FILE).write_bytes(b"\0" * 10)
    with pytest.raises(UserInputError, match="usable checkpoint"):
        endpoint(tmp_path).restore()


def test_checkpoint_of_another_model_is_skipped(tmp_path: Path) -> None:
    saved_at(tmp_path, [1])
    init = {"w": torch.zeros(4, 4), "b": torch.zeros(5)}  # a different shape of "w"
    opt = build_optimizer("async-nesterov", init, OuterConfig(), 2)
    other = partial(Coordinator, Server(init, opt, ServerConfig(n_workers=2)), Budget(revisions=9))
    with pytest.raises(UserInputError, match="do not match"):
        endpoint(tmp_path, other).restore()


def test_poisoned_value_is_neither_accepted_nor_loaded(tmp_path: Path) -> None:
    """``tokens = 10**400`` in a push is refused; a checkpoint holding it (checksums
    recomputed, as an attacker with disk access could) is skipped on load."""
    ep = saved_at(tmp_path, [1])
    bad = push_round(ep.coord, tokens=10**400)
    assert bad.type == "error" and bad.body["reason"] == "malformed"
    assert "tokens" in bad.body["detail"]
    status = ep.coord.status()
    json.dumps(status, allow_nan=False)  # status still serialises (it crashed before)
    assert ep.save_checkpoint() is not None
    newest = checkpoint.checkpoints(tmp_path)[-1]
    state = json.loads((newest / checkpoint.STATE_FILE).read_text())
    state["coordinator"]["tokens"] = 10**400
    (newest / checkpoint.STATE_FILE).write_text(json.dumps(state))
    sums = {n: checkpoint.sha256(newest / n) for n in (checkpoint.TENSORS_FILE, "state.json")}
    (newest / checkpoint.CHECKSUMS_FILE).write_text(json.dumps(sums))
    fresh = endpoint(tmp_path)
    assert fresh.restore() and fresh.coord.tokens == 30
    assert "tokens" in fresh.skipped[0].reason


def _full_disk(monkeypatch: pytest.MonkeyPatch) -> None:
    """Make the tensor write fail halfway, as a full disk does (ENOSPC)."""

    def failing_write(path: Path, tensors: dict[str, torch.Tensor]) -> str:
        path.write_bytes(b"\0" * 64)
        raise OSError(errno.ENOSPC, "No space left on device")

    monkeypatch.setattr(checkpoint, "write_safetensors", failing_write)


def test_disk_full_keeps_the_previous_checkpoint_and_the_server_running(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    ep = saved_at(tmp_path, [2])
    before = checkpoint.checkpoints(tmp_path)
    assert push_round(ep.coord).type == "ack"
    with monkeypatch.context() as m:
        _full_disk(m)
        assert ep.save_checkpoint() is None
        assert ep.coord.counters.checkpoint_failed == 1
        assert "checkpoint not written" in capsys.readouterr().err
        assert push_round(ep.coord).type == "ack"  # still serving
    assert checkpoint.checkpoints(tmp_path) == before
    assert not [p for p in tmp_path.iterdir() if p.name.startswith(".tmp-")]  # cleaned up
    assert checkpoint.load(before[-1]).state["server"]["revision"] == 2
    assert ep.save_checkpoint() is not None  # the disk has room again
    assert endpoint(tmp_path).restore()


def test_durable_server_does_not_acknowledge_what_it_could_not_persist(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    ep = endpoint(tmp_path, durable=True)
    assert push_round(ep.coord).type == "ack"
    with monkeypatch.context() as m:
        _full_disk(m)
        reply = push_round(ep.coord)
        assert reply.type == "error" and reply.body["reason"] == "not_durable"
    assert ep.coord.server.revision == 2  # applied in memory, just not promised
    assert push_round(ep.coord).type == "ack"
    restored = endpoint(tmp_path)
    assert restored.restore() and restored.coord.server.revision == 3
