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

# Each memory flag once: plan field -> (kind, help). The kind is the field's Literal type (its
# values become the choices), `bool` (an on/off pair, --x / --no-x) or `positive_int`. The
# order is the --help order.
MEMORY_FLAGS: dict[str, tuple[Any, str]] = {
    "optimizer": (
        Optimizer, "optimizer whose states are kept (default adamw; paged_*: bitsandbytes paged)"
    ),
    "master_weights": (
        MasterWeights, "fp32 master copy (default), 16-bit remainder, or none (pure bf16)"
    ),
    "offload": (
        Offload, "keep the optimizer states (and the weights and gradients) in host memory"
    ),
    "fp8_recipe": (Fp8Recipe, "FP8 library: te saves 1-byte GEMM inputs, torchao saves bf16"),
    "reshard_after_forward": (bool, "FSDP frees gathered weights after forward (default yes)"),
    "recompute_every": (
        positive_int, "with --recompute full: checkpoint only every N-th layer (torchtitan's 'N')"
    ),
    "fused_ce": (bool, "fused or chunked cross-entropy: no fp32 copy of the logits"),
    "selective_policy": (
        SelectivePolicy,
        "what --recompute selective keeps: megatron's set or torchtitan's per-op policy",
    ),
    "ce_upcast": (
        CeUpcast, "the loss upcasts the logits to fp32: eager (12 B per logit) or compiled (4 B)"
    ),
    "grad_accum_dtype": (
        GradAccumDtype, "gradient buffer dtype: fp32 is Megatron's main_grad (4 B per parameter)"
    ),
    "optimizer_in_backward": (
        bool, "optimizer step fused into backward: one gradient live at a time (torchtune)"
    ),
    "sp_gathered_inputs": (
        bool, "with SP the GEMMs save their all-gathered input (DTensor SP, torchtitan)"
    ),
    "pp_keeps_outputs": (
        bool, "with PP each stage keeps its output per micro-batch (torch pipelining)"
    ),
    "offload_activations": (
        bool, "kept activations go to host memory and back (MaxText minimal_offloaded)"
    ),
}  # fmt: skip


def add_memory_flags(parser: argparse.ArgumentParser) -> None:
    """The memory-setup group, one flag per MEMORY_FLAGS entry, so that a flag's name, kind
    and help are written once and `memory_fields` reads the same names; each flag left out
    keeps the plan's (or framework's) value."""
    group = parser.add_argument_group("memory setup (docs/memory.md)")
    for name, (kind, text) in MEMORY_FLAGS.items():
        flag = f"--{name.replace('_', '-')}"
        if kind is bool:
            group.add_argument(flag, action=argparse.BooleanOptionalAction, default=None, help=text)
        elif kind is positive_int:
            group.add_argument(flag, type=positive_int, metavar="N", help=text)
        else:
            group.add_argument(flag, choices=get_args(kind), help=text)


def memory_fields(args: argparse.Namespace) -> dict[str, Any]:
    """The memory-setup plan fields the user stated."""
    return {
        name: getattr(args, name) for name in MEMORY_FLAGS if getattr(args, name, None) is not None
    }
