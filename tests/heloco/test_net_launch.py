"""`heloco launch` ends when training ends, and `heloco keys`.

The launch replays the simulated clock in real time: paces are seconds per inner step, so a
worker's share of the updates follows its pace; the workers are told the run is over and
leave by themselves; a failed worker makes the launch exit 1, naming it.
"""

from __future__ import annotations

import json
import os
import signal
import stat
import threading
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

import pytest
import zmq.auth

from heloco.cli import main
from heloco.cli.launch import EventWatch, local_cluster, report
from heloco.cli.serve import status
from heloco.config import save_config
from heloco.net import keys
from heloco.net.launcher import LaunchConfig, run_to_end
from heloco.sim import PACE_RULE, parse_sim_config

ROUND_TOKENS = 2 * 2 * 32  # inner_steps · batch_size · seq_len of the tiny config


def tiny(path: Path, values: Callable[..., dict[str, Any]], **over: Any) -> Path:
    cfg = values(method="async-nesterov", workers=3, eval_every=0, total_steps=200) | over
    save_config(parse_sim_config(cfg), path)
    return path


@pytest.mark.slow
@pytest.mark.timeout(200)
@pytest.mark.parametrize("shards", [1, 2])
def test_launch_ends_with_the_run_and_shares_follow_the_paces(
    tmp_path: Path,
    tiny_net_values: Callable[..., dict[str, Any]],
    capsys: pytest.CaptureFixture[str],
    shards: int,
) -> None:
    """Paces 0.15/0.3/0.6 s per step (rounds of 0.3/0.6/1.2 s): about 4:2:1 of 28 rounds;
    the same with `--shards 2` (a server of two shards, every worker talking to both)."""
    config = tiny(tmp_path / "run.toml", tiny_net_values, token_budget=28 * ROUND_TOKENS)
    out = tmp_path / "run"
    argv = ["launch", "--config", str(config), "--out", str(out), "--paces", "0.15,0.3,0.6"]
    assert main([*argv, "--shards", str(shards)]) == 0
    server_log = (out / "logs" / "server.log").read_text()
    assert ("(shards)" in server_log) == (shards > 1), server_log[-2000:]
    err = capsys.readouterr().err
    assert "heloco launch: " in err and "did not finish" not in err
    summary = json.loads((out / "summary.json").read_text())
    shares = summary["worker_shares"]
    assert shares[0] > shares[1] > shares[2] > 0, shares
    assert 0.4 < shares[0] < 0.75, shares
    for w in range(3):  # every worker was told the run is over and left by itself
        report_w = json.loads((out / "workers" / f"worker{w}.json").read_text())
        assert report_w["rounds"] >= 1
    events = [json.loads(line) for line in (out / "events.jsonl").read_text().splitlines()]
    left = {e["worker"] for e in events if e.get("event") == "left"}
    assert left == {0, 1, 2}
    assert [e["type"] for e in events].count("start") == 1


@pytest.mark.slow
@pytest.mark.timeout(200)
def test_launch_exits_1_when_a_worker_dies(
    tmp_path: Path,
    tiny_net_values: Callable[..., dict[str, Any]],
    capsys: pytest.CaptureFixture[str],
) -> None:
    config = tiny(tmp_path / "run.toml", tiny_net_values, token_budget=40 * ROUND_TOKENS)
    cfg = LaunchConfig(config, tmp_path / "run", 3, paces=[0.2, 0.2, 0.2], threads=1)
    cluster = local_cluster(cfg)
    cluster.start()

    def kill_worker2_after_its_first_round() -> None:
        ask = cluster.client_keys()
        while status(cluster.address, cluster.secret, 10.0, ask)["workers"][2]["accepted"] < 1:
            time.sleep(0.1)
        cluster.workers[2].send_signal(signal.SIGKILL)

    killer = threading.Thread(target=kill_worker2_after_its_first_round, daemon=True)
    killer.start()
    result = run_to_end(cluster, timeout_s=120)
    killer.join(10)
    assert result.server.ok and result.workers[0].ok and result.workers[1].ok
    assert [p.name for p in result.failures] == ["worker2"]
    assert report(result, cfg.out_dir) == 1
    err = capsys.readouterr().err
    assert "worker2 exited with -9" in err and "worker2.log" in err


