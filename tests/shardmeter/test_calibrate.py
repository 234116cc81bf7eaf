"""CSV rows -> specs, error statistics, the fitter, and accuracy on the shared calibration runs."""

from __future__ import annotations

from collections.abc import Callable
from pathlib import Path

import numpy as np
import pytest

from shardmeter.calibrate import (
    Calibration,
    cluster_from_row,
    evaluate_rows,
    leave_one_source_out,
    model_from_row,
    nelder_mead,
    plan_from_row,
    predict_run,
    predictions,
    read_rows,
    run_from_row,
    source_weights,
    summarize,
    summarize_results,
)
from shardmeter.errors import UserInputError
from shardmeter.memcheck import read_memory_rows
from shardmeter.paths import missing_shared_reason, shared_path

BASE = {
    "run_id": "1", "source_id": "SX", "model": "m", "n_layers": "32", "hidden": "4096",
    "n_heads": "32", "n_kv_heads": "8", "head_dim": "128", "ffn": "14336", "vocab": "128256",
    "seq_len": "8192", "mlp": "swiglu", "gpu": "h100-sxm", "n_gpus": "16", "gpus_per_node": "8",
    "nvlink_domain": "8", "inter_node_gbps_per_gpu": "", "tp": "2", "pp": "1", "dp": "8",
    "cp": "1", "ep": "1", "vpp": "", "sp": "", "sharding": "", "shard_degree": "",
    "micro_batch": "", "global_batch": "16", "recompute": "", "precision": "bf16",
    "framework": "NeMo 24.09", "tokens_per_sec_per_gpu": "5000", "notes": "",
}  # fmt: skip


def test_model_from_row_and_tied_embeddings() -> None:
    model = model_from_row(BASE)
    assert (model.kv_heads, model.mlp, model.moe, model.tied_embeddings) == (
        8,
        "swiglu",
        None,
        False,
    )
    mpt = {**BASE, "n_kv_heads": "32", "vocab": "50368", "mlp": "gelu", "ffn": "16384",
           "params_b_arch": "6.64876"}  # fmt: skip
    assert model_from_row(mpt).tied_embeddings


def test_moe_dense_layers_from_notes() -> None:
    row = {**BASE, "model": "DeepSeek-V3", "n_layers": "61", "hidden": "7168", "n_heads": "128",
           "n_kv_heads": "128", "head_dim": "192", "vocab": "129280", "moe_experts": "256",
           "moe_topk": "8", "moe_shared_experts": "1", "ffn": "2048", "notes": ""}  # fmt: skip
    spec = model_from_row(row)
    assert spec.moe is not None
    assert (spec.moe.dense_layers, spec.dense_ffn, spec.expert_ffn) == (3, 18432, 2048)
    assert spec.params_total / 1e9 == pytest.approx(671, rel=0.01)  # MLA as same-weight GQA
    assert spec.params_active / 1e9 == pytest.approx(37, rel=0.03)
    row["notes"] = "first 1 dense layers, dense FFN 10944"
    spec = model_from_row(row)
    assert spec.moe is not None and (spec.moe.dense_layers, spec.dense_ffn) == (1, 10944)


def test_cluster_from_row_nic_override() -> None:
    cluster = cluster_from_row({**BASE, "inter_node_gbps_per_gpu": "200"})
    assert cluster.inter.bandwidth_gbps == 25.0
    assert cluster.accelerator.name == "h100-sxm"
    nvl = cluster_from_row({**BASE, "gpu": "gb200", "gpus_per_node": "4", "nvlink_domain": "72"})
    assert (nvl.gpus_per_node, nvl.nvlink_domain) == (4, 72)
    with pytest.raises(UserInputError, match="abacus"):
        cluster_from_row({**BASE, "gpu": "abacus"})
    h20 = cluster_from_row({**BASE, "gpu": "H20"})  # an accelerator preset without a cluster
    assert (h20.accelerator.name, h20.nvlink_domain) == ("h20", 8)


