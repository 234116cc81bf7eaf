"""The multilingual validation set: an equal character share from the head of each language.

The paper evaluates every stride-1 window of the 40,000-character head of each language file
(spec §3, "Validation set"). That is thousands of windows per language, too slow for frequent
CPU evaluation, so by default :meth:`ValidationSet.evaluate` scores a fixed subset: ``n``
windows whose starts are evenly spaced over the whole validation text (the same windows on
every call, no randomness). ``max_windows_per_language=None`` scores every stride-1 window.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass

import numpy as np
import torch
import torch.nn.functional as F
from torch import nn

from heloco.data.stream import gather_windows
from shardmeter.errors import UserInputError

LossFn = Callable[[nn.Module, torch.Tensor, torch.Tensor], torch.Tensor]


@dataclass(frozen=True)
class ValLoss:
    """Mean next-token cross-entropy (nats/token): per language, and their plain mean."""

    overall: float
    per_language: dict[str, float]


def window_starts(n_tokens: int, seq_len: int, max_windows: int | None) -> torch.Tensor:
    """Start offsets of the evaluated ``seq_len + 1``-token windows, evenly spaced."""
    n_possible = n_tokens - seq_len
    if n_possible < 1:
        raise ValueError(f"{n_tokens} tokens cannot hold a window of {seq_len + 1}")
    if max_windows is None or max_windows >= n_possible:
        return torch.arange(n_possible)
    return torch.from_numpy(np.linspace(0, n_possible - 1, max_windows).round().astype(np.int64))


def token_cross_entropy(
    model: nn.Module, inputs: torch.Tensor, targets: torch.Tensor
) -> torch.Tensor:
    """Mean next-token cross-entropy of a model that returns ``(B, T, V)`` logits, or an
    output object holding them as ``.logits`` (Hugging Face causal LMs)."""
    out = model(inputs)
    logits = out if isinstance(out, torch.Tensor) else out.logits
    return F.cross_entropy(logits.reshape(-1, logits.shape[-1]), targets.reshape(-1))


@dataclass(frozen=True, eq=False)
class ValidationSet:
    """Validation tokens per language (int32), never used for training."""

    languages: tuple[str, ...]
    tokens: tuple[torch.Tensor, ...]
    seq_len: int

    def evaluate(
        self,
        model: nn.Module,
        batch_size: int = 64,
        max_windows_per_language: int | None = 64,
        loss_fn: LossFn = token_cross_entropy,
    ) -> ValLoss:
        """Mean cross-entropy per language and overall, under ``torch.inference_mode``.

        Every window weighs the same inside a language; every language weighs the same
        overall (the paper's equal share per language). Restores the model's train/eval mode.
        """
        if batch_size < 1:
            raise UserInputError("batch_size", batch_size, "an integer >= 1")
        if max_windows_per_language is not None and max_windows_per_language < 1:
            raise UserInputError(
                "max_windows_per_language", max_windows_per_language, "an integer >= 1 or None"
            )
        device = next(model.parameters()).device
        was_training = model.training
        model.eval()
        per_language: dict[str, float] = {}
        try:
            with torch.inference_mode():
                for language, tokens in zip(self.languages, self.tokens, strict=True):
                    per_language[language] = self._language_loss(
                        model, tokens, batch_size, max_windows_per_language, loss_fn, device
                    )
        finally:
            model.train(was_training)
        overall = sum(per_language.values()) / len(per_language)
        return ValLoss(overall, per_language)

    def _language_loss(
        self,
        model: nn.Module,
        tokens: torch.Tensor,
        batch_size: int,
        max_windows: int | None,
        loss_fn: LossFn,
        device: torch.device,
    ) -> float:
        starts = window_starts(tokens.numel(), self.seq_len, max_windows)
        arange = torch.arange(self.seq_len + 1)
        total = torch.zeros((), dtype=torch.float64, device=device)
        for chunk in starts.split(batch_size):
            window = gather_windows(tokens, chunk, arange).to(device)
            loss = loss_fn(model, window[:, :-1], window[:, 1:])
            total += loss.double() * chunk.numel()
        return float(total.item()) / starts.numel()
