"""Fidelity to the authors' code: our fused HeLoCo against plain re-derivations
of the paper prototype and of the production server, on random arrivals, to float rounding.

The references below are written from the semantics of the authors' public code (spec §6):
the prototype ``SmartDCMLA_v2`` + MLA backbone with ρ applied before the correction, and the
production ``block_correct`` (published λ, no ε in the cosine, no clamp) with ρ applied after.
They work per tensor on materialised float64 vectors, the slow obvious way; ours works on
per-block scalars in fused float32 passes. Every formula cites the spec section it follows.
"""

from __future__ import annotations

import math

import pytest
import torch

from heloco.data import ValLoss
from heloco.outer import OuterConfig, build_optimizer
from heloco.outer.base import Arrival, OptimizerState
from heloco.outer.heloco import CorrectionConfig, HeLoCo, correct, correction_coefficients
from heloco.outer.lookahead import BlockGeometry
from heloco.server import Server, ServerConfig, quantile_speed
from heloco.sim import Clock, InnerSetup, ServerSetup, parse_sim_config, round_steps, simulate
from heloco.types import Params, RoundResult
from shardmeter.errors import UserInputError

EPS = 1e-8
HP = {"c_ok": 0.2, "k_s": 0.5, "beta_max": 0.5, "k_d": 1.0, "kappa": 3.0, "c_bad": -0.2}


def prototype_block(delta: torch.Tensor, m: torch.Tensor) -> torch.Tensor:
    """SmartDCMLA_v2's corrected block (spec 1.4, normalized λ, prototype ε placement)."""
    dn, mn = float(delta.norm()), float(m.norm())
    if dn < EPS or mn < EPS:
        return delta
    cos = max(-1.0, min(1.0, float(delta @ m) / (dn * mn + EPS)))
    conf = dn / (dn + HP["kappa"] * mn + EPS)
    if cos >= HP["c_ok"]:
        return delta
    if cos < 0.0:
        beta = min(HP["k_s"] * -cos * conf, HP["beta_max"])
        unit_m = m / (mn + EPS)
        return delta - beta * float(delta @ unit_m) * unit_m
    t = min(1.0, max(0.0, (cos - HP["c_bad"]) / (HP["c_ok"] - HP["c_bad"] + EPS)))
    lam = min(HP["k_d"] * (1.0 - t) * conf, 1.0)
    mix = (1.0 - lam) * delta / (dn + EPS) + lam * m / (mn + EPS)
    mix_norm = float(mix.norm())
    return mix / (mix_norm + EPS) * dn if mix_norm >= EPS else delta


def production_block(delta: torch.Tensor, m: torch.Tensor) -> torch.Tensor:
    """block_correct's corrected block (spec 1.4, published λ, production ε placement)."""
    dn, mn = float(delta.norm()), float(m.norm())
    if dn < EPS or mn < EPS:
        return delta
    cos = float(delta @ m) / (max(dn, EPS) * max(mn, EPS))
    conf = dn / (dn + HP["kappa"] * mn + EPS)
    if cos >= HP["c_ok"]:
        return delta
    unit_d, unit_m = delta / max(dn, EPS), m / max(mn, EPS)
    if cos < 0.0:
        beta = min(HP["k_s"] * -cos * conf, HP["beta_max"])
        return delta - beta * cos * dn * unit_m
    lam = min(HP["k_d"] * (1.0 - cos) * conf, 1.0)
    mix = (1.0 - lam) * unit_d + lam * unit_m
    mix_norm = float(mix.norm())
    return dn * mix / max(mix_norm, EPS) if mix_norm > EPS else delta


