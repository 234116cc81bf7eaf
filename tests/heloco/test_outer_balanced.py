"""Arrival balancing: never amplify by default, and balance the data, not the
workers, when their mixtures are known. Worked examples and properties."""

from __future__ import annotations

import numpy as np
import pytest
import torch
from hypothesis import given, settings
from hypothesis import strategies as st

from heloco.outer import OuterConfig, build_optimizer
from heloco.outer.balanced import (
    ArrivalBalanced,
    balanced_shares,
    balanced_weights,
    mixture_matrix,
    project_simplex,
    skew_ratio,
)
from heloco.outer.base import Arrival
from shardmeter.errors import UserInputError

ONE_FAST = [15 / 19] + [1 / 19] * 4  # arrival shares at paces [1, 15, 15, 15, 15]


def test_default_never_amplifies() -> None:
    # (1/K)/s = (19/75, 3.8, 3.8, 3.8, 3.8) has Σ s w = 1. "mean" uses it as is and gives the
    # stale slow updates 3.8×; the default "clip" caps it at 1 (the fast worker down to its
    # fair share 1/K, nobody up); "max" divides by the largest, so the fast one gets 1/15.
    assert balanced_weights(ONE_FAST, 10) == pytest.approx([19 / 75, 1, 1, 1, 1])
    mean = balanced_weights(ONE_FAST, 10, normalize="mean")
    assert mean == pytest.approx([19 / 75, 3.8, 3.8, 3.8, 3.8])
    assert balanced_weights(ONE_FAST, 10, normalize="max") == pytest.approx([1 / 15, 1, 1, 1, 1])
    # γ = ½: raw (19/75)^½ and 3.8^½ over their arrival-weighted mean, then clipped at 1.
    half = np.sqrt([19 / 75] + [3.8] * 4)
    fast = half[0] / (np.array(ONE_FAST) @ half)
    assert balanced_weights(ONE_FAST, 10, power=0.5) == pytest.approx([fast, 1, 1, 1, 1])
    assert balanced_weights(ONE_FAST, 10, power=0.0) == pytest.approx([1.0] * 5)


def test_one_language_per_worker_is_worker_balancing() -> None:
    p = mixture_matrix([{lang: 1.0} for lang in ("de", "en", "es", "fr", "it")])
    assert skew_ratio(np.array(ONE_FAST), p) == pytest.approx(1.0)
    assert balanced_weights(ONE_FAST, 10, mixtures=p) == pytest.approx([19 / 75, 1, 1, 1, 1])


def test_identical_mixtures_are_left_alone() -> None:
    p = mixture_matrix([{"de": 0.5, "en": 0.5}] * 3)
    assert balanced_weights([0.8, 0.1, 0.1], 10, mixtures=p) == pytest.approx([1.0] * 3)


def test_overlap_weakens_the_balancing_by_hand() -> None:
    # Worker 0 holds only A, worker 1 half A, half B; shares s = (0.8, 0.2).
    #   q = P·(1/2) = (0.75, 0.25); plain mix P s = (0.9, 0.1): TV = 0.15, worst TV(s, ½) = 0.3
    #   → r = 0.5. Balanced shares u = (0.5, 0.5) give P u = q exactly.
    #   w = (u/s)^r = (0.625^½, 2.5^½) = (0.7906, 1.5811); Σ s w = 0.9487, so "clip" gives
    #   (0.8333, 1) and "max" (0.5, 1). Without the mixtures: (0.625, 1) and (0.25, 1).
    p = mixture_matrix([{"A": 1.0}, {"A": 0.5, "B": 0.5}])
    s = np.array([0.8, 0.2])
    assert skew_ratio(s, p) == pytest.approx(0.5)
    assert balanced_shares(s, p) == pytest.approx([0.5, 0.5], abs=1e-3)
    clip = balanced_weights(s.tolist(), 10, mixtures=p)
    assert clip == pytest.approx(
        [np.sqrt(0.625) / (0.8 * np.sqrt(0.625) + 0.2 * np.sqrt(2.5)), 1.0], abs=1e-3
    )
    assert balanced_weights(s.tolist(), 10, normalize="max", mixtures=p) == pytest.approx(
        [0.5, 1.0], abs=1e-3
    )
    assert balanced_weights(s.tolist(), 10) == pytest.approx([0.625, 1.0])


