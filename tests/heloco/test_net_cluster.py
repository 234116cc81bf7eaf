"""Real multi-process runs on 127.0.0.1: workers killed and replaced, the server killed and
restarted, and an adversarial client (replays, duplicates, wrong secret, NaN, oversized).

Every test ends by checking the server's state: revision = updates in the revision log,
accepted rounds = rounds in the log + rounds still buffered, no round applied twice, and every
push a worker saw acknowledged is in the log exactly once.
"""

from __future__ import annotations

import contextlib
import json
import signal
import socket
import threading
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

import pytest
import torch

from heloco.cli import main
from heloco.cli.launch import local_cluster
from heloco.cli.serve import status
from heloco.config import save_config
from heloco.net import checkpoint, wire
from heloco.net.auth import SECRET_ENV
from heloco.net.client import Client, ClientConfig, ServerUnreachable
from heloco.net.launcher import LaunchConfig, LocalCluster
from heloco.sim import parse_sim_config

pytestmark = [pytest.mark.slow, pytest.mark.timeout(150)]

SECRET = b"cluster-test-secret-0123456789abcdef"
ROUND_TOKENS = 2 * 2 * 32  # inner_steps · batch_size · seq_len


def pushes_per_round(exchange: str) -> int:
    """Outer updates per round of H steps: one, or streaming's P = 2 fragment pushes (the
    config's default `fragments`), each of H/P steps."""
    return 2 if exchange == "streaming" else 1


@pytest.fixture
def tiny_config(tiny_net_values: Callable[..., dict[str, Any]]) -> Callable[..., Path]:
    """Writer of a 3-worker async-nesterov run config (12 rounds, no evals); keywords override."""

    def make(path: Path, **over: Any) -> Path:
        values = tiny_net_values(
            method="async-nesterov",
            workers=3,
            token_budget=12 * ROUND_TOKENS,
            eval_every=0,
            total_steps=200,
        )
        values.update(over)
        save_config(parse_sim_config(values), path)
        return path

    return make


def wait_until(pred: Callable[[], bool], timeout_s: float, what: str) -> None:
    deadline = time.monotonic() + timeout_s
    while not pred():
        if time.monotonic() > deadline:
            raise AssertionError(f"timed out after {timeout_s} s waiting for {what}")
        time.sleep(0.1)


def server_status(cluster: LocalCluster) -> dict[str, Any]:
    return status(cluster.address, cluster.secret, 5.0, cluster.client_keys())


def final_state(out: Path) -> dict[str, Any]:
    path = checkpoint.latest(out / "checkpoints")
    assert path is not None, "no checkpoint written"
    return checkpoint.load(path).state


def assert_consistent(out: Path, workers: int, exchange: str = "blocking") -> dict[str, Any]:
    """Revision log vs. counters vs. what workers saw acknowledged; streaming, every applied
    push carried one fragment and both fragments were stepped."""
    state = final_state(out)
    server, coord = state["server"], state["coordinator"]
    log = server["log"]
    fragments = {a.get("fragment") for r in log for a in r["arrivals"]}
    assert fragments == ({0, 1} if exchange == "streaming" else {None}), fragments
    assert server["revision"] == len(log)
    rounds = [(a["worker"], a["round_id"]) for r in log for a in r["arrivals"]]
    assert len(rounds) == len(set(rounds)), "a round was applied twice"
    assert coord["counters"]["accepted"] == len(rounds) + len(server["pending"])
    for w in range(workers):
        report = out / "workers" / f"worker{w}.json"
        assert report.is_file(), f"worker {w} wrote no report"
        for round_id, _ in json.loads(report.read_text())["acked"]:
            assert rounds.count((w, round_id)) == 1, (
                f"acked round {round_id} of worker {w} not applied once"
            )
    summary = json.loads((out / "summary.json").read_text())
    assert summary["updates"] == server["revision"]
    return state


def start(
    tmp_path: Path,
    config: Path,
    workers: int,
    *,
    sps: float,
    serve: list[str],
    work: list[str] | None = None,
    shards: int = 1,
) -> LocalCluster:
    cfg = LaunchConfig(
        config=config,
        out_dir=tmp_path / "run",
        workers=workers,
        paces=[sps] * workers,
        serve_args=["--heartbeat-s", "0.3", "--evict-after-s", "3", *serve],
        work_args=["--timeout-s", "2", "--deadline-s", "60", *(work or [])],
        threads=1,
        shards=shards,
    )
    cluster = local_cluster(cfg, SECRET)
    cluster.start()
    return cluster


