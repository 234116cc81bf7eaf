"""Tokenizers: raw UTF-8 bytes (no files, no downloads), a byte-level BPE trained locally, or
a local ``tokenizer.json`` (any Hugging Face fast tokenizer, e.g. a Llama or GPT-2 one).

The BPE tokenizer is trained with the Hugging Face ``tokenizers`` package on the training text
only, and cached as JSON under a key of (corpus hash, vocab size) so a run trains it once.
Every tokenizer converts to a ``tokenizers.Tokenizer`` (:func:`to_hf`), so an exported model
ships the exact tokenizer it was trained with.
"""

from __future__ import annotations

import hashlib
import io
import os
from collections.abc import Iterable, Sequence
from pathlib import Path
from typing import Protocol

import numpy as np
from tokenizers import Tokenizer as HFTokenizer
from tokenizers import decoders, models, pre_tokenizers, trainers

from shardmeter.errors import UserInputError
from shardmeter.io import write_atomic

BYTE_VOCAB = 256
BPE_MIN_VOCAB = BYTE_VOCAB + 1
BPE_MAX_VOCAB = 1 << 20
BPE_FORMAT = "bytelevel-bpe-v1"  # bump when the training recipe changes (invalidates caches)


class Tokenizer(Protocol):
    """Text <-> token ids. ``encode`` returns a 1-D int32 numpy array."""

    name: str
    vocab_size: int

    def encode(self, text: str) -> np.ndarray: ...

    def decode(self, ids: Sequence[int] | np.ndarray) -> str: ...


class ByteTokenizer:
    """One token per UTF-8 byte: vocab 256, no special tokens, lossless."""

    name = "byte"
    vocab_size = BYTE_VOCAB

    def encode(self, text: str) -> np.ndarray:
        return np.frombuffer(text.encode("utf-8"), dtype=np.uint8).astype(np.int32)

    def decode(self, ids: Sequence[int] | np.ndarray) -> str:
        return np.asarray(ids).astype(np.uint8).tobytes().decode("utf-8", errors="replace")


def bytes_to_unicode() -> dict[int, str]:
    """GPT-2's reversible map from the 256 byte values to printable characters (Radford et
    al. 2019, ``encoder.py``), which the ``tokenizers`` ByteLevel pre-tokenizer applies."""
    printable = [
        *range(ord("!"), ord("~") + 1),
        *range(ord("¡"), ord("¬") + 1),
        *range(ord("®"), ord("ÿ") + 1),
    ]
    chars = {b: chr(b) for b in printable}
    extra = (b for b in range(BYTE_VOCAB) if b not in chars)
    for n, b in enumerate(extra):
        chars[b] = chr(BYTE_VOCAB + n)
    return chars


def byte_tokenizer_hf() -> HFTokenizer:
    """:class:`ByteTokenizer` as a ``tokenizers.Tokenizer``: id b is byte b, no merges."""
    vocab = {ch: b for b, ch in bytes_to_unicode().items()}
    tok = HFTokenizer(models.BPE(vocab=vocab, merges=[]))
    tok.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False, use_regex=False)
    tok.decoder = decoders.ByteLevel()
    return tok


class BpeTokenizer:
    """A trained byte-level BPE (GPT-2 style pre-tokenisation, no special tokens), lossless."""

    name = "bpe"

    def __init__(self, tokenizer: HFTokenizer) -> None:
        self._tok = tokenizer
        self.vocab_size = tokenizer.get_vocab_size()

    def encode(self, text: str) -> np.ndarray:
        """Encode line by line, in parallel (about 2x faster than one long string). Ids can
        differ from whole-string encoding only where a whitespace run spans a line break;
        decoding is exact either way."""
        encodings = self._tok.encode_batch_fast(text.splitlines(keepends=True))
        ids = [np.asarray(e.ids, dtype=np.int32) for e in encodings]
        return np.concatenate(ids) if ids else np.zeros(0, dtype=np.int32)

    def decode(self, ids: Sequence[int] | np.ndarray) -> str:
        return self._tok.decode(np.asarray(ids, dtype=np.int64).tolist())

    def to_json(self) -> str:
        """The trained BPE tokenizer as a `tokenizers` JSON string."""
        return self._tok.to_str()

    @property
    def hf(self) -> HFTokenizer:
        """The underlying ``tokenizers.Tokenizer``."""
        return self._tok


