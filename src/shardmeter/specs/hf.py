"""Import a TransformerSpec from a local Hugging Face `config.json` (no network, no transformers).

Supported architectures: Llama, Mistral, Mixtral, Qwen2, GPT-2, OPT, BLOOM, GPT-NeoX and
DeepSeek-V3. Key names follow the `transformers` configuration classes of each family.
"""

from __future__ import annotations

import json
from collections.abc import Callable, Mapping
from pathlib import Path
from typing import Any

from shardmeter.errors import UserInputError
from shardmeter.specs.model import MLASpec, MoESpec, TransformerSpec
from shardmeter.specs.validation import validate_spec

# architectures[0] -> model_type, for configs that only name the class
ARCHITECTURES: dict[str, str] = {
    "LlamaForCausalLM": "llama",
    "MistralForCausalLM": "mistral",
    "MixtralForCausalLM": "mixtral",
    "Qwen2ForCausalLM": "qwen2",
    "GPT2LMHeadModel": "gpt2",
    "OPTForCausalLM": "opt",
    "BloomForCausalLM": "bloom",
    "GPTNeoXForCausalLM": "gpt_neox",
    "DeepseekV3ForCausalLM": "deepseek_v3",
}
BLOOM_TRAIN_SEQ_LEN = 2048  # BLOOM uses ALiBi and has no max_position_embeddings (BigScience 2022)


class _Config:
    """Typed access to a config dict; a missing or ill-typed key is a one-line UserInputError."""

    def __init__(self, data: Mapping[str, Any], where: str) -> None:
        self.data = data
        self.where = where

    def _field(self, key: str) -> str:
        return f"{self.where}:{key}"

    def has(self, key: str) -> bool:
        return self.data.get(key) is not None

    def int(self, *keys: str, default: int | None = None) -> int:
        """The first present key among `keys` as a positive int, else `default`."""
        for key in keys:
            value = self.data.get(key)
            if value is None:
                continue
            if isinstance(value, bool) or not isinstance(value, int) or value <= 0:
                raise UserInputError(self._field(key), value, "expected a positive integer")
            return value
        if default is None:
            raise UserInputError(self._field(keys[0]), None, "required key is missing")
        return default

    def flag(self, key: str, default: bool) -> bool:
        value = self.data.get(key, default)
        if not isinstance(value, bool):
            raise UserInputError(self._field(key), value, "expected true or false")
        return value


def _gated(cfg: _Config) -> str:
    """Llama-family MLPs are gated (SwiGLU, 3 matrices) unless the config says otherwise;
    `relu2` (Nemotron's squared ReLU) and any other activation make a 2-matrix MLP."""
    act = str(cfg.data.get("hidden_act", "silu")).lower()
    if act == "relu2":
        return "relu2"
    return "swiglu" if act in ("silu", "swish", "swiglu") else "gelu"


def _llama_like(cfg: _Config) -> dict[str, Any]:
    """Llama, Mistral, Qwen2 and Mixtral keys (LlamaConfig / MistralConfig / MixtralConfig)."""
    hidden = cfg.int("hidden_size")
    n_heads = cfg.int("num_attention_heads")
    fields: dict[str, Any] = {
        "n_layers": cfg.int("num_hidden_layers"),
        "hidden": hidden,
        "n_heads": n_heads,
        "n_kv_heads": cfg.int("num_key_value_heads", default=n_heads),
        "ffn": cfg.int("intermediate_size"),
        "mlp": _gated(cfg),
        "vocab": cfg.int("vocab_size"),
        "seq_len": cfg.int("max_position_embeddings"),
        "tied_embeddings": cfg.flag("tie_word_embeddings", False),
    }
    if cfg.has("head_dim") and cfg.int("head_dim") * n_heads != hidden:
        fields["head_dim"] = cfg.int("head_dim")
    if cfg.has("num_local_experts"):
        fields["moe"] = MoESpec(
            experts=cfg.int("num_local_experts"), top_k=cfg.int("num_experts_per_tok")
        )
    return fields


def _gpt2(cfg: _Config) -> dict[str, Any]:
    hidden = cfg.int("n_embd", "hidden_size")
    return {
        "n_layers": cfg.int("n_layer", "num_hidden_layers"),
        "hidden": hidden,
        "n_heads": cfg.int("n_head", "num_attention_heads"),
        "ffn": cfg.int("n_inner", default=4 * hidden),
        "mlp": "gelu",
        "norm": "layernorm",  # nn.LayerNorm (what an eager norm saves: estimate/memory.py)
        "vocab": cfg.int("vocab_size"),
        "seq_len": cfg.int("n_positions", "n_ctx", "max_position_embeddings"),
        "tied_embeddings": cfg.flag("tie_word_embeddings", True),
    }