@pytest.mark.parametrize("shards", [1, 2])
def test_sync_run_survives_worker_sigkill_and_replacement(
    tmp_path: Path, tiny_config: Callable[..., Path], shards: int
) -> None:
    """3 workers, sync barrier: worker 1 is SIGKILLed mid-round and evicted, the barrier
    shrinks to the two live workers and goes on; the replacement rejoins; run completes."""
    budget_rounds = 3 * 6
    config = tiny_config(
        tmp_path / "run.toml", method="sync", token_budget=budget_rounds * ROUND_TOKENS
    )
    cluster = start(tmp_path, config, 3, sps=0.25, serve=[], shards=shards)
    try:
        wait_until(lambda: server_status(cluster)["revision"] >= 2, 60, "two sync updates")
        cluster.kill_worker(1)  # rounds are ~0.5 s of sleep/compute: killed mid-round
        wait_until(lambda: not server_status(cluster)["workers"][1]["active"], 10, "eviction")
        evicted_at = server_status(cluster)
        assert evicted_at["counters"]["evictions"] >= 1
        wait_until(
            lambda: server_status(cluster)["revision"] > evicted_at["revision"] + 1,
            10,
            "updates without the evicted worker",
        )
        cluster.start_worker(1)
        assert cluster.wait(90) == 0
    finally:
        cluster.stop()
    out = tmp_path / "run"
    state = assert_consistent(out, 3)
    counters = state["coordinator"]["counters"]
    assert counters["evictions"] >= 1 and counters["rejoins"] >= 1
    barriers = [sorted(a["worker"] for a in r["arrivals"]) for r in state["server"]["log"]]
    assert barriers[:2] == [[0, 1, 2], [0, 1, 2]]
    assert [0, 2] in barriers and all(b in ([0, 1, 2], [0, 2]) for b in barriers)
    assert sum(map(len, barriers)) >= budget_rounds
    events = [json.loads(line) for line in (out / "events.jsonl").read_text().splitlines()]
    assert {"evicted", "replaced"} <= {e["event"] for e in events if e["type"] == "worker"}


@pytest.mark.parametrize(
    ("shards", "exchange"),
    [(1, "blocking"), (2, "blocking"), (1, "overlapped"), (1, "streaming")],
)
def test_async_run_survives_server_sigkill_and_restart(
    tmp_path: Path, tiny_config: Callable[..., Path], shards: int, exchange: str
) -> None:
    """3 async workers; the server is SIGKILLed and restarted from its (durable) checkpoint."""
    config = tiny_config(tmp_path / "run.toml", token_budget=24 * ROUND_TOKENS, exchange=exchange)
    cluster = start(tmp_path, config, 3, sps=0.1, serve=["--durable"], shards=shards)
    try:
        wait_until(lambda: server_status(cluster)["revision"] >= 4, 60, "four updates")
        cluster.kill_server(signal.SIGKILL)
        killed_at = final_state(tmp_path / "run")["server"]["revision"]
        assert killed_at >= 4
        cluster.start_server()
        assert cluster.wait(90) == 0
    finally:
        cluster.stop()
    out = tmp_path / "run"
    state = assert_consistent(out, 3, exchange)
    # Durable acks: nothing acknowledged was lost, so exactly the budget's 24 rounds were applied
    # (48 pushes of one fragment each, streaming).
    assert state["server"]["revision"] == 24 * pushes_per_round(exchange)
    assert state["coordinator"]["tokens"] == 24 * ROUND_TOKENS
    events = [json.loads(line) for line in (out / "events.jsonl").read_text().splitlines()]
    restarts = [e for e in events if e["type"] == "restart"]
    assert len(restarts) == 1 and restarts[0]["revision"] >= killed_at


