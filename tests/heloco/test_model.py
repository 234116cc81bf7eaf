"""TinyGPT: shapes, causality, parameter count formula, presets, config errors."""

from __future__ import annotations

import pytest
import torch
from hypothesis import given, settings
from hypothesis import strategies as st

from heloco.model import PRESETS, ModelConfig, TinyGPT, parse_model_config, preset_config
from shardmeter.errors import UserInputError


def test_forward_shapes_and_dtype() -> None:
    cfg = preset_config("tiny", vocab_size=50)
    model = TinyGPT(cfg, seed=0)
    tokens = torch.randint(0, 50, (3, 17))
    logits = model(tokens)
    assert logits.shape == (3, 17, 50) and logits.dtype == torch.float32
    assert model(torch.randint(0, 50, (2, cfg.seq_len))).shape == (2, cfg.seq_len, 50)
    with pytest.raises(ValueError, match="seq_len"):
        model(torch.zeros(1, cfg.seq_len + 1, dtype=torch.int64))


def test_causal_future_tokens_do_not_change_past_logits() -> None:
    model = TinyGPT(preset_config("tiny"), seed=0)
    a = torch.randint(0, 256, (1, 20))
    b = a.clone()
    b[0, 12:] = (b[0, 12:] + 1) % 256
    with torch.no_grad():
        la, lb = model(a), model(b)
    assert torch.allclose(la[0, :12], lb[0, :12], atol=1e-6)
    assert not torch.allclose(la[0, 12:], lb[0, 12:])


def test_structure_is_pre_ln_untied_bias_free_head() -> None:
    model = TinyGPT(preset_config("small"), seed=0)
    assert model.head.bias is None
    assert model.head.weight.data_ptr() != model.tok_emb.weight.data_ptr()
    assert len(model.blocks) == 4
    names = [n for n, _ in model.named_parameters()]
    assert names[:2] == ["tok_emb.weight", "pos_emb.weight"]


def test_seeded_init_is_reproducible_and_leaves_global_rng_alone() -> None:
    torch.manual_seed(123)
    before = torch.get_rng_state()
    a, b = TinyGPT(preset_config("tiny"), seed=5), TinyGPT(preset_config("tiny"), seed=5)
    assert torch.equal(torch.get_rng_state(), before)
    assert all(torch.equal(p, q) for p, q in zip(a.parameters(), b.parameters(), strict=True))
    c = TinyGPT(preset_config("tiny"), seed=6)
    assert not torch.equal(a.tok_emb.weight, c.tok_emb.weight)
    assert a.tok_emb.weight.std().item() == pytest.approx(0.02, rel=0.1)


@given(
    vocab=st.integers(2, 300),
    seq=st.integers(1, 40),
    layers=st.integers(1, 3),
    heads=st.integers(1, 4),
    head_dim=st.integers(1, 8),
)
@settings(max_examples=25, deadline=None)
def test_param_count_formula_matches_module(
    vocab: int, seq: int, layers: int, heads: int, head_dim: int
) -> None:
    cfg = ModelConfig(
        vocab_size=vocab, seq_len=seq, n_layer=layers, n_head=heads, d_model=heads * head_dim
    )
    assert TinyGPT(cfg).param_count() == cfg.param_count()


def test_paper_presets() -> None:
    paper = PRESETS["paper"]
    assert (paper.n_layer, paper.d_model, paper.n_head, paper.seq_len) == (8, 128, 4, 128)
    # the authors' TinyGPT with the GPT-2 vocabulary: 14,468,608 parameters (spec §3, "Model")
    assert PRESETS["paper-gpt2vocab"].param_count() == 14_468_608
    assert TinyGPT(PRESETS["tiny"]).param_count() == PRESETS["tiny"].param_count()


def test_bad_configs_are_one_line_errors() -> None:
    with pytest.raises(UserInputError, match=r"model\.preset.*tiny, small, paper"):
        preset_config("huge")
    with pytest.raises(UserInputError, match="multiple of n_head") as exc:
        preset_config("tiny", d_model=65)
    assert "\n" not in str(exc.value)
    with pytest.raises(UserInputError, match=r"model\.n_layer"):
        parse_model_config(
            {"vocab_size": 10, "seq_len": 8, "n_layer": 0, "n_head": 1, "d_model": 4}
        )