@pytest.mark.slow
@pytest.mark.timeout(120)
def test_server_stops_when_every_worker_is_gone(tmp_path: Path, tiny_net_values: Any) -> None:
    config = tiny(tmp_path / "run.toml", tiny_net_values, token_budget=10**9)
    cfg = LaunchConfig(config, tmp_path / "run", 3, work_args=["--device", "bogus"])
    cluster = local_cluster(cfg)
    cluster.start()
    result = run_to_end(cluster, timeout_s=90)
    assert result.server.code == 0  # stopped by the launcher, with its final checkpoint
    assert [p.code for p in result.workers] == [2, 2, 2]


def test_paces_follow_the_simulate_rule(capsys: pytest.CaptureFixture[str], tmp_path: Path) -> None:
    errors = []
    for command in (["simulate"], ["launch", "--out", str(tmp_path / "x")]):
        assert main([*command, "--paces", "1,0"]) == 2
        errors.append(capsys.readouterr().err.strip())
    assert errors[0] == errors[1] and PACE_RULE in errors[0]


def test_event_watch_reads_only_whole_lines(tmp_path: Path, tiny_net_values: Any) -> None:
    cfg = parse_sim_config(tiny_net_values(method="async-nesterov", workers=2, token_budget=999))
    path = tmp_path / "events.jsonl"
    watch = EventWatch(path, cfg)
    watch.poll()  # no file yet
    path.write_text(
        '{"type": "round", "worker": 1}\n{"type": "update", "revision": 1, "tokens": 128}\n'
        '{"type": "eval", "loss": 4.5'
    )
    watch.poll()
    assert (watch.tokens, watch.updates, watch.rounds, watch.loss) == (128, 1, [0, 1], None)
    with path.open("a") as f:
        f.write(', "tokens": 128}\nnot json\n{"type": "round", "worker": 99}\n')
    watch.poll()
    assert watch.loss == 4.5 and watch.rounds == [0, 1]


def test_keys_layout_modes_and_growth(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    out = tmp_path / "keys"
    assert main(["keys", "--out", str(out), "--workers", "2"]) == 0
    server = keys.load_server(out / "server")
    assert sorted(server.allowed.values()) == ["server", "worker0", "worker1"]
    w1 = keys.load_client(out / "worker1")
    assert w1.server_public == server.keypair.public
    assert server.allowed[w1.keypair.public] == "worker1"
    assert not (out / "worker1" / "worker1.key").exists()  # its public half is on the server
    for secret_file in [*out.rglob("*.key_secret"), *out.rglob("hmac.secret")]:
        assert stat.S_IMODE(secret_file.stat().st_mode) == 0o600, secret_file
    secret = (out / "server" / "hmac.secret").read_text()
    assert (out / "worker0" / "hmac.secret").read_text() == secret
    # ZeroMQ's own tools read the files
    assert zmq.auth.load_certificate(out / "worker1" / "worker1.key_secret")[1] is not None
    # growing keeps every existing key and the secret
    assert main(["keys", "--out", str(out), "--workers", "3"]) == 0
    grown = keys.load_server(out / "server")
    assert grown.keypair == server.keypair and len(grown.allowed) == 4
    assert keys.load_client(out / "worker1") == w1
    assert (out / "worker2" / "hmac.secret").read_text() == secret
    assert "kept" in capsys.readouterr().out


def test_bad_key_folders_are_one_line_errors(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, cli_error: Callable[..., str]
) -> None:
    keys.generate(tmp_path / "keys", 1)
    (tmp_path / "keys" / "worker0" / "worker0.key_secret").write_text("garbage")
    work = ["work", "--connect", "tcp://127.0.0.1:9", "--worker", "0"]
    cases = [
        ["keys", "--out", str(tmp_path / "k2"), "--workers", "0"],
        [*work, "--keys", str(tmp_path / "missing")],
        [*work, "--keys", str(tmp_path / "keys" / "worker0")],
        ["serve", "--preset", "default", "--keys", str(tmp_path / "keys" / "worker0")],
    ]
    for argv in cases:
        assert cli_error(main, argv).startswith("heloco: error:")


def test_a_shared_secret_file_is_warned_about(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    keys.generate(tmp_path, 1)
    os.chmod(tmp_path / "worker0" / "worker0.key_secret", 0o644)
    keys.load_client(tmp_path / "worker0")
    assert "readable by other users" in capsys.readouterr().err
