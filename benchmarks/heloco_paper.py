"""Reproduce the HeLoCo paper's three headline claims on the 5-language corpus, on CPU.

Grid (heloco-spec.md §3-4): 5 workers, one language each; paces [1,1,1,1,1], [1,1,1,2,2],
[1,6,6,6,6], [1,15,15,15,15]; methods sync, async-nesterov, dn, dn-dylu, mla, heloco,
heloco-uncorrected, heloco+ab, mla+ab and Decoupled DiLoCo (``decoupled``, arXiv 2604.21428:
quorum of half the workers, no grace window, token-weighted merge); seeds 0-2; two regimes (presets ``paper-regime`` and
``converged``). Cells run seed-major (every cell of seed 0 first), two processes with one torch
thread each, and are resumable (see :mod:`heloco.experiments`). Each task simulates the methods
of one setting and seed side by side, their rounds batched (the same losses as one at a time;
``--no-batch`` turns it off); ``--executor ray`` runs the tasks on a Ray cluster.

Payload codecs (``--codecs``, its own folder ``heloco_paper_codecs``): sync DiLoCo and HeLoCo
sending Δ as fp32, int8 (the transport's blockwise int8, no residual), top-1% and sign (each
with error feedback, :mod:`heloco.codecs`), in both regimes at paces [1,1,1,2,2], seeds 0-2.
Every payload row talks to the server over the same simulated link: a round costs
(push bytes + dispatch bytes) / bandwidth, whole wire messages, the bandwidth set so that the
fp32 round trip (Δ up, θ down, both fp32) takes half a pace-1 worker's round of compute; a
compressed payload shortens only the push (the dispatch is θ in fp32). Read at equal tokens
(T) and at equal simulated time (S), each against the same method's fp32 row.

Claims (abstract of arXiv 2606.00271; spec §4.1), relative loss reduction (L_b − L_h)/L_b:
  1. up to 7.5% vs asynchronous DiLoCo baselines (async-nesterov, dn, dn-dylu), fixed tokens;
  2. up to 3.3% vs MLA, fixed (simulated) wall-clock time;
  3. up to 22.1% vs sync DiLoCo under severe heterogeneity (paces [1,15,15,15,15]), fixed time.
Verdict per claim, regime and reading (budget point / last-cycle mean), on the setting where the
seed-mean improvement is largest ("up to"):
  reproduced      mean ≥ half the claimed figure and mean > seed std;
  reversed        HeLoCo is worse in every setting (best mean < 0 and |mean| > std);
  not reproduced  anything else (the note says whether the direction still holds).

    python benchmarks/heloco_paper.py --quick              # 1 seed, 1/4 of the steps
    python benchmarks/heloco_paper.py                      # the full grid
    python benchmarks/heloco_paper.py --check              # generalisation settings
    python benchmarks/heloco_paper.py --codecs             # payload codecs against fp32
    python benchmarks/heloco_paper.py --report-only        # tables from runs/ or results.jsonl
    python benchmarks/heloco_paper.py --executor ray --ray-address HOST:6379   # on a cluster
    bash benchmarks/heloco_paper_gpu.sh                    # the authors' scale, on a GPU
"""

from __future__ import annotations

import argparse
import dataclasses
import json
import sys
import time
from collections.abc import Sequence
from dataclasses import dataclass
from datetime import datetime, timezone
from pathlib import Path

from heloco.config import atomic_write_text, load_config
from heloco.executors import EXECUTORS
from heloco.experiments import (
    Cell,
    CellResult,
    GridRun,
    Split,
    Spread,
    paired_improvement,
    read_results,
    run_grid,
    spread,
)
from heloco.metrics import RunStats
from heloco.sim import SimConfig
from heloco.worker import check_device
from shardmeter.errors import UserInputError
from shardmeter.paths import missing_shared_reason, shared_path

REGIMES = ("paper-regime", "converged")
PACES: tuple[tuple[float, ...], ...] = (
    (1, 1, 1, 1, 1),
    (1, 1, 1, 2, 2),
    (1, 6, 6, 6, 6),
    (1, 15, 15, 15, 15),
)
METHODS = (
    "sync",
    "async-nesterov",
    "dn",
    "dn-dylu",
    "mla",
    "heloco",
    "heloco-uncorrected",
    "heloco+ab",
    "mla+ab",
    "decoupled",
)
SEEDS = (0, 1, 2)
ASYNC_BASELINES = ("async-nesterov", "dn", "dn-dylu")
SEVERE = (1, 15, 15, 15, 15)
CHECK_SETTINGS: tuple[tuple[tuple[float, ...], Split], ...] = (
    ((1, 2, 3, 1, 5), Split()),
    ((1, 3, 3, 9, 9), Split()),
    ((1, 6, 6, 6, 6), Split("dirichlet", 0.1)),
    ((1, 6, 6, 6, 6), Split("dirichlet", 1.0)),
)
CHECK_METHODS = ("sync", "async-nesterov", "dn-dylu", "mla", "heloco", "heloco+ab", "decoupled")
CHECK_SEEDS = (3, 4)
# Payload rows (--codecs): each method sends Δ as each payload over the same simulated link.
CODEC_PAYLOADS = ("fp32", "int8", "topk:fraction=0.01", "sign")
CODEC_METHODS = ("sync", "heloco")
CODEC_PACES: tuple[tuple[float, ...], ...] = ((1, 1, 1, 2, 2),)
CODEC_ROUND_TRIP = 0.5  # the fp32 round trip on the link, in pace-1 rounds (H inner steps)
SECRET = b"heloco-paper-codecs-benchmark-0123"  # signs the probe messages that are counted
PROBE_TS = 1796000000.123456  # the probe messages' timestamp (a typical width, 17 characters)
# The comparisons the plots draw and the check re-tests: (method, baseline, budget).
COMPARISONS: tuple[tuple[str, str, str], ...] = (
    ("heloco", "async-nesterov", "tokens"),
    ("heloco", "dn-dylu", "tokens"),
    ("heloco", "mla", "time"),
    ("heloco", "sync", "time"),
    ("heloco+ab", "heloco", "tokens"),
    ("heloco+ab", "mla", "time"),
    ("heloco+ab", "sync", "time"),
    ("heloco", "decoupled", "time"),
)
QUICK_DIVISOR = 4
READINGS = (("point", "loss_at"), ("cycle", "cycle_loss_at"))


