"""Every reference vector in heloco-vectors.json, read in place, matched in float32."""

from __future__ import annotations

import json
from typing import Any

import pytest
import torch

from heloco.outer.base import Arrival
from heloco.outer.delayed import DelayedNesterov
from heloco.outer.heloco import CorrectionConfig, HeLoCo, correct
from heloco.outer.lookahead import MomentumLookAhead
from heloco.outer.nesterov import Nesterov
from heloco.types import Params
from shardmeter.paths import missing_shared_reason, shared_path

VECTORS = ("design", "heloco-vectors.json")
RTOL, ATOL = 1e-5, 1e-6


@pytest.fixture(scope="module")
def vectors() -> dict[str, Any]:
    path = shared_path(*VECTORS)
    if path is None:
        pytest.skip(missing_shared_reason(*VECTORS))
    return json.loads(path.read_text())


def _t(x: Any) -> torch.Tensor:
    return torch.tensor(x, dtype=torch.float32)


def _params(d: dict[str, Any]) -> Params:
    return {k: _t(v) for k, v in d.items()}


def _hp(vectors: dict[str, Any], form: str = "normalized") -> CorrectionConfig:
    h = vectors["hyperparameters"]
    return CorrectionConfig(
        c_ok=h["c_ok"],
        k_s=h["k_s"],
        beta_max=h["beta_max"],
        k_d=h["k_d"],
        kappa=h["kappa"],
        c_bad=h["c_bad"],
        eps=h["eps"],
        lambda_form=form,
    )


def test_correction_cases(vectors: dict[str, Any]) -> None:
    cases = vectors["correction_cases"]
    assert len(cases) >= 10
    for i, case in enumerate(cases):
        cfg = _hp(vectors, case["lambda_form"])
        out, upd = correct({"x": _t(case["delta"])}, {"x": _t(case["momentum"])}, cfg)
        expected = _t(case["expected"])
        torch.testing.assert_close(out["x"], expected, rtol=RTOL, atol=ATOL, msg=f"case {i}")
        label = {
            "keep": upd.kept,
            "degenerate": upd.kept,
            "shrink": upd.shrunk,
            "rotate": upd.rotated,
        }
        assert bool(label[case["case"]][0]), f"case {i} classified wrongly"


def _run(opt: Any, vectors: dict[str, Any], batch: int = 1) -> list[dict[str, Params]]:
    seq = vectors["sequences"]
    theta = _params(seq["initial_theta"])
    grads = [_params(g) for g in seq["pseudo_gradients_in_arrival_order"]]
    out = []
    for i in range(0, len(grads), batch):
        arrivals = [
            Arrival(delta=g, worker=j, staleness=0) for j, g in enumerate(grads[i : i + batch])
        ]
        opt.step(theta, arrivals)
        state = opt.state_dict().tensors
        mom = {k.split("/", 1)[1]: v for k, v in state.items() if k.startswith("momentum/")}
        out.append(
            {
                "theta": {k: v.clone() for k, v in theta.items()},
                "momentum": mom,
                "dispatch": opt.dispatch_params(theta),
            }
        )
    return out


def _check(got: list[dict[str, Params]], expected: list[dict[str, Any]], name: str) -> None:
    assert len(got) == len(expected)
    for i, (g, e) in enumerate(zip(got, expected, strict=True)):
        for field in ("theta", "momentum", "dispatch"):
            for k, v in e[field].items():
                torch.testing.assert_close(
                    g[field][k], _t(v), rtol=RTOL, atol=ATOL, msg=f"{name} step {i} {field}/{k}"
                )


def _init(vectors: dict[str, Any]) -> Params:
    return _params(vectors["sequences"]["initial_theta"])


@pytest.mark.parametrize("form", ["normalized", "published"])
@pytest.mark.parametrize("order", [("first", "before"), ("after", "after")])
def test_heloco_sequences(vectors: dict[str, Any], form: str, order: tuple[str, str]) -> None:
    seq = vectors["sequences"]
    h = vectors["hyperparameters"]
    opt = HeLoCo(
        _init(vectors),
        lr=h["outer_lr"],
        momentum=h["outer_momentum"],
        rho="sqrt_k",
        n_workers=seq["K"],
        correction=_hp(vectors, form),
        rho_order=order[1],
    )
    name = f"heloco_{form}_rho_{order[0]}"
    _check(_run(opt, vectors), seq[name], name)


def test_mla_sequence(vectors: dict[str, Any]) -> None:
    seq = vectors["sequences"]
    h = vectors["hyperparameters"]
    opt = MomentumLookAhead(
        _init(vectors),
        lr=h["outer_lr"],
        momentum=h["outer_momentum"],
        rho="sqrt_k",
        n_workers=seq["K"],
    )
    _check(_run(opt, vectors), seq["mla"], "mla")


def test_async_nesterov_sequence(vectors: dict[str, Any]) -> None:
    seq = vectors["sequences"]
    opt = Nesterov(_init(vectors), lr=0.07, momentum=0.9, rho="sqrt_k", n_workers=seq["K"])
    _check(_run(opt, vectors), seq["async_nesterov_lr0.07_rho"], "async nesterov")


def test_sync_diloco_sequence(vectors: dict[str, Any]) -> None:
    seq = vectors["sequences"]
    opt = Nesterov(_init(vectors), lr=0.7, momentum=0.9, rho="none", n_workers=2)
    _check(_run(opt, vectors, batch=2), seq["sync_diloco_lr0.7_two_rounds_of_two"], "sync")


def test_delayed_nesterov_sequence(vectors: dict[str, Any]) -> None:
    seq = vectors["sequences"]
    opt = DelayedNesterov(
        _init(vectors), lr=0.07, momentum=0.9, rho="none", n_workers=seq["K"], period=2
    )
    _check(_run(opt, vectors), seq["delayed_nesterov_N2_lr0.07"], "dn")
