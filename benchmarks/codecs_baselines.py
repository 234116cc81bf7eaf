"""Two small CPU studies on the 5-language corpus: what compressed payloads cost in loss, and
the Decoupled DiLoCo baseline beside HeLoCo, MLA and +ab, with and without failures.

    python benchmarks/codecs_baselines.py                 # both, 3 seeds (~20 min, 2 cores)
    python benchmarks/codecs_baselines.py --seeds 0 --divisor 16   # a smoke run
    shardmeter plan --topology two-clouds --payload topk:fraction=0.01 \\
        --quality-from benchmarks/results/codecs_baselines/payload-runs --no-progress

Both use the ``converged`` regime of ``heloco_paper.py`` (byte vocabulary, tiny model, inner
AdamW 1e-3, H = 10) at 1/``--divisor`` of its token budget, paces 1,1,1,2,2 (seconds per inner
step), one language per worker, seeds 0-2.

**Payloads** (sync DiLoCo and HeLoCo × dense, top-1%, top-10%, sign). The workers reach the
server over a simulated link: a round's communication is (push bytes + dispatch bytes) /
bandwidth, the bandwidth chosen so that a dense round trip (fp32 Δ up, fp32 θ down, whole wire
messages) takes 5 s, half a pace-1 worker's 10 s of compute. The dispatch stays fp32 (the
runtime sends θ dense), so a compressed payload at most halves the communication. Readings:
loss at the token budget (equal tokens) and at the earliest end time of the runs compared
(equal simulated time), each method against its own dense run; and the quality factor q =
tokens to the target loss / the dense sync run's (``shardmeter.quality``, the target the
lowest loss every run reaches), which ``shardmeter plan --quality-from`` reads.

**Baselines** (sync, heloco, mla, heloco+ab, decoupled) with no failures and with churn:
worker 0 killed at 15 s for 20 s and worker 3 at 40 s for 20 s (simulated; a killed round is
lost, the server evicts the worker, it rejoins with a fresh dispatch). Readings: loss at the
token budget, loss at the earliest end time, goodput (accepted rounds' compute / capacity).
"""

from __future__ import annotations

import argparse
import json
import math
import statistics
from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import torch

from heloco.codecs import ErrorFeedback
from heloco.config import load_config
from heloco.experiments import interpolate
from heloco.modelspec import build_model
from heloco.net import wire
from heloco.sim import RunResult, SimConfig, run_simulations
from shardmeter.paths import missing_shared_reason, shared_path
from shardmeter.quality import quality_factors

PRESET = "converged"
PACES = [1.0, 1.0, 1.0, 2.0, 2.0]
PAYLOADS = ("dense", "topk:fraction=0.01", "topk:fraction=0.1", "sign")
PAYLOAD_METHODS = ("sync", "heloco")
BASELINES = ("sync", "heloco", "mla", "heloco+ab", "decoupled")
CHURN = [{"worker": 0, "at": 15.0, "down": 20.0}, {"worker": 3, "at": 40.0, "down": 20.0}]
ROUND_TRIP_S = 5.0  # a dense fp32 round trip on the simulated link, seconds
OUT = Path(__file__).resolve().parent / "results" / "codecs_baselines"
SECRET = b"codecs-baselines-benchmark-secret-0123"


