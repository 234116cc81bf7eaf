"""Host time per rank of DeepSpeed ZeRO-3's list-gather view loop, against one eager op.

    python benchmarks/host_view_ops.py            # d = 1536 ranks (S1 run 13), best of 30
    python benchmarks/host_view_ops.py --ranks 768 --repeats 50

DeepSpeed 0.3-0.4 `partition_parameters.py` `_allgather_param` builds, before each per-module
all-gather, a list of d shard views: `flat_tensor.narrow(0, partition_size * i, partition_size)`
and `torch.distributed.get_rank(group=...)` per rank i (ShardMeter's `VIEW_OPS_PER_RANK`, costed
at the fitted host time per kernel launch). This times that loop on this machine's CPU (a view
makes no device call, so a CPU tensor costs the host what a CUDA one does) beside an eager
in-place add on a small CPU tensor (dispatch plus a tiny kernel, no CUDA launch), both in µs per
rank. Needs torch (the `train` extra); a one-process gloo group stands in for the data-parallel
group. Timings are wall-clock on a shared machine: record `uptime` beside them.
"""

from __future__ import annotations

import argparse
import os
import time
from collections.abc import Callable, Sequence

PARTITION = 4096  # elements per shard view; a view's host cost does not depend on it


def best_per_rank_us(loop: Callable[[], object], ranks: int, repeats: int) -> float:
    """Fastest of `repeats` runs of `loop`, in µs per rank."""
    best = float("inf")
    for _ in range(repeats):
        start = time.perf_counter()
        loop()
        best = min(best, time.perf_counter() - start)
    return 1e6 * best / ranks


def main(argv: Sequence[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--ranks", type=int, default=1536, help="data-parallel size d (default 1536)")
    ap.add_argument("--repeats", type=int, default=30, help="timed runs; the best is kept")
    args = ap.parse_args(argv)
    if args.ranks < 1 or args.repeats < 1:
        ap.error(f"--ranks {args.ranks} / --repeats {args.repeats}: both must be at least 1")
    import torch
    import torch.distributed as dist

    os.environ.setdefault("MASTER_ADDR", "127.0.0.1")
    os.environ.setdefault("MASTER_PORT", "29533")
    dist.init_process_group("gloo", rank=0, world_size=1)
    group = dist.new_group([0])
    d = args.ranks
    flat = torch.zeros(d * PARTITION, dtype=torch.float16)
    small = torch.zeros(16)

    def views() -> list[torch.Tensor]:  # the loop of `_allgather_param`
        partitions = []
        for i in range(d):
            partitions.append(flat.narrow(0, PARTITION * i, PARTITION))
            if i == dist.get_rank(group=group):
                pass
        return partitions

    def narrows() -> list[torch.Tensor]:
        return [flat.narrow(0, PARTITION * i, PARTITION) for i in range(d)]

    def eager_ops() -> None:
        for _ in range(d):
            small.add_(1.0)

    print(f"torch {torch.__version__}, d = {d}, best of {args.repeats}")
    print(f"{'loop':<42} {'µs per rank':>12}")
    for label, loop in (
        ("narrow + get_rank (DeepSpeed view loop)", views),
        ("narrow only", narrows),
        ("eager in-place add (CPU, 16 elements)", eager_ops),
    ):
        print(f"{label:<42} {best_per_rank_us(loop, d, args.repeats):>12.2f}")
    dist.destroy_process_group()
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
