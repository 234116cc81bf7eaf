"""Training batches: random stride-1 windows from a worker's language mixture.

All languages' training tokens live in one flat int32 tensor shared by every worker's stream.
A batch draws, per sequence, a language from the worker's mixture and then a uniform start
offset inside that language (spec §3: "random stride-1 windows"), and gathers the
``(B, T+1)`` window with one index operation: no Python work per token.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

import torch

from shardmeter.errors import UserInputError


def gather_windows(
    tokens: torch.Tensor, starts: torch.Tensor, offsets: torch.Tensor
) -> torch.Tensor:
    """``(N, len(offsets))`` int64 windows ``tokens[s + offsets]`` for each start ``s``."""
    return tokens[starts.unsqueeze(1) + offsets].long()


@dataclass(frozen=True, eq=False)
class TokenStream:
    """One worker's training data: shared token storage plus its language mixture.

    ``tokens`` holds every language back to back; language ``l`` is
    ``tokens[starts[l] : starts[l] + lengths[l]]``. ``weights`` is the mixture (sums to 1).
    ``seed`` seeds :meth:`sampler` when no other seed is given.
    """

    tokens: torch.Tensor  # (N,) int32
    starts: torch.Tensor  # (L,) int64
    lengths: torch.Tensor  # (L,) int64
    weights: torch.Tensor  # (L,) float64
    languages: tuple[str, ...]
    seq_len: int
    seed: int

    @property
    def mixture(self) -> dict[str, float]:
        """Language -> sampling weight."""
        return dict(zip(self.languages, self.weights.tolist(), strict=True))

    @property
    def max_seq_len(self) -> int:
        """Longest window (in inputs) every language this stream samples can hold."""
        active = self.lengths[self.weights > 0]
        return int(active.min()) - 1

    def sampler(
        self, batch_size: int, seq_len: int | None = None, seed: int | None = None
    ) -> BatchSampler:
        """A batch sampler over this stream (its own generator, seeded by ``seed``)."""
        return BatchSampler(
            self,
            batch_size,
            self.seq_len if seq_len is None else seq_len,
            self.seed if seed is None else seed,
        )


class BatchSampler:
    """Draws ``(inputs, targets)`` int64 batches of shape ``(batch_size, seq_len)``.

    Deterministic: the same stream, shape and seed give the same batches. Its generator state
    (a uint8 tensor) is checkpointable through :meth:`get_state` / :meth:`set_state`.
    """

    def __init__(self, stream: TokenStream, batch_size: int, seq_len: int, seed: int) -> None:
        if batch_size < 1:
            raise UserInputError("batch_size", batch_size, "an integer >= 1")
        if not 1 <= seq_len <= stream.max_seq_len:
            raise UserInputError(
                "seq_len", seq_len, f"an integer in [1, {stream.max_seq_len}] for this data"
            )
        self.batch_size = batch_size
        self.seq_len = seq_len
        self.generator = torch.Generator().manual_seed(seed)
        self._tokens = stream.tokens
        self._weights = stream.weights
        self._starts = stream.starts
        self._spans = (stream.lengths - seq_len).clamp(min=1).to(torch.float64)
        self._arange = torch.arange(seq_len + 1)

    @property
    def tokens_per_batch(self) -> int:
        """Training tokens in one batch (batch_size × seq_len)."""
        return self.batch_size * self.seq_len

    def next(self) -> tuple[torch.Tensor, torch.Tensor]:
        """The next batch: targets are inputs shifted left by one token."""
        g = self.generator
        lang = torch.multinomial(self._weights, self.batch_size, replacement=True, generator=g)
        u = torch.rand(self.batch_size, dtype=torch.float64, generator=g)
        offsets = self._starts[lang] + (u * self._spans[lang]).long()
        window = gather_windows(self._tokens, offsets, self._arange)
        return window[:, :-1], window[:, 1:]

    def get_state(self) -> torch.Tensor:
        """The sampling RNG state (for checkpoints)."""
        return self.generator.get_state()

    def set_state(self, state: torch.Tensor) -> None:
        """Restore the sampling RNG state from :meth:`get_state`."""
        self.generator.set_state(state)

    def state_dict(self) -> dict[str, Any]:
        """The read position as ``{"meta": {}, "tensors": {"rng": state}}`` (worker state)."""
        return {"meta": {}, "tensors": {"rng": self.get_state()}}

    def load_state_dict(self, state: dict[str, Any]) -> None:
        """Restore :meth:`state_dict` output."""
        self.set_state(state["tensors"]["rng"])