class Reference:
    """The MLA backbone with look-ahead dispatch (spec 1.3, 1.6), one arrival per step."""

    def __init__(self, theta: Params, rho: float, flavour: str) -> None:
        self.theta = {k: v.double().clone() for k, v in theta.items()}
        self.m: dict[str, torch.Tensor] | None = None
        self.rho, self.flavour = rho, flavour
        self.lr, self.mu = 0.7, 0.9

    def step(self, delta: Params) -> None:
        new_m = {}
        for k, d in delta.items():
            d64 = d.double().reshape(-1)
            old = torch.zeros_like(d64) if self.m is None else self.m[k].reshape(-1)
            if self.m is None:
                g = self.rho * d64
            elif self.flavour == "prototype":  # ρ first (spec 1.5)
                g = prototype_block(self.rho * d64, old)
            else:  # correct, then ρ
                g = self.rho * production_block(d64, old)
            new_m[k] = (self.mu * old + (1 - self.mu) * g).reshape(d.shape)
            self.theta[k] = self.theta[k] - self.lr * (g.reshape(d.shape) + self.mu * new_m[k])
        self.m = new_m

    def dispatch(self) -> Params:
        if self.m is None:
            return dict(self.theta)
        return {k: v - self.lr * self.mu * self.m[k] for k, v in self.theta.items()}


SHAPES = {"emb": (6, 4), "w": (5,), "b": (3,), "tiny": (4,), "zero": (2,)}


def random_arrival(gen: torch.Generator, scale_tiny: float) -> Params:
    """A pseudo-gradient with one ordinary-sized block per shape, a block of norm ~scale_tiny
    (where ε matters) and an all-zero block (degenerate)."""
    out = {k: torch.randn(s, generator=gen) * 0.1 for k, s in SHAPES.items()}
    out["tiny"] = torch.randn(SHAPES["tiny"], generator=gen) * scale_tiny
    out["zero"] = torch.zeros(SHAPES["zero"])
    return out


@pytest.mark.parametrize(
    ("flavour", "form", "order"),
    [("prototype", "normalized", "before"), ("production", "published", "after")],
)
@pytest.mark.parametrize("seed", [0, 1, 2])
def test_random_arrivals_match_the_authors_rules(
    flavour: str, form: str, order: str, seed: int
) -> None:
    gen = torch.Generator().manual_seed(seed)
    theta = {k: torch.randn(s, generator=gen) for k, s in SHAPES.items()}
    k_workers = 5
    ours = HeLoCo(
        {k: v.clone() for k, v in theta.items()},
        lr=0.7,
        momentum=0.9,
        rho="sqrt_k",
        n_workers=k_workers,
        correction=CorrectionConfig(lambda_form=form),  # type: ignore[arg-type]
        rho_order=order,  # type: ignore[arg-type]
    )
    params = {k: v.clone() for k, v in theta.items()}
    ref = Reference(theta, 1 / math.sqrt(k_workers), flavour)
    cases = {"kept": 0.0, "shrunk": 0.0, "rotated": 0.0}
    for i in range(12):
        delta = random_arrival(gen, scale_tiny=1e-4 if i % 2 else 3e-4)
        stats = ours.step(params, [Arrival(delta, worker=i % k_workers, staleness=i % 4)])
        ref.step(delta)
        for name in cases:
            cases[name] += getattr(stats, f"frac_{name}")
        got_dispatch = ours.dispatch_params(params)
        want_dispatch = ref.dispatch()
        for k in SHAPES:
            torch.testing.assert_close(params[k].double(), ref.theta[k], rtol=1e-5, atol=1e-7)
            torch.testing.assert_close(
                got_dispatch[k].double(), want_dispatch[k], rtol=1e-5, atol=1e-7
            )
    assert all(v > 0 for v in cases.values()), cases  # every case was exercised


