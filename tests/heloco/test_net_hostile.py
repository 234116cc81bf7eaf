"""A hostile network against a live `heloco serve` on 127.0.0.1.

One real server process (CURVE keys, HMAC secret, ``--max-mb 4``) takes 63 hostile cases:
strangers without keys, key holders without the secret, and secret holders sending
malformed frames, wrong counts, huge or deep JSON, bad types and values, replays and
truncated payloads. After every case the server must still answer, and the reply must be the
expected refusal (or none); nothing may be accepted. Afterwards a good worker completes a
round, the revision log holds exactly that one update, and the server's log holds no
traceback. A second test measures that a stranger cannot make the server allocate memory.
"""

from __future__ import annotations

import contextlib
import json
import re
import signal
import socket
import time
from collections.abc import Callable, Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import pytest
import torch
import zmq

from heloco.cli import main
from heloco.cli.launch import local_cluster
from heloco.cli.serve import status
from heloco.codecs import Coded, ErrorFeedback
from heloco.config import save_config
from heloco.net import auth, keys, wire
from heloco.net.auth import SECRET_ENV
from heloco.net.client import ClientConfig
from heloco.net.launcher import LaunchConfig, LocalCluster
from heloco.net.link import NetLink
from heloco.sim import parse_sim_config
from heloco.types import RoundResult

pytestmark = [pytest.mark.slow, pytest.mark.timeout(240)]

SECRET = b"hostile-test-secret-0123456789abcdef"
MAX_MB = 4
NO_REPLY_S = 0.4  # how long a case waits for a reply it must not get
SEND_TIMEOUT_MS = 5000  # a send that cannot be queued gives up (a DEALER with no peer blocks)


@dataclass
class Peer:
    """A raw DEALER socket to the server, with or without CURVE keys and the secret."""

    sock: zmq.Socket[bytes]
    secret: bytes

    def send(self, frames: list[bytes]) -> bool:
        """Queue ``frames``; False if they could not be queued within the send timeout (a
        DEALER whose connection is between a refused CURVE handshake and its reconnect has no
        peer, and a plain send would block forever)."""
        try:
            self.sock.send_multipart(frames)
        except zmq.Again:
            return False
        return True

    def reply(self, timeout_s: float) -> wire.Message | None:
        if not self.sock.poll(int(timeout_s * 1000)):
            return None
        return wire.decode(self.sock.recv_multipart(), self.secret)

    def close(self) -> None:
        self.sock.close(linger=0)


class Live:
    """The live server and what a test needs to attack it."""

    def __init__(self, cluster: LocalCluster) -> None:
        self.cluster = cluster
        self.address = cluster.address
        self.ctx: zmq.Context[Any] = zmq.Context()
        self.worker1 = keys.load_client(cluster.keys_dir / "worker1")
        self.replay: list[bytes] = []  # a message the server has seen, to send again

    def peer(self, curve: keys.ClientKeys | None = None, secret: bytes = SECRET) -> Peer:
        sock = self.ctx.socket(zmq.DEALER)
        sock.setsockopt(zmq.LINGER, 0)
        sock.setsockopt(zmq.SNDTIMEO, SEND_TIMEOUT_MS)
        if curve is not None:
            keys.connect_securely(sock, curve)
        sock.connect(self.address)
        return Peer(sock, secret)

    def insider(self) -> Peer:
        """Holds worker 1's key and the secret."""
        return self.peer(self.worker1)

    def status(self) -> dict[str, Any]:
        return status(self.address, SECRET, 10.0, self.cluster.client_keys())


@pytest.fixture
def server(tmp_path: Path, tiny_net_values: Callable[..., dict[str, Any]]) -> Iterator[Live]:
    root = tmp_path
    values = tiny_net_values(method="async-nesterov", workers=2, token_budget=10**9, eval_every=0)
    save_config(parse_sim_config(values), root / "run.toml")
    cfg = LaunchConfig(
        config=root / "run.toml",
        out_dir=root / "run",
        workers=2,
        serve_args=["--max-mb", str(MAX_MB), "--heartbeat-s", "1", "--evict-after-s", "60"],
    )
    cluster = local_cluster(cfg, SECRET)
    cluster.start_server()
    srv = Live(cluster)
    try:
        yield srv
    finally:
        cluster.stop()
        srv.ctx.term()