def test_plan_defaults_by_framework() -> None:
    nemo = plan_from_row(BASE)
    assert (nemo.sharding, nemo.sp, nemo.vpp, nemo.micro_batch, nemo.overlap_tp) == (
        "zero1", True, 1, 1, True,
    )  # fmt: skip
    titan = plan_from_row({**BASE, "framework": "torchtitan", "tp": "1", "dp": "16"})
    assert (titan.sharding, titan.recompute, titan.sp) == ("zero3", "selective", False)
    assert titan.overlap_param_gather
    deepspeed = plan_from_row({**BASE, "framework": "DeepSpeed ZeRO-3", "tp": "1", "dp": "16"})
    assert (deepspeed.sharding, deepspeed.overlap_param_gather) == ("zero3", False)
    assert (deepspeed.gather_unit, deepspeed.attention) == ("matrix", "unfused")


def test_maxtext_offloaded_remat_policy_reads_as_selective_with_offload() -> None:
    """MaxText's remat_policy "minimal_offloaded" keeps the weight-matmul outputs, as
    "minimal" does, but in host memory: selective recompute with `offload_activations`."""
    maxtext = {**BASE, "framework": "MaxText (TPU, JAX/XLA)", "gpu": "tpu-v5e", "tp": "16",
               "dp": "16", "n_gpus": "256", "nvlink_domain": "256"}  # fmt: skip
    offloaded = plan_from_row({**maxtext, "recompute": "minimal_offloaded"})
    minimal = plan_from_row({**maxtext, "recompute": "minimal"})
    assert (offloaded.recompute, offloaded.offload_activations) == ("selective", True)
    assert (minimal.recompute, minimal.offload_activations) == ("selective", False)
    assert not plan_from_row({**maxtext, "recompute": "full"}).offload_activations


def test_run_from_row_blank_recompute_and_gpu_check() -> None:
    run = run_from_row({**BASE, "model": "Llama 70B", "n_layers": "80", "hidden": "8192",
                        "n_heads": "64", "ffn": "28672", "tp": "1", "dp": "16",
                        "sharding": "zero3"})  # fmt: skip
    assert run.plan.recompute == "none"  # the DGX Cloud NeMo recipes: no recompute unless stated
    with pytest.raises(UserInputError, match="GPU count"):
        run_from_row({**BASE, "n_gpus": "32"})


def test_summaries() -> None:
    s = summarize([0.1, 0.2, 0.3, 0.4])
    assert (s.n, s.median_ape, s.mean_ape) == (4, pytest.approx(0.25), pytest.approx(0.25))
    assert s.p90_ape == pytest.approx(0.37)
    assert summarize([]).n == 0


def test_evaluate_rows_reports_skips() -> None:
    results = evaluate_rows([BASE, {**BASE, "run_id": "2", "tp": "3"}])
    assert results[0].ape is not None and results[0].predicted is not None
    assert results[1].skipped is not None and "tp" in results[1].skipped
    overall, per_source = summarize_results(results)
    assert overall.n == 1 and set(per_source) == {"SX"}


def test_nelder_mead_finds_quadratic_minimum() -> None:
    target = np.array([1.0, -2.0, 0.5])
    x, value = nelder_mead(lambda z: float(np.sum((z - target) ** 2)), np.zeros(3), 1.0, 300)
    np.testing.assert_allclose(x, target, atol=1e-3)
    assert value < 1e-6


