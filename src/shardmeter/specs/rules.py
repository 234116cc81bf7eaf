"""The plan rules, written once: what makes a plan runnable on a model, as one table.

Each `Rule` has a code, the field an error names, a numpy-broadcastable predicate over plan
columns, the one-line message, and whether a calibration row may relax it (a measured run whose
framework does not impose the rule). The table yields:

- `validate_plan`'s first error (`first_broken`, raised as a `PlanRuleError` carrying the code);
- the search's validity masks (`rules_hold` on `PlanArrays` or on a broadcast grid of columns:
  `estimate.step.plan_validity`, `search.space.grid_valid`);
- calibration's relaxations, chosen by code (`calibrate.validate_relaxed`), never by message.

Columns follow `PlanArrays`' conventions (duck-typed, so this module needs no estimator): stage
layer counts are -1 where the split is even, `vpp_group` is 0 when unset, `sharding` is a code
(0 = none) and `shard_group` is 1 without sharding. Where a Plan holds more than its columns
can show (an explicit `pp_layers` list, a shard degree given without sharding), the rule's
`exact` check on the Plan refines the predicate for one plan.

To add a rule: append a `Rule` to `RULES` in the position its error should take.
"""

from __future__ import annotations

from collections.abc import Callable, Iterable
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

import numpy as np
from numpy.typing import NDArray

from shardmeter.errors import UserInputError
from shardmeter.specs.model import TransformerSpec

if TYPE_CHECKING:  # plan.py imports this table for validate_plan
    from shardmeter.specs.plan import Plan

BoolArray = NDArray[np.bool_]
SHARDING_STAGES: dict[str, int] = {"none": 0, "zero1": 1, "zero2": 2, "zero3": 3}


class PlanRuleError(UserInputError):
    """A plan that breaks a rule of `RULES`; `code` names the rule."""

    def __init__(self, code: str, field: str, value: Any, allowed: str) -> None:
        self.code = code
        super().__init__(field, value, allowed)


