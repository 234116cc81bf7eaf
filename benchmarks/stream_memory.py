"""Streamed data keeps a worker's memory bounded: a synthetic 1 GB corpus through one worker.

Writes a synthetic multilingual corpus of ``--gb`` gigabytes to a temporary folder (JSONL and
Parquet shards, 3 languages, never in the repository), then, in a fresh worker process:

1. builds the run's data in stream mode (validation heads, lazy per-worker streams);
2. trains a TinyGPT for ``--steps`` inner steps through the library's own worker loop;
3. reads the *whole* corpus through the worker's packed sampler (every record tokenized and
   packed into seq_len windows), to show memory stays flat over the full gigabyte.

It prints the peak resident memory (``ru_maxrss``) after each phase, and the tokens read.
The issue's bar: under 1 GB for a corpus of at least 1 GB. Run:

    .venv/bin/python benchmarks/stream_memory.py            # 1 GB, about 5 minutes on 2 cores
    .venv/bin/python benchmarks/stream_memory.py --gb 0.05  # a quick look
"""

from __future__ import annotations

import argparse
import json
import os
import resource
import subprocess
import sys
import tempfile
import time
from pathlib import Path

import numpy as np

LANGS = ("aa", "bb", "cc")
RECORD_CHARS = (200, 4000)


def write_corpus(root: Path, total_bytes: int, seed: int = 0) -> int:
    """Random-word records per language: a JSONL shard and a Parquet shard, round-robin,
    until ``total_bytes`` are on disk. Returns the bytes written."""
    import pyarrow as pa
    import pyarrow.parquet as pq

    rng = np.random.default_rng(seed)
    words = {lang: [f"{lang}{i:x}" for i in range(4000)] for lang in LANGS}
    written, shard = 0, 0
    for lang in LANGS:
        (root / lang).mkdir(parents=True)
    while written < total_bytes:
        for lang in LANGS:
            n = int(rng.integers(*RECORD_CHARS) // 6)
            recs = [
                " ".join(words[lang][k] for k in rng.integers(0, 4000, size=n)) for _ in range(2000)
            ]
            if shard % 2 == 0:
                path = root / lang / f"part-{shard:05d}.jsonl"
                path.write_text("".join(json.dumps({"text": r}) + "\n" for r in recs))
            else:
                path = root / lang / f"part-{shard:05d}.parquet"
                pq.write_table(pa.table({"text": recs}), path, compression="none")
            written += path.stat().st_size
        shard += 1
    return written


def peak_rss_mb() -> float:
    """Peak resident set size of this process in MB (Linux ru_maxrss is in KiB)."""
    return resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024


def worker_phase(root: Path, steps: int, seq_len: int, batch: int) -> dict[str, float]:
    """The measured process: build data, train, then stream the whole corpus."""
    import torch

    from heloco.data import build_data, parse_data_config
    from heloco.model import TinyGPT, preset_config
    from heloco.worker import InnerConfig, Worker

    torch.set_num_threads(1)
    out: dict[str, float] = {"after_import_mb": peak_rss_mb()}
    cfg = parse_data_config(
        {"data_dir": str(root), "sampling": "stream", "seq_len": seq_len, "assignment": "iid"}
    )
    t0 = time.perf_counter()
    data = build_data(cfg, 1, 0)
    out["build_s"] = time.perf_counter() - t0
    out["after_build_mb"] = peak_rss_mb()
    model = TinyGPT(preset_config("tiny", vocab_size=256, seq_len=seq_len), seed=0)
    inner = InnerConfig(lr=1e-3, batch_size=batch, seq_len=seq_len)
    worker = Worker(0, model, data.streams[0], inner, seed=0)
    start = {n: p.detach().clone() for n, p in model.named_parameters()}
    t0 = time.perf_counter()
    result = worker.run_round(start, steps, 0)
    out["train_s"] = time.perf_counter() - t0
    out["train_loss"] = result.mean_loss
    out["after_train_mb"] = peak_rss_mb()
    # Now read everything: one pass over every source (the sampler wraps at the end).
    sampler = data.streams[0].sampler(256, seq_len, seed=1)
    t0 = time.perf_counter()
    tokens = 0
    while True:
        sampler.next()
        tokens += 256 * seq_len
        state = sampler.state_dict()["meta"]["cursors"]
        if len(state) == len(LANGS) and all(c["pos"]["epoch"] >= 1 for c in state.values()):
            break
    out["stream_s"] = time.perf_counter() - t0
    out["streamed_tokens"] = float(tokens)
    out["after_stream_mb"] = peak_rss_mb()
    return out


def main() -> int:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--gb", type=float, default=1.0, help="corpus size on disk (GB)")
    p.add_argument("--steps", type=int, default=20, help="inner training steps")
    p.add_argument("--seq-len", type=int, default=128)
    p.add_argument("--batch", type=int, default=8)
    p.add_argument("--phase", type=Path, help=argparse.SUPPRESS)  # the measured child
    args = p.parse_args()
    if args.phase is not None:
        print(json.dumps(worker_phase(args.phase, args.steps, args.seq_len, args.batch)))
        return 0
    with tempfile.TemporaryDirectory(prefix="heloco-stream-", dir="/tmp") as tmp:
        root = Path(tmp)
        t0 = time.perf_counter()
        size = write_corpus(root, int(args.gb * 1e9))
        print(f"corpus: {size / 1e9:.2f} GB in {root} ({time.perf_counter() - t0:.0f} s)")
        cmd = [sys.executable, __file__, "--phase", str(root), "--steps", str(args.steps)]
        cmd += ["--seq-len", str(args.seq_len), "--batch", str(args.batch)]
        res = json.loads(subprocess.run(cmd, check=True, capture_output=True, text=True).stdout)
    load = os.getloadavg()[0]
    print(f"load average (1 min) at the end: {load:.1f}")
    print(f"{'phase':<28}{'peak RSS (MB)':>14}{'seconds':>10}")
    print(f"{'import torch + heloco':<28}{res['after_import_mb']:>14.0f}{'':>10}")
    print(f"{'build data (stream mode)':<28}{res['after_build_mb']:>14.0f}{res['build_s']:>10.1f}")
    print(f"{f'train {args.steps} steps':<28}{res['after_train_mb']:>14.0f}{res['train_s']:>10.1f}")
    gtok = res["streamed_tokens"] / 1e9
    print(
        f"{f'stream all ({gtok:.2f} G tokens)':<28}{res['after_stream_mb']:>14.0f}{res['stream_s']:>10.1f}"
    )
    verdict = "PASS" if res["after_stream_mb"] < 1024 and size >= 1e9 else "(bar needs >= 1 GB)"
    print(f"peak worker memory {res['after_stream_mb']:.0f} MB for {size / 1e9:.2f} GB: {verdict}")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