def test_prototype_shrink_keeps_epsilon_out_of_the_projection() -> None:
    # A small block: ‖ρΔ‖·‖m‖ = 1.41e-8, comparable to ε. Δ = 1e-4·(−1, 1), m = 1e-4·(1, 0):
    #   c = Δ·m/(‖Δ‖‖m‖ + ε) = −1e-8/(1.414e-8 + 1e-8) = −0.4142 (the true cosine is −0.7071)
    #   conf = ‖Δ‖/(‖Δ‖ + 3‖m‖ + ε) = 0.32037 ; β = 0.5·0.4142·0.32037 = 0.066351
    #   prototype: Δ̂ = Δ − β (Δ·m)/(‖m‖+ε)² m = Δ + 0.066351·0.99980 m
    # The old form, β c ‖Δ‖ m/‖m‖, moved it only 0.5858 of that: ε counted twice.
    delta, m = torch.tensor([-1e-4, 1e-4]), torch.tensor([1e-4, 0.0])
    dn, mn = math.sqrt(2) * 1e-4, 1e-4
    c = -1e-8 / (dn * mn + EPS)
    beta = 0.5 * -c * dn / (dn + 3 * mn + EPS)
    out, upd = correct({"x": delta}, {"x": m}, CorrectionConfig())
    expected = delta + beta * 1e-8 / (mn + EPS) ** 2 * m
    assert bool(upd.shrunk[0]) and float(upd.beta[0]) == pytest.approx(beta, rel=1e-6)
    torch.testing.assert_close(out["x"], expected, rtol=1e-6, atol=1e-12)
    moved = float(out["x"][0] - delta[0]) / (beta * 1e-4)
    assert moved == pytest.approx((mn / (mn + EPS)) ** 2, rel=1e-5)  # 0.9998, not 0.5858


def test_published_path_takes_the_cosine_without_epsilon() -> None:
    # True cosine 0.25 ≥ c_ok, but ‖Δ‖‖m‖ = 1e-8 = ε: with ε inside, c = 0.125 < c_ok.
    # The production code keeps the block; the prototype's cosine (ε inside) rotates it.
    delta = 1e-4 * torch.tensor([0.25, math.sqrt(1 - 0.25**2)], dtype=torch.float64)
    m = torch.tensor([1e-4, 0.0], dtype=torch.float64)
    kept, upd = correct({"x": delta}, {"x": m}, CorrectionConfig(lambda_form="published"))
    assert bool(upd.kept[0]) and torch.equal(kept["x"], delta)
    _, upd = correct({"x": delta}, {"x": m}, CorrectionConfig(lambda_form="normalized"))
    assert bool(upd.rotated[0])


def test_published_cosine_is_not_clamped() -> None:
    # Rounding can put Δ·m past ‖Δ‖‖m‖ in magnitude. Take the scalars ‖Δ‖ = ‖m‖ = 1 and
    # Δ·m = −1.5 as such a case: conf = 1/(1 + 3 + ε) = 0.25.
    #   production: c = −1.5 as is, β = 0.5·1.5·0.25 = 0.1875;
    #   prototype:  c clamped to −1,  β = 0.5·1.0·0.25 = 0.125.
    geometry = BlockGeometry(
        torch.tensor([1.0], dtype=torch.float64),
        torch.tensor([-1.5], dtype=torch.float64),
        torch.tensor([1.0], dtype=torch.float64),
    )
    published = correction_coefficients(
        geometry, 1.0, 1.0, CorrectionConfig(lambda_form="published")
    )
    normalized = correction_coefficients(geometry, 1.0, 1.0, CorrectionConfig())
    assert float(published.beta[0]) == pytest.approx(0.1875)
    assert float(normalized.beta[0]) == pytest.approx(0.125)
    # Δ̂ = Δ − β c ‖Δ‖ m/‖m‖ (production) and Δ − β (Δ·m)/(‖m‖+ε)² m (prototype).
    assert float(published.b[0]) == pytest.approx(-0.1875 * -1.5)
    assert float(normalized.b[0]) == pytest.approx(-0.125 * -1.5 / (1 + EPS) ** 2)


def test_tensor_mean_correction_size() -> None:
    # Two tensors: "a" aligned (kept, size 0); "b" = (−1, 1) against m = (1, 0), shrunk by
    # β = 0.5/(3 + √2) along m: ‖Δ̂ − Δ‖/‖Δ‖ = β·1/√2. Mean over tensors = β/(2√2);
    # over the whole model the same change is β/‖(1, 0, −1, 1)‖ = β/√3.
    delta = {"a": torch.tensor([1.0, 0.0]), "b": torch.tensor([-1.0, 1.0])}
    mom = {"a": torch.tensor([1.0, 0.0]), "b": torch.tensor([1.0, 0.0])}
    theta = {k: torch.zeros(2) for k in delta}
    opt = HeLoCo(
        theta,
        lr=0.7,
        momentum=0.9,
        rho="none",
        n_workers=1,
        correction=CorrectionConfig(),
    )
    opt.load_state_dict(
        OptimizerState({f"momentum/{k}": v for k, v in mom.items()}, {"seeded": True})
    )
    stats = opt.step(theta, [Arrival(delta, 0, 0)])
    beta = 0.5 * (1 / math.sqrt(2)) * math.sqrt(2) / (math.sqrt(2) + 3 + EPS)
    assert stats.frac_shrunk == 0.5 and stats.frac_kept == 0.5
    assert stats.tensor_correction_size == pytest.approx(beta / (2 * math.sqrt(2)), rel=1e-5)
    assert stats.correction_size == pytest.approx(beta / math.sqrt(3), rel=1e-5)


