"""Simulator overhead: training tokens/s of `heloco simulate` vs a plain PyTorch loop.

Both sides train the same TinyGPT preset with the same AdamW settings, batch, number of steps
and torch thread count, on random stride-1 windows of the same tokens. The plain loop is the
floor of what any trainer can do (nanoGPT-style: gather a batch, forward, backward, step). The
simulator adds rounds (load the dispatched model, fresh AdamW, pseudo-gradient), the server and
the outer optimizer; its tokens/s is the summary's ``train_tokens_per_second`` (evaluation and
data preparation excluded on both sides). Target: ratio >= 0.9. Repeats alternate the two sides
(A B A B ...) so load from other processes hits both alike; the median is reported. Below the
target, a cProfile of one simulated run shows where the time goes.

    python benchmarks/sim_throughput.py                   # tiny + small, 1 thread
    python benchmarks/sim_throughput.py --presets paper --threads 2 --steps 200
"""

from __future__ import annotations

import argparse
import cProfile
import io
import pstats
import statistics
import sys
import time
from collections.abc import Sequence
from dataclasses import dataclass

import torch
import torch.nn.functional as F

from heloco.config import load_config
from heloco.data import build_data
from heloco.model import TinyGPT
from heloco.sim import SimConfig, model_config_for, run_simulation

TARGET = 0.9


@dataclass(frozen=True)
class Measurement:
    preset: str
    batch: int
    seq_len: int
    steps: int
    threads: int
    plain_tps: float
    sim_tps: float

    @property
    def ratio(self) -> float:
        return self.sim_tps / self.plain_tps


def sim_config(
    preset: str, steps: int, batch: int, seq_len: int, workers: int, method: str
) -> SimConfig:
    """A simulation of exactly ``steps`` inner steps (a multiple of workers × H) and no
    evaluation beyond the first and last."""
    h = 20
    steps = max(workers * h, steps // (workers * h) * workers * h)
    return load_config(
        preset="default",
        overrides={
            "model": preset,
            "method": method,
            "workers": workers,
            "paces": [1.0] * workers,
            "inner_steps": h,
            "token_budget": steps * batch * seq_len,
            "eval_every": 0,
            "eval_windows": 1,
            "data.seq_len": seq_len,
            "inner.seq_len": seq_len,
            "inner.batch_size": batch,
            "inner.total_steps": steps,
        },
    )


def plain_loop(cfg: SimConfig, steps: int) -> float:
    """Tokens/s of a bare PyTorch loop: same model, AdamW, batch and data (stride-1 windows)."""
    data = build_data(cfg.data, cfg.workers, cfg.seed)
    model = TinyGPT(model_config_for(cfg, data.vocab_size), seed=0)
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
    t0 = time.perf_counter()
    for _ in range(steps):
        step()
    return steps * b * t / (time.perf_counter() - t0)


def measure(
    preset: str, steps: int, batch: int, seq_len: int, threads: int, repeats: int, method: str
) -> Measurement:
    torch.set_num_threads(threads)
    cfg = sim_config(preset, steps, batch, seq_len, 5, method)
    n = cfg.token_budget // (batch * seq_len) if cfg.token_budget else steps
    plain, sim = [], []
    for _ in range(repeats):
        plain.append(plain_loop(cfg, n))
        sim.append(run_simulation(cfg).summary.train_tokens_per_second)
    return Measurement(
        preset, batch, seq_len, n, threads, statistics.median(plain), statistics.median(sim)
    )


def profile(preset: str, steps: int, batch: int, seq_len: int, method: str, top: int = 25) -> str:
    """cProfile of one simulated run, sorted by internal time."""
    cfg = sim_config(preset, steps, batch, seq_len, 5, method)
    prof = cProfile.Profile()
    prof.enable()
    run_simulation(cfg)
    prof.disable()
    buf = io.StringIO()
    pstats.Stats(prof, stream=buf).sort_stats("tottime").print_stats(top)
    return buf.getvalue()


def table(rows: Sequence[Measurement]) -> str:
    head = f"{'preset':<8}{'batch':>7}{'seq':>6}{'steps':>7}{'threads':>9}{'plain tok/s':>14}{'sim tok/s':>12}{'ratio':>8}  ok"
    lines = [head, "-" * len(head)]
    for m in rows:
        ok = "yes" if m.ratio >= TARGET else "NO"
        lines.append(
            f"{m.preset:<8}{m.batch:>7}{m.seq_len:>6}{m.steps:>7}{m.threads:>9}"
            f"{m.plain_tps:>14,.0f}{m.sim_tps:>12,.0f}{m.ratio:>8.3f}  {ok}"
        )
    return "\n".join(lines)


def main(argv: Sequence[str] | None = None) -> int:
    p = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    p.add_argument("--presets", default="tiny,small", help="comma list of model presets")
    p.add_argument("--steps", type=int, default=300, help="inner steps (rounded to rounds of 5×20)")
    p.add_argument("--batch", type=int, default=4)
    p.add_argument("--seq-len", type=int, default=64)
    p.add_argument("--threads", type=int, default=1)
    p.add_argument("--repeats", type=int, default=3)
    p.add_argument("--method", default="heloco", help="outer method of the simulated run")
    p.add_argument("--profile", action="store_true", help="always print the profile")
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
                args.method,
            )
        )
        print(table(rows[-1:]).splitlines()[-1], flush=True)
    print()
    print(table(rows))
    slow = [m for m in rows if m.ratio < TARGET]
    for m in slow if not args.profile else rows:
        print(
            f"\n{m.preset}: ratio {m.ratio:.3f} < {TARGET}; profile of one simulated run:"
            if m.ratio < TARGET
            else f"\n{m.preset}: profile"
        )
        print(profile(m.preset, m.steps, m.batch, m.seq_len, args.method))
    return 1 if slow else 0


if __name__ == "__main__":
    sys.exit(main())