# -- message builders ---------------------------------------------------------------------------
def sign(frames: list[bytes], secret: bytes = SECRET) -> list[bytes]:
    return [*frames, auth.sign(secret, frames)]


def header(type_: str = "status", body: dict[str, Any] | None = None, **over: Any) -> bytes:
    head = {
        "v": 1,
        "type": type_,
        "id": wire.new_id(),
        "re": "",
        "ts": time.time(),
        "body": body or {},
        "tensors": [],
    } | over
    return json.dumps(head).encode()


def raw_header(text: str) -> bytes:
    """A header whose JSON is written by hand (NaN, 10**400, 1e400 ...)."""
    return text.replace("ID", wire.new_id()).replace("TS", repr(time.time())).encode()


@dataclass
class Round:
    """A dispatch worker 1 really got: what a push must refer to."""

    round_id: int
    revision: int
    shapes: dict[str, tuple[int, ...]]


def dispatch_for_worker1(srv: Live) -> Round:
    peer = srv.insider()
    try:
        peer.send(wire.encode(wire.make("pull", {"worker": 1, "incarnation": "h"}), SECRET))
        reply = peer.reply(10)
    finally:
        peer.close()
    assert reply is not None and reply.type == "dispatch", reply
    shapes = {k: e.shape for k, e in reply.tensors.items()}
    return Round(reply.body["round_id"], reply.body["revision"], shapes)


def push_frames(rnd: Round, body: dict[str, Any] | None = None, **tweak: Any) -> list[bytes]:
    """A push of worker 1's round; ``tweak`` bends the delta (names, shapes, values, codec)."""
    delta = {k: torch.full(s, 1e-3) for k, s in rnd.shapes.items()}
    if "delta" in tweak:
        delta = tweak["delta"](delta)
    b = {
        "worker": 1,
        "incarnation": "h",
        "round_id": rnd.round_id,
        "base_revision": rnd.revision,
        "steps": 2,
        "tokens": 128,
        "mean_loss": 5.0,
        "compute_s": 0.1,
    } | (body or {})
    params: Any = delta
    if "payload" in tweak:  # a compressed Δ (top-k, sign), then bent by ``coded``
        params = ErrorFeedback(tweak["payload"]).compress(delta)
        if "coded" in tweak:
            name = next(iter(params.coded))
            params.coded[name] = tweak["coded"](params.coded[name])
    msg = wire.make("push", b, params, codec=tweak.get("codec", "fp32"))
    return [bytes(f) for f in wire.encode(msg, SECRET)]


def bend_topk(values: Callable[[torch.Tensor], None] | None = None, index: int | None = None):  # type: ignore[no-untyped-def]
    """A top-k tensor with a value or its last index replaced (frames stay signed)."""

    def bend(c: Coded) -> Coded:
        data, aux = c.data.clone(), c.aux.clone()
        if values is not None:
            values(data)
        if index is not None:
            aux[-1] = index
        return Coded(c.kind, c.shape, data, aux, c.group)

    return bend


def nan_at_first(delta: dict[str, torch.Tensor], value: float) -> dict[str, torch.Tensor]:
    first = next(iter(delta))
    delta[first] = delta[first].clone()
    delta[first].view(-1)[0] = value
    return delta


# -- the cases ----------------------------------------------------------------------------------
# Each case sends something hostile and names what must come back: None (dropped without a
# reply) or the reason of an ``error``/``rejected`` reply. ``who`` is the sender.
Case = tuple[str, str, Callable[[Live, Round], list[bytes]], str | None]

GOOD_STATUS = lambda s, r: [bytes(f) for f in wire.encode(wire.make("status"), SECRET)]  # noqa: E731


def _tensor_header(meta: list[dict[str, Any]]) -> bytes:
    return header("push", {"worker": 1}, tensors=meta)


