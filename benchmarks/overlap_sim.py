"""Blocking vs overlapped exchange on the simulated link clock: utilization, time, loss.

    python benchmarks/overlap_sim.py            # 4 link speeds x 2 exchanges x 3 seeds
    python benchmarks/overlap_sim.py --seeds 1  # one seed: 30 s of CPU, minutes when loaded

Two HeLoCo workers (paces 1.0 and 1.5 s per inner step, H = 5) on the tiny model. Each link
is set so that one exchange (push + pull, ``heloco.sim.clock.link_seconds``) takes ``ratio``
times the fast worker's round compute (H x pace): 0 (no link), 0.5, 1 and 2. For each it
prints, per exchange mode, the simulated time to the token budget, the goodput (compute over
the workers' capacity, summary.json's ``goodput``), the mean staleness and the final
validation loss at the same token budget, averaged over the seeds (loss: mean ± spread).
The figures are simulated seconds, so they do not depend on the machine's load.
"""

from __future__ import annotations

import argparse
import statistics
from typing import Any

from heloco.sim import build_run, parse_sim_config, run_simulation

PACES = [1.0, 1.5]
H = 5
BASE: dict[str, Any] = {
    "method": "heloco",
    "workers": 2,
    "paces": PACES,
    "inner_steps": H,
    "model": "tiny",
    "eval_windows": 4,
    "eval_batch_size": 16,
    "data": {"seq_len": 64, "synthetic_chars_per_language": 20000, "val_chars_per_language": 2000},
    "inner": {"batch_size": 4, "seq_len": 64, "total_steps": 400},
    "token_budget": 60 * H * 4 * 64,
    "threads": 1,
}


def link_for(ratio: float, n_params: int) -> dict[str, Any]:
    """Config keys giving each worker a link on which push + pull take ``ratio`` x H x pace_0."""
    if ratio == 0:
        return {}
    seconds = ratio * H * PACES[0]
    mbit = 2 * 4 * n_params * 8 / 1e6 / seconds  # two legs of 4 bytes per parameter
    return {"link_mbit": [mbit, mbit]}


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--seeds", type=int, default=3)
    args = ap.parse_args()
    n = sum(p.numel() for p in build_run(parse_sim_config(BASE)).model.parameters())
    print(f"tiny model, {n:,} parameters; paces {PACES}, H = {H}; {args.seeds} seeds\n")
    head = f"{'exchange/compute':>16}  {'mode':<10} {'time s':>8} {'goodput':>8} "
    print(head + f"{'staleness':>9}  {'final loss':>16}")
    for ratio in (0.0, 0.5, 1.0, 2.0):
        for mode in ("blocking", "overlapped"):
            runs = []
            for seed in range(args.seeds):
                values = BASE | link_for(ratio, n) | {"exchange": mode, "seed": seed}
                runs.append(run_simulation(parse_sim_config(values)).summary)
            time = statistics.mean(s.time for s in runs)
            goodput = statistics.mean(s.goodput or 0.0 for s in runs)
            stale = statistics.mean(statistics.mean(s.staleness_mean) for s in runs)
            losses = [s.final_loss or float("nan") for s in runs]
            spread = (max(losses) - min(losses)) / 2
            print(
                f"{ratio:>16.1f}  {mode:<10} {time:>8.1f} {goodput:>8.3f} {stale:>9.2f}  "
                f"{statistics.mean(losses):>8.4f} ± {spread:.4f}"
            )


if __name__ == "__main__":
    main()
