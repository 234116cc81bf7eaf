"""Which model a run trains: the built-in TinyGPT, a Hugging Face architecture, or a factory.

The ``model`` key of a run config (its type, :data:`heloco.config.ModelChoice`, is defined with
the run file; this module builds it) takes one of

- a TinyGPT preset name (``"tiny"``, ``"small"``, ...) or a TinyGPT table (``[model]`` with
  ``n_layer``, ``d_model``, ...): the built-in default, sized to the data's vocabulary;
- ``[model] hf = "DIR"``: the architecture in ``DIR/config.json`` (Llama, Qwen, GPT-2, ...),
  built with ``transformers.AutoModelForCausalLM.from_config`` from a seeded random init, or
  started from local safetensors weights (``weights = "FILE_OR_DIR"``); nothing is downloaded;
- ``[model] factory = "package.module:callable"`` (+ ``kwargs``): any ``nn.Module`` the
  callable returns; parameters named ``vocab_size`` / ``seq_len`` that ``kwargs`` leave out are
  filled from the data.

Every choice builds the same initial weights in every process from the run seed (the server,
the simulator and each worker), and the simulator accepts all of them.
"""

from __future__ import annotations

import importlib
import inspect
from typing import Any

import torch
from torch import nn

from heloco.config import FactoryModel, HFModel
from heloco.model import ModelConfig, TinyGPT, preset_config
from shardmeter.errors import UserInputError


def describe(choice: str | ModelConfig | HFModel | FactoryModel) -> str:
    """A short human name of the model choice (for logs and reports)."""
    if isinstance(choice, str):
        return f"TinyGPT {choice}"
    if isinstance(choice, ModelConfig):
        return f"TinyGPT {choice.n_layer}x{choice.d_model}"
    if isinstance(choice, HFModel):
        return f"Hugging Face {choice.hf}"
    return f"factory {choice.factory}"


# -- TinyGPT ------------------------------------------------------------------------------------
def tinygpt_config(choice: str | ModelConfig, vocab_size: int, seq_len: int) -> ModelConfig:
    """The TinyGPT shape: a preset sized to the data's vocabulary and window, or as given."""
    if isinstance(choice, str):
        return preset_config(choice, vocab_size=vocab_size, seq_len=seq_len)
    if choice.vocab_size < vocab_size:
        raise UserInputError("model.vocab_size", choice.vocab_size, f">= {vocab_size}")
    if choice.seq_len < seq_len:
        raise UserInputError("model.seq_len", choice.seq_len, f">= {seq_len}")
    return choice


# -- factory ------------------------------------------------------------------------------------
def resolve_factory(spec: str) -> Any:
    """The callable named ``package.module:callable`` (one-line errors for every failure)."""
    module_name, sep, attr = spec.partition(":")
    if not sep or not module_name or not attr:
        raise UserInputError("model.factory", spec, "package.module:callable")
    try:
        module = importlib.import_module(module_name)
    except ImportError as exc:
        raise UserInputError(
            "model.factory", spec, f"an importable module ({type(exc).__name__}: {exc})"
        ) from None
    target: Any = module
    for part in attr.split("."):
        if not hasattr(target, part):
            raise UserInputError("model.factory", spec, f"a name defined in {module_name}")
        target = getattr(target, part)
    if not callable(target):
        raise UserInputError("model.factory", spec, "a callable returning an nn.Module")
    return target


def build_factory(choice: FactoryModel, vocab_size: int, seq_len: int, seed: int) -> nn.Module:
    """Call the factory under a seeded, forked RNG (the global RNG is left untouched)."""
    fn = resolve_factory(choice.factory)
    kwargs = dict(choice.kwargs)
    try:
        accepted = inspect.signature(fn).parameters
    except (TypeError, ValueError):
        accepted = {}  # type: ignore[assignment]
    for name, value in (("vocab_size", vocab_size), ("seq_len", seq_len)):
        if name in accepted and name not in kwargs:
            kwargs[name] = value
    with torch.random.fork_rng(devices=[]):
        torch.manual_seed(seed)
        try:
            model = fn(**kwargs)
        except TypeError as exc:
            raise UserInputError(
                "model.kwargs", choice.kwargs, f"arguments it takes ({exc})"
            ) from None
    if not isinstance(model, nn.Module):
        raise UserInputError(
            "model.factory",
            choice.factory,
            f"a callable returning an nn.Module, not {type(model).__name__}",
        )
    return model


# -- any choice ---------------------------------------------------------------------------------
def build_model(
    choice: str | ModelConfig | HFModel | FactoryModel,
    vocab_size: int,
    seq_len: int,
    seed: int,
    device: torch.device | str = "cpu",
) -> nn.Module:
    """The initial model of a run (fp32, on ``device``): identical in every process."""
    if isinstance(choice, str | ModelConfig):
        model: nn.Module = TinyGPT(tinygpt_config(choice, vocab_size, seq_len), seed=seed)
    elif isinstance(choice, HFModel):
        from heloco import hf

        model = hf.build(choice, vocab_size, seq_len, seed)
    else:
        model = build_factory(choice, vocab_size, seq_len, seed)
    if not any(True for _ in model.parameters()):
        raise UserInputError("model", describe(choice), "a module with parameters")
    return model.to(device=torch.device(device), dtype=torch.float32)
