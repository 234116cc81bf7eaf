"""Hypothesis properties of the outer optimizers and the block correction."""

from __future__ import annotations

import json

import pytest
import torch
from hypothesis import given, settings
from hypothesis import strategies as st

from heloco.outer import OuterConfig, build_optimizer, method_names, resolve_method
from heloco.outer.balanced import balanced_weights
from heloco.outer.base import Arrival
from heloco.outer.delayed import DelayedNesterov
from heloco.outer.heloco import CorrectionConfig, correct
from heloco.outer.nesterov import Nesterov

FAST = settings(max_examples=60, deadline=None)
floats = st.floats(-3.0, 3.0, allow_nan=False, width=32)
vec = st.lists(floats, min_size=2, max_size=6)


def _pair(draw: st.DrawFn) -> tuple[torch.Tensor, torch.Tensor]:
    n = draw(st.integers(2, 6))
    d = draw(st.lists(floats, min_size=n, max_size=n))
    m = draw(st.lists(floats, min_size=n, max_size=n))
    return torch.tensor(d), torch.tensor(m)


pairs = st.composite(_pair)()
forms = st.sampled_from(["normalized", "published"])


@FAST
@given(pair=pairs, form=forms)
def test_correction_never_grows_a_block_and_rotation_preserves_it(
    pair: tuple[torch.Tensor, torch.Tensor], form: str
) -> None:
    d, m = pair
    out, upd = correct({"x": d}, {"x": m}, CorrectionConfig(lambda_form=form))  # type: ignore[arg-type]
    n_in, n_out = float(d.norm()), float(out["x"].norm())
    assert n_out <= n_in * (1 + 1e-5) + 1e-6
    if bool(upd.rotated[0]):
        assert abs(n_out - n_in) <= 1e-5 * n_in + 1e-6
    if bool(upd.kept[0]):
        assert torch.equal(out["x"], d)


@FAST
@given(d=vec)
def test_zero_momentum_passes_through(d: list[float]) -> None:
    delta = torch.tensor(d)
    out, upd = correct({"x": delta}, {"x": torch.zeros_like(delta)}, CorrectionConfig())
    assert torch.equal(out["x"], delta)
    assert bool(upd.kept.all())


@FAST
@given(pair=pairs)
def test_correction_moves_toward_the_momentum(pair: tuple[torch.Tensor, torch.Tensor]) -> None:
    d, m = pair
    out, upd = correct({"x": d}, {"x": m}, CorrectionConfig())
    if bool(upd.kept[0]) or float(d.norm()) < 1e-3 or float(m.norm()) < 1e-3:
        return
    cos = torch.nn.functional.cosine_similarity
    assert float(cos(out["x"], m, dim=0)) >= float(cos(d, m, dim=0)) - 1e-5


@settings(max_examples=25, deadline=None)
@given(
    method=st.sampled_from(method_names()),
    grads=st.lists(st.lists(floats, min_size=3, max_size=3), min_size=3, max_size=6),
    split=st.integers(1, 5),
)
def test_state_dict_round_trip_gives_identical_updates(
    method: str, grads: list[list[float]], split: int
) -> None:
    k = 2
    sync = resolve_method(method).spec.policy.synchronous
    batch = k if sync else 1
    split = min(split, len(grads) // batch - 1) * batch if len(grads) >= 2 * batch else 0
    arrivals = [Arrival({"w": torch.tensor(g)}, i % k, i % 3) for i, g in enumerate(grads)]
    theta = {"w": torch.tensor([0.5, -0.5, 1.0])}
    a = build_optimizer(method, theta, OuterConfig(), k)
    for i in range(0, split, batch):
        a.step(theta, arrivals[i : i + batch])
    state = a.state_dict()
    state.meta = json.loads(json.dumps(state.meta))  # the meta must survive JSON
    theta_b = {"w": theta["w"].clone()}
    b = build_optimizer(method, theta_b, OuterConfig(), k)
    b.load_state_dict(state)
    for i in range(split, len(arrivals) - batch + 1, batch):
        a.step(theta, arrivals[i : i + batch])
        b.step(theta_b, arrivals[i : i + batch])
        assert torch.equal(theta["w"], theta_b["w"])
        assert torch.equal(a.dispatch_params(theta)["w"], b.dispatch_params(theta_b)["w"])


@FAST
@given(
    grads=st.lists(st.lists(floats, min_size=3, max_size=3), min_size=6, max_size=6),
    n=st.sampled_from([1, 2, 3]),
)
def test_dn_over_n_pushes_equals_nesterov_on_the_mean(grads: list[list[float]], n: int) -> None:
    theta_dn = {"w": torch.zeros(3)}
    theta_nv = {"w": torch.zeros(3)}
    dn = DelayedNesterov(theta_dn, lr=0.7, momentum=0.9, rho="none", n_workers=n, period=n)
    nv = Nesterov(theta_nv, lr=0.7, momentum=0.9, rho="none", n_workers=n)
    gs = [{"w": torch.tensor(g, dtype=torch.float64).float()} for g in grads]
    for start in range(0, 6, n):
        chunk = gs[start : start + n]
        for g in chunk:
            dn.step(theta_dn, [Arrival(g, 0, 0)])
        nv.step(theta_nv, [Arrival(g, 0, 0) for g in chunk])
        torch.testing.assert_close(theta_dn["w"], theta_nv["w"], rtol=1e-5, atol=1e-5)


@FAST
@given(raw=st.lists(st.floats(0.01, 1.0), min_size=2, max_size=8), cap=st.floats(1.0, 50.0))
def test_balanced_weights_have_unit_arrival_mean(raw: list[float], cap: float) -> None:
    shares = [r / sum(raw) for r in raw]
    w = balanced_weights(shares, cap, normalize="mean")
    assert abs(sum(s * x for s, x in zip(shares, w, strict=True)) - 1.0) < 1e-9
    assert all(x > 0 for x in w)
    for norm in ("clip", "max"):  # never amplify
        capped = balanced_weights(shares, cap, normalize=norm)  # type: ignore[arg-type]
        assert max(capped) == pytest.approx(1.0) and all(0 < x <= 1.0 + 1e-12 for x in capped)
