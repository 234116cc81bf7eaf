"""Corrections of published runs' plan cells from each run's own published configuration."""

from __future__ import annotations

from collections.abc import Callable
from pathlib import Path

import pytest

from shardmeter.calibrate import apply_corrections, read_corrections, read_rows, run_from_row
from shardmeter.errors import UserInputError
from shardmeter.paths import missing_shared_reason, shared_path
from shardmeter.specs.plan import Plan

CORRECTIONS = Path(__file__).resolve().parents[2] / "benchmarks" / "runs_corrections.csv"
HEADER = "source_id,run_ids,column,value,document,quote\n"


def test_corrections_apply_to_matching_source_and_ids_only(tmp_path: Path) -> None:
    path = tmp_path / "c.csv"
    path.write_text(HEADER + 'S5,99-101;7,attention,flash,"doc","NVTE_FUSED_ATTN=0"\n')
    (fix,) = read_corrections(path)
    assert fix.run_ids == frozenset({"99", "100", "101", "7"})
    rows = [
        {"source_id": "S5", "run_id": "100", "attention": ""},
        {"source_id": "S1", "run_id": "100"},
        {"source_id": "S5", "run_id": "102"},
    ]
    out, changed = apply_corrections(rows, [fix])
    assert changed == 1
    assert out[0]["attention"] == "flash" and "attention" not in out[1] | out[2]
    assert rows[0]["attention"] == ""  # the input rows are not modified


@pytest.mark.parametrize(
    ("line", "field"),
    [
        ('S5,9-3,recompute,full,"doc","quote"', "run_ids"),
        ('S5,a-b,recompute,full,"doc","quote"', "run_ids"),
        ("S5,9,recompute,full,doc,", "quote"),
    ],
)
def test_bad_corrections_name_the_field(tmp_path: Path, line: str, field: str) -> None:
    path = tmp_path / "c.csv"
    path.write_text(HEADER + line + "\n")
    with pytest.raises(UserInputError) as err:
        read_corrections(path)
    assert err.value.field == field


def test_shipped_corrections_set_the_published_recipes() -> None:
    """The DGX Cloud benchmarking recipes (v25.01) run GPT-3 175B and Nemotron-4 340B with
    FlashAttention-2 (NVTE_FUSED_ATTN=0), Nemotron-4 340B with selective recompute, and
    MaxText Llama 2 70B with every dot saved but the MLP up projection and cuDNN attention."""
    path = shared_path("calibration", "runs.csv")
    if path is None:
        pytest.skip(missing_shared_reason("calibration", "runs.csv"))
    fixes = read_corrections(CORRECTIONS)
    assert all(f.quote and f.document for f in fixes)
    rows, changed = apply_corrections(read_rows(path), fixes)
    assert changed > 0
    plans = {r["run_id"]: run_from_row(r).plan for r in rows if r["source_id"] == "S5"}
    assert plans["99"].attention == "flash" and plans["99"].recompute == "none"
    assert plans["109"].attention == "flash" and plans["109"].recompute == "selective"
    assert plans["119"].attention == "cudnn"  # Nemotron-4 15B: NVTE_FUSED_ATTN=1
    assert plans["89"].attention == "cudnn"  # Llama 3.1: NVTE_FUSED_ATTN=1
    maxtext = plans["141"]
    assert maxtext.recompute == "selective" and maxtext.recompute_mlp_up
    assert maxtext.attention == "cudnn"


def test_torchtitan_rows_carry_their_published_compile_async_tp_and_pipeline(
    corrected_plans: Callable[[str], dict[str, Plan]],
) -> None:
    """benchmarks/runs_corrections.csv sets what torchtitan's benchmark pages state for S7:
    torch.compile (fused element-wise ops) on the "FSDP + torch.compile" rows 164 and 171 and
    on the asyncTP page's bfloat16 runs 181 and 187; async TP on "2D + AsyncTP" (174) and on
    the 405B 3D and 4D tables (176, 178-180); the 405B interleaved run's torchtitan defaults
    (2 stages per rank, 16 micro-batches of 2); the compiled loss of the 2025 asyncTP runs.
    The eager FSDP rows 163 and 170 keep torchtitan's defaults."""
    plans = corrected_plans("S7")
    for rid in ("164", "171", "181", "187"):
        assert plans[rid].fused_elementwise, rid
    for rid in ("163", "170"):
        assert not plans[rid].fused_elementwise, rid
    for rid in ("174", "176", "178", "179", "180"):
        assert plans[rid].tp_async, rid
    assert not plans["173"].tp_async
    assert (plans["176"].vpp, plans["176"].micro_batch) == (2, 2)
    assert {k for k, p in plans.items() if p.ce_upcast == "compiled"} == {
        str(i) for i in range(181, 193) if str(i) in plans
    }
