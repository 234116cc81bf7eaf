"""`--quality-from RUN_DIR` for `shardmeter predict --topology` and `shardmeter plan`: the
flags, reading them into quality factors, and what the commands print (the JSON view from
`shardmeter.quality`, the table from `shardmeter.report.quality`)."""

from __future__ import annotations

import argparse
import math
from typing import Any

from shardmeter.clikit import positive_float
from shardmeter.errors import UserInputError
from shardmeter.quality import (
    DEFAULT_ASYNC_METHOD,
    QualityFactors,
    RankedPlan,
    payload_spec,
    quality_factors,
    ranked_json,
    topology_payload,
)
from shardmeter.report.quality import render_ranked
from shardmeter.search.to_target import plan_to_target
from shardmeter.specs.topology import PayloadSpec

__all__ = ["add_arguments", "apply", "from_args", "rank_from_args", "ranked_json", "render_ranked"]


def add_arguments(parser: argparse.ArgumentParser) -> None:
    """Flags that read the quality factor from HeLoCo runs."""
    group = parser.add_argument_group("quality factor from HeLoCo runs")
    group.add_argument(
        "--quality-from",
        metavar="RUN_DIR",
        help="HeLoCo run folder (or folder of runs incl. a 'sync' one): q = tokens to the "
        "target loss relative to the sync run",
    )
    group.add_argument(
        "--quality-method",
        metavar="METHOD",
        help=f"HeLoCo method whose q applies to async plans (default: {DEFAULT_ASYNC_METHOD}); "
        "synchronous modes use the sync run (q = 1)",
    )
    group.add_argument(
        "--target-loss",
        type=positive_float,
        help="validation loss (nats/token) the runs race to (default: lowest all reach)",
    )


def from_args(args: argparse.Namespace) -> QualityFactors | None:
    """The quality factors named by `--quality-from`, or None without it."""
    source = getattr(args, "quality_from", None)
    if source is None:
        for flag in ("quality_method", "target_loss"):
            if getattr(args, flag, None) is not None:
                raise UserInputError(
                    f"--{flag.replace('_', '-')}", getattr(args, flag), "needs --quality-from"
                )
        return None
    return quality_factors(source, getattr(args, "target_loss", None))


def apply(args: argparse.Namespace) -> QualityFactors | None:
    """`shardmeter predict --topology`: set `args.quality_factor` from `--quality-from` for
    the run's outer mode (`--mode`, else the topology file's). Returns the factors used."""
    quality = from_args(args)
    if quality is None:
        return None
    if getattr(args, "quality_factor", None) is not None:
        raise UserInputError("--quality-factor", args.quality_factor, "not with --quality-from")
    mode = getattr(args, "mode", None)
    if mode is None and getattr(args, "topology", None) is not None:
        from shardmeter.specs.topology import load_topology

        mode = load_topology(args.topology).run.mode
    payload = getattr(args, "payload", None)
    if payload is None and getattr(args, "topology", None) is not None:
        spec: PayloadSpec | None = topology_payload(args.topology)
    else:
        spec = payload_spec(payload) if isinstance(payload, str) else None
    q = quality.for_mode(mode or "single", getattr(args, "quality_method", None), spec)
    if not math.isfinite(q):
        raise UserInputError(
            "--target-loss", quality.target_loss, "the chosen method never reaches it"
        )
    args.quality_factor = q
    return quality


def rank_from_args(
    args: argparse.Namespace, top_k: int = 20, **plan_kwargs: Any
) -> list[RankedPlan]:
    """`shardmeter plan --quality-from`: `plan_to_target` with the plan call's keyword
    arguments (empty without the flag); the factors used are left on `args.quality`."""
    quality = from_args(args)
    if quality is None:
        return []
    args.quality = quality
    return plan_to_target(quality, getattr(args, "quality_method", None), top_k, **plan_kwargs)
