"""Which languages each worker trains on: a (workers x languages) mixture matrix.

- ``language``: worker i is bound to language i mod L (the paper's non-IID split, spec §3
  "Non-IID split": ``non_iid_lang``).
- ``dirichlet``: each worker's mixture is a Dirichlet(α·1) draw (Hsu et al. 2019,
  arXiv 1909.06335, §3); small α gives near one-language workers, large α near IID.
- ``iid``: every worker samples the uniform mixture over languages.
"""

from __future__ import annotations

import numpy as np

from shardmeter.errors import UserInputError

ASSIGNMENTS: tuple[str, ...] = ("language", "dirichlet", "iid")


def language_mixture(n_workers: int, n_languages: int) -> np.ndarray:
    """One-hot rows: worker i -> language i mod L."""
    mix = np.zeros((n_workers, n_languages))
    mix[np.arange(n_workers), np.arange(n_workers) % n_languages] = 1.0
    return mix


def dirichlet_mixture(n_workers: int, n_languages: int, alpha: float, seed: int) -> np.ndarray:
    """Rows drawn i.i.d. from Dirichlet(alpha, ..., alpha), seeded."""
    if not alpha > 0 or not np.isfinite(alpha):
        raise UserInputError("dirichlet_alpha", alpha, "a finite number > 0")
    mix = np.random.default_rng(seed).dirichlet(np.full(n_languages, alpha), size=n_workers)
    if not np.all(np.isfinite(mix)) or not np.allclose(mix.sum(axis=1), 1.0):
        raise UserInputError(
            "dirichlet_alpha", alpha, "a value large enough to sample (try >= 1e-3)"
        )
    return mix


def iid_mixture(n_workers: int, n_languages: int) -> np.ndarray:
    """Every row uniform over the languages."""
    return np.full((n_workers, n_languages), 1.0 / n_languages)


def partition(
    assignment: str, n_workers: int, n_languages: int, alpha: float, seed: int
) -> np.ndarray:
    """The (n_workers, n_languages) mixture matrix; each row sums to 1."""
    if assignment == "language":
        return language_mixture(n_workers, n_languages)
    if assignment == "dirichlet":
        return dirichlet_mixture(n_workers, n_languages, alpha, seed)
    if assignment == "iid":
        return iid_mixture(n_workers, n_languages)
    raise UserInputError("assignment", assignment, f"one of {', '.join(ASSIGNMENTS)}")
