"""Export a run's model in Hugging Face ``save_pretrained`` layout (``heloco export``).

The parameters come from a server checkpoint of the run folder (the newest, or the one of a
given revision; ``heloco serve``/``launch`` write them under ``RUN_DIR/checkpoints``) or from
any parameter map (:func:`export_params`, e.g. ``run_simulation(cfg).params``). The folder
gets ``config.json``, ``model.safetensors`` and, when the run's tokenizer is known, the
tokenizer files, so ``AutoModelForCausalLM.from_pretrained(OUT)`` and
``AutoTokenizer.from_pretrained(OUT)`` load it with nothing else.

- Hugging Face architectures are written as they are;
- TinyGPT is written as the equivalent ``GPT2LMHeadModel`` (:func:`heloco.hf.gpt2_config`,
  :func:`heloco.hf.tinygpt_to_gpt2`); the logits agree to float rounding;
- a factory model is exported when it is a ``transformers.PreTrainedModel``.
"""

from __future__ import annotations

import json
import shutil
import tempfile
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import torch
from torch import nn

from heloco.config import ModelChoice, RunConfig, parse_run_config
from heloco.data.build import DataConfig
from heloco.data.tokenizer import ByteTokenizer, FileTokenizer, Tokenizer, to_hf
from heloco.model import ModelConfig
from heloco.modelspec import HFModel, build_model, describe
from heloco.net import checkpoint
from heloco.runfolder import CONFIG_FILE
from heloco.sim.build import ModelSetup
from heloco.types import Params
from shardmeter.errors import UserInputError

PARAMS_PREFIX = "params/"


@dataclass(frozen=True)
class Exported:
    """What :func:`export_params` wrote."""

    out_dir: Path
    architecture: str
    parameters: int
    tokenizer: bool


def read_run(run_dir: Path) -> RunConfig:
    """The run config saved in ``run_dir/config.json``."""
    path = run_dir / CONFIG_FILE
    if not run_dir.is_dir() or not path.is_file():
        raise UserInputError("RUN_DIR", str(run_dir), f"a run folder holding {CONFIG_FILE}")
    try:
        values = json.loads(path.read_text(encoding="utf-8"))
    except ValueError as exc:
        raise UserInputError("RUN_DIR", str(path), f"valid JSON ({exc})") from None
    return parse_run_config(values)


def checkpoint_params(run_dir: Path, revision: int | None = None) -> tuple[Params, int]:
    """The server parameters of the newest valid checkpoint (or the newest of ``revision``)
    and its revision. A damaged checkpoint is skipped for an older one."""
    root = run_dir / "checkpoints"
    found = checkpoint.checkpoints(root)
    if not found:
        raise UserInputError(
            "RUN_DIR",
            str(run_dir),
            "a run of `heloco serve`/`launch` with checkpoints (RUN_DIR/checkpoints)",
        )
    wanted = f"{checkpoint.PREFIX}{revision:09d}" if revision is not None else checkpoint.PREFIX
    candidates = [p for p in reversed(found) if p.name.startswith(wanted)]
    if not candidates:
        have = sorted({int(p.name[len(checkpoint.PREFIX) :].split("-")[0]) for p in found})
        raise UserInputError("--revision", revision, f"one of the checkpointed revisions {have}")
    problems = []
    for path in candidates:
        try:
            ck = checkpoint.load(path)
        except checkpoint.CheckpointError as exc:
            problems.append(str(exc))
            continue
        params = {
            k.removeprefix(PARAMS_PREFIX): v
            for k, v in ck.tensors.items()
            if k.startswith(PARAMS_PREFIX)
        }
        return params, int(ck.state["server"]["revision"])
    raise UserInputError("RUN_DIR", str(root), f"a readable checkpoint ({problems[0]})")


def run_tokenizer(data: DataConfig) -> Tokenizer | None:
    """The run's tokenizer when it can be had without the corpus (byte, a file); a trained
    BPE is found in the cache by its corpus, so it is rebuilt from the data config."""
    if data.tokenizer == "byte":
        return ByteTokenizer()
    if data.tokenizer != "bpe":
        return FileTokenizer(Path(data.tokenizer).expanduser())
    from heloco.data.build import make_tokenizer
    from heloco.data.corpus import load_corpus, split_language
    from heloco.data.synthetic import synthetic_corpus

    corpus = (
        synthetic_corpus(data.synthetic_chars_per_language)
        if data.data_dir is None
        else load_corpus(data.data_dir)
    )
    splits = [
        split_language(lang, text, data.val_chars_per_language, data.train_fraction)
        for lang, text in zip(corpus.languages, corpus.texts, strict=True)
    ]
    return make_tokenizer(data, splits)


