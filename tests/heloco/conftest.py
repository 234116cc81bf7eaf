"""Fixtures shared by the HeLoCo tests: one torch thread, and the tiny networked-run config."""

from __future__ import annotations

import os
from collections.abc import Callable, Iterator
from typing import Any

import pytest
import torch

TinyNetValues = Callable[..., dict[str, Any]]

os.environ.setdefault("HF_HUB_OFFLINE", "1")  # nothing may reach the internet (transformers)


@pytest.fixture
def one_thread() -> Iterator[None]:
    """Tiny models run fastest (and steadiest on a shared machine) on one intra-op thread."""
    before = torch.get_num_threads()
    torch.set_num_threads(1)
    yield
    torch.set_num_threads(before)


@pytest.fixture
def tiny_net_values() -> TinyNetValues:
    """Factory of the smallest run config the networked tests share, as a raw dict.

    Tiny model, 2 inner steps of 2 × 32 tokens (128 tokens a round), a 4000-character synthetic
    corpus per language; ``total_steps`` is the inner cosine horizon (steps) and every other
    keyword sets a top-level key (callers give method, workers, token_budget).
    """

    def make(*, total_steps: int = 50, **over: Any) -> dict[str, Any]:
        values: dict[str, Any] = {
            "inner_steps": 2,
            "model": "tiny",
            "eval_windows": 2,
            "eval_batch_size": 8,
            "data": {
                "seq_len": 32,
                "synthetic_chars_per_language": 4000,
                "val_chars_per_language": 1000,
            },
            "inner": {"batch_size": 2, "seq_len": 32, "total_steps": total_steps},
        }
        values.update(over)
        return values

    return make