CASES: list[Case] = [
    # strangers: no CURVE key, an unknown key, or the wrong server key -> refused in handshake
    ("no keys, valid message", "stranger", GOOD_STATUS, None),
    ("unknown key, valid message", "unknown_key", GOOD_STATUS, None),
    ("wrong server key", "wrong_server", GOOD_STATUS, None),
    (
        "no keys, deep JSON + 2 MB",
        "stranger",
        lambda s, r: [b"[" * 150_000 + b"]" * 150_000, b"x" * 2_000_000, b"\0" * 32],
        None,
    ),
    ("unknown key, 20 MB", "unknown_key", lambda s, r: [b"h", *[b"\0" * 1_000_000] * 20], None),
    # key holders without the secret -> dropped after the HMAC check
    ("wrong secret", "insider", lambda s, r: sign([header()], b"wrong-secret-0123456789"), None),
    ("tag truncated", "insider", lambda s, r: [*sign([header()])[:-1], b"\0" * 31], None),
    ("no tag", "insider", lambda s, r: [header()], None),
    ("empty frame", "insider", lambda s, r: [b""], None),
    ("tag only", "insider", lambda s, r: [b"\0" * 32], None),
    (
        "deep JSON + 2 MB as insider",
        "insider",
        lambda s, r: [b"[" * 150_000 + b"]" * 150_000, b"x" * 2_000_000, b"\0" * 32],
        None,
    ),
    ("replayed good status", "insider", lambda s, r: s.replay, None),
    ("stale timestamp", "insider", lambda s, r: sign([header(ts=time.time() - 10_000)]), None),
    ("future timestamp", "insider", lambda s, r: sign([header(ts=time.time() + 10_000)]), None),
    # secret holders: malformed headers -> dropped (counted as malformed)
    ("header not JSON", "insider", lambda s, r: sign([b"\x00\xffnot json"]), None),
    ("header invalid UTF-8", "insider", lambda s, r: sign([b'{"v":1,"type":"\xff"}']), None),
    ("header is a list", "insider", lambda s, r: sign([b"[1,2,3]"]), None),
    ("header nested 100k", "insider", lambda s, r: sign([b"[" * 100_000 + b"]" * 100_000]), None),
    (
        "header body nested 1k",
        "insider",
        lambda s, r: sign(
            [
                raw_header(
                    '{"v":1,"type":"status","id":"ID","re":"","ts":TS,"body":'
                    + '{"a":' * 1000
                    + "1"
                    + "}" * 1000
                    + ',"tensors":[]}'
                )
            ]
        ),
        None,
    ),
    ("header 2 MiB", "insider", lambda s, r: sign([header(body={"x": "a" * (2 << 20)})]), None),
    ("version 2", "insider", lambda s, r: sign([header(v=2)]), None),
    (
        "ts 10**400",
        "insider",
        lambda s, r: sign(
            [
                raw_header(
                    '{"v":1,"type":"status","id":"ID","re":"","ts":1'
                    + "0" * 400
                    + ',"body":{},"tensors":[]}'
                )
            ]
        ),
        None,
    ),
    (
        "ts NaN",
        "insider",
        lambda s, r: sign(
            [
                raw_header(
                    '{"v":1,"type":"status","id":"ID","re":"","ts":NaN,"body":{},"tensors":[]}'
                )
            ]
        ),
        None,
    ),
    ("id not hex", "insider", lambda s, r: sign([header(id="zz")]), None),
    ("type 1000 chars", "insider", lambda s, r: sign([header(type_="x" * 1000)]), None),
    ("body is a list", "insider", lambda s, r: sign([header(body=[1])]), None),  # type: ignore[arg-type]
    ("tensors is an object", "insider", lambda s, r: sign([header(tensors={})]), None),
    (
        "tensor frame missing",
        "insider",
        lambda s, r: sign(
            [_tensor_header([{"name": "w", "codec": "fp32", "shape": [4], "block": 0}])]
        ),
        None,
    ),
    ("extra frame", "insider", lambda s, r: sign([header(), b"\0" * 16]), None),
    (
        "payload truncated",
        "insider",
        lambda s, r: sign(
            [_tensor_header([{"name": "w", "codec": "fp32", "shape": [4], "block": 0}]), b"\0" * 15]
        ),
        None,
    ),
    (
        "int8 block 2**62",
        "insider",
        lambda s, r: sign(
            [
                _tensor_header([{"name": "w", "codec": "int8", "shape": [4], "block": 2**62}]),
                b"\0" * 4,
                b"\0" * 4,
            ]
        ),
        None,
    ),
    (
        "negative shape",
        "insider",
        lambda s, r: sign(
            [
                _tensor_header([{"name": "w", "codec": "fp32", "shape": [-4], "block": 0}]),
                b"\0" * 16,
            ]
        ),
        None,
    ),
    (
        "shape product 2**80",
        "insider",
        lambda s, r: sign(
            [
                _tensor_header(
                    [{"name": "w", "codec": "fp32", "shape": [2**40, 2**40], "block": 0}]
                ),
                b"\0" * 16,
            ]
        ),
        None,
    ),
    (
        "tensor name twice",
        "insider",
        lambda s, r: sign(
            [
                _tensor_header([{"name": "w", "codec": "fp32", "shape": [1], "block": 0}] * 2),
                b"\0" * 4,
                b"\0" * 4,
            ]
        ),
        None,
    ),
    # secret holders: well-formed messages with bad content -> an error reply, nothing stored
    ("unknown type", "insider", lambda s, r: sign([header("launch_missiles")]), "unknown_type"),
    ("status with a body", "insider", lambda s, r: sign([header(body={"x": 1})]), "malformed"),
    (
        "status, 10k-element body",
        "insider",
        lambda s, r: sign([header(body={"x": list(range(10_000))})]),
        "malformed",
    ),
    (
        "pull with tensors",
        "insider",
        lambda s, r: [
            bytes(f)
            for f in wire.encode(wire.make("pull", {"worker": 1}, {"w": torch.ones(2)}), SECRET)
        ],
        "malformed",
    ),
    (
        "hello, 10 KB incarnation",
        "insider",
        lambda s, r: [
            bytes(f)
            for f in wire.encode(
                wire.make("hello", {"worker": 1, "incarnation": "x" * 10_000}), SECRET
            )
        ],
        "malformed",
    ),
    (
        "worker slot 99",
        "insider",
        lambda s, r: [bytes(f) for f in wire.encode(wire.make("pull", {"worker": 99}), SECRET)],
        "forbidden",
    ),
    (
        "worker0 by worker1's key",
        "insider",
        lambda s, r: [bytes(f) for f in wire.encode(wire.make("pull", {"worker": 0}), SECRET)],
        "forbidden",
    ),
    (
        "push tokens 10**400",
        "insider",
        lambda s, r: push_frames(r, {"tokens": 10**400}),
        "malformed",
    ),
    (
        "push tokens beyond its steps",
        "insider",
        lambda s, r: push_frames(r, {"tokens": 10**12}),
        "malformed",
    ),
    ("push steps 2**62", "insider", lambda s, r: push_frames(r, {"steps": 2**62}), "malformed"),
    (
        "push steps above dispatch",
        "insider",
        lambda s, r: push_frames(r, {"steps": 3}),
        "malformed",
    ),
    (
        "push mean_loss 1e400",
        "insider",
        lambda s, r: sign(
            [
                raw_header(
                    '{"v":1,"type":"push","id":"ID","re":"","ts":TS,"body":{"worker":1,"round_id":0,'
                    '"base_revision":0,"steps":2,"tokens":1,"mean_loss":1e400},"tensors":[]}'
                )
            ]
        ),
        "malformed",
    ),
    ("push compute_s 0", "insider", lambda s, r: push_frames(r, {"compute_s": 0}), "malformed"),
    ("push worker true", "insider", lambda s, r: push_frames(r, {"worker": True}), "malformed"),
    ("push worker '1'", "insider", lambda s, r: push_frames(r, {"worker": "1"}), "malformed"),
    ("push round_id float", "insider", lambda s, r: push_frames(r, {"round_id": 0.0}), "malformed"),
    ("push extra field", "insider", lambda s, r: push_frames(r, {"admin": True}), "malformed"),
    (
        "push never-dispatched round",
        "insider",
        lambda s, r: push_frames(r, {"round_id": 999}),
        "unknown",
    ),
    (
        "push wrong base revision",
        "insider",
        lambda s, r: push_frames(r, {"base_revision": 7}),
        "revision_mismatch",
    ),
    (
        "push wrong names",
        "insider",
        lambda s, r: push_frames(r, delta=lambda d: {f"x.{k}": v for k, v in d.items()}),
        "bad_update",
    ),
    (
        "push wrong shapes",
        "insider",
        lambda s, r: push_frames(
            r, delta=lambda d: {k: v.reshape(-1)[:-1] if v.numel() > 1 else v for k, v in d.items()}
        ),
        "bad_update",
    ),
    (
        "push NaN",
        "insider",
        lambda s, r: push_frames(r, delta=lambda d: nan_at_first(d, float("nan"))),
        "bad_update",
    ),
    (
        "push inf in bf16",
        "insider",
        lambda s, r: push_frames(r, codec="bf16", delta=lambda d: nan_at_first(d, float("inf"))),
        "bad_update",
    ),
    (
        "push NaN in top-k",
        "insider",
        lambda s, r: push_frames(
            r, payload="topk:fraction=0.5", coded=bend_topk(lambda v: v.fill_(float("nan")))
        ),
        "bad_update",
    ),
    (
        "push top-k index past the end",
        "insider",
        lambda s, r: push_frames(r, payload="topk:fraction=0.5", coded=bend_topk(index=10**9)),
        None,
    ),
    (
        "push top-k index repeated",
        "insider",
        lambda s, r: push_frames(r, payload="topk:fraction=1", coded=bend_topk(index=0)),
        None,
    ),
    (
        "push NaN in int8",
        "insider",
        lambda s, r: push_frames(r, codec="int8", delta=lambda d: nan_at_first(d, float("nan"))),
        "bad_update",
    ),
    (
        "push over --max-mb",
        "insider",
        lambda s, r: [
            bytes(f)
            for f in wire.encode(
                wire.make("push", {"worker": 1}, {f"t{i}": torch.zeros(250_000) for i in range(5)}),
                SECRET,
            )
        ],
        "too_large",
    ),
    (
        "frame over the frame limit",
        "insider",
        lambda s, r: [
            bytes(f)
            for f in wire.encode(
                wire.make("push", {"worker": 1}, {"t": torch.zeros(2 << 20)}), SECRET
            )
        ],
        None,
    ),
]


