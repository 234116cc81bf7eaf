"""`benchmarks/cv_residuals.py --features`: the signed held-out error per plan-feature bucket."""

from __future__ import annotations

from collections.abc import Callable
from pathlib import Path
from types import ModuleType

import pytest

from shardmeter.calibrate import SHARED_PARAMETERS

COLUMNS = (
    "run_id,source_id,framework,model,gpu,n_gpus,params_b,seq_len,tp,pp,vpp,cp,dp,ep,experts,"
    "sharding,recompute,precision,micro_batch,measured,predicted,signed_error,global_batch,"
    "n_layers,attention"
)


@pytest.fixture(scope="module")
def bench(load_benchmark: Callable[[str], ModuleType]) -> ModuleType:
    return load_benchmark("cv_residuals")


def test_feature_buckets_give_the_signed_median_per_bucket(
    bench: ModuleType, tmp_path: Path
) -> None:
    """Two GPT-3-like rows at pp 8 / v 12 (one layer per chunk) predicted +10% and +20%, two
    pp 1 rows at -4% and -6%: the pp, vpp and layers-per-chunk features split them with
    signed medians +15% and -5%; every line fits 80 columns; a file without the newer columns
    (global batch, layers, attention) leaves those features out."""
    rows = [
        "1,S5,NeMo 24.11,g,h100-sxm,128,175,2048,4,8,12,1,4,1,0,zero1,none,bf16,1,1,1.1,0.10,256,96,flash",
        "2,S5,NeMo 24.11,g,h100-sxm,256,175,2048,4,8,12,1,8,1,0,zero1,none,bf16,1,1,1.2,0.20,512,96,flash",
        "3,S5,NeMo 24.09,l,h100-sxm,8,8,8192,1,1,1,2,4,1,0,zero1,none,bf16,1,1,0.96,-0.04,128,32,cudnn",
        "4,S5,NeMo 24.09,l,h100-sxm,16,8,8192,1,1,1,2,8,1,0,zero1,none,bf16,1,1,0.94,-0.06,256,32,cudnn",
    ]  # fmt: skip
    path = tmp_path / "cv.csv"
    path.write_text("\n".join([COLUMNS, *rows]) + "\n")
    lines = bench.feature_table(bench.read(path))
    assert all(len(line) <= 80 for line in lines)
    by_feature: dict[str, list[str]] = {}
    feature = ""
    for line in lines[1:]:
        feature = line[:22].strip() or feature
        by_feature.setdefault(feature, []).append(line[23:])
    pp = {cells.split()[0]: cells.split()[2] for cells in by_feature["pp"]}
    assert pp == {"<=1": "-5.0%", "5-8": "+15.0%"}
    chunks = {cells.split()[0]: cells.split()[2] for cells in by_feature["layers/chunk"]}
    assert chunks == {"<=1": "+15.0%", ">16": "-5.0%"}
    assert {c.split()[0] for c in by_feature["attention kernel"]} == {"cudnn", "flash"}
    old = tmp_path / "old.csv"
    old.write_text(
        "\n".join([",".join(COLUMNS.split(",")[:-3]), *(",".join(r.split(",")[:-3]) for r in rows)])
    )
    names = {line[:22].strip() for line in bench.feature_table(bench.read(old))}
    assert "layers/chunk" not in names and "attention kernel" not in names and "pp" in names


def test_cv_folds_can_start_from_a_saved_fit_printout(
    load_benchmark: Callable[[str], ModuleType], tmp_path: Path
) -> None:
    """`calibration.py --cv-start-from` reads the parameter lines of a `--fit` printout back
    into a Calibration (the all-data fit the folds start from); any other file is an error
    naming the option."""
    cal = load_benchmark("calibration")
    fit = tmp_path / "fit.txt"
    fit.write_text(
        "fitted on 220 runs (source-weighted mean |log error| 0.0549):\n"
        "  matmul_max.hopper        0.7713   [0.2, 0.98]\n"
        + "".join(
            f"  {b.name:<24} {b.start:.4f}   [{b.low}, {b.high}]\n" for b in SHARED_PARAMETERS
        )
        + "  prior matmul_max (families without runs) 0.7664\n"
    )
    start = cal.read_fit(fit)
    assert start.matmul_max == {"hopper": 0.7713}
    ratio = next(b.start for b in SHARED_PARAMETERS if b.name == "attention_ratio")
    assert start.attention_ratio == pytest.approx(ratio, abs=1e-4)
    (tmp_path / "no.txt").write_text("nothing here\n")
    with pytest.raises(cal.UserInputError, match="cv-start-from"):
        cal.read_fit(tmp_path / "no.txt")
