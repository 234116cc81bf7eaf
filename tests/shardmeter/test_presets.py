"""Shipped presets: every file validates, sizes match published counts, hardware numbers are
dense datasheet values with a cited source, and the calibration set is covered."""

from __future__ import annotations

import json
import re
import time

import pytest

from shardmeter.cli import main
from shardmeter.specs.loader import (
    DATA_DIR,
    KINDS,
    clusters_for_accelerator,
    list_presets,
    load_accelerator,
    load_cluster,
    load_model,
    preset_data,
    preset_names,
)
from shardmeter.specs.model import TransformerSpec

MODELS = preset_names("models")
ACCELERATORS = preset_names("accelerators")
CLUSTERS = preset_names("clusters")

# Published sizes are rounded (1.7B, 7.5B, ...) and include biases, norms and learned position
# embeddings that TransformerSpec ignores; 3.5% covers both (worst: Megatron 1.7B = 1.65B).
DENSE_TOLERANCE = 0.035
# MoE active counts: Mixtral within 0.5%. DeepSeek-V3 37.56B vs "37B": the published figure is
# rounded down, and MLA is represented by its exact weight count (docs/specs.md), so 2%.
ACTIVE_TOLERANCE = 0.02


def _rel(a: float, b: float) -> float:
    return abs(a / b - 1.0)


def test_required_presets_ship() -> None:
    required_models = {
        "gpt3-175b", "gpt-1.7b", "gpt-1t", "llama-2-7b", "llama-2-13b", "llama-2-70b",
        "llama-3-8b", "llama-3-70b", "llama-3.1-8b", "llama-3.1-70b", "llama-3.1-405b",
        "mixtral-8x7b", "mixtral-8x22b", "deepseek-v3", "nemotron-4-15b", "nemotron-4-340b",
        "mpt-1b", "mpt-70b", "bloom-176b", "opt-125m", "opt-175b",
    }  # fmt: skip
    required_accelerators = {
        "a100-40gb", "a100-80gb", "h100-sxm", "h100-sxm-96gb-500w", "h100-pcie", "h200", "b200",
        "gb200", "gb300", "mi300x", "l40s", "tpu-v4", "tpu-v5p",
        "a10g", "l4", "rtx-4090", "rtx-6000-ada", "rtx-a6000", "a40",
    }  # fmt: skip
    required_clusters = {
        "dgx-a100", "dgx-a100-40gb", "dgx-h100", "hgx-h200", "dgx-b200", "gb200-nvl72",
        "dgx-h100-roce", "h100-ethernet-100g", "a100-ethernet-25g", "mi300x-node", "l40s-pcie",
        "tpu-v5p-pod", "tpu-v4-pod",
    }  # fmt: skip
    assert required_models <= set(MODELS)
    assert required_accelerators <= set(ACCELERATORS)
    assert required_clusters <= set(CLUSTERS)


@pytest.mark.parametrize("kind", KINDS)
def test_every_preset_lists_with_summary_and_source(kind: str) -> None:
    infos = list_presets(kind)
    assert [info.name for info in infos] == list(preset_names(kind))
    for info in infos:
        assert info.summary, f"{kind}/{info.name} has no [preset] summary"
        if kind != "topologies":
            assert info.source, f"{kind}/{info.name} has no source"


@pytest.mark.parametrize("name", MODELS)
def test_model_preset_matches_published_size(name: str) -> None:
    model = load_model(name)
    meta = preset_data("models", name)["preset"]
    assert model.name == name
    assert _rel(model.params_total / 1e9, meta["published_params_b"]) < DENSE_TOLERANCE
    if model.moe is None:
        assert model.params_active == model.params_total
        assert "published_active_params_b" not in meta
    else:
        active = model.params_active / 1e9
        assert _rel(active, meta["published_active_params_b"]) < ACTIVE_TOLERANCE


@pytest.mark.parametrize(
    ("name", "total_b", "active_b", "tolerance"),
    [
        ("gpt3-175b", 175.0, 175.0, 0.005),
        ("llama-3.1-405b", 405.0, 405.0, 0.005),
        ("llama-2-70b", 69.0, 69.0, 0.005),
        ("mixtral-8x7b", 46.7, 12.9, 0.005),
        ("mixtral-8x22b", 141.0, 39.0, 0.005),
        ("deepseek-v3", 671.0, 37.0, 0.016),
        ("bloom-176b", 176.0, 176.0, 0.005),
        ("opt-175b", 175.0, 175.0, 0.005),
    ],
)
def test_headline_sizes(name: str, total_b: float, active_b: float, tolerance: float) -> None:
    model = load_model(name)
    assert _rel(model.params_total / 1e9, total_b) < tolerance
    assert _rel(model.params_active / 1e9, active_b) < tolerance


