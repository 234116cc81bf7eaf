"""Batched simulation: the same losses, bit for bit, as computing each round on its own.

The stacked TinyGPT gives each model the loss and gradients it has alone; the batch engine
runs every worker's own sampler, schedule, clipping and AdamW; the event loop takes rounds in
the same order whoever computed them. So batched runs, and runs simulated side by side, equal
``batch = "off"`` exactly, not merely to 1e-6 in loss at every evaluation.
"""

from __future__ import annotations

from typing import Any

import pytest
import torch

from heloco.data.validation import token_cross_entropy
from heloco.model import TinyGPT, preset_config
from heloco.sim import SimConfig, parse_sim_config, run_simulation
from heloco.sim.batch import BatchEngine
from heloco.sim.build import build_run
from heloco.sim.pool import PooledRounds, RoundPool, same_tensors
from heloco.sim.run import batching_pays, round_sources, run_simulations
from heloco.sim.stacked import stacked_losses

BASE: dict[str, Any] = {
    "model": "tiny",
    "inner_steps": 3,
    "token_budget": 2400,
    "eval_every": 480,
    "eval_windows": 2,
    "eval_batch_size": 8,
    "seed": 5,
    "data": {"seq_len": 16, "synthetic_chars_per_language": 4000, "val_chars_per_language": 800},
    "inner": {"batch_size": 2, "seq_len": 16, "total_steps": 40, "lr": 3e-3, "warmup_steps": 4},
}


def config(**over: Any) -> SimConfig:
    values = {**BASE, **over}
    values["inner"] = {**BASE["inner"], **over.get("inner", {})}
    return parse_sim_config(values)


@pytest.mark.parametrize("threads", [1, 2])
def test_stacked_losses_and_gradients_equal_each_model_alone(threads: int) -> None:
    before = torch.get_num_threads()
    torch.set_num_threads(threads)
    try:
        cfg = preset_config("tiny", vocab_size=97, seq_len=24)
        models = [TinyGPT(cfg, seed=s) for s in range(3)]
        names = [n for n, _ in models[0].named_parameters()]
        gen = torch.Generator().manual_seed(0)
        tokens = torch.randint(0, 97, (3, 2, 21), generator=gen)
        inputs, targets = tokens[:, :, :-1], tokens[:, :, 1:]
        stack = {
            n: torch.stack([dict(m.named_parameters())[n].detach() for m in models])
            .clone()
            .requires_grad_()
            for n in names
        }
        losses = stacked_losses(cfg, stack, inputs, targets)
        losses.sum().backward()
        for i, model in enumerate(models):
            alone = token_cross_entropy(model, inputs[i], targets[i])
            alone.backward()
            assert torch.equal(alone, losses[i])
            for name, p in model.named_parameters():
                grad = stack[name].grad
                assert grad is not None and p.grad is not None
                assert torch.equal(p.grad, grad[i]), name
    finally:
        torch.set_num_threads(before)


CASES: list[dict[str, Any]] = [
    {"method": "heloco", "workers": 3, "paces": [1.0, 1.0, 2.5]},
    {"method": "sync", "workers": 3, "paces": [1.0, 2.0, 3.0]},
    {"method": "dn-dylu", "workers": 3, "paces": [1.0, 3.0, 3.0], "pace_jitter": 0.3},
    {
        "method": "mla",
        "workers": 2,
        "paces": [1.0, 4.0],
        "inner": {"grad_clip": 0.05, "reset_each_round": False},
    },
    {"method": "heloco", "workers": 2, "paces": [1.0, 1.5], "inner_schedule": "budget"},
]


@pytest.mark.slow
@pytest.mark.parametrize("case", CASES, ids=[c["method"] for c in CASES])
def test_batched_run_equals_unbatched(case: dict[str, Any]) -> None:
    reference = run_simulation(config(**case, batch="off"))
    batched = run_simulation(config(**case))
    assert len(reference.losses) >= 4
    assert batched.losses == reference.losses
    assert [e.tokens for e in batched.evals] == [e.tokens for e in reference.evals]
    for name, p in reference.params.items():
        assert torch.equal(batched.params[name], p)
    assert batched.summary.staleness_max == reference.summary.staleness_max


