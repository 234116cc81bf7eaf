"""Predictions against published measured runs (calibration CSV schema) and the error table.

A CSV row becomes a TransformerSpec (architecture columns), a Cluster (the accelerator preset
named by `gpu` on its reference cluster, with the row's node shape and NIC speed) and a Plan
(parallel columns). Blank cells take the documented defaults of the row's framework
(`shardmeter.specs.framework`); a framework name that is not on that list is an error.
"""

from __future__ import annotations

import csv
import math
import re
from collections.abc import Callable, Iterable, Mapping, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import TYPE_CHECKING, Any

import numpy as np

from shardmeter.errors import UserInputError
from shardmeter.estimate.plan_arrays import PlanArrays
from shardmeter.estimate.result import StepEstimate
from shardmeter.estimate.step import estimate_step_arrays, view
from shardmeter.predict import cluster_for_gpu
from shardmeter.specs.framework import framework_id
from shardmeter.specs.hardware import Accelerator, Cluster, Efficiency
from shardmeter.specs.hf import gqa_equivalent, mla_attention_params
from shardmeter.specs.loader import load_cluster
from shardmeter.specs.model import MLASpec, MoESpec, TransformerSpec
from shardmeter.specs.plan import Plan, validate_plan
from shardmeter.specs.rules import RELAXABLE, PlanRuleError
from shardmeter.specs.validation import MAX_EXACT_INT, validate_spec

if TYPE_CHECKING:  # memcheck builds on this module
    from shardmeter.memcheck import MemoryResult

REQUIRED_COLUMNS: tuple[str, ...] = (
    "run_id",
    "n_layers",
    "hidden",
    "n_heads",
    "ffn",
    "vocab",
    "seq_len",
    "gpu",
    "n_gpus",
    "tp",
    "pp",
    "dp",
    "global_batch",
    "tokens_per_sec_per_gpu",
)


@dataclass(frozen=True)
class RunSpec:
    """One measured run as ShardMeter inputs."""

    run_id: str
    source_id: str
    framework: str
    model: TransformerSpec
    cluster: Cluster
    plan: Plan
    measured: float  # tokens/s per GPU
    relaxed: tuple[str, ...]  # schedule checks the source's framework does not need (see
    # `validate_relaxed`): the estimate then uses the fullest stage / whole micro-batches


@dataclass(frozen=True)
class RowResult:
    """Prediction for one row, or why it could not be predicted."""

    run_id: str
    source_id: str
    measured: float | None
    predicted: float | None = None
    ape: float | None = None  # |predicted − measured| / measured
    skipped: str | None = None
    run: RunSpec | None = field(default=None, compare=False, repr=False)
    estimate: StepEstimate | None = field(default=None, compare=False, repr=False)


@dataclass(frozen=True)
class ErrorSummary:
    """Absolute percentage error statistics (fractions, not percent)."""

    n: int
    median_ape: float
    mean_ape: float
    p90_ape: float

    def as_json(self) -> dict[str, float | int]:
        """The summary as the `validate --json` documents write it."""
        return {
            "median_ape": self.median_ape,
            "mean_ape": self.mean_ape,
            "p90_ape": self.p90_ape,
            "n": self.n,
        }


def skipped_json(results: Iterable[RowResult | MemoryResult]) -> list[dict[str, str]]:
    """The rows left out (throughput or memory rows), with why, as the `validate --json`
    documents write them."""
    return [
        {"run_id": r.run_id, "source_id": r.source_id, "reason": r.skipped}
        for r in results
        if r.skipped is not None
    ]


def _cell(row: Mapping[str, str], name: str) -> str:
    return (row.get(name) or "").strip()


def _int(row: Mapping[str, str], name: str, default: int | None = None) -> int:
    value = _optional_int(row, name)
    if value is None:
        if default is None:
            raise UserInputError(name, "", "a value is required")
        return default
    return value


def _optional_int(row: Mapping[str, str], name: str) -> int | None:
    """A whole number cell (``8`` or ``8.0``), None if blank; NaN, inf and 2.5 are errors."""
    value = _float(row, name)
    if value is None:
        return None
    if value != int(value) or abs(value) > MAX_EXACT_INT:
        raise UserInputError(name, _cell(row, name), "must be an integer of at most 2**53")
    return int(value)


def _float(row: Mapping[str, str], name: str) -> float | None:
    """A finite number cell, None if blank (``nan``, ``inf`` and words are errors)."""
    text = _cell(row, name)
    if not text:
        return None
    try:
        value = float(text)
    except ValueError:
        raise UserInputError(name, text, "must be a number") from None
    if not math.isfinite(value):
        raise UserInputError(name, text, "must be a finite number")
    return value


def _yes_no(row: Mapping[str, str], name: str) -> bool | None:
    """A yes/no cell (also true/false, 1/0), None if blank; anything else is an error."""
    text = _cell(row, name).lower()
    if not text:
        return None
    if text not in YES_NO:
        raise UserInputError(name, _cell(row, name), "yes or no (or true/false, 1/0)")
    return YES_NO[text]


YES_NO: dict[str, bool] = {
    "yes": True,
    "true": True,
    "1": True,
    "no": False,
    "false": False,
    "0": False,
}