def expected_reply(reply: wire.Message | None, want: str | None) -> bool:
    if want is None:
        return reply is None
    return (
        reply is not None
        and reply.type in ("error", "rejected")
        and reply.body.get("reason") == want
    )


def test_hostile_network_suite(server: Live) -> None:
    """63 hostile cases, then a good worker: 0 crashes, 0 tracebacks, 0 hangs, 0 accepted."""
    assert len(CASES) >= 50
    strangers = {
        "stranger": None,
        "unknown_key": keys.ClientKeys(server.worker1.server_public, keys.new_keypair()),
        "wrong_server": keys.ClientKeys(keys.new_keypair().public, server.worker1.keypair),
    }
    rnd = dispatch_for_worker1(server)
    good = [bytes(f) for f in wire.encode(wire.make("status"), SECRET)]
    first = server.insider()
    first.send(good)
    assert first.reply(10) is not None
    first.close()
    server.replay = good
    failures = []
    for name, who, build, want in CASES:
        peer = server.insider() if who == "insider" else server.peer(strangers[who])
        try:
            sent = peer.send(build(server, rnd))
            reply = peer.reply(NO_REPLY_S if want is None else 10.0) if sent else None
        finally:
            peer.close()
        if not expected_reply(reply, want):
            failures.append(f"{name}: got {reply and (reply.type, reply.body)}, want {want}")
        s = server.status()  # answers within 10 s: no crash, no hang
        if s["revision"] != 0 or s["counters"]["accepted"] != 0:
            failures.append(f"{name}: something was accepted: {s['counters']}")
        assert server.cluster.server is not None and server.cluster.server.poll() is None, name
    assert not failures, "\n".join(failures)

    counters = server.status()["counters"]
    assert counters["bad_mac"] == 2 and counters["malformed"] >= 20
    assert counters["bad_update"] == 6 and counters["forbidden"] == 2
    assert counters["replay"] == 1 and counters["stale"] == 2 and counters["too_large"] >= 1

    # A good worker is still served: hello, pull, push, ack; the log holds its round only.
    me = keys.load_client(server.cluster.keys_dir / "worker0")
    peer = server.peer(me)
    try:
        ident = {"worker": 0, "incarnation": "good"}
        peer.send([bytes(f) for f in wire.encode(wire.make("hello", ident), SECRET)])
        assert (welcome := peer.reply(10)) is not None and welcome.type == "welcome"
        peer.send([bytes(f) for f in wire.encode(wire.make("pull", ident), SECRET)])
        d = peer.reply(10)
        assert d is not None and d.type == "dispatch"
        body = ident | {
            "round_id": d.body["round_id"],
            "base_revision": d.body["revision"],
            "steps": d.body["steps"],
            "tokens": 128,
        }
        delta = {k: torch.full(e.shape, 1e-3) for k, e in d.tensors.items()}
        coded = ErrorFeedback("topk:fraction=0.01").compress(delta)  # a top-k push counts once
        push = [bytes(f) for f in wire.encode(wire.make("push", body, coded), SECRET)]
        peer.send(push)
        ack = peer.reply(10)
        assert ack is not None and ack.type == "ack" and ack.body["staleness"] == 0
        retry = wire.make("push", body, coded)  # the same round again, as a client retries
        peer.send([bytes(f) for f in wire.encode(retry, SECRET)])
        again = peer.reply(10)
        assert again is not None and again.type == "ack" and again.body["duplicate"]
    finally:
        peer.close()
    s = server.status()
    assert s["revision"] == s["log_length"] == 1 and s["counters"]["accepted"] == 1
    assert server.cluster.kill_server(signal.SIGTERM) == 0
    log = (server.cluster.logs / "server.log").read_text()
    assert "Traceback" not in log, log[-2000:]


