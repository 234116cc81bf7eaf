"""Every config key has an effect.

A table sets each key of ``heloco simulate --print-config`` (every key docs/heloco.md
documents is one of them) to a non-default value on a tiny run and checks that its effect
shows: the run's trajectory (losses, tokens, time, updates, final parameters) differs from
the same run without it, or, for keys that by design leave the trajectory alone, what they
do is observed directly (files written, the thread count, the batched engine in use). A key
added to the config without a row here fails ``test_every_key_has_a_row``.
"""

from __future__ import annotations

import hashlib
import json
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import pytest
import torch

from heloco.config import load_config
from heloco.metrics import EvalPoint
from heloco.sim import SimConfig, build_run, run_simulation
from heloco.sim.run import round_sources
from shardmeter.errors import _dotted_keys

# The smallest run that still exercises every part: 3 workers (one slow), 12 outer updates.
BASE: dict[str, Any] = {
    "workers": 3,
    "paces": [1.0, 1.0, 2.0],
    "inner_steps": 2,
    "token_budget": 1536,
    "eval_every": 768,
    "eval_windows": 2,
    "eval_batch_size": 4,
    "data.synthetic_chars_per_language": 4000,
    "data.val_chars_per_language": 1000,
    "data.seq_len": 32,
    "inner.seq_len": 32,
    "inner.batch_size": 2,
    "inner.total_steps": 20,
    "inner.warmup_steps": 2,
}

Probe = Callable[[SimConfig, Path], Any]


def trajectory(cfg: SimConfig, tmp: Path) -> Any:
    """What a run did: evaluations, totals, staleness and a hash of the final parameters."""
    r = run_simulation(cfg)
    digest = hashlib.sha256()
    for name in sorted(r.params):
        digest.update(r.params[name].detach().to(torch.float32).contiguous().numpy().tobytes())
    s = r.summary
    evals = [(e.tokens, round(e.time, 9), e.loss) for e in r.evals]
    return (evals, s.tokens, s.time, s.updates, s.staleness_mean, digest.hexdigest())


def files_written(cfg: SimConfig, tmp: Path) -> Any:
    run_simulation(cfg)
    return sorted(p.name for p in tmp.rglob("*") if p.is_file())


def threads_during_run(cfg: SimConfig, tmp: Path) -> Any:
    seen: list[int] = []

    def progress(point: EvalPoint) -> None:
        seen.append(torch.get_num_threads())

    run_simulation(cfg, progress)
    return sorted(set(seen))


def batched_engine(cfg: SimConfig, tmp: Path) -> Any:
    """Whether the run's rounds go to the batched engine (losses are equal by design)."""
    return [type(s).__name__ for s in round_sources([build_run(cfg)])]


def eval_batches(cfg: SimConfig, tmp: Path) -> Any:
    """The batch sizes of one validation pass (the loss is the same whatever they are)."""
    parts = build_run(cfg)
    sizes: list[int] = []
    hook = parts.model.register_forward_hook(lambda m, args, out: sizes.append(len(args[0])))
    parts.evaluate({k: v.detach().clone() for k, v in parts.model.named_parameters()})
    hook.remove()
    return sorted(set(sizes))


def optimizer_kind(cfg: SimConfig, tmp: Path) -> Any:
    """The inner AdamW's kernel choice (fused and foreach give the same math)."""
    parts = build_run(cfg)
    opt = parts.worker(0).optimizer
    return (opt.defaults.get("fused"), opt.defaults.get("foreach"))


@dataclass(frozen=True)
class Row:
    """One key: the value to set, the overrides that make the key matter, the probe."""

    key: str
    value: Any
    context: dict[str, Any] = field(default_factory=dict)
    probe: Probe = trajectory


WORDS = {
    "de": "der die das und ist nicht ein zu ",
    "en": "the and of to is in that it ",
    "fr": "le la les et est un une des ",
}


def corpus(tmp: Path) -> str:
    """A small text folder in the `--data-dir` layout, one file per language."""
    folder = tmp / "corpus"
    folder.mkdir(exist_ok=True)
    for lang, text in WORDS.items():
        (folder / f"{lang}.txt").write_text((text * 400).strip(), encoding="utf-8")
    return str(folder)


