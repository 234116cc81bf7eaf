"""Partitioners: language i mod L, Dirichlet rows on the simplex, IID uniform."""

from __future__ import annotations

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from heloco.data import partition
from shardmeter.errors import UserInputError

workers = st.integers(1, 40)
languages = st.integers(1, 12)


@given(workers, languages)
def test_language_assignment_is_i_mod_l(k: int, n_lang: int) -> None:
    mix = partition("language", k, n_lang, 1.0, 0)
    assert mix.shape == (k, n_lang)
    assert [int(np.argmax(row)) for row in mix] == [i % n_lang for i in range(k)]
    assert np.array_equal(mix.sum(axis=1), np.ones(k))
    assert set(np.unique(mix)) <= {0.0, 1.0}


@given(workers, languages, st.floats(0.01, 100.0), st.integers(0, 2**32))
@settings(max_examples=60)
def test_dirichlet_rows_are_seeded_mixtures(k: int, n_lang: int, alpha: float, seed: int) -> None:
    mix = partition("dirichlet", k, n_lang, alpha, seed)
    assert mix.shape == (k, n_lang)
    assert np.all(mix >= 0)
    np.testing.assert_allclose(mix.sum(axis=1), 1.0, rtol=0, atol=1e-12)
    assert np.array_equal(mix, partition("dirichlet", k, n_lang, alpha, seed))


def test_dirichlet_alpha_controls_concentration() -> None:
    peaked = partition("dirichlet", 200, 5, 0.05, 1).max(axis=1).mean()
    flat = partition("dirichlet", 200, 5, 100.0, 1).max(axis=1).mean()
    assert peaked > 0.8 > 0.3 > flat


@given(workers, languages)
def test_iid_is_uniform(k: int, n_lang: int) -> None:
    np.testing.assert_allclose(partition("iid", k, n_lang, 1.0, 0), 1.0 / n_lang)


@pytest.mark.parametrize("alpha", [0.0, -1.0, float("nan"), float("inf")])
def test_dirichlet_rejects_bad_alpha(alpha: float) -> None:
    with pytest.raises(UserInputError, match="dirichlet_alpha"):
        partition("dirichlet", 3, 5, alpha, 0)


def test_unknown_assignment() -> None:
    with pytest.raises(UserInputError, match=r"assignment.*language, dirichlet, iid"):
        partition("random", 3, 5, 1.0, 0)