_DENSE_LAYERS = re.compile(r"(?:first\s+)?(\d+)\s+(?:leading\s+)?dense(?:\s+\w+)?\s+layers?", re.I)
_DENSE_LAYERS_ALT = re.compile(r"dense\s+layers?\s*(?:=|:)?\s*(\d+)\b(?!\d)", re.I)
_DENSE_FFN = re.compile(r"dense[^;,.]*?(\d{4,6})", re.I)


def _dense_layers(notes: str, model_name: str) -> tuple[int, int | None]:
    """(leading dense layers, their FFN width) of an MoE model, read from the notes column.

    DeepSeek-V3's report (arXiv:2412.19437, §4.2) has 3 leading dense layers of width 18432;
    that is used when the notes do not state the split.
    """
    ffn_match = _DENSE_FFN.search(notes)
    dense_ffn = int(ffn_match.group(1)) if ffn_match else None
    for pattern in (_DENSE_LAYERS, _DENSE_LAYERS_ALT):
        match = pattern.search(notes)
        if match and int(match.group(1)) < 1000:
            return int(match.group(1)), dense_ffn
    if _is_deepseek_v3(model_name):
        return 3, dense_ffn or 18432
    return 0, dense_ffn


def _is_deepseek_v3(model_name: str) -> bool:
    return "deepseek-v3" in model_name.lower().replace(" ", "-")


def _mla_as_gqa(hidden: int, n_heads: int) -> dict[str, Any]:
    """DeepSeek-V3's multi-head latent attention (q_lora 1536, kv_lora 512, qk 128 + 64 rope,
    v 128; arXiv:2412.19437 §2.1) as the GQA shape with the same weight count, as the
    Hugging Face import does: exact projection FLOPs, approximate score FLOPs; the latent
    shapes kept for the activations of the up-projection recompute."""
    mla = MLASpec(
        q_lora_rank=1536, kv_lora_rank=512, qk_nope_head_dim=128, qk_rope_head_dim=64,
        v_head_dim=128,
    )  # fmt: skip
    attn = mla_attention_params(
        hidden, n_heads, mla.q_lora_rank, mla.kv_lora_rank, mla.qk_nope_head_dim,
        mla.qk_rope_head_dim, mla.v_head_dim,
    )  # fmt: skip
    head_dim, kv_heads = gqa_equivalent(hidden, n_heads, attn)
    return {"head_dim": head_dim, "n_kv_heads": kv_heads, "mla": mla}


def model_from_row(row: Mapping[str, str]) -> TransformerSpec:
    """TransformerSpec from the architecture columns; embeddings tied when that matches
    `params_b_arch` better (MPT ties its embeddings)."""
    mlp_cell = _cell(row, "mlp").lower() or "gelu"
    mlp = MLP_ALIASES.get(mlp_cell, mlp_cell)
    if mlp not in ("gelu", "swiglu", "relu2"):
        raise UserInputError(
            "mlp",
            mlp_cell,
            "allowed: gelu (2-matrix), swiglu (3-matrix gated), relu2 (squared ReLU)",
        )
    moe = None
    experts = _cell(row, "moe_experts")
    if experts:
        dense_layers, dense_ffn = _dense_layers(_cell(row, "notes"), _cell(row, "model"))
        groups = (8, 4) if _is_deepseek_v3(_cell(row, "model")) else (None, None)
        moe_fields = {
            "experts": _int(row, "moe_experts"),
            "top_k": _int(row, "moe_topk", 1),
            "shared_experts": _int(row, "moe_shared_experts", 0),
            "dense_layers": dense_layers,
            "dense_ffn": dense_ffn,
            "n_groups": groups[0],  # DeepSeek-V3 config.json n_group / topk_group
            "topk_groups": groups[1],
        }
        moe = validate_spec(MoESpec, moe_fields, "moe")  # one line naming the bad cell
    kwargs = {
        "name": _cell(row, "model") or "custom",
        "n_layers": _int(row, "n_layers"),
        "hidden": _int(row, "hidden"),
        "n_heads": _int(row, "n_heads"),
        "n_kv_heads": _int(row, "n_kv_heads", _int(row, "n_heads")),
        "head_dim": _optional_int(row, "head_dim"),
        "ffn": _int(row, "ffn"),
        "mlp": mlp,
        "vocab": _int(row, "vocab"),
        "seq_len": _int(row, "seq_len"),
        "moe": moe,
    }
    if _is_deepseek_v3(_cell(row, "model")):
        kwargs.update(_mla_as_gqa(_int(row, "hidden"), _int(row, "n_heads")))
    try:
        untied = TransformerSpec(**kwargs)
    except ValueError as exc:
        raise UserInputError("model", kwargs["name"], str(exc).splitlines()[-1]) from None
    arch = _float(row, "params_b_arch")
    if arch and moe is None:
        tied = untied.model_copy(update={"tied_embeddings": True})
        if abs(tied.params_total / 1e9 - arch) < abs(untied.params_total / 1e9 - arch):
            return tied
    return untied


def cluster_from_row(row: Mapping[str, str]) -> Cluster:
    """Reference cluster of the row's `gpu`, with its node shape and per-GPU NIC speed."""
    base = cluster_for_gpu(_cell(row, "gpu").lower())
    overrides: dict[str, object] = {}
    gpn = _int(row, "gpus_per_node", 0)
    domain = _int(row, "nvlink_domain", 0)
    if gpn:
        overrides["gpus_per_node"] = gpn
    if domain:
        overrides["nvlink_domain"] = domain
    nic = _float(row, "inter_node_gbps_per_gpu")
    if nic:
        overrides["inter"] = {"bandwidth_gbps": nic / 8.0}  # Gbit/s -> GB/s
    return load_cluster(base, **overrides) if overrides else base


