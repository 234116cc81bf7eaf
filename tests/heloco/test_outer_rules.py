"""Each outer update rule against tensors computed by hand (every correction case)."""

from __future__ import annotations

import math

import pytest
import torch

from heloco.outer import OuterConfig, build_optimizer, method_names, resolve_method
from heloco.outer.balanced import ArrivalBalanced, balanced_weights
from heloco.outer.base import Arrival, rho_weight
from heloco.outer.delayed import DelayedNesterov
from heloco.outer.heloco import CorrectionConfig, HeLoCo, correct
from heloco.outer.lookahead import MomentumLookAhead
from heloco.outer.nesterov import Nesterov
from shardmeter.errors import UserInputError


def t(*xs: float) -> torch.Tensor:
    return torch.tensor(xs, dtype=torch.float32)


def close(a: torch.Tensor, b: torch.Tensor) -> None:
    torch.testing.assert_close(a, b, rtol=1e-5, atol=1e-6)


def one(delta: torch.Tensor, mom: torch.Tensor, **cfg: object) -> tuple[torch.Tensor, object]:
    out, upd = correct({"x": delta}, {"x": mom}, CorrectionConfig.model_validate(cfg))
    return out["x"], upd


def test_keep_when_aligned() -> None:
    out, upd = one(t(1.0, 0.3), t(2.0, 0.0))
    close(out, t(1.0, 0.3))
    assert bool(upd.kept[0])  # type: ignore[attr-defined]


def test_shrink_removes_part_of_the_anti_aligned_component() -> None:
    # Δ = (-1, 1), m = (1, 0): c = -1/√2, conf = √2/(√2+3), β = k_s(-c)conf = 0.5/(3+√2).
    # Δ̂ = Δ − β c ‖Δ‖ m/‖m‖ = Δ + β (1, 0).
    beta = 0.5 / (3 + math.sqrt(2))
    out, upd = one(t(-1.0, 1.0), t(1.0, 0.0))
    close(out, t(-1.0 + beta, 1.0))
    assert bool(upd.shrunk[0])  # type: ignore[attr-defined]
    assert float(upd.beta[0]) == pytest.approx(beta)  # type: ignore[attr-defined]


def test_shrink_is_capped_at_beta_max() -> None:
    # β = β_max = 0.5 removes half of the anti-aligned part; the prototype's shrink is
    # Δ − β (Δ·m)/(‖m‖+ε)² m, so ε shows at ‖m‖ = 1e-3: (1e-3/(1e-3 + 1e-8))² = 1 − 2e-5.
    out, _ = one(t(-1.0, 0.0), t(1e-3, 0.0), k_s=100.0, kappa=0.0)
    close(out, t(-1.0 + 0.5 * (1e-3 / (1e-3 + 1e-8)) ** 2, 0.0))


def test_rotate_published_lambda() -> None:
    # Δ = (0, 1), m = (1, 0): c = 0, conf = 1/(1+3) = 1/4, λ = (1 − 0)·1/4 = 1/4,
    # ũ = (1/4, 3/4), Δ̂ = ‖Δ‖ ũ/‖ũ‖ = (1, 3)/√10.
    out, upd = one(t(0.0, 1.0), t(1.0, 0.0), lambda_form="published")
    close(out, t(1.0, 3.0) / math.sqrt(10))
    assert bool(upd.rotated[0])  # type: ignore[attr-defined]
    assert float(upd.lam[0]) == pytest.approx(0.25)  # type: ignore[attr-defined]


def test_rotate_normalized_lambda() -> None:
    # t = (0 + 0.2)/(0.2 + 0.2) = 1/2, λ = (1 − 1/2)·1/4 = 1/8, ũ = (1/8, 7/8), Δ̂ = (1, 7)/√50.
    out, upd = one(t(0.0, 1.0), t(1.0, 0.0), lambda_form="normalized")
    close(out, t(1.0, 7.0) / math.sqrt(50))
    assert float(upd.lam[0]) == pytest.approx(0.125)  # type: ignore[attr-defined]


def test_negative_cosine_rotates_when_shrink_disabled() -> None:
    conf = math.sqrt(2) / (math.sqrt(2) + 3)  # normalized t clips to 0, so λ = conf
    u = (1 - conf) * t(-1.0, 1.0) / math.sqrt(2) + conf * t(1.0, 0.0)
    out, upd = one(t(-1.0, 1.0), t(1.0, 0.0), shrink_when_negative=False)
    close(out, math.sqrt(2) * u / u.norm())
    assert bool(upd.rotated[0])  # type: ignore[attr-defined]


