"""The arrival-balancing variants benchmark's table (benchmarks/heloco_ab_variants.py)."""

from __future__ import annotations

from collections.abc import Callable
from types import ModuleType

import pytest

from heloco.config import load_config
from heloco.experiments import CellResult


@pytest.fixture(scope="module")
def bench(load_benchmark: Callable[[str], ModuleType]) -> ModuleType:
    return load_benchmark("heloco_ab_variants")


def _row(method: str, seed: int, loss: float) -> CellResult:
    return CellResult(
        "converged", [1, 15], "language", method, seed, 1, 1.0, 1.0, loss, loss, loss, loss, 5.0,
        {}, {}, 1, 1.0, 1, [1.0], {}, [0.0], [0], {}, 0.0,
    )  # fmt: skip


def test_table_reads_improvements_against_heloco_and_sync(bench: ModuleType) -> None:
    # heloco 4.0 and 5.0 (seeds 0, 1); sync 5.0; the default +ab 3.0 and 4.5:
    # vs heloco (4 − 3)/4 = 25%, (5 − 4.5)/5 = 10% → 17.5 ± 10.6%; vs sync 40%, 10%.
    results = {
        "sync": [_row("sync", 0, 5.0), _row("sync", 1, 5.0)],
        bench.REFERENCE: [_row("heloco", 0, 4.0), _row("heloco", 1, 5.0)],
        "+ab clip (default)": [_row("heloco+ab", 0, 3.0), _row("heloco+ab", 1, 4.5)],
    }
    lines = bench.table(results, "loss_at_time")
    row = next(line for line in lines if line.startswith("| +ab clip (default)"))
    assert "3.7500 (H 17.5 ± 10.6%) (S 25.0 ± 21.2%)" in row
    assert next(x for x in lines if x.startswith("| +ab max")).endswith("| - |")
    sync = next(x for x in lines if x.startswith("| sync"))
    assert "(S" not in sync and "(H -12.5 ± 17.7%)" in sync


def test_variants_are_valid_configs(bench: ModuleType) -> None:
    for v in bench.VARIANTS:
        cfg = load_config(preset="converged", overrides={"method": v.method, **v.overrides})
        assert cfg.method == v.method
    slugs = {v.slug for v in bench.VARIANTS}
    assert len(slugs) == len(bench.VARIANTS) and all(x.isascii() for x in slugs)
    assert "heloco-eta-0-35" in slugs