# Spellings seen in published tables, mapped onto the schema's values.
MLP_ALIASES: dict[str, str] = {
    "geglu": "swiglu", "glu": "swiglu", "relu": "gelu", "squared_relu": "relu2",
    "squared-relu": "relu2",
}  # fmt: skip
SHARDING_ALIASES: dict[str, str] = {
    "fsdp": "zero3", "fsdp2": "zero3", "hsdp": "zero3", "zero-3": "zero3", "zero-2": "zero2",
    "zero-1": "zero1", "distributed_optimizer": "zero1", "dist-opt": "zero1", "ddp": "none",
    "no": "none",
}  # fmt: skip
RECOMPUTE_ALIASES: dict[str, str] = {
    "sac": "selective", "op": "selective", "partial": "selective", "yes": "full",
    "block": "full", "no": "none", "off": "none", "minimal": "selective",
    "minimal_offloaded": "selective", "save_dot_except_mlpwi": "selective",
}  # fmt: skip
# MaxText remat policies that save every dot but the MLP up projection (`mlpwi`): selective
# recompute (the attention core and element-wise ops) plus the up GEMMs, `recompute_mlp_up`.
MLP_UP_REMAT: frozenset[str] = frozenset({"save_dot_except_mlpwi"})
# MaxText remat policies that offload what they keep to host memory (decoders.py,
# save_and_offload_only_these_names): the plan's `offload_activations`.
OFFLOADED_REMAT: frozenset[str] = frozenset({"minimal_offloaded"})


def _alias(row: Mapping[str, str], name: str, aliases: Mapping[str, str]) -> str:
    text = _cell(row, name).lower()
    return aliases.get(text, text)


def _precision(text: str) -> str:
    """bf16 / fp16 / fp8 from cells such as 'fp8-hybrid' or 'bf16-mixed' (blank: bf16)."""
    low = text.lower()
    for name in ("fp8", "fp16", "bf16"):
        if name in low:
            return name
    return low or "bf16"


def global_batch_from_row(row: Mapping[str, str]) -> int:
    """The global batch in sequences: stated, or derived from the measured throughput and
    iteration time (tokens/s/GPU × GPUs × seconds / sequence length) when the row gives
    both; otherwise UserInputError with the reason."""
    if _cell(row, "global_batch"):
        return _int(row, "global_batch")
    rate = _float(row, "tokens_per_sec_per_gpu")
    seconds = _float(row, "iteration_time_s")
    if rate is None or seconds is None:
        raise UserInputError(
            "global_batch", "", "blank and not derivable: give it, or iteration_time_s with "
            "tokens_per_sec_per_gpu",
        )  # fmt: skip
    sequences = rate * _int(row, "n_gpus") * seconds / _int(row, "seq_len")
    return max(round(sequences), 1)


def plan_from_row(row: Mapping[str, str]) -> Plan:
    """Plan from the parallel columns; blank cells take the row framework's defaults
    (`shardmeter.specs.framework`; vpp 1 unless the framework interleaves, micro-batch 1)."""
    framework = framework_id(_cell(row, "framework")) if _cell(row, "framework") else None
    tp = _int(row, "tp", 1)
    sp = _yes_no(row, "sp")
    shard_degree = _optional_int(row, "shard_degree")
    stated: dict[str, object] = {
        "dp": _int(row, "dp", 1),
        "tp": tp,
        "pp": _int(row, "pp", 1),
        "cp": _int(row, "cp", 1),
        "ep": _int(row, "ep", 1),
        "micro_batch": _int(row, "micro_batch", 1),
        "global_batch": global_batch_from_row(row),
        "precision": _precision(_cell(row, "precision")),
        "framework": framework,
    }
    if _cell(row, "vpp"):
        stated["vpp"] = _int(row, "vpp")
    if sp is not None:
        stated["sp"] = sp
    elif framework is None:
        stated["sp"] = tp > 1
    if _cell(row, "sharding"):
        stated["sharding"] = _alias(row, "sharding", SHARDING_ALIASES)
    if shard_degree is not None:
        stated["shard_degree"] = shard_degree
    if _cell(row, "recompute"):
        stated["recompute"] = _alias(row, "recompute", RECOMPUTE_ALIASES)
        if _cell(row, "recompute").lower() in OFFLOADED_REMAT:
            stated["offload_activations"] = True
        if _cell(row, "recompute").lower() in MLP_UP_REMAT:
            stated["recompute_mlp_up"] = True
    stated.update(_plan_extras(row))
    try:
        return Plan(**{k: v for k, v in stated.items() if v is not None})
    except ValueError as exc:
        errors = getattr(exc, "errors", None)
        detail = errors()[0] if callable(errors) else {"loc": ("plan",), "msg": str(exc)}
        loc = ".".join(str(x) for x in detail.get("loc", ("plan",))) or "plan"
        raise UserInputError(f"plan.{loc}", detail.get("input"), str(detail.get("msg"))) from None


