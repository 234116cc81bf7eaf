"""Accelerators, links and clusters: peak rates, capacities and calibrated efficiencies.

Units: FLOP/s in TFLOP/s (1e12), memory in GB (1e9 bytes), bandwidths in GB/s (1e9 bytes/s)
per GPU and per direction, latencies in microseconds.
"""

from __future__ import annotations

from typing import Literal

from pydantic import BaseModel, ConfigDict, Field, model_validator

from shardmeter.errors import UserInputError

Dtype = Literal["fp32", "tf32", "bf16", "fp16", "fp8"]


class Efficiency(BaseModel):
    """Calibrated, physically meaningful efficiencies of one accelerator (fitted, not per row).

    Matmul efficiency rises with op size: eta(F) = matmul_max · F / (F + matmul_half_gflop),
    a saturating curve in the spirit of Calculon's size-keyed tables (Isaev et al. SC'23).
    """

    model_config = ConfigDict(frozen=True, extra="forbid", allow_inf_nan=False)

    matmul_max: float = Field(default=0.8, gt=0, le=1)  # asymptotic fraction of dense peak
    matmul_half_gflop: float = Field(default=1.0, ge=0)  # op size (GFLOP) at half of matmul_max
    memory: float = Field(default=0.8, gt=0, le=1)  # achieved fraction of HBM bandwidth
    attention: float = Field(default=0.6, gt=0, le=1)  # flash-attention fraction of peak
    fp8_speedup: float = Field(default=1.5, ge=1)  # achieved end-to-end GEMM gain of fp8 over bf16
    # host time to launch one kernel (µs): eager PyTorch dispatch and the CUDA launch. A layer
    # takes at least its kernel count times this (none with CUDA graphs or XLA)
    kernel_launch_us: float = Field(default=5.0, ge=0)
    # GPU-to-GPU spread of speed (standard deviation / mean of one chip's time for the same
    # work: clocks under power and thermal limits, Sinha et al. SC'22). A synchronous step waits
    # for the slowest of its n GPUs, 1 + speed_cv·sqrt(2 ln n) times the mean (dimensionless)
    speed_cv: float = Field(default=0.0, ge=0, le=0.2)
    source: str = ""


class Accelerator(BaseModel):
    """One GPU/TPU chip: dense peak per dtype, HBM size and bandwidth, and its efficiencies."""

    model_config = ConfigDict(frozen=True, extra="forbid", allow_inf_nan=False)

    name: str
    peak_tflops: dict[Dtype, float]  # dense (no sparsity) TFLOP/s per dtype
    hbm_gb: float = Field(gt=0)
    hbm_gbps: float = Field(gt=0)
    # host link (PCIe) per chip and direction, GB/s; None: the planner's PCIe default
    # (estimate/memory.py PCIE_BYTES_PER_S). Carries host offload traffic.
    host_gbps: float | None = Field(default=None, gt=0)
    tdp_w: float | None = Field(default=None, gt=0)
    # Rate of kernels built on the previous generation's warp-level `mma.sync` instruction
    # (FlashAttention-2 class) as a fraction of the native kernel's (cuDNN fused attention /
    # FlashAttention-3, Hopper's warpgroup `wgmma`). Hopper: measured 0.62, forward and
    # backward (Shah et al. 2024, FlashAttention-3, Figs. 5e and 7b, H100 SXM5, head dim 128,
    # 2K-8K), under the 2/3 ceiling of mma.sync on Hopper (§2.2); 1 where mma.sync is the
    # native path (Ampere, Ada) or the chip has no such split (TPU). Dimensionless.
    mma_sync_fraction: float = Field(default=1.0, gt=0, le=1)
    efficiency: Efficiency = Efficiency()
    source: str = ""

    @model_validator(mode="after")
    def _check(self) -> Accelerator:
        if "bf16" not in self.peak_tflops and "fp16" not in self.peak_tflops:
            raise UserInputError("peak_tflops", self.peak_tflops, "a bf16 or fp16 entry")
        for dtype, value in self.peak_tflops.items():
            if value <= 0:
                raise UserInputError(f"peak_tflops.{dtype}", value, "> 0 TFLOP/s")
        return self

    def peak(self, dtype: Dtype) -> float:
        """Dense peak TFLOP/s for `dtype`, falling back fp16<->bf16 and fp8->bf16."""
        table = self.peak_tflops
        for candidate in (dtype, "bf16" if dtype != "bf16" else "fp16", "fp16"):
            if candidate in table:
                return table[candidate]
        raise KeyError(dtype)

    @property
    def hbm_bytes(self) -> float:
        """HBM capacity, bytes (GB × 1e9)."""
        return self.hbm_gb * 1e9

    @property
    def hbm_bytes_per_s(self) -> float:
        """Achieved HBM bandwidth, bytes/s (GB/s × 1e9 × the calibrated memory efficiency)."""
        return self.hbm_gbps * 1e9 * self.efficiency.memory