def test_adversarial_client(
    tmp_path: Path,
    monkeypatch: pytest.MonkeyPatch,
    capsys: pytest.CaptureFixture[str],
    tiny_config: Callable[..., Path],
) -> None:
    """Replays, duplicates, a wrong secret, NaN and oversized messages against `heloco serve`."""
    config = tiny_config(tmp_path / "run.toml", workers=2, token_budget=10**9)
    cfg = LaunchConfig(
        config=config, out_dir=tmp_path / "run", workers=2, serve_args=["--max-mb", "1"]
    )
    cluster = local_cluster(cfg, SECRET)
    try:
        address = cluster.start_server()
        me = {"worker": 0, "incarnation": "test"}
        keys0 = cluster.client_keys("worker0")
        client = Client(
            ClientConfig(address, timeout_s=5, deadline_s=10, max_bytes=1 << 20, keys=keys0),
            SECRET,
        )
        assert client.request("hello", me).type == "welcome"
        d = client.request("pull", me)
        assert d.type == "dispatch"
        params = d.params()

        def push_msg(
            d: wire.Message, delta: dict[str, torch.Tensor], codec: str = "int8"
        ) -> wire.Message:
            body = me | {
                "round_id": d.body["round_id"],
                "base_revision": d.body["revision"],
                "steps": 2,
                "tokens": ROUND_TOKENS,
                "mean_loss": 5.0,
                "compute_s": 0.1,
            }
            return wire.make("push", body, delta, codec=codec)  # type: ignore[arg-type]

        small = {k: torch.randn_like(v) * 1e-3 for k, v in params.items()}
        msg = push_msg(d, small)
        frames = wire.encode(msg, SECRET)
        client.send_frames(list(frames))
        first = client.receive(msg.id, 5)
        assert first is not None and first.type == "ack" and first.body["revision"] == 1

        client.send_frames(list(frames))  # byte-for-byte replay: dropped, counted, not applied
        assert client.receive(msg.id, 0.5) is None
        dup = client.call(push_msg(d, small))  # same round, fresh message (a retry): acked once
        assert dup.type == "ack" and dup.body["duplicate"] and dup.body["revision"] == 1

        intruder = Client(  # an allowed key but the wrong HMAC secret: dropped, counted
            ClientConfig(address, timeout_s=0.5, deadline_s=0.8, keys=keys0),
            b"not-the-secret-0123456789",
        )
        with pytest.raises(ServerUnreachable):
            intruder.request("status")
        intruder.close()
        stranger = Client(  # the secret but no CURVE key: refused in the handshake
            ClientConfig(address, timeout_s=0.5, deadline_s=0.8), SECRET
        )
        with pytest.raises(ServerUnreachable):
            stranger.request("status")
        stranger.close()

        d2 = client.request("pull", me)
        nan = {k: v.clone() for k, v in small.items()}
        next(iter(nan.values())).view(-1)[0] = float("nan")
        for codec in ("fp32", "bf16", "int8"):
            bad = client.call(push_msg(d2, nan, codec))
            assert bad.type == "error" and bad.body["reason"] == "bad_update"
        shapes = {k: torch.zeros(v.numel() + 1) for k, v in small.items()}
        assert client.call(push_msg(d2, shapes)).body["reason"] == "bad_update"

        huge = {f"t{i}": torch.zeros(100_000) for i in range(4)}  # 4 frames of 400 kB > 1 MiB
        too_big = client.call(wire.make("push", me, huge))
        assert too_big.type == "error" and too_big.body["reason"] == "too_large"
        one_frame = wire.make("push", me, {"t": torch.zeros(400_000)})  # > MAXMSGSIZE: cut off
        client.send(one_frame)
        assert client.receive(one_frame.id, 0.5) is None
        client.close()

        ok = Client(ClientConfig(address, timeout_s=5, deadline_s=10, keys=keys0), SECRET)
        assert ok.call(push_msg(d2, small, "bf16")).body["revision"] == 2
        s = status(address, SECRET, 5, cluster.client_keys())
        ok.close()
        c = s["counters"]
        assert s["revision"] == s["log_length"] == 2 and c["accepted"] == 2
        assert c["replay"] == 1 and c["duplicate"] == 1 and c["bad_mac"] >= 1
        assert c["bad_update"] == 4 and c["too_large"] == 1
        monkeypatch.setenv(SECRET_ENV, SECRET.decode())
        server_keys = str(cluster.keys_dir / "server")
        assert main(["serve", "--status", address, "--keys", server_keys]) == 0  # the CLI's
        assert json.loads(capsys.readouterr().out)["revision"] == 2
        cluster.kill_server(signal.SIGTERM)  # clean shutdown writes a final checkpoint
    finally:
        cluster.stop()
    state = final_state(tmp_path / "run")
    assert state["server"]["revision"] == 2 and state["coordinator"]["counters"]["accepted"] == 2


