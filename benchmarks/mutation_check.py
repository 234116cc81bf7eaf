"""Deliberate small bugs in the estimator, and which tests catch them.

    python benchmarks/mutation_check.py                  # closed-form tests only (~1 min)
    python benchmarks/mutation_check.py --tests tests/shardmeter   # the whole ShardMeter suite

Each mutation is one exact text replacement in `src/shardmeter/estimate/*.py`. It is applied to
a temporary copy of `src/` (the working tree is never touched), the tests run against that
copy, and the table lists the tests that fail. A mutation no test catches is a hole in the
suite; the script exits 1 if any. The first eleven are issue 13's list; the rest are the
equivalents for the terms issue 13 added.
"""

from __future__ import annotations

import argparse
import os
import re
import shutil
import subprocess
import sys
import tempfile
from dataclasses import dataclass
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]


@dataclass(frozen=True)
class Mutation:
    name: str
    path: str  # relative to src/shardmeter/estimate
    old: str
    new: str


MUTATIONS: tuple[Mutation, ...] = (
    Mutation("overlap slowdown u/(1-u) written as u", "step.py",
             "interference=hidden * slowdown / (1.0 - slowdown)",
             "interference=hidden * slowdown"),
    Mutation("pipeline sends halved", "step.py",
             "pp_sends = where(pp > 1, 2.0 * m * vpp, 0.0)",
             "pp_sends = where(pp > 1, m * vpp, 0.0)"),
    Mutation("context-parallel backward hops 2 -> 1", "step.py",
             "cp_bwd = _overlap(hop * 2.0,", "cp_bwd = _overlap(hop * 1.0,"),
    Mutation("DP overlap window widened to include the forward", "step.py",
             'where(plans.overlap_dp, bwd_window, 0.0)',
             'where(plans.overlap_dp, bwd_window + on_critical("forward"), 0.0)'),
    Mutation("ZeRO-1 parameter all-gather dropped", "step.py",
             'ag_once = where((stage >= SHARDING_CODES["zero1"])',
             'ag_once = where((stage >= SHARDING_CODES["zero2"])'),
    Mutation("tensor-parallel all-reduces per layer 4 -> 2", "step.py",
             "tp_count = 4.0 + 2.0 * full", "tp_count = 2.0 + 2.0 * full"),
    Mutation("all-to-all max across links written as a sum", "comm.py",
             "return maximum(t_intra, t_inter)", "return t_intra + t_inter"),
    Mutation("pipeline-send node boundary >= written as >", "comm.py",
             "across = stride >= cluster.nvlink_domain", "across = stride > cluster.nvlink_domain"),
    Mutation("ZeRO-3 prefetch buffer 2 units -> 1", "memory.py",
             "minimum(2.0 * shared.unit, params.total)", "minimum(1.0 * shared.unit, params.total)"),
    Mutation("full-recompute working layer dropped", "memory.py",
             "activations = shared.per_layer * in_flight + shared.working",
             "activations = shared.per_layer * in_flight + 0.0 * shared.working"),
    Mutation("last stage's logits dropped", "memory.py",
             "        logits,\n    )  # fmt: skip\n    mid = _stage_memory(",
             "        0.0,\n    )  # fmt: skip\n    mid = _stage_memory("),
    # --- the terms issue 13 added ---
    Mutation("interleaved bubble not divided by v", "compute.py",
             "return (self.total_s - self.critical_s) / as_float(v)",
             "return self.total_s - self.critical_s"),
    Mutation("interleaved in-flight ignores the stage index", "memory.py",
             "2.0 * (p - 1.0 - stage) + (v - 1.0) * n + 1.0", "2.0 * (p - 1.0) + (v - 1.0) * n + 1.0"),
    Mutation("uneven split ignores the stated first/last layers", "compute.py",
             "rest = model.n_layers - as_float(first_n * first_set + last_n * last_set)",
             "rest = as_float(model.n_layers) + 0.0 * first_n"),
    Mutation("ZeRO-3 first unit's gather hidden", "step.py",
             'first_gather = where(plans.sharding == SHARDING_CODES["zero3"], layer_sync.ag / matrices, 0.0)',
             "first_gather = 0.0 * layer_sync.ag"),
    Mutation("ZeRO-2 per-micro-batch reduce-scatter dropped", "step.py",
             'rs = where(stage >= SHARDING_CODES["zero2"], sync.rs, 0.0)',
             'rs = where(stage >= SHARDING_CODES["zero3"], sync.rs, 0.0)'),
    Mutation("expert dedup: every copy counted as a distinct node", "step.py",
             "reached = nodes * (1.0 - (1.0 - 1.0 / nodes) ** k)", "reached = nodes * 1.0"),
    Mutation("group-limited routing ignored", "step.py",
             "reached = minimum(reached, limit)", "reached = reached + 0.0 * limit"),
    Mutation("FP8 dispatch sent in bf16", "step.py",
             "FP8_DISPATCH_BYTES = 1.0 + 4.0 / 128.0", "FP8_DISPATCH_BYTES = 2.0"),
    Mutation("expert all-to-all overlap window dropped", "step.py",
             "where(plans.overlap_ep, units.layer_s, 0.0)", "0.0 * units.layer_s"),
    Mutation("unfused attention score traffic 13 B -> 8 B", "compute.py",
             "UNFUSED_SCORE_BYTES = 13.0", "UNFUSED_SCORE_BYTES = 8.0"),
    Mutation("unfused attention scores not kept in memory", "memory.py",
             'full_set = full_set + where(plans.attention == ATTENTION_CODES["unfused"], scores, 0.0)',
             "full_set = full_set + 0.0 * scores"),
    Mutation("MoE launches after the host sync hidden", "compute.py",
             "return maximum(self.gpu_forward_s, self.launch_s) + self.synced_launch_s",
             "return maximum(self.gpu_forward_s, self.launch_s + self.synced_launch_s)"),
    Mutation("kernel launches per layer 11 -> 1", "compute.py",
             "KERNELS_PER_LAYER = 11.0", "KERNELS_PER_LAYER = 1.0"),
    Mutation("step synchronisations dropped", "step.py",
             "STEP_SYNCS = 2.0", "STEP_SYNCS = 0.0"),
    Mutation("TPU group gets every torus axis", "comm.py",
             "share = maximum(axes_spanned(n, stride, shape), 1.0) / cluster.ici_axes",
             "share = 1.0 + 0.0 * axes_spanned(n, stride, shape)"),
    Mutation("compiled recompute keeps the dead down projection", "compute.py",
             'full = layer_fwd - where(plans.compiled, mix("down_s"), 0.0)',
             "full = layer_fwd"),
    Mutation("master-weight remainders ignored", "memory.py",
             "optimizer = OPTIMIZER_BYTES - where(remainder, REMAINDER_SAVING, 0.0)",
             "optimizer = OPTIMIZER_BYTES + 0.0 * remainder"),
    Mutation("selective recompute keeps the activation output", "memory.py",
             "- tokens * (q_l + mlp_width)", "- tokens * q_l"),
    Mutation("all-gather latency hierarchical, not NCCL's flat ring", "comm.py",
             "return hierarchical + (g - 1.0) * (n / g - 1.0) * intra.latency_s",
             "return hierarchical + 0.0 * intra.latency_s"),
    Mutation("per-rank copy-back of a list all-gather dropped", "step.py",
             "copies = where(plans.gather_matrix, launch_time(d, plans, acc), 0.0)",
             "copies = 0.0 * d"),
    Mutation("module-hook re-gather for the recomputed forward dropped", "step.py",
             "where(regather, 2.0, 1.0),", "where(regather, 1.0, 1.0),"),
    Mutation("eager RMSNorm bytes counted as fused", "compute.py",
             "NORM_BYTES = (4.0, 36.0)", "NORM_BYTES = (4.0, 4.0)"),
    Mutation("autocast weight cast reads 2 B instead of 4", "compute.py",
             "AUTOCAST_CAST_BYTES = 6.0", "AUTOCAST_CAST_BYTES = 4.0"),
    Mutation("backward gradient casts of fp32 weights dropped", "compute.py",
             "BWD_ELEMENTWISE * (self.elementwise_s + self.cast_s)",
             "BWD_ELEMENTWISE * self.elementwise_s + 0.0 * self.cast_s"),
    Mutation("fp32 residual stream of autocast counted as bf16", "compute.py",
             "FP32_RESIDUAL_BYTES = 2.0 * (10.0 - 6.0) + 2.0 * 6.0",
             "FP32_RESIDUAL_BYTES = 2.0 * (10.0 - 6.0)"),
    Mutation("fp32 weights gathered as bf16", "memory.py",
             "where(plans.params_fp32, 4.0, WEIGHT_BYTES)", "where(plans.params_fp32, 2.0, WEIGHT_BYTES)"),
    # --- the 405B memory terms ---
    Mutation("recomputed activation-function output still kept", "memory.py",
             "full_set - where(plans.recompute_act, act_out, 0.0)", "full_set - 0.0 * act_out"),
    Mutation("recomputed norm outputs still kept", "memory.py",
             "dropped_norm = where(plans.recompute_norm, norm_out, 0.0)",
             "dropped_norm = 0.0 * norm_out"),
    Mutation("interleaved warm-up hops counted once", "memory.py",
             "2.0 * (p - 1.0 - stage) + (v - 1.0) * n", "1.0 * (p - 1.0 - stage) + (v - 1.0) * n"),
    Mutation("chunk group N ignored (always p)", "memory.py",
             "where(plans.vpp_group > 0, plans.vpp_group, plans.pp)",
             "where(plans.vpp_group > 0, plans.pp, plans.pp)"),
    Mutation("end stages' missing layers spread over their chunks", "memory.py",
             "where(plans.pp_end_chunks & (layers < fullest), fullest / v, layers / v)",
             "layers / v + 0.0 * fullest"),
    Mutation("light first chunk counted like the others", "memory.py",
             "count = rounds * n + minimum(maximum(rest - c * n, 0.0), n)", "count = peak / v"),
    Mutation("last stage's steady-state growth ignored", "memory.py",
             "peak = where(several & (b < v), maximum(peak, top), peak)", "peak = peak + 0.0 * top"),
    # --- MLA up-projection recompute (DeepSeek-V3) ---
    Mutation("recomputed Q, K, V still kept", "memory.py",
             "where(plans.recompute_qkv, ACT_BYTES * tokens", "where(plans.recompute_qkv, 0.0 * tokens"),
    Mutation("MLA latents not kept in place of Q, K, V", "memory.py",
             "ACT_BYTES * model.mla.latent_dim * norm_tokens", "0.0 * model.mla.latent_dim * norm_tokens"),
    Mutation("up-projection GEMMs not re-run in backward", "compute.py",
             "+ where(plans.recompute_qkv, qkv_recompute_time(model, plans, acc), 0.0)",
             "+ 0.0 * where(plans.recompute_qkv, qkv_recompute_time(model, plans, acc), 0.0)"),
    # WAN transfers as TCP sends them (tests/shardmeter/test_wan_transfers.py)
    Mutation("WAN: ring step pays a round trip, not one way", "outer.py",
             "hops * rtt / 2.0 * rounds", "hops * rtt * rounds"),
    Mutation("WAN: hub phases pay a round trip each", "outer.py",
             "2.0 * (rtt / 2.0) * rounds", "2.0 * rtt * rounds"),
    Mutation("WAN: no default TCP window cap", "wan.py",
             "window = DEFAULT_WINDOW_BYTES if link.window_mb is None",
             "window = float('inf') if link.window_mb is None"),
    Mutation("WAN: stated parallel streams ignored", "wan.py",
             "streams = 1 if link.streams is None else link.streams", "streams = 1"),
    Mutation("WAN: slow start grows linearly, not by doubling", "wan.py",
             "sent_ss = iw * (2.0**k_star - 1.0)", "sent_ss = iw * k_star"),
    Mutation("WAN: receiver's first window does not cap IW", "wan.py",
             "INITIAL_WINDOW_SEGMENTS * np.asarray(mss, dtype=np.float64), INITIAL_RWND_BYTES",
             "INITIAL_WINDOW_SEGMENTS * np.asarray(mss, dtype=np.float64), np.inf"),
    Mutation("WAN: TCP/IP headers not paid", "wan.py",
             "* (mtu - TCP_IP_HEADER_BYTES)", "* (mtu - 0.0)"),
    Mutation("WAN: broadcast parent sends one child at a time", "wan.py",
             "chains[v] = (levels + 1, load + children[parent])",
             "chains[v] = (levels + 1, load + 1)"),
    Mutation("WAN: reduce's gather to the root dropped", "wan.py",
             "return (k - 1.0) * (lat + send(m / k)) + lat + send((k - 1.0) * m / k)",
             "return (k - 1.0) * (lat + send(m / k)) + lat"),
    Mutation("WAN: HeLoCo exchange counted as one transfer", "wan.py",
             "return 2.0 * (rtt + slow_start_s(m, rate_Bps, rtt))",
             "return rtt + slow_start_s(m, rate_Bps, rtt)"),
    Mutation("WAN: HeLoCo workers do not share the server link", "wan.py",
             "link_Bps=path.link_Bps / workers", "link_Bps=path.link_Bps"),
    Mutation("WAN: server applies pushes at once, not in turn", "wan.py",
             "return wire + workers * m / HELOCO_SERVER_PUSH_BPS", "return wire + m / HELOCO_SERVER_PUSH_BPS"),
    Mutation("WAN: transport fraction ignored", "wan.py",
             "rate = path.rate_Bps * efficiency", "rate = path.rate_Bps"),
    Mutation("WAN: async ignores exchange='heloco'", "outer.py",
             'if exchange_pattern == "heloco":', "if False:"),
)  # fmt: skip


