"""Sweeps and knees (shardmeter.analysis)."""

from __future__ import annotations

from pathlib import Path

import pytest

from shardmeter.analysis import (
    SweepPoint,
    diminishing_returns_knee,
    plot_sweep,
    sweep,
)
from shardmeter.errors import UserInputError
from shardmeter.specs.topology import load_topology


def point(gpus: float, tps: float, bound: bool = True) -> SweepPoint:
    return SweepPoint(
        value=gpus,
        n_gpus=int(gpus),
        tokens_per_s=tps,
        tokens_per_s_per_gpu=tps / gpus,
        utilization=0.95 if bound else 0.5,
        wall_s=1e12 / tps,
        cost_usd=1.0,
        usd_per_mtok=1.0,
        compute_bound=bound,
        regime="compute-bound" if bound else "communication-bound (WAN a↔b)",
    )


def test_diminishing_returns_knee_is_first_marginal_below_half() -> None:
    # first GPU: 1000 tok/s; marginals: 2→ 900, 4→ 800, 8→ 450 (< 500): knee at 8
    pts = [point(1, 1000), point(2, 1900), point(4, 3500), point(8, 5300), point(16, 6000)]
    knee = diminishing_returns_knee(pts)
    assert knee.value == 8
    assert "from 8 GPUs per island" in knee.text and "450 tokens/s per added GPU" in knee.text


def test_no_knee_when_scaling_stays_linear() -> None:
    knee = diminishing_returns_knee([point(g, 1000 * g) for g in (1, 2, 4, 8)])
    assert knee.value is None and knee.text.startswith("No knee up to 8")


def test_island_size_sweep_finds_the_knee_of_sync_dp_over_the_wan() -> None:
    """Sync DP pays a fixed WAN all-reduce per step: growing the island shrinks compute only,
    so per-GPU gains fall off."""
    res = sweep(load_topology("two-clouds"), "island_size", [8, 16, 32, 64, 128], mode="sync")
    tps = [p.tokens_per_s for p in res.points]
    assert tps == sorted(tps)
    per_gpu = [p.tokens_per_s_per_gpu for p in res.points]
    assert per_gpu == sorted(per_gpu, reverse=True)
    knee = res.knees[0]
    assert knee.kind == "diminishing returns" and knee.value is not None
    assert 8 < knee.value <= 128


def test_bandwidth_sweep_flip_brackets_the_exact_threshold() -> None:
    res = sweep(load_topology("two-clouds"), "bandwidth", [0.25, 0.5, 1, 2, 4, 8])
    flip = res.knees[0]
    assert flip.kind == "regime flip" and flip.value is not None
    exact = float(flip.text.split("The exact threshold is ")[1].split(" Gbit/s")[0])
    assert flip.value == pytest.approx(exact, rel=1e-2)
    between = (
        [p.value for p in res.points if not p.compute_bound][-1],
        next(p.value for p in res.points if p.compute_bound),
    )
    assert between[0] < exact <= between[1]
    utils = [p.utilization for p in res.points]
    assert utils == sorted(utils)


def test_h_sweep_and_island_count_sweep() -> None:
    topo = load_topology("four-regions")
    res = sweep(topo, "inner_steps", [1, 5, 20, 100, 1000])
    bound = [p.compute_bound for p in res.points]
    assert bound == sorted(bound) and not bound[0] and bound[-1]
    assert "exact threshold is H = " in res.knees[0].text
    count = sweep(topo, "islands")
    assert [p.n_gpus for p in count.points] == [16, 32, 48, 64]


def test_unfit_island_sizes_are_skipped_with_the_reason() -> None:
    res = sweep(load_topology("two-clouds"), "island_size", [1, 8])
    assert [p.value for p in res.points] == [8]
    assert res.skipped and "no FSDP/HSDP plan fits" in res.skipped[0]


@pytest.mark.parametrize(
    ("knob", "value", "reason"),
    [
        ("islands", 0, "a positive whole number"),
        ("islands", 3, "at most the 2 islands"),
        ("inner_steps", 1.5, "a positive whole number"),
        ("batch", 0, "a positive whole number"),
        ("bandwidth", -5, "a positive bandwidth"),
        ("bandwidth", float("nan"), "a positive bandwidth"),
    ],
)
def test_nonsense_sweep_values_are_skipped_with_the_reason(
    knob: str, value: float, reason: str
) -> None:
    res = sweep(load_topology("two-clouds"), knob, [value])
    assert not res.points
    assert len(res.skipped) == 1 and f"{knob}: got " in res.skipped[0]
    assert reason in res.skipped[0]


def test_unknown_knob() -> None:
    with pytest.raises(UserInputError, match=r"^sweep: got 'colour'"):
        sweep(load_topology("two-clouds"), "colour")


def test_plots_are_written_as_small_png_and_svg(tmp_path: Path) -> None:
    res = sweep(load_topology("two-clouds"), "inner_steps", [1, 10, 100])
    paths = plot_sweep(res, tmp_path)
    assert sorted(p.suffix for p in paths) == [".png", ".svg"]
    png = paths[0].read_bytes()
    assert png[:8] == b"\x89PNG\r\n\x1a\n" and len(png) < 150_000
    assert paths[1].read_text().lstrip().startswith("<?xml")
    assert not [p for p in tmp_path.iterdir() if p.name.startswith(".")]