@pytest.mark.parametrize(
    ("key", "value", "words"),
    [
        ("c_bad", 0.2, "below c_ok"),
        ("c_bad", 0.5, "below c_ok"),
        ("beta_max", 1.0, "less than 1"),
    ],
)
def test_inverted_thresholds_are_one_line_errors(key: str, value: float, words: str) -> None:
    with pytest.raises(UserInputError) as err:
        parse_sim_config({"token_budget": 100, "outer": {"correction": {key: value}}})
    text = str(err.value)
    assert "\n" not in text and key in text and words in text


def test_defaults_are_the_authors() -> None:
    """The prototype's HeLoCo experiment settings, the production defaults and Table 3."""
    cfg = CorrectionConfig()
    assert (cfg.c_ok, cfg.k_s, cfg.beta_max, cfg.k_d, cfg.kappa, cfg.c_bad, cfg.eps) == (
        0.2,
        0.5,
        0.5,
        1.0,
        3.0,
        -0.2,
        1e-8,
    )
    assert cfg.lambda_form == "normalized" and cfg.shrink_when_negative and cfg.scope == "tensor"
    outer = OuterConfig()
    assert outer.momentum == 0.9 and outer.rho_order == "before"
    run = parse_sim_config({"token_budget": 100})  # the prototype: K = 5, H = 20, seed 42
    assert (run.workers, run.inner_steps, run.seed, run.grace_window) == (5, 20, 42, 0.0)
    assert (run.inner.lr, run.inner.betas, run.inner.weight_decay) == (2e-4, (0.9, 0.999), 1e-2)
    assert (run.dylu_reference, run.dylu_quantile) == ("max", 0.9)  # production: 0.9
    theta = {"x": torch.zeros(2)}
    for method, lr, rho in [
        ("heloco", 0.7, 1 / math.sqrt(5)),
        ("mla", 0.7, 1 / math.sqrt(5)),
        ("async-nesterov", 0.07, 1 / math.sqrt(5)),
        ("sync", 0.7, 1.0),
    ]:
        opt = build_optimizer(method, theta, outer, 5)
        assert opt.lr == pytest.approx(lr), method  # type: ignore[attr-defined]
        stats = opt.step({"x": torch.zeros(2)}, [Arrival({"x": torch.ones(2)}, 0, 0)])
        assert stats.rho == pytest.approx(rho), method


def _dylu_server(reference: str, window: int | None = None) -> Server:
    cfg = ServerConfig(
        n_workers=3,
        inner_steps=20,
        dylu=True,
        dylu_reference=reference,  # type: ignore[arg-type]
        dylu_window=window,
    )
    return Server(
        {"x": torch.zeros(1)}, build_optimizer("dn", {"x": torch.zeros(1)}, OuterConfig(), 3), cfg
    )


def test_dylu_quantile_reference_ignores_an_outlier() -> None:
    # Speeds (steps/s): worker 1 at 0.5, worker 2 at 0.25, worker 0 eight times at 1.0, then
    # one mis-measured window at 5.0. Pool of the last 11: sorted [0.25, 0.5, 1 ×8, 5];
    # the production reference is sorted[ceil(0.9·10)] = sorted[9] = 1.0.
    #   max reference (5.0):   H_w = floor(v/5·20)       = 20, 2, 1
    #   quantile (1.0):        H_w = min(20, floor(v·20)) = 20 (capped from 100), 10, 5
    servers = {ref: _dylu_server(ref, window=11) for ref in ("max", "quantile")}
    for s in servers.values():
        s.observe_speed(1, 0.5)
        s.observe_speed(2, 0.25)
        for _ in range(8):
            s.observe_speed(0, 1.0)
        s.observe_speed(0, 5.0)
    assert servers["max"].reference_speed() == 5.0
    assert servers["quantile"].reference_speed() == 1.0
    assert [servers["max"].steps_for(w) for w in range(3)] == [20, 2, 1]
    assert [servers["quantile"].steps_for(w) for w in range(3)] == [20, 10, 5]