@dataclass(frozen=True)
class Claim:
    """One headline claim of the abstract."""

    number: int
    text: str
    claimed: float  # relative improvement (0.075 = 7.5%)
    baselines: tuple[str, ...]
    budget: str  # "tokens" | "time"
    severe_only: bool = False


CLAIMS = (
    Claim(1, "vs async DiLoCo baselines, fixed tokens", 0.075, ASYNC_BASELINES, "tokens"),
    Claim(2, "vs MLA, fixed wall-clock", 0.033, ("mla",), "time"),
    Claim(3, "vs sync, severe heterogeneity, fixed wall-clock", 0.221, ("sync",), "time", True),
)


# -- grid definition ------------------------------------------------------------------------
def parse_paces_list(text: str) -> list[tuple[float, ...]]:
    """``"1,1,1,2,2;1,6,6,6,6"`` -> two pace tuples."""
    out = []
    for group in text.split(";"):
        try:
            out.append(tuple(float(x) for x in group.split(",")))
        except ValueError:
            raise UserInputError(
                "--paces", text, "groups like 1,1,1,2,2 separated by ';'"
            ) from None
    return out


def build_cells(
    regimes: Sequence[str],
    settings: Sequence[tuple[tuple[float, ...], Split]],
    methods: Sequence[str],
    seeds: Sequence[int],
    payloads: Sequence[str] = ("",),
) -> list[Cell]:
    """Seed-major order, so an interrupted grid has whole seeds done."""
    return [
        Cell(regime, paces, method, seed, split, payload)
        for seed in seeds
        for regime in regimes
        for paces, split in settings
        for method in methods
        for payload in payloads
    ]


# -- payload rows: the link and the bytes -----------------------------------------------------
def exchange_bytes(cfg: SimConfig, payload: str) -> tuple[int, int]:
    """(push, dispatch) wire bytes of one round of ``cfg``'s model, whole messages (header,
    frames, tag) as :mod:`heloco.net.wire` encodes them: Δ as ``payload`` up, θ in fp32 down."""
    import torch

    from heloco.codecs import ErrorFeedback
    from heloco.modelspec import build_model
    from heloco.net import wire

    model = build_model(cfg.model, 256, max(cfg.inner.seq_len, cfg.data.seq_len), 0, "cpu")
    params = {n: p.detach().clone() for n, p in model.named_parameters()}
    delta = {n: 1e-3 * torch.randn_like(p) for n, p in params.items()}
    body = {"worker": 0, "round_id": 1, "base_revision": 0, "steps": 10, "tokens": 2560}
    if payload in ("fp32", "bf16", "int8"):
        push = wire.make("push", body, delta, payload)  # type: ignore[arg-type]
    else:
        push = wire.make("push", body, ErrorFeedback(payload).compress(delta))
    down = wire.make("dispatch", {"revision": 0, "steps": 10, "round_id": 1}, params)
    # a fixed timestamp: the header's length, and so the link delays, must not vary by run
    push, down = (dataclasses.replace(m, ts=PROBE_TS) for m in (push, down))
    return (
        wire.wire_bytes(wire.encode(push, SECRET)),
        wire.wire_bytes(wire.encode(down, SECRET)),
    )


def payload_overrides(
    regime: str, data_dir: Path, paces: Sequence[float], payloads: Sequence[str]
) -> dict[str, dict[str, object]]:
    """Per payload row: its codec or payload and the link delay of every worker's round,
    ``(push + dispatch) / bandwidth``, the bandwidth making the fp32 round trip
    CODEC_ROUND_TRIP of a pace-1 round (module docstring)."""
    cfg = load_config(preset=regime, overrides={"data.data_dir": str(data_dir)})
    push32, down = exchange_bytes(cfg, "fp32")
    bandwidth = (push32 + down) / (CODEC_ROUND_TRIP * cfg.inner_steps * min(paces))  # B/s
    out: dict[str, dict[str, object]] = {}
    for payload in payloads:
        push, _ = exchange_bytes(cfg, payload)
        codec = {"codec": payload} if payload in ("bf16", "int8") else {}
        sent = {} if payload in ("fp32", "bf16", "int8") else {"payload": payload}
        delay = (push + down) / bandwidth
        out[payload] = {**codec, **sent, "comm_delays": [delay] * len(paces)}
    return out


# -- analysis -------------------------------------------------------------------------------
def group(rows: Sequence[CellResult]) -> dict[tuple[str, str, str], list[CellResult]]:
    """Rows by (regime, paces label, split)."""
    out: dict[tuple[str, str, str], list[CellResult]] = {}
    for r in rows:
        out.setdefault((r.regime, r.paces_label, r.split), []).append(r)
    return out


def regime_rank(regime: str) -> tuple[int, str]:
    return (REGIMES.index(regime) if regime in REGIMES else len(REGIMES), regime)