def _opt(cfg: _Config) -> dict[str, Any]:
    """OPTConfig; `word_embed_proj_dim` projections (OPT-350m only) are ignored."""
    return {
        "n_layers": cfg.int("num_hidden_layers"),
        "hidden": cfg.int("hidden_size"),
        "n_heads": cfg.int("num_attention_heads"),
        "ffn": cfg.int("ffn_dim"),
        "mlp": "gelu",  # ReLU, but a 2-matrix MLP like GELU
        "norm": "layernorm",  # nn.LayerNorm (what an eager norm saves: estimate/memory.py)
        "vocab": cfg.int("vocab_size"),
        "seq_len": cfg.int("max_position_embeddings"),
        "tied_embeddings": cfg.flag("tie_word_embeddings", True),
    }


def _bloom(cfg: _Config) -> dict[str, Any]:
    hidden = cfg.int("hidden_size", "n_embed")
    return {
        "n_layers": cfg.int("n_layer", "num_hidden_layers"),
        "hidden": hidden,
        "n_heads": cfg.int("n_head", "num_attention_heads"),
        "ffn": 4 * hidden,  # BloomMLP: dense_h_to_4h
        "mlp": "gelu",
        "norm": "layernorm",  # nn.LayerNorm (what an eager norm saves: estimate/memory.py)
        "vocab": cfg.int("vocab_size"),
        "seq_len": cfg.int("seq_length", default=BLOOM_TRAIN_SEQ_LEN),
        "tied_embeddings": cfg.flag("tie_word_embeddings", True),
    }


def _gpt_neox(cfg: _Config) -> dict[str, Any]:
    return {
        "n_layers": cfg.int("num_hidden_layers"),
        "hidden": cfg.int("hidden_size"),
        "n_heads": cfg.int("num_attention_heads"),
        "ffn": cfg.int("intermediate_size"),
        "mlp": "gelu",
        "norm": "layernorm",  # nn.LayerNorm (what an eager norm saves: estimate/memory.py)
        "vocab": cfg.int("vocab_size"),
        "seq_len": cfg.int("max_position_embeddings"),
        "tied_embeddings": cfg.flag("tie_word_embeddings", False),
    }


def mla_attention_params(
    hidden: int,
    n_heads: int,
    q_lora_rank: int | None,
    kv_lora_rank: int,
    qk_nope_head_dim: int,
    qk_rope_head_dim: int,
    v_head_dim: int,
) -> int:
    """Weights of one multi-head latent attention layer (DeepSeek-V2 2024, Eqs. 9-19; norms
    ignored): Q down/up (or a full Q), KV down + shared rope key, KV up to K_nope and V, output."""
    qk_dim = qk_nope_head_dim + qk_rope_head_dim
    if q_lora_rank:
        q = hidden * q_lora_rank + q_lora_rank * n_heads * qk_dim
    else:
        q = hidden * n_heads * qk_dim
    kv = hidden * (kv_lora_rank + qk_rope_head_dim)
    kv += kv_lora_rank * n_heads * (qk_nope_head_dim + v_head_dim)
    out = n_heads * v_head_dim * hidden
    return q + kv + out