def jsonl_corpus(tmp: Path) -> str:
    """The same languages as JSONL records with two text fields, ``text`` and ``body``."""
    folder = tmp / "jsonl"
    folder.mkdir(exist_ok=True)
    for lang, text in WORDS.items():
        records = [{"text": text * 4, "body": text[::-1] * 4} for _ in range(100)]
        (folder / f"{lang}.jsonl").write_text("\n".join(map(json.dumps, records)))
    return str(folder)


HELOCO = {"method": "heloco"}
DN = {"method": "dn"}
AB = {"method": "heloco+ab"}
DYLU = {"method": "dn-dylu", "paces": [1.0, 2.0, 5.0], "inner_steps": 10, "token_budget": 3072}
BPE = {"data.tokenizer": "bpe", "data.bpe_vocab_size": 300}
LOGNORMAL = {"paces": {"median": 1.0, "sigma": 0.5}}

ROWS: list[Row] = [
    Row("method", "mla"),
    Row("workers", 4, {"paces": None}),
    Row("paces", [1.0, 3.0, 2.0]),
    Row("paces.median", 2.0, LOGNORMAL),
    Row("paces.sigma", 1.5, LOGNORMAL),
    Row("pace_jitter", 0.5),
    Row("comm_delays", [0.0, 0.0, 3.0]),
    Row("link_mbit", [1.0, 1.0, 0.5]),
    Row("link_latency", [0.0, 0.0, 2.0], {"link_mbit": [100.0] * 3}),
    Row("server_link_mbit", 1.0, {"link_mbit": [100.0] * 3}),
    Row("exchange", "overlapped"),
    Row("overlap_eager", 0.0, {"exchange": "overlapped"}),
    Row("fragments", 4, {"exchange": "streaming", "inner_steps": 4}),
    Row("stream_alpha", 0.0, {"exchange": "streaming"}),
    Row("inner_steps", 3),
    Row("payload", "topk:fraction=0.05"),
    Row("codec", "int8"),
    Row("quorum", 3, {"method": "decoupled"}),
    Row("failures", [{"worker": 2, "at": 1.0, "down": 2.0}]),
    Row("outer.lr", 0.3),
    Row("outer.momentum", 0.5),
    Row("outer.rho", "delay"),
    Row("outer.rho_order", "after"),
    Row("outer.correction.c_ok", 0.9),
    Row("outer.correction.k_s", 0.1),
    Row("outer.correction.beta_max", 0.05),
    Row("outer.correction.k_d", 3.0),
    Row("outer.correction.kappa", 0.5),
    Row("outer.correction.c_bad", 0.1),
    Row("outer.correction.eps", 1.0),
    Row("outer.correction.lambda_form", "published"),
    Row("outer.correction.scope", "model"),
    Row("outer.correction.shrink_when_negative", False),
    Row("outer.dn_period", 2, DN),
    Row("outer.dn_c", 0.3, DN),
    Row("outer.ab_shares", "paces", AB),
    Row("outer.ab_prior", 0.05, AB),
    Row("outer.ab_max_weight", 1.0, AB),
    Row("outer.ab_power", 0.5, AB),
    Row("outer.ab_normalize", "mean", AB),
    Row("outer.ab_data", "workers", AB | {"data.assignment": "dirichlet"}),
    Row("dylu", True),
    Row("dylu_reference", "quantile", DYLU | {"dylu_quantile": 0.2}),  # 0.9 of 3: the max
    Row("dylu_quantile", 0.2, DYLU | {"dylu_reference": "quantile"}),
    Row("grace_window", 1.5),
    Row("data.data_dir", "CORPUS"),
    Row("data.tokenizer", "bpe", {"data.bpe_vocab_size": 300}),
    Row("data.bpe_vocab_size", 280, BPE),
    Row("data.cache_dir", "TMP/bpe-cache", BPE, files_written),
    Row("data.assignment", "iid"),
    Row("data.dirichlet_alpha", 5.0, {"data.assignment": "dirichlet"}),
    Row("data.val_chars_per_language", 1500),
    Row("data.train_fraction", 0.5),
    Row("data.seq_len", 48, {"inner.seq_len": 32}),
    Row("data.synthetic_chars_per_language", 6000),
    Row("data.sampling", "stream", {"data.data_dir": "JSONL"}),
    Row("data.text_field", "body", {"data.data_dir": "JSONL"}),
    Row("data.sources", "SOURCES"),
    Row("model", "small"),
    Row("inner.lr", 3e-3),
    Row("inner.weight_decay", 0.5),
    Row("inner.betas", [0.5, 0.9]),
    Row("inner.eps", 1e-3),
    Row("inner.warmup_steps", 0),
    Row("inner.min_lr", 1e-3),
    Row("inner.total_steps", 5),
    Row("inner.batch_size", 3),
    Row("inner.seq_len", 16),
    Row("inner.grad_clip", 0.01),
    Row("inner.reset_each_round", False),
    Row("inner.fused", False, {}, optimizer_kind),
    Row("inner_schedule", "budget"),
    Row("token_budget", 2304),
    Row("time_budget", 3.0),
    Row("eval_every", 512),
    Row("eval_unit", "steps", {"eval_every": 4}),
    Row("eval_batch_size", 1, {}, eval_batches),
    Row("eval_windows", 1),
    Row("seed", 7),
    Row("out_dir", "TMP/run", {}, files_written),
    Row("threads", 2, {}, threads_during_run),
    Row("batch", "off", {}, batched_engine),
]

