"""Every field of every message is validated before use.

In process, through the real wire format: authentication before parsing, bounded JSON,
strict types and ranges, staleness as the revision log defines it, slot-bound keys, and
replies the worker checks too.
"""

from __future__ import annotations

import json
from typing import Any

import pytest
import torch
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from heloco.net import auth, messages, wire
from heloco.net.coordinator import Budget, Coordinator
from heloco.net.endpoint import Endpoint, EndpointConfig
from heloco.net.link import ProtocolError, reply_body
from heloco.net.wire import WireError
from heloco.outer import OuterConfig, build_optimizer
from heloco.server import Server, ServerConfig

SECRET = b"messages-test-secret-0123456789"
DELTA = {"w": torch.full((3, 4), 0.1), "b": torch.full((5,), 0.1)}


def make_coord(method: str = "async-nesterov", workers: int = 2, **wiring: Any) -> Coordinator:
    init = {"w": torch.zeros(3, 4), "b": torch.zeros(5)}
    opt = build_optimizer(method, init, OuterConfig(), workers)
    cfg = ServerConfig(n_workers=workers, inner_steps=3, synchronous=method == "sync")
    server = Server(init, opt, cfg)
    return Coordinator(server, Budget(revisions=100), max_tokens_per_step=64, **wiring)


def signed(header: bytes, *payload: bytes) -> list[wire.Frame]:
    frames: list[wire.Frame] = [header, *payload]
    return [*frames, auth.sign(SECRET, frames)]


def header(**over: Any) -> bytes:
    """A well-formed header with ``over`` replacing fields (as JSON text)."""
    head = {
        "v": 1,
        "type": "status",
        "id": wire.new_id(),
        "re": "",
        "ts": 1.0e9,
        "body": {},
        "tensors": [],
    }
    return json.dumps(head | over).encode()


# -- nothing is parsed before the HMAC, and parsing is bounded --------------------------
def test_oversized_deep_unauthenticated_message_is_refused_unparsed() -> None:
    """A message that once crashed the server: > --max-mb, first frame JSON nested 150,000 deep, a bogus tag."""
    ep = Endpoint(make_coord, SECRET, EndpointConfig(max_bytes=1 << 20))
    frames = [b"[" * 150_000 + b"]" * 150_000, b"x" * 2_000_000, b"\0" * 32]
    reply = ep.handle_frames(frames)
    assert reply is not None and reply.body["reason"] == "too_large" and reply.re == ""
    assert ep.coord.counters.too_large == 1


def test_deep_header_of_a_secret_holder_is_refused_by_a_count() -> None:
    """A signed header nested 100,000 deep is a bad_header, not a RecursionError."""
    for deep in (b"[" * 100_000 + b"]" * 100_000, b'{"a":' * 50_000 + b"1" + b"}" * 50_000):
        with pytest.raises(WireError, match="nested"):
            wire.decode(signed(deep), SECRET)
    assert wire.json_depth(header()) <= wire.MAX_JSON_DEPTH


@pytest.mark.slow
@settings(max_examples=200, deadline=None, derandomize=True)
@given(st.recursive(st.integers() | st.text(alphabet='[]{}"\\ a'), st.lists, max_leaves=30))
def test_json_depth_matches_the_nesting(value: object) -> None:
    def depth(v: object) -> int:
        return 1 + max(map(depth, v), default=0) if isinstance(v, list) else 0

    assert wire.json_depth(json.dumps(value).encode()) == depth(value)