def ordered_groups(
    rows: Sequence[CellResult],
) -> list[tuple[tuple[str, str, str], list[CellResult]]]:
    """Groups in reading order: regime as in REGIMES, then mild to severe paces, then split."""

    def key(item: tuple[tuple[str, str, str], list[CellResult]]) -> tuple[object, ...]:
        (regime, paces, split), cell_rows = item
        p = cell_rows[0].paces
        return (regime_rank(regime), max(p) / min(p), paces, split)

    return sorted(group(rows).items(), key=key)


def metric_name(reading: str, budget: str) -> str:
    prefix = dict(READINGS)[reading]
    return f"{prefix}_{budget}"


def method_spread(rows: Sequence[CellResult], method: str, metric: str) -> Spread:
    return spread(float(getattr(r, metric)) for r in rows if r.method == method)


def pct(s: Spread) -> str:
    return s.fmt(".2f", 100.0, "%")


@dataclass(frozen=True)
class Verdict:
    claim: Claim
    regime: str
    reading: str
    best: Spread
    setting: str
    baseline: str
    verdict: str
    note: str


def judge(best: Spread, claimed: float, any_positive: bool) -> tuple[str, str]:
    """Verdict of the best-case improvement (see the module docstring)."""
    if best.n == 0:
        return "not run", ""
    consistent = best.mean > best.std if best.n > 1 else best.mean > 0
    caveat = "; 1 seed, no spread estimate" if best.n == 1 else ""
    if best.mean >= claimed / 2 and consistent:
        return "reproduced", caveat.removeprefix("; ")
    if best.mean < 0 and abs(best.mean) > best.std and not any_positive:
        return "reversed", "HeLoCo is worse in every setting" + caveat
    if consistent:
        return "not reproduced", "direction holds, magnitude below half the claim" + caveat
    return "not reproduced", "no consistent improvement over the seed spread" + caveat


def verdicts(
    rows: Sequence[CellResult], regime: str, claim: Claim, reading: str, method: str = "heloco"
) -> Verdict:
    """Best (largest seed-mean improvement of ``method``) setting × baseline for one claim."""
    metric = metric_name(reading, claim.budget)
    best: tuple[Spread, str, str] | None = None
    any_positive = False
    for (reg, paces, split), cell_rows in ordered_groups(rows):
        if reg != regime or split != "language":
            continue
        if claim.severe_only and paces != label(SEVERE):
            continue
        for base in claim.baselines:
            imp = paired_improvement(cell_rows, method, base, metric)
            if imp.n == 0:
                continue
            any_positive = any_positive or imp.mean > 0
            if best is None or imp.mean > best[0].mean:
                best = (imp, paces, base)
    if best is None:
        return Verdict(claim, regime, reading, spread([]), "-", "-", "not run", "")
    verdict, note = judge(best[0], claim.claimed, any_positive)
    return Verdict(claim, regime, reading, best[0], best[1], best[2], verdict, note)


def _num(x: float | None) -> float:
    return float("nan") if x is None else float(x)


def label(paces: Sequence[float]) -> str:
    return "-".join(f"{p:g}" for p in paces)


# -- markdown -------------------------------------------------------------------------------
def md_table(header: Sequence[str], rows: Sequence[Sequence[str]]) -> list[str]:
    out = ["| " + " | ".join(header) + " |", "|" + "---|" * len(header)]
    out += ["| " + " | ".join(r) + " |" for r in rows]
    return [*out, ""]


def loss_tables(rows: Sequence[CellResult], methods: Sequence[str]) -> list[str]:
    lines: list[str] = []
    for (regime, paces, split), cell_rows in ordered_groups(rows):
        first = cell_rows[0]
        lines.append(
            f"#### {regime}, paces [{paces.replace('-', ', ')}], split {split} — "
            f"T = {first.token_budget:,} tokens, S = {first.time_budget:,.1f} s simulated, "
            f"cycle W = {first.cycle_seconds:g} s"
        )
        lines.append("")
        present = [m for m in methods if any(r.method == m for r in cell_rows)]
        body = []
        for m in present:
            seeds = sum(1 for r in cell_rows if r.method == m)
            cells = [
                method_spread(cell_rows, m, metric).fmt()
                for metric in (
                    "loss_at_tokens",
                    "cycle_loss_at_tokens",
                    "loss_at_time",
                    "cycle_loss_at_time",
                )
            ]
            imp = [
                pct(paired_improvement(cell_rows, "heloco", m, "loss_at_tokens"))
                if m != "heloco"
                else "",
                pct(paired_improvement(cell_rows, "heloco", m, "loss_at_time"))
                if m != "heloco"
                else "",
            ]
            body.append([m, str(seeds), *cells, *imp])
        lines += md_table(
            [
                "method",
                "seeds",
                "loss @T",
                "cycle mean @T",
                "loss @S",
                "cycle mean @S",
                "HeLoCo vs it @T",
                "HeLoCo vs it @S",
            ],
            body,
        )
    return lines


def variant_lines(rows: Sequence[CellResult]) -> list[str]:
    """Arrival-balanced variants against their parents."""
    body = []
    for (regime, paces, split), cell_rows in ordered_groups(rows):
        for variant, parent in (("heloco+ab", "heloco"), ("mla+ab", "mla"), ("heloco+ab", "mla")):
            a = paired_improvement(cell_rows, variant, parent, "loss_at_tokens")
            b = paired_improvement(cell_rows, variant, parent, "loss_at_time")
            c = paired_improvement(cell_rows, variant, parent, "cycle_loss_at_time")
            if a.n:
                body.append(
                    [regime, paces, split, f"{variant} vs {parent}", pct(a), pct(b), pct(c)]
                )
    if not body:
        return []
    return md_table(["regime", "paces", "split", "comparison", "@T", "@S", "cycle mean @S"], body)


