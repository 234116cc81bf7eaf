"""Loopback transport benchmark of ``heloco serve`` / ``heloco work``: MB/s, updates/s, comm share.

    python benchmarks/transport.py                  # 10M and 100M parameters, fp32/bf16/int8
    python benchmarks/transport.py --sizes 10 --reps 5
    python benchmarks/transport.py --skip-round     # no real-training comm-share table

Table 1: a server process (the real endpoint, coordinator, ``Server`` and async Nesterov outer
step) holds a model of N fp32 parameters in 8 tensors; this process pulls it (fp32 download)
and pushes a pseudo-gradient (fp32, bf16 or blockwise int8 upload). MB/s = wire bytes of the
message / seconds of the request, end to end: encode, HMAC, copy through loopback TCP, verify,
decode, finiteness check, and (push) the outer update. updates/s = pushes applied per second.
Table 2: real rounds of TinyGPT presets (H inner steps, pull + push) and the share of a
worker's round spent communicating on loopback. Loopback only; nothing leaves 127.0.0.1.
"""

from __future__ import annotations

import argparse
import multiprocessing as mp
import statistics
import tempfile
import time
from dataclasses import dataclass
from pathlib import Path

import torch

from heloco.net import auth, compress
from heloco.net.client import Client, ClientConfig
from heloco.net.coordinator import Budget, Coordinator
from heloco.net.endpoint import Endpoint, EndpointConfig
from heloco.net.session import Session
from heloco.net.worker_loop import NetWorker, WorkerOptions
from heloco.outer import OuterConfig, build_optimizer
from heloco.server import Server, ServerConfig
from heloco.sim import parse_sim_config

N_TENSORS = 8
MB = 1e6


def fake_params(n_params: int) -> dict[str, torch.Tensor]:
    """N fp32 parameters split over ``N_TENSORS`` tensors of about equal size."""
    per, extra = divmod(n_params, N_TENSORS)
    return {f"layer{i}.weight": torch.zeros(per + (i < extra)) for i in range(N_TENSORS)}


def serve_fake(n_params: int, secret: bytes, address: mp.Queue) -> None:
    """Server process: a real endpoint in front of a Server with async Nesterov."""
    torch.set_num_threads(1)
    init = fake_params(n_params)
    opt = build_optimizer("async-nesterov", init, OuterConfig(), 1)
    coord = Coordinator(Server(init, opt, ServerConfig(n_workers=1, inner_steps=1)), Budget())
    ep = Endpoint(coord, secret, EndpointConfig(bind="tcp://127.0.0.1:0", max_bytes=2 << 30))
    address.put(ep.open())
    ep.serve()


@dataclass(frozen=True)
class Row:
    """Pull/push sizes (MB) and throughput (MB/s) of one model size and codec over loopback."""

    params_m: int
    codec: str
    pull_mb: float
    pull_mbs: float
    push_mb: float
    push_mbs: float
    updates_per_s: float


def bench_size(n_params: int, codecs: list[str], reps: int) -> list[Row]:
    """Median pull and push time of ``n_params`` fp32 parameters per codec (``reps`` each) against
    a server process over loopback."""
    secret = auth.new_secret()
    ctx = mp.get_context("spawn")
    q: mp.Queue = ctx.Queue()
    proc = ctx.Process(target=serve_fake, args=(n_params, secret, q), daemon=True)
    proc.start()
    try:
        address = q.get(timeout=120)
        client = Client(
            ClientConfig(address, timeout_s=600, deadline_s=600, max_bytes=2 << 30), secret
        )
        me = {"worker": 0, "incarnation": "bench"}
        client.request("hello", me)
        rows = []
        gen = torch.Generator().manual_seed(0)
        delta = {
            k: torch.randn(v.shape, generator=gen) * 1e-3 for k, v in fake_params(n_params).items()
        }
        for codec in codecs:
            pulls, pushes, pull_bytes, push_bytes = [], [], 0, 0
            for _ in range(reps):
                before = client.traffic.recv_bytes
                t0 = time.perf_counter()
                d = client.request("pull", me)
                d.params()
                pulls.append(time.perf_counter() - t0)
                pull_bytes = client.traffic.recv_bytes - before
                body = me | {
                    "round_id": d.body["round_id"],
                    "base_revision": d.body["revision"],
                    "steps": 1,
                    "tokens": 1,
                    "mean_loss": 0.0,
                }
                before = client.traffic.sent_bytes
                t0 = time.perf_counter()
                ack = client.request("push", body, delta, codec=compress.check_codec(codec))
                pushes.append(time.perf_counter() - t0)
                push_bytes = client.traffic.sent_bytes - before
                assert ack.type == "ack", ack.body
            pull_s, push_s = statistics.median(pulls), statistics.median(pushes)
            rows.append(
                Row(
                    n_params // 1_000_000,
                    codec,
                    pull_bytes / MB,
                    pull_bytes / MB / pull_s,
                    push_bytes / MB,
                    push_bytes / MB / push_s,
                    1.0 / push_s,
                )
            )
        client.close()
        return rows
    finally:
        proc.kill()
        proc.join(10)