# -- faults: a frozen worker, a network partition, a server frozen and killed mid-push ---------
def events_of(out: Path) -> list[dict[str, Any]]:
    return [json.loads(line) for line in (out / "events.jsonl").read_text().splitlines()]


def worker_events(out: Path, w: int) -> list[str]:
    return [e["event"] for e in events_of(out) if e["type"] == "worker" and e["worker"] == w]


def accepted_of(cluster: LocalCluster, w: int) -> int:
    return int(server_status(cluster)["workers"][w]["accepted"])


@pytest.mark.parametrize(
    ("shards", "exchange"),
    [(1, "blocking"), (2, "blocking"), (1, "overlapped"), (1, "streaming")],
)
def test_frozen_worker_rejoins_without_double_application(
    tmp_path: Path, tiny_config: Callable[..., Path], shards: int, exchange: str
) -> None:
    """Worker 1 is frozen (SIGSTOP) mid-run until the server evicts it, then thawed
    (SIGCONT): it rejoins, its round in flight is applied once, and the run completes.
    Overlapped or streaming, its push and pull were in flight when it froze."""
    config = tiny_config(tmp_path / "run.toml", token_budget=60 * ROUND_TOKENS, exchange=exchange)
    cluster = start(tmp_path, config, 3, sps=0.25, serve=["--evict-after-s", "2"], shards=shards)
    try:
        wait_until(lambda: accepted_of(cluster, 1) >= 1, 60, "a round of worker 1")
        cluster.workers[1].send_signal(signal.SIGSTOP)
        frozen_at = accepted_of(cluster, 1)
        wait_until(lambda: not server_status(cluster)["workers"][1]["active"], 20, "eviction")
        revision = server_status(cluster)["revision"]
        wait_until(lambda: server_status(cluster)["revision"] >= revision + 2, 30, "progress")
        cluster.workers[1].send_signal(signal.SIGCONT)
        wait_until(lambda: accepted_of(cluster, 1) > frozen_at, 30, "worker 1 back")
        assert cluster.wait(120) == 0
    finally:
        cluster.stop()
    out = tmp_path / "run"
    assert_consistent(out, 3, exchange)
    assert {"evicted", "rejoined"} <= set(worker_events(out, 1))


class Proxy:
    """A TCP proxy in front of the server. :meth:`partition` cuts every connection and holds
    new ones open without forwarding a byte (a black hole); :meth:`heal` forwards again.

    It listens on ``host`` at the target's own port (another loopback address, so that a
    sharded server's shard ports, which the worker learns from ``welcome``, lead to proxies
    on the same host too)."""

    def __init__(self, target: str, host: str = "127.0.0.2") -> None:
        addr, port = target.removeprefix("tcp://").rsplit(":", 1)
        self.target = (addr, int(port))
        self.listener = socket.create_server((host, int(port)))
        self.listener.settimeout(0.2)
        self.address = f"tcp://{host}:{port}"
        self.cut = threading.Event()
        self.closed = threading.Event()
        self.open: list[socket.socket] = []
        self.lock = threading.Lock()
        threading.Thread(target=self._accept, daemon=True).start()

    def _accept(self) -> None:
        while not self.closed.is_set():
            try:
                client, _ = self.listener.accept()
            except TimeoutError:
                continue
            except OSError:  # closed
                return
            with self.lock:
                self.open.append(client)
            if self.cut.is_set():
                continue  # held open, nothing forwarded: a black hole
            try:
                upstream = socket.create_connection(self.target, timeout=5)
            except OSError:
                client.close()
                continue
            with self.lock:
                self.open.append(upstream)
            for a, b in ((client, upstream), (upstream, client)):
                threading.Thread(target=self._pump, args=(a, b), daemon=True).start()

    def _pump(self, src: socket.socket, dst: socket.socket) -> None:
        try:
            while (data := src.recv(1 << 16)) and not self.cut.is_set():
                dst.sendall(data)
        except OSError:
            pass
        finally:
            for s in (src, dst):
                with contextlib.suppress(OSError):
                    s.shutdown(socket.SHUT_RDWR)

    def _drop_all(self) -> None:
        with self.lock:
            conns, self.open = self.open, []
        for s in conns:
            with contextlib.suppress(OSError):
                s.shutdown(socket.SHUT_RDWR)
            s.close()

    def partition(self) -> None:
        self.cut.set()
        self._drop_all()

    def heal(self) -> None:
        self._drop_all()  # the black-holed connections; clients reconnect
        self.cut.clear()

    def close(self) -> None:
        self.closed.set()
        self._drop_all()
        self.listener.close()


