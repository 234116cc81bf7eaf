"""`shardmeter fit`: every listed layout fits, one step past the reported limits does not."""

from __future__ import annotations

import json

import pytest

from shardmeter.cli import main
from shardmeter.estimate.step import estimate_step
from shardmeter.fit import (
    SEQ_STEP,
    _with_micro_batch,
    fit_layouts,
    largest_micro_batch,
    largest_seq_len,
    what_would_fit,
)
from shardmeter.predict import cluster_for_gpu
from shardmeter.specs.loader import load_model
from shardmeter.specs.model import TransformerSpec


def test_every_listed_layout_fits_and_they_are_ranked() -> None:
    model, cluster = load_model("llama-3.1-70b"), cluster_for_gpu("h100-sxm")
    options = fit_layouts(model, cluster, 64)
    assert options
    rates = [o.estimate.tokens_per_s_per_gpu for o in options]
    assert rates == sorted(rates, reverse=True)
    for o in options[:20]:
        again = estimate_step(model, cluster, o.plan, check_layers=False)
        assert again.fits and again.memory_total_bytes <= again.hbm_bytes
        assert o.plan.n_gpus == 64


def test_largest_micro_batch_is_the_limit() -> None:
    model, cluster = load_model("llama-3.1-8b"), cluster_for_gpu("h100-sxm")
    plan = fit_layouts(model, cluster, 8)[0].plan
    best = largest_micro_batch(model, cluster, plan)
    assert best >= 1
    assert estimate_step(model, cluster, _with_micro_batch(plan, best)).fits
    assert not estimate_step(model, cluster, _with_micro_batch(plan, best + 1)).fits


def test_largest_seq_len_is_the_limit() -> None:
    model, cluster = load_model("llama-3.1-8b"), cluster_for_gpu("h100-sxm")
    plan = fit_layouts(model, cluster, 8)[0].plan
    seq = largest_seq_len(model, cluster, plan)
    assert seq % SEQ_STEP == 0 and seq >= SEQ_STEP

    def fits(tokens: int) -> bool:
        m = model.model_copy(update={"seq_len": tokens})
        return estimate_step(m, cluster, plan, check_layers=False).fits

    assert fits(seq) and not fits(seq + SEQ_STEP)


def test_nothing_fits_names_what_would() -> None:
    model, cluster = load_model("llama-3.1-8b"), cluster_for_gpu("rtx-4090")
    assert fit_layouts(model, cluster, 1) == []
    found = what_would_fit(model, cluster, 1)
    assert found
    for s in found:
        again = estimate_step(model, cluster, s.option.plan, check_layers=False)
        assert again.fits
    assert any(s.change.startswith("gpus=") for s in found)


def test_fit_cli_json(capsys: pytest.CaptureFixture[str]) -> None:
    code = main(["fit", "--model", "llama-3.1-8b", "--gpu", "a100-80gb", "--gpus", "8", "--json"])
    doc = json.loads(capsys.readouterr().out)
    assert code == 0 and doc["options"] and doc["best"]["largest_micro_batch"] >= 1
    code = main(["fit", "--model", "llama-3.1-8b", "--gpu", "rtx-4090", "--gpus", "1"])
    out = capsys.readouterr().out
    assert code == 1 and "Nothing fits" in out and "would fit with" in out


def test_zero_offload_is_suggested_where_optimizer_offload_is_not_enough() -> None:
    """DeepSpeed's 10B GPT-2 on one 32 GB V100 (ZeRO-Offload tutorial): optimizer offload
    alone keeps 2 B of gradients per parameter on the GPU and does not fit; moving the
    gradients to the host too (grads+optimizer) does."""
    gpt2_10b = TransformerSpec(
        n_layers=50, hidden=4096, n_heads=32, ffn=16384, vocab=50304, seq_len=1024,
        tied_embeddings=True, norm="layernorm",
    )  # fmt: skip
    cluster = cluster_for_gpu("v100-32gb")
    changes = [s.change for s in what_would_fit(gpt2_10b, cluster, 1)]
    assert "offload=grads+optimizer" in changes and "offload=optimizer" not in changes
