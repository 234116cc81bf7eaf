"""Tokenizers: byte round trip, BPE round trip, determinism and the atomic cache."""

from __future__ import annotations

from pathlib import Path

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from heloco.data import ByteTokenizer, cached_bpe, synthetic_corpus, train_bpe
from shardmeter.errors import UserInputError


@given(st.text(max_size=200))
@settings(max_examples=200, deadline=None)
def test_byte_round_trip(text: str) -> None:
    tok = ByteTokenizer()
    ids = tok.encode(text)
    assert ids.dtype == np.int32
    assert ids.size == len(text.encode("utf-8"))
    assert int(ids.max(initial=0)) < tok.vocab_size == 256
    assert tok.decode(ids) == text


@pytest.fixture(scope="module")
def small_texts() -> list[str]:
    corpus = synthetic_corpus(6000)
    return [t[:6000] for t in corpus.texts] + ["Grüße, ÿ€ und 日本語.\n"]


def test_bpe_round_trip_and_vocab(small_texts: list[str]) -> None:
    bpe = train_bpe(small_texts, 400)
    assert 256 < bpe.vocab_size <= 400
    for text in [*small_texts, "unseen: ¿Qué tal? 🙂\n  double  spaces\n"]:
        ids = bpe.encode(text)
        assert bpe.decode(ids) == text
        assert ids.max() < bpe.vocab_size
    # merges compress: fewer tokens than bytes on training-like text
    assert bpe.encode(small_texts[0]).size < 0.8 * len(small_texts[0].encode())


def test_bpe_training_is_deterministic(small_texts: list[str]) -> None:
    assert train_bpe(small_texts, 320).to_json() == train_bpe(small_texts, 320).to_json()


def test_bpe_cache_reuses_trained_file(tmp_path: Path, small_texts: list[str]) -> None:
    first = cached_bpe(small_texts, 300, tmp_path)
    files = list((tmp_path / "tokenizers").iterdir())
    assert len(files) == 1 and files[0].suffix == ".json"
    assert "-300.json" in files[0].name
    stamp = files[0].stat().st_mtime_ns
    second = cached_bpe(small_texts, 300, tmp_path)
    assert files[0].stat().st_mtime_ns == stamp  # loaded, not retrained
    assert second.to_json() == first.to_json()
    cached_bpe(small_texts[:2], 300, tmp_path)  # another corpus -> another key
    assert len(list((tmp_path / "tokenizers").iterdir())) == 2


@pytest.mark.parametrize("vocab", [0, 256, 10**9])
def test_bpe_rejects_bad_vocab(vocab: int) -> None:
    with pytest.raises(UserInputError, match="bpe_vocab_size"):
        train_bpe(["abc"], vocab)