# Optional plan columns (not in the shared schema): `pp_layers` as "7;8;...;7", `attention`,
# `ep_dispatch`, `param_dtype`, `fp8_scaling`, `ce_upcast`, `ep_imbalance`, and yes/no `ep_dedup`,
# `overlap_ep`, `graphs`, `fused_ce`, `compiled`, `fused_elementwise`, `tp_async`.
_BOOL_EXTRAS = (
    "ep_dedup", "overlap_ep", "graphs", "fused_ce", "compiled", "fused_elementwise", "tp_async",
)  # fmt: skip


def _plan_extras(row: Mapping[str, str]) -> dict[str, object]:
    extras: dict[str, object] = {}
    layers = _cell(row, "pp_layers")
    if layers:
        try:
            extras["pp_layers"] = tuple(int(x) for x in layers.split(";"))
        except ValueError:
            raise UserInputError("pp_layers", layers, "layer counts separated by ';'") from None
    for name in ("attention", "ep_dispatch", "param_dtype", "fp8_scaling", "ce_upcast"):
        if _cell(row, name):
            extras[name] = _cell(row, name).lower()
    if _cell(row, "ep_imbalance"):
        extras["ep_imbalance"] = _float(row, "ep_imbalance")
    for name in _BOOL_EXTRAS:
        flag = _yes_no(row, name)
        if flag is not None:
            extras[name] = flag
    return extras