def diagnostics(
    rows: Sequence[CellResult], regime: str, paces: str, methods: Sequence[str]
) -> list[str]:
    """Arrival shares per language, per-language losses, staleness, correction statistics."""
    cell_rows = [
        r for r in rows if r.regime == regime and r.paces_label == paces and r.split == "language"
    ]
    if not cell_rows:
        return []
    langs = sorted(cell_rows[0].per_language_at_tokens)
    lines = ["Means over seeds.", ""]
    body = []
    for m in methods:
        mr = [r for r in cell_rows if r.method == m]
        if not mr:
            continue
        shares = [spread(r.language_shares.get(lg, float("nan")) for r in mr).mean for lg in langs]
        losses = [spread(r.per_language_at_tokens[lg] for r in mr).mean for lg in langs]
        stale = [
            spread(_num(r.staleness_mean[w]) for r in mr) for w in range(len(mr[0].staleness_mean))
        ]
        body.append(
            [
                m,
                " / ".join(f"{s:.2f}" for s in shares),
                " / ".join(f"{x:.3f}" for x in losses),
                " / ".join(f"{s.mean:.1f}" if s.n else "-" for s in stale),
            ]
        )
    lines += md_table(
        [
            "method",
            f"arrival share per language ({'/'.join(langs)})",
            "loss per language @T",
            "mean staleness per worker",
        ],
        body,
    )
    corr = []
    for m in methods:
        mr = [r for r in cell_rows if r.method == m]
        if not mr:
            continue
        vals = []
        for key in RunStats.STAT_FIELDS:
            vals.append(spread(_num(r.correction.get(key)) for r in mr).fmt(".3f"))
        corr.append([m, *vals])
    lines += md_table(
        [
            "method",
            "cos(Δ, m)",
            "kept",
            "shrunk",
            "rotated",
            "‖Δ̂−Δ‖/‖Δ‖",
            "tensor mean ‖Δ̂−Δ‖/‖Δ‖",
            "mean λ",
            "mean β",
        ],
        corr,
    )
    return lines


def regime_groups(
    rows: Sequence[CellResult], regime: str
) -> list[tuple[tuple[str, str, str], list[CellResult]]]:
    """``ordered_groups`` of one regime."""
    return [(key, rs) for key, rs in ordered_groups(rows) if key[0] == regime]


def comparison_name(method: str, baseline: str, budget: str) -> str:
    """``heloco vs mla @S``: T is the token budget, S the simulated-time budget."""
    return f"{method} vs {baseline} @{'T' if budget == 'tokens' else 'S'}"


def direction(values: Sequence[float]) -> str:
    """'+' / '−' when every value has that sign, else 'mixed' ('-' with no values)."""
    if not values:
        return "-"
    if all(v > 0 for v in values):
        return "+"
    if all(v < 0 for v in values):
        return "−"
    return "mixed"


def heterogeneous_means(
    rows: Sequence[CellResult], regime: str, method: str, baseline: str, metric: str
) -> list[float]:
    """Seed-mean improvement of ``method`` over ``baseline`` per heterogeneous setting."""
    out = []
    for (reg, _, _), cell_rows in ordered_groups(rows):
        if reg != regime or max(cell_rows[0].paces) == min(cell_rows[0].paces):
            continue
        imp = paired_improvement(cell_rows, method, baseline, metric)
        if imp.n:
            out.append(imp.mean)
    return out


def generalisation_lines(check: Sequence[CellResult], grid: Sequence[CellResult]) -> list[str]:
    """Do the grid's directions (sign of each comparison over its heterogeneous settings)
    hold on the check settings? One row per regime × comparison, budget-point reading."""
    regimes = sorted({r.regime for r in check}, key=regime_rank)
    header: list[str] = []
    body = []
    for regime in regimes:
        groups = regime_groups(check, regime)
        header = [f"[{paces.replace('-', ', ')}] {split}" for (_, paces, split), _ in groups]
        for method, base, budget in COMPARISONS:
            metric = metric_name("point", budget)
            ref = heterogeneous_means(grid, regime, method, base, metric)
            ref_dir = direction(ref)
            imps = [paired_improvement(rs, method, base, metric) for _, rs in groups]
            means = [imp.mean for imp in imps if imp.n]
            agree = sum(1 for v in means if direction([v]) == ref_dir)
            if ref_dir not in ("+", "−") or not means:
                held = "grid mixed" if ref_dir == "mixed" else "-"
            else:
                held = "holds" if agree == len(means) else f"{agree}/{len(means)}"
            span = f"{min(ref) * 100:.2f}..{max(ref) * 100:.2f}%" if ref else "-"
            name = comparison_name(method, base, budget)
            body.append([regime, name, f"{ref_dir} ({span})", *map(pct, imps), held])
    if not body:
        return []
    grid_col = "grid direction (range over heterogeneous paces)"
    return md_table(["regime", "comparison", grid_col, *header, "direction holds"], body)


