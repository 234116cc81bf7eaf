"""Hugging Face config.json import: each supported family round-trips to the matching preset."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import pytest
from hypothesis import given
from hypothesis import strategies as st

from shardmeter.errors import UserInputError
from shardmeter.specs.hf import gqa_equivalent, mla_attention_params, model_from_hf_config
from shardmeter.specs.loader import load_model

# Key subsets of the published config.json files (values copied from the model repositories).
LLAMA_31_8B = {
    "architectures": ["LlamaForCausalLM"],
    "model_type": "llama",
    "hidden_act": "silu",
    "hidden_size": 4096,
    "intermediate_size": 14336,
    "max_position_embeddings": 131072,
    "num_attention_heads": 32,
    "num_hidden_layers": 32,
    "num_key_value_heads": 8,
    "tie_word_embeddings": False,
    "vocab_size": 128256,
}
MIXTRAL_8X7B = {
    "architectures": ["MixtralForCausalLM"],
    "model_type": "mixtral",
    "hidden_act": "silu",
    "hidden_size": 4096,
    "intermediate_size": 14336,
    "max_position_embeddings": 32768,
    "num_attention_heads": 32,
    "num_experts_per_tok": 2,
    "num_hidden_layers": 32,
    "num_key_value_heads": 8,
    "num_local_experts": 8,
    "tie_word_embeddings": False,
    "vocab_size": 32000,
}
DEEPSEEK_V3 = {
    "architectures": ["DeepseekV3ForCausalLM"],
    "model_type": "deepseek_v3",
    "first_k_dense_replace": 3,
    "hidden_size": 7168,
    "intermediate_size": 18432,
    "kv_lora_rank": 512,
    "max_position_embeddings": 163840,
    "moe_intermediate_size": 2048,
    "n_group": 8,
    "n_routed_experts": 256,
    "n_shared_experts": 1,
    "num_attention_heads": 128,
    "num_experts_per_tok": 8,
    "num_hidden_layers": 61,
    "num_key_value_heads": 128,
    "q_lora_rank": 1536,
    "qk_nope_head_dim": 128,
    "qk_rope_head_dim": 64,
    "tie_word_embeddings": False,
    "topk_group": 4,
    "v_head_dim": 128,
    "vocab_size": 129280,
}
OPT_125M = {
    "architectures": ["OPTForCausalLM"],
    "model_type": "opt",
    "ffn_dim": 3072,
    "hidden_size": 768,
    "max_position_embeddings": 2048,
    "num_attention_heads": 12,
    "num_hidden_layers": 12,
    "vocab_size": 50272,
    "word_embed_proj_dim": 768,
}
BLOOM_176B = {
    "architectures": ["BloomForCausalLM"],
    "model_type": "bloom",
    "hidden_size": 14336,
    "n_head": 112,
    "n_layer": 70,
    "vocab_size": 250880,
}
LLAMA_2_70B = {
    "architectures": ["LlamaForCausalLM"],
    "hidden_size": 8192,
    "intermediate_size": 28672,
    "max_position_embeddings": 4096,
    "num_attention_heads": 64,
    "num_hidden_layers": 80,
    "num_key_value_heads": 8,
    "vocab_size": 32000,
}
GPT2 = {  # openai-community/gpt2 (124M)
    "architectures": ["GPT2LMHeadModel"],
    "model_type": "gpt2",
    "n_ctx": 1024,
    "n_embd": 768,
    "n_head": 12,
    "n_layer": 12,
    "n_positions": 1024,
    "vocab_size": 50257,
}
PYTHIA_160M = {  # EleutherAI/pythia-160m
    "architectures": ["GPTNeoXForCausalLM"],
    "model_type": "gpt_neox",
    "hidden_size": 768,
    "intermediate_size": 3072,
    "max_position_embeddings": 2048,
    "num_attention_heads": 12,
    "num_hidden_layers": 12,
    "tie_word_embeddings": False,
    "vocab_size": 50304,
}
QWEN2_7B = {  # Qwen/Qwen2-7B
    "architectures": ["Qwen2ForCausalLM"],
    "model_type": "qwen2",
    "hidden_act": "silu",
    "hidden_size": 3584,
    "intermediate_size": 18944,
    "max_position_embeddings": 131072,
    "num_attention_heads": 28,
    "num_hidden_layers": 28,
    "num_key_value_heads": 4,
    "tie_word_embeddings": False,
    "vocab_size": 152064,
}


def _config(tmp_path: Path, data: dict[str, Any], folder: str = "model") -> Path:
    path = tmp_path / folder / "config.json"
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text(json.dumps(data))
    return path


def _shape(model: Any) -> dict[str, Any]:
    return model.model_dump(exclude={"name"})


@pytest.mark.parametrize(
    ("config", "preset", "seq_len"),
    [
        (LLAMA_31_8B, "llama-3.1-8b", 8192),
        (MIXTRAL_8X7B, "mixtral-8x7b", None),
        (DEEPSEEK_V3, "deepseek-v3", 4096),
        (OPT_125M, "opt-125m", None),
        (BLOOM_176B, "bloom-176b", None),
        (LLAMA_2_70B, "llama-2-70b", None),
    ],
)
def test_config_json_round_trips_to_preset(
    tmp_path: Path, config: dict[str, Any], preset: str, seq_len: int | None
) -> None:
    path = _config(tmp_path, config, folder=preset)
    model = model_from_hf_config(path, seq_len=seq_len)
    assert _shape(model) == _shape(load_model(preset))
    assert model.name == preset  # the folder name
    assert load_model(path.parent, **({"seq_len": seq_len} if seq_len else {})) == model


@pytest.mark.parametrize(
    ("config", "published_b", "tolerance"),
    [(GPT2, 0.124, 0.01), (PYTHIA_160M, 0.162, 0.01), (QWEN2_7B, 7.62, 0.01)],
)
def test_families_without_presets_count_their_parameters(
    tmp_path: Path, config: dict[str, Any], published_b: float, tolerance: float
) -> None:
    model = load_model(_config(tmp_path, config))  # load_model detects a transformers config
    assert model.params_total / 1e9 == pytest.approx(published_b, rel=tolerance)


def test_tied_embeddings_and_activation_defaults() -> None:
    assert model_from_hf_config(GPT2).tied_embeddings is True
    assert model_from_hf_config(PYTHIA_160M).tied_embeddings is False
    assert model_from_hf_config(LLAMA_31_8B).mlp == "swiglu"
    gelu_llama = model_from_hf_config({**LLAMA_31_8B, "hidden_act": "gelu"})
    assert gelu_llama.mlp == "gelu"
    assert model_from_hf_config({**LLAMA_31_8B, "hidden_act": "relu2"}).mlp == "relu2"
    assert model_from_hf_config({**QWEN2_7B, "tie_word_embeddings": True}).tied_embeddings


def test_explicit_head_dim_is_kept() -> None:
    model = model_from_hf_config({**LLAMA_31_8B, "hidden_size": 3072, "head_dim": 128})
    assert (model.dim_head, model.q_dim) == (128, 4096)


def test_unsupported_and_broken_configs_are_one_line(tmp_path: Path) -> None:
    with pytest.raises(UserInputError, match="unsupported architecture; supported: Llama"):
        model_from_hf_config({"architectures": ["T5ForConditionalGeneration"]})
    missing = {k: v for k, v in LLAMA_31_8B.items() if k != "hidden_size"}
    with pytest.raises(UserInputError, match=r"^config.json:hidden_size: got None; required"):
        model_from_hf_config(_config(tmp_path, missing))
    with pytest.raises(UserInputError, match=r"config:num_hidden_layers: got 'many'"):
        model_from_hf_config({**LLAMA_31_8B, "num_hidden_layers": "many"})
    with pytest.raises(UserInputError, match=r"n_kv_heads: got 5; a divisor of n_heads \(32\)"):
        model_from_hf_config({**LLAMA_31_8B, "num_key_value_heads": 5})
    with pytest.raises(UserInputError, match="file not found"):
        model_from_hf_config(tmp_path / "absent" / "config.json")


def test_mla_weight_count_matches_deepseek_v3() -> None:
    # 7168·1536 + 1536·128·192 + 7168·576 + 512·128·256 + 128·128·7168 (DeepSeek-V2 Eqs. 9-19)
    assert mla_attention_params(7168, 128, 1536, 512, 128, 64, 128) == 187_105_280


@given(
    n_heads=st.sampled_from([8, 12, 16, 32, 64, 128]),
    head_dim=st.integers(16, 256),
    kv_index=st.integers(0, 10),
    hidden=st.integers(256, 16384),
)
def test_gqa_equivalent_recovers_an_equal_weight_shape(
    n_heads: int, head_dim: int, kv_index: int, hidden: int
) -> None:
    divisors = [k for k in range(1, n_heads + 1) if n_heads % k == 0]
    kv = divisors[kv_index % len(divisors)]
    target = 2 * hidden * head_dim * (n_heads + kv)
    d, k = gqa_equivalent(hidden, n_heads, target)
    assert n_heads % k == 0
    assert 2 * hidden * d * (n_heads + k) == target


def test_layernorm_families_say_so() -> None:
    """GPT-2, OPT, BLOOM and GPT-NeoX use nn.LayerNorm, Llama-like models RMSNorm: the norm
    decides what an eager norm saves (estimate/memory.py)."""
    assert model_from_hf_config(GPT2).norm == "layernorm"
    assert model_from_hf_config(PYTHIA_160M).norm == "layernorm"
    assert model_from_hf_config(LLAMA_31_8B).norm == "rmsnorm"
