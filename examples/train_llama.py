"""Train a Llama-architecture model with HeLoCo across 3 local workers, export it, generate.

What it does, end to end (everything local, nothing downloaded):

1. converts the shared multilingual corpus (``$SHARED_DIR/data/multilingual/*.txt``, one
   language per file) into streamed shards in a temporary folder: one folder per language,
   half of its paragraphs as JSONL and half as Parquet (never copied into the repository);
2. writes a Llama ``config.json`` (about 20M parameters with ``--size 20m``, byte vocabulary);
3. trains it with ``heloco launch``: a server and 3 worker processes on this machine, each
   worker bound to one language folder, reading its shards as a stream;
4. exports the server's final model with ``heloco export`` (Hugging Face layout) and
   generates a few tokens from it with ``transformers``.

Run it from the repository root::

    SHARED_DIR=../shared .venv/bin/python examples/train_llama.py              # ~20M params
    SHARED_DIR=../shared .venv/bin/python examples/train_llama.py --size tiny  # a 1-min check

On a GPU add ``--device cuda``; on several hosts see docs/train-your-own-model.md.
"""

from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys
import tempfile
from pathlib import Path

SIZES = {  # hidden, intermediate, layers, heads, kv heads
    "tiny": (64, 176, 2, 4, 2),
    "20m": (448, 1216, 8, 8, 4),
}
LANGUAGES = ("de", "en", "fr")


def convert(src: Path, out: Path, languages: tuple[str, ...]) -> Path:
    """Each language's paragraphs -> ``out/<lang>/part-0.jsonl`` and ``part-1.parquet``."""
    import pyarrow as pa
    import pyarrow.parquet as pq

    for lang in languages:
        paragraphs = [p for p in (src / f"{lang}.txt").read_text().split("\n") if p.strip()]
        folder = out / lang
        folder.mkdir(parents=True)
        half = len(paragraphs) // 2
        with (folder / "part-0.jsonl").open("w") as fh:
            fh.writelines(json.dumps({"text": p}) + "\n" for p in paragraphs[:half])
        pq.write_table(pa.table({"text": paragraphs[half:]}), folder / "part-1.parquet")
    return out


def llama_config(folder: Path, size: str, seq_len: int) -> Path:
    """A Llama config.json over the byte vocabulary (256 ids)."""
    from transformers import LlamaConfig

    hidden, inter, layers, heads, kv = SIZES[size]
    LlamaConfig(
        vocab_size=256,
        hidden_size=hidden,
        intermediate_size=inter,
        num_hidden_layers=layers,
        num_attention_heads=heads,
        num_key_value_heads=kv,
        max_position_embeddings=seq_len,
        bos_token_id=None,
        eos_token_id=None,
        tie_word_embeddings=False,
    ).save_pretrained(folder)
    return folder


def run_config(path: Path, model: Path, shards: Path, args: argparse.Namespace) -> Path:
    """The HeLoCo run: 3 workers, one language each, streamed shards, HeLoCo's method."""
    path.write_text(
        f"""preset = "default"
method = "heloco"
workers = 3
inner_steps = {args.inner_steps}
token_budget = {args.token_budget}
eval_every = {args.token_budget // 4}
eval_windows = 8
device = "{args.device}"

[model]
hf = "{model}"

[data]
data_dir = "{shards}"
sampling = "stream"
text_field = "text"
assignment = "language"
seq_len = {args.seq_len}
val_chars_per_language = 20000

[inner]
lr = {args.lr}
min_lr = {args.lr / 10}
warmup_steps = 4
total_steps = {args.token_budget // (args.batch_size * args.seq_len) // 3 + 1}
batch_size = {args.batch_size}
seq_len = {args.seq_len}
"""
    )
    return path


def heloco(*argv: str) -> None:
    """Run a `heloco` command of this interpreter, failing loudly."""
    cmd = [sys.executable, "-m", "heloco", *argv]
    print("+", " ".join(cmd), flush=True)
    subprocess.run(cmd, check=True)


def generate(folder: Path, prompt: str, tokens: int) -> str:
    """Greedy continuation of ``prompt`` by the exported model (transformers only)."""
    import torch
    from transformers import AutoModelForCausalLM, AutoTokenizer

    model = AutoModelForCausalLM.from_pretrained(folder).eval()
    tok = AutoTokenizer.from_pretrained(folder)
    ids = tok(prompt, return_tensors="pt")["input_ids"]
    with torch.no_grad():
        out = model.generate(ids, max_new_tokens=tokens, do_sample=False, pad_token_id=0)
    return str(tok.decode(out[0]))


def main() -> int:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--size", choices=sorted(SIZES), default="20m")
    p.add_argument("--token-budget", type=int, default=None, help="default: by size")
    p.add_argument("--inner-steps", type=int, default=5, help="H")
    p.add_argument("--batch-size", type=int, default=4)
    p.add_argument("--seq-len", type=int, default=128)
    p.add_argument("--lr", type=float, default=1e-3)
    p.add_argument("--device", default="cpu")
    p.add_argument("--out", type=Path, help="keep the run and export here (default: a temp dir)")
    args = p.parse_args()
    if args.token_budget is None:
        args.token_budget = 30_720 if args.size == "20m" else 20_480
    shared = Path(os.environ.get("SHARED_DIR", "../shared")) / "data" / "multilingual"
    if not shared.is_dir():
        print(f"no corpus at {shared}: set SHARED_DIR", file=sys.stderr)
        return 2
    os.environ.setdefault("HF_HUB_OFFLINE", "1")
    with tempfile.TemporaryDirectory(prefix="heloco-example-") as tmp_name:
        tmp = Path(tmp_name)
        out = args.out or tmp / "out"
        shards = convert(shared, tmp / "shards", LANGUAGES)
        model = llama_config(out / "llama", args.size, args.seq_len)  # kept with the run
        config = run_config(tmp / "run.toml", model, shards, args)
        run = out / "run"
        heloco("launch", "--config", str(config), "--workers", "3", "--out", str(run))
        heloco("export", str(run), "--out", str(out / "hf"))
        summary = json.loads((run / "summary.json").read_text())
        evals = [json.loads(x) for x in (run / "events.jsonl").read_text().splitlines()]
        losses = [round(e["loss"], 3) for e in evals if e.get("type") == "eval"]
        print(f"validation loss per evaluation: {losses}")
        print(f"{summary['updates']} updates, {summary['tokens']} training tokens")
        text = generate(out / "hf", "The ", 40)
        print(f"generated: {text!r}")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
