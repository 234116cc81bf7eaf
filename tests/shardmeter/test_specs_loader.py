"""Loading specs from presets, TOML/JSON files and dicts: overrides, references, one-line errors."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from shardmeter.errors import UserInputError
from shardmeter.specs.hardware import Cluster
from shardmeter.specs.loader import (
    apply_overrides,
    load_accelerator,
    load_cluster,
    load_model,
    load_plan,
    preset_data,
    split_meta,
)
from shardmeter.specs.model import TransformerSpec
from shardmeter.specs.plan import Plan

LLAMA_TOML = """
name = "my-llama"
n_layers = 32
hidden = 4096
n_heads = 32
n_kv_heads = 8
ffn = 14336
mlp = "swiglu"
vocab = 128256
seq_len = 8192

[preset]
summary = "metadata is ignored by the spec"
"""


def _error(call: Any, *args: Any, **kwargs: Any) -> str:
    with pytest.raises(UserInputError) as info:
        call(*args, **kwargs)
    message = str(info.value)
    assert "\n" not in message
    return message


def _write(tmp_path: Path, name: str, text: str) -> Path:
    path = tmp_path / name
    path.write_text(text)
    return path


# --- files and dicts --------------------------------------------------------------------------
def test_model_from_toml_equals_preset_shape(tmp_path: Path) -> None:
    model = load_model(_write(tmp_path, "llama.toml", LLAMA_TOML))
    preset = load_model("llama-3.1-8b")
    assert model.name == "my-llama"
    assert model.params_total == preset.params_total
    assert load_model(str(tmp_path / "llama.toml")) == model


def test_model_from_json_and_dict(tmp_path: Path) -> None:
    data, _ = split_meta(preset_data("models", "mixtral-8x7b"))
    path = _write(tmp_path, "mixtral.json", json.dumps(data))
    assert load_model(path) == load_model("mixtral-8x7b") == load_model(data)


def test_overrides_replace_and_merge() -> None:
    model = load_model("llama-3.1-70b", seq_len=32768, name="llama-long")
    assert (model.seq_len, model.name, model.n_layers) == (32768, "llama-long", 80)
    base = load_accelerator("h100-sxm")
    accel = load_accelerator("h100-sxm", **{"efficiency.matmul_max": 0.6}, tdp_w=500.0)
    assert accel.efficiency.matmul_max == 0.6
    assert accel.efficiency.memory == base.efficiency.memory  # the rest of the table is kept
    assert accel.tdp_w == 500.0
    moe = load_model("mixtral-8x7b", moe={"top_k": 1})
    assert moe.moe is not None and (moe.moe.experts, moe.moe.top_k) == (8, 1)


def test_apply_overrides_does_not_mutate() -> None:
    base = {"inter": {"bandwidth_gbps": 50.0, "latency_us": 5.0}}
    out = apply_overrides(base, {"inter.latency_us": 9.0, "n_nodes": 2})
    assert out == {"inter": {"bandwidth_gbps": 50.0, "latency_us": 9.0}, "n_nodes": 2}
    assert base["inter"]["latency_us"] == 5.0


def test_cluster_overrides_and_accelerator_swap() -> None:
    cluster = load_cluster(
        "dgx-h100", n_nodes=16, accelerator="h200", inter={"bandwidth_gbps": 25.0}
    )
    assert cluster.n_gpus == 128 and cluster.accelerator.name == "h200"
    assert (cluster.inter.bandwidth_gbps, cluster.inter.latency_us) == (25.0, 5.0)
    tweaked = load_cluster("dgx-h100", **{"accelerator.hbm_gb": 96.0})
    assert tweaked.accelerator.hbm_gb == 96.0 and tweaked.accelerator.name == "h100-sxm"
    assert load_cluster(cluster) is cluster
    assert load_cluster(cluster, n_nodes=2).n_gpus == 16


CLUSTER_TOML = """
name = "my-cluster"
gpus_per_node = 8
nvlink_domain = 8
price_per_gpu_hour = 2.0
{accelerator}

[intra]
bandwidth_gbps = 450.0