@pytest.mark.slow
def test_runs_side_by_side_equal_each_run_alone() -> None:
    cfgs = [config(**case) for case in CASES[:3]] + [config(**CASES[0], seed=6)]
    together = run_simulations(cfgs)
    for cfg, got in zip(cfgs, together, strict=True):
        assert not isinstance(got, Exception)
        assert got.losses == run_simulation(cfg.model_copy(update={"batch": "off"})).losses


def test_runs_of_one_shape_share_one_engine_and_off_opts_out() -> None:
    parts = [build_run(config(**CASES[0])), build_run(config(**CASES[1]))]
    parts.append(build_run(config(**CASES[0], batch="off")))
    parts.append(build_run(config(**CASES[0], model="small")))
    sources = round_sources(parts)
    a, b, off, other = sources
    assert isinstance(a, PooledRounds) and isinstance(b, PooledRounds)
    assert a.pool is b.pool and a.pool.slots == 6 and b.offset == 3
    assert not isinstance(off, PooledRounds)
    assert isinstance(other, PooledRounds)  # another shape: an engine of its own
    assert other.pool is not a.pool and other.pool.slots == 3
    alone = round_sources([build_run(config(**{**CASES[0], "workers": 1, "paces": [1.0]}))])[0]
    assert alone is not None and not isinstance(alone, PooledRounds)  # nothing to batch


@pytest.mark.slow
def test_a_failing_run_does_not_stop_the_others(tmp_path: Any) -> None:
    bad = config(**CASES[0], data={**BASE["data"], "data_dir": str(tmp_path / "absent")})
    good = config(**CASES[0])
    failed, ok = run_simulations([bad, good])
    assert isinstance(failed, Exception) and "data_dir" in str(failed)
    assert not isinstance(ok, Exception)
    assert ok.losses == run_simulation(good).losses


def test_auto_batches_small_models_on_the_cpu_and_on_forces_it() -> None:
    light = build_run(config(**CASES[0]))
    heavy_values = {**CASES[0], "model": "small", "inner": {"batch_size": 32}}
    heavy = build_run(config(**heavy_values))
    assert batching_pays(light) and not batching_pays(heavy)
    auto, forced = round_sources([heavy, build_run(config(**heavy_values, batch="on"))])
    assert not isinstance(auto, PooledRounds) and isinstance(forced, PooledRounds)


METHODS = ["heloco", "mla", "dn", "async-nesterov", "sync"]


def pooled(cfgs: list[SimConfig], monkeypatch: pytest.MonkeyPatch) -> tuple[list[Any], list[Any]]:
    """``run_simulations(cfgs)`` and the round sources it used."""
    import heloco.sim.run as sim_run

    seen: list[Any] = []
    original = sim_run.round_sources

    def spy(built: Any) -> Any:
        sources = original(built)
        seen.extend(sources)
        return sources

    monkeypatch.setattr(sim_run, "round_sources", spy)
    results = sim_run.run_simulations(cfgs)
    monkeypatch.setattr(sim_run, "round_sources", original)
    return results, seen


@pytest.mark.slow
@pytest.mark.parametrize("model", ["tiny", "small"], ids=["batched", "one-at-a-time"])
def test_a_pool_computes_identical_rounds_once_and_changes_no_result(
    model: str, monkeypatch: pytest.MonkeyPatch
) -> None:
    """The methods of one seed share every worker's first round (the initial model, the same
    data and steps); the pool computes it once and each run's losses stay bit-identical."""
    over: dict[str, Any] = {"workers": 3, "paces": [1.0, 1.0, 2.0], "model": model}
    if model == "small":  # too heavy to batch on the CPU: one round at a time
        over.update(inner={"batch_size": 32}, token_budget=15360, eval_every=3072)
    cfgs = [config(**over, method=m) for m in METHODS]
    results, sources = pooled(cfgs, monkeypatch)
    pool = sources[0].pool
    assert all(s.pool is pool for s in sources)
    assert isinstance(pool, BatchEngine) == (model == "tiny")
    assert pool.shared >= 3 * (len(METHODS) - 1)  # at least the first rounds
    for cfg, got in zip(cfgs, results, strict=True):
        assert not isinstance(got, Exception)
        alone = run_simulation(cfg.model_copy(update={"batch": "off"}))
        assert got.losses == alone.losses
        assert got.summary.tokens == alone.summary.tokens
        for name, p in alone.params.items():
            assert torch.equal(got.params[name], p)


