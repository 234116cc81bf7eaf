"""Blocking vs overlapped (vs streaming) exchange on the simulated link clock: utilization,
time, loss.

    python benchmarks/overlap_sim.py            # 4 link speeds x 2 exchanges x 3 seeds
    python benchmarks/overlap_sim.py --seeds 1  # one seed: 30 s of CPU, minutes when loaded
    python benchmarks/overlap_sim.py --modes blocking,overlapped,streaming --ratios 1 \
        --inner-steps 6 --fragments 3       # streaming: one of P fragments every H/P steps

Two HeLoCo workers (paces 1.0 and 1.5 s per inner step, H = 5 unless ``--inner-steps``) on
the tiny model, 60 rounds of tokens. Each link
is set so that one exchange (push + pull, ``heloco.sim.clock.link_seconds``) takes ``ratio``
times the fast worker's round compute (H x pace): 0 (no link), 0.5, 1 and 2. For each it
prints, per exchange mode, the simulated time to the token budget, the goodput (compute over
the workers' capacity, summary.json's ``goodput``), the mean staleness and the final
validation loss at the same token budget, averaged over the seeds (loss: mean ± spread).
The figures are simulated seconds, so they do not depend on the machine's load. Streaming
(``heloco.streaming``) pushes one of ``--fragments`` fragments every H/P steps, in the
background, and merges the one returned with ``--alpha``; H must be a multiple of P.
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


def link_for(ratio: float, n_params: int, h: int = H) -> dict[str, Any]:
    """Config keys giving each worker a link on which push + pull take ``ratio`` x H x pace_0."""
    if ratio == 0:
        return {}
    seconds = ratio * h * PACES[0]
    mbit = 2 * 4 * n_params * 8 / 1e6 / seconds  # two legs of 4 bytes per parameter
    return {"link_mbit": [mbit, mbit]}


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--seeds", type=int, default=3)
    ap.add_argument("--modes", default="blocking,overlapped", help="comma-separated exchanges")
    ap.add_argument("--ratios", default="0,0.5,1,2", help="exchange/compute ratios, commas")
    ap.add_argument("--inner-steps", type=int, default=H, help="H (a multiple of --fragments)")
    ap.add_argument("--fragments", type=int, default=2, help="streaming: P")
    ap.add_argument("--alpha", type=float, default=0.5, help="streaming: merge weight α")
    args = ap.parse_args()
    h = args.inner_steps
    base = BASE | {"inner_steps": h, "token_budget": 60 * h * 4 * 64}
    modes = args.modes.split(",")
    n = sum(p.numel() for p in build_run(parse_sim_config(base)).model.parameters())
    extra = f"; streaming P = {args.fragments}, α = {args.alpha}" if "streaming" in modes else ""
    print(f"tiny model, {n:,} parameters; paces {PACES}, H = {h}; {args.seeds} seeds{extra}\n")
    head = f"{'exchange/compute':>16}  {'mode':<10} {'time s':>8} {'goodput':>8} "
    print(head + f"{'staleness':>9}  {'final loss':>16}")
    for ratio in (float(r) for r in args.ratios.split(",")):
        for mode in modes:
            runs = []
            for seed in range(args.seeds):
                values = base | link_for(ratio, n, h) | {"exchange": mode, "seed": seed}
                if mode == "streaming":
                    values |= {"fragments": args.fragments, "stream_alpha": args.alpha}
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