def test_dylu_quantile_pool_is_recent_and_checkpointed() -> None:
    # The default window keeps 4 observations per worker (12 here); older ones drop out.
    s = _dylu_server("quantile")
    for v in [9.0] * 3 + [1.0] * 12:
        s.observe_speed(0, v)
    assert list(s.speed_pool) == [1.0] * 12 and s.reference_speed() == 1.0
    restored = _dylu_server("quantile")
    restored.load_state_dict(s.state_dict())
    assert list(restored.speed_pool) == list(s.speed_pool)
    # A pool of at most 1/(1 − 0.9) = 10 entries: the 0.9-quantile is its maximum.
    assert quantile_speed([0.5, 2.0, 1.0], 0.9) == 2.0
    assert quantile_speed([], 0.9) is None
    assert _dylu_server("quantile").steps_for(1) == 20  # nothing known yet: full H


class PullWorker:
    """Δ = 0.1·steps·θ_start (toward 0); 10 tokens per step."""

    def __init__(self, worker: int) -> None:
        self.worker = worker

    def run_round(
        self, start: Params, steps: int, base_revision: int, round_id: int | None = None
    ) -> RoundResult:
        delta = {"w": 0.1 * steps * start["w"]}
        return RoundResult(self.worker, delta, steps, 10 * steps, 0.0, base_revision, round_id)


def test_arrivals_at_one_time_are_all_applied_before_anyone_is_dispatched() -> None:
    # Paces [1, 1, 2], H = 1. At t = 1 workers 0 and 1 arrive; both are applied (revisions
    # 1, 2) and only then re-dispatched, so both start from revision 2 (the prototype's loop:
    # synchronize every worker whose finish time equals now, then dispatch the idle ones).
    # At t = 2 all three arrive: 0 and 1 from revision 2, 2 from revision 0; all restart at 5.
    init = {"w": torch.ones(2)}
    server = Server(
        init,
        build_optimizer("mla", init, OuterConfig(), 3),
        ServerConfig(n_workers=3, inner_steps=1),
    )
    clock = Clock([1.0, 1.0, 2.0], [0.0] * 3, 0.0, 0, None, 4.0, 0)
    simulate(server, [PullWorker(w) for w in range(3)], clock, lambda p: ValLoss(0.0, {}))
    got = [(a.worker, a.base_revision, a.staleness) for r in server.log for a in r.arrivals]
    assert got[:5] == [(0, 0, 0), (1, 0, 1), (0, 2, 0), (1, 2, 1), (2, 0, 4)]
    assert got[5:8] == [(0, 5, 0), (1, 5, 1), (0, 7, 0)]


def test_dylu_reference_is_a_run_setting() -> None:
    # Twelve workers: eleven at 1 s/step, one at 0.5 s/step (2 steps/s). The production
    # reference, sorted(speeds)[ceil(0.9·11)] = 1 step/s, gives everyone H = 10 (the fast one
    # capped); today's maximum, 2 steps/s, halves the eleven others.
    paces = [1.0] * 11 + [0.5]
    base = {"method": "dn-dylu", "workers": 12, "paces": paces, "inner_steps": 10}
    quantile = parse_sim_config({**base, "token_budget": 100, "dylu_reference": "quantile"})
    assert round_steps(InnerSetup.of(quantile), paces) == [10] * 12
    plain = InnerSetup.of(parse_sim_config({**base, "token_budget": 100}))
    assert round_steps(plain, paces) == [5] * 11 + [10]
    server = ServerSetup.of(quantile).build({"x": torch.zeros(1)}, [1.0] * 12).cfg
    assert (server.dylu_reference, server.dylu_quantile) == ("quantile", 0.9)