def test_deepseek_v3_layout() -> None:
    model = load_model("deepseek-v3")
    assert model.moe is not None
    assert (model.n_moe_layers, model.n_dense_layers) == (58, 3)
    assert (model.expert_ffn, model.dense_ffn) == (2048, 18432)
    # MLA weights per layer (q_lora 1536, kv_lora 512, qk 128+64, v 128) = 187,105,280;
    # the equal-weight GQA shape (head_dim 96, 8 KV heads) is within 0.04% of it.
    assert _rel(model.attn_params_per_layer, 187_105_280) < 1e-3


def test_long_context_override_keeps_parameters() -> None:
    base = load_model("llama-3.1-8b")
    long = load_model("llama-3.1-8b", seq_len=131072)
    assert long.seq_len == 131072 and long.params_total == base.params_total
    assert long.attention_flops_per_token() == pytest.approx(16 * base.attention_flops_per_token())


# --- accelerators ---------------------------------------------------------------------------
@pytest.mark.parametrize("name", ACCELERATORS)
def test_accelerator_preset_is_sane(name: str) -> None:
    accel = load_accelerator(name)
    assert accel.name == name
    bf16 = accel.peak("bf16")
    assert 100 <= bf16 <= 5000  # TFLOP/s: every shipped chip is in this range
    if "fp32" in accel.peak_tflops:
        assert accel.peak_tflops["fp32"] < bf16
    if "tf32" in accel.peak_tflops:  # dense TF32 is half of dense BF16 on all these chips
        assert accel.peak_tflops["tf32"] == pytest.approx(bf16 / 2, rel=0.02)
    if "fp8" in accel.peak_tflops:  # dense FP8 is twice dense BF16
        assert accel.peak_tflops["fp8"] == pytest.approx(2 * bf16, rel=0.02)
    assert 16 <= accel.hbm_gb <= 300 and 250 <= accel.hbm_gbps <= 10_000  # L4: 300 GB/s
    eff = accel.efficiency
    assert 0.4 <= eff.matmul_max <= 0.95 and 0.5 <= eff.memory <= 0.95 and eff.source


@pytest.mark.parametrize(
    ("name", "bf16", "hbm_gib", "hbm_gbps"),
    [  # dense datasheet values (sparsity figures are exactly twice these); memory in GiB
        ("a100-80gb", 312.0, 80.0, 2039.0),
        ("h100-sxm", 989.4, 80.0, 3350.0),
        ("h200", 989.4, 141.0, 4800.0),
        ("b200", 2250.0, 180.0, 8000.0),
        ("mi300x", 1307.4, 192.0, 5300.0),
        ("l40s", 362.05, 48.0, 864.0),
        ("tpu-v5p", 459.0, 95.0, 2765.0),
    ],
)
def test_accelerator_datasheet_values(
    name: str, bf16: float, hbm_gib: float, hbm_gbps: float
) -> None:
    accel = load_accelerator(name)
    assert (accel.peak("bf16"), accel.hbm_gbps) == (bf16, hbm_gbps)
    assert accel.hbm_gb == pytest.approx(hbm_gib * 2**30 / 1e9, abs=0.005)  # field is 1e9 B


@pytest.mark.parametrize("name", ACCELERATORS)
def test_every_accelerator_number_cites_a_source(name: str) -> None:
    text = (DATA_DIR / "accelerators" / f"{name}.toml").read_text()
    section = ""
    for line in text.splitlines():
        if line.startswith("["):
            section = line.strip("[] ")
        numeric = re.match(r"^(\w+)\s*=\s*[0-9.]+", line)
        if numeric and (section == "peak_tflops" or numeric.group(1) in ("hbm_gb", "hbm_gbps")):
            assert "#" in line, f"{name}: {line!r} has no source comment"


# --- clusters -------------------------------------------------------------------------------
@pytest.mark.parametrize("name", CLUSTERS)
def test_cluster_preset_is_sane(name: str) -> None:
    cluster = load_cluster(name)
    assert cluster.name == name
    assert cluster.accelerator.name in ACCELERATORS
    assert cluster.accelerator == load_accelerator(cluster.accelerator.name)
    assert cluster.intra.bandwidth_gbps > cluster.inter.bandwidth_gbps
    assert cluster.intra.latency_us <= cluster.inter.latency_us
    assert cluster.nvlink_domain >= cluster.gpus_per_node
    assert cluster.price_per_gpu_hour > 0
    text = (DATA_DIR / "clusters" / f"{name}.toml").read_text()
    price_line = next(line for line in text.splitlines() if line.startswith("price_per_gpu_hour"))
    assert "#" in price_line, "the price needs its source in a comment"