def base_values(data_dir: Path, divisor: int, seed: int) -> dict[str, Any]:
    """The preset at 1/divisor of its budget, with this study's paces and seed."""
    cfg = load_config(preset=PRESET)
    assert cfg.token_budget is not None
    return {
        "workers": len(PACES),
        "paces": PACES,
        "seed": seed,
        "data.data_dir": str(data_dir),
        "token_budget": cfg.token_budget // divisor,
        "eval_every": max(1, cfg.eval_every // divisor),
        "time_budget": "null",
    }


def push_bytes(cfg: SimConfig, payload: str) -> int:
    """Wire bytes of one push of ``payload`` (whole message) for the preset's model."""
    model = build_model(cfg.model, 256, max(cfg.inner.seq_len, cfg.data.seq_len), 0, "cpu")
    delta = {n: 1e-3 * torch.randn_like(p) for n, p in model.named_parameters()}
    params: Any = delta if payload == "dense" else ErrorFeedback(payload).compress(delta)
    body = {"worker": 0, "round_id": 1, "base_revision": 0, "steps": 10, "tokens": 2560}
    return wire.wire_bytes(wire.encode(wire.make("push", body, params), SECRET))


@dataclass(frozen=True)
class Row:
    study: str
    method: str
    variant: str  # payload or failure scenario
    seed: int
    loss_tokens: float
    loss_time: float
    sim_time: float
    goodput: float
    updates: int


def loss_at(result: RunResult, key: str, x: float) -> float:
    xs = [float(getattr(e, key)) for e in result.evals]
    return interpolate(xs, result.losses, x)


def readings(
    study: str, labels: Sequence[tuple[str, str]], seed: int, results: Sequence[Any]
) -> list[Row]:
    """Loss at the token budget and at the earliest end time of ``results``."""
    done = [r for r in results if isinstance(r, RunResult)]
    for r in results:
        if not isinstance(r, RunResult):
            raise r
    t_equal = min(r.summary.time for r in done)
    rows = []
    for (method, variant), r in zip(labels, done, strict=True):
        budget = r.config.token_budget or 0
        rows.append(
            Row(
                study,
                method,
                variant,
                seed,
                loss_at(r, "tokens", budget),
                loss_at(r, "time", t_equal),
                r.summary.time,
                r.summary.goodput or math.nan,
                r.summary.updates,
            )
        )
    return rows


def run_payloads(data_dir: Path, divisor: int, seed: int, out: Path) -> list[Row]:
    values = base_values(data_dir, divisor, seed)
    probe = load_config(preset=PRESET, overrides=values)
    dense = push_bytes(probe, "dense")
    bandwidth = 2 * dense / ROUND_TRIP_S  # bytes per simulated second
    labels, cfgs = [], []
    for payload in PAYLOADS:
        comm = (push_bytes(probe, payload) + dense) / bandwidth
        for method in PAYLOAD_METHODS:
            key = f"{method}-{payload.replace(':', '-').replace('=', '')}-s{seed}"
            over = values | {
                "method": method,
                "payload": payload,
                "comm_delays": [comm] * len(PACES),
                "out_dir": str(out / "payload-runs" / key),
            }
            cfgs.append(load_config(preset=PRESET, overrides=over))
            labels.append((method, payload))
    return readings("payloads", labels, seed, run_simulations(cfgs))


def run_baselines(data_dir: Path, divisor: int, seed: int, out: Path) -> list[Row]:
    values = base_values(data_dir, divisor, seed)
    rows: list[Row] = []
    for scenario, failures in (("none", []), ("churn", CHURN)):
        labels, cfgs = [], []
        for method in BASELINES:
            key = f"{method}-{scenario}-s{seed}"
            over = values | {
                "method": method,
                "failures": failures,
                "out_dir": str(out / "baseline-runs" / key),
            }
            cfgs.append(load_config(preset=PRESET, overrides=over))
            labels.append((method, scenario))
        rows += readings("baselines", labels, seed, run_simulations(cfgs))
    return rows


def mean_std(xs: Sequence[float]) -> str:
    if len(xs) == 1:
        return f"{xs[0]:.4f}"
    return f"{statistics.fmean(xs):.4f} ± {statistics.stdev(xs):.4f}"


def table(rows: Sequence[Row], study: str) -> list[str]:
    """Markdown: per (method, variant) the seed means; payloads add the loss change vs dense."""
    picked = [r for r in rows if r.study == study]
    keys = list(dict.fromkeys((r.method, r.variant) for r in picked))
    head = "| method | " + ("payload" if study == "payloads" else "failures") + " | seeds | "
    head += "loss @ tokens | loss @ equal time | sim time s | goodput | updates |"
    if study == "payloads":
        head += " Δ loss @ tokens vs dense | Δ loss @ time vs dense |"
    lines = [head, "|" + "---|" * (head.count("|") - 1)]
    for method, variant in keys:
        rs = [r for r in picked if (r.method, r.variant) == (method, variant)]
        cells = [
            method,
            variant,
            str(len(rs)),
            mean_std([r.loss_tokens for r in rs]),
            mean_std([r.loss_time for r in rs]),
            f"{statistics.fmean(r.sim_time for r in rs):.1f}",
            f"{statistics.fmean(r.goodput for r in rs):.3f}",
            f"{statistics.fmean(r.updates for r in rs):.1f}",
        ]
        if study == "payloads":
            base = {r.seed: r for r in picked if (r.method, r.variant) == (method, "dense")}
            dt = [100 * (r.loss_tokens / base[r.seed].loss_tokens - 1) for r in rs]
            de = [100 * (r.loss_time / base[r.seed].loss_time - 1) for r in rs]
            cells += [f"{statistics.fmean(dt):+.2f}%", f"{statistics.fmean(de):+.2f}%"]
        lines.append("| " + " | ".join(cells) + " |")
    return lines


def main(argv: Sequence[str] | None = None) -> int:
    p = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    p.add_argument("--seeds", default="0,1,2")
    p.add_argument("--divisor", type=int, default=4, help="1/divisor of the preset's tokens")
    p.add_argument("--study", default="payloads,baselines")
    p.add_argument("--out", type=Path, default=OUT)
    args = p.parse_args(argv)
    data_dir = shared_path("data", "multilingual")
    if data_dir is None:
        print(missing_shared_reason("data", "multilingual"))
        return 2
    seeds = [int(s) for s in args.seeds.split(",")]
    studies = args.study.split(",")
    rows: list[Row] = []
    for seed in seeds:
        if "payloads" in studies:
            rows += run_payloads(data_dir, args.divisor, seed, args.out)
            print(f"seed {seed}: payloads done", flush=True)
        if "baselines" in studies:
            rows += run_baselines(data_dir, args.divisor, seed, args.out)
            print(f"seed {seed}: baselines done", flush=True)
    args.out.mkdir(parents=True, exist_ok=True)
    (args.out / "rows.json").write_text(json.dumps([r.__dict__ for r in rows], indent=1))
    for study in studies:
        print(f"\n{study}\n" + "\n".join(table(rows, study)))
    if "payloads" in studies:
        q = quality_factors(args.out / "payload-runs")
        print(f"\nquality factors (target loss {q.target_loss:.4f}, reference {q.reference!r}):")
        for m in q.methods:
            print(
                f"  {m.method:<40} runs {m.runs}  tokens {m.tokens_to_target:,.0f}  q {m.factor:.3f}"
            )
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
