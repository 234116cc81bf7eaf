"""A 1B-parameter model served for one full round: the server's peak memory and time per update.

    python benchmarks/server_scale.py                 # 1.01B parameters, int8 push, CURVE on
    python benchmarks/server_scale.py --codec bf16 --layers 2 --shards 2

The server is `heloco serve`'s own stack (endpoint with CURVE keys and HMAC, coordinator,
``Server``, async Nesterov outer step, a checkpoint folder) in its own process, over the
tensors of a GPT-style model: d = 2048, FFN 8192, vocabulary 50304, 18 layers (1.01B fp32
parameters, 4.04 GB). This process is one worker (``NetLink``): hello, pull the model (fp32),
push a pseudo-gradient (``--codec``), pull the updated model; then the server is stopped and
writes its final checkpoint. The server reports its peak resident memory (``VmHWM``, which
includes that checkpoint write) against the issue's budget, 2.5 x the fp32 parameter bytes
+ 1 GB, and the seconds of its outer update (the ``Server`` applying the push).

Memory of the server: θ and the momentum (2x the parameters), the push in its wire form (int8:
0.25x), one decoded tensor at a time (the largest, the embedding), nothing more: θ is sent
without a copy, and checkpoints are written tensor by tensor from memory. Needs about 16 GB
free: check ``free -g`` first on a shared machine.
"""

from __future__ import annotations

import argparse
import multiprocessing as mp
import os
import tempfile
import threading
import time
from dataclasses import dataclass
from functools import partial
from pathlib import Path
from typing import Any

import torch

from heloco.net import auth, compress
from heloco.net.client import ClientConfig
from heloco.net.coordinator import Budget, Coordinator
from heloco.net.endpoint import Endpoint, EndpointConfig
from heloco.net.keys import ClientKeys, ServerKeys, new_keypair
from heloco.net.link import NetLink
from heloco.outer import OuterConfig, build_optimizer
from heloco.server import Server, ServerConfig, UpdateRecord
from heloco.types import Params, RoundResult

GB = 1e9


@dataclass(frozen=True)
class Layout:
    """A GPT-style model's tensor shapes: embedding, per layer 4 attention and 2 MLP
    matrices and 2 norms, a final norm (head tied to the embedding)."""

    d: int = 2048
    ffn: int = 8192
    vocab: int = 50304
    layers: int = 18

    def shapes(self) -> dict[str, tuple[int, ...]]:
        """Tensor name -> shape."""
        out: dict[str, tuple[int, ...]] = {"embed.weight": (self.vocab, self.d)}
        for i in range(self.layers):
            for m in ("q", "k", "v", "o"):
                out[f"layers.{i}.attn.{m}.weight"] = (self.d, self.d)
            out[f"layers.{i}.mlp.up.weight"] = (self.ffn, self.d)
            out[f"layers.{i}.mlp.down.weight"] = (self.d, self.ffn)
            out[f"layers.{i}.norm1.weight"] = (self.d,)
            out[f"layers.{i}.norm2.weight"] = (self.d,)
        out["norm.weight"] = (self.d,)
        return out

    @property
    def n_params(self) -> int:
        """Parameters in the layout."""
        return sum(int(torch.Size(s).numel()) for s in self.shapes().values())


def peak_rss_gb() -> float:
    """This process's peak resident memory (``VmHWM``) in GB."""
    for line in Path("/proc/self/status").read_text().splitlines():
        if line.startswith("VmHWM:"):
            return int(line.split()[1]) * 1024 / GB
    return float("nan")


class TimedServer(Server):
    """A ``Server`` that records how long each outer update takes (seconds)."""

    update_s: list[float]

    def _apply(self, items: list[tuple[RoundResult, int]]) -> UpdateRecord:
        start = time.perf_counter()
        record = super()._apply(items)
        self.update_s = [*getattr(self, "update_s", []), time.perf_counter() - start]
        return record