def test_a_worker_holding_every_language_needs_no_balancing() -> None:
    # Worker 2 holds A and B half and half and is fast: its arrivals skew the arrival mix but
    # not the data mix (P s = q), so r = 0 and every weight is 1.
    p = mixture_matrix([{"A": 1.0}, {"B": 1.0}, {"A": 0.5, "B": 0.5}])
    s = np.array([0.1, 0.1, 0.8])
    assert skew_ratio(s, p) == pytest.approx(0.0)
    assert balanced_weights(s.tolist(), 10, mixtures=p) == pytest.approx([1.0] * 3)


def test_project_simplex_by_hand() -> None:
    assert project_simplex(np.array([0.5, 0.5])) == pytest.approx([0.5, 0.5])
    assert project_simplex(np.array([2.0, 0.0])) == pytest.approx([1.0, 0.0])
    assert project_simplex(np.array([0.6, 0.6, -1.0])) == pytest.approx([0.5, 0.5, 0.0])


mix_st = st.lists(
    st.lists(st.floats(0.0, 1.0), min_size=3, max_size=3).filter(lambda m: sum(m) > 0.05),
    min_size=2,
    max_size=6,
)


@settings(max_examples=60, deadline=None, derandomize=True)
@given(mixes=mix_st, raw=st.lists(st.floats(0.01, 1.0), min_size=6, max_size=6))
def test_balanced_shares_improve_the_data_mix(mixes: list[list[float]], raw: list[float]) -> None:
    k = len(mixes)
    p = mixture_matrix([dict(zip("ABC", m, strict=True)) for m in mixes])
    s = np.array(raw[:k]) / sum(raw[:k])
    u = balanced_shares(s, p)
    assert np.all(u >= -1e-12) and u.sum() == pytest.approx(1.0)
    q = p.mean(axis=1)
    assert np.linalg.norm(p @ u - q) <= np.linalg.norm(p @ s - q) + 1e-6
    w = balanced_weights(s.tolist(), 10, mixtures=p)
    assert max(w) <= 1.0 + 1e-12 and min(w) > 0
    assert max(balanced_weights(s.tolist(), 10, normalize="max", mixtures=p)) == pytest.approx(1.0)
    assert 0.0 <= skew_ratio(s, p) <= 1.0


def test_wrapper_uses_the_mixtures_and_rejects_bad_settings() -> None:
    p = {"x": torch.zeros(1)}
    mixes = [{"A": 1.0}, {"A": 0.5, "B": 0.5}]
    cfg = OuterConfig(ab_shares="paces")
    ab = build_optimizer("mla+ab", p, cfg, 2, rates=[0.8, 0.2], mixtures=mixes)
    assert isinstance(ab, ArrivalBalanced)
    w0 = ab.weights()[0]  # type: ignore[attr-defined]
    assert w0 == pytest.approx(0.8333, abs=1e-3)
    workers = build_optimizer(
        "mla+ab", p, cfg.model_copy(update={"ab_data": "workers"}), 2, [0.8, 0.2], mixes
    )
    assert workers.weights() == pytest.approx([0.625, 1.0])  # type: ignore[attr-defined]
    theta = {"x": torch.zeros(1)}
    ab.step(theta, [Arrival({"x": torch.ones(1)}, 0, 0)])  # weight w0 on top of ρ = 1/√2
    expected = -0.7 * (1 + 0.9 * 0.1) * w0 / np.sqrt(2)  # MLA first step: η(1 + μ(1−μ))·G
    assert float(theta["x"][0]) == pytest.approx(expected, rel=1e-5)
    inner = build_optimizer("mla", p, OuterConfig(), 2)
    for kwargs in ({"power": 1.5}, {"max_weight": 0.5}, {"prior": 0.0}, {"mixtures": mixes[:1]}):
        with pytest.raises(UserInputError):
            ArrivalBalanced(inner, n_workers=2, **kwargs)  # type: ignore[arg-type]