def render_markdown(
    rows: Sequence[CellResult],
    expected: Sequence[Cell],
    title: str,
    command: str,
    wall: float | None,
    note: str = "",
    grid_rows: Sequence[CellResult] = (),
) -> str:
    done = {(r.regime, r.paces_label, r.split, r.method, r.seed) for r in rows}
    exp = {(c.regime, c.paces_label, c.split.label, c.method, c.seed) for c in expected}
    seeds_done = sorted({r.seed for r in rows})
    methods = [m for m in (*METHODS, *CHECK_METHODS) if any(r.method == m for r in rows)]
    methods = list(dict.fromkeys(methods))
    lines = [
        f"# {title}",
        "",
        f"Generated {datetime.now(timezone.utc):%Y-%m-%d %H:%M} UTC by `{command}`.",
        "",
        f"Cells finished: {len(done & exp)} of {len(exp)} planned"
        + (f" ({len(done - exp)} more from earlier runs)" if done - exp else "")
        + f"; seeds with results: {', '.join(map(str, seeds_done)) or 'none'}."
        + ("" if wall is None else f" Wall time of this invocation: {wall / 60:.1f} min."),
        "",
        *([note, ""] if note else []),
        "Every cell trains on the regime's token budget T; S is the simulated time at which an "
        "asynchronous method has trained on T tokens (S = T / (b·Σ 1/p_i)). Losses are validation "
        "cross-entropy (nats/token, equal-weight mean over the 5 languages), read at the budget "
        "point (linear interpolation between evaluations) and as the mean of the loss curve over "
        "the last full cycle of the slowest worker (W = H·max p) before it. Improvements are "
        "(L_baseline − L_HeLoCo)/L_baseline per seed, then mean ± std over seeds. A verdict "
        "uses the best case over pace settings (and, for claim 1, over the three asynchronous "
        "DiLoCo baselines), as the abstract's 'up to' does: reproduced = at least half the "
        "claimed improvement and larger than its seed std; reversed = HeLoCo worse in every "
        "setting; otherwise not reproduced. The per-setting tables show every comparison.",
        "",
        "## Verdicts",
        "",
    ]
    regimes = sorted({r.regime for r in rows}, key=regime_rank)
    body = []
    for regime in regimes:
        for claim in CLAIMS:
            for reading, _ in READINGS:
                v = verdicts(rows, regime, claim, reading)
                body.append(
                    [
                        f"{claim.number}. {claim.text} (paper: {claim.claimed * 100:.1f}%)",
                        regime,
                        reading,
                        pct(v.best),
                        "-"
                        if v.setting == "-"
                        else f"{v.baseline} @ [{v.setting.replace('-', ', ')}]",
                        f"**{v.verdict}**" + (f" — {v.note}" if v.note else ""),
                    ]
                )
    lines += md_table(
        ["claim", "regime", "reading", "HeLoCo improvement (best case)", "where", "verdict"], body
    )
    if any(r.method == "heloco+ab" for r in rows):
        lines += [
            "The same claims with the new arrival-balanced HeLoCo (`heloco+ab`) in place of "
            "HeLoCo (claim 2 then compares with plain MLA):",
            "",
        ]
        body = []
        for regime in regimes:
            for claim in CLAIMS:
                v = verdicts(rows, regime, claim, "point", "heloco+ab")
                where = (
                    "-" if v.setting == "-" else f"{v.baseline} @ [{v.setting.replace('-', ', ')}]"
                )
                body.append([f"{claim.number}", regime, pct(v.best), where, f"**{v.verdict}**"])
        lines += md_table(
            ["claim", "regime", "heloco+ab improvement @ budget", "where", "verdict"], body
        )
    gen = generalisation_lines(rows, grid_rows) if grid_rows else []
    if gen:
        lines += [
            "## Do the grid's conclusions hold here?",
            "",
            "Each comparison's direction in the paper grid (the sign of its seed-mean "
            "improvement on every heterogeneous pace setting, budget point) against its "
            "seed-mean improvement on each setting of this run. Positive = the first method "
            "has the lower loss.",
            "",
            *gen,
        ]
    lines += ["## Validation loss per setting", "", *loss_tables(rows, methods)]
    var = variant_lines(rows)
    if var:
        lines += ["## Arrival-balanced variants (new; positive = the variant is better)", "", *var]
    lines += ["## Diagnostics", ""]
    for regime in regimes:
        why: dict[str, list[str]] = {}
        for claim in CLAIMS:
            v = verdicts(rows, regime, claim, "point")
            if v.verdict != "reproduced" and v.setting != "-":
                why.setdefault(v.setting, []).append(f"claim {claim.number} {v.verdict}")
        sev = label(SEVERE)
        if any(r.regime == regime and r.paces_label == sev for r in rows):
            why.setdefault(sev, []).append("severe heterogeneity")
        for setting, reasons in why.items():
            lines += [f"{regime}, [{setting.replace('-', ', ')}] ({'; '.join(reasons)}):", ""]
            lines += diagnostics(rows, regime, setting, methods)
    return "\n".join(lines) + "\n"


# -- payload rows -----------------------------------------------------------------------------
def payload_change(
    rows: Sequence[CellResult], method: str, payload: str, metric: str, ref: str = "fp32"
) -> Spread:
    """Per-seed loss change of ``method`` sending ``payload`` against its ``ref`` row,
    (L_payload − L_ref) / L_ref: positive when the payload costs loss."""
    by_seed: dict[str, dict[int, float]] = {payload: {}, ref: {}}
    for r in rows:
        if r.method == method and r.payload in by_seed:
            by_seed[r.payload][r.seed] = float(getattr(r, metric))
    seeds = sorted(set(by_seed[payload]) & set(by_seed[ref]))
    return spread(by_seed[payload][s] / by_seed[ref][s] - 1 for s in seeds)