def test_calibration_vector_roundtrip_and_apply() -> None:
    cal = Calibration.start(["ampere", "hopper"])
    again = Calibration.from_values(cal.names(), cal.vector())
    assert again == cal
    cluster = cal.apply(cluster_from_row(BASE))
    eff = cluster.accelerator.efficiency
    assert eff.matmul_max == pytest.approx(cal.matmul_max["hopper"])
    # F_half is a time at bf16 peak: 989.4 TFLOP/s · matmul_half_us µs
    assert eff.matmul_half_gflop == pytest.approx(cal.matmul_half_us * 989.4e-3)
    assert cluster.intra.efficiency == pytest.approx(cal.nvlink_efficiency)
    assert cluster.inter.efficiency == pytest.approx(cal.nic_efficiency)
    assert eff.speed_cv == pytest.approx(cal.speed_cv) and cal.speed_cv > 0


def test_predictions_batch_runs_sharing_a_model_and_cluster_exactly() -> None:
    """The fit's predictions run every (model, cluster) group as one vectorized estimate; each
    row must equal its own one-by-one estimate (fp8, another plan, another GPU, a single)."""
    rows = [
        BASE,
        {**BASE, "run_id": "2", "precision": "fp8"},
        {**BASE, "run_id": "3", "tp": "1", "dp": "16", "recompute": "full"},
        {**BASE, "run_id": "4", "gpu": "a100-80gb"},
        {**BASE, "run_id": "5", "n_layers": "16", "n_gpus": "32", "dp": "16"},
    ]
    runs = [run_from_row(r) for r in rows]
    cal = Calibration.start(["ampere", "hopper"])
    one_by_one = [predict_run(r, cal.apply(r.cluster)).tokens_per_s_per_gpu for r in runs]
    np.testing.assert_allclose(predictions(runs, cal), one_by_one, rtol=1e-12)
    np.testing.assert_allclose(predictions(runs), [predict_run(r).tokens_per_s_per_gpu
                                                   for r in runs], rtol=1e-12)  # fmt: skip


def test_unfitted_family_takes_mean_of_fitted_families_not_a_scaled_hopper() -> None:
    cal = Calibration.start(["ampere", "hopper", "hopper-500w"])
    b200 = cal.apply(cluster_from_row({**BASE, "gpu": "b200"})).accelerator.efficiency
    mean = (cal.matmul_max["ampere"] + cal.matmul_max["hopper"]) / 2  # power cap excluded
    assert b200.matmul_max == pytest.approx(mean)
    assert cal.prior_matmul_max == pytest.approx(mean)


def test_leave_one_source_out_never_fits_on_the_held_out_source() -> None:
    runs = [run_from_row({**BASE, "run_id": str(i), "source_id": s}) for i, s in
            enumerate(["A", "B"])]  # fmt: skip
    folds = leave_one_source_out(runs, iterations=2)
    assert [f.source_id for f in folds] == ["A", "B"]
    assert all(len(f.rows) == 1 and f.rows[0].source_id == f.source_id for f in folds)
    assert all(f.rows[0].ape is not None for f in folds)


def test_source_weights_equal_per_source() -> None:
    runs = [run_from_row({**BASE, "run_id": str(i), "source_id": s}) for i, s in
            enumerate(["A", "A", "A", "B"])]  # fmt: skip
    w = source_weights(runs)
    assert w.sum() == pytest.approx(1.0)
    assert w[3] == pytest.approx(0.5) and w[0] == pytest.approx(1 / 6)


def test_shipped_presets_meet_accuracy_targets_on_calibration_runs() -> None:
    path = shared_path("calibration", "runs.csv")
    if path is None:
        pytest.skip(missing_shared_reason("calibration", "runs.csv"))
    results = evaluate_rows(read_rows(path))
    assert all(r.skipped is None for r in results)
    overall, per_source = summarize_results(results)
    assert overall.median_ape <= 0.10
    assert overall.p90_ape <= 0.25
    assert all(s.median_ape <= 0.20 for s in per_source.values())