class Link(BaseModel):
    """A network link as one GPU sees it: bandwidth per direction, latency, achieved fraction."""

    model_config = ConfigDict(frozen=True, extra="forbid", allow_inf_nan=False)

    name: str = "link"
    bandwidth_gbps: float = Field(gt=0)  # GB/s per GPU per direction (nominal)
    latency_us: float = Field(default=5.0, ge=0)
    efficiency: float = Field(default=0.8, gt=0, le=1)  # achieved bus bandwidth / nominal

    @property
    def effective_bytes_per_s(self) -> float:
        """Achieved bandwidth per GPU per direction, bytes/s (GB/s × 1e9 × efficiency)."""
        return self.bandwidth_gbps * 1e9 * self.efficiency

    @property
    def latency_s(self) -> float:
        """Per-message latency, seconds."""
        return self.latency_us * 1e-6


class Cluster(BaseModel):
    """A homogeneous cluster (one island): nodes of identical GPUs, NVLink inside, NICs across."""

    model_config = ConfigDict(frozen=True, extra="forbid", allow_inf_nan=False)

    name: str = "cluster"
    accelerator: Accelerator
    gpus_per_node: int = Field(gt=0)
    nvlink_domain: int = Field(gt=0)  # GPUs that share the fast fabric (8 for DGX, 72 for NVL72)
    intra: Link  # NVLink/xGMI/ICI per GPU
    inter: Link  # NIC per GPU (rail-optimised fabric)
    n_nodes: int | None = Field(default=None, gt=0)  # None = as many as the plan needs
    price_per_gpu_hour: float = Field(default=0.0, ge=0)  # USD
    overlap_slowdown: float = Field(default=0.1, ge=0, lt=1)  # compute lost while comms overlap
    # fixed per-GPU overhead replacing the CUDA context and NCCL buffer terms (None: those
    # sourced terms, estimate/memory.py); TPU pods set 0.5 (XLA plans its buffers)
    memory_overhead_gb: float | None = Field(default=None, ge=0)
    # TPU: dimensions of the ICI torus (3 for v4/v5p, 2 for v5e); the slice is nvlink_domain
    # chips as cubic as powers of two allow, and the intra bandwidth is split evenly over axes
    ici_axes: int | None = Field(default=None, ge=1, le=3)
    source: str = ""

    @model_validator(mode="after")
    def _check(self) -> Cluster:
        if self.nvlink_domain < self.gpus_per_node and self.gpus_per_node % self.nvlink_domain:
            allowed = f"a divisor or multiple of gpus_per_node ({self.gpus_per_node})"
            raise UserInputError("nvlink_domain", self.nvlink_domain, allowed)
        return self

    @property
    def n_gpus(self) -> int | None:
        """GPUs in the cluster (n_nodes × gpus_per_node); None when unbounded."""
        return None if self.n_nodes is None else self.n_nodes * self.gpus_per_node