[inter]
bandwidth_gbps = 12.5
latency_us = 10.0
"""


def test_cluster_file_references_or_inlines_the_accelerator(tmp_path: Path) -> None:
    by_name = load_cluster(
        _write(tmp_path, "a.toml", CLUSTER_TOML.format(accelerator='accelerator = "h100-sxm"'))
    )
    inline_preset = load_cluster(
        _write(
            tmp_path,
            "b.toml",
            CLUSTER_TOML.format(accelerator="")
            + '\n[accelerator]\npreset = "h100-sxm"\nhbm_gb = 96.0\n',
        )
    )
    full = load_accelerator("a100-80gb").model_dump()
    inline_full = load_cluster(
        _write(tmp_path, "c.json", json.dumps({**_cluster_dict(), "accelerator": full}))
    )
    assert by_name.accelerator == load_accelerator("h100-sxm")
    assert inline_preset.accelerator.hbm_gb == 96.0
    assert inline_preset.accelerator.peak("bf16") == 989.4
    assert inline_full.accelerator == load_accelerator("a100-80gb")
    assert isinstance(by_name, Cluster) and by_name.inter.bandwidth_gbps == 12.5


def _cluster_dict() -> dict[str, Any]:
    return {
        "gpus_per_node": 8,
        "nvlink_domain": 8,
        "intra": {"bandwidth_gbps": 450.0},
        "inter": {"bandwidth_gbps": 50.0},
    }


def test_files_can_start_from_a_preset(tmp_path: Path) -> None:
    model = load_model(_write(tmp_path, "m.toml", 'preset = "llama-3.1-8b"\nseq_len = 32768\n'))
    assert model == load_model("llama-3.1-8b", seq_len=32768)
    accel = load_accelerator(_write(tmp_path, "a.toml", 'preset = "h100-sxm"\ntdp_w = 500.0\n'))
    assert accel == load_accelerator("h100-sxm", tdp_w=500.0)
    text = 'preset = "dgx-h100"\nn_nodes = 4\n[inter]\nbandwidth_gbps = 25.0\n[accelerator]\nhbm_gb = 96.0\n'
    cluster = load_cluster(_write(tmp_path, "c.toml", text))
    assert (cluster.n_gpus, cluster.inter.bandwidth_gbps, cluster.inter.latency_us) == (
        32,
        25.0,
        5.0,
    )
    assert cluster.accelerator.hbm_gb == 96.0 and cluster.accelerator.name == "h100-sxm"
    swapped = load_cluster({"preset": "dgx-h100", "accelerator": {"preset": "h200"}})
    assert swapped.accelerator == load_accelerator("h200")
    assert "dgx-h100" in _error(load_cluster, {"preset": "dgx-h10"})


def test_plan_from_file_with_plan_table(tmp_path: Path) -> None:
    text = 'model = "llama-3.1-8b"\ncluster = "dgx-h100"\n\n[plan]\ndp = 8\ntp = 2\nsharding = "zero3"\nglobal_batch = 64\n'
    plan = load_plan(_write(tmp_path, "run.toml", text))
    assert plan == Plan(dp=8, tp=2, sharding="zero3", global_batch=64)
    assert load_plan({"dp": 4, "recompute": "full"}).recompute == "full"
    assert load_plan(plan, dp=16).dp == 16


# --- errors -----------------------------------------------------------------------------------
def test_unknown_preset_lists_close_matches() -> None:
    message = _error(load_model, "llama-3.1-7b")
    assert "llama-3.1-8b" in message and "shardmeter presets models" in message
    assert "h100-sxm" in _error(load_accelerator, "h100")
    assert "dgx-h100" in _error(load_cluster, "dgx-h10")


def test_bad_value_names_file_and_field(tmp_path: Path) -> None:
    path = _write(tmp_path, "bad.toml", LLAMA_TOML.replace("n_layers = 32", "n_layers = 0"))
    message = _error(load_model, path)
    assert message.startswith("bad.toml:model.n_layers: got 0;") and "greater than 0" in message


def test_literal_error_lists_allowed_values(tmp_path: Path) -> None:
    path = _write(tmp_path, "relu.toml", LLAMA_TOML.replace('"swiglu"', '"relu"'))
    message = _error(load_model, path)
    assert "mlp" in message and "'gelu'" in message and "'swiglu'" in message
    plan_message = _error(load_plan, {"sharding": "zero4"})
    assert plan_message.startswith("plan.sharding") and "'zero3'" in plan_message


def test_unknown_field_lists_allowed_fields() -> None:
    message = _error(load_model, "llama-3.1-8b", n_layer=3)
    assert message.startswith("model.n_layer:") and "n_layers" in message
    nested = _error(load_cluster, "dgx-h100", **{"inter.bandwith_gbps": 3.0})
    assert nested.startswith("cluster.inter.bandwith_gbps") and "bandwidth_gbps" in nested


def test_missing_field_and_cross_field_errors() -> None:
    data, _ = split_meta(preset_data("models", "llama-3.1-8b"))
    del data["ffn"]
    assert _error(load_model, data).startswith("model.ffn: got None; required field")
    message = _error(load_model, "llama-3.1-8b", n_kv_heads=5)
    assert message == "model.n_kv_heads: got 5; a divisor of n_heads (32)"
    message = _error(load_cluster, "dgx-h100", nvlink_domain=3)
    assert message == "cluster.nvlink_domain: got 3; a divisor or multiple of gpus_per_node (8)"
    message = _error(load_cluster, "dgx-h100", **{"inter.bandwidth_gbps": -1})
    assert message.startswith("cluster.inter.bandwidth_gbps: got -1")


def test_file_problems_are_one_line(tmp_path: Path) -> None:
    assert "file not found" in _error(load_model, tmp_path / "nope.toml")
    broken = _write(tmp_path, "broken.toml", "n_layers = = 3\n")
    assert "invalid TOML" in _error(load_model, broken)
    assert "invalid JSON" in _error(load_plan, _write(tmp_path, "p.json", "{dp: 2"))
    assert "table/object" in _error(load_plan, _write(tmp_path, "list.json", "[1, 2]"))
    assert ".toml or .json" in _error(load_model, _write(tmp_path, "m.yaml", "a: 1"))


def test_non_finite_numbers_are_rejected(tmp_path: Path) -> None:
    message = _error(load_accelerator, "h100-sxm", **{"peak_tflops.bf16": float("nan")})
    assert message == "accelerator.peak_tflops.bf16: got nan; expected a finite number"
    path = _write(tmp_path, "inf.toml", 'accelerator = "h100-sxm"\nprice_per_gpu_hour = inf\n')
    assert _error(load_cluster, path).startswith("inf.toml:cluster.price_per_gpu_hour: got inf")


def test_cluster_file_with_unknown_accelerator(tmp_path: Path) -> None:
    text = CLUSTER_TOML.format(accelerator='accelerator = "h100-sxm5"')
    message = _error(load_cluster, _write(tmp_path, "x.toml", text))
    assert message.startswith("x.toml:cluster.accelerator: got 'h100-sxm5'")
    assert "h100-sxm" in message


# --- property: invalid input only ever raises UserInputError ----------------------------------
JUNK = st.one_of(
    st.none(),
    st.booleans(),
    st.integers(min_value=-(2**70), max_value=2**70),
    st.floats(allow_nan=True, allow_infinity=True),
    st.text(max_size=8),
    st.lists(st.integers(), max_size=3),
    st.dictionaries(st.text(max_size=5), st.integers(), max_size=2),
)
MODEL_BASE = split_meta(preset_data("models", "deepseek-v3"))[0]
MODEL_KEYS = [
    *TransformerSpec.model_fields,
    "moe.experts",
    "moe.top_k",
    "moe.dense_layers",
    "bogus",
]
PLAN_KEYS = [*Plan.model_fields, "bogus"]


def _mutate(base: dict[str, Any], changes: dict[str, Any], drops: list[str]) -> dict[str, Any]:
    data = apply_overrides(base, changes)
    for key in drops:
        data.pop(key, None)
    return data


@settings(max_examples=150, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(
    changes=st.dictionaries(st.sampled_from(MODEL_KEYS), JUNK, min_size=1, max_size=3),
    drops=st.lists(st.sampled_from(list(TransformerSpec.model_fields)), max_size=2),
)
def test_random_model_dicts_raise_only_user_input_error(
    changes: dict[str, Any], drops: list[str]
) -> None:
    data = _mutate(MODEL_BASE, changes, drops)
    try:
        model = load_model(data)
    except UserInputError as exc:
        assert "\n" not in str(exc) and str(exc).startswith("model")
        return
    assert model.params_total > 0  # a mutation may happen to be valid


@settings(max_examples=150, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(changes=st.dictionaries(st.sampled_from(PLAN_KEYS), JUNK, min_size=1, max_size=4))
def test_random_plan_dicts_raise_only_user_input_error(changes: dict[str, Any]) -> None:
    try:
        plan = load_plan(changes)
    except UserInputError as exc:
        assert "\n" not in str(exc) and str(exc).startswith("plan")
        return
    assert plan.n_gpus >= 1
