"""Plan flags of the memory setups (optimizer, master weights, offload, FP8 recipe, FSDP
resharding, fused or fp32-upcast cross-entropy, what selective recompute keeps), shared by
`predict` and `fit`."""

from __future__ import annotations

import argparse
from typing import Any, get_args

from shardmeter.clikit import positive_int
from shardmeter.specs.framework import MasterWeights
from shardmeter.specs.plan import (
    CeUpcast,
    Fp8Recipe,
    GradAccumDtype,
    Offload,
    Optimizer,
    SelectivePolicy,
)

MEMORY_FLAGS = (
    "optimizer", "master_weights", "offload", "fp8_recipe", "reshard_after_forward", "fused_ce",
    "recompute_every", "selective_policy", "ce_upcast", "grad_accum_dtype",
    "optimizer_in_backward", "sp_gathered_inputs", "pp_keeps_outputs", "offload_activations",
)  # fmt: skip


def add_memory_flags(parser: argparse.ArgumentParser) -> None:
    """The memory-setup group; each flag left out keeps the plan's (or framework's) value."""
    group = parser.add_argument_group("memory setup (docs/memory.md)")
    group.add_argument(
        "--optimizer", choices=get_args(Optimizer),
        help="optimizer whose states are kept (default adamw; paged_*: bitsandbytes paged)",
    )  # fmt: skip
    group.add_argument(
        "--master-weights", choices=get_args(MasterWeights),
        help="fp32 master copy (default), 16-bit remainder, or none (pure bf16)",
    )  # fmt: skip
    group.add_argument(
        "--offload", choices=get_args(Offload),
        help="keep the optimizer states (and the weights and gradients) in host memory",
    )  # fmt: skip
    group.add_argument(
        "--fp8-recipe", choices=get_args(Fp8Recipe),
        help="FP8 library: te saves 1-byte GEMM inputs, torchao saves bf16",
    )  # fmt: skip
    group.add_argument(
        "--reshard-after-forward", action=argparse.BooleanOptionalAction, default=None,
        help="FSDP frees gathered weights after forward (default yes)",
    )  # fmt: skip
    group.add_argument(
        "--recompute-every", type=positive_int, metavar="N",
        help="with --recompute full: checkpoint only every N-th layer (torchtitan's 'N')",
    )  # fmt: skip
    group.add_argument(
        "--fused-ce", action=argparse.BooleanOptionalAction, default=None,
        help="fused or chunked cross-entropy: no fp32 copy of the logits",
    )  # fmt: skip
    group.add_argument(
        "--selective-policy", choices=get_args(SelectivePolicy),
        help="what --recompute selective keeps: megatron's set or torchtitan's per-op policy",
    )  # fmt: skip
    group.add_argument(
        "--ce-upcast", choices=get_args(CeUpcast),
        help="the loss upcasts the logits to fp32: eager (12 B per logit) or compiled (4 B)",
    )  # fmt: skip
    group.add_argument(
        "--grad-accum-dtype", choices=get_args(GradAccumDtype),
        help="gradient buffer dtype: fp32 is Megatron's main_grad (4 B per parameter)",
    )  # fmt: skip
    group.add_argument(
        "--optimizer-in-backward", action=argparse.BooleanOptionalAction, default=None,
        help="optimizer step fused into backward: one gradient live at a time (torchtune)",
    )  # fmt: skip
    group.add_argument(
        "--sp-gathered-inputs", action=argparse.BooleanOptionalAction, default=None,
        help="with SP the GEMMs save their all-gathered input (DTensor SP, torchtitan)",
    )  # fmt: skip
    group.add_argument(
        "--pp-keeps-outputs", action=argparse.BooleanOptionalAction, default=None,
        help="with PP each stage keeps its output per micro-batch (torch pipelining)",
    )  # fmt: skip
    group.add_argument(
        "--offload-activations", action=argparse.BooleanOptionalAction, default=None,
        help="kept activations go to host memory and back (MaxText minimal_offloaded)",
    )  # fmt: skip


def memory_fields(args: argparse.Namespace) -> dict[str, Any]:
    """The memory-setup plan fields the user stated."""
    return {
        name: getattr(args, name) for name in MEMORY_FLAGS if getattr(args, name, None) is not None
    }
