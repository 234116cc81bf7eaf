"""TinyGPT: the small decoder-only transformer of the HeLoCo experiments.

Pre-LN blocks, learned positional embeddings, GELU MLP of width 4·d, dropout 0 and an untied,
bias-free LM head: the authors' prototype model (heloco-spec.md §3, "Model"), written in the
style of nanoGPT. Any ``torch.nn.Module`` mapping ``(B, T)`` int64 tokens to ``(B, T, V)``
logits works with the worker; this one is shipped so runs need nothing else.
"""

from __future__ import annotations

import math
from typing import Any

import torch
import torch.nn.functional as F
from pydantic import ValidationError
from torch import nn

from heloco.config import ModelConfig
from shardmeter.errors import UserInputError, from_pydantic

INIT_STD = 0.02  # GPT-2 initialisation (Radford et al. 2019, §2.3; nanoGPT `_init_weights`)


PRESETS: dict[str, ModelConfig] = {
    "tiny": ModelConfig(vocab_size=256, seq_len=64, n_layer=2, n_head=2, d_model=64),
    "small": ModelConfig(vocab_size=256, seq_len=128, n_layer=4, n_head=4, d_model=128),
    "paper": ModelConfig(vocab_size=256, seq_len=128, n_layer=8, n_head=4, d_model=128),
    "paper-gpt2vocab": ModelConfig(vocab_size=50257, seq_len=128, n_layer=8, n_head=4, d_model=128),
}


def preset_config(name: str, **overrides: Any) -> ModelConfig:
    """A named preset, with optional field overrides (e.g. the data's ``vocab_size``)."""
    if name not in PRESETS:
        raise UserInputError("model.preset", name, f"one of {', '.join(PRESETS)}")
    return parse_model_config({**PRESETS[name].model_dump(), **overrides})


def parse_model_config(values: dict[str, Any]) -> ModelConfig:
    """Validate user values into a ModelConfig; bad input raises a one-line UserInputError."""
    try:
        return ModelConfig.model_validate(values)
    except ValidationError as exc:
        raise from_pydantic(exc, "model") from None


class CausalSelfAttention(nn.Module):
    """Multi-head causal self-attention with a fused QKV projection."""

    def __init__(self, cfg: ModelConfig) -> None:
        super().__init__()
        self.n_head = cfg.n_head
        self.qkv = nn.Linear(cfg.d_model, 3 * cfg.d_model)
        self.proj = nn.Linear(cfg.d_model, cfg.d_model)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        """softmax(QKᵀ/√d_head)V with a causal mask (Vaswani et al. 2017, Eq. 1); (B, T, C) -> (B, T, C)."""
        b, t, c = x.shape
        q, k, v = self.qkv(x).split(c, dim=2)
        shape = (b, t, self.n_head, c // self.n_head)
        q, k, v = (z.view(shape).transpose(1, 2) for z in (q, k, v))
        y = F.scaled_dot_product_attention(q, k, v, is_causal=True)
        return self.proj(y.transpose(1, 2).reshape(b, t, c))


class MLP(nn.Module):
    """Position-wise feed-forward: d -> 4d -> GELU -> d."""

    def __init__(self, cfg: ModelConfig) -> None:
        super().__init__()
        self.fc = nn.Linear(cfg.d_model, 4 * cfg.d_model)
        self.proj = nn.Linear(4 * cfg.d_model, cfg.d_model)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        """W₂ GELU(W₁ x) with a 4x hidden width (GPT-2); (B, T, C) -> (B, T, C)."""
        return self.proj(F.gelu(self.fc(x)))


class Block(nn.Module):
    """Pre-LN transformer block: x + attn(ln(x)), then x + mlp(ln(x))."""

    def __init__(self, cfg: ModelConfig) -> None:
        super().__init__()
        self.ln1 = nn.LayerNorm(cfg.d_model)
        self.attn = CausalSelfAttention(cfg)
        self.ln2 = nn.LayerNorm(cfg.d_model)
        self.mlp = MLP(cfg)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        """Pre-LN residual block: x + attn(LN x), then + mlp(LN x) (GPT-2 ordering)."""
        x = x + self.attn(self.ln1(x))
        return x + self.mlp(self.ln2(x))


class TinyGPT(nn.Module):
    """Decoder-only transformer: ``(B, T)`` int64 tokens -> ``(B, T, vocab_size)`` logits.

    ``seed`` makes the initialisation reproducible without touching torch's global RNG
    (``seed=None`` draws the initialisation from the global RNG, like any torch module).
    """

    positions: torch.Tensor  # (seq_len,) position ids, a non-persistent buffer

    def __init__(self, cfg: ModelConfig, seed: int | None = None) -> None:
        super().__init__()
        self.cfg = cfg
        # torch's default per-layer init draws from the global RNG; it is overwritten below,
        # so run it on a forked RNG state to leave the caller's stream untouched
        with torch.random.fork_rng(devices=[]):
            self.tok_emb = nn.Embedding(cfg.vocab_size, cfg.d_model)
            self.pos_emb = nn.Embedding(cfg.seq_len, cfg.d_model)
            self.blocks = nn.ModuleList(Block(cfg) for _ in range(cfg.n_layer))
            self.ln_f = nn.LayerNorm(cfg.d_model)
            self.head = nn.Linear(cfg.d_model, cfg.vocab_size, bias=False)
        self.register_buffer("positions", torch.arange(cfg.seq_len), persistent=False)
        self.init_weights(None if seed is None else torch.Generator().manual_seed(seed))

    @torch.no_grad()
    def init_weights(self, generator: torch.Generator | None = None) -> None:
        """GPT-2 init: N(0, 0.02) weights, zero biases, residual projections scaled by
        1/sqrt(2·n_layer) (Radford et al. 2019, §2.3)."""
        residual_std = INIT_STD / math.sqrt(2 * self.cfg.n_layer)
        for name, module in self.named_modules():
            if isinstance(module, nn.Linear):
                std = residual_std if name.endswith(".proj") else INIT_STD
                nn.init.normal_(module.weight, 0.0, std, generator=generator)
                if module.bias is not None:
                    module.bias.zero_()
            elif isinstance(module, nn.Embedding):
                nn.init.normal_(module.weight, 0.0, INIT_STD, generator=generator)
            elif isinstance(module, nn.LayerNorm):
                module.reset_parameters()

    def forward(self, tokens: torch.Tensor) -> torch.Tensor:
        """(B, T) int64 token ids -> (B, T, vocab_size) logits."""
        t = tokens.shape[1]
        if t > self.cfg.seq_len:
            raise ValueError(f"sequence length {t} exceeds the model's seq_len {self.cfg.seq_len}")
        x = self.tok_emb(tokens) + self.pos_emb(self.positions[:t])
        for block in self.blocks:
            x = block(x)
        return self.head(self.ln_f(x))

    def param_count(self) -> int:
        """Number of parameter elements actually held (equals ``cfg.param_count()``)."""
        return sum(p.numel() for p in self.parameters())