def gqa_equivalent(hidden: int, n_heads: int, attn_params: int) -> tuple[int, int]:
    """(head_dim, n_kv_heads) of the GQA layer whose weights 2h(n·d + k·d) come closest to
    `attn_params`, with k dividing n; ties prefer the larger head_dim. MLA's weights and FLOPs
    are represented by its weight count (exact matmul FLOPs per token),
    while the score/value matmuls then use this head_dim (an approximation, see docs/specs.md)."""
    target = attn_params / (2 * hidden)  # = d · (n + k)
    best: tuple[float, int, int] | None = None
    for k in (k for k in range(1, n_heads + 1) if n_heads % k == 0):
        for d in {max(1, int(target // (n_heads + k))), int(target // (n_heads + k)) + 1}:
            key = (abs(d * (n_heads + k) - target), -d, k)
            if best is None or key < best:
                best = key
    assert best is not None
    return -best[1], best[2]


def _deepseek_v3(cfg: _Config) -> dict[str, Any]:
    """DeepseekV3Config: MLA attention, `first_k_dense_replace` dense layers, then MoE layers
    with `n_routed_experts` experts of `moe_intermediate_size` plus `n_shared_experts`."""
    hidden = cfg.int("hidden_size")
    n_heads = cfg.int("num_attention_heads")
    mla = MLASpec(
        q_lora_rank=cfg.int("q_lora_rank") if cfg.has("q_lora_rank") else None,
        kv_lora_rank=cfg.int("kv_lora_rank"),
        qk_nope_head_dim=cfg.int("qk_nope_head_dim"),
        qk_rope_head_dim=cfg.int("qk_rope_head_dim"),
        v_head_dim=cfg.int("v_head_dim"),
    )
    attn = mla_attention_params(
        hidden,
        n_heads,
        mla.q_lora_rank,
        mla.kv_lora_rank,
        mla.qk_nope_head_dim,
        mla.qk_rope_head_dim,
        mla.v_head_dim,
    )
    head_dim, kv_heads = gqa_equivalent(hidden, n_heads, attn)
    n_layers = cfg.int("num_hidden_layers")
    dense = min(int(cfg.data.get("first_k_dense_replace", 0) or 0), n_layers)
    return {
        "n_layers": n_layers,
        "hidden": hidden,
        "n_heads": n_heads,
        "n_kv_heads": kv_heads,
        "head_dim": head_dim,
        "ffn": cfg.int("moe_intermediate_size"),
        "mlp": "swiglu",
        "vocab": cfg.int("vocab_size"),
        "seq_len": cfg.int("max_position_embeddings"),
        "tied_embeddings": cfg.flag("tie_word_embeddings", False),
        "mla": mla,
        "moe": MoESpec(
            experts=cfg.int("n_routed_experts"),
            top_k=cfg.int("num_experts_per_tok"),
            shared_experts=int(cfg.data.get("n_shared_experts", 0) or 0),
            dense_layers=dense,
            dense_ffn=cfg.int("intermediate_size"),
            n_groups=int(cfg.data["n_group"]) if cfg.data.get("topk_group") else None,
            topk_groups=int(cfg.data["topk_group"]) if cfg.data.get("topk_group") else None,
        ),
    }


READERS: dict[str, Callable[[_Config], dict[str, Any]]] = {
    "llama": _llama_like,
    "mistral": _llama_like,
    "mixtral": _llama_like,
    "qwen2": _llama_like,
    "gpt2": _gpt2,
    "opt": _opt,
    "bloom": _bloom,
    "gpt_neox": _gpt_neox,
    "deepseek_v3": _deepseek_v3,
}


def _model_type(data: Mapping[str, Any], where: str) -> str:
    archs = data.get("architectures") or []
    if isinstance(archs, list) and archs and archs[0] in ARCHITECTURES:
        return ARCHITECTURES[archs[0]]
    model_type = data.get("model_type")
    if isinstance(model_type, str) and model_type in READERS:
        return model_type
    shown = archs[0] if isinstance(archs, list) and archs else model_type
    raise UserInputError(
        f"{where}:architectures",
        shown,
        f"unsupported architecture; supported: {', '.join(ARCHITECTURES)}",
    )


def _default_name(data: Mapping[str, Any], path: Path | None, model_type: str) -> str:
    name = data.get("_name_or_path")
    if isinstance(name, str) and name:
        return name.rstrip("/").split("/")[-1]
    if path is not None and path.parent.name:
        return path.parent.name
    return f"hf-{model_type}"


def model_from_hf_config(
    source: str | Path | Mapping[str, Any],
    *,
    name: str | None = None,
    seq_len: int | None = None,
) -> TransformerSpec:
    """A TransformerSpec from a Hugging Face `config.json` path (or its folder, or its dict).

    `seq_len` defaults to `max_position_embeddings`; pass the training sequence length when it
    is shorter (Llama 3.1 trains mostly at 8192 but advertises 131072)."""
    path: Path | None = None
    if isinstance(source, Mapping):
        data: Mapping[str, Any] = source
        where = "config"
    else:
        path = Path(source).expanduser()
        if path.is_dir():
            path = path / "config.json"
        where = path.name
        try:
            data = json.loads(path.read_text(encoding="utf-8"))
        except FileNotFoundError:
            raise UserInputError("config", str(path), "file not found") from None
        except (OSError, UnicodeDecodeError, json.JSONDecodeError) as exc:
            raise UserInputError("config", str(path), f"invalid JSON: {exc}") from None
        if not isinstance(data, dict):
            raise UserInputError("config", str(path), "expected a JSON object")
    model_type = _model_type(data, where)
    fields = READERS[model_type](_Config(data, where))
    fields["name"] = name or _default_name(data, path, model_type)
    if seq_len is not None:
        fields["seq_len"] = seq_len
    return validate_spec(TransformerSpec, fields, where)
