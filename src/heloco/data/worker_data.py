"""What a run's data gives its workers and evaluator, and the checked encoding of one text:
shared by the corpus builder (:mod:`heloco.data.build`) and the streamed builder
(:mod:`heloco.data.streamed`)."""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np
import torch

from heloco.config import DataConfig
from heloco.data.packed import PackedStream
from heloco.data.stream import TokenStream
from heloco.data.tokenizer import Tokenizer, cached_encode
from heloco.data.validation import ValidationSet
from shardmeter.errors import UserInputError


@dataclass(frozen=True, eq=False)
class WorkerData:
    """Everything the workers and the evaluator need; streams share one token tensor."""

    streams: list[TokenStream] | list[PackedStream]
    validation: ValidationSet
    vocab_size: int
    languages: list[str]
    worker_languages: list[dict[str, float]]
    tokenizer: Tokenizer


def encode_checked(
    tokenizer: Tokenizer, text: str, language: str, part: str, cfg: DataConfig
) -> torch.Tensor:
    """Tokens of one text as int32, which must hold at least one ``seq_len + 1`` window."""
    seq_len = cfg.seq_len
    ids = cached_encode(tokenizer, text, cfg.cache_dir)
    if ids.size < seq_len + 1:
        raise UserInputError(
            f"language {language!r} ({part})",
            f"{ids.size} tokens",
            f"at least seq_len + 1 = {seq_len + 1} tokens (more text, or a smaller seq_len)",
        )
    return torch.from_numpy(ids.astype(np.int32, copy=False))
