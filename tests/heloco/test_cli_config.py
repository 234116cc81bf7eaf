"""Config files: presets load, TOML round-trips, dotted overrides, null handling."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

import pytest

from heloco.config import (
    config_to_toml,
    deep_merge,
    load_config,
    parse_assignment,
    preset_names,
    save_config,
)
from heloco.model import ModelConfig
from shardmeter.errors import UserInputError


def test_shipped_presets_validate() -> None:
    assert {"default", "paper-regime", "converged"} <= set(preset_names())
    for name in preset_names():
        cfg = load_config(preset=name)
        assert cfg.token_budget is not None


@pytest.mark.parametrize(
    "overrides",
    [
        {},
        {"eval_windows": "null", "rho": "delay", "outer.correction.lambda_form": "published"},
        {"paces": [1.0, 2.5, 3.0, 1.0, 5.0], "inner.betas": [0.9, 0.95], "data.data_dir": "/x/y"},
        {"model": {"vocab_size": 300, "seq_len": 64, "n_layer": 1, "n_head": 1, "d_model": 8}},
        {"paces": {"median": 2.0, "sigma": 0.3}, "inner.grad_clip": 1.0, "time_budget": 12.5},
    ],
)
def test_round_trip(tmp_path: Path, overrides: dict[str, object]) -> None:
    cfg = load_config(overrides=overrides)
    path = tmp_path / "cfg.toml"
    save_config(cfg, path)
    again = load_config(path)
    assert again == cfg
    assert config_to_toml(again) == config_to_toml(cfg)


def test_null_and_model_table() -> None:
    cfg = load_config(overrides={"eval_windows": "null"})
    assert cfg.eval_windows is None
    model = {"vocab_size": 300, "seq_len": 64, "n_layer": 1, "n_head": 1, "d_model": 8}
    assert isinstance(load_config(overrides={"model": model}).model, ModelConfig)


def test_parse_assignment_values() -> None:
    assert parse_assignment("inner.lr=2e-4") == ("inner.lr", 2e-4)
    assert parse_assignment("paces=[1, 2]") == ("paces", [1, 2])
    assert parse_assignment("method=mla") == ("method", "mla")
    assert parse_assignment("dylu=true") == ("dylu", True)
    with pytest.raises(UserInputError):
        parse_assignment("=3")


def test_deep_merge_nested() -> None:
    merged = deep_merge({"a": {"b": 1, "c": 2}, "d": 1}, {"a": {"b": 5}, "e": 3})
    assert merged == {"a": {"b": 5, "c": 2}, "d": 1, "e": 3}


def test_file_and_preset_together_is_an_error(tmp_path: Path) -> None:
    path = tmp_path / "c.toml"
    path.write_text('method = "mla"\n')
    with pytest.raises(UserInputError, match="preset"):
        load_config(path, "default")


def test_malformed_toml(tmp_path: Path) -> None:
    path = tmp_path / "bad.toml"
    path.write_text("method = \n")
    with pytest.raises(UserInputError, match="TOML"):
        load_config(path)


@pytest.mark.slow  # a fresh interpreter
def test_the_config_module_is_a_leaf() -> None:
    """``heloco.config`` (the run file's schema, TOML, presets, overrides) loads no other part
    of heloco, and no torch: the layers above build from it, never the reverse."""
    code = (
        "import sys, heloco.config; "
        "print(sorted(m for m in sys.modules if m.startswith('heloco')), 'torch' in sys.modules)"
    )
    out = subprocess.run(
        [sys.executable, "-c", code], capture_output=True, text=True, check=True
    ).stdout
    assert out.strip() == "['heloco', 'heloco.config'] False"


def test_every_method_policy_has_one_builder() -> None:
    """The run file checks method names against ``METHOD_POLICIES``; the registry builds each
    with the same policy, so the two cannot drift apart."""
    from heloco.config import METHOD_POLICIES, method_names
    from heloco.outer.registry import METHODS, resolve_method

    assert list(METHODS) == list(METHOD_POLICIES)
    for name in method_names():
        spec = resolve_method(name).spec
        assert spec.policy is METHOD_POLICIES[name.removesuffix("+ab")]
    with pytest.raises(UserInputError, match="one of sync, async-nesterov"):
        resolve_method("sync+ab")