# Keys with no second value to try, or only a device this machine may lack; each is
# exercised elsewhere.
NOT_SET: dict[str, str] = {
    "paces.kind": "one allowed value (lognormal)",
    "device": "needs a CUDA device; the error without one is test_cli_simulate's",
}
TABLES = {"outer", "outer.correction", "data", "inner"}  # tables, not keys of their own


def test_every_key_has_a_row() -> None:
    leaves = set(_dotted_keys(SimConfig)) - TABLES
    covered = {row.key for row in ROWS} | set(NOT_SET)
    assert leaves - covered == set(), "config keys without an effect test"
    assert covered - leaves == set(), "rows for keys the config does not have"


def resolve(value: Any, tmp: Path) -> Any:
    if value == "CORPUS":
        return corpus(tmp)
    if value == "JSONL":
        return jsonl_corpus(tmp)
    if value == "SOURCES":
        return {lang: [str(Path(corpus(tmp)) / f"{lang}.txt")] for lang in WORDS}
    if isinstance(value, str) and value.startswith("TMP/"):
        return str(tmp / value.removeprefix("TMP/"))
    return value


def config(tmp: Path, *layers: dict[str, Any]) -> SimConfig:
    values: dict[str, Any] = {}
    for layer in (BASE, *layers):
        values.update({k: resolve(v, tmp) for k, v in layer.items()})
    return load_config(overrides=values)


_BASELINES: dict[str, Any] = {}  # a run without the key, shared by rows of one context


def baseline(row: Row, folder: Path) -> Any:
    """``row.probe`` on the run without the key (computed once per context and probe where
    the probe writes nothing)."""
    key = f"{row.probe.__name__}:{sorted(row.context.items())!r}"
    if row.probe is not trajectory or key not in _BASELINES:
        _BASELINES[key] = row.probe(config(folder, row.context), folder)
    return _BASELINES[key]


@pytest.mark.slow
@pytest.mark.parametrize("row", ROWS, ids=lambda r: r.key)
def test_key_has_an_effect(row: Row, tmp_path: Path) -> None:
    before_dir, after_dir = tmp_path / "before", tmp_path / "after"
    before_dir.mkdir()
    after_dir.mkdir()
    changed = config(after_dir, row.context, {row.key: row.value})
    assert changed != config(before_dir, row.context), f"{row.key} = {row.value!r}: same config"
    assert row.probe(changed, after_dir) != baseline(row, before_dir), (
        f"{row.key} = {row.value!r} changed nothing the run does"
    )