def serve(
    layout: Layout, secret: bytes, keys: ServerKeys, shards: int, folder: str, q: Any
) -> None:
    """Server process: builds θ in place (no second copy), serves, reports its memory."""
    torch.set_num_threads(1)
    init: Params = {k: torch.zeros(s) for k, s in layout.shapes().items()}
    opt = build_optimizer("async-nesterov", init, OuterConfig(), 1)
    server = TimedServer(init, opt, ServerConfig(n_workers=1, inner_steps=1), copy_init=False)
    del init
    built = peak_rss_gb()
    cfg = EndpointConfig(
        bind="tcp://127.0.0.1:0",
        max_bytes=16 << 30,
        keys=keys,
        shards=shards,
        checkpoint_dir=Path(folder),
    )
    endpoint = Endpoint(partial(Coordinator, server, Budget()), secret, cfg)
    address = endpoint.open()
    thread = threading.Thread(target=endpoint.serve)
    thread.start()
    q.put(address)
    assert q.get() == "stop"
    endpoint.stop.set()
    thread.join()  # the final checkpoint is written
    q.put({"built_gb": built, "peak_gb": peak_rss_gb(), "update_s": server.update_s})


def main() -> None:
    """Serve one round of a 1B model and print the server's peak memory against the budget."""
    parser = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    parser.add_argument("--layers", type=int, default=Layout.layers)
    parser.add_argument("--codec", default="int8", choices=compress.CODECS)
    parser.add_argument("--shards", type=int, default=1)
    args = parser.parse_args()
    layout = Layout(layers=args.layers)
    n = layout.n_params
    param_gb = 4 * n / GB
    budget = 2.5 * param_gb + 1.0
    print(
        f"{n / 1e9:.2f}B parameters ({param_gb:.2f} GB fp32), push {args.codec}, "
        f"{args.shards} shard(s), CURVE on; load average {os.getloadavg()[0]:.2f}"
    )
    server_pair, worker_pair = new_keypair(), new_keypair()
    server_keys = ServerKeys(server_pair, {worker_pair.public: "worker0"})
    secret = auth.new_secret()
    ctx = mp.get_context("spawn")
    q: Any = ctx.Queue()
    with tempfile.TemporaryDirectory() as folder:
        proc = ctx.Process(target=serve, args=(layout, secret, server_keys, args.shards, folder, q))
        proc.start()
        t0 = time.perf_counter()
        address = q.get(timeout=900)
        print(f"server up in {time.perf_counter() - t0:.1f} s at {address}")
        keys = ClientKeys(server_pair.public, worker_pair)
        cfg = ClientConfig(address, timeout_s=900, deadline_s=900, max_bytes=16 << 30, keys=keys)
        link = NetLink(cfg, secret, 0, compress.check_codec(args.codec))
        link.join()
        times = {}
        t0 = time.perf_counter()
        d = link.pull()
        times["pull"] = time.perf_counter() - t0
        assert d is not None
        revision, round_id = d.revision, d.round_id
        del d
        gen = torch.Generator().manual_seed(0)
        delta = {k: torch.randn(s, generator=gen) * 1e-3 for k, s in layout.shapes().items()}
        result = RoundResult(0, delta, 1, 1, 0.0, revision, round_id)
        t0 = time.perf_counter()
        outcome = link.push(result, 1.0)
        times["push"] = time.perf_counter() - t0
        assert outcome.accepted, outcome
        del delta, result
        t0 = time.perf_counter()
        assert link.pull() is not None
        times["pull again"] = time.perf_counter() - t0
        link.close()
        t0 = time.perf_counter()
        q.put("stop")
        report = q.get(timeout=900)
        times["stop + final checkpoint"] = time.perf_counter() - t0
        proc.join(60)
        written = sum(f.stat().st_size for f in Path(folder).rglob("*") if f.is_file())
    print(", ".join(f"{k} {v:.1f} s" for k, v in times.items()))
    print(f"outer update (server): {', '.join(f'{s:.2f}' for s in report['update_s'])} s")
    print(f"checkpoint written: {written / GB:.2f} GB")
    print(
        f"server memory: {report['built_gb']:.2f} GB once built (theta + momentum), peak "
        f"{report['peak_gb']:.2f} GB = {report['peak_gb'] / param_gb:.2f} x parameters"
    )
    verdict = "within" if report["peak_gb"] <= budget else "OVER"
    print(f"budget 2.5 x {param_gb:.2f} GB + 1 GB = {budget:.2f} GB: {verdict}")
    print("load average {:.2f}, {:.2f}, {:.2f}".format(*os.getloadavg()))


if __name__ == "__main__":
    main()