@settings(
    max_examples=300,
    deadline=None,
    derandomize=True,
    suppress_health_check=[HealthCheck.too_slow],
)
@given(
    head=st.binary(max_size=300)
    | st.builds(
        lambda parts: b"".join(parts),
        st.lists(
            st.sampled_from(
                [
                    b"{",
                    b"}",
                    b"[",
                    b"]",
                    b'"',
                    b"\\",
                    b":",
                    b",",
                    b"1e999",
                    b"NaN",
                    b"-",
                    b"0",
                    b'"v":1',
                    b'"type":"push"',
                    b'"tensors":[',
                    b'"body":{',
                    b"\xff",
                    b"true",
                ]
            ),
            max_size=60,
        ),
    ),
    payload=st.lists(st.binary(max_size=64), max_size=4),
    sign=st.booleans(),
)
def test_decode_raises_only_wire_errors(head: bytes, payload: list[bytes], sign: bool) -> None:
    """Fuzz: arbitrary frames, signed (a secret holder) or not, give a WireError or a valid
    message, nothing else."""
    frames: list[wire.Frame] = signed(head, *payload) if sign else [head, *payload, b"t" * 32]
    try:
        msg = wire.decode(frames, SECRET, max_bytes=1 << 16)
    except WireError as exc:
        assert exc.reason in {
            "too_large",
            "bad_frames",
            "bad_mac",
            "bad_header",
            "bad_version",
            "bad_tensor",
        }
        return
    assert sign and isinstance(msg.body, dict)
    msg.params()


# -- types, ranges, finiteness -------------------------------------------------------
@pytest.mark.parametrize(
    ("field", "value"),
    [
        ("ts", 10**400),
        ("ts", "now"),
        ("ts", -1),
        ("id", "not-hex"),
        ("id", 7),
        ("re", "x" * 33),
        ("v", True),
        ("type", ""),
        ("body", []),
        ("tensors", {}),
        ("tensors", [{"name": "w", "codec": "int8", "shape": [4], "block": 2**62}]),
        ("tensors", [{"name": "w", "codec": "int8", "shape": [4], "block": 0}]),
        ("tensors", [{"name": "w", "codec": "fp32", "shape": [4], "block": 8}]),
        ("tensors", [{"name": "w", "codec": "fp32", "shape": [-1], "block": 0}]),
        ("tensors", [{"name": "w", "codec": "fp32", "shape": [2**41], "block": 0}]),
        ("tensors", [{"name": "w", "codec": "fp32", "shape": [1] * 9, "block": 0}]),
        ("tensors", [{"name": "", "codec": "fp32", "shape": [1], "block": 0}]),
        ("tensors", [{"name": "w", "codec": "fp8", "shape": [1], "block": 0}]),
        ("tensors", [{"name": "w", "codec": "fp32", "shape": [1], "block": 0, "x": 1}]),
        ("tensors", [{"name": "w", "codec": "fp32", "shape": [1.0], "block": 0}]),
        ("extra", 1),
    ],
)
def test_bad_header_fields_are_refused(field: str, value: object) -> None:
    with pytest.raises(WireError) as info:
        wire.decode(signed(header(**{field: value}), b"\0" * 4), SECRET)
    assert info.value.reason in {"bad_header", "bad_version", "bad_frames"}


def test_duplicate_tensor_names_are_refused() -> None:
    meta = {"name": "w", "codec": "fp32", "shape": [1], "block": 0}
    with pytest.raises(WireError, match="twice"):
        wire.decode(signed(header(tensors=[meta, meta]), b"\0" * 4, b"\0" * 4), SECRET)


def _push(coord: Coordinator, w: int = 0, tensors: bool = True, **over: Any) -> wire.Message:
    d = coord.handle(wire.make("pull", {"worker": w, "incarnation": "a"}))
    assert d.type == "dispatch"
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
    msg = wire.make("push", body, DELTA if tensors else None)
    return coord.handle(wire.decode(wire.encode(msg, SECRET), SECRET))


