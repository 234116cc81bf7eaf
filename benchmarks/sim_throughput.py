"""Simulator throughput: training tokens per CPU-second, against a plain PyTorch loop.

Side by side in one run, for each TinyGPT preset:
  plain   a bare PyTorch loop of one model (nanoGPT-style: gather a batch, forward, backward,
          fused AdamW step), the floor of what any trainer of one model does;
  run     one simulated run, every round on its own (``batch = "off"``);
  batched the same run with its in-flight rounds batched (the default);
  grid    a grid batch of one pace setting: every method × seed of paces [1,1,1,2,2]
          simulated side by side, their rounds in one batched kernel (what
          ``heloco_paper.py`` runs per task). Its pool computes rounds that are the same
          computation in several runs once (every worker's first round, for the methods that
          dispatch the initial model with the same steps) and no round a run cannot take;
          the ``computed`` column is the share of the grid's simulated inner steps that were
          actually computed. These runs are short (about 2 rounds per worker), so the shared
          first rounds weigh more here than in the paper grid's cells.
All use the same model, AdamW settings, batch shape and torch threads, on random windows of
the same tokens. Throughput is training tokens ÷ CPU seconds of this process (user + system,
all threads), so other load on the machine costs little; evaluation runs only at the start
and the end on one window, and data preparation is built once before timing. Repeats
alternate the sides (A B C D A B C D ...) and the median is reported. Target: grid ≥ 1.5×
plain. The simulated runs give the same losses batched or not (tests/heloco/test_sim_batch.py).

    python benchmarks/sim_throughput.py                      # tiny + small, 1 thread
    python benchmarks/sim_throughput.py --presets small --threads 2 --steps 200
"""

from __future__ import annotations

import argparse
import statistics
import sys
import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass

import torch
import torch.nn.functional as F

import heloco.sim.run as sim_run
from heloco.config import load_config
from heloco.data import build_data
from heloco.model import TinyGPT
from heloco.sim import ModelSetup, RunParts, SimConfig, run_simulation, run_simulations
from heloco.sim.loop import RoundSource
from heloco.sim.pool import PooledRounds, RoundPool

TARGET = 1.5
METHODS = (
    "sync",
    "async-nesterov",
    "dn",
    "dn-dylu",
    "mla",
    "heloco",
    "heloco-uncorrected",
    "heloco+ab",
    "mla+ab",
)
PACES = [1.0, 1.0, 1.0, 2.0, 2.0]
SIDES = ("plain", "run", "batched", "grid")


@dataclass(frozen=True)
class Measurement:
    preset: str
    threads: int
    cells: int
    tps: dict[str, float]  # side -> training tokens per CPU-second (median)
    computed: float  # share of the grid's simulated inner steps its pool computed

    @property
    def ratio(self) -> float:
        return self.tps["grid"] / self.tps["plain"]