@dataclass(frozen=True)
class PlanColumns:
    """One Plan as the columns the rules read (the `PlanArrays` conventions, as numpy ints)."""

    dp: Any
    tp: Any
    pp: Any
    cp: Any
    ep: Any
    vpp: Any
    micro_batch: Any
    global_batch: Any
    sharding: Any  # 0 none, 1..3 ZeRO stage
    shard_group: Any  # ZeRO/FSDP group (1 without sharding)
    pp_first: Any = -1
    pp_mid: Any = -1
    pp_last: Any = -1
    vpp_group: Any = 0  # 0: pp

    @classmethod
    def of(cls, plan: Plan) -> PlanColumns:
        first, mid, last = plan.stage_layer_counts
        return cls(
            dp=plan.dp,
            tp=plan.tp,
            pp=plan.pp,
            cp=plan.cp,
            ep=plan.ep,
            vpp=plan.vpp,
            micro_batch=plan.micro_batch,
            global_batch=plan.global_batch,
            sharding=SHARDING_STAGES[plan.sharding],
            shard_group=plan.shard_group,
            pp_first=first,
            pp_mid=mid,
            pp_last=last,
            vpp_group=plan.vpp_group or 0,
        )

    @property
    def micro_batches(self) -> Any:
        """Micro-batches per pipeline per step, at least 1 (as `PlanArrays.micro_batches`)."""
        return np.maximum(self.global_batch // (self.dp * self.micro_batch), 1)

    @property
    def chunk_group(self) -> Any:
        """N of the interleaved schedule: `vpp_group`, else pp (as `PlanArrays.chunk_group`)."""
        return np.where(self.vpp_group > 0, self.vpp_group, self.pp)


Predicate = Callable[[Any, TransformerSpec], Any]
Describe = Callable[["Plan", TransformerSpec], Any]


@dataclass(frozen=True)
class Rule:
    """One plan rule. `holds(columns, model)` broadcasts over plan columns; `field`, `value`
    and `allowed` spell the one-line error for one Plan; `exact`, where given, replaces
    `holds` for one Plan (it sees what the columns cannot)."""

    code: str
    field: Describe | str
    holds: Predicate
    value: Describe
    allowed: Describe
    relaxable: bool = False  # a calibration row may relax it (its framework does not impose it)
    exact: Callable[[Plan, TransformerSpec], bool] | None = None

    def broken_by(self, plan: Plan, model: TransformerSpec) -> bool:
        if self.exact is not None:
            return not self.exact(plan, model)
        return not bool(np.all(self.holds(PlanColumns.of(plan), model)))

    def error(self, plan: Plan, model: TransformerSpec) -> PlanRuleError:
        field = self.field if isinstance(self.field, str) else self.field(plan, model)
        return PlanRuleError(self.code, field, self.value(plan, model), self.allowed(plan, model))


def _stated(c: Any) -> Any:
    return (c.pp_first >= 0) | (c.pp_mid >= 0) | (c.pp_last >= 0)


def _split_fits(c: Any, model: TransformerSpec) -> Any:
    """Stated first/last counts leave at least one layer for every other stage (and exactly
    none when both ends are stated with pp = 2); Megatron-Core decoder_first/last_pipeline_num_layers."""
    first_set, last_set = c.pp_first >= 0, c.pp_last >= 0
    stated = np.where(first_set, c.pp_first, 0) + np.where(last_set, c.pp_last, 0)
    unstated = c.pp - np.asarray(first_set, np.int64) - np.asarray(last_set, np.int64)
    rest = model.n_layers - stated
    return (c.pp > 1) & (rest >= unstated) & ((unstated > 0) | (rest == 0))


def _stage_error(plan: Plan, model: TransformerSpec) -> tuple[str, Any, str] | None:
    """The field, value and message of a stated stage split that does not fit, or None."""
    n_layers = model.n_layers
    if plan.pp_layers is None and plan.pp_first is None and plan.pp_last is None:
        return None
    if plan.pp == 1:
        return "plan.pp_layers", plan.pp_layers, "uneven stages need pp > 1"
    if plan.pp_layers is not None:
        counts = plan.pp_layers
        if len(counts) != plan.pp or sum(counts) != n_layers or min(counts) < 0:
            allowed = f"{plan.pp} non-negative counts summing to n_layers = {n_layers}"
            return "plan.pp_layers", list(counts), allowed
        return None
    stated = (plan.pp_first or 0) + (plan.pp_last or 0)
    unstated = plan.pp - (plan.pp_first is not None) - (plan.pp_last is not None)
    rest = n_layers - stated
    if rest < unstated or (unstated == 0 and rest != 0):
        field = "plan.pp_first" if plan.pp_first is not None else "plan.pp_last"
        allowed = (
            f"first + last ({stated}) must leave at least one of the {n_layers} layers for "
            f"each of the other {unstated} stages"
            if unstated
            else f"first + last must equal n_layers = {n_layers} with pp = 2"
        )
        return field, stated, allowed
    return None


def _stage_part(k: int) -> Describe:
    def part(plan: Plan, model: TransformerSpec) -> Any:
        found = _stage_error(plan, model)
        return None if found is None else found[k]

    return part


def _group_name(plan: Plan) -> str:
    return "vpp_group" if plan.vpp_group is not None else "pp"


def _group(plan: Plan) -> int:
    return plan.vpp_group if plan.vpp_group is not None else plan.pp


RULES: tuple[Rule, ...] = (
    Rule(
        "tp_divides_heads",
        "plan.tp",
        lambda c, m: m.n_heads % c.tp == 0,
        lambda p, m: p.tp,
        lambda p, m: f"must divide n_heads = {m.n_heads}",
    ),
    Rule(
        "stage_split",
        _stage_part(0),
        lambda c, m: np.logical_not(_stated(c)) | _split_fits(c, m),
        _stage_part(1),
        _stage_part(2),
        exact=lambda p, m: _stage_error(p, m) is None,
    ),
    Rule(
        "layers_per_chunk",
        "plan.pp",
        lambda c, m: _stated(c) | (m.n_layers % (c.pp * c.vpp) == 0),
        lambda p, m: p.pp,
        lambda p, m: f"pp*vpp = {p.pp * p.vpp} must divide n_layers = {m.n_layers}",
        relaxable=True,  # torchtitan splits layers unevenly; the estimate takes the fullest stage
    ),
    Rule(
        "vpp_needs_pp",
        "plan.vpp",
        lambda c, m: (c.vpp == 1) | (c.pp > 1),
        lambda p, m: p.vpp,
        lambda p, m: "interleaving needs pp > 1",
    ),
    Rule(
        "cp_divides_seq",
        "plan.cp",
        lambda c, m: m.seq_len % c.cp == 0,
        lambda p, m: p.cp,
        lambda p, m: f"must divide seq_len = {m.seq_len}",
    ),
    Rule(
        "ep_needs_moe",
        "plan.ep",
        lambda c, m: (c.ep == 1) | (m.moe is not None),
        lambda p, m: p.ep,
        lambda p, m: "expert parallelism needs an MoE model (ep = 1)",
    ),
    Rule(
        "ep_divides_experts",
        "plan.ep",
        lambda c, m: (m.moe is None) | ((m.moe.experts if m.moe else 1) % c.ep == 0),
        lambda p, m: p.ep,
        lambda p, m: f"must divide experts = {m.moe.experts if m.moe else 1}",
    ),
    Rule(
        "ep_divides_dp",
        "plan.ep",
        lambda c, m: c.dp % c.ep == 0,
        lambda p, m: p.ep,
        lambda p, m: f"must divide dp = {p.dp}",
    ),
    Rule(
        "whole_micro_batches",
        "plan.global_batch",
        lambda c, m: c.global_batch % (c.dp * c.micro_batch) == 0,
        lambda p, m: p.global_batch,
        lambda p, m: f"must be a multiple of dp*micro_batch = {p.dp * p.micro_batch}",
        relaxable=True,  # some stacks drop the remainder; the estimate uses whole micro-batches
    ),
    Rule(
        "vpp_group",
        "plan.vpp_group",
        lambda c, m: (c.vpp_group == 0) | ((c.vpp > 1) & (c.chunk_group >= c.pp)),
        lambda p, m: _group(p),
        lambda p, m: f"needs an interleaved schedule (vpp > 1) and >= pp = {p.pp}",
    ),
    Rule(
        "interleave_micro_batches",
        "plan.global_batch",
        lambda c, m: (c.vpp == 1) | (c.micro_batches % c.chunk_group == 0),
        lambda p, m: p.global_batch,
        lambda p, m: (
            f"interleaved schedules need micro-batches ({p.micro_batches}) divisible by "
            f"{_group_name(p)} = {_group(p)}"
        ),
        relaxable=True,  # not every stack needs it; the estimate then runs plain 1F1B (vpp 1)
    ),
    Rule(
        "shard_needs_sharding",
        "plan.shard_degree",
        lambda c, m: (c.sharding > 0) | (c.shard_group == 1),
        lambda p, m: p.shard_degree,
        lambda p, m: "needs sharding zero1/2/3",
        exact=lambda p, m: p.shard_degree is None or p.sharding != "none",
    ),
    Rule(
        "shard_divides_dp",
        "plan.shard_degree",
        lambda c, m: c.dp % c.shard_group == 0,
        lambda p, m: p.shard_degree,
        lambda p, m: f"must divide dp = {p.dp}",
    ),
)
RULE_CODES: tuple[str, ...] = tuple(r.code for r in RULES)
RELAXABLE: frozenset[str] = frozenset(r.code for r in RULES if r.relaxable)


def rule(code: str) -> Rule:
    """The rule of that code (KeyError for an unknown one)."""
    for r in RULES:
        if r.code == code:
            return r
    raise KeyError(code)


def first_broken(
    plan: Plan, model: TransformerSpec, relax: Iterable[str] = ()
) -> PlanRuleError | None:
    """The first rule (in table order) `plan` breaks on `model`, skipping `relax`, as its error."""
    skip = frozenset(relax)
    for r in RULES:
        if r.code not in skip and r.broken_by(plan, model):
            return r.error(plan, model)
    return None


def rules_hold(columns: Any, model: TransformerSpec, relax: Iterable[str] = ()) -> BoolArray:
    """True where every rule but `relax` holds, broadcast over the columns (a `PlanArrays`,
    a `PlanColumns` of arrays, or any object with those attributes)."""
    skip = frozenset(relax)
    ok: Any = True
    for r in RULES:
        if r.code not in skip:
            ok = ok & r.holds(columns, model)
    return np.asarray(ok, dtype=np.bool_)
