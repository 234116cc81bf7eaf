"""`heloco simulate [--config CONFIG.toml]`: one simulated run (real training, simulated clock).

Without CONFIG it runs the ``default`` preset (built-in synthetic corpus, tiny model, well
under a minute on 2 cores). Every config key can be overridden: the common ones have flags,
any other with ``--set key=value`` (dotted for tables: ``--set inner.lr=1e-3``).
"""

from __future__ import annotations

import argparse
import json
import sys
from typing import Any

from rich.console import Console
from rich.progress import BarColumn, MofNCompleteColumn, Progress, TextColumn, TimeElapsedColumn
from rich.table import Table

from heloco import runfolder
from heloco import topology as topology_flags
from heloco.cli.common import (
    add_config_args,
    add_out,
    add_overwrite,
    load_run_config,
    parse_paces,
    set_overrides,
)
from heloco.config import (
    RunConfig,
    atomic_write_text,
    config_to_toml,
)
from heloco.metrics import EvalPoint
from heloco.outer import resolve_method
from heloco.outer.registry import method_names
from heloco.sim import RunResult, run_simulation
from shardmeter.clikit import nonneg_int, positive_float, positive_int
from shardmeter.report.terminal import add_wide_flag, console_for, key_value_table, si, sig3

# flag dest -> dotted config key
FLAG_KEYS: dict[str, str] = {
    "method": "method",
    "workers": "workers",
    "paces": "paces",
    "inner_steps": "inner_steps",
    "data_dir": "data.data_dir",
    "assignment": "data.assignment",
    "dirichlet_alpha": "data.dirichlet_alpha",
    "tokenizer": "data.tokenizer",
    "seed": "seed",
    "token_budget": "token_budget",
    "time_budget": "time_budget",
    "model": "model",
    "eval_every": "eval_every",
    "out": "out_dir",
    "outer_lr": "outer.lr",
    "threads": "threads",
    "batch": "batch",
    "payload": "payload",
    "exchange": "exchange",
    "fragments": "fragments",
}


def add_parser(sub: Any) -> None:
    p = sub.add_parser(
        "simulate",
        help="simulate asynchronous training with heterogeneous workers",
        description="Train for real on a simulated clock: workers with per-step paces, "
        "arrivals in finish-time order. Writes events.jsonl, summary.json and config.toml "
        "to --out (read them with `heloco report`).",
    )
    add_config_args(p)
    p.add_argument("--method", help="one of " + ", ".join(method_names()))
    p.add_argument("--workers", type=positive_int, help="number of workers K")
    p.add_argument("--paces", help="seconds per inner step per worker, e.g. 1,1,1,2,2")
    p.add_argument("--inner-steps", type=positive_int, help="inner steps per round H")
    p.add_argument("--data-dir", help="folder of per-language xx.txt / xx.jsonl files")
    p.add_argument("--assignment", help="language | dirichlet | iid")
    p.add_argument(
        "--dirichlet-alpha", type=positive_float, help="concentration of the Dirichlet split"
    )
    p.add_argument("--tokenizer", help="byte | bpe")
    p.add_argument("--seed", type=int, help="everything random derives from it (0 to 2**63 - 1)")
    p.add_argument("--token-budget", type=positive_int, help="stop after this many training tokens")
    p.add_argument(
        "--time-budget", type=positive_float, help="stop at this simulated time (seconds)"
    )
    p.add_argument("--model", help="model preset: tiny, small, paper, ...")
    p.add_argument("--eval-every", type=nonneg_int, help="training tokens between evaluations")
    p.add_argument("--outer-lr", type=positive_float, help="outer learning rate (default: Table 3)")
    add_out(p, "run folder for events.jsonl, summary.json, config.toml (default: none)")
    add_overwrite(p)
    p.add_argument(
        "--threads",
        type=positive_int,
        help="torch threads, the config key `threads` (default 1: these small models gain "
        "little from intra-op threads; the losses depend on the count)",
    )
    p.add_argument(
        "--no-batch",
        dest="batch",
        action="store_const",
        const="off",
        help="compute one round at a time (the key `batch`; default auto: rounds in flight "
        "together run in one batched kernel, with the same losses)",
    )
    p.add_argument(
        "--payload",
        metavar="KIND[:KEY=VALUE,...]",
        help="what each worker sends, as `shardmeter plan --payload`: dense, "
        "topk:fraction=0.01, sign (error feedback per worker; docs/network.md)",
    )
    p.add_argument(
        "--exchange",
        choices=("blocking", "overlapped", "streaming"),
        help="blocking (default): push, pull, then train; overlapped: push and pull in the "
        "background while the next round trains; streaming: one of --fragments fragments every "
        "H/P steps, in the background (the key `exchange`; docs/wan.md)",
    )
    p.add_argument(
        "--fragments",
        type=int,
        metavar="P",
        help="streaming: fragments of the model, one pushed every H/P steps (the key `fragments`)",
    )
    p.add_argument("--print-config", action="store_true", help="print the TOML and exit")
    p.add_argument("--json", action="store_true", help="print the summary as JSON")
    p.add_argument("--quiet", action="store_true", help="no progress bar")
    add_wide_flag(p)
    topology_flags.add_arguments(p)