def _vocab_size(
    model: ModelChoice, data: DataConfig, params: Params, tokenizer: Tokenizer | None
) -> int:
    """TinyGPT's from its embedding; any other model's from the run's tokenizer."""
    if "tok_emb.weight" in params and isinstance(model, str | ModelConfig):
        return int(params["tok_emb.weight"].shape[0])
    if tokenizer is None:
        raise UserInputError("data.tokenizer", data.tokenizer, "a tokenizer this run can rebuild")
    return tokenizer.vocab_size


def hf_model(setup: ModelSetup, params: Params, vocab_size: int) -> nn.Module:
    """A ``transformers`` model of ``setup``'s architecture holding ``params`` (TinyGPT
    mapped to GPT-2)."""
    from transformers import GPT2LMHeadModel, PreTrainedModel

    from heloco import hf

    choice = setup.model
    if isinstance(choice, str | ModelConfig):
        tiny = setup.tinygpt(vocab_size)
        model: nn.Module = GPT2LMHeadModel(hf.gpt2_config(tiny))
        state = hf.tinygpt_to_gpt2(params)
    else:
        if isinstance(choice, HFModel):
            choice = choice.model_copy(update={"weights": None})  # the run's weights come next
        model = build_model(choice, vocab_size, setup.seq_len, seed=0)
        if not isinstance(model, PreTrainedModel):
            raise UserInputError(
                "model",
                describe(setup.model),
                f"a transformers PreTrainedModel to export ({type(model).__name__} is not; "
                "its parameters are in RUN_DIR/checkpoints as safetensors)",
            )
        state = params
    hf.check_state(model, state, "checkpoint")
    with torch.no_grad():
        target = model.state_dict()
        for name, value in state.items():
            target[name].copy_(value)
    config = getattr(model, "config", None)
    if config is not None:
        config.use_cache = True  # inference after export
    return model


def export_params(
    cfg: RunConfig, params: Params, out_dir: Path, tokenizer: Tokenizer | None = None
) -> Exported:
    """Write ``params`` of a run of ``cfg`` to ``out_dir`` in ``save_pretrained`` layout.

    Written into a temporary sibling folder and renamed into place, so ``out_dir`` holds a
    whole export or nothing. ``tokenizer`` defaults to the run's own (when it has one).
    """
    if out_dir.exists() and any(out_dir.iterdir()):
        raise UserInputError("--out", str(out_dir), "a new or empty folder")
    tok = tokenizer if tokenizer is not None else run_tokenizer(cfg.data)
    setup = ModelSetup.of(cfg)
    model = hf_model(setup, params, _vocab_size(setup.model, cfg.data, params, tok))
    out_dir.parent.mkdir(parents=True, exist_ok=True)
    tmp = Path(tempfile.mkdtemp(prefix=f".{out_dir.name}.", dir=out_dir.parent))
    try:
        model.save_pretrained(str(tmp), safe_serialization=True)  # type: ignore[operator]
        hf_tok = to_hf(tok) if tok is not None else None
        if hf_tok is not None:
            from transformers import PreTrainedTokenizerFast

            PreTrainedTokenizerFast(tokenizer_object=hf_tok).save_pretrained(str(tmp))
        if out_dir.exists():
            out_dir.rmdir()
        tmp.rename(out_dir)
    except BaseException:
        shutil.rmtree(tmp, ignore_errors=True)
        raise
    arch = type(model).__name__
    n = sum(p.numel() for p in model.parameters())
    return Exported(out_dir, arch, n, hf_tok is not None)


def export_run(run_dir: Path, out_dir: Path, revision: int | None = None) -> tuple[Exported, int]:
    """Export the newest checkpoint of ``run_dir`` (or ``revision``); returns what was
    written and the revision."""
    cfg = read_run(run_dir)
    params, rev = checkpoint_params(run_dir, revision)
    return export_params(cfg, params, out_dir), rev


def logits_of(model: nn.Module, tokens: torch.Tensor) -> Any:
    """``(B, T, V)`` logits of any of our models or a ``transformers`` causal LM."""
    out = model(tokens)
    return out if isinstance(out, torch.Tensor) else out.logits
