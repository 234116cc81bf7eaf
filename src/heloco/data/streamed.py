"""Streamed data for ``data.sampling = "stream"``: validation heads and per-worker streams.

Cheap to build in every process (the server, each worker): it reads only the validation head
of each source; training records are read lazily by each worker's own sampler
(:mod:`heloco.data.packed`). Workers that share a source split its records round-robin.
"""

from __future__ import annotations

from pathlib import Path
from typing import TYPE_CHECKING

import numpy as np
import torch

from heloco.data.packed import PackedStream, Source
from heloco.data.partition import partition
from heloco.data.seeding import derive_seed
from heloco.data.sources import folder_sources, glob_sources, validation_head
from heloco.data.tokenizer import ByteTokenizer, FileTokenizer, Tokenizer
from heloco.data.validation import ValidationSet
from heloco.data.worker_data import WorkerData, encode_checked
from shardmeter.errors import UserInputError

if TYPE_CHECKING:
    from heloco.config import DataConfig

PARTITION_KEY = 0  # the same derive_seed keys as the windows path (heloco.data.build)
STREAM_KEY = 1


def stream_tokenizer(cfg: DataConfig) -> Tokenizer:
    """Bytes or a local tokenizer.json: a streamed corpus is never read whole to train a BPE."""
    if cfg.tokenizer == "byte":
        return ByteTokenizer()
    if cfg.tokenizer == "bpe":
        raise UserInputError(
            "data.tokenizer",
            "bpe",
            "byte or a local tokenizer.json with sampling = 'stream' (train a BPE once, save "
            "its tokenizer.json, and point data.tokenizer at it)",
        )
    return FileTokenizer(Path(cfg.tokenizer).expanduser())


def shares(mixtures: np.ndarray) -> list[tuple[tuple[int, int], ...]]:
    """Per worker and source: (its rank among the source's readers, number of readers)."""
    n_workers, n_sources = mixtures.shape
    out: list[list[tuple[int, int]]] = [[] for _ in range(n_workers)]
    for lang in range(n_sources):
        readers = [w for w in range(n_workers) if mixtures[w, lang] > 0]
        for w in range(n_workers):
            out[w].append((readers.index(w), len(readers)) if w in readers else (0, 1))
    return [tuple(row) for row in out]


def build_streamed(cfg: DataConfig, n_workers: int, seed: int) -> WorkerData:
    """Validation heads and each worker's lazy stream of its share of the sources."""
    if cfg.sources is not None:
        found = glob_sources(cfg.sources)
    elif cfg.data_dir is not None:
        found = folder_sources(cfg.data_dir)
    else:
        raise UserInputError(
            "data.sampling",
            "stream",
            "data.data_dir or data.sources (the synthetic corpus is in memory)",
        )
    tokenizer = stream_tokenizer(cfg)
    sources, val = [], []
    for name, files in found.items():
        head, start = validation_head(files, cfg.text_field, cfg.val_chars_per_language, name)
        val.append(encode_checked(tokenizer, head, name, "validation", cfg))
        sources.append(Source(name, tuple(files), start))
    languages = [s.name for s in sources]
    mixtures = partition(
        cfg.assignment,
        n_workers,
        len(languages),
        cfg.dirichlet_alpha,
        derive_seed(seed, PARTITION_KEY),
    )
    streams = [
        PackedStream(
            sources=tuple(sources),
            weights=torch.from_numpy(row.copy()),
            shares=share,
            tokenizer=tokenizer,
            text_field=cfg.text_field,
            seq_len=cfg.seq_len,
            seed=derive_seed(seed, STREAM_KEY, i),
        )
        for i, (row, share) in enumerate(zip(mixtures, shares(mixtures), strict=True))
    ]
    return WorkerData(
        streams=streams,
        validation=ValidationSet(tuple(languages), tuple(val), cfg.seq_len),
        vocab_size=tokenizer.vocab_size,
        languages=languages,
        worker_languages=[s.mixture for s in streams],
        tokenizer=tokenizer,
    )
