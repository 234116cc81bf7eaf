"""Words for a search result: why the winner wins, and which constraint no plan meets."""

from __future__ import annotations

import math
from collections.abc import Sequence
from dataclasses import fields

from shardmeter.search.options import Constraints
from shardmeter.search.result import Candidate, Explanation, Infeasibility, TermDiff
from shardmeter.specs.plan import Plan

MIN_TERM_SHARE = 0.01  # terms that move less than 1% of the winner's time are not listed


def plan_diffs(a: Plan, b: Plan, prefix: str = "") -> list[str]:
    """'field: runner-up value → winner value' for every Plan field that differs."""
    out = []
    for f in type(a).model_fields:
        va, vb = getattr(a, f), getattr(b, f)
        if va != vb:
            out.append(f"{prefix}{f}: {vb} → {va}")
    return out


def candidate_diffs(winner: Candidate, runner_up: Candidate) -> list[str]:
    """Differences in GPUs per island, outer settings and inner plans."""
    out: list[str] = []
    if winner.outer is not None and runner_up.outer is not None:
        for f in fields(winner.outer):
            va, vb = getattr(winner.outer, f.name), getattr(runner_up.outer, f.name)
            if va != vb:
                out.append(f"{f.name}: {vb} → {va}")
    ra = {i.name: i for i in runner_up.islands}
    wa = {i.name: i for i in winner.islands}
    for name in sorted(set(ra) | set(wa)):
        if name not in wa:
            out.append(f"{name}: {ra[name].n_gpus} GPUs → unused")
        elif name not in ra:
            out.append(f"{name}: unused → {wa[name].n_gpus} GPUs")
        else:
            prefix = f"{name}." if len(wa) > 1 or len(ra) > 1 else ""
            if wa[name].n_gpus != ra[name].n_gpus:
                out.append(f"{prefix}GPUs: {ra[name].n_gpus} → {wa[name].n_gpus}")
            out.extend(plan_diffs(wa[name].plan, ra[name].plan, prefix))
    return out


def explain(
    winner: Candidate,
    runner_up: Candidate,
    winner_terms: dict[str, float],
    runner_terms: dict[str, float],
) -> Explanation:
    """Compare two candidates' breakdowns (seconds per million tokens, same keys)."""
    total = sum(winner_terms.values())
    diffs = [
        TermDiff(k, winner_terms[k], runner_terms.get(k, 0.0))
        for k in winner_terms
        if abs(runner_terms.get(k, 0.0) - winner_terms[k]) > MIN_TERM_SHARE * total
    ]
    diffs.sort(key=lambda d: -abs(d.saved))
    speedup = runner_up.wall_s / winner.wall_s
    changes = candidate_diffs(winner, runner_up)
    shown = (
        diffs[:3]
        or sorted(
            (TermDiff(k, winner_terms[k], runner_terms.get(k, 0.0)) for k in winner_terms),
            key=lambda d: -abs(d.saved),
        )[:2]
    )
    parts = [
        f"{d.term} {'−' if d.saved > 0 else '+'}{abs(d.saved):.3g} s/Mtok "
        f"({d.runner_up:.3g} → {d.winner:.3g})"
        for d in shown
    ]
    text = (
        f"The top plan is {100 * (speedup - 1):.2g}% faster than the runner-up"
        f" ({'; '.join(changes[:4]) or 'same plan fields'}): " + ", ".join(parts) + "."
    )
    return Explanation(speedup, tuple(diffs), tuple(changes), text)


def _miss(c: Candidate, con: Constraints) -> float:
    """How far a candidate misses, as the larger relative excess over deadline and budget."""
    over = 0.0
    if con.deadline_s is not None:
        over = max(over, c.wall_s / con.deadline_s - 1.0)
    if con.budget_usd is not None:
        over = max(over, c.cost_usd / con.budget_usd - 1.0)
    return over


def _fmt_days(seconds: float) -> str:
    return f"{seconds / 86400:.3g} days"


def infeasibility(
    front: Sequence[Candidate], con: Constraints, any_fitting: bool, memory_note: str
) -> Infeasibility:
    """Name the binding constraint and the closest plan on the time-cost front of all
    memory-fitting plans (every plan closest to a deadline/budget box lies on it)."""
    if not any_fitting or not front:
        return Infeasibility("memory", None, f"No runnable plan fits in memory: {memory_note}.")
    fastest = min(front, key=lambda c: c.wall_s)
    cheapest = min(front, key=lambda c: c.cost_usd)
    deadline_ok = con.deadline_s is None or fastest.wall_s <= con.deadline_s
    budget_ok = con.budget_usd is None or cheapest.cost_usd <= con.budget_usd
    closest = min(front, key=lambda c: _miss(c, con))
    if not deadline_ok and con.deadline_s is not None:
        binding = "deadline"
        closest = fastest
        text = (
            f"No plan meets the deadline of {_fmt_days(con.deadline_s)}: the fastest takes "
            f"{_fmt_days(fastest.wall_s)} ({100 * (fastest.wall_s / con.deadline_s - 1):.3g}% over)."
        )
    elif not budget_ok and con.budget_usd is not None:
        binding = "budget"
        closest = cheapest
        text = (
            f"No plan fits the budget of ${con.budget_usd:,.0f}: the cheapest costs "
            f"${cheapest.cost_usd:,.0f} ({100 * (cheapest.cost_usd / con.budget_usd - 1):.3g}% over)."
        )
    else:
        binding = "deadline and budget"
        text = (
            "Each constraint alone can be met but not both: the closest plan takes "
            f"{_fmt_days(closest.wall_s)} and costs ${closest.cost_usd:,.0f} "
            f"({100 * _miss(closest, con):.3g}% over the tighter one)."
        )
    if math.isnan(_miss(closest, con)):
        text = "No plan meets the constraints."
    return Infeasibility(binding, closest, text)