def _peak_rss_kib(pid: int) -> int:
    text = Path(f"/proc/{pid}/status").read_text()
    match = re.search(r"VmHWM:\s+(\d+) kB", text)
    assert match is not None
    return int(match.group(1))


def _flood_tcp(port: int, greeting: bytes, total: int) -> int:
    """Send ``greeting`` then up to ``total`` bytes of ZMTP frames; returns bytes accepted."""
    frame = b"\x02" + (1 << 20).to_bytes(8, "big") + b"\0" * (1 << 20)
    sent = 0
    with socket.create_connection(("127.0.0.1", port), timeout=5) as s:
        try:
            s.sendall(greeting)
            while sent < total:
                s.sendall(frame)
                sent += len(frame)
        except (BrokenPipeError, ConnectionResetError, TimeoutError, OSError):
            pass
    return sent


@pytest.mark.skipif(not Path("/proc/self/status").exists(), reason="needs Linux /proc")
def test_a_stranger_cannot_make_the_server_allocate(tmp_path: Path, tiny_net_values: Any) -> None:
    """228 MiB in 120 frames, sent by peers without an allowed key: the server's peak
    memory grows by less than 32 MiB (libzmq never gets past the handshake)."""
    values = tiny_net_values(method="async-nesterov", workers=1, token_budget=10**9)
    save_config(parse_sim_config(values), tmp_path / "run.toml")
    cfg = LaunchConfig(tmp_path / "run.toml", tmp_path / "run", 1, serve_args=["--max-mb", "4"])
    cluster = local_cluster(cfg, SECRET)
    try:
        address = cluster.start_server()
        assert cluster.server is not None
        pid = cluster.server.pid
        port = int(address.rsplit(":", 1)[1])
        status(address, SECRET, 10.0, cluster.client_keys())  # warm: first request's buffers
        before = _peak_rss_kib(pid)
        null_greeting = (
            b"\xff" + b"\0" * 8 + b"\x7f" + b"\x03\x00" + b"NULL".ljust(20, b"\0") + b"\0" * 32
        )
        accepted = _flood_tcp(port, null_greeting, 228 << 20)
        accepted += _flood_tcp(port, b"GET / HTTP/1.1\r\n\r\n", 228 << 20)
        ctx: zmq.Context[Any] = zmq.Context()
        sock = ctx.socket(zmq.DEALER)
        sock.setsockopt(zmq.LINGER, 0)
        sock.setsockopt(zmq.SNDTIMEO, SEND_TIMEOUT_MS)
        stranger = keys.ClientKeys(
            keys.load_client(cluster.keys_dir / "worker0").server_public, keys.new_keypair()
        )
        keys.connect_securely(sock, stranger)
        sock.connect(address)
        chunk = b"\0" * (1_900_000)
        for _ in range(3):
            with contextlib.suppress(zmq.Again):  # no peer while the handshake is refused
                sock.send_multipart([b"h", *[chunk] * 120], copy=False)
        time.sleep(2.0)
        sock.close(linger=0)
        ctx.term()
        s = status(address, SECRET, 10.0, cluster.client_keys())  # still serving
        grew_mib = (_peak_rss_kib(pid) - before) / 1024
        assert grew_mib < 32, f"peak RSS grew by {grew_mib:.0f} MiB (accepted {accepted} B)"
        assert s["counters"]["bad_mac"] == s["counters"]["too_large"] == 0
    finally:
        cluster.stop()


