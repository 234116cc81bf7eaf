"""HeLoCo data: tokenizers, per-language corpora, non-IID partitions, streams, validation."""

from heloco.data.build import DataConfig, WorkerData, build_data, parse_data_config
from heloco.data.corpus import Corpus, load_corpus
from heloco.data.partition import ASSIGNMENTS, partition
from heloco.data.seeding import derive_seed
from heloco.data.stream import BatchSampler, TokenStream
from heloco.data.synthetic import synthetic_corpus
from heloco.data.tokenizer import BpeTokenizer, ByteTokenizer, Tokenizer, cached_bpe, train_bpe
from heloco.data.validation import ValidationSet, ValLoss

__all__ = [
    "ASSIGNMENTS",
    "BatchSampler",
    "BpeTokenizer",
    "ByteTokenizer",
    "Corpus",
    "DataConfig",
    "TokenStream",
    "Tokenizer",
    "ValLoss",
    "ValidationSet",
    "WorkerData",
    "build_data",
    "cached_bpe",
    "derive_seed",
    "load_corpus",
    "parse_data_config",
    "partition",
    "synthetic_corpus",
    "train_bpe",
]
