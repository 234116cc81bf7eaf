"""What a compressed payload costs per round, against the round's own compute, on this CPU.

    python benchmarks/transport.py --payload topk:fraction=0.01 --payload sign   # 100M, H=100
    python benchmarks/payload_cost.py --size 100 --inner-steps 100 --payload topk:fraction=0.01

The model is a TinyGPT (nanoGPT layout) of about ``--size`` million parameters: d_model 768,
n_head 12, vocabulary 8192, 128 positions, and as many layers as reach the size (12 layers:
97.8M at 100). Three measures, each the best of ``--reps`` (the machine is shared):

* the round's compute: ``H`` AdamW steps (fused) on batch 2 × 128 tokens, one step timed
  after a warm-up step, times H, on ``--threads`` torch threads (the figure the codec cost is
  compared with; no data loading, so the round is if anything shorter than a real one);
* the worker's encode: :meth:`heloco.codecs.ErrorFeedback.compress` of a Δ of the model's
  shapes (residual added, compressed, decoded once for the new residual), then the push built
  as wire frames (``wire.make`` + ``wire.encode``: views of the coded tensors, the HMAC tag);
* the server's decode: ``wire.decode`` (tag, sizes, top-k indices sorted and in range), the
  finiteness check of every tensor, and every tensor read once in fp32 through
  :class:`heloco.net.compress.Decoded`, as the outer step reads it.

The share printed is (encode + decode) / round compute; the tag's HMAC is in both (an fp32
push pays it too; its own row says how much). Bytes per push are the measured message against
ShardMeter's (``shardmeter.estimate.payload.push_bytes``: the payload's frames per tensor, the
JSON header's entries and envelope, the tag) for the same tensors.
"""

from __future__ import annotations

import argparse
import os
import time
from collections.abc import Callable
from dataclasses import dataclass

import torch

from heloco.codecs import ErrorFeedback, parse_payload
from heloco.model import ModelConfig, TinyGPT
from heloco.net import compress, wire
from shardmeter.estimate.payload import push_bytes
from shardmeter.specs.topology import PayloadSpec

SECRET = b"payload-cost-benchmark-secret-0123456789"
D_MODEL, N_HEAD, VOCAB, SEQ = 768, 12, 8192, 128
BATCH = 2


def model_config(size_m: float) -> ModelConfig:
    """The TinyGPT of about ``size_m`` million parameters (module docstring)."""
    per_block = 12 * D_MODEL * D_MODEL + 13 * D_MODEL
    fixed = 2 * VOCAB * D_MODEL + SEQ * D_MODEL + 2 * D_MODEL
    layers = max(1, round((size_m * 1e6 - fixed) / per_block))
    return ModelConfig(
        vocab_size=VOCAB, seq_len=SEQ, n_layer=layers, n_head=N_HEAD, d_model=D_MODEL
    )


def best_of(reps: int, fn: Callable[[], object]) -> float:
    """Fastest of ``reps`` calls of ``fn``, in seconds."""
    best = float("inf")
    for _ in range(reps):
        t0 = time.perf_counter()
        fn()
        best = min(best, time.perf_counter() - t0)
    return best


def step_seconds(model: TinyGPT, reps: int) -> float:
    """One AdamW step (forward, backward, fused update) on 2 × 128 tokens, best of ``reps``
    after one warm-up step."""
    opt = torch.optim.AdamW(model.parameters(), lr=1e-4, fused=True)
    x = torch.randint(0, VOCAB, (BATCH, SEQ))

    def step() -> None:
        logits = model(x)
        loss = torch.nn.functional.cross_entropy(logits.view(-1, VOCAB), x.view(-1))
        opt.zero_grad(set_to_none=True)
        loss.backward()
        opt.step()

    step()
    return best_of(reps, step)


@dataclass(frozen=True)
class PayloadRow:
    payload: str
    encode_s: float  # the worker: EF compress + frames + tag
    decode_s: float  # the server: verify + checks + every tensor read in fp32
    push_bytes: int  # the whole push message on the wire
    planned_bytes: float  # ShardMeter's payload model for the same parameters

    def share(self, round_s: float) -> float:
        return (self.encode_s + self.decode_s) / round_s


