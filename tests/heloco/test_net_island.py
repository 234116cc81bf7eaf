"""An island of 2 ranks under torchrun (gloo, CPU) trains for a networked server.

Rank 0 talks to the server and broadcasts each dispatch; gradients are all-reduced every inner
step, so both ranks stay identical and compute the same pseudo-gradient.
"""

from __future__ import annotations

import json
import os
import socket
import subprocess
import sys
from collections.abc import Callable
from pathlib import Path
from typing import Any

import pytest

from heloco.net import keys
from heloco.net.auth import SECRET_ENV
from heloco.net.endpoint import EndpointConfig
from heloco.net.session import Session
from heloco.sim import parse_sim_config

pytestmark = [pytest.mark.slow, pytest.mark.timeout(150)]

SECRET = b"island-test-secret-0123456789abcdef"
ROUND_TOKENS = 2 * 2 * 32


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


def test_torchrun_island_with_two_gloo_ranks(
    tmp_path: Path, tiny_net_values: Callable[..., dict[str, Any]]
) -> None:
    cfg = parse_sim_config(
        tiny_net_values(
            method="async-nesterov",
            workers=1,
            token_budget=4 * 2 * ROUND_TOKENS,  # 4 rounds of an island of 2 ranks
        )
    )
    keys.generate(tmp_path / "keys", 1, SECRET)
    session = Session(
        cfg,
        SECRET,
        EndpointConfig(
            checkpoint_dir=tmp_path / "ck",
            drain_s=2.0,
            keys=keys.load_server(tmp_path / "keys" / "server"),
        ),
        out_dir=tmp_path / "run",
    )
    server, address = session.serve_in_thread()
    report = tmp_path / "island.json"
    env = os.environ | {
        SECRET_ENV: "",
        "GLOO_SOCKET_IFNAME": "lo",
        "OMP_NUM_THREADS": "1",
    }
    cmd = [
        sys.executable,
        "-m",
        "torch.distributed.run",
        "--nproc-per-node",
        "2",
        "--nnodes",
        "1",
        "--master-addr",
        "127.0.0.1",
        "--master-port",
        str(free_port()),
        "-m",
        "heloco",
        "work",
        "--connect",
        address,
        "--worker",
        "0",
        "--keys",
        str(tmp_path / "keys" / "worker0"),
        "--timeout-s",
        "20",
        "--deadline-s",
        "60",
        "--report",
        str(report),
    ]
    proc = subprocess.run(cmd, env=env, capture_output=True, text=True, timeout=120)
    assert proc.returncode == 0, proc.stderr[-3000:]
    server.join(30)
    assert not server.is_alive()
    rank0 = json.loads((tmp_path / "island-rank0.json").read_text())
    rank1 = json.loads((tmp_path / "island-rank1.json").read_text())
    assert rank0["world"] == rank1["world"] == 2
    assert rank0["rounds"] == rank1["rounds"] == 4 and len(rank0["acked"]) == 4
    assert rank1["acked"] == [] and rank1["sent_bytes"] == 0  # only rank 0 talks to the server
    # DDP semantics: identical replicas, identical pseudo-gradients on both ranks.
    assert rank0["delta_checksums"] == pytest.approx(rank1["delta_checksums"], rel=1e-6)
    server_state = session.side.server
    assert server_state.revision == 4 == len(server_state.log)
    assert all(a.tokens == 2 * ROUND_TOKENS for r in server_state.log for a in r.arrivals)