def test_relaxed_schedule_rules_still_predict() -> None:
    row = {**BASE, "tp": "1", "pp": "3", "dp": "4", "n_gpus": "12", "vpp": "2",
           "global_batch": "10", "framework": "torchtitan"}  # fmt: skip
    run = run_from_row(row)  # 32 layers over 3x2 chunks, 10 sequences over dp 4, m % pp != 0
    assert set(run.relaxed) == {
        "uneven pipeline stages",
        "global batch not a whole number of micro-batches",
        "interleaving with micro-batches not divisible by pp",
    }
    assert evaluate_rows([row])[0].predicted is not None
    with pytest.raises(UserInputError, match="cp"):
        run_from_row({**row, "cp": "3", "n_gpus": "36", "seq_len": "8192"})


def test_llm_foundry_rows_keep_fp32_weights_unless_the_row_says_otherwise() -> None:
    """Composer's FSDP mixed_precision DEFAULT (llm-foundry) keeps fp32 weights under autocast;
    an optional `param_dtype` column overrides it, and a bad value names the field."""
    foundry = {**BASE, "framework": "llm-foundry", "tp": "1", "dp": "16"}
    assert run_from_row(foundry).plan.param_dtype == "fp32"
    assert run_from_row({**foundry, "param_dtype": "BF16"}).plan.param_dtype == "bf16"
    assert run_from_row(BASE).plan.param_dtype == "bf16"
    with pytest.raises(UserInputError, match="param_dtype"):
        run_from_row({**foundry, "param_dtype": "fp64"})


def test_power_capped_variant_without_runs_follows_its_parent_at_the_capped_clock() -> None:
    cal = Calibration.start(["ampere", "hopper"])
    capped = cal.apply(cluster_from_row({**BASE, "gpu": "h100-sxm-96gb-500w"}))
    expected = cal.matmul_max["hopper"] * (500 / 700) ** (1 / 3)
    assert capped.accelerator.efficiency.matmul_max == pytest.approx(expected)


def test_deepseek_v3_public_figure_within_20_percent() -> None:
    """2,048 H800, 180K GPU-hours per trillion tokens (1,543 tokens/s/GPU), with its published
    plan: PP16 (DualPipe), EP64 over 8 nodes, ZeRO-1, FP8, no TP (benchmarks/holdout_runs.csv)."""
    from pathlib import Path

    holdout = Path(__file__).resolve().parents[2] / "benchmarks" / "holdout_runs.csv"
    row = next(r for r in read_rows(holdout) if r["model"] == "DeepSeek-V3")
    run = run_from_row(row)
    assert (run.plan.pp, run.plan.ep, run.plan.tp, run.plan.precision) == (16, 64, 1, "fp8")
    assert (run.plan.ep_dispatch, run.plan.ep_dedup, run.plan.overlap_ep) == ("fp8", True, True)
    result = evaluate_rows([row])[0]
    assert result.ape is not None and result.ape <= 0.20
    # MLA up-projections recomputed (§3.2.3): the latents kept instead of Q, K, V, so the
    # published plan fits the 80 GiB H800 (90.7 GB with Q, K, V kept)
    assert run.model.mla is not None and run.model.mla.latent_dim == 1536 + 512 + 64
    assert run.plan.recompute_qkv and run.plan.recompute_norm and run.plan.recompute_act
    est = predict_run(run)
    assert est.fits and est.memory_bytes < 80 * 2**30


