"""From a data config to per-worker token streams and the shared validation set."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import torch
from pydantic import (
    ValidationError,
)

from heloco.config import DataConfig
from heloco.data.corpus import Corpus, LanguageSplit, load_corpus, sources_corpus, split_language
from heloco.data.partition import partition
from heloco.data.seeding import derive_seed
from heloco.data.stream import TokenStream
from heloco.data.streamed import build_streamed
from heloco.data.synthetic import synthetic_corpus
from heloco.data.tokenizer import (
    ByteTokenizer,
    FileTokenizer,
    Tokenizer,
    cached_bpe,
)
from heloco.data.validation import ValidationSet
from heloco.data.worker_data import WorkerData, encode_checked
from shardmeter.errors import UserInputError, from_pydantic

MAX_WORKERS = 1024
PARTITION_KEY = 0  # derive_seed key of the Dirichlet partition
STREAM_KEY = 1  # derive_seed key of the per-worker streams


def parse_data_config(values: dict[str, Any]) -> DataConfig:
    """Validate user values into a DataConfig; bad input raises a one-line UserInputError."""
    try:
        return DataConfig.model_validate(values)
    except ValidationError as exc:
        raise from_pydantic(exc, "data") from None


def make_tokenizer(cfg: DataConfig, splits: list[LanguageSplit]) -> Tokenizer:
    """The byte tokenizer, a BPE trained on the training text only (cached), or a file."""
    if cfg.tokenizer == "byte":
        return ByteTokenizer()
    if cfg.tokenizer != "bpe":
        return FileTokenizer(Path(cfg.tokenizer).expanduser())
    return cached_bpe([s.train for s in splits], cfg.bpe_vocab_size, cfg.cache_dir)


def corpus_of(cfg: DataConfig) -> Corpus:
    """The whole text per language: the sources, the data folder or the synthetic corpus."""
    if cfg.sources is not None:
        return sources_corpus(cfg.sources, cfg.text_field)
    if cfg.data_dir is not None:
        return load_corpus(cfg.data_dir, cfg.text_field)
    return synthetic_corpus(cfg.synthetic_chars_per_language)


def build_data(cfg: DataConfig, n_workers: int, seed: int) -> WorkerData:
    """Load, split, tokenise and partition the corpus for ``n_workers`` workers."""
    if not 1 <= n_workers <= MAX_WORKERS:
        raise UserInputError("n_workers", n_workers, f"an integer in [1, {MAX_WORKERS}]")
    if cfg.sampling == "stream":
        return build_streamed(cfg, n_workers, seed)
    corpus = corpus_of(cfg)
    splits = [
        split_language(lang, text, cfg.val_chars_per_language, cfg.train_fraction)
        for lang, text in zip(corpus.languages, corpus.texts, strict=True)
    ]
    tokenizer = make_tokenizer(cfg, splits)
    train = [encode_checked(tokenizer, s.train, s.language, "training", cfg) for s in splits]
    val = tuple(
        encode_checked(tokenizer, s.validation, s.language, "validation", cfg) for s in splits
    )

    lengths = torch.tensor([t.numel() for t in train], dtype=torch.int64)
    starts = torch.cumsum(lengths, 0) - lengths
    tokens = torch.cat(train)
    languages = list(corpus.languages)
    mixtures = partition(
        cfg.assignment,
        n_workers,
        len(languages),
        cfg.dirichlet_alpha,
        derive_seed(seed, PARTITION_KEY),
    )
    streams = [
        TokenStream(
            tokens=tokens,
            starts=starts,
            lengths=lengths,
            weights=torch.from_numpy(row.copy()),
            languages=tuple(languages),
            seq_len=cfg.seq_len,
            seed=derive_seed(seed, STREAM_KEY, i),
        )
        for i, row in enumerate(mixtures)
    ]
    return WorkerData(
        streams=streams,
        validation=ValidationSet(tuple(languages), val, cfg.seq_len),
        vocab_size=tokenizer.vocab_size,
        languages=languages,
        worker_languages=[s.mixture for s in streams],
        tokenizer=tokenizer,
    )
