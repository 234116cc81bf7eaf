"""A user's own DDP loop under torchrun (2 gloo ranks) trains for a server through the API.

The script is what a user writes: init the process group, wrap the model in DDP or shard it
with FSDP2 (``fully_shard``, which gloo supports on CPU), their own AdamW and batches, and
``heloco.OuterLoop`` around the loop. Rank 0 talks to the server and broadcasts each
dispatch (loaded shard by shard under FSDP2); DDP/FSDP keep the ranks one model. The script
gathers the model right before it leaves the island with ``heloco.leave_island()``: the
gathered tensors must not be freed by gloo's worker thread once the interpreter finalises
(that aborts the rank: heloco.handoff).
"""

from __future__ import annotations

import json
import os
import socket
import subprocess
import sys
import textwrap
from collections.abc import Callable
from pathlib import Path
from typing import Any

import pytest

from heloco.net.auth import SECRET_ENV
from heloco.net.endpoint import EndpointConfig
from heloco.net.session import Session
from heloco.sim import parse_sim_config

pytestmark = [pytest.mark.slow, pytest.mark.timeout(180)]

SECRET = b"user-island-test-secret-0123456789"
ROUNDS = 3

USER_SCRIPT = textwrap.dedent(
    """
    import json, sys
    import torch, torch.distributed as dist
    from torch.nn.parallel import DistributedDataParallel as DDP
    import heloco
    from heloco.sim import build_run, parse_sim_config

    address, config, out, wrap = sys.argv[1], sys.argv[2], sys.argv[3], sys.argv[4]
    dist.init_process_group("gloo")
    rank = dist.get_rank()
    cfg = parse_sim_config(json.loads(open(config).read()))
    parts = build_run(cfg)                       # the run's architecture and data
    model = parts.model
    if wrap == "fsdp2":
        from torch.distributed.fsdp import fully_shard

        for block in model.blocks:
            fully_shard(block)
        ddp = fully_shard(model)
    else:
        ddp = DDP(model)
    opt = torch.optim.AdamW(model.parameters(), lr=cfg.inner.lr)
    batches = parts.data.streams[0].sampler(2, 32, seed=100 + rank)
    link = heloco.connect(address, worker=0, timeout_s=20, deadline_s=60)
    steps = 0
    with heloco.OuterLoop(model, opt, link, tokens_per_step=batches.tokens_per_batch) as outer:
        while not outer.done:
            x, y = batches.next()
            logits = ddp(x)
            loss = torch.nn.functional.cross_entropy(logits.reshape(-1, logits.shape[-1]), y.reshape(-1))
            opt.zero_grad()
            loss.backward()
            outer.record_loss(loss)
            opt.step()
            steps += 1
    checksum = 0.0
    for p in model.parameters():
        whole = heloco.full_tensor(p.detach())   # the sharded parameter's whole value
        checksum += float(whole.double().abs().sum())
        if wrap == "fsdp2":  # test only: this rank's shard sits at its rows of the whole
            rows = -(-whole.shape[0] // 2)
            assert torch.equal(whole[rank * rows : rank * rows + p.to_local().shape[0]], p.to_local())
    open(f"{out}-rank{rank}.json", "w").write(json.dumps({"steps": steps, "checksum": checksum,
        "rounds": outer.rounds.rounds}))
    heloco.leave_island()  # last: barrier, gloo's threads done with our tensors, group destroyed
    """
)


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


@pytest.mark.parametrize("wrap", ["ddp", "fsdp2"])
def test_user_loop_under_torchrun(
    tmp_path: Path, tiny_net_values: Callable[..., dict[str, Any]], wrap: str
) -> None:
    round_tokens = 2 * 2 * 2 * 32  # H=2 steps of 2x32 tokens on each of 2 ranks
    values = tiny_net_values(method="async-nesterov", workers=1, token_budget=ROUNDS * round_tokens)
    cfg = parse_sim_config(values)
    session = Session(cfg, SECRET, EndpointConfig(drain_s=2.0), out_dir=tmp_path / "run")
    server, address = session.serve_in_thread()
    (tmp_path / "config.json").write_text(json.dumps(values))
    (tmp_path / "user.py").write_text(USER_SCRIPT)
    env = os.environ | {
        SECRET_ENV: SECRET.decode(),
        "GLOO_SOCKET_IFNAME": "lo",
        "OMP_NUM_THREADS": "1",
    }
    cmd = [
        sys.executable,
        "-m",
        "torch.distributed.run",
        "--nproc-per-node",
        "2",
        "--master-addr",
        "127.0.0.1",
        "--master-port",
        str(free_port()),
        str(tmp_path / "user.py"),
        address,
        str(tmp_path / "config.json"),
        str(tmp_path / "out"),
        wrap,
    ]
    proc = subprocess.run(cmd, env=env, capture_output=True, text=True, timeout=150)
    assert proc.returncode == 0, proc.stderr[-3000:]
    server.join(30)
    assert not server.is_alive()
    rank0 = json.loads((tmp_path / "out-rank0.json").read_text())
    rank1 = json.loads((tmp_path / "out-rank1.json").read_text())
    assert rank0["rounds"] == rank1["rounds"] == ROUNDS
    assert rank0["steps"] == rank1["steps"] == ROUNDS * cfg.inner_steps
    assert rank0["checksum"] == pytest.approx(rank1["checksum"], rel=1e-9)  # DDP: one model
    log = session.side.server.log
    assert len(log) == ROUNDS
    assert all(a.tokens == round_tokens for r in log for a in r.arrivals)  # island tokens