@pytest.mark.parametrize(("delta", "mom"), [((1.0, 2.0), (0.0, 0.0)), ((1e-10, 0.0), (1.0, 0.0))])
def test_degenerate_blocks_pass_through(
    delta: tuple[float, float], mom: tuple[float, float]
) -> None:
    out, _ = one(t(*delta), t(*mom))
    close(out, t(*delta))


def test_whole_model_scope_takes_one_decision() -> None:
    delta = {"a": t(1.0, 0.0), "b": t(0.0, 0.1)}
    mom = {"a": t(1.0, 0.0), "b": t(0.1, 0.0)}
    per_tensor, upd = correct(delta, mom, CorrectionConfig(scope="tensor"))
    assert bool(upd.rotated[1]) and not torch.equal(per_tensor["b"], delta["b"])
    whole, upd = correct(delta, mom, CorrectionConfig(scope="model"))  # cos ≈ 0.99: keep all
    assert bool(upd.kept.all())
    close(whole["b"], delta["b"])


def test_nesterov_two_steps() -> None:
    theta = {"x": t(1.0, 1.0)}
    opt = Nesterov(theta, lr=0.5, momentum=0.5, rho="none", n_workers=1)
    opt.step(theta, [Arrival({"x": t(1.0, 2.0)}, 0, 0)])
    close(theta["x"], t(0.25, -0.5))  # buf = (1,2); θ −= 0.5((1,2) + 0.5(1,2))
    opt.step(theta, [Arrival({"x": t(0.0, 2.0)}, 0, 0)])
    close(theta["x"], t(0.125, -2.25))  # buf = (0.5,3); θ −= 0.5((0,2) + 0.5(0.5,3))


def test_sync_nesterov_averages_the_round() -> None:
    theta = {"x": t(0.0)}
    opt = Nesterov(theta, lr=1.0, momentum=0.0, rho="none", n_workers=2)
    opt.step(theta, [Arrival({"x": t(1.0)}, 0, 0), Arrival({"x": t(3.0)}, 1, 0)])
    close(theta["x"], t(-2.0))


def test_mla_and_lookahead_dispatch() -> None:
    theta = {"x": t(1.0, 1.0)}
    mla = MomentumLookAhead(theta, lr=1.0, momentum=0.5, rho=0.5, n_workers=4)
    mla.step(theta, [Arrival({"x": t(2.0, 0.0)}, 0, 0)])
    # G = (1,0); m = 0.5·(1,0); θ −= G + 0.5 m = (1.25, 0)
    close(theta["x"], t(-0.25, 1.0))
    close(mla.m["x"], t(0.5, 0.0))
    close(mla.dispatch_params(theta)["x"], t(-0.25, 1.0))  # MLA dispatches θ
    theta2 = {"x": t(1.0, 1.0)}
    unc = HeLoCo(theta2, lr=1.0, momentum=0.5, rho=0.5, n_workers=4, correction=None)
    unc.step(theta2, [Arrival({"x": t(2.0, 0.0)}, 0, 0)])
    close(theta2["x"], t(-0.25, 1.0))
    close(unc.dispatch_params(theta2)["x"], t(-0.5, 1.0))  # θ − ημm


def test_delayed_nesterov_by_hand() -> None:
    theta = {"x": t(1.0, 1.0)}
    dn = DelayedNesterov(theta, lr=1.0, momentum=0.5, rho="none", n_workers=2, period=2)
    dn.step(theta, [Arrival({"x": t(2.0, 0.0)}, 0, 0)])
    close(theta["x"], t(0.0, 1.0))  # −ε g/N
    dn.step(theta, [Arrival({"x": t(0.0, 2.0)}, 1, 0)])
    close(dn.m["x"], t(1.0, 1.0))  # m = buf/N
    close(theta["x"], t(-0.5, -0.5))  # −ε(β m + g/N)


def test_delayed_nesterov_rejects_bad_c() -> None:
    with pytest.raises(UserInputError):
        DelayedNesterov({"x": t(0.0)}, lr=1, momentum=0.9, rho="none", n_workers=2, period=2, c=0.9)


def test_rho_modes() -> None:
    assert rho_weight("sqrt_k", 4, 7) == pytest.approx(0.5)
    assert rho_weight("delay", 4, 3) == pytest.approx(0.25)
    assert rho_weight("none", 4, 3) == 1.0
    assert rho_weight(0.3, 4, 3) == 0.3
    with pytest.raises(UserInputError):
        rho_weight("bogus", 4, 0)  # type: ignore[arg-type]