@dataclass(frozen=True)
class RoundRow:
    """Seconds computing vs seconds in pull + push over the rounds of one real training run."""

    preset: str
    params_m: float
    codec: str
    rounds: int
    compute_s: float
    comm_s: float

    @property
    def share(self) -> float:
        """Fraction of the round's wall-clock spent communicating (0-1)."""
        return self.comm_s / (self.comm_s + self.compute_s)


def bench_round(preset: str, codec: str, inner_steps: int, rounds: int) -> RoundRow:
    """Real training rounds over loopback: seconds computing vs seconds in pull + push."""
    cfg = parse_sim_config(
        {
            "method": "async-nesterov",
            "workers": 1,
            "inner_steps": inner_steps,
            "model": preset,
            "token_budget": rounds * inner_steps * 2 * 128,
            "eval_windows": 1,
            "eval_batch_size": 8,
            "data": {"synthetic_chars_per_language": 20_000, "val_chars_per_language": 2000},
            "inner": {"batch_size": 2, "seq_len": 128, "total_steps": 1000},
        }
    )
    secret = auth.new_secret()
    with tempfile.TemporaryDirectory() as tmp:
        session = Session(cfg, secret, EndpointConfig(drain_s=1.0), out_dir=Path(tmp))
        server, address = session.serve_in_thread(timeout_s=60)
        report = NetWorker(
            ClientConfig(address, timeout_s=120, deadline_s=300),
            secret,
            WorkerOptions(worker=0, codec=compress.check_codec(codec)),
        ).run()
        server.join(60)
    n = sum(p.numel() for p in session.side.model.parameters()) / 1e6
    return RoundRow(preset, n, codec, report.rounds, report.compute_s, report.comm_s)


def main() -> None:
    """Print the transport tables (payload sizes, MB/s, comm share of a round)."""
    parser = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    parser.add_argument("--sizes", default="10,100", help="millions of parameters, comma-separated")
    parser.add_argument("--codecs", default="fp32,bf16,int8")
    parser.add_argument("--reps", type=int, default=3)
    parser.add_argument("--skip-round", action="store_true")
    parser.add_argument("--round-presets", default="tiny,small")
    parser.add_argument("--inner-steps", type=int, default=20)
    args = parser.parse_args()
    codecs = args.codecs.split(",")
    print(f"torch {torch.__version__}, {torch.get_num_threads()} threads; loopback 127.0.0.1\n")
    print(
        f"{'params':>7} {'codec':>5} | {'pull MB':>8} {'pull MB/s':>9} | {'push MB':>8} "
        f"{'push MB/s':>9} | {'updates/s':>9}"
    )
    for size in (int(s) for s in args.sizes.split(",")):
        for r in bench_size(size * 1_000_000, codecs, args.reps):
            print(
                f"{r.params_m:>6}M {r.codec:>5} | {r.pull_mb:>8.1f} {r.pull_mbs:>9.1f} | "
                f"{r.push_mb:>8.1f} {r.push_mbs:>9.1f} | {r.updates_per_s:>9.2f}",
                flush=True,
            )
    if args.skip_round:
        return
    print(
        f"\nreal rounds (H={args.inner_steps}, batch 2x128, CPU): share of the round spent communicating"
    )
    print(
        f"{'preset':>6} {'params':>7} {'codec':>5} {'rounds':>6} | {'compute s':>9} {'comm s':>7} | {'comm share':>10}"
    )
    for preset in args.round_presets.split(","):
        for codec in ("fp32", "int8"):
            rr = bench_round(preset, codec, args.inner_steps, 3)
            print(
                f"{rr.preset:>6} {rr.params_m:>6.2f}M {rr.codec:>5} {rr.rounds:>6} | "
                f"{rr.compute_s:>9.2f} {rr.comm_s:>7.2f} | {100 * rr.share:>9.1f}%",
                flush=True,
            )


if __name__ == "__main__":
    main()