class FileTokenizer(BpeTokenizer):
    """A local ``tokenizer.json`` (a folder holding one also works), e.g. a Llama tokenizer.

    Encoded line by line like the BPE; ids are whatever the file defines.
    """

    name = "file"

    def __init__(self, path: Path) -> None:
        file = path / "tokenizer.json" if path.is_dir() else path
        if not file.is_file():
            raise UserInputError(
                "data.tokenizer", str(path), "byte, bpe, or a local tokenizer.json (or its folder)"
            )
        try:
            tok = HFTokenizer.from_file(str(file))
        except Exception as exc:  # tokenizers raises its own exception type
            raise UserInputError(
                "data.tokenizer", str(file), f"a tokenizers JSON file ({str(exc)[:120]})"
            ) from None
        super().__init__(tok)
        self.path = file

    def encode(self, text: str) -> np.ndarray:
        """Ids of ``text`` without the file's special tokens (no BOS added per line)."""
        lines = text.splitlines(keepends=True)
        encodings = self._tok.encode_batch_fast(lines, add_special_tokens=False)
        ids = [np.asarray(e.ids, dtype=np.int32) for e in encodings]
        return np.concatenate(ids) if ids else np.zeros(0, dtype=np.int32)


def to_hf(tokenizer: Tokenizer) -> HFTokenizer | None:
    """The ``tokenizers.Tokenizer`` equivalent of ``tokenizer`` (None if it has none)."""
    if isinstance(tokenizer, ByteTokenizer):
        return byte_tokenizer_hf()
    if isinstance(tokenizer, BpeTokenizer):
        return tokenizer.hf
    return None


def train_bpe(texts: Iterable[str], vocab_size: int) -> BpeTokenizer:
    """Train a byte-level BPE of ``vocab_size`` tokens (256 byte symbols + merges) on ``texts``."""
    if not BPE_MIN_VOCAB <= vocab_size <= BPE_MAX_VOCAB:
        raise UserInputError(
            "bpe_vocab_size", vocab_size, f"an integer in [{BPE_MIN_VOCAB}, {BPE_MAX_VOCAB}]"
        )
    tok = HFTokenizer(models.BPE())
    tok.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False)
    tok.decoder = decoders.ByteLevel()
    trainer = trainers.BpeTrainer(
        vocab_size=vocab_size,
        min_frequency=2,
        initial_alphabet=pre_tokenizers.ByteLevel.alphabet(),
        special_tokens=[],
        show_progress=False,
    )
    lines = (line for text in texts for line in text.splitlines(keepends=True))
    tok.train_from_iterator(lines, trainer=trainer)
    return BpeTokenizer(tok)


def corpus_hash(texts: Sequence[str]) -> str:
    """SHA-256 of the texts (length-prefixed, so boundaries count), hex."""
    h = hashlib.sha256(BPE_FORMAT.encode())
    for text in texts:
        data = text.encode("utf-8")
        h.update(len(data).to_bytes(8, "little"))
        h.update(data)
    return h.hexdigest()


def default_cache_dir() -> Path:
    """``$HELOCO_CACHE`` if set, else ``$XDG_CACHE_HOME/heloco`` (``~/.cache/heloco``)."""
    env = os.environ.get("HELOCO_CACHE")
    if env:
        return Path(env).expanduser()
    xdg = os.environ.get("XDG_CACHE_HOME")
    return (Path(xdg) if xdg else Path.home() / ".cache") / "heloco"


def atomic_write(path: Path, data: bytes) -> None:
    """Write ``data`` to ``path`` atomically (``shardmeter.io.write_atomic``), never half-written."""
    write_atomic(path, data)


def cached_bpe(texts: Sequence[str], vocab_size: int, cache_dir: Path | None) -> BpeTokenizer:
    """Load the BPE trained on ``texts`` from the cache, or train it and cache it atomically."""
    path = (
        (cache_dir or default_cache_dir())
        / "tokenizers"
        / f"bpe-{corpus_hash(texts)[:24]}-{vocab_size}.json"
    )
    if path.is_file():
        return BpeTokenizer(HFTokenizer.from_file(str(path)))
    bpe = train_bpe(texts, vocab_size)
    atomic_write(path, bpe.to_json().encode("utf-8"))
    return bpe


def cached_encode(tokenizer: Tokenizer, text: str, cache_dir: Path | None) -> np.ndarray:
    """``tokenizer.encode(text)``; BPE ids are cached as ``.npy`` under a key of (tokenizer,
    text), since encoding the 15 MB multilingual corpus takes about a minute."""
    if not isinstance(tokenizer, BpeTokenizer):
        return tokenizer.encode(text)
    key = corpus_hash([tokenizer.to_json(), text])[:32]
    path = (cache_dir or default_cache_dir()) / "tokens" / f"bpe-{key}.npy"
    if path.is_file():
        return np.load(path, allow_pickle=False)
    ids = tokenizer.encode(text)
    buffer = io.BytesIO()
    np.save(buffer, ids, allow_pickle=False)
    atomic_write(path, buffer.getvalue())
    return ids
