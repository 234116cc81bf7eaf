"""Hugging Face causal LMs from local files: build, load weights (every shape checked), and the
TinyGPT ↔ GPT-2 name map used to export TinyGPT in ``save_pretrained`` layout.

Nothing here touches the network: configs are read with ``local_files_only`` and weights from
local safetensors files. ``transformers`` is imported lazily (it takes seconds).
"""

from __future__ import annotations

import json
from pathlib import Path
from typing import TYPE_CHECKING

import torch
from torch import nn

from heloco.config import HFModel
from heloco.model import ModelConfig
from shardmeter.errors import UserInputError

if TYPE_CHECKING:
    from transformers import GPT2Config, PretrainedConfig, PreTrainedModel

CONFIG_FILE = "config.json"
POSITION_KEYS = ("max_position_embeddings", "n_positions")


def load_config(folder: Path, field: str = "model.hf") -> PretrainedConfig:
    """The ``config.json`` of a local model folder; a missing or malformed one is one line."""
    if not folder.is_dir():
        raise UserInputError(field, str(folder), f"an existing folder holding {CONFIG_FILE}")
    path = folder / CONFIG_FILE
    if not path.is_file():
        raise UserInputError(field, str(folder), f"a folder holding {CONFIG_FILE}")
    try:
        raw = json.loads(path.read_text(encoding="utf-8"))
    except (ValueError, UnicodeDecodeError) as exc:
        raise UserInputError(f"{field} {CONFIG_FILE}", str(path), f"valid JSON ({exc})") from None
    if not isinstance(raw, dict) or not isinstance(raw.get("model_type"), str):
        raise UserInputError(
            f"{field} {CONFIG_FILE}", str(path), 'a JSON object with a "model_type" (e.g. "llama")'
        )
    from transformers import AutoConfig

    try:
        return AutoConfig.from_pretrained(str(folder), local_files_only=True)
    except (ValueError, KeyError, TypeError, OSError) as exc:
        first = str(exc).strip().splitlines()[0] if str(exc).strip() else type(exc).__name__
        raise UserInputError(
            f"{field} {CONFIG_FILE}", str(path), f"a config transformers can read ({first[:200]})"
        ) from None


def check_fits(config: PretrainedConfig, vocab_size: int, seq_len: int, field: str) -> None:
    """The tokenizer's ids and the training window must fit the architecture."""
    vocab = int(getattr(config, "vocab_size", 0) or 0)
    if vocab < vocab_size:
        raise UserInputError(
            f"{field} vocab_size", vocab, f">= the tokenizer's vocabulary ({vocab_size})"
        )
    for key in POSITION_KEYS:
        limit = getattr(config, key, None)
        if isinstance(limit, int) and limit < seq_len:
            raise UserInputError(f"{field} {key}", limit, f">= the training seq_len ({seq_len})")


def build(choice: HFModel, vocab_size: int, seq_len: int, seed: int) -> PreTrainedModel:
    """``AutoModelForCausalLM.from_config`` under a seeded, forked RNG (fp32, no KV cache),
    then the local weights if given."""
    from transformers import AutoModelForCausalLM

    config = load_config(choice.hf)
    check_fits(config, vocab_size, seq_len, "model.hf")
    config.use_cache = False  # training: no key/value cache kept per forward
    with torch.random.fork_rng(devices=[]):
        torch.manual_seed(seed)
        try:
            model = AutoModelForCausalLM.from_config(config)
        except ValueError as exc:
            raise UserInputError(
                "model.hf", str(choice.hf), f"a causal-LM architecture ({str(exc)[:200]})"
            ) from None
    model = model.float()
    if choice.weights is not None:
        load_weights(model, choice.weights)
    return model


def weight_files(path: Path) -> list[Path]:
    """The safetensors files of ``path`` (a file, or every ``*.safetensors`` in a folder)."""
    if path.is_file() and path.suffix == ".safetensors":
        return [path]
    files = sorted(path.glob("*.safetensors")) if path.is_dir() else []
    if not files:
        raise UserInputError(
            "model.weights", str(path), "a .safetensors file or a folder holding them"
        )
    return files