def failing_tests(src: Path, tests: str) -> tuple[list[str], str]:
    """Run pytest against the package in `src`; return the failed test ids and the tail."""
    env = {**os.environ, "PYTHONPATH": str(src)}
    proc = subprocess.run(
        [sys.executable, "-m", "pytest", "-q", "-p", "no:cacheprovider", *tests.split(), "-W", "ignore"],
        cwd=ROOT, env=env, capture_output=True, text=True, check=False,
    )  # fmt: skip
    failed = re.findall(r"^FAILED (\S+)", proc.stdout, flags=re.M)
    return [f.split("::", 1)[-1] for f in failed], proc.stdout[-400:]


def apply(src: Path, mutation: Mutation) -> None:
    path = src / "shardmeter" / "estimate" / mutation.path
    text = path.read_text()
    if text.count(mutation.old) != 1:
        raise SystemExit(f"mutation {mutation.name!r}: the text to replace is not unique in "
                         f"{mutation.path} (found {text.count(mutation.old)} times)")  # fmt: skip
    path.write_text(text.replace(mutation.old, mutation.new))


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument(
        "--tests",
        default="tests/shardmeter/test_closed_form.py tests/shardmeter/test_wan_transfers.py",
        help="test paths, space-separated",
    )
    ap.add_argument("--only", default="", help="run only mutations whose name contains this")
    args = ap.parse_args()
    holes = 0
    with tempfile.TemporaryDirectory() as tmp:
        clean = Path(tmp) / "clean"
        shutil.copytree(ROOT / "src", clean)
        base, tail = failing_tests(clean, args.tests)
        if base:
            print(f"the unmutated tree already fails: {base}\n{tail}")
            return 2
        for mutation in MUTATIONS:
            if args.only and args.only not in mutation.name:
                continue
            src = Path(tmp) / "mutant"
            shutil.rmtree(src, ignore_errors=True)
            shutil.copytree(ROOT / "src", src)
            apply(src, mutation)
            failed, _ = failing_tests(src, args.tests)
            holes += not failed
            caught = ", ".join(failed) if failed else "NOT CAUGHT"
            print(f"{mutation.name:<52} {caught}")
    print(f"\n{holes} mutation(s) not caught")
    return 1 if holes else 0


if __name__ == "__main__":
    raise SystemExit(main())
