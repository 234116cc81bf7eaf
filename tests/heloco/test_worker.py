"""Worker: pseudo-gradient, inner-state reset vs kept, schedule, determinism, resume."""

from __future__ import annotations

import itertools
import json
import math

import pytest
import torch
from torch import nn

from heloco.data import DataConfig, WorkerData, build_data
from heloco.model import TinyGPT, preset_config
from heloco.types import Params
from heloco.worker import InnerConfig, Worker, cosine_lr
from shardmeter.errors import UserInputError

SEQ = 16


pytestmark = pytest.mark.usefixtures("one_thread")  # tests/heloco/conftest.py


@pytest.fixture(scope="module")
def data() -> WorkerData:
    cfg = DataConfig(val_chars_per_language=1000, synthetic_chars_per_language=8000, seq_len=SEQ)
    return build_data(cfg, 2, 0)


def tiny_model(data: WorkerData) -> TinyGPT:
    return TinyGPT(
        preset_config("tiny", vocab_size=data.vocab_size, seq_len=SEQ, d_model=32), seed=0
    )


def params_of(model: nn.Module) -> Params:
    return {n: p.detach().clone() for n, p in model.named_parameters()}


def make_worker(data: WorkerData, seed: int = 0, **inner: object) -> Worker:
    cfg = InnerConfig(**{"lr": 1e-2, "batch_size": 4, "seq_len": SEQ, "total_steps": 40, **inner})  # type: ignore[arg-type]
    return Worker(1, tiny_model(data), data.streams[1], cfg, seed)


def test_delta_is_start_minus_end(data: WorkerData) -> None:
    worker = make_worker(data)
    start = params_of(tiny_model(data))
    start["tok_emb.weight"] += 0.01  # a start point that differs from the worker's own model
    snapshot = {n: t.clone() for n, t in start.items()}
    result = worker.run_round(start, steps=5, base_revision=7, round_id=3)
    end = params_of(worker.model)
    assert list(result.delta) == list(start)
    for name in start:
        assert torch.equal(start[name], snapshot[name])  # the start point is not modified
        assert torch.equal(result.delta[name], start[name] - end[name])
        assert result.delta[name].dtype == torch.float32 and result.delta[name].device.type == "cpu"
    assert sum(float(d.abs().sum()) for d in result.delta.values()) > 0
    assert (result.worker, result.steps, result.base_revision, result.round_id) == (1, 5, 7, 3)
    assert result.tokens == 5 * 4 * SEQ
    assert math.isfinite(result.mean_loss) and 0 < result.mean_loss < 7


def test_training_lowers_the_loss(data: WorkerData) -> None:
    worker = make_worker(data, lr=3e-3, total_steps=200)
    params = params_of(worker.model)
    first = worker.run_round(params, 30, 0)
    params = {n: params[n] - first.delta[n] for n in params}
    later = worker.run_round(params, 30, 1)
    assert later.mean_loss < first.mean_loss - 0.5


def test_same_seed_gives_bit_identical_deltas(data: WorkerData) -> None:
    start = params_of(tiny_model(data))
    a = make_worker(data, seed=5).run_round(start, 4, 0)
    b = make_worker(data, seed=5).run_round(start, 4, 0)
    c = make_worker(data, seed=6).run_round(start, 4, 0)
    assert all(torch.equal(a.delta[n], b.delta[n]) for n in start)
    assert a.mean_loss == b.mean_loss
    assert not all(torch.equal(a.delta[n], c.delta[n]) for n in start)


def test_reset_and_kept_inner_state_differ(data: WorkerData) -> None:
    start = params_of(tiny_model(data))
    reset, kept = make_worker(data), make_worker(data, reset_each_round=False)
    r1, k1 = reset.run_round(start, 3, 0), kept.run_round(start, 3, 0)
    assert all(torch.equal(r1.delta[n], k1.delta[n]) for n in start)  # first rounds agree
    r2, k2 = reset.run_round(start, 3, 1), kept.run_round(start, 3, 1)
    assert not all(torch.equal(r2.delta[n], k2.delta[n]) for n in start)
    # with a fresh AdamW, the first step moves every weight by about lr (Adam's m/sqrt(v) = ±1)
    one = make_worker(data, total_steps=10**6).run_round(start, 1, 0)
    assert one.delta["head.weight"].abs().max().item() == pytest.approx(1e-2, rel=0.05)


def test_schedule_position_advances_across_rounds(data: WorkerData) -> None:
    worker = make_worker(data, warmup_steps=2, total_steps=10, min_lr=1e-4)
    start = params_of(tiny_model(data))
    worker.run_round(start, 3, 0)
    assert worker.step == 3
    worker.run_round(start, 4, 1)
    assert worker.step == 7 and worker.rounds == 2
    lrs = [cosine_lr(s, worker.cfg) for s in range(12)]
    assert worker.optimizer is not None
    assert (
        worker.optimizer.param_groups[0]["lr"] == lrs[6]
    )  # last step of round 2 ran at position 6
    assert lrs[0] == pytest.approx(5e-3) and lrs[1] == pytest.approx(1e-2)
    assert lrs[2] == pytest.approx(1e-2) and lrs[10] == pytest.approx(1e-4) == lrs[11]
    assert all(a >= b for a, b in itertools.pairwise(lrs[1:]))


