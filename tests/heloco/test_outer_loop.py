"""The library API around a user's own loop: Rounds (the boundary) and OuterLoop (the driver).

A hand-written loop (the user's AdamW, the optimizer.step hook) must give exactly what the
reference loop gives for the same run config and seed: in process (LocalLink) and over the
network, against `heloco work`'s own NetWorker.
"""

from __future__ import annotations

import json
import threading
from collections.abc import Callable
from pathlib import Path
from typing import Any

import pytest
import torch
from torch import nn

from heloco.data.seeding import derive_seed
from heloco.island import Island
from heloco.metrics import EVENTS_FILE
from heloco.net import keys
from heloco.net.client import ClientConfig
from heloco.net.endpoint import EndpointConfig
from heloco.net.link import connect
from heloco.net.session import Session
from heloco.net.worker_loop import NetWorker, WorkerOptions
from heloco.outer_loop import LocalLink, OuterLoop
from heloco.rounds import Rounds
from heloco.sim import RunParts, SimConfig, build_run, parse_sim_config
from heloco.types import Dispatch, Params, tensor_bytes
from heloco.worker import SAMPLER_KEY, cosine_lr
from shardmeter.errors import UserInputError

pytestmark = pytest.mark.usefixtures("one_thread")

SECRET = b"outer-loop-test-secret-0123456789"


def params_of(model: nn.Module) -> Params:
    return {n: p.detach().clone() for n, p in model.named_parameters()}


def test_rounds_boundary_with_a_user_optimizer() -> None:
    model = nn.Linear(3, 2)
    opt = torch.optim.SGD(model.parameters(), lr=0.1, momentum=0.9)
    rounds = Rounds(4, model, opt, reset_optimizer=False)
    start = {n: torch.ones_like(p) for n, p in model.named_parameters()}
    rounds.begin(Dispatch(start, 7, 2, 3, 4))
    assert all(torch.equal(p, torch.ones_like(p)) for p in model.parameters())
    losses = []
    for _ in range(2):
        loss = model(torch.ones(1, 3)).sum()
        opt.zero_grad()
        loss.backward()
        opt.step()
        done = rounds.record_step(5, loss)
        losses.append(float(loss.detach()))
    assert done and rounds.finished
    result = rounds.end()
    assert (result.worker, result.steps, result.tokens, result.base_revision, result.round_id) == (
        4,
        2,
        10,
        7,
        3,
    )
    for name, p in model.named_parameters():
        assert torch.equal(result.delta[name], start[name] - p.detach())
    assert result.mean_loss == pytest.approx(sum(losses) / 2)
    # momentum is kept across rounds, and travels in the state dict by parameter name
    state = rounds.state_dict()
    assert state["meta"]["has_optimizer"] and "optimizer.weight.momentum_buffer" in state["tensors"]
    other = nn.Linear(3, 2)
    opt2 = torch.optim.SGD(other.parameters(), lr=0.1, momentum=0.9)
    again = Rounds(4, other, opt2, reset_optimizer=False)
    again.load_state_dict(state)
    assert again.step == 2 and again.rounds == 1
    assert torch.equal(
        opt2.state[other.weight]["momentum_buffer"], opt.state[model.weight]["momentum_buffer"]
    )


def test_rounds_resets_the_optimizer_when_asked() -> None:
    model = nn.Linear(2, 2)
    opt = torch.optim.AdamW(model.parameters())
    rounds = Rounds(0, model, opt)
    model(torch.ones(1, 2)).sum().backward()
    opt.step()
    assert opt.state
    rounds.begin(Dispatch(params_of(model), 0, 1, 0, 0))
    assert not opt.state


def test_rounds_rejects_a_model_unlike_the_servers() -> None:
    rounds = Rounds(0, nn.Linear(2, 2))
    good = params_of(nn.Linear(2, 2))
    with pytest.raises(UserInputError, match=r"model parameter 'weight': got 'shape \(2, 2\)'"):
        rounds.begin(Dispatch(good | {"weight": torch.zeros(3, 2)}, 0, 1, 0, 0))
    with pytest.raises(UserInputError, match="unknown to it"):
        rounds.begin(Dispatch(good | {"extra": torch.zeros(1)}, 0, 1, 0, 0))
    with pytest.raises(UserInputError, match="a module with parameters"):
        Rounds(0, nn.ReLU())


@pytest.fixture
def small_cfg(tiny_net_values: Callable[..., dict[str, Any]]) -> SimConfig:
    return parse_sim_config(tiny_net_values(method="heloco", workers=2, token_budget=10_000))


