"""build_data: equal validation shares disjoint from training, streams, errors, real corpus."""

from __future__ import annotations

from pathlib import Path

import numpy as np
import pytest
import torch

from heloco.data import DataConfig, TokenStream, WorkerData, build_data, parse_data_config
from shardmeter.errors import UserInputError
from shardmeter.paths import missing_shared_reason, shared_path

SMALL = {"val_chars_per_language": 2000, "synthetic_chars_per_language": 12_000, "seq_len": 16}


def small_data(n_workers: int = 5, seed: int = 0, **overrides: object) -> WorkerData:
    return build_data(DataConfig.model_validate({**SMALL, **overrides}), n_workers, seed)


def write_corpus(folder: Path, texts: dict[str, str]) -> Path:
    for lang, text in texts.items():
        (folder / f"{lang}.txt").write_text(text, encoding="utf-8")
    return folder


def test_validation_share_is_equal_and_excluded_from_training(tmp_path: Path) -> None:
    rng = np.random.default_rng(0)
    texts = {
        lang: "".join(rng.choice(list(letters), size=3000))
        for lang, letters in {"aa": "abc ", "bb": "xyz ", "cc": "mnö "}.items()
    }
    data = build_data(
        DataConfig(data_dir=write_corpus(tmp_path, texts), val_chars_per_language=1000, seq_len=8),
        3,
        0,
    )
    stream = data.streams[0]
    for i, lang in enumerate(data.languages):
        val = data.tokenizer.decode(data.validation.tokens[i].numpy())
        start, length = int(stream.starts[i]), int(stream.lengths[i])
        train = data.tokenizer.decode(stream.tokens[start : start + length].numpy())
        assert len(val) == 1000  # the same character share for every language
        assert val == texts[lang][:1000]
        assert train == texts[lang][1000:]  # the rest, and only the rest, is training text


def test_train_fraction_keeps_the_head_of_the_training_text() -> None:
    full, half = small_data(), small_data(train_fraction=0.5)
    ratio = half.streams[0].lengths.double() / full.streams[0].lengths.double()
    assert torch.allclose(ratio, torch.full_like(ratio, 0.5), atol=0.01)
    assert all(
        torch.equal(a, b)
        for a, b in zip(full.validation.tokens, half.validation.tokens, strict=True)
    )


def test_worker_mixtures_follow_the_assignment() -> None:
    data = small_data(7)
    assert [max(m, key=m.__getitem__) for m in data.worker_languages] == [
        data.languages[i % 5] for i in range(7)
    ]
    iid = small_data(3, assignment="iid")
    assert all(set(m.values()) == {0.2} for m in iid.worker_languages)
    dirichlet = small_data(4, assignment="dirichlet", dirichlet_alpha=0.3)
    assert all(abs(sum(m.values()) - 1) < 1e-12 for m in dirichlet.worker_languages)
    assert (
        dirichlet.worker_languages
        == small_data(4, assignment="dirichlet", dirichlet_alpha=0.3).worker_languages
    )
    assert (
        dirichlet.worker_languages
        != small_data(4, 1, assignment="dirichlet", dirichlet_alpha=0.3).worker_languages
    )


def test_batches_are_windows_of_the_worker_languages() -> None:
    data = small_data(5)
    stream = data.streams[2]  # bound to language 2
    lo = int(stream.starts[2])
    hi = lo + int(stream.lengths[2])
    sampler = stream.sampler(32, 16, seed=3)
    inputs, targets = sampler.next()
    assert inputs.shape == targets.shape == (32, 16) and inputs.dtype == torch.int64
    assert torch.equal(inputs[:, 1:], targets[:, :-1])
    lang_tokens = stream.tokens[lo:hi]
    for row_in, row_t in zip(inputs, targets, strict=True):
        window = torch.cat([row_in, row_t[-1:]]).to(torch.int32)
        hits = (lang_tokens.unfold(0, 17, 1) == window).all(dim=1)
        assert bool(hits.any())
    # same seed -> same batches; another seed -> other batches
    again = stream.sampler(32, 16, seed=3).next()[0]
    assert torch.equal(again, inputs)
    assert not torch.equal(stream.sampler(32, 16, seed=4).next()[0], inputs)