def sim_config(
    preset: str, steps: int, batch: int, seq_len: int, method: str, seed: int, threads: int
) -> SimConfig:
    """A run of about ``steps`` inner steps over its 5 workers (a multiple of 5 × H), with no
    evaluation beyond the first and last, on one validation window."""
    h = 20
    steps = max(5 * h, steps // (5 * h) * 5 * h)
    return load_config(
        preset="default",
        overrides={
            "model": preset,
            "method": method,
            "seed": seed,
            "workers": 5,
            "paces": PACES,
            "inner_steps": h,
            "token_budget": steps * batch * seq_len,
            "eval_every": 0,
            "eval_windows": 1,
            "threads": threads,
            "data.seq_len": seq_len,
            "inner.seq_len": seq_len,
            "inner.batch_size": batch,
            "inner.total_steps": steps,
        },
    )


def cpu_rate(work: Callable[[], int]) -> float:
    """Tokens ÷ CPU seconds of this process spent in ``work`` (which returns its tokens)."""
    c0 = time.process_time()
    tokens = work()
    return tokens / max(time.process_time() - c0, 1e-9)


def plain_loop(cfg: SimConfig, steps: int) -> Callable[[], int]:
    """A bare PyTorch loop: same model, AdamW, batch and data (stride-1 windows)."""
    data = build_data(cfg.data, cfg.workers, cfg.seed)
    model = TinyGPT(ModelSetup.of(cfg).tinygpt(data.vocab_size), seed=0)
    inner = cfg.inner
    opt = torch.optim.AdamW(
        model.parameters(),
        lr=inner.lr,
        betas=inner.betas,
        eps=inner.eps,
        weight_decay=inner.weight_decay,
        fused=True,
    )
    tokens = data.streams[0].tokens
    gen = torch.Generator().manual_seed(0)
    offsets = torch.arange(inner.seq_len + 1)
    b, t = inner.batch_size, inner.seq_len

    def step() -> None:
        starts = torch.randint(0, tokens.numel() - t - 1, (b, 1), generator=gen)
        window = tokens[starts + offsets].long()
        logits = model(window[:, :-1])
        loss = F.cross_entropy(logits.reshape(-1, logits.shape[-1]), window[:, 1:].reshape(-1))
        opt.zero_grad(set_to_none=True)
        loss.backward()
        opt.step()

    for _ in range(3):  # warm-up, as the simulator's first round also pays it
        step()

    def run() -> int:
        for _ in range(steps):
            step()
        return steps * b * t

    return run


@dataclass
class PoolSteps:
    """Inner steps simulated by a grid's runs and computed by their pools (last call)."""

    simulated: int = 0
    computed: int = 0


def simulated(cfgs: Sequence[SimConfig], steps: PoolSteps | None = None) -> Callable[[], int]:
    def run() -> int:
        pools: list[RoundPool] = []
        original = sim_run.round_sources

        def spy(built: Sequence[RunParts | Exception]) -> list[RoundSource | None]:
            sources = original(built)
            pools.extend(
                {id(s.pool): s.pool for s in sources if isinstance(s, PooledRounds)}.values()
            )
            return sources

        sim_run.round_sources = spy
        try:
            outs = run_simulations(cfgs)
        finally:
            sim_run.round_sources = original
        tokens = 0
        for out in outs:
            if isinstance(out, Exception):
                raise out
            tokens += out.summary.tokens
        if steps is not None:
            steps.simulated = sum(o.summary.steps for o in outs if not isinstance(o, Exception))
            steps.computed = sum(p.computed_steps for p in pools)
        return tokens

    return run


def measure(
    preset: str, steps: int, batch: int, seq_len: int, threads: int, repeats: int, seeds: int
) -> Measurement:
    torch.set_num_threads(threads)
    one = sim_config(preset, steps, batch, seq_len, "heloco", 0, threads)
    grid = [
        sim_config(preset, steps, batch, seq_len, m, s, threads).model_copy(update={"batch": "on"})
        for s in range(seeds)
        for m in METHODS
    ]
    run_simulation(one.model_copy(update={"token_budget": batch * seq_len}))  # lazy imports
    assert one.token_budget is not None
    pool_steps = PoolSteps()
    works = {
        "plain": plain_loop(one, one.token_budget // (batch * seq_len)),
        "run": simulated([one.model_copy(update={"batch": "off"})]),
        "batched": simulated([one.model_copy(update={"batch": "on"})]),
        "grid": simulated(grid, pool_steps),
    }
    samples: dict[str, list[float]] = {side: [] for side in SIDES}
    for _ in range(repeats):
        for side in SIDES:
            samples[side].append(cpu_rate(works[side]))
    tps = {side: statistics.median(v) for side, v in samples.items()}
    return Measurement(
        preset, threads, len(grid), tps, pool_steps.computed / max(1, pool_steps.simulated)
    )


def table(rows: Sequence[Measurement]) -> str:
    head = (
        f"{'preset':<7}{'threads':>8}{'plain':>10}{'run':>10}{'batched':>10}"
        f"{'grid':>10}{'cells':>6}{'computed':>9}{'grid/plain':>11}  ok"
    )
    lines = ["training tokens per CPU-second", head, "-" * len(head)]
    for m in rows:
        ok = "yes" if m.ratio >= TARGET else "NO"
        values = "".join(f"{m.tps[s]:>10,.0f}" for s in SIDES)
        lines.append(
            f"{m.preset:<7}{m.threads:>8}{values}{m.cells:>6}{m.computed:>9.0%}"
            f"{m.ratio:>10.2f}x  {ok}"
        )
    return "\n".join(lines)


def main(argv: Sequence[str] | None = None) -> int:
    p = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    p.add_argument("--presets", default="tiny,small", help="comma list of model presets")
    p.add_argument("--steps", type=int, default=200, help="inner steps per run (rounds of 5×20)")
    p.add_argument("--batch", type=int, default=4)
    p.add_argument("--seq-len", type=int, default=64)
    p.add_argument("--threads", type=int, default=1)
    p.add_argument("--repeats", type=int, default=3)
    p.add_argument("--seeds", type=int, default=2, help="seeds of the grid batch (× 9 methods)")
    args = p.parse_args(argv)
    rows = []
    for preset in [x for x in args.presets.split(",") if x]:
        rows.append(
            measure(
                preset,
                args.steps,
                args.batch,
                args.seq_len,
                args.threads,
                args.repeats,
                args.seeds,
            )
        )
        print(table(rows[-1:]).splitlines()[-1], flush=True)
    print()
    print(table(rows))
    return 0 if all(m.ratio >= TARGET for m in rows) else 1


if __name__ == "__main__":
    sys.exit(main())
