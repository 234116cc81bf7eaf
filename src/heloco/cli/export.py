"""`heloco export`: a run's model in Hugging Face `save_pretrained` layout."""

from __future__ import annotations

import argparse
import sys
from pathlib import Path
from typing import Any

from heloco.cli.common import require_out


def add_parser(sub: Any) -> None:
    """Register `heloco export` and its flags on the subcommand parsers."""
    p = sub.add_parser(
        "export",
        help="write a run's model as a Hugging Face folder (config, safetensors, tokenizer)",
        description="Export the server's newest checkpoint of RUN_DIR (or --revision N) so "
        "that transformers' AutoModelForCausalLM.from_pretrained(OUT) loads it. TinyGPT is "
        "written as the equivalent GPT-2.",
    )
    p.add_argument("run_dir", type=Path, metavar="RUN_DIR", help="a `heloco serve`/`launch` --out")
    p.add_argument("--out", "--hf", dest="out", type=Path, metavar="FOLDER", help="new folder")
    p.add_argument("--revision", type=int, help="export this checkpointed revision")


def run(args: argparse.Namespace) -> int:
    """Run `heloco export`; bad input raises UserInputError (one line, exit 2)."""
    from heloco.export import export_run

    out = require_out(args)
    done, revision = export_run(args.run_dir, out, args.revision)
    tok = "with its tokenizer" if done.tokenizer else "without a tokenizer"
    print(
        f"heloco export: revision {revision} as {done.architecture} "
        f"({done.parameters:,} parameters) {tok} in {done.out_dir}",
        file=sys.stderr,
    )
    return 0