def test_nvl72_domain_spans_trays() -> None:
    cluster = load_cluster("gb200-nvl72")
    assert (cluster.gpus_per_node, cluster.nvlink_domain) == (4, 72)
    assert cluster.intra.bandwidth_gbps == 900.0  # 1.8 TB/s bidirectional NVLink5


@pytest.mark.parametrize(
    ("name", "intra", "inter"),
    [("dgx-a100", 300.0, 25.0), ("dgx-h100", 450.0, 50.0), ("dgx-b200", 900.0, 50.0)],
)
def test_dgx_link_numbers(name: str, intra: float, inter: float) -> None:
    cluster = load_cluster(name)
    assert (cluster.intra.bandwidth_gbps, cluster.inter.bandwidth_gbps) == (intra, inter)


# --- calibration coverage ---------------------------------------------------------------------
def _architecture(model: TransformerSpec) -> tuple[object, ...]:
    return (
        model.n_layers, model.hidden, model.n_heads, model.kv_heads, model.dim_head,
        model.ffn, model.vocab, model.mlp,
    )  # fmt: skip


def _row_architecture(row: dict[str, str]) -> tuple[object, ...]:
    keys = ("n_layers", "hidden", "n_heads", "n_kv_heads", "head_dim", "ffn", "vocab")
    return (*(int(row[key]) for key in keys), row["mlp"])


def test_every_calibration_architecture_has_a_preset_with_the_same_count(
    corrected_rows: list[dict[str, str]],
) -> None:
    by_arch: dict[tuple[object, ...], list[TransformerSpec]] = {}
    for name in MODELS:
        model = load_model(name)
        by_arch.setdefault(_architecture(model), []).append(model)
    rows = [row for row in corrected_rows if not row["moe_experts"]]
    assert rows
    for row in rows:
        matches = by_arch.get(_row_architecture(row))
        assert matches, f"no preset for calibration row {row['run_id']} ({row['model']})"
        for model in matches:
            assert _rel(model.params_total / 1e9, float(row["params_b_arch"])) < 1e-3, (
                row["run_id"],
                model.name,
            )


def test_every_calibration_gpu_has_an_accelerator_and_a_matching_cluster(
    corrected_rows: list[dict[str, str]],
) -> None:
    for row in corrected_rows:
        accel = load_accelerator(row["gpu"])
        clusters = [load_cluster(name) for name in clusters_for_accelerator(accel.name)]
        assert clusters, f"no cluster preset for {row['gpu']}"
        if row["gpus_per_node"]:
            assert any(c.gpus_per_node == int(row["gpus_per_node"]) for c in clusters)
        if row["inter_node_gbps_per_gpu"]:
            gbytes = float(row["inter_node_gbps_per_gpu"]) / 8
            assert any(c.inter.bandwidth_gbps == gbytes for c in clusters), row["run_id"]


# --- speed and CLI ----------------------------------------------------------------------------
def test_presets_load_fast_and_are_cached() -> None:
    start = time.perf_counter()
    for name in MODELS:
        load_model(name)
    for name in CLUSTERS:
        load_cluster(name)
    assert time.perf_counter() - start < 5.0  # ~0.3 s on one idle core
    assert load_model("llama-3.1-8b") is load_model("llama-3.1-8b")
    assert load_cluster("dgx-h100") is load_cluster("dgx-h100")


def test_cli_lists_presets_as_json(capsys: pytest.CaptureFixture[str]) -> None:
    assert main(["presets", "accelerators", "--json"]) == 0
    listed = json.loads(capsys.readouterr().out)
    assert [item["name"] for item in listed] == list(ACCELERATORS)
    assert all(item["kind"] == "accelerators" and item["source"] for item in listed)


def test_cli_shows_a_model_with_derived_counts(capsys: pytest.CaptureFixture[str]) -> None:
    assert main(["presets", "show", "llama-3.1-405b", "--json"]) == 0
    shown = json.loads(capsys.readouterr().out)
    model = load_model("llama-3.1-405b")
    assert shown["derived"]["params_total"] == model.params_total
    assert shown["derived"]["training_flops_per_token"] == model.training_flops_per_token()
    assert main(["presets", "show", "mixtral-8x7b"]) == 0
    text = capsys.readouterr().out
    assert "46.703 B" in text and "12.880 B" in text


def test_cli_table_and_unknown_name(capsys: pytest.CaptureFixture[str]) -> None:
    assert main(["presets", "clusters"]) == 0
    assert "gb200-nvl72" in capsys.readouterr().out
    assert main(["presets", "show", "h100-sx"]) == 2
    err = capsys.readouterr().err.strip()
    assert "\n" not in err and "h100-sxm" in err and "shardmeter presets" in err
    assert main(["presets", "gizmos"]) == 2
    assert "models, accelerators" in capsys.readouterr().err