# -- a sharded server: every shard holds the same line ------------------------------------------
def stage_frames(rnd: Round, part: dict[str, torch.Tensor], **body: Any) -> list[bytes]:
    """A ``stage`` of worker 1's round carrying ``part``; ``body`` overrides fields."""
    b = {"worker": 1, "incarnation": "h", "round_id": rnd.round_id} | body
    return [bytes(f) for f in wire.encode(wire.make("stage", b, part), SECRET)]


SHARD_CASES: list[tuple[str, str, Callable[[Live, Round, dict[str, Any]], list[bytes]], str | None]]
SHARD_CASES = [
    ("no keys", "stranger", lambda s, r, p: GOOD_STATUS(s, r), None),
    ("unknown key", "unknown_key", lambda s, r, p: GOOD_STATUS(s, r), None),
    ("no keys, 20 MB", "stranger", lambda s, r, p: [b"h", *[b"\0" * 1_000_000] * 20], None),
    ("wrong secret", "insider", lambda s, r, p: sign([header()], b"wrong-secret-0123456789"), None),
    (
        "header nested 100k",
        "insider",
        lambda s, r, p: sign([b"[" * 100_000 + b"]" * 100_000]),
        None,
    ),
    (
        "status",
        "insider",
        lambda s, r, p: GOOD_STATUS(s, r),
        "wrong_shard",
    ),
    ("push", "insider", lambda s, r, p: push_frames(r), "wrong_shard"),
    (
        "stage without round_id",
        "insider",
        lambda s, r, p: stage_frames(r, p, round_id=None),
        "malformed",
    ),
    (
        "stage round_id 1.0",
        "insider",
        lambda s, r, p: stage_frames(r, p, round_id=1.0),
        "malformed",
    ),
    ("stage extra field", "insider", lambda s, r, p: stage_frames(r, p, evil=1), "malformed"),
    (
        "stage worker 70000",
        "insider",
        lambda s, r, p: stage_frames(r, p, worker=70_000),
        "malformed",
    ),
    ("stage for worker 0", "insider", lambda s, r, p: stage_frames(r, p, worker=0), "forbidden"),
    (
        "stage NaN",
        "insider",
        lambda s, r, p: stage_frames(r, nan_at_first(dict(p), float("nan"))),
        "bad_update",
    ),
    (
        "stage wrong tensors",
        "insider",
        lambda s, r, p: stage_frames(r, {"x": torch.zeros(3)}),
        "bad_update",
    ),
    (
        "stage wrong shape",
        "insider",
        lambda s, r, p: stage_frames(r, {k: torch.zeros(v.numel() + 1) for k, v in p.items()}),
        "bad_update",
    ),
    (
        "fetch with tensors",
        "insider",
        lambda s, r, p: [
            bytes(f)
            for f in wire.encode(
                wire.make("fetch", {"worker": 1, "incarnation": "h", "round_id": 0}, p), SECRET
            )
        ],
        "malformed",
    ),
    (
        "fetch of no dispatch",
        "insider",
        lambda s, r, p: [
            bytes(f)
            for f in wire.encode(
                wire.make("fetch", {"worker": 1, "incarnation": "h", "round_id": 99}), SECRET
            )
        ],
        "superseded",
    ),
]


