"""Closed forms of the squared-ReLU MLP (`mlp = "relu2"`, relu(x)², Nemotron-4).

Its two weight matrices and FLOPs are GELU's. Fused into one kernel (Megatron-Core's
`jit_fuser`, a compiled step) its element-wise traffic is GELU's too: read F, write F per token,
backward twice that. NeMo and Megatron-Bridge run it eagerly, `torch.pow(relu(x), 2)`: relu then
pow forward (8 B per intermediate element), and backward autograd's pow (a copy, a scale, the
gradient multiply) and relu's threshold_backward (20 B).

The world: HBM at exactly 1e12 B/s, so a layer's element-wise seconds are its bytes / 1e12.
"""

from __future__ import annotations

import pytest

from shardmeter.calibrate import model_from_row
from shardmeter.errors import UserInputError
from shardmeter.estimate.compute import layer_forward
from shardmeter.estimate.plan_arrays import PlanArrays
from shardmeter.specs.framework import FRAMEWORKS
from shardmeter.specs.hardware import Accelerator, Efficiency
from shardmeter.specs.model import TransformerSpec
from shardmeter.specs.plan import Plan

H, FFN, SEQ = 1024, 4096, 512
BYTES_PER_S = 1e12
ACC = Accelerator(
    name="closed-form-gpu",
    peak_tflops={"bf16": 1000.0},
    hbm_gb=80,
    hbm_gbps=BYTES_PER_S / 1e9,
    efficiency=Efficiency(
        matmul_max=1.0, matmul_half_gflop=0.0, memory=1.0, attention=1.0, kernel_launch_us=0.0
    ),
)


def model(mlp: str) -> TransformerSpec:
    return TransformerSpec(n_layers=2, hidden=H, n_heads=8, ffn=FFN, mlp=mlp, vocab=1000,
                           seq_len=SEQ)  # fmt: skip


def extra_seconds(**plan: object) -> tuple[float, float]:
    """(forward, backward) element-wise seconds of one relu2 layer over the same GELU layer."""
    plans = PlanArrays.scalar(Plan(**plan))  # type: ignore[arg-type]
    relu2 = layer_forward(model("relu2"), plans, ACC, moe=False)
    gelu = layer_forward(model("gelu"), plans, ACC, moe=False)
    return (
        float(relu2.elementwise_s - gelu.elementwise_s),
        float(relu2.backward_s - gelu.backward_s),
    )


def elements(micro_batch: int = 1) -> float:
    """Intermediate activation elements of one layer and micro-batch (tp = 1)."""
    return float(micro_batch * SEQ * FFN)


def test_squared_relu_has_gelus_matrices_and_parameters() -> None:
    assert model("relu2").mlp_matrices == 2
    assert model("relu2").params_total == model("gelu").params_total


def test_fused_squared_relu_moves_what_gelu_moves() -> None:
    fwd, bwd = extra_seconds(fused_elementwise=True, eager_squared_relu=False)
    assert (fwd, bwd) == (pytest.approx(0.0, abs=1e-15), pytest.approx(0.0, abs=1e-15))


def test_eager_squared_relu_runs_relu_then_pow_and_their_autograd() -> None:
    """Forward 8 B against GELU's 4; backward 20 B against GELU's 2 × 4."""
    fwd, bwd = extra_seconds(fused_elementwise=True, eager_squared_relu=True)
    assert fwd == pytest.approx((8.0 - 4.0) * elements() / BYTES_PER_S, rel=1e-9)
    assert bwd == pytest.approx((20.0 - 8.0) * elements() / BYTES_PER_S, rel=1e-9)


def test_an_eager_stack_runs_squared_relu_eagerly_without_the_flag() -> None:
    eager = extra_seconds(fused_elementwise=True, eager_squared_relu=True)
    assert extra_seconds(fused_elementwise=False) == pytest.approx(eager, rel=1e-9)


def test_a_compiled_step_fuses_squared_relu_away() -> None:
    fwd, bwd = extra_seconds(compiled=True, eager_squared_relu=True)
    assert (fwd, bwd) == (pytest.approx(0.0, abs=1e-15), pytest.approx(0.0, abs=1e-15))


def test_nemo_and_megatron_bridge_run_it_eagerly_megatron_core_fuses_it() -> None:
    eager = {name for name, fw in FRAMEWORKS.items() if fw.eager_squared_relu}
    assert eager == {"nemo", "megatron-bridge"}
    assert Plan(framework="nemo").eager_squared_relu
    assert not Plan(framework="megatron-core").eager_squared_relu


def test_calibration_rows_spell_squared_relu_several_ways() -> None:
    base = {"n_layers": "2", "hidden": str(H), "n_heads": "8", "ffn": str(FFN),
            "vocab": "1000", "seq_len": str(SEQ)}  # fmt: skip
    for cell in ("relu2", "squared_relu", "Squared-ReLU"):
        assert model_from_row({**base, "mlp": cell}).mlp == "relu2"
    assert model_from_row({**base, "mlp": "relu"}).mlp == "gelu"
    with pytest.raises(UserInputError, match="relu2"):
        model_from_row({**base, "mlp": "tanh"})