def load_weights(model: nn.Module, path: Path) -> None:
    """Load local safetensors weights; every parameter must be there with its exact shape
    (one-line error naming the first tensor that is not), and no unknown tensor may be."""
    from safetensors.torch import load_file

    tensors: dict[str, torch.Tensor] = {}
    for f in weight_files(path):
        try:
            tensors.update(load_file(str(f)))
        except Exception as exc:  # safetensors raises its own error types
            raise UserInputError("model.weights", str(f), f"a safetensors file ({exc})") from None
    check_state(model, tensors, "model.weights")
    with torch.no_grad():
        state = model.state_dict()
        for name, value in tensors.items():
            state[name].copy_(value)


def check_state(model: nn.Module, tensors: dict[str, torch.Tensor], field: str) -> None:
    """Every parameter present with its shape; every tensor a known name (buffers allowed)."""
    known = model.state_dict()
    for name, p in model.named_parameters():
        if name not in tensors:
            raise UserInputError(field, f"no tensor {name!r}", "every parameter of the model")
        if tuple(tensors[name].shape) != tuple(p.shape):
            raise UserInputError(
                f"{field} {name!r}", f"shape {tuple(tensors[name].shape)}", f"{tuple(p.shape)}"
            )
    unknown = sorted(set(tensors) - set(known))
    if unknown:
        raise UserInputError(field, f"unknown tensors {unknown[:3]}", "only the model's tensors")


# -- TinyGPT in GPT-2 layout --------------------------------------------------------------------
def gpt2_config(cfg: ModelConfig) -> GPT2Config:
    """The GPT-2 config with TinyGPT's exact function: exact-erf GELU (TinyGPT uses
    ``F.gelu``, GPT-2 ``gelu_new``), an untied head, LayerNorm ε 1e-5, no dropout."""
    from transformers import GPT2Config

    return GPT2Config(
        vocab_size=cfg.vocab_size,
        n_positions=cfg.seq_len,
        n_embd=cfg.d_model,
        n_layer=cfg.n_layer,
        n_head=cfg.n_head,
        n_inner=4 * cfg.d_model,
        activation_function="gelu",
        resid_pdrop=0.0,
        embd_pdrop=0.0,
        attn_pdrop=0.0,
        layer_norm_epsilon=1e-5,
        tie_word_embeddings=False,
        bos_token_id=None,
        eos_token_id=None,
        architectures=["GPT2LMHeadModel"],
    )


_GPT2_TRANSPOSED = ("attn.qkv", "attn.proj", "mlp.fc", "mlp.proj")  # nn.Linear -> HF Conv1D


def tinygpt_to_gpt2(params: dict[str, torch.Tensor]) -> dict[str, torch.Tensor]:
    """TinyGPT parameter names -> GPT2LMHeadModel names; linear weights are transposed
    (HF's Conv1D stores [in, out], ``nn.Linear`` [out, in]). Same QKV split order and head
    layout, so the logits agree."""
    top = {
        "tok_emb.weight": "transformer.wte.weight",
        "pos_emb.weight": "transformer.wpe.weight",
        "ln_f.weight": "transformer.ln_f.weight",
        "ln_f.bias": "transformer.ln_f.bias",
        "head.weight": "lm_head.weight",
    }
    block = {
        "ln1": "ln_1",
        "ln2": "ln_2",
        "attn.qkv": "attn.c_attn",
        "attn.proj": "attn.c_proj",
        "mlp.fc": "mlp.c_fc",
        "mlp.proj": "mlp.c_proj",
    }
    out: dict[str, torch.Tensor] = {}
    for name, value in params.items():
        if name in top:
            out[top[name]] = value
            continue
        _, index, rest = name.split(".", 2)  # blocks.{i}.{module}.{weight|bias}
        module, kind = rest.rsplit(".", 1)
        transposed = module in _GPT2_TRANSPOSED and kind == "weight"
        out[f"transformer.h.{index}.{block[module]}.{kind}"] = (
            value.t().contiguous() if transposed else value
        )
    return out