def codec_lines(rows: Sequence[CellResult]) -> list[str]:
    """One table per (regime, paces): each method × payload, losses at T and S, change vs fp32."""
    lines: list[str] = []
    for (regime, paces, split), cell_rows in ordered_groups(rows):
        first = cell_rows[0]
        lines += [
            f"#### {regime}, paces [{paces.replace('-', ', ')}], split {split} — "
            f"T = {first.token_budget:,} tokens, S = {first.time_budget:,.1f} s simulated",
            "",
        ]
        body = []
        for method in CODEC_METHODS:
            for payload in CODEC_PAYLOADS:
                rs = [r for r in cell_rows if r.method == method and r.payload == payload]
                if not rs:
                    continue
                at_t = spread(r.loss_at_tokens for r in rs)
                at_s = spread(r.loss_at_time for r in rs)
                end = spread(r.sim_time for r in rs)
                changes = [
                    ""
                    if payload == "fp32"
                    else pct(payload_change(cell_rows, method, payload, metric))
                    for metric in ("loss_at_tokens", "loss_at_time")
                ]
                body.append(
                    [
                        method,
                        payload,
                        str(len(rs)),
                        at_t.fmt(),
                        at_s.fmt(),
                        *changes,
                        end.fmt(".1f"),
                        spread(r.updates for r in rs).fmt(".0f"),
                    ]
                )
        lines += md_table(
            [
                "method",
                "payload",
                "seeds",
                "loss @T",
                "loss @S",
                "vs fp32 @T",
                "vs fp32 @S",
                "sim time to T (s)",
                "updates",
            ],
            body,
        )
    return lines


def render_codecs(
    rows: Sequence[CellResult], expected: Sequence[Cell], command: str, wall: float | None
) -> str:
    """The payload rows' report: tables per setting and the quality factors they give."""
    from shardmeter.quality import quality_factors

    done = {(c.regime, c.paces_label, c.split.label, c.method, c.seed, c.payload) for c in expected}
    done &= {(r.regime, r.paces_label, r.split, r.method, r.seed, r.payload) for r in rows}
    lines = [
        "# HeLoCo on CPU: payload codecs against fp32",
        "",
        f"Generated {datetime.now(timezone.utc):%Y-%m-%d %H:%M} UTC by `{command}`.",
        "",
        f"Cells finished: {len(done)} of {len(expected)} planned."
        + ("" if wall is None else f" Wall time of this invocation: {wall / 60:.1f} min."),
        "",
        "Every row trains to the regime's token budget T over the same simulated link: a "
        "round costs (push + dispatch bytes) / bandwidth, whole wire messages, the bandwidth "
        f"making the fp32 round trip {CODEC_ROUND_TRIP:g} of a pace-1 round; θ goes down in "
        "fp32 whatever the payload. S = T / (b·Σ 1/p_i) as in the paper grid. Losses are "
        "validation cross-entropy (nats/token) at the budget point, mean ± std over seeds; "
        "'vs fp32' is (L − L_fp32)/L_fp32 per seed, positive = the payload costs loss.",
        "",
        *codec_lines(rows),
        "## Quality factors (shardmeter plan --quality-from)",
        "",
    ]
    for (regime, paces, split), _ in ordered_groups(rows):
        folder = _quality_folder(rows, regime, paces, split)
        if folder is None:
            continue
        try:
            q = quality_factors(folder)
        except UserInputError as exc:
            lines += [f"{regime}, [{paces}]: {exc}", ""]
            continue
        lines += [
            f"{regime}, [{paces.replace('-', ', ')}]: `--quality-from {folder.as_posix()}`, "
            f"target loss {q.target_loss:.4f} (the lowest every run reaches):",
            "",
        ]
        lines += md_table(
            ["method", "runs", "tokens to target", "q"],
            [
                [m.method, str(m.runs), f"{m.tokens_to_target:,.0f}", f"{m.factor:.3f}"]
                for m in q.methods
            ],
        )
    return "\n".join(lines) + "\n"


def _quality_folder(rows: Sequence[CellResult], regime: str, paces: str, split: str) -> Path | None:
    """The folder holding a setting's payload runs side by side (relative to the cwd when
    inside it), or None."""
    for r in rows:
        if (r.regime, r.paces_label, r.split) == (regime, paces, split) and r.run_dir:
            folder = Path(r.run_dir).parent
            try:
                return folder.resolve().relative_to(Path.cwd().resolve())
            except ValueError:
                return folder
    return None


