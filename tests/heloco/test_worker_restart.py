"""A `heloco work` process killed mid-run and started again neither replays nor skips data.

The worker streams its shards (``sampling = "stream"``) and keeps its state in ``--state``.
After a SIGKILL, the new process asks the server how many of its slot's steps were accepted
and continues from the data position saved at exactly that count: its final position is the
one an uninterrupted reader reaches after the run's accepted steps.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

import pytest
import torch

from heloco.net import keys
from heloco.net.auth import SECRET_ENV
from heloco.net.endpoint import EndpointConfig
from heloco.net.session import Session
from heloco.sim import build_run, parse_sim_config
from heloco.worker_state import load_states

pytestmark = [pytest.mark.slow, pytest.mark.timeout(180)]

SECRET = b"restart-test-secret-0123456789abcd"
ROUND_TOKENS = 2 * 2 * 32


@pytest.mark.parametrize("exchange", ["blocking", "overlapped", "streaming"])
def test_killed_worker_continues_its_data_exactly(
    tmp_path: Path, tiny_net_values: Callable[..., dict[str, Any]], exchange: str
) -> None:
    """Overlapped, the kill comes while a push and the next pull may be in flight: the
    restarted worker resumes from the state of whichever the server accepted. Streaming
    (2 fragments: sub-rounds of 1 step), the new process starts from a full dispatch and
    every fragment push after it is accepted."""
    corpus = tmp_path / "corpus"
    corpus.mkdir()
    for lang in ("en", "de"):
        lines = [
            json.dumps({"text": f"{lang} record {i:05d} " + "y" * (i % 11)}) for i in range(3000)
        ]
        (corpus / f"{lang}.jsonl").write_text("\n".join(lines) + "\n")
    values = tiny_net_values(method="async-nesterov", workers=1, token_budget=12 * ROUND_TOKENS)
    values["exchange"] = exchange
    values["data"] = {
        "data_dir": str(corpus),
        "sampling": "stream",
        "assignment": "iid",
        "seq_len": 32,
        "val_chars_per_language": 1000,
    }
    cfg = parse_sim_config(values)
    keys.generate(tmp_path / "keys", 1, SECRET)
    endpoint = EndpointConfig(
        checkpoint_dir=tmp_path / "ck",
        drain_s=2.0,
        keys=keys.load_server(tmp_path / "keys" / "server"),
    )
    session = Session(cfg, SECRET, endpoint, out_dir=tmp_path / "run")
    server, address = session.serve_in_thread()
    state = tmp_path / "state.safetensors"
    cmd = [sys.executable, "-m", "heloco", "work", "--connect", address, "--worker", "0"]
    cmd += ["--state", str(state), "--timeout-s", "20", "--deadline-s", "60"]
    cmd += ["--keys", str(tmp_path / "keys" / "worker0")]
    env = os.environ | {SECRET_ENV: SECRET.decode(), "OMP_NUM_THREADS": "1"}
    first = subprocess.Popen([*cmd, "--pace", "0.25"], env=env, stderr=subprocess.PIPE)
    deadline = time.monotonic() + 90
    while session.side.server.revision < 3 and time.monotonic() < deadline:
        time.sleep(0.05)
    time.sleep(0.3)  # into the next round
    first.kill()
    first.wait(10)
    killed_at = session.side.server.revision
    assert 3 <= killed_at < 12, (first.stderr.read() if first.stderr else b"")[-2000:]
    second = subprocess.run(cmd, env=env, capture_output=True, text=True, timeout=120)
    assert second.returncode == 0, second.stderr[-3000:]
    server.join(30)
    assert not server.is_alive()
    accepted = sum(a.steps for r in session.side.server.log for a in r.arrivals)
    assert accepted == 12 * cfg.inner_steps
    if exchange == "streaming":
        pushed = [(a.round_id, a.fragment) for r in session.side.server.log for a in r.arrivals]
        assert len(pushed) == len(set(pushed)) == 24  # one step each, none applied twice
        assert all(f == (rid + 1) % 2 for rid, f in pushed)
        assert session.coord.counters.rejected == 0, session.coord.counters
    saved = load_states(state)[accepted]  # the state after the last accepted round
    reference = build_run(cfg).worker(0).sampler
    for _ in range(accepted):
        reference.next()
    want = reference.state_dict()
    assert saved["meta"]["data"] == json.loads(json.dumps(want["meta"]))
    assert torch.equal(saved["tensors"]["data.rng"], want["tensors"]["rng"])