def hand_written_loop(parts: RunParts, cfg: SimConfig, worker: int, link: Any) -> list[float]:
    """What a user writes: their own model, AdamW and batches, the optimizer.step hook."""
    model = build_run(cfg).model  # a fresh copy of the architecture (its init is overwritten)
    inner = cfg.inner
    opt = torch.optim.AdamW(
        model.parameters(),
        lr=inner.lr,
        betas=inner.betas,
        eps=inner.eps,
        weight_decay=inner.weight_decay,
        fused=True,
    )
    sampler = parts.data.streams[worker].sampler(
        inner.batch_size, inner.seq_len, seed=derive_seed(cfg.seed, SAMPLER_KEY, worker)
    )
    losses: list[float] = []
    with OuterLoop(
        model, opt, link, tokens_per_step=sampler.tokens_per_batch, island=Island()
    ) as outer:
        while not outer.done:
            for group in opt.param_groups:
                group["lr"] = cosine_lr(outer.step_count, inner)
            x, y = sampler.next()
            logits = model(x)
            loss = nn.functional.cross_entropy(logits.reshape(-1, logits.shape[-1]), y.reshape(-1))
            opt.zero_grad(set_to_none=True)
            loss.backward()
            outer.record_loss(loss)
            opt.step()
            losses.append(float(loss.detach()))
    return losses


def test_hand_written_loop_matches_the_reference_loop_in_process(small_cfg: SimConfig) -> None:
    rounds = 3
    ref = build_run(small_cfg)
    worker = ref.worker(1)
    for _ in range(rounds):
        d = ref.server.dispatch(1)
        ref.server.submit(worker.run_round(d.params, d.steps, d.revision, d.round_id))
    mine = build_run(small_cfg)
    losses = hand_written_loop(mine, small_cfg, 1, LocalLink(mine.server, 1, max_rounds=rounds))
    assert len(losses) == rounds * small_cfg.inner_steps
    assert mine.server.revision == ref.server.revision == rounds
    for name, value in ref.server.params.items():
        assert torch.equal(mine.server.params[name], value), name
    got = [a.train_loss for r in mine.server.log for a in r.arrivals]
    want = [a.train_loss for r in ref.server.log for a in r.arrivals]
    assert got == want


@pytest.mark.slow
@pytest.mark.timeout(120)
def test_hand_written_loop_matches_heloco_work_over_the_network(
    tmp_path: Path, tiny_net_values: Callable[..., dict[str, Any]]
) -> None:
    cfg = parse_sim_config(
        tiny_net_values(method="heloco", workers=1, token_budget=6 * 128, eval_every=256)
    )

    keys.generate(tmp_path / "keys", 1, SECRET)
    server_keys = keys.load_server(tmp_path / "keys" / "server")

    def serve(name: str, work: Callable[[str], None]) -> Session:
        endpoint = EndpointConfig(drain_s=1.0, keys=server_keys)
        session = Session(cfg, SECRET, endpoint, out_dir=tmp_path / name)
        server, address = session.serve_in_thread()
        thread = threading.Thread(target=work, args=(address,), daemon=True)
        thread.start()
        thread.join(90)
        server.join(30)
        assert not server.is_alive()
        return session

    def heloco_work(address: str) -> None:
        curve = keys.load_client(tmp_path / "keys" / "worker0")
        client = ClientConfig(address, timeout_s=20, deadline_s=60, keys=curve)
        NetWorker(client, SECRET, WorkerOptions(worker=0)).run()

    def user_loop(address: str) -> None:
        folder = tmp_path / "keys" / "worker0"  # CURVE keys and the HMAC secret
        link = connect(address, 0, key_folder=folder, timeout_s=20, deadline_s=60)
        hand_written_loop(build_run(cfg), cfg, 0, link)

    reference = serve("work", heloco_work)
    mine = serve("user", user_loop)
    want = [(e.tokens, e.loss) for e in reference.traj.evals]
    got = [(e.tokens, e.loss) for e in mine.traj.evals]
    assert [t for t, _ in got] == [t for t, _ in want] == [0, 256, 512, 768]
    assert got == want  # same ops, same seeds, fp32 on the wire: identical
    assert want[-1][1] < want[0][1]
    # Both loops' rounds carry when they received, computed and sent, in a blocking order.
    theta = tensor_bytes(build_run(cfg).server.params)
    for name in ("work", "user"):
        lines = (tmp_path / name / EVENTS_FILE).read_text().splitlines()
        rounds = [r for r in map(json.loads, lines) if r["type"] == "round"]
        assert len(rounds) == 6
        for r in rounds:
            times = [r[k] for k in ("start", "recv_start", "recv_end", "compute_start")]
            times += [r[k] for k in ("compute_end", "send_start", "send_end", "time")]
            assert times == sorted(times) and r["recv_start"] == r["start"]
            assert r["compute_end"] - r["compute_start"] > 0 and r["send_end"] == r["time"]
            assert r["bytes_received"] == r["bytes_sent"] == theta  # fp32 both ways