def plot_codecs(rows: Sequence[CellResult], out_dir: Path, stem: str) -> list[Path]:
    """Loss change against fp32 (seed mean ± std) at T and at S per method × payload, one
    panel per regime."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    from heloco.report import save_figure

    regimes = sorted({r.regime for r in rows}, key=regime_rank)
    if not regimes:
        return []
    fig, axes = plt.subplots(1, len(regimes), figsize=(7 * len(regimes), 4.5), squeeze=False)
    shown = [p for p in CODEC_PAYLOADS if p != "fp32"]
    for ax, regime in zip(axes.flat, regimes, strict=True):
        groups = regime_groups(rows, regime)
        bars = [(method, budget) for method in CODEC_METHODS for budget in ("tokens", "time")]
        width = 0.8 / len(bars)
        for i, (method, budget) in enumerate(bars):
            xs, means, errs = [], [], []
            for g, (_, rs) in enumerate(groups):
                for j, payload in enumerate(shown):
                    ch = payload_change(rs, method, payload, metric_name("point", budget))
                    xs.append(g * len(shown) + j + (i - (len(bars) - 1) / 2) * width)
                    means.append(100 * ch.mean if ch.n else 0.0)
                    errs.append(100 * ch.std if ch.n else 0.0)
            name = f"{method} @{'T' if budget == 'tokens' else 'S'}"
            ax.bar(xs, means, width, yerr=errs, capsize=2, label=name)
        ticks = [
            f"{payload}\n[{paces.replace('-', ',')}]"
            for (_, paces, _), _ in groups
            for payload in shown
        ]
        ax.set_xticks(range(len(ticks)), ticks, fontsize=7)
        ax.axhline(0, color="black", lw=0.8)
        ax.set_yscale("symlog", linthresh=1.0)
        ax.set_title(regime)
        ax.set_ylabel("loss change vs fp32 (%, + = worse)")
        ax.grid(axis="y", alpha=0.3)
    axes.flat[0].legend(fontsize="x-small", loc="upper left")
    fig.tight_layout()
    paths = save_figure(fig, out_dir, stem)
    plt.close(fig)
    return paths


# -- plot -----------------------------------------------------------------------------------
PLOT_LIMIT = 12.0  # % ; bars beyond it are clipped and labelled with their value


def plot_improvements(rows: Sequence[CellResult], out_dir: Path, stem: str) -> list[Path]:
    """Seed-mean ± std improvement per setting (budget point), one panel per regime."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    from heloco.report import save_figure

    regimes = sorted({r.regime for r in rows}, key=regime_rank)
    if not regimes:
        return []
    fig, axes = plt.subplots(1, len(regimes), figsize=(7 * len(regimes), 4.5), squeeze=False)
    ran = {r.method for r in rows}
    drawn = [c for c in COMPARISONS if c[0] in ran and c[1] in ran]  # only what the rows hold
    width = 0.8 / max(len(drawn), 1)
    for ax, regime in zip(axes.flat, regimes, strict=True):
        groups = regime_groups(rows, regime)
        for i, (method, base, budget) in enumerate(drawn):
            imps = [
                paired_improvement(rs, method, base, metric_name("point", budget))
                for _, rs in groups
            ]
            xs = [g + (i - (len(drawn) - 1) / 2) * width for g in range(len(groups))]
            means = [100 * s.mean if s.n else 0.0 for s in imps]
            shown = [max(-PLOT_LIMIT, min(PLOT_LIMIT, m)) for m in means]
            clipped = [m != v for m, v in zip(means, shown, strict=True)]
            errs = [
                0.0 if c or not s.n else 100 * s.std for s, c in zip(imps, clipped, strict=True)
            ]
            label = comparison_name(method, base, budget)
            ax.bar(xs, shown, width, yerr=errs, capsize=2, label=label)
            for x, m, v, c in zip(xs, means, shown, clipped, strict=True):
                if c:
                    ax.annotate(
                        f"{m:.0f}%", (x, v), ha="center", va="bottom", rotation=90, fontsize=7
                    )
        labels = [f"[{paces.replace('-', ',')}]\n{split}" for (_, paces, split), _ in groups]
        ax.set_xticks(range(len(groups)), labels, fontsize=8)
        ax.axhline(0, color="black", lw=0.8)
        ax.set_ylim(-PLOT_LIMIT - 1, PLOT_LIMIT + 1)
        ax.set_title(regime)
        ax.set_ylabel("loss reduction at the budget (%)")
        ax.grid(axis="y", alpha=0.3)
    axes.flat[0].legend(fontsize="x-small", loc="lower left")
    fig.tight_layout()
    paths = save_figure(fig, out_dir, stem)
    plt.close(fig)
    return paths


# -- main -----------------------------------------------------------------------------------
def parse_args(argv: Sequence[str] | None) -> argparse.Namespace:
    p = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    p.add_argument("--regime", default=",".join(REGIMES), help="comma list of presets")
    p.add_argument("--paces", help="';'-separated pace groups (default: the paper's four)")
    p.add_argument("--methods", help="comma list (default: all ten)")
    p.add_argument("--seeds", help="comma list (default 0,1,2; --quick 0)")
    p.add_argument("--quick", action="store_true", help=f"1 seed, 1/{QUICK_DIVISOR} of the steps")
    p.add_argument("--check", action="store_true", help="generalisation settings instead")
    p.add_argument("--codecs", action="store_true", help="payload codecs against fp32 instead")
    p.add_argument("--jobs", type=int, default=2, help="parallel processes (1 torch thread each)")
    p.add_argument("--executor", choices=EXECUTORS, default="local", help="local processes, or Ray")
    p.add_argument("--ray-address", help="a running Ray cluster (default: a local Ray)")
    p.add_argument(
        "--batch-cells",
        type=int,
        help="cells of one setting simulated side by side per task (default: one per method)",
    )
    p.add_argument(
        "--no-batch", action="store_true", help="every round on its own (same losses, slower)"
    )
    p.add_argument("--device", default="cpu", help="torch device of every cell (cpu, cuda)")
    p.add_argument("--out", type=Path, help="results folder (default benchmarks/results/...)")
    p.add_argument("--markdown", type=Path, help="markdown file (default <out>/../<name>.md)")
    p.add_argument("--data-dir", type=Path, help="corpus (default: shared data/multilingual)")
    p.add_argument("--report-only", action="store_true", help="only rewrite the tables")
    p.add_argument(
        "--note", default="", help="'What ran: ...' for the header (--report-only keeps the old)"
    )
    return p.parse_args(argv)


