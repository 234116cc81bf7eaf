"""The FlashAttention-2 rate on Hopper is its authors' measurement, not a ceiling argument.

Shah et al. 2024 (FlashAttention-3, arXiv 2407.08608) measure FlashAttention-2 and cuDNN fused
attention on one H100 SXM5, BF16, head dim 128 (TFLOP/s): forward causal, Fig. 5e; backward,
Fig. 7b. Their ratio is the share of the native kernel's rate that the mma.sync kernel reaches.
"""

from __future__ import annotations

import pytest

from shardmeter.specs.loader import load_accelerator

SEQ = (2048, 4096, 8192)  # the sequence lengths of the calibration rows
FA2_FWD = (298.0, 319.0, 333.0)
CUDNN_FWD = (484.0, 518.0, 529.0)
FA2_BWD = (291.0, 310.0, 318.0)
CUDNN_BWD = (465.0, 499.0, 518.0)
HOPPER = ("h100-sxm", "h100-sxm-96gb-500w", "h100-pcie", "h200", "h800", "h20")


def measured_ratio() -> float:
    """Mean FA2 / cuDNN rate over forward and backward at 2K, 4K and 8K (about 0.62)."""
    fwd = [a / b for a, b in zip(FA2_FWD, CUDNN_FWD, strict=True)]
    bwd = [a / b for a, b in zip(FA2_BWD, CUDNN_BWD, strict=True)]
    return sum(fwd + bwd) / len(fwd + bwd)


def test_forward_and_backward_ratios_agree() -> None:
    """Forward and backward give the same ratio to within 0.02 at every length, so one
    fraction serves both passes."""
    for i in range(len(SEQ)):
        assert FA2_FWD[i] / CUDNN_FWD[i] == pytest.approx(FA2_BWD[i] / CUDNN_BWD[i], abs=0.02)


@pytest.mark.parametrize("name", HOPPER)
def test_hopper_presets_carry_the_measured_flash2_ratio(name: str) -> None:
    """Every Hopper preset's `mma_sync_fraction` is the measured ratio (0.62), below the 2/3
    ceiling of mma.sync on Hopper's tensor cores (FlashAttention-3 §2.2)."""
    frac = load_accelerator(name).mma_sync_fraction
    assert frac == pytest.approx(measured_ratio(), abs=0.005)
    assert frac < 2.0 / 3.0