@pytest.mark.parametrize(("dp", "in_flight"), [(64, 141), (128, 128)])
def test_llama3_405b_meta_plan_is_expressible_and_fits(dp: int, in_flight: int) -> None:
    """Meta's 405B plan (Llama 3 paper Table 4, 8,192 and 16,384 GPUs): TP8 with SP, PP16 over
    126 layers with one fewer on the first and last stages (whose end chunks hold only the
    embedding and the head), v = 8 one-layer chunks, DP 64 or 128, 2,048 sequences of 8K, no
    activation checkpointing. The fullest stage is rank 1 (8 layers): 2·14 + 7·16 + 1 = 141
    one-layer chunk-micro-batches at m = 32, all 8·16 = 128 at m = 16, each 2 B per token of
    4h/tp (norm and GEMM inputs, SP), (2q + 2kv)/tp (Q, K, V, attention output) and 2F/tp
    (SwiGLU inputs; its output recomputed), plus 8 layers of bf16 weights, ZeRO-2 gradients
    and optimizer over dp (allocated); the device total adds the allocator's fragmentation,
    the CUDA context and the NCCL buffers."""
    from shardmeter.estimate.step import estimate_step
    from shardmeter.specs.loader import load_cluster, load_model
    from shardmeter.specs.plan import Plan

    model = load_model("llama-3.1-405b")
    plan = Plan(
        framework="meta-llama3", tp=8, pp=16, vpp=8, dp=dp, pp_first=7, pp_last=7,
        micro_batch=1, global_batch=2048,
    )  # fmt: skip
    assert plan.sp and plan.pp_end_chunks and plan.recompute_act and plan.recompute == "none"
    est = estimate_step(model, load_cluster("dgx-h100"), plan)
    h, q, kv, f, tp = 16384, 16384, 1024, 53248, 8
    per_layer_mb = 2 * 8192 * (4 * h + 2 * q + 2 * kv + 2 * f) / tp
    layer_params = (h * (q + 2 * kv) + q * h + 3 * h * f) / tp
    states = 8 * layer_params * (2 + (2 + 12) / dp)
    assert est.memory_allocated_bytes == pytest.approx(in_flight * per_layer_mb + states, rel=1e-6)
    d = est.memory_detail
    extra = d["fragmentation"] + d["cuda_context"] + d["nccl_buffers"]
    assert est.memory_bytes == pytest.approx(est.memory_allocated_bytes + extra, rel=1e-9)
    assert est.fits and est.n_gpus == 8 * 16 * dp


@pytest.mark.parametrize(
    ("read", "what"), [(read_rows, "calibration CSV"), (read_memory_rows, "memory CSV")]
)
def test_both_csv_readers_refuse_bad_files_in_one_line(
    tmp_path: Path, read: Callable[[Path], object], what: str
) -> None:
    """The calibration and memory readers share one reader: a missing file, a folder, a file
    that is not UTF-8 and a missing column are each a one-line error naming the file."""
    with pytest.raises(UserInputError, match=f"an existing {what} file"):
        read(tmp_path / "absent.csv")
    with pytest.raises(UserInputError, match="a directory"):
        read(tmp_path)
    latin = tmp_path / "latin.csv"
    latin.write_bytes(b"run_id\n\xe9\xff\n")
    with pytest.raises(UserInputError, match="not a UTF-8 CSV"):
        read(latin)
    short = tmp_path / "short.csv"
    short.write_text("run_id\nx\n", encoding="utf-8")
    with pytest.raises(UserInputError, match="missing columns"):
        read(short)


def test_predict_cli_offload_activations(capsys: pytest.CaptureFixture[str]) -> None:
    """`--offload-activations` moves the kept activations to host memory: the chip holds
    less, the host the rest, and the step pays for the transfers."""
    import json

    from shardmeter.cli import main

    args = ["predict", "--model", "llama-2-70b", "--cluster", "tpu-v5e-pod", "--gpus", "256",
            "--tp", "16", "--micro-batch", "16", "--recompute", "selective", "--framework",
            "maxtext", "--seq-len", "2048", "--json"]  # fmt: skip
    assert main(args) == 0
    plain = json.loads(capsys.readouterr().out)
    assert main([*args, "--offload-activations"]) == 0
    offloaded = json.loads(capsys.readouterr().out)
    assert offloaded["plan"]["offload_activations"] is True
    assert offloaded["memory_bytes"] < plain["memory_bytes"]
    assert offloaded["memory_detail_bytes"]["host"] > plain["memory_detail_bytes"]["host"] == 0
    assert offloaded["time_breakdown_s"]["recompute"] > plain["time_breakdown_s"]["recompute"]
