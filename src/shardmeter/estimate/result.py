"""Estimate objects: what one island's training step costs, and why.

`StepArrays` is the vectorized form (every field an array over plans, broadcastable);
`StepEstimate` is one plan's view of it. Times in seconds, memory in bytes, rates per second.
"""

from __future__ import annotations

from dataclasses import dataclass, field

import numpy as np
from numpy.typing import NDArray

FloatArray = NDArray[np.float64]

# Names of the step-time components, in report order. Each is exposed (not hidden) time.
TIME_COMPONENTS: tuple[str, ...] = (
    "compute",  # forward + backward GEMMs, attention and element-wise ops
    "recompute",  # forward re-run under activation recomputation, or activations offloaded to host
    "optimizer",  # optimizer step (memory bound)
    "bubble",  # pipeline fill/drain
    "tp_comm",  # exposed tensor/sequence-parallel collectives
    "pp_comm",  # exposed pipeline point-to-point
    "dp_comm",  # exposed data-parallel gradient reduce (incl. ZeRO reduce-scatter)
    "fsdp_comm",  # exposed ZeRO/FSDP parameter all-gathers
    "cp_comm",  # exposed context-parallel ring exchange
    "ep_comm",  # exposed expert-parallel all-to-all
)

# The three answers to "how much memory" and the terms between them (bytes per GPU):
# allocated (torch.cuda.max_memory_allocated: the five tensor components), reserved (+ the
# caching allocator's fragmentation), device total (= memory_bytes: + CUDA context + NCCL
# buffers; what decides an OOM); host: offloaded or paged states, not on the GPU.
MEMORY_KINDS: tuple[str, ...] = (
    "allocated", "reserved", "fragmentation", "cuda_context", "nccl_buffers", "host",
)  # fmt: skip

MEMORY_COMPONENTS: tuple[str, ...] = (
    "weights",
    "gradients",
    "optimizer_states",
    "activations",
    "buffers",  # FSDP gather buffers, communication buckets, logits
    "overhead",  # CUDA context, NCCL, allocator fragmentation
)


@dataclass(frozen=True)
class StepArrays:
    """Vectorized estimate: each array has the broadcast shape of the plans evaluated."""

    time: dict[str, FloatArray]  # component name (TIME_COMPONENTS) -> exposed seconds
    memory: dict[str, FloatArray]  # component name (MEMORY_COMPONENTS) -> bytes per GPU
    step_time_s: FloatArray
    tokens_per_step: FloatArray  # global batch × sequence length
    n_gpus: FloatArray
    model_flops_per_step: FloatArray  # 6N-style model FLOPs (no recompute)
    hardware_flops_per_step: FloatArray  # including recompute
    peak_flops_per_gpu: FloatArray  # FLOP/s at the plan's precision
    hbm_bytes: FloatArray  # capacity per GPU
    comm_bytes: dict[str, FloatArray] = field(
        default_factory=dict
    )  # per-GPU bytes per step by kind
    # Backward (incl. recompute) of the step's last micro-batch, seconds: the window a gradient
    # exchange issued bucket by bucket during that backward can hide behind (C.7).
    backward_window_s: FloatArray | None = None
    # MEMORY_KINDS -> bytes per GPU: allocated, reserved and the overhead's terms
    memory_detail: dict[str, FloatArray] = field(default_factory=dict)
    # *_comm components -> seconds each collective runs hidden under compute (not in the step)
    hidden: dict[str, FloatArray] = field(default_factory=dict)

    @property
    def tokens_per_s(self) -> FloatArray:
        """Training throughput of the whole job, tokens/s."""
        return self.tokens_per_step / self.step_time_s

    @property
    def tokens_per_s_per_gpu(self) -> FloatArray:
        """Throughput per GPU, tokens/s."""
        return self.tokens_per_s / self.n_gpus

    @property
    def mfu(self) -> FloatArray:
        """Model FLOPs utilization (fraction): model FLOP / (step s × GPUs × peak FLOP/s),
        PaLM (Chowdhery et al. 2022, Sec. 4.1), without recompute."""
        return self.model_flops_per_step / (
            self.step_time_s * self.n_gpus * self.peak_flops_per_gpu
        )

    @property
    def hfu(self) -> FloatArray:
        """Hardware FLOPs utilization (fraction): as `mfu` but counting recomputed FLOP
        (PaLM, Chowdhery et al. 2022, Sec. 4.1)."""
        return self.hardware_flops_per_step / (
            self.step_time_s * self.n_gpus * self.peak_flops_per_gpu
        )

    @property
    def memory_bytes(self) -> FloatArray:
        """Peak memory per GPU, bytes: the sum of the MEMORY_COMPONENTS."""
        return sum(self.memory.values(), start=np.zeros_like(self.step_time_s))

    @property
    def fits(self) -> NDArray[np.bool_]:
        """True where the peak memory per GPU is within its HBM capacity."""
        return self.memory_bytes <= self.hbm_bytes


@dataclass(frozen=True)
class StepEstimate:
    """One plan on one island: step time with its breakdown, throughput, memory, verdicts."""

    step_time_s: float
    time_breakdown: dict[str, float]  # TIME_COMPONENTS -> exposed seconds
    memory_breakdown: dict[str, float]  # MEMORY_COMPONENTS -> bytes per GPU
    tokens_per_step: float
    n_gpus: int
    tokens_per_s: float
    tokens_per_s_per_gpu: float
    mfu: float
    hfu: float
    memory_bytes: float
    hbm_bytes: float
    fits: bool
    bottleneck: str  # the largest non-compute component, or "compute"
    regime: str  # "compute-bound" or "communication-bound (<link>)"
    comm_bytes: dict[str, float] = field(default_factory=dict)
    backward_window_s: float = 0.0  # last micro-batch's backward + recompute, seconds
    memory_detail: dict[str, float] = field(default_factory=dict)  # MEMORY_KINDS -> bytes
    time_hidden: dict[str, float] = field(default_factory=dict)  # *_comm -> seconds hidden

    @property
    def memory_allocated_bytes(self) -> float:
        """Peak allocated bytes per GPU (`torch.cuda.max_memory_allocated`)."""
        return self.memory_detail.get("allocated", self.memory_bytes)

    @property
    def memory_reserved_bytes(self) -> float:
        """Peak reserved bytes per GPU (`torch.cuda.max_memory_reserved`)."""
        return self.memory_detail.get("reserved", self.memory_bytes)

    @property
    def memory_total_bytes(self) -> float:
        """Device total per GPU (reserved + CUDA context + NCCL buffers): the OOM verdict."""
        return self.memory_bytes

    @property
    def memory_headroom_bytes(self) -> float:
        """HBM left per GPU at peak, bytes (negative when the plan does not fit)."""
        return self.hbm_bytes - self.memory_bytes
