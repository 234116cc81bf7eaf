"""Streamed training data: each worker reads its share of the shards in order, packed to seq_len.

``data.sampling = "stream"`` (instead of the paper's random windows over an in-memory corpus):
every language (source) is read record by record from where the worker left off, tokenized,
and cut into windows of ``seq_len + 1`` tokens that follow each other with a stride of
``seq_len`` (each token is a target once), across record boundaries. Workers that share a
language split its records round-robin (record ``i`` goes to the ``i mod m``-th of them), so
no two workers read the same record in an epoch. A batch row draws its language from the
worker's mixture (seeded), as the windows sampler does.

Memory is bounded by a few records per language, never the corpus. The read position (per
language: the record and token offset of the next window; the mixture RNG) is the sampler's
:meth:`PackedSampler.state_dict`, part of the worker's state: a restarted worker continues
exactly where its last accepted round ended, neither replaying nor skipping data.
"""

from __future__ import annotations

from collections import deque
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import numpy as np
import torch

from heloco.data.shards import RecordPos, read_source
from heloco.data.tokenizer import Tokenizer
from shardmeter.errors import UserInputError


@dataclass(frozen=True)
class Source:
    """One language's shards and where its training records start (after validation)."""

    name: str
    files: tuple[Path, ...]
    train_start: RecordPos


class Cursor:
    """Packed windows of one language, read from ``start`` (token ``tok`` of that record);
    only training records ``i`` (counted from the first after the validation head) with
    ``i mod share[1] == share[0]`` are this worker's. Each epoch starts over at that first
    training record: the validation head is never trained on."""

    def __init__(
        self,
        source: Source,
        field: str,
        tokenizer: Tokenizer,
        share: tuple[int, int],
        start: RecordPos,
        tok: int = 0,
    ) -> None:
        self.source = source
        self.field = field
        self.tokenizer = tokenizer
        self.share = share
        self._records = self._mine(start)
        self._buf: deque[tuple[RecordPos, np.ndarray]] = deque()
        self._tok = tok

    def _mine(self, start: RecordPos) -> Iterator[tuple[RecordPos, str]]:
        j, m = self.share
        last_epoch = start.epoch
        files, restart = list(self.source.files), self.source.train_start
        for pos, text in read_source(files, self.field, start, restart=restart):
            if (pos.index - restart.index) % m == j:  # counted from the first training record
                last_epoch = pos.epoch
                yield pos, text
            elif pos.epoch > last_epoch + 1:  # a whole pass without a record of ours
                raise UserInputError(
                    f"data source {self.source.name!r}",
                    f"too few training records for {m} workers",
                    "at least one record per worker that reads it, after the validation head",
                )

    def _fill(self, need: int) -> None:
        have = sum(ids.size for _, ids in self._buf) - self._tok
        while have < need:
            pos, text = next(self._records)
            ids = self.tokenizer.encode(text)
            if ids.size:
                self._buf.append((pos, ids.astype(np.int64, copy=False)))
                have += ids.size

    def take(self, seq_len: int) -> np.ndarray:
        """The next ``seq_len + 1`` tokens; the cursor moves on by ``seq_len``."""
        self._fill(seq_len + 1)
        parts, need, tok = [], seq_len + 1, self._tok
        for _, ids in self._buf:
            piece = ids[tok : tok + need]
            parts.append(piece)
            need -= piece.size
            tok = 0
            if need == 0:
                break
        advance = seq_len
        while advance:
            left = self._buf[0][1].size - self._tok
            if advance < left:
                self._tok += advance
                advance = 0
            else:
                advance -= left
                self._buf.popleft()
                self._tok = 0
        return np.concatenate(parts)

    def position(self) -> tuple[RecordPos, int]:
        """The record and token offset the next window starts at."""
        self._fill(1)
        return self._buf[0][0], self._tok


@dataclass(frozen=True, eq=False)
class PackedStream:
    """One worker's streamed training data (the counterpart of ``TokenStream``)."""

    sources: tuple[Source, ...]
    weights: torch.Tensor  # (L,) float64 mixture
    shares: tuple[tuple[int, int], ...]  # per language: (this worker's rank, readers)
    tokenizer: Tokenizer
    text_field: str
    seq_len: int
    seed: int

    @property
    def languages(self) -> tuple[str, ...]:
        """Source names, in order."""
        return tuple(s.name for s in self.sources)

    @property
    def mixture(self) -> dict[str, float]:
        """Language -> sampling weight."""
        return dict(zip(self.languages, self.weights.tolist(), strict=True))

    def sampler(
        self, batch_size: int, seq_len: int | None = None, seed: int | None = None
    ) -> PackedSampler:
        """A batch reader over this stream, its language draws seeded by ``seed``."""
        return PackedSampler(
            self,
            batch_size,
            self.seq_len if seq_len is None else seq_len,
            self.seed if seed is None else seed,
        )


class PackedSampler:
    """``(inputs, targets)`` int64 batches of shape ``(batch_size, seq_len)``, read in order."""

    def __init__(self, stream: PackedStream, batch_size: int, seq_len: int, seed: int) -> None:
        if batch_size < 1:
            raise UserInputError("batch_size", batch_size, "an integer >= 1")
        if seq_len < 1:
            raise UserInputError("seq_len", seq_len, "an integer >= 1")
        self.stream = stream
        self.batch_size = batch_size
        self.seq_len = seq_len
        self.generator = torch.Generator().manual_seed(seed)
        self._cursors: dict[int, Cursor] = {}

    @property
    def tokens_per_batch(self) -> int:
        """Training tokens in one batch (batch_size × seq_len)."""
        return self.batch_size * self.seq_len

    def _cursor(self, lang: int, start: RecordPos | None = None, tok: int = 0) -> Cursor:
        if lang not in self._cursors or start is not None:
            s = self.stream
            source = s.sources[lang]
            self._cursors[lang] = Cursor(
                source,
                s.text_field,
                s.tokenizer,
                s.shares[lang],
                source.train_start if start is None else start,
                tok,
            )
        return self._cursors[lang]

    def next(self) -> tuple[torch.Tensor, torch.Tensor]:
        """The next batch: targets are inputs shifted left by one token."""
        w = self.stream.weights
        langs = torch.multinomial(w, self.batch_size, replacement=True, generator=self.generator)
        rows = [self._cursor(int(lang)).take(self.seq_len) for lang in langs.tolist()]
        window = torch.from_numpy(np.stack(rows))
        return window[:, :-1], window[:, 1:]

    def state_dict(self) -> dict[str, Any]:
        """The read position: per language the next window's record and token offset, and
        the mixture RNG (``{"meta": JSON, "tensors": {"rng": ...}}``)."""
        cursors = {}
        for lang, cursor in self._cursors.items():
            pos, tok = cursor.position()
            cursors[self.stream.sources[lang].name] = {"pos": pos.to_json(), "tok": tok}
        return {"meta": {"cursors": cursors}, "tensors": {"rng": self.generator.get_state()}}

    def load_state_dict(self, state: dict[str, Any]) -> None:
        """Continue from :meth:`state_dict` output."""
        self.generator.set_state(state["tensors"]["rng"])
        names = {s.name: i for i, s in enumerate(self.stream.sources)}
        self._cursors = {}
        for name, where in state["meta"].get("cursors", {}).items():
            if name not in names:
                raise ValueError(f"saved data position of unknown source {name!r}")
            self._cursor(names[name], RecordPos.from_json(where["pos"]), int(where["tok"]))
