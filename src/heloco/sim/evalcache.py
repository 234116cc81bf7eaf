"""Validation losses shared by runs simulated side by side, by exact parameter content.

An evaluation is a pure function of the parameters, the validation set, the batch size and
window count, and the model's shape. Runs of one grid setting and seed share their data, so
every method's first evaluation (of the same initial model) is one computation, as is any
later evaluation of parameters that happen to be identical. The cache keys on a BLAKE2b
digest of every tensor's name, dtype, shape and bytes, and returns the stored loss.
"""

from __future__ import annotations

import hashlib
from collections.abc import Hashable

import torch

from heloco.data import ValLoss
from heloco.model import TinyGPT
from heloco.sim.build import RunParts
from heloco.sim.recorder import Evaluator
from heloco.types import Params


def params_digest(params: Params) -> bytes:
    """BLAKE2b-256 of the parameters: names, dtypes, shapes and contents, in order."""
    h = hashlib.blake2b(digest_size=32)
    for name, t in params.items():
        flat = t.detach().reshape(-1).cpu().contiguous()
        h.update(f"{name}|{flat.dtype}|{tuple(t.shape)}|".encode())
        h.update(flat.view(torch.uint8).numpy().data)
    return h.digest()


class EvalCache:
    """Validation losses by (evaluation setting, parameter digest); ``hits`` counts reuses."""

    def __init__(self) -> None:
        self.losses: dict[tuple[Hashable, bytes], ValLoss] = {}
        self.hits = 0

    def evaluator(self, parts: RunParts) -> Evaluator:
        """``parts.evaluate`` through the cache (TinyGPT runs; others evaluate directly)."""
        model = parts.model
        if not isinstance(model, TinyGPT):
            return parts.evaluate
        scope = (
            id(parts.data.validation),
            parts.cfg.eval_batch_size,
            parts.cfg.eval_windows,
            model.cfg,
            str(model.positions.device),
        )

        def evaluate(params: Params) -> ValLoss:
            key = (scope, params_digest(params))
            loss = self.losses.get(key)
            if loss is None:
                loss = self.losses[key] = parts.evaluate(params)
            else:
                self.hits += 1
            return loss

        return evaluate