def test_cosine_midpoint() -> None:
    cfg = InnerConfig(lr=1.0, min_lr=0.0, total_steps=100)
    assert cosine_lr(50, cfg) == pytest.approx(0.5)
    assert cosine_lr(0, cfg) == 1.0 and cosine_lr(100, cfg) == pytest.approx(0.0)


@pytest.mark.parametrize("reset", [True, False])
def test_state_dict_resume_matches_uninterrupted_run(data: WorkerData, reset: bool) -> None:
    start = params_of(tiny_model(data))
    straight = make_worker(data, reset_each_round=reset)
    straight.run_round(start, 3, 0)
    expected = straight.run_round(start, 3, 1)

    first = make_worker(data, reset_each_round=reset)
    first.run_round(start, 3, 0)
    state = first.state_dict()
    assert set(state) == {"meta", "tensors"}
    assert json.loads(json.dumps(state["meta"])) == state["meta"]  # JSON, no pickle
    assert all(isinstance(t, torch.Tensor) for t in state["tensors"].values())
    assert any(k.startswith("optimizer.") for k in state["tensors"]) == (not reset)
    resumed = make_worker(data, reset_each_round=reset)
    resumed.load_state_dict(state)
    got = resumed.run_round(start, 3, 1)
    assert all(torch.equal(got.delta[n], expected.delta[n]) for n in start)


def test_any_module_with_loss_fn_hook(data: WorkerData) -> None:
    class Counts(nn.Module):
        def __init__(self) -> None:
            super().__init__()
            self.bias = nn.Parameter(torch.zeros(data.vocab_size))
            self.frozen = nn.Parameter(torch.ones(3), requires_grad=False)

    model = Counts()

    def loss_fn(m: nn.Module, inputs: torch.Tensor, targets: torch.Tensor) -> torch.Tensor:
        logits = m.bias.expand(targets.numel(), -1)  # type: ignore[operator]
        return nn.functional.cross_entropy(logits, targets.reshape(-1))

    worker = Worker(
        0, model, data.streams[0], InnerConfig(lr=0.1, batch_size=2, seq_len=SEQ), 0, loss_fn
    )
    start = params_of(model)
    result = worker.run_round(start, 3, 0)
    assert float(result.delta["bias"].abs().sum()) > 0
    assert torch.equal(result.delta["frozen"], torch.zeros(3))


def test_on_step_hook_sees_every_step_after_it_is_taken(data: WorkerData) -> None:
    worker = make_worker(data)
    start = params_of(worker.model)
    seen: list[tuple[int, int]] = []
    worker.on_step = lambda i: seen.append((i, worker.step))
    worker.run_round(start, 3, 0)
    worker.run_round(start, 2, 1)
    assert seen == [(0, 1), (1, 2), (2, 3), (0, 4), (1, 5)]


def test_zero_steps_and_bad_inputs(data: WorkerData) -> None:
    worker = make_worker(data)
    start = params_of(tiny_model(data))
    empty = worker.run_round(start, 0, 0)
    assert all(torch.equal(d, torch.zeros_like(d)) for d in empty.delta.values())
    assert math.isnan(empty.mean_loss) and empty.tokens == 0
    with pytest.raises(UserInputError, match="steps"):
        worker.run_round(start, -1, 0)
    with pytest.raises(UserInputError, match="parameters missing from the server's model"):
        worker.run_round({"head.weight": start["head.weight"]}, 1, 0)
    wrong = dict(start, **{"head.weight": torch.zeros(3, 3)})
    with pytest.raises(UserInputError, match=r"'head.weight': got 'shape") as exc:
        worker.run_round(wrong, 1, 0)
    assert "\n" not in str(exc.value)


@pytest.mark.parametrize(
    ("field", "value"),
    [
        ("lr", 0.0),
        ("lr", float("nan")),
        ("min_lr", 1.0),
        ("weight_decay", -1.0),
        ("betas", (0.9, 1.0)),
        ("total_steps", 0),
        ("warmup_steps", 10**9),
        ("batch_size", 0),
        ("seq_len", 0),
        ("grad_clip", 0.0),
    ],
)
def test_inner_config_rejects_nonsense(field: str, value: object) -> None:
    with pytest.raises(UserInputError, match=f"inner.{field}") as exc:
        InnerConfig(**{field: value})  # type: ignore[arg-type]
    assert "\n" not in str(exc.value)


def test_seq_len_longer_than_data_is_rejected(data: WorkerData) -> None:
    with pytest.raises(UserInputError, match="seq_len"):
        make_worker(data, seq_len=10**7)


def test_grad_clip_bounds_the_first_step(data: WorkerData) -> None:
    start = params_of(tiny_model(data))
    clipped = make_worker(data, grad_clip=1e-3).run_round(start, 2, 0)
    free = make_worker(data).run_round(start, 2, 0)
    assert not all(torch.equal(clipped.delta[n], free.delta[n]) for n in start)


def test_workers_sharing_one_model_match_separate_models(data: WorkerData) -> None:
    cfg = InnerConfig(lr=1e-2, batch_size=4, seq_len=SEQ, total_steps=40, reset_each_round=False)
    shared = tiny_model(data)
    pair = [Worker(i, shared, data.streams[i], cfg, 0) for i in range(2)]
    alone = [Worker(i, tiny_model(data), data.streams[i], cfg, 0) for i in range(2)]
    start = params_of(shared)
    for revision in range(2):
        for i in range(2):
            a, b = pair[i].run_round(start, 3, revision), alone[i].run_round(start, 3, revision)
            assert all(torch.equal(a.delta[n], b.delta[n]) for n in start)