def overrides_from_args(args: argparse.Namespace) -> dict[str, Any]:
    """Dotted-key overrides: ``--set`` items first, dedicated flags win over them."""
    out: dict[str, Any] = set_overrides(args)
    for dest, key in FLAG_KEYS.items():
        value = getattr(args, dest, None)
        if value is None:
            continue
        if dest == "method":
            resolve_method(value)
        if dest == "paces":
            value = parse_paces(value)
        out[key] = value
    return out


def build_config(args: argparse.Namespace) -> RunConfig:
    overrides = topology_flags.apply(args, overrides_from_args(args))
    return load_run_config(args, overrides)


def run(args: argparse.Namespace) -> int:
    cfg = build_config(args)
    if args.print_config:
        sys.stdout.write(config_to_toml(cfg))
        return 0
    if cfg.out_dir is not None:
        runfolder.prepare("--out", cfg.out_dir, args.overwrite)
        cfg.out_dir.mkdir(parents=True, exist_ok=True)
        atomic_write_text(cfg.out_dir / "config.toml", config_to_toml(cfg))
        topology_flags.record(args, cfg.out_dir)
    result = run_with_progress(cfg, quiet=args.quiet or args.json)
    if args.json:
        print(json.dumps(summary_dict(result), indent=2))
    else:
        console_for(sys.stdout.isatty(), args.wide).print(summary_table(result))
    return 0


def run_with_progress(cfg: RunConfig, quiet: bool = False) -> RunResult:
    """Run with a rich progress bar over the token (or time) budget. The bar appears at the
    first evaluation, so errors while building data or model stay one line."""
    if quiet:
        return run_simulation(cfg)
    by_tokens = cfg.token_budget is not None
    budget = cfg.token_budget if cfg.token_budget is not None else cfg.time_budget
    total = float(budget or 1.0)
    done_col = (
        MofNCompleteColumn() if by_tokens else TextColumn("{task.completed:.0f}/{task.total:.0f} s")
    )
    bar = Progress(
        TextColumn(f"[bold]{cfg.method}[/]"),
        BarColumn(),
        done_col,
        TextColumn("loss {task.fields[loss]}"),
        TimeElapsedColumn(),
        console=Console(stderr=True),
    )
    task = bar.add_task("run", total=total, loss="-")

    def progress(point: EvalPoint) -> None:
        if not bar.live.is_started:
            bar.start()
        done = point.tokens if by_tokens else point.time
        bar.update(task, completed=min(float(done), total), loss=f"{point.loss:.4f}")

    try:
        result = run_simulation(cfg, progress)
        bar.update(task, completed=total)
    finally:
        if bar.live.is_started:
            bar.stop()
    return result


def summary_dict(result: RunResult) -> dict[str, Any]:
    s = result.summary
    return {
        "method": s.method,
        "final_loss": s.final_loss,
        "initial_loss": result.evals[0].loss if result.evals else None,
        "loss_at_token_budget": s.loss_at_token_budget,
        "loss_at_time_budget": s.loss_at_time_budget,
        "cycle_loss": s.cycle_loss,
        "per_language": s.final_per_language,
        "tokens": s.tokens,
        "simulated_seconds": s.time,
        "updates": s.updates,
        "wall_seconds": s.wall_seconds,
        "train_tokens_per_second": s.train_tokens_per_second,
        "worker_shares": s.worker_shares,
        "staleness_mean": s.staleness_mean,
        "goodput": s.goodput,
        "out_dir": None if result.config.out_dir is None else str(result.config.out_dir),
    }


def _fmt(x: float | None, spec: str = ".4f") -> str:
    return "-" if x is None else format(x, spec)


def summary_table(result: RunResult) -> Table:
    """A two-column table of the run's headline numbers."""
    s = result.summary
    first = result.evals[0].loss if result.evals else None
    rows = [
        ("validation loss (start -> end)", f"{_fmt(first)} -> {_fmt(s.final_loss)}"),
        ("mean over the last slowest-worker cycle", _fmt(s.cycle_loss)),
        *((f"  {lang}", _fmt(loss)) for lang, loss in sorted(s.final_per_language.items())),
        ("training tokens", f"{s.tokens:,}"),
        ("simulated time", f"{s.time:,.0f} s"),
        ("outer updates", f"{s.updates:,}"),
        ("worker paces (s/step)", ", ".join(sig3(p) for p in s.paces)),
        ("arrival share per worker", ", ".join(f"{x:.2f}" for x in s.worker_shares)),
        (
            "mean staleness per worker",
            ", ".join("-" if x is None else f"{x:.1f}" for x in s.staleness_mean),
        ),
        ("wall time", f"{s.wall_seconds:.1f} s ({si(s.train_tokens_per_second)} tok/s)"),
    ]
    if result.config.out_dir is not None:
        rows.append(("run folder", str(result.config.out_dir)))
    return key_value_table(f"heloco simulate: {s.method}, {s.n_workers} workers", rows)