@pytest.mark.parametrize(
    ("field", "value"),
    [
        ("tokens", 10**400),
        ("tokens", 3 * 64 + 1),  # more than 3 steps hold
        ("tokens", -1),
        ("tokens", 30.0),
        ("tokens", True),
        ("mean_loss", 10**400),
        ("mean_loss", "low"),
        ("compute_s", 10**400),
        ("compute_s", 0),
        ("steps", 0),
        ("steps", 4),  # more than the 3 dispatched
        ("steps", 2**62),
        ("round_id", 10**400),
        ("base_revision", -1),
        ("worker", 2),
        ("worker", 10**400),
        ("worker", "0"),
        ("incarnation", "x" * 65),
        ("incarnation", "a b"),
        ("surprise", 1),
    ],
)
def test_bad_push_fields_are_refused_and_nothing_is_stored(field: str, value: object) -> None:
    coord = make_coord()
    reply = _push(coord, **{field: value})
    assert reply.type == "error" and reply.body["reason"] in {"malformed", "bad_worker"}
    assert coord.server.revision == 0 and coord.tokens == 0 and coord.counters.accepted == 0
    json.dumps(coord.status(), allow_nan=False)
    assert _push(coord).type == "ack"  # the same slot still works


def test_requests_other_than_push_carry_no_tensors_and_no_extra_fields() -> None:
    coord = make_coord()
    with_tensors = wire.make("pull", {"worker": 0}, DELTA)
    assert coord.handle(with_tensors).body["reason"] == "malformed"
    assert coord.handle(wire.make("status", {"x": 1})).body["reason"] == "malformed"
    assert coord.handle(wire.make("pull", {"worker": 0})).type == "dispatch"


def test_a_worker_key_speaks_only_for_its_slot() -> None:
    coord = make_coord()
    pull0 = wire.make("pull", {"worker": 0})
    assert coord.handle(pull0, peer="worker1").body["reason"] == "forbidden"
    assert coord.counters.forbidden == 1
    assert coord.handle(pull0, peer="worker0").type == "dispatch"
    assert coord.handle(wire.make("pull", {"worker": 1}), peer="server").type == "dispatch"


def test_worker_checks_replies_too() -> None:
    good = wire.make("dispatch", {"revision": 1, "steps": 3, "round_id": 0})
    assert reply_body(good, messages.DispatchBody).steps == 3
    for body in ({"revision": 1, "steps": 0, "round_id": 0}, {"revision": 10**400}):
        with pytest.raises(ProtocolError):
            reply_body(wire.make("dispatch", body), messages.DispatchBody)
    with pytest.raises(ProtocolError):
        reply_body(wire.make("wait", {"retry_s": 1e9, "revision": 0}), messages.Wait)


# -- staleness is the revision log's ------------------------------------------------
def test_ack_and_status_staleness_equal_the_revision_log() -> None:
    """τ = revision at arrival − base revision (spec 1.1): 0 for the first arrival."""
    coord = make_coord(workers=3)
    pulls = [coord.handle(wire.make("pull", {"worker": w})) for w in range(3)]
    acks = []
    for w in (0, 1, 2):
        body = {
            "worker": w,
            "round_id": pulls[w].body["round_id"],
            "steps": 3,
            "tokens": 30,
            "base_revision": pulls[w].body["revision"],
        }
        acks.append(coord.handle(wire.make("push", body, DELTA)).body["staleness"])
    logged = [a.staleness for r in coord.server.log for a in r.arrivals]
    assert acks == logged == [0, 1, 2]
    status = coord.status()
    assert [w["mean_staleness"] for w in status["workers"]] == [0, 1, 2]


def test_sync_staleness_is_none_until_applied_then_zero() -> None:
    coord = make_coord("sync", workers=2)
    d0, d1 = (coord.handle(wire.make("pull", {"worker": w})) for w in (0, 1))
    first = coord.handle(wire.make("push", _body(0, d0), DELTA)).body
    last = coord.handle(wire.make("push", _body(1, d1), DELTA)).body
    assert (first["applied"], first["staleness"]) == (False, None)
    assert (last["applied"], last["staleness"]) == (True, 0)
    assert [w["mean_staleness"] for w in coord.status()["workers"]] == [0, 0]


def _body(w: int, d: wire.Message) -> dict[str, Any]:
    return {
        "worker": w,
        "round_id": d.body["round_id"],
        "steps": 3,
        "tokens": 30,
        "base_revision": d.body["revision"],
    }
