"""The predict API and the `shardmeter predict` / `validate` command lines."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from shardmeter.cli import main
from shardmeter.errors import UserInputError
from shardmeter.predict import default_plan, predict, prepare
from shardmeter.specs.plan import Plan

CSV_HEADER = (
    "run_id,source_id,model,n_layers,hidden,n_heads,n_kv_heads,head_dim,ffn,vocab,seq_len,mlp,"
    "moe_experts,moe_topk,moe_shared_experts,gpu,n_gpus,gpus_per_node,nvlink_domain,"
    "inter_node_gbps_per_gpu,tp,pp,dp,cp,ep,vpp,sp,sharding,shard_degree,micro_batch,"
    "global_batch,recompute,precision,framework,tokens_per_sec_per_gpu,notes\n"
)


def test_default_prediction_is_the_readme_job() -> None:
    est = predict()
    assert est.n_gpus == 8
    assert est.fits
    assert 0.2 < est.mfu < 0.9
    assert est.tokens_per_s_per_gpu > 1000


def test_predict_accepts_names_and_mappings() -> None:
    plan = {"tp": 4, "pp": 2, "dp": 2, "sp": True, "global_batch": 16, "sharding": "zero1"}
    est = predict("llama-3.1-70b", "dgx-h100", plan, n_gpus=16)
    assert est.n_gpus == 16
    with pytest.raises(UserInputError, match="must equal the GPU count"):
        predict("llama-3.1-70b", "dgx-h100", plan, n_gpus=8)
    with pytest.raises(UserInputError):
        predict("no-such-model")
    with pytest.raises(UserInputError):
        predict(plan={"tp": 0})


def test_default_plan_fills_dp_and_batch() -> None:
    plan = default_plan(64, tp=4, pp=2)
    assert (plan.dp, plan.global_batch, plan.sharding) == (8, 64, "zero1")
    assert default_plan(8).sharding == "zero3"
    with pytest.raises(UserInputError):
        default_plan(6, tp=4)


def test_auto_recompute_picks_lightest_that_fits() -> None:
    tight = prepare("llama-3.1-70b", "dgx-h100", Plan(dp=8, sharding="zero3", global_batch=8),
                    recompute_auto=True)  # fmt: skip
    assert tight.plan.recompute in ("selective", "full")
    roomy = prepare("llama-3.1-8b", "dgx-h100", Plan(dp=8, sharding="zero3", global_batch=8),
                    recompute_auto=True)  # fmt: skip
    assert roomy.plan.recompute == "none"


def test_cli_predict_default_and_json(capsys: pytest.CaptureFixture[str]) -> None:
    assert main(["predict"]) == 0
    out = capsys.readouterr().out
    assert "tokens/s per GPU" in out and "memory per GPU" in out
    assert main(["predict", "--gpus", "16", "--tp", "2", "--json"]) == 0
    doc = json.loads(capsys.readouterr().out)
    assert doc["schema"] == "shardmeter.predict/1"
    assert doc["plan"]["dp"] == 8 and doc["n_gpus"] == 16
    assert doc["step_time_s"] == pytest.approx(sum(doc["time_breakdown_s"].values()))


def test_cli_predict_bad_input_is_one_line(capsys: pytest.CaptureFixture[str]) -> None:
    assert main(["predict", "--tp", "3"]) == 2
    err = capsys.readouterr().err
    assert err.count("\n") == 1 and "tp" in err


def test_cli_predict_plan_file_and_gpu(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    plan = tmp_path / "plan.toml"
    plan.write_text('dp = 4\ntp = 2\nglobal_batch = 8\nsharding = "zero1"\n')
    assert main(["predict", "--plan", str(plan), "--gpu", "a100-80gb", "--precision", "bf16",
                 "--json"]) == 0  # fmt: skip
    doc = json.loads(capsys.readouterr().out)
    assert doc["cluster"]["accelerator"] == "a100-80gb"
    assert doc["plan"]["tp"] == 2


def _write_csv(path: Path) -> None:
    rows = [
        "1,SX,Llama 3.1 8B,32,4096,32,8,128,14336,128256,8192,swiglu,,,,h100-sxm,8,8,8,400,"
        "1,1,8,1,1,1,no,zero3,,1,8,selective,bf16,torchtitan,7000,",
        "2,SX,Llama 3.1 70B,80,8192,64,8,128,28672,128256,8192,swiglu,,,,h100-sxm,64,8,8,400,"
        "4,4,4,1,1,5,yes,,,1,64,,bf16,NeMo 24.09,1100,",
        "3,SY,bad,32,4096,32,8,128,14336,128256,8192,swiglu,,,,h100-sxm,8,8,8,400,"
        "3,1,8,1,1,1,no,zero3,,1,8,none,bf16,torchtitan,7000,",
        "4,SY,Mixtral,32,4096,32,8,128,14336,32000,4096,swiglu,8,2,,h100-sxm,16,8,8,,"
        "1,1,16,1,8,1,no,zero3,,1,16,full,bf16,megatron-core,4000,",
    ]
    path.write_text(CSV_HEADER + "\n".join(rows) + "\n")


def test_cli_validate_json_schema(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    runs = tmp_path / "runs.csv"
    _write_csv(runs)
    assert main(["validate", str(runs), "--json"]) == 0
    doc = json.loads(capsys.readouterr().out)
    assert [r["run_id"] for r in doc["rows"]] == ["1", "2", "4"]
    for row in doc["rows"]:
        assert set(row) == {
            "run_id", "predicted_tokens_per_sec_per_gpu", "measured_tokens_per_sec_per_gpu", "ape",
        }  # fmt: skip
        expected = abs(
            row["predicted_tokens_per_sec_per_gpu"] / row["measured_tokens_per_sec_per_gpu"] - 1
        )
        assert row["ape"] == pytest.approx(expected)
    assert set(doc["summary"]) == {"median_ape", "mean_ape", "p90_ape", "n"}
    assert doc["summary"]["n"] == 3
    assert doc["skipped"][0]["run_id"] == "3" and "tp" in doc["skipped"][0]["reason"]
    assert set(doc["per_source"]) == {"SX", "SY"}


def test_cli_validate_table(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    runs = tmp_path / "runs.csv"
    _write_csv(runs)
    assert main(["validate", str(runs)]) == 0
    out = capsys.readouterr().out
    assert "median" in out and "skipped run 3" in out


def test_cli_validate_missing_columns(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    bad = tmp_path / "bad.csv"
    bad.write_text("run_id,model\n1,x\n")
    assert main(["validate", str(bad)]) == 2
    assert "missing columns" in capsys.readouterr().err


@pytest.mark.parametrize("content", [None, b"\xff\xfe\x00run_id"])
def test_cli_validate_unreadable_file_is_one_line(
    content: bytes | None, tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    path = tmp_path / "runs.csv"
    if content is None:
        path.mkdir()
    else:
        path.write_bytes(content)
    assert main(["validate", str(path)]) == 2
    err = capsys.readouterr().err.strip()
    assert err.startswith("shardmeter: error: csv: got ") and "\n" not in err


def _reject_constant(name: str) -> None:
    raise AssertionError(f"{name} is not JSON")


def test_cli_validate_json_is_strict_when_no_row_predicts(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    runs = tmp_path / "runs.csv"
    _write_csv(runs)
    assert main(["validate", str(runs), "--json", "--source", "nobody"]) == 0
    doc = json.loads(capsys.readouterr().out, parse_constant=_reject_constant)
    assert doc["summary"] == {"median_ape": None, "mean_ape": None, "p90_ape": None, "n": 0}