@pytest.mark.parametrize(
    ("shards", "exchange"),
    [(1, "blocking"), (2, "blocking"), (1, "overlapped"), (1, "streaming")],
)
def test_network_partition_through_a_proxy(
    tmp_path: Path, tiny_config: Callable[..., Path], shards: int, exchange: str
) -> None:
    """Worker 0 reaches the server through a TCP proxy per shard that partitions it away long
    enough to be evicted, then heals: worker 0 reconnects by itself, rejoins, and every round
    it had acknowledged is applied exactly once."""
    config = tiny_config(tmp_path / "run.toml", token_budget=60 * ROUND_TOKENS, exchange=exchange)
    cfg = LaunchConfig(
        config=config,
        out_dir=tmp_path / "run",
        workers=3,
        paces=[0.25] * 3,
        serve_args=["--heartbeat-s", "0.3", "--evict-after-s", "2"],
        work_args=["--timeout-s", "1", "--deadline-s", "60"],
        threads=1,
        shards=shards,
    )
    cluster = local_cluster(cfg, SECRET)
    proxies: list[Proxy] = []
    try:
        cluster.start_server()
        shard_addresses = [s["address"] for s in server_status(cluster).get("shards", [])]
        proxies = [Proxy(a) for a in shard_addresses or [cluster.address]]
        cluster.start_worker(0, proxies[0].address)
        for w in (1, 2):
            cluster.start_worker(w)
        wait_until(lambda: accepted_of(cluster, 0) >= 1, 60, "a round of worker 0")
        for proxy in proxies:
            proxy.partition()
        cut_at = accepted_of(cluster, 0)
        wait_until(lambda: not server_status(cluster)["workers"][0]["active"], 20, "eviction")
        revision = server_status(cluster)["revision"]
        wait_until(lambda: server_status(cluster)["revision"] >= revision + 2, 30, "progress")
        assert accepted_of(cluster, 0) == cut_at  # nothing got through the partition
        for proxy in proxies:
            proxy.heal()
        wait_until(lambda: accepted_of(cluster, 0) > cut_at, 30, "worker 0 back")
        assert cluster.wait(120) == 0
    finally:
        cluster.stop()
        for proxy in proxies:
            proxy.close()
    out = tmp_path / "run"
    assert_consistent(out, 3, exchange)
    assert {"evicted", "rejoined"} <= set(worker_events(out, 0))


@pytest.mark.parametrize(
    ("shards", "exchange"),
    [(1, "blocking"), (2, "blocking"), (1, "overlapped"), (1, "streaming")],
)
def test_server_frozen_and_killed_while_workers_push(
    tmp_path: Path, tiny_config: Callable[..., Path], shards: int, exchange: str
) -> None:
    """The server is frozen (SIGSTOP) until every worker has finished its round and is
    waiting on its push, then SIGKILLed and restarted from its durable checkpoint: the pushes
    in flight are retried to the new server and applied once; nothing acknowledged is lost.
    With 2 shards a worker may be between staging its parts and pushing: the restarted server
    has lost the parts, answers ``unstaged``, and the worker stages again."""
    budget = 24
    config = tiny_config(
        tmp_path / "run.toml", token_budget=budget * ROUND_TOKENS, exchange=exchange
    )
    cluster = start(tmp_path, config, 3, sps=0.1, serve=["--durable"], shards=shards)
    try:
        wait_until(lambda: server_status(cluster)["revision"] >= 4, 60, "four updates")
        assert cluster.server is not None
        cluster.server.send_signal(signal.SIGSTOP)
        time.sleep(2.0)  # rounds take 0.2 s: every worker is now waiting on a push
        cluster.kill_server(signal.SIGKILL)
        cluster.start_server()
        assert cluster.wait(120) == 0
    finally:
        cluster.stop()
    out = tmp_path / "run"
    state = assert_consistent(out, 3, exchange)
    # durable acks: none lost, none doubled
    assert state["server"]["revision"] == budget * pushes_per_round(exchange)
    reports = [json.loads((out / "workers" / f"worker{w}.json").read_text()) for w in range(3)]
    assert sum(r["retries"] for r in reports) >= 1  # some push really was in flight