@pytest.mark.slow
def test_a_pool_computes_no_round_its_run_cannot_take(monkeypatch: pytest.MonkeyPatch) -> None:
    """Asynchronous runs stop at their token budget with rounds in flight: those rounds are
    never computed (every computed or shared round is taken)."""
    cfgs = [
        config(method=m, workers=3, paces=[1.0, 1.0, 2.0], seed=s)
        for m in METHODS[:2]
        for s in (1, 2)
    ]
    tokens = {"rounds": 0}
    original = RoundPool.run

    def counting(self: RoundPool) -> int:
        before = set(self.done)
        n = original(self)
        tokens["rounds"] += sum(self.done[s].tokens for s in set(self.done) - before)
        return n

    monkeypatch.setattr(RoundPool, "run", counting)
    results, _ = pooled(cfgs, monkeypatch)
    taken = sum(r.summary.tokens for r in results if not isinstance(r, Exception))
    assert tokens["rounds"] == taken


def test_may_take_stops_where_the_budget_fills() -> None:
    """Worked example: 3 workers, 2×16 tokens per step, 3 steps per round (96 tokens); the run
    took 2,304 of its 2,400 tokens. In arrival order, the first round may be taken (the budget
    is unfilled before it), the second may not (2,304 + 96 fills it), nor the third."""
    parts = build_run(config(workers=3, paces=[1.0, 1.0, 2.0]))
    pool = RoundPool(3)
    for w in range(3):
        pool.bind(w, parts.worker(w), w)
    view = PooledRounds(pool, 0, 3, token_budget=2400, time_budget=None)
    for w, arrival in ((0, 5.0), (1, 4.0), (2, 6.0)):
        view.submit(parts.server.dispatch(w), arrival)
    view.taken_tokens = 2304
    assert view.may_take() == [1]
    view.taken_tokens = 2208
    assert view.may_take() == [1, 0]
    timed = PooledRounds(pool, 0, 3, token_budget=None, time_budget=5.5)
    assert timed.may_take() == [1, 0]  # worker 2 arrives past the time budget


@pytest.mark.slow
def test_runs_side_by_side_evaluate_identical_parameters_once(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    from heloco.sim.evalcache import EvalCache

    made: list[EvalCache] = []
    original = EvalCache.__init__

    def remember(self: EvalCache) -> None:
        original(self)
        made.append(self)

    monkeypatch.setattr(EvalCache, "__init__", remember)
    cfgs = [config(method=m) for m in METHODS[:3]]
    results = run_simulations(cfgs)
    assert made and made[0].hits >= 2  # the initial model, evaluated once for 3 runs
    for cfg, got in zip(cfgs, results, strict=True):
        assert not isinstance(got, Exception)
        assert got.losses == run_simulation(cfg.model_copy(update={"batch": "off"})).losses


def test_rounds_are_shared_only_between_bit_identical_inputs() -> None:
    zero, negative = torch.zeros(3), torch.tensor([0.0, -0.0, 0.0])
    assert torch.equal(zero, negative) and not same_tensors([zero], [negative])
    nan = torch.tensor([float("nan"), 1.0])
    assert same_tensors([nan], [nan.clone()])
    assert not same_tensors([zero], [zero.double()])
    assert not same_tensors([zero], [zero[:2]])