def test_rho_before_vs_after_changes_only_the_confidence() -> None:
    theta0 = {"x": t(0.0, 0.0)}
    seed_delta, late = {"x": t(1.0, 0.0)}, {"x": t(0.1, 1.0)}
    results = []
    for order in ("before", "after"):
        theta = {"x": theta0["x"].clone()}
        opt = HeLoCo(
            theta,
            lr=0.7,
            momentum=0.9,
            rho="sqrt_k",
            n_workers=4,
            correction=CorrectionConfig(),
            rho_order=order,
        )  # type: ignore[arg-type]
        opt.step(theta, [Arrival(seed_delta, 0, 0)])
        stats = opt.step(theta, [Arrival(late, 1, 0)])
        assert stats.frac_rotated == 1.0
        results.append(theta["x"].clone())
    assert not torch.allclose(results[0], results[1])


def test_balanced_weights_by_hand() -> None:
    # w_i ∝ (1/K)/s_i = (2/3, 4/3, 4/3): arrival-weighted mean 1, or the largest at 1.
    w = balanced_weights([0.5, 0.25, 0.25], max_weight=10, normalize="mean")
    assert w == pytest.approx([2 / 3, 4 / 3, 4 / 3])
    assert balanced_weights([0.5, 0.25, 0.25], max_weight=10) == pytest.approx([2 / 3, 1.0, 1.0])
    assert balanced_weights([0.5, 0.25, 0.25], 10, normalize="max") == pytest.approx([0.5, 1, 1])
    inner = MomentumLookAhead({"x": t(0.0)}, lr=1, momentum=0.0, rho="none", n_workers=3)
    ab = ArrivalBalanced(inner, n_workers=3, normalize="mean")
    theta = {"x": t(0.0)}
    for _ in range(3):
        ab.step(theta, [Arrival({"x": t(1.0)}, 0, 0)])
    assert ab.shares() == pytest.approx([4 / 6, 1 / 6, 1 / 6])
    assert ab.weights() == pytest.approx([0.5, 2.0, 2.0])
    before = theta["x"].clone()
    ab.step(theta, [Arrival({"x": t(1.0)}, 1, 0)])  # μ = 0, lr 1: θ −= w·Δ = 2
    close(theta["x"], before - 2.0)


def test_balanced_shares_from_known_rates() -> None:
    p = {"x": t(0.0)}
    cfg = OuterConfig(ab_shares="paces", ab_normalize="mean")
    ab = build_optimizer("heloco+ab", p, cfg, 3, rates=[1.0, 1.0, 0.5])
    assert isinstance(ab, ArrivalBalanced)
    assert ab.shares() == pytest.approx([0.4, 0.4, 0.2])
    assert ab.weights() == pytest.approx([5 / 6, 5 / 6, 5 / 3])
    ab.step(p, [Arrival({"x": t(1.0)}, 0, 0)])
    assert ab.shares() == pytest.approx([0.4, 0.4, 0.2])  # known rates ignore the counts


def test_balanced_weights_respect_the_cap() -> None:
    w = balanced_weights([0.98, 0.01, 0.01], max_weight=4, normalize="mean")
    assert max(w) / min(w) <= 16 + 1e-9
    assert sum(s * x for s, x in zip([0.98, 0.01, 0.01], w, strict=True)) == pytest.approx(1.0)


def test_registry_defaults_and_names() -> None:
    names = method_names()
    for n in (
        "sync",
        "async-nesterov",
        "dn",
        "dn-dylu",
        "mla",
        "heloco",
        "heloco-uncorrected",
        "heloco+ab",
        "mla+ab",
    ):
        assert n in names
    p = {"x": t(0.0)}
    assert build_optimizer("async-nesterov", p, OuterConfig(), 4).lr == 0.07  # type: ignore[attr-defined]
    assert build_optimizer("heloco", p, OuterConfig(), 4).lr == 0.7  # type: ignore[attr-defined]
    assert build_optimizer("heloco", p, OuterConfig(lr=0.3), 4).lr == 0.3  # type: ignore[attr-defined]
    assert isinstance(build_optimizer("heloco+ab", p, OuterConfig(), 4), ArrivalBalanced)
    assert resolve_method("sync").spec.policy.synchronous
    assert resolve_method("dn-dylu").spec.policy.dylu
    for bad in ("sync+ab", "adam", "heloco+ab+ab"):
        with pytest.raises(UserInputError):
            resolve_method(bad)
    with pytest.raises(UserInputError):
        build_optimizer("mla+ab", p, OuterConfig(ab_shares="paces"), 4)


def test_mismatched_delta_names_are_rejected() -> None:
    theta = {"x": t(0.0)}
    opt = MomentumLookAhead(theta, lr=1, momentum=0.9, rho="none", n_workers=1)
    with pytest.raises(UserInputError):
        opt.step(theta, [Arrival({"y": t(0.0)}, 0, 0)])