def main(argv: Sequence[str] | None = None) -> int:
    args = parse_args(argv)
    t0 = time.perf_counter()
    data_dir = args.data_dir or shared_path("data", "multilingual")
    if data_dir is None:
        print(missing_shared_reason("data", "multilingual"), file=sys.stderr)
        return 2
    check_device(args.device)
    regimes = [r for r in args.regime.split(",") if r]
    for r in regimes:
        load_config(preset=r)
    if args.check and args.codecs:
        raise UserInputError("--codecs", "with --check", "one of --check or --codecs")
    kind = "_check" if args.check else "_codecs" if args.codecs else ""
    name = "heloco_paper" + kind + ("_quick" if args.quick else "")
    here = Path(__file__).resolve().parent / "results"
    out = args.out or here / name
    markdown = args.markdown or out.parent / f"{name}.md"
    payloads = [""]
    if args.check:
        settings = list(CHECK_SETTINGS)
        methods = list(CHECK_METHODS)
        seeds = list(CHECK_SEEDS)
    elif args.codecs:
        settings = [(p, Split()) for p in CODEC_PACES]
        methods, seeds, payloads = list(CODEC_METHODS), list(SEEDS), list(CODEC_PAYLOADS)
    else:
        settings = [(p, Split()) for p in PACES]
        methods, seeds = list(METHODS), list(SEEDS)
    if args.paces:
        settings = [(p, s) for p in parse_paces_list(args.paces) for s in {s for _, s in settings}]
    if args.methods:
        methods = [m for m in args.methods.split(",") if m]
    if args.quick:
        seeds = [0]
    if args.seeds:
        seeds = [int(s) for s in args.seeds.split(",") if s]
    cells = build_cells(regimes, settings, methods, seeds, payloads)
    payload_extra: dict[str, dict[str, dict[str, object]]] = {}
    if args.codecs:
        links = {(len(p), min(p)) for p, _ in settings}
        if len(links) != 1:
            raise UserInputError("--paces", args.paces, "one worker count and fastest pace")
        paces = settings[0][0]
        payload_extra = {r: payload_overrides(r, data_dir, paces, payloads) for r in regimes}
    given = list(sys.argv[1:] if argv is None else argv)
    if "--note" in given:  # the note is printed on its own line
        i = given.index("--note")
        del given[i : i + 2]
    command = " ".join(["python benchmarks/heloco_paper.py", *given])
    if not args.report_only:
        regime_extra = {r: quick_overrides(r) for r in regimes} if args.quick else {}
        print(f"{len(cells)} cells ({len(regimes)} regimes) -> {out}", flush=True)
        extra: dict[str, object] = {"device": args.device}
        if args.no_batch:
            extra["batch"] = "off"
        grid = GridRun(
            out_root=out,
            data_dir=data_dir,
            jobs=args.jobs,
            extra=extra,
            regime_extra=regime_extra,
            payload_extra=payload_extra,
            batch_cells=1 if args.no_batch else (args.batch_cells or len(methods)),
            executor=args.executor,
            ray_address=args.ray_address,
        )
        done = [0]

        def on_result(cell: Cell, outcome: CellResult | str, cached: bool) -> None:
            report(cell, outcome, cached)
            done[0] += 1
            if not cached and done[0] % 6 == 0 and not args.codecs:  # refresh now and then
                rows = read_results(out)
                text = render_markdown(rows, cells, _title(args), command, None)
                atomic_write_text(markdown, text)

        report = _progress(t0, len(cells))
        run_grid(cells, grid, on_result=on_result)
    rows = finished_rows(out)
    if args.codecs:
        wall = None if args.report_only else time.perf_counter() - t0
        text = render_codecs(rows, cells, command, wall)
        atomic_write_text(markdown, text)
        plots = plot_codecs(rows, markdown.parent, markdown.stem)
        print(text)
        print(f"results: {out}  markdown: {markdown}  plots: {', '.join(map(str, plots))}")
        return 0
    grid_rows = finished_rows(here / "heloco_paper") if args.check else []
    note = args.note or (previous_note(markdown) if args.report_only else "")
    text = render_markdown(
        rows,
        cells,
        _title(args),
        command,
        None if args.report_only else time.perf_counter() - t0,
        note,
        grid_rows,
    )
    atomic_write_text(markdown, text)
    plots = plot_improvements(rows, markdown.parent, markdown.stem)
    print(text)
    print(
        f"results: {out}  markdown: {markdown}  plots: {', '.join(map(str, plots))}",
        file=sys.stderr,
    )
    return 0


def finished_rows(folder: Path) -> list[CellResult]:
    """The finished cells of a results folder: its ``runs/`` cell files, or, where ``runs/`` is
    absent (a fresh clone holds only the committed ``results.jsonl``), that file's rows."""
    if (folder / "runs").is_dir():
        return read_results(folder)
    jsonl = folder / "results.jsonl"
    if not jsonl.is_file():
        return []
    lines = jsonl.read_text(encoding="utf-8").splitlines()
    return [CellResult(**json.loads(line)) for line in lines if line.strip()]


def previous_note(markdown: Path) -> str:
    """The 'What ran:' paragraph of an earlier report, kept by --report-only."""
    if not markdown.exists():
        return ""
    lines = markdown.read_text(encoding="utf-8").splitlines()
    return next((line for line in lines if line.startswith("What ran:")), "")


def quick_overrides(regime: str) -> dict[str, object]:
    """1/QUICK_DIVISOR of the regime's token budget (evaluations scaled alike)."""
    cfg = load_config(preset=regime)
    assert cfg.token_budget is not None
    return {
        "token_budget": cfg.token_budget // QUICK_DIVISOR,
        "eval_every": max(1, cfg.eval_every // QUICK_DIVISOR),
    }


def _title(args: argparse.Namespace) -> str:
    kind = "generalisation check" if args.check else "paper claims"
    return f"HeLoCo on CPU: {kind}" + (" (quick: 1/4 of the steps, 1 seed)" if args.quick else "")


def _progress(t0: float, total: int):  # type: ignore[no-untyped-def]
    count = [0]

    def report(cell: Cell, outcome: CellResult | str, cached: bool) -> None:
        count[0] += 1
        stamp = f"[{count[0]}/{total} {time.perf_counter() - t0:,.0f}s]"
        if isinstance(outcome, str):
            print(f"{stamp} FAILED {cell.key}: {outcome}", flush=True)
        elif not cached:
            print(
                f"{stamp} {cell.key}: loss@T {outcome.loss_at_tokens:.4f} "
                f"@S {outcome.loss_at_time:.4f} ({outcome.wall_seconds:.0f} s)",
                flush=True,
            )

    return report


if __name__ == "__main__":
    try:
        raise SystemExit(main())
    except UserInputError as exc:
        print(f"heloco_paper: error: {exc}", file=sys.stderr)
        raise SystemExit(2) from None