def measure(
    payload: str, delta: dict[str, torch.Tensor], cfg: ModelConfig, reps: int
) -> PayloadRow:
    """One payload's encode and decode per push, and its bytes (module docstring)."""
    n = sum(t.numel() for t in delta.values())
    body = {"worker": 0, "round_id": 1, "base_revision": 0, "steps": 100, "tokens": 25600}
    dense = payload in compress.CODECS
    ef = None if dense else ErrorFeedback(payload)
    frames: list[wire.Frame] = []

    def encode() -> None:
        params = delta if ef is None else ef.compress(delta)
        codec = payload if dense else "fp32"
        frames[:] = wire.encode(wire.make("push", body, params, codec), SECRET)  # type: ignore[arg-type]

    def decode() -> None:
        msg = wire.decode(frames, SECRET)
        for enc in msg.tensors.values():
            assert compress.is_finite(enc)
        view = compress.Decoded(msg.tensors)
        for name in view:
            view[name].sum()  # the outer step reads every element once

    encode_s = best_of(reps, encode)
    decode_s = best_of(reps, decode)
    tensors = [(name, tuple(t.shape)) for name, t in delta.items()]
    if dense:
        bits = {"fp32": 32, "bf16": 16, "int8": 8}[payload]
        planned = push_bytes(PayloadSpec(kind="dense"), tensors, bits)
    else:
        planned = push_bytes(parse_payload(payload), tensors)
    assert n == sum(t.numel() for t in delta.values())
    return PayloadRow(payload, encode_s, decode_s, wire.wire_bytes(frames), planned)


def run(size_m: float, payloads: list[str], inner_steps: int, reps: int, threads: int) -> None:
    """Print the round's compute and each payload's cost and share of it."""
    torch.set_num_threads(threads)
    torch.manual_seed(0)
    cfg = model_config(size_m)
    model = TinyGPT(cfg)
    n = sum(p.numel() for p in model.parameters())
    load = os.getloadavg()
    print(
        f"TinyGPT {n / 1e6:.1f}M parameters ({cfg.n_layer} layers, d {cfg.d_model}, vocab "
        f"{cfg.vocab_size}), {threads} torch thread(s), load {load[0]:.2f} {load[1]:.2f}"
    )
    step_s = step_seconds(model, reps)
    round_s = inner_steps * step_s
    print(
        f"one AdamW step on {BATCH}x{SEQ} tokens: {step_s:.3f} s; round of H={inner_steps}: {round_s:.1f} s"
    )
    delta = {name: 1e-3 * torch.randn_like(p) for name, p in model.named_parameters()}
    del model
    print(
        f"\n{'payload':<34} {'encode s':>9} {'decode s':>9} {'share':>7} | "
        f"{'push bytes':>12} {'planned':>12} {'diff':>7}"
    )
    for payload in payloads:
        row = measure(payload, delta, cfg, reps)
        print(
            f"{row.payload:<34} {row.encode_s:>9.3f} {row.decode_s:>9.3f} "
            f"{100 * row.share(round_s):>6.2f}% | {row.push_bytes:>12,} {row.planned_bytes:>12,.0f} "
            f"{100 * (row.push_bytes / row.planned_bytes - 1):>+6.2f}%",
            flush=True,
        )
    end = os.getloadavg()
    print(f"\nshare = (encode + decode) / round compute; load at the end {end[0]:.2f} {end[1]:.2f}")


DEFAULT_PAYLOADS = ["fp32", "int8", "topk:fraction=0.01", "topk:fraction=0.03", "sign"]


def main() -> None:
    parser = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    parser.add_argument("--size", type=float, default=100.0, help="millions of parameters")
    parser.add_argument("--inner-steps", type=int, default=100, help="H")
    parser.add_argument(
        "--payload", action="append", help="a payload or fp32/bf16/int8 (repeat; default: five)"
    )
    parser.add_argument("--reps", type=int, default=2)
    parser.add_argument("--threads", type=int, default=1)
    args = parser.parse_args()
    run(args.size, args.payload or DEFAULT_PAYLOADS, args.inner_steps, args.reps, args.threads)


if __name__ == "__main__":
    main()
