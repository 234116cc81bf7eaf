"""The FP8 scaling granularity against torchao's own measured training benchmark.

    python benchmarks/fp8_scaling_check.py

torchao's float8 README ("Training benchmarks", NVIDIA H100) measured torchtitan Llama 3 8B on
8 H100 (batch size 1, sequence length 8192, torch.compile, FSDP2, per-op SAC): bf16 6150
tokens/s, tensorwise with float8 all-gather 7689.5, rowwise with bf16 all-gather 6768. None of
these runs is in the calibration data. This prints ShardMeter's prediction of each (torchtitan
defaults, compiled element-wise ops and loss, the shipped calibration) and the FP8 gains, on
the H100 SXM preset and on the 500 W H100 of torchtitan's own benchmarks (the README does not
state the power limit). FSDP's float8 weight all-gather of the tensorwise run is not modelled.
"""

from __future__ import annotations

from shardmeter.calibrate import Calibration
from shardmeter.estimate.step import estimate_step
from shardmeter.predict import cluster_for_gpu, resolve_model
from shardmeter.specs.plan import Plan

MEASURED = {"bf16": 6150.0, "tensorwise": 7689.5, "rowwise": 6768.0}
FAMILIES = ["ampere", "blackwell", "hopper", "hopper-500w", "tpu"]
SOURCE = "pytorch/ao torchao/float8/README.md, Training benchmarks, NVIDIA H100"


def main() -> None:
    model = resolve_model("llama-3.1-8b").model_copy(update={"seq_len": 8192})
    base = dict(
        dp=8, sharding="zero3", micro_batch=1, global_batch=8, framework="torchtitan",
        recompute="selective", fused_elementwise=True, ce_upcast="compiled",
    )  # fmt: skip
    variants = {
        "bf16": {},
        "tensorwise": {"precision": "fp8"},
        "rowwise": {"precision": "fp8", "fp8_scaling": "rowwise"},
    }
    print(f"source: {SOURCE}")
    print(f"{'gpu':<20} {'scaling':<11} {'predicted':>9} {'measured':>9} {'error':>7} "
          f"{'gain pred':>9} {'gain meas':>9}")  # fmt: skip
    for gpu in ("h100-sxm", "h100-sxm-96gb-500w"):
        raw = cluster_for_gpu(gpu)
        cluster = Calibration.start(FAMILIES).apply(raw)  # the shipped fit's values
        rates = {
            name: estimate_step(model, cluster, Plan(**base, **extra)).tokens_per_s_per_gpu
            for name, extra in variants.items()
        }
        for name, rate in rates.items():
            meas = MEASURED[name]
            print(
                f"{gpu:<20} {name:<11} {rate:>9.0f} {meas:>9.0f} {100 * (rate / meas - 1):>+6.1f}% "
                f"{rate / rates['bf16']:>9.3f} {meas / MEASURED['bf16']:>9.3f}"
            )


if __name__ == "__main__":
    main()