def _relax_layers(plan: Plan, model: TransformerSpec) -> tuple[Plan, TransformerSpec]:
    chunks = plan.pp * plan.vpp
    return plan, model.model_copy(update={"n_layers": -(-model.n_layers // chunks) * chunks})


def _relax_interleave(plan: Plan, model: TransformerSpec) -> tuple[Plan, TransformerSpec]:
    return plan.model_copy(update={"vpp": 1}), model


def _relax_batch(plan: Plan, model: TransformerSpec) -> tuple[Plan, TransformerSpec]:
    per_step = plan.dp * plan.micro_batch
    whole = max(plan.global_batch // per_step, 1) * per_step
    return plan.model_copy(update={"global_batch": whole}), model


# How a calibration row relaxes each relaxable rule of `specs.rules.RULES` (by code), and the
# phrase the error table shows: the check the estimate then runs instead.
RELAXATIONS: dict[
    str, tuple[str, Callable[[Plan, TransformerSpec], tuple[Plan, TransformerSpec]]]
] = {
    "layers_per_chunk": ("uneven pipeline stages", _relax_layers),
    "interleave_micro_batches": (
        "interleaving with micro-batches not divisible by pp",
        _relax_interleave,
    ),
    "whole_micro_batches": ("global batch not a whole number of micro-batches", _relax_batch),
}


def validate_relaxed(plan: Plan, model: TransformerSpec, n_gpus: int) -> tuple[str, ...]:
    """`validate_plan`, except the rules marked relaxable in `specs.rules.RULES` (torchtitan
    splits layers unevenly; not every stack needs micro-batches divisible by pp when
    interleaving, or a global batch that is a whole number of micro-batches): each broken one
    is relaxed by its code (`RELAXATIONS`) and validation runs again. Returns the phrases of
    the rules relaxed; any other violation raises UserInputError."""
    relaxed: list[str] = []
    check_model, check_plan = model, plan
    for _ in range(len(RELAXATIONS) + 1):
        try:
            validate_plan(check_plan, check_model, n_gpus)
            return tuple(relaxed)
        except PlanRuleError as exc:
            if exc.code not in RELAXABLE or exc.code not in RELAXATIONS:
                raise
            phrase, relax = RELAXATIONS[exc.code]
            check_plan, check_model = relax(check_plan, check_model)
            relaxed.append(phrase)
    raise UserInputError("plan", plan, "violates the schedule rules")


def run_from_row(row: Mapping[str, str]) -> RunSpec:
    """All inputs of one CSV row; raises UserInputError naming what cannot be mapped."""
    model = model_from_row(row)
    cluster = cluster_from_row(row)
    plan = plan_from_row(row)
    relaxed = validate_relaxed(plan, model, _int(row, "n_gpus"))
    measured = _float(row, "tokens_per_sec_per_gpu")
    if measured is None or measured <= 0:
        raise UserInputError("tokens_per_sec_per_gpu", measured, "must be a positive number")
    return RunSpec(
        run_id=_cell(row, "run_id"),
        source_id=_cell(row, "source_id") or "?",
        framework=_cell(row, "framework"),
        model=model,
        cluster=cluster,
        plan=plan,
        measured=measured,
        relaxed=relaxed,
    )


CORRECTION_COLUMNS = ("source_id", "run_ids", "column", "value", "document", "quote")


@dataclass(frozen=True)
class Correction:
    """One cell of published runs set from the run's own published configuration: the rows
    of `source_id` whose run_id is in `run_ids` get `value` in `column`; `document` and
    `quote` say where the published source states it."""

    source_id: str
    run_ids: frozenset[str]
    column: str
    value: str
    document: str
    quote: str


def _run_ids(text: str) -> frozenset[str]:
    """'99-108;120' -> the ids 99..108 and 120 (inclusive ranges of integers, or single ids)."""
    ids: set[str] = set()
    for part in (p.strip() for p in text.split(";") if p.strip()):
        low, sep, high = part.partition("-")
        if sep and low.isdigit() and high.isdigit() and int(low) <= int(high):
            ids.update(str(i) for i in range(int(low), int(high) + 1))
        elif sep:
            raise UserInputError("run_ids", text, "ids or ranges LOW-HIGH separated by ';'")
        else:
            ids.add(part)
    if not ids:
        raise UserInputError("run_ids", text, "at least one run id")
    return frozenset(ids)


def read_corrections(path: str | Path) -> list[Correction]:
    """Corrections CSV (CORRECTION_COLUMNS); each needs its document and quote."""
    out: list[Correction] = []
    for row in read_csv_rows(path, CORRECTION_COLUMNS, "corrections CSV"):
        if not _cell(row, "document") or not _cell(row, "quote"):
            raise UserInputError("quote", _cell(row, "run_ids"), "a document and a quote per row")
        out.append(
            Correction(
                source_id=_cell(row, "source_id"),
                run_ids=_run_ids(_cell(row, "run_ids")),
                column=_cell(row, "column"),
                value=_cell(row, "value"),
                document=_cell(row, "document"),
                quote=_cell(row, "quote"),
            )
        )
    return out


def apply_corrections(
    rows: Sequence[Mapping[str, str]], corrections: Sequence[Correction]
) -> tuple[list[dict[str, str]], int]:
    """Copies of `rows` with every matching correction applied, and how many cells changed."""
    out: list[dict[str, str]] = []
    changed = 0
    for row in rows:
        new = dict(row)
        for c in corrections:
            if _cell(row, "source_id") == c.source_id and _cell(row, "run_id") in c.run_ids:
                changed += new.get(c.column, "") != c.value
                new[c.column] = c.value
        out.append(new)
    return out, changed


def read_rows(path: str | Path) -> list[dict[str, str]]:
    """Rows of a CSV in the calibration schema (see :func:`read_csv_rows`)."""
    return read_csv_rows(path, REQUIRED_COLUMNS, "calibration CSV")


def read_csv_rows(path: str | Path, columns: Sequence[str], what: str) -> list[dict[str, str]]:
    """Rows of a UTF-8 CSV file (``what`` names it in errors) that has every one of
    ``columns``; a missing file, a folder, a file that is not a UTF-8 CSV or a missing
    column is a one-line UserInputError."""
    try:
        with open(path, newline="", encoding="utf-8") as fh:
            reader = csv.DictReader(fh)
            missing = [c for c in columns if c not in (reader.fieldnames or [])]
            if missing:
                raise UserInputError("csv", str(path), f"missing columns: {', '.join(missing)}")
            return [dict(r) for r in reader]
    except FileNotFoundError:
        raise UserInputError("csv", str(path), f"an existing {what} file") from None
    except (IsADirectoryError, UnicodeDecodeError, csv.Error) as exc:
        reason = "a directory" if isinstance(exc, IsADirectoryError) else "not a UTF-8 CSV"
        raise UserInputError("csv", str(path), f"{reason}; want a CSV file") from None


def predict_run(run: RunSpec, cluster: Cluster | None = None) -> StepEstimate:
    """Estimate one run (optionally on a cluster with other efficiencies, for fitting); its
    plan was checked by `validate_relaxed` when the run was built."""
    island = cluster or run.cluster
    arrays = estimate_step_arrays(run.model, island, PlanArrays.scalar(run.plan))
    return view(arrays, 0, island, run.plan)


def evaluate_rows(rows: Iterable[Mapping[str, str]]) -> list[RowResult]:
    """Predicted vs measured tokens/s per GPU for every row; unmappable rows carry the reason."""
    results: list[RowResult] = []
    for row in rows:
        run_id = _cell(row, "run_id")
        source = _cell(row, "source_id") or "?"
        measured = None
        try:
            measured = _float(row, "tokens_per_sec_per_gpu") if run_id else None
            run = run_from_row(row)
            est = predict_run(run)
        except UserInputError as exc:
            results.append(RowResult(run_id, source, measured, skipped=str(exc)))
            continue
        pred = est.tokens_per_s_per_gpu
        results.append(
            RowResult(
                run_id, source, run.measured, pred, abs(pred / run.measured - 1.0), None, run, est
            )
        )
    return results


def summarize(apes: Sequence[float]) -> ErrorSummary:
    """Median, mean and 90th-percentile APE (numpy's linear percentile)."""
    if not apes:
        return ErrorSummary(0, float("nan"), float("nan"), float("nan"))
    arr = np.asarray(apes, dtype=np.float64)
    return ErrorSummary(
        n=len(arr),
        median_ape=float(np.median(arr)),
        mean_ape=float(np.mean(arr)),
        p90_ape=float(np.percentile(arr, 90)),
    )


def summarize_results(results: Sequence[RowResult]) -> tuple[ErrorSummary, dict[str, ErrorSummary]]:
    """Overall and per-source summaries over the predicted rows."""
    done = [r for r in results if r.ape is not None]
    overall = summarize([r.ape for r in done if r.ape is not None])
    per_source: dict[str, ErrorSummary] = {}
    for source in sorted({r.source_id for r in done}):
        per_source[source] = summarize(
            [r.ape for r in done if r.source_id == source and r.ape is not None]
        )
    return overall, per_source


# --- fitting ------------------------------------------------------------------------------------
# Accelerator preset -> family. A family shares one achieved fraction of dense matmul peak (same
# tensor-core generation and software stack era); H100 at 500 W is a power-capped variant.
FAMILIES: dict[str, str] = {
    "a100-40gb": "ampere",
    "a100-80gb": "ampere",
    "h100-sxm": "hopper",
    "h100-pcie": "hopper",
    "h200": "hopper",
    "h20": "hopper",
    "h800": "hopper",
    "h100-sxm-96gb-500w": "hopper-500w",
    "b200": "blackwell",
    "gb200": "blackwell",
    "gb300": "blackwell",
    "tpu-v4": "tpu",
    "tpu-v5p": "tpu",
    "tpu-v5e": "tpu",
    "mi250x": "cdna",
    "mi300x": "cdna",
    "mi325x": "cdna",
    "l40s": "ada",
}
# Families that do not enter the prior of unfitted families (a power cap is not a generation).
PRIOR_EXCLUDED: frozenset[str] = frozenset({"hopper-500w"})
# A power-capped variant without runs follows its parent family at the clock its power cap
# allows: dynamic power ∝ C·V²·f with V ∝ f under DVFS, so f ∝ P^(1/3) (NVIDIA's datasheet
# boost clocks follow it: H100 SXM 1830 MHz at 700 W, NVL 1545 MHz at 400 W). A GEMM loop held
# at the cap the whole time falls further (docs/model.md, "Power-capped H100").
POWER_CAPPED: dict[str, tuple[str, float]] = {"hopper-500w": ("hopper", 500.0 / 700.0)}
NVLINK_PREFIXES: tuple[str, ...] = ("nvlink",)
NIC_PREFIXES: tuple[str, ...] = ("ib-", "roce-", "cx8-")  # InfiniBand / RoCE rails


@dataclass(frozen=True)
class Bound:
    """A free parameter's name, bounds and starting value (the last fit's result)."""

    name: str
    low: float
    high: float
    start: float


# Bounds keep every parameter physically plausible: achieved NCCL bus bandwidth is 60-95% of
# nominal on NVSwitch and 70-95% on IB/RoCE rails; fused attention with the chip's native
# instructions (cuDNN, FlashAttention-3) reaches 40-100% of the GEMM efficiency, FlashAttention-2
# on Hopper `mma_sync_fraction` (0.62, measured) of that; FP8 GEMMs gain 1.2-2x; overlapped
# communication takes at most a fifth of the SMs (Calculon: 0.15 NVLink, 0.02 IB). The GEMM
# size at half efficiency is a time at peak (launch, wave quantisation and tail), so faster
# chips need proportionally bigger GEMMs: F_half = matmul_half_us · peak_bf16.
FAMILY_BOUND: tuple[float, float] = (0.2, 0.98)
# Starts are the last fit's values (fitted on runs.csv + holdout H1-H11, 2026-12-04); cdna
# and ada have no runs, so their starts are never used: they take
# `Calibration.prior_matmul_max`.
FAMILY_START: dict[str, float] = {
    "ampere": 0.7992,
    "hopper": 0.7547,
    "hopper-500w": 0.6146,
    "blackwell": 0.6975,
    "tpu": 0.7737,
    "cdna": 0.6,
    "ada": 0.6,
}
SHARED_PARAMETERS: tuple[Bound, ...] = (
    Bound("matmul_half_us", 0.5, 50.0, 28.7403),
    Bound("attention_ratio", 0.4, 1.0, 0.4860),
    Bound("memory", 0.6, 0.95, 0.7544),
    Bound("fp8_speedup", 1.2, 2.0, 1.6503),
    Bound("nvlink_efficiency", 0.6, 0.95, 0.6076),
    Bound("nic_efficiency", 0.7, 0.95, 0.9477),
    Bound("overlap_slowdown", 0.0, 0.2, 0.2000),
    # Host time per kernel launch: a CUDA launch is 2-5 µs, an eager PyTorch op with its
    # Python dispatch 5-30 µs (measured dispatch overheads of eager frameworks). It also prices
    # each host hand-off of a TPU's DCN send or receive (docs/model.md, Communication).
    Bound("kernel_launch_us", 1.0, 30.0, 15.3656),
    # GPU-to-GPU speed spread (sd/mean): 0 (identical chips) to 5% (Sinha et al. SC'22 measure
    # a few percent of clock and throughput variation across the GPUs of production clusters).
    Bound("speed_cv", 0.0, 0.05, 0.0061),
)


def families_of(runs: Sequence[RunSpec]) -> list[str]:
    """Accelerator families with at least one run (only these get a fitted matmul_max)."""
    return sorted({FAMILIES[r.cluster.accelerator.name] for r in runs
                   if r.cluster.accelerator.name in FAMILIES})  # fmt: skip


def free_parameters(families: Sequence[str]) -> tuple[Bound, ...]:
    """matmul_max of each family with data, and the shared parameters."""
    fam = tuple(Bound(f"matmul_max.{f}", *FAMILY_BOUND, FAMILY_START[f]) for f in families)
    return fam + SHARED_PARAMETERS


@dataclass(frozen=True)
class Calibration:
    """Fitted physical parameters: matmul efficiency per accelerator family with data, shared
    kernel and link efficiencies. Families without data take `prior_matmul_max`."""

    matmul_max: dict[str, float]  # family -> asymptotic fraction of dense peak
    matmul_half_us: float  # GEMM size at half of matmul_max, as seconds·1e-6 at bf16 peak
    attention_ratio: float  # native fused-attention efficiency / matmul efficiency
    memory: float  # achieved fraction of HBM bandwidth
    fp8_speedup: float  # FP8 over BF16 GEMM time
    nvlink_efficiency: float  # achieved / nominal NVLink bus bandwidth
    nic_efficiency: float  # achieved / nominal IB or RoCE bandwidth per GPU
    overlap_slowdown: float  # compute lost while communication overlaps
    kernel_launch_us: float  # host µs per kernel launch
    speed_cv: float  # GPU-to-GPU speed spread (sd/mean); the step waits for the slowest GPU

    @classmethod
    def from_values(cls, names: Sequence[str], values: Sequence[float]) -> Calibration:
        named = dict(zip(names, values, strict=True))
        families = {k.split(".", 1)[1]: v for k, v in named.items() if k.startswith("matmul_max.")}
        shared = {b.name: named[b.name] for b in SHARED_PARAMETERS}
        return cls(matmul_max=families, **shared)

    @classmethod
    def start(cls, families: Sequence[str]) -> Calibration:
        """The last fit's values (the Bound starts) for these families."""
        bounds = free_parameters(families)
        return cls.from_values([b.name for b in bounds], [b.start for b in bounds])

    def vector(self) -> list[float]:
        fam = [self.matmul_max[f] for f in sorted(self.matmul_max)]
        shared = [float(getattr(self, b.name)) for b in SHARED_PARAMETERS]
        return fam + shared

    def names(self) -> list[str]:
        fam = [f"matmul_max.{f}" for f in sorted(self.matmul_max)]
        return fam + [b.name for b in SHARED_PARAMETERS]

    @property
    def prior_matmul_max(self) -> float:
        """Prior for a family without runs: the mean achieved/peak of the fitted families
        (never one family's value scaled by another's software losses)."""
        vals = [v for f, v in self.matmul_max.items() if f not in PRIOR_EXCLUDED]
        return float(np.mean(vals)) if vals else FAMILY_START["hopper"]

    def family_matmul_max(self, family: str) -> float:
        """Fitted value; else a power-capped variant's parent at its cap; else the prior."""
        if family in self.matmul_max:
            return self.matmul_max[family]
        parent, power_ratio = POWER_CAPPED.get(family, ("", 1.0))
        if parent in self.matmul_max:
            return self.matmul_max[parent] * power_ratio ** (1.0 / 3.0)
        return self.prior_matmul_max

    def efficiency(self, acc: Accelerator) -> Efficiency:
        """The accelerator's [efficiency] under this calibration (its family's matmul_max or
        the prior; F_half from the bf16 peak; fp8_speedup only where FP8 tensor cores exist)."""
        eta = self.family_matmul_max(FAMILIES.get(acc.name, ""))
        update: dict[str, float] = {
            "matmul_max": eta,
            "matmul_half_gflop": self.matmul_half_us * acc.peak("bf16") * 1e-3,
            "attention": min(1.0, eta * self.attention_ratio),
            "memory": self.memory,
            "kernel_launch_us": self.kernel_launch_us,
            "speed_cv": self.speed_cv,
        }
        if "fp8" in acc.peak_tflops:
            update["fp8_speedup"] = self.fp8_speedup
        return acc.efficiency.model_copy(update=update)

    def apply(self, cluster: Cluster) -> Cluster:
        """The cluster with these efficiencies (links other than NVLink and IB/RoCE keep theirs)."""
        acc = cluster.accelerator
        update: dict[str, object] = {
            "overlap_slowdown": self.overlap_slowdown,
            "accelerator": acc.model_copy(update={"efficiency": self.efficiency(acc)}),
        }
        if cluster.intra.name.startswith(NVLINK_PREFIXES):
            update["intra"] = cluster.intra.model_copy(
                update={"efficiency": self.nvlink_efficiency}
            )
        if cluster.inter.name.startswith(NIC_PREFIXES):
            update["inter"] = cluster.inter.model_copy(update={"efficiency": self.nic_efficiency})
        return cluster.model_copy(update=update)


def source_weights(runs: Sequence[RunSpec]) -> np.ndarray:
    """Each source weighs the same in total; inside a source every row weighs the same
    (so S5's weak-scaling sweeps count as one source, not 66 independent runs)."""
    sources = [r.source_id for r in runs]
    counts = {s: sources.count(s) for s in set(sources)}
    w = np.array([1.0 / counts[s] for s in sources])
    return w / w.sum()


@dataclass(frozen=True)
class _Batch:
    """Runs that share a model and a cluster: one vectorized estimate for all their plans."""

    index: list[int]  # positions in the runs sequence
    model: TransformerSpec
    cluster: Cluster
    plans: PlanArrays


_BATCHES: list[tuple[tuple[RunSpec, ...], list[_Batch]]] = []  # the last few run lists


def _batches(runs: Sequence[RunSpec]) -> list[_Batch]:
    """The runs grouped by (model, cluster), cached for the same run list (a fit evaluates
    one list hundreds of times)."""
    for cached_runs, cached in _BATCHES:
        same = len(cached_runs) == len(runs)
        if same and all(a is b for a, b in zip(cached_runs, runs, strict=True)):
            return cached
    groups: dict[tuple[str, str], list[int]] = {}
    for i, run in enumerate(runs):
        key = (run.model.model_dump_json(), run.cluster.model_dump_json())
        groups.setdefault(key, []).append(i)
    batches = [
        _Batch(idx, runs[idx[0]].model, runs[idx[0]].cluster,
               PlanArrays.from_plans([runs[i].plan for i in idx]) if len(idx) > 1
               else PlanArrays.scalar(runs[idx[0]].plan))
        for idx in groups.values()
    ]  # fmt: skip
    _BATCHES.insert(0, (tuple(runs), batches))
    del _BATCHES[4:]
    return batches


def predictions(runs: Sequence[RunSpec], calibration: Calibration | None = None) -> np.ndarray:
    """Predicted tokens/s per GPU of every run (under `calibration` when given): the runs that
    share a model and a cluster in one vectorized estimate (the same formulas as one by one),
    memory left out."""
    out = np.empty(len(runs))
    for batch in _batches(runs):
        cluster = calibration.apply(batch.cluster) if calibration else batch.cluster
        arrays = estimate_step_arrays(batch.model, cluster, batch.plans, with_memory=False)
        out[batch.index] = np.asarray(arrays.tokens_per_s_per_gpu, dtype=np.float64).reshape(-1)
    return out


def fit_loss(runs: Sequence[RunSpec], calibration: Calibration, weights: np.ndarray) -> float:
    """Source-weighted mean |log(predicted / measured)| (robust to the noisy duplicates)."""
    measured = np.array([r.measured for r in runs])
    return float(np.sum(weights * np.abs(np.log(predictions(runs, calibration) / measured))))


def _to_unit(x: float, b: Bound) -> float:
    p = min(max((x - b.low) / (b.high - b.low), 1e-6), 1 - 1e-6)
    return float(np.log(p / (1 - p)))


def _from_unit(z: float, b: Bound) -> float:
    return b.low + (b.high - b.low) / (1.0 + float(np.exp(-z)))


def nelder_mead(
    f: Callable[[np.ndarray], float], x0: np.ndarray, step: float, iterations: int
) -> tuple[np.ndarray, float]:
    """Minimise f from x0 with the Nelder-Mead simplex (Nelder & Mead 1965 coefficients)."""
    n = len(x0)
    simplex = [x0] + [x0 + step * np.eye(n)[i] for i in range(n)]
    values = [f(x) for x in simplex]
    for _ in range(iterations):
        order = np.argsort(values)
        simplex = [simplex[i] for i in order]
        values = [values[i] for i in order]
        centroid = np.mean(simplex[:-1], axis=0)
        worst = simplex[-1]
        reflected = centroid + (centroid - worst)
        fr = f(reflected)
        if fr < values[0]:
            expanded = centroid + 2.0 * (centroid - worst)
            fe = f(expanded)
            simplex[-1], values[-1] = (expanded, fe) if fe < fr else (reflected, fr)
        elif fr < values[-2]:
            simplex[-1], values[-1] = reflected, fr
        else:
            contracted = centroid + 0.5 * (worst - centroid)
            fc = f(contracted)
            if fc < values[-1]:
                simplex[-1], values[-1] = contracted, fc
            else:
                best = simplex[0]
                simplex = [best] + [best + 0.5 * (x - best) for x in simplex[1:]]
                values = [values[0]] + [f(x) for x in simplex[1:]]
    i = int(np.argmin(values))
    return simplex[i], values[i]


def fit(
    runs: Sequence[RunSpec], start: Calibration | None = None, iterations: int = 300
) -> tuple[Calibration, float]:
    """Fit matmul_max of every family with runs plus the shared parameters (bounded via a
    logistic transform); returns the calibration and its loss."""
    weights = source_weights(runs)
    bounds = free_parameters(families_of(runs))
    names = [b.name for b in bounds]
    starts = dict(zip(start.names(), start.vector(), strict=True)) if start else {}
    x0 = [starts.get(b.name, b.start) for b in bounds]
    z0 = np.array([_to_unit(x, b) for x, b in zip(x0, bounds, strict=True)])

    def calibration(z: np.ndarray) -> Calibration:
        values = [_from_unit(zi, b) for zi, b in zip(z, bounds, strict=True)]
        return Calibration.from_values(names, values)

    z, value = nelder_mead(
        lambda z: fit_loss(runs, calibration(z), weights), z0, step=0.5, iterations=iterations
    )
    return calibration(z), value


@dataclass(frozen=True)
class FoldResult:
    """One leave-one-source-out fold: the held-out source's rows predicted by a fit on the
    other sources."""

    source_id: str
    rows: list[RowResult]
    train_loss: float


def leave_one_source_out(
    runs: Sequence[RunSpec],
    iterations: int = 300,
    start: Calibration | None = None,
    only: Sequence[str] | None = None,
) -> list[FoldResult]:
    """For each source (or each of `only`), fit on every other source and predict the held-out
    one: the honest estimate of accuracy on a source the fit has never seen."""
    folds: list[FoldResult] = []
    for source in sorted({r.source_id for r in runs}):
        if only and source not in only:
            continue
        train = [r for r in runs if r.source_id != source]
        test = [r for r in runs if r.source_id == source]
        calibration, loss = fit(train, start=start, iterations=iterations)
        pred = predictions(test, calibration)
        rows = [
            RowResult(r.run_id, r.source_id, r.measured, float(p), abs(float(p) / r.measured - 1))
            for r, p in zip(test, pred, strict=True)
        ]
        folds.append(FoldResult(source, rows, loss))
    return folds