def test_mixture_sampling_follows_weights() -> None:
    # language l holds only token l, so a window's first token names its language
    lengths = torch.tensor([50, 80, 30, 60])
    tokens = torch.cat(
        [torch.full((int(n),), lang, dtype=torch.int32) for lang, n in enumerate(lengths)]
    )
    weights = torch.tensor([0.1, 0.0, 0.6, 0.3], dtype=torch.float64)
    stream = TokenStream(
        tokens, torch.cumsum(lengths, 0) - lengths, lengths, weights, ("a", "b", "c", "d"), 8, 0
    )
    inputs, targets = stream.sampler(20_000).next()
    assert torch.equal(
        inputs.min(dim=1).values, targets.max(dim=1).values
    )  # windows never straddle
    share = torch.bincount(inputs[:, 0], minlength=4).double() / 20_000
    assert share[1] == 0
    assert torch.allclose(share, weights, atol=0.015)


def test_sampler_state_resumes_the_sequence() -> None:
    sampler = small_data(1).streams[0].sampler(4, 8, seed=1)
    sampler.next()
    state = sampler.get_state()
    expected = sampler.next()[0]
    sampler.next()
    sampler.set_state(state)
    assert torch.equal(sampler.next()[0], expected)


@pytest.mark.parametrize(
    ("values", "field"),
    [
        ({"assignment": "random"}, "data.assignment"),
        ({"dirichlet_alpha": 0.0}, "data.dirichlet_alpha"),
        ({"dirichlet_alpha": -2}, "data.dirichlet_alpha"),
        ({"tokenizer": "gpt2"}, "data.tokenizer"),
        ({"train_fraction": 0}, "data.train_fraction"),
        ({"train_fraction": 1.5}, "data.train_fraction"),
        ({"val_chars_per_language": 0}, "data.val_chars_per_language"),
        ({"seq_len": 0}, "data.seq_len"),
        ({"bpe_vocab_size": 100}, "data.bpe_vocab_size"),
        ({"unknown_option": 1}, "data.unknown_option"),
    ],
)
def test_bad_config_is_one_line_error(values: dict[str, object], field: str) -> None:
    with pytest.raises(UserInputError) as exc:
        parse_data_config(values)
    assert exc.value.field == field
    assert "\n" not in str(exc.value)


@pytest.mark.parametrize("n_workers", [0, -1, 100_000])
def test_unreasonable_worker_count(n_workers: int) -> None:
    with pytest.raises(UserInputError, match="n_workers"):
        small_data(n_workers)


def test_language_too_short_for_validation_and_a_window(tmp_path: Path) -> None:
    texts = {"aa": "x" * 5000, "bb": "y" * 1005}
    cfg = DataConfig(data_dir=write_corpus(tmp_path, texts), val_chars_per_language=1000, seq_len=8)
    with pytest.raises(
        UserInputError, match=r"language 'bb' \(training\).*seq_len \+ 1 = 9"
    ) as exc:
        build_data(cfg, 2, 0)
    assert "\n" not in str(exc.value)
    (tmp_path / "cc.txt").write_text("")
    with pytest.raises(UserInputError, match="'cc'"):
        build_data(cfg.model_copy(update={"seq_len": 2}), 2, 0)


def test_bpe_data_round_trip(tmp_path: Path) -> None:
    data = small_data(2, tokenizer="bpe", bpe_vocab_size=300, cache_dir=tmp_path)
    assert 256 < data.vocab_size <= 300
    assert max(int(t.max()) for t in data.validation.tokens) < data.vocab_size
    assert len(data.tokenizer.decode(data.validation.tokens[0].numpy())) == 2000
    cached = sorted((tmp_path / "tokens").iterdir())
    assert len(cached) == 10  # train and validation ids of 5 languages
    again = small_data(2, tokenizer="bpe", bpe_vocab_size=300, cache_dir=tmp_path)
    assert sorted((tmp_path / "tokens").iterdir()) == cached
    assert torch.equal(again.streams[0].tokens, data.streams[0].tokens)


def test_real_multilingual_corpus_in_place() -> None:
    folder = shared_path("data", "multilingual")
    if folder is None:
        pytest.skip(missing_shared_reason("data", "multilingual"))
    data = build_data(DataConfig(data_dir=folder, train_fraction=0.05), 5, 42)
    assert data.languages == ["de", "en", "es", "fr", "it"]
    assert data.vocab_size == 256
    assert [m[lang] for m, lang in zip(data.worker_languages, data.languages, strict=True)] == [
        1.0
    ] * 5
    for i, lang in enumerate(data.languages):
        head = (folder / f"{lang}.txt").read_text(encoding="utf-8")[:40_000]
        assert data.tokenizer.decode(data.validation.tokens[i].numpy()) == head
    inputs, _ = data.streams[1].sampler(2, 128, seed=0).next()
    assert inputs.shape == (2, 128)