def test_hostile_cases_against_a_shard(
    tmp_path: Path,
    tiny_net_values: Callable[..., dict[str, Any]],
    capsys: pytest.CaptureFixture[str],
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    """A 2-shard `heloco serve`: strangers, wrong secrets, malformed and forbidden stages and
    requests a shard does not serve, all sent to shard 1, are refused there; nothing is staged
    or applied, and a good worker's round then goes through both shards, as `heloco serve
    --status` then reports per shard."""
    values = tiny_net_values(method="async-nesterov", workers=2, token_budget=10**9, eval_every=0)
    save_config(parse_sim_config(values), tmp_path / "run.toml")
    cfg = LaunchConfig(
        config=tmp_path / "run.toml",
        out_dir=tmp_path / "run",
        workers=2,
        serve_args=["--max-mb", str(MAX_MB), "--heartbeat-s", "1", "--evict-after-s", "60"],
        shards=2,
    )
    cluster = local_cluster(cfg, SECRET)
    cluster.start_server()
    srv = Live(cluster)
    try:
        shard = srv.status()["shards"][1]
        srv.address = shard["address"]
        srv.address = srv.address.replace("0.0.0.0", "127.0.0.1")
        leader = Live(cluster)
        rnd = dispatch_for_worker1(leader)
        for live in (leader, srv):  # the sharded dispatch's tensors: fetched from each shard
            peer = live.insider()
            body = {"worker": 1, "incarnation": "h", "round_id": rnd.round_id}
            peer.send([bytes(f) for f in wire.encode(wire.make("fetch", body), SECRET)])
            part_reply = peer.reply(10)
            peer.close()
            assert part_reply is not None and part_reply.type == "slice", part_reply
            rnd.shapes.update({k: e.shape for k, e in part_reply.tensors.items()})
        insider = leader.insider()
        insider.send([bytes(f) for f in wire.encode(wire.make("hello", {"worker": 1}), SECRET)])
        welcome = insider.reply(10)
        insider.close()
        assert welcome is not None and welcome.type == "welcome"
        names = welcome.body["shards"][1]["tensors"]
        part = {k: torch.full(rnd.shapes[k], 1e-3) for k in names}
        strangers = {
            "stranger": None,
            "unknown_key": keys.ClientKeys(srv.worker1.server_public, keys.new_keypair()),
        }
        failures = []
        for name, who, build, want in SHARD_CASES:
            peer = srv.insider() if who == "insider" else srv.peer(strangers[who])
            try:
                sent = peer.send(build(srv, rnd, part))
                reply = peer.reply(NO_REPLY_S if want is None else 10.0) if sent else None
            finally:
                peer.close()
            if not expected_reply(reply, want):
                failures.append(f"{name}: got {reply and (reply.type, reply.body)}, want {want}")
        assert not failures, "\n".join(failures)
        s = leader.status()
        assert s["revision"] == 0 and s["counters"]["accepted"] == 0
        assert s["shards"][1]["counters"]["staged"] == 0
        assert s["shards"][1]["counters"]["bad_mac"] == 1
        leader.ctx.term()
        link = NetLink(
            ClientConfig(
                cluster.address, timeout_s=10, deadline_s=20, keys=cluster.client_keys("worker0")
            ),
            SECRET,
            0,
        )
        link.join()
        d = link.pull()
        assert d is not None and set(d.params) == set(rnd.shapes)
        delta = {k: torch.full(v.shape, 1e-3) for k, v in d.params.items()}
        outcome = link.push(RoundResult(0, delta, 2, 128, 5.0, d.revision, d.round_id), 0.1)
        link.close()
        assert outcome.accepted and outcome.revision == 1
        monkeypatch.setenv(SECRET_ENV, SECRET.decode())
        ask = ["serve", "--status", cluster.address, "--keys", str(cluster.keys_dir / "server")]
        assert main(ask) == 0
        shown = json.loads(capsys.readouterr().out)
        assert shown["revision"] == 1 and len(shown["shards"]) == 2
        assert sum(s["tensors"] for s in shown["shards"]) == len(rnd.shapes)
        assert all(s["counters"]["staged"] == 1 for s in shown["shards"]), shown["shards"]
    finally:
        cluster.stop()
        srv.ctx.term()
    log = (cluster.logs / "server.log").read_text()
    assert "Traceback" not in log, log[-2000:]
