"""Independent, reproducible seeds for the parts of a run (partition, streams, workers)."""

from __future__ import annotations

import numpy as np


def derive_seed(seed: int, *keys: int) -> int:
    """A 63-bit seed derived from ``seed`` and integer ``keys`` (numpy SeedSequence hashing).

    Different key tuples give statistically independent streams, unlike ``seed + i``.
    """
    state = np.random.SeedSequence([seed, *keys]).generate_state(2, dtype=np.uint32)
    return int((int(state[0]) << 31) ^ int(state[1]))
