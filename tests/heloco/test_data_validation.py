"""ValidationSet.evaluate: fixed evenly spaced windows, per-language means, mode restored."""

from __future__ import annotations

import math

import pytest
import torch
import torch.nn.functional as F
from torch import nn

from heloco.data import ValidationSet
from heloco.data.validation import window_starts
from shardmeter.errors import UserInputError


class Bigram(nn.Module):
    """Logits depend only on the current token: an exact, cheap reference model."""

    def __init__(self, vocab: int) -> None:
        super().__init__()
        self.table = nn.Parameter(
            torch.randn(vocab, vocab, generator=torch.Generator().manual_seed(0))
        )

    def forward(self, tokens: torch.Tensor) -> torch.Tensor:
        return self.table[tokens]


def manual_loss(model: Bigram, tokens: torch.Tensor, starts: torch.Tensor, seq_len: int) -> float:
    losses = []
    for s in starts.tolist():
        w = tokens[s : s + seq_len + 1].long()
        losses.append(F.cross_entropy(model(w[:-1]), w[1:]).item())
    return sum(losses) / len(losses)


def test_window_starts_cover_the_text_evenly() -> None:
    starts = window_starts(1000, 10, 5)
    assert starts.tolist() == [0, 247, 494, 742, 989]  # last start 989 ends at token 999
    assert window_starts(20, 10, None).tolist() == list(range(10))  # every stride-1 window
    assert window_starts(20, 10, 50).tolist() == list(range(10))


def test_evaluate_matches_manual_per_language_mean() -> None:
    gen = torch.Generator().manual_seed(1)
    tokens = (
        torch.randint(0, 7, (300,), generator=gen, dtype=torch.int32),
        torch.randint(0, 7, (120,), generator=gen, dtype=torch.int32),
    )
    val = ValidationSet(("aa", "bb"), tokens, seq_len=6)
    model = Bigram(7)
    model.train()
    result = val.evaluate(model, batch_size=4, max_windows_per_language=9)
    assert model.training  # mode restored
    for lang, toks in zip(val.languages, tokens, strict=True):
        expected = manual_loss(model, toks, window_starts(toks.numel(), 6, 9), 6)
        assert result.per_language[lang] == pytest.approx(expected, rel=1e-6)
    assert result.overall == pytest.approx(sum(result.per_language.values()) / 2)
    full = val.evaluate(model, batch_size=1000, max_windows_per_language=None)
    assert full.per_language["bb"] == pytest.approx(
        manual_loss(model, tokens[1], torch.arange(114), 6), rel=1e-6
    )
    assert not math.isclose(full.overall, result.overall)


def test_evaluate_is_deterministic_and_batch_size_independent() -> None:
    tokens = (torch.arange(200, dtype=torch.int32) % 5,)
    val = ValidationSet(("aa",), tokens, seq_len=8)
    model = Bigram(5)
    a = val.evaluate(model, batch_size=3, max_windows_per_language=17)
    b = val.evaluate(model, batch_size=17, max_windows_per_language=17)
    assert a.overall == pytest.approx(b.overall, rel=1e-6)


@pytest.mark.parametrize(
    ("kwargs", "field"),
    [
        ({"batch_size": 0}, "batch_size"),
        ({"max_windows_per_language": 0}, "max_windows_per_language"),
    ],
)
def test_evaluate_rejects_bad_sizes(kwargs: dict[str, int], field: str) -> None:
    val = ValidationSet(("aa",), (torch.zeros(50, dtype=torch.int32),), seq_len=8)
    with pytest.raises(UserInputError, match=field):
        val.evaluate(Bigram(2), **kwargs)
