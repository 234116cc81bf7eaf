"""Deliberate small bugs in the estimator, and which tests catch them.

    python benchmarks/mutation_check.py                  # closed-form and memory tests (~2 min)
    python benchmarks/mutation_check.py --tests tests/shardmeter   # the whole ShardMeter suite

Each mutation is one exact text replacement in `src/shardmeter/estimate/*.py`, or, when its
path starts with `shardmeter/` or `heloco/`, in that module under `src/`. It is applied to a
temporary copy of `src/` (the working tree is never touched), the tests run against that copy
(the mutation's own tests where it names them, else `--tests`), and the table lists the tests
that fail. A mutation no test catches is a hole in the suite; the script exits 1 if any.
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
PACKAGES = ("shardmeter/", "heloco/")  # a path starting so is relative to src/
CODEC_TESTS = "tests/heloco/test_codecs.py"
DECOUPLED_TESTS = "tests/heloco/test_decoupled.py"
PLANNED_PUSH_TESTS = (  # a whole push and dispatch against the planner's (tiny and 18M models)
    "tests/heloco/test_codecs.py::test_the_planner_prices_a_tiny_models_whole_push_within_2_percent"
    " tests/heloco/test_codecs.py::test_the_planners_plan_prices_an_18m_model_push_within_2_percent"
)
SIM_CODEC_TESTS = (
    "tests/heloco/test_codecs.py::test_the_simulators_int8_uplink_is_what_the_server_decodes"
)


@dataclass(frozen=True)
class Mutation:
    name: str
    path: str  # relative to src/shardmeter/estimate, or to src/ when it starts with a package
    old: str
    new: str
    tests: str = ""  # the tests that must catch it (default: --tests)


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
             "        logits, plans, counts.last, matrices, cached,\n    )  # fmt: skip\n    mid = _stage_memory(",
             "        0.0, plans, counts.last, matrices, cached,\n    )  # fmt: skip\n    mid = _stage_memory("),
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
             'MASTER_BYTES["remainder"], 0.0),\n    )  # fmt: skip\n    state_dtype',
             'MASTER_BYTES["fp32"], 0.0),\n    )  # fmt: skip\n    state_dtype'),
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
    Mutation("chunk group N ignored (always p)", "plan_arrays.py",
             "where(self.vpp_group > 0, self.vpp_group, self.pp)",
             "where(self.vpp_group > 0, self.pp, self.pp)"),
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
    # --- heloco: the server's snapshot and the message tag ---
    Mutation("heloco: Server.state_dict() hands out the live optimizer state", "heloco/server.py",
             "opt = self.optimizer.state_dict(copy)", "opt = self.optimizer.state_dict(False)",
             "tests/heloco/test_server.py"),
    Mutation("heloco: the HMAC no longer covers frame lengths", "heloco/net/auth.py",
             'mac.update(len(frame).to_bytes(8, "little"))', 'mac.update(b"")',
             "tests/heloco/test_net_wire.py"),
    Mutation("heloco: a restore replaces the counters the listener holds", "heloco/net/endpoint.py",
             "coord.counters.load(meta.counters)", "coord.counters = Counters(**meta.counters)",
             "tests/heloco/test_net_coordinator.py"),
    Mutation("heloco: a push checks the revision log twice", "heloco/net/coordinator.py",
             "record = self.server.accept(result)",
             "record = self.server.submit(result, validated=True)",
             "tests/heloco/test_net_coordinator.py"),
    Mutation("heloco: an arrival at a grace window's end closes it", "heloco/run.py",
             "(now is None or now > self.grace_end)", "(now is None or now >= self.grace_end)",
             "tests/heloco/test_run_control.py"),
    Mutation("heloco: a round arriving at the time budget is refused", "heloco/run.py",
             "self.budget.seconds is not None and now > self.budget.seconds",
             "self.budget.seconds is not None and now >= self.budget.seconds",
             "tests/heloco/test_run_control.py"),
    # --- mutations an independent run found surviving; each now fails a named test ---
    Mutation("K,V heads below tp: max(kv/tp, 1) dropped (compute)", "compute.py",
             "kv_local = maximum(model.kv_heads / tp, 1.0) * model.dim_head  # KV",
             "kv_local = (model.kv_heads / tp) * model.dim_head  # KV"),
    Mutation("K,V heads below tp: max(kv/tp, 1) dropped (cp ring)", "step.py",
             "kv_local = maximum(model.kv_heads / tp, 1.0) * model.dim_head",
             "kv_local = (model.kv_heads / tp) * model.dim_head"),
    Mutation("K,V heads below tp: max(kv/tp, 1) dropped (activations)", "memory.py",
             "kv_l = maximum(model.kv_heads / tp, 1.0) * model.dim_head\n    moe_share",
             "kv_l = (model.kv_heads / tp) * model.dim_head\n    moe_share"),
    Mutation("K,V heads below tp: max(kv/tp, 1) dropped (torchtitan's saved set)", "memory.py",
             "kv_l = maximum(model.kv_heads / tp, 1.0) * model.dim_head\n    width",
             "kv_l = (model.kv_heads / tp) * model.dim_head\n    width"),
    Mutation("TP ring factor 2(n-1)/n dropped from comm_bytes", "step.py",
             '"tp": m * layers_crit * tp_count * tp_msg * 2.0 * (tp - 1.0) / tp,',
             '"tp": m * layers_crit * tp_count * tp_msg,'),
    Mutation("uneven interleaved split per stage, not per chunk", "compute.py",
             "even = ceil(rest / maximum(stages * v, 1.0)) * v",
             "even = ceil(rest / maximum(stages, 1.0))"),
    Mutation("pruning guard against the runner-up dropped", "shardmeter/search/cluster.py",
             "useless = (wall > self._threshold) & (wall > runner_up)",
             "useless = wall > self._threshold  # runner-up ignored",
             tests="tests/shardmeter/test_search.py"),
    Mutation("WAN bytes and egress charged for rounds lost to failures", "islands.py",
             "useful_rounds = wall[..., None] * loss.goodput / rnd.round_s",
             "useful_rounds = wall[..., None] / rnd.round_s",
             tests="tests/shardmeter/test_islands_fidelity.py"),
    Mutation("search ranks plans as if nothing failed", "islands.py",
             "island_tps = ideal_tps * loss.goodput",
             "island_tps = ideal_tps * 1.0",
             tests="tests/shardmeter/test_search.py"),
    # --- the --html pages: what they draw is the result (tests/test_html_data.py) ---
    Mutation("page: plan memory breakdown left out", "shardmeter/report/html.py",
             'island["memory_breakdown_bytes"] = dict(choice.step.memory_breakdown)',
             'island["memory_breakdown_bytes"] = {}', "tests/test_html_data.py"),
    Mutation("page: front points carry the wrong plan", "shardmeter/report/html.py",
             '"customdata": [k for k, _ in items],', '"customdata": [0 for k, _ in items],',
             "tests/test_html_data.py"),
    Mutation("page: $/Mtok scale inverted", "shardmeter/report/html.py",
             "per_mtok = 1e6 / res.tokens", "per_mtok = 1e6 * res.tokens", "tests/test_html_data.py"),
    Mutation("page: knee line away from the knee", "shardmeter/report/html.py",
             '"x": [knee.value, knee.value],', '"x": [knee.value * 2, knee.value * 2],',
             "tests/test_html_data.py"),
    Mutation("page: island utilization bars show goodput", "shardmeter/report/html.py",
             '"y": [i.utilization for i in est.islands],', '"y": [i.goodput for i in est.islands],',
             "tests/test_html_data.py"),
    Mutation("page: link busy share in bits, not bytes", "shardmeter/report/html.py",
             "seconds = nbytes_ / bps if", "seconds = nbytes_ * 8 / bps if", "tests/test_html_data.py"),
    Mutation("page: embedded JSON can close its script element", "shardmeter/report/htmlpage.py",
             r'text.replace("<", "\\u003c")', r'text.replace("<", "<")', "tests/test_html_data.py"),
    Mutation("timeline: comm_delays ignored", "heloco/report_html.py",
             "comm_s = min(comm[w], dur)", "comm_s = 0.0 * min(comm[w], dur)",
             "tests/test_html_data.py"),
    Mutation("timeline: compute from paces ignored", "heloco/report_html.py",
             "comm_s = max(0.0, dur - r.steps * paces[w])", "comm_s = 0.0",
             "tests/test_html_data.py"),
    Mutation("timeline: idle before the next dispatch dropped", "heloco/report_html.py",
             "idle_s=max(0.0, nxt - r.time),", "idle_s=0.0,", "tests/test_html_data.py"),
    Mutation("timeline: every arrival gets the worker's first staleness", "heloco/report_html.py",
             "tau = queue[k][1]", "tau = queue[0][1]", "tests/test_html_data.py"),
    # --- memory setups and the three kinds of memory (tests/shardmeter/test_memory_kinds.py) ---
    Mutation("8-bit AdamW keeps one state", "memory.py",
             "where(eight, 2.0 * ADAM_8BIT_STATE,", "where(eight, 1.0 * ADAM_8BIT_STATE,"),
    Mutation("4-bit AdamW keeps one state", "memory.py",
             "where(code == codes[\"adamw4bit\"], 2.0 * ADAM_4BIT_STATE,",
             "where(code == codes[\"adamw4bit\"], 1.0 * ADAM_4BIT_STATE,"),
    Mutation("pure bf16 states kept in fp32", "memory.py",
             'state_dtype = where(plans.master == MASTER_CODES["none"], WEIGHT_BYTES, 4.0)',
             'state_dtype = where(plans.master == MASTER_CODES["none"], 4.0, 4.0)'),
    Mutation("16-bit remainder counted as a full fp32 master", "memory.py",
             '"remainder": 2.0, "none": 0.0}', '"remainder": 4.0, "none": 0.0}'),
    Mutation("paged optimizer states left on the allocator", "memory.py",
             "return master + where(paged, 0.0, states), where(paged, states, 0.0)",
             "return master + states, where(paged, states, 0.0)"),
    Mutation("SGD/Muon keep two states", "memory.py",
             "where(one_state, state_dtype, 0.0)", "where(one_state, 2.0 * state_dtype, 0.0)"),
    Mutation("offloaded optimizer states still on the GPU", "memory.py",
             "optimizer=where(host_states, 0.0, state_bytes) * params / d",
             "optimizer=state_bytes * params / d"),
    Mutation("offloaded parameters still on the GPU", "memory.py",
             "on_gpu = 1.0 - as_float(host_params)", "on_gpu = 1.0 + 0.0 * as_float(host_params)"),
    Mutation("offloaded weights and grads not counted on the host", "memory.py",
             "+ where(host_params, WEIGHT_BYTES + GRAD_BYTES, 0.0)",
             "+ where(host_params, WEIGHT_BYTES, 0.0)"),
    Mutation("NCCL ring peers 2 -> 1", "memory.py",
             "return groups * NCCL_CHANNELS * NCCL_RING_PEERS * NCCL_BUFFSIZE",
             "return groups * NCCL_CHANNELS * NCCL_BUFFSIZE"),
    Mutation("pipeline send/recv communicator not counted", "memory.py",
             "plans.cp, plans.ep, plans.pp):", "plans.cp, plans.ep):"),
    Mutation("allocator rounding waste a whole 2 MiB per block", "memory.py",
             "return ROUND_WASTE * blocks + ALLOCATOR_SLACK * transient",
             "return ROUND_LARGE * blocks + ALLOCATOR_SLACK * transient"),
    Mutation("no master tensor counted among the state blocks", "memory.py",
             'state_tensors = where(plans.master == MASTER_CODES["none"], 4.0, 5.0)',
             'state_tensors = where(plans.master == MASTER_CODES["none"], 5.0, 5.0)'),
    Mutation("CUDA context dropped", "memory.py",
             "context = full_like(activations, CUDA_CONTEXT_BYTES)", "context = 0.0 * activations"),
    Mutation("reserved memory without fragmentation", "memory.py",
             "return self.allocated + self.fragmentation", "return self.allocated"),
    Mutation("kept gathered weights include the local shard", "memory.py",
             "gathered = shared.unit_weight_bytes * params.total * missing",
             "gathered = shared.unit_weight_bytes * params.total"),
    Mutation("unsharded gradients accumulated without PP too", "memory.py",
             "accumulated = where(plans.pp > 1, UNSHARDED_GRAD_BYTES * params.total, 0.0)",
             "accumulated = UNSHARDED_GRAD_BYTES * params.total"),
    Mutation("torchao float8 saves FP8 casts like Transformer Engine", "memory.py",
             'fp8_saved = (plans.precision == PRECISION_CODES["fp8"]) & plans.fp8_te',
             'fp8_saved = plans.precision == PRECISION_CODES["fp8"]'),
    Mutation("offloaded parameters fetched once per step", "memory.py",
             "per_param = step_bytes + fetch * as_float(plans.micro_batches)",
             "per_param = step_bytes + fetch"),
    Mutation("offload PCIe time not charged", "step.py",
             "opt = where(offloaded, offload_transfer_time(owned, plans), opt)",
             "opt = where(offloaded, 0.0 * opt, opt)"),
    Mutation("recompute_every: the unchecked layers keep nothing", "memory.py",
             "checkpointed = share * layer_input + (1.0 - share) * full_set",
             "checkpointed = share * layer_input + 0.0 * full_set"),
    Mutation("recompute_every: every layer re-run", "compute.py",
             "full * recompute_share(plans), selective", "full, selective"),
    Mutation("recompute_every: FLOPs of every layer counted", "step.py",
             '* where(plans.recompute == RECOMPUTE_CODES["full"], recompute_share(plans), 1.0)',
             "* 1.0"),
    Mutation("recompute_every: saved blocks counted as full recompute", "memory.py",
             "full = share * SAVED_TENSORS[2] + (1.0 - share) * SAVED_TENSORS[0]",
             "full = SAVED_TENSORS[2] + 0.0 * share"),
    Mutation("optimizer step without a master reads no weight", "memory.py",
             "read = master + states + GRAD_BYTES + no_master",
             "read = master + states + GRAD_BYTES + 0.0 * no_master"),
    Mutation("optimizer step bytes ignored", "step.py",
             "opt = optimizer_time(owned, acc, plans.master_remainder, optimizer_step_bytes(plans))",
             "opt = optimizer_time(owned, acc, plans.master_remainder)"),
    Mutation("eager RMSNorm saves nothing extra", "memory.py",
             "eager_extra = EAGER_NORM_EXTRA * 2.0 * model.hidden * norm_tokens + (",
             "eager_extra = 0.0 * model.hidden * norm_tokens + ("),
    Mutation("eager SwiGLU's silu output not kept", "memory.py",
             "EAGER_SWIGLU_EXTRA * tokens * gated_width", "0.0 * tokens * gated_width"),
    # --- torchtitan's per-op selective set and the fp32-upcast loss (test_memory_kinds.py) ---
    Mutation("op SAC keeps K as well as V", "memory.py",
             "kept = tokens * (q_l + kv_l + q_l + width / tp + w2_out)",
             "kept = tokens * (q_l + 2.0 * kv_l + q_l + width / tp + w2_out)"),
    Mutation("op SAC drops the w2 output", "memory.py",
             'w2_out = model.hidden if model.mlp == "swiglu" else 0.0', "w2_out = 0.0"),
    Mutation("op SAC keeps GELU's w2 output", "memory.py",
             'w2_out = model.hidden if model.mlp == "swiglu" else 0.0', "w2_out = model.hidden"),
    Mutation("op SAC without the layer input", "memory.py",
             "return layer_input + ACT_BYTES * kept", "return 0.0 * layer_input + ACT_BYTES * kept"),
    Mutation("selective policy ignored", "memory.py",
             "plans.op_sac, op_sac_set(model, plans, tokens, layer_input)",
             "False, op_sac_set(model, plans, tokens, layer_input)"),
    Mutation("eager fp32 loss holds two fp32 tensors", "memory.py",
             "EAGER_FP32_LOGITS_BYTES = 12.0", "EAGER_FP32_LOGITS_BYTES = 8.0"),
    Mutation("compiled loss counted as eager", "memory.py",
             "where(plans.ce_compiled, COMPILED_LOGITS_BYTES,",
             "where(plans.ce_compiled, EAGER_FP32_LOGITS_BYTES,"),
    Mutation("cached bf16 logits block not reserved", "memory.py",
             "EAGER_FP32_CACHED_BYTES * local_logits, 0.0,", "0.0 * local_logits, 0.0,"),
    Mutation("cached block counted under a fused loss", "memory.py",
             "plans.ce_eager & logical_not(plans.fused_ce | plans.ce_compiled),",
             "plans.ce_eager,"),
    Mutation("fp32 gradient buffer counted as bf16", "memory.py",
             "grad_bytes = where(plans.grad_fp32, FP32_GRAD_BYTES, GRAD_BYTES)",
             "grad_bytes = where(plans.grad_fp32, GRAD_BYTES, GRAD_BYTES)"),
    Mutation("gradient bytes ignore the buffer dtype", "memory.py",
             "gradients=on_gpu * grad_bytes * params", "gradients=on_gpu * GRAD_BYTES * params"),
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
    # --- compressed payloads with error feedback (heloco.codecs, the wire, the planner) ---
    Mutation("error-feedback residual dropped", "heloco/codecs.py",
             "residual[name] = p - decode(c)", "residual[name] = 0.0 * p", CODEC_TESTS),
    Mutation("top-k k = floor(f·n) instead of ceil", "heloco/codecs.py",
             "math.ceil(fraction * numel - 1e-9)", "math.floor(fraction * numel - 1e-9)", CODEC_TESTS),
    Mutation("sign scale of a short last group divided by the full group", "heloco/codecs.py",
             "scales = (sums / counts)", "scales = (sums / group)", CODEC_TESTS),
    Mutation("top-k index n accepted", "heloco/codecs.py",
             "int(idx[-1]) >= n", "int(idx[-1]) > n", CODEC_TESTS),
    Mutation("top-k repeated index accepted", "heloco/codecs.py",
             "(idx[1:] > idx[:-1])", "(idx[1:] >= idx[:-1])", CODEC_TESTS),
    Mutation("residual left out of the worker's state", "heloco/rounds.py",
             'tensors.update({f"feedback.{k}": v for k, v in fb["tensors"].items()})',
             "pass", CODEC_TESTS),
    Mutation("header k larger than the tensor accepted", "heloco/net/wire.py",
             "if t.k > math.prod(t.shape):", "if t.k > 2 * math.prod(t.shape):", CODEC_TESTS),
    Mutation("planner's top-k index 32 -> 16 bits", "payload.py",
             'DEFAULT_INDEX_BITS = {"topk": 32,', 'DEFAULT_INDEX_BITS = {"topk": 16,', CODEC_TESTS),
    # --- Decoupled DiLoCo (quorum, token-weighted merge) and failures on the simulated clock ---
    Mutation("merge weights ignore tokens", "heloco/server.py",
             "weights = [n * r.tokens / total if total > 0 else 1.0 for r, _ in items]",
             "weights = [1.0 for r, _ in items]", DECOUPLED_TESTS),
    Mutation("quorum counts rounds, not distinct workers", "heloco/server.py",
             "return len({r.worker for r, _ in self._pending}) >= self.cfg.quorum",
             "return len(self._pending) >= self.cfg.quorum", DECOUPLED_TESTS),
    Mutation("a buffered learner waits for the merge", "heloco/server.py",
             "return self.cfg.synchronous or self.cfg.quorum == 0", "return True", DECOUPLED_TESTS),
    Mutation("a killed worker's round still arrives", "heloco/sim/loop.py",
             "heap = [(a, v) for a, v in heap if v != w]", "heap = list(heap)", DECOUPLED_TESTS),
    Mutation("goodput never counts compute", "heloco/sim/loop.py",
             "            self.traj.useful_seconds += compute\n", "", DECOUPLED_TESTS),
    Mutation("quality: any compressed run stands for any payload", "shardmeter/quality.py",
             "if base == name and payload_spec(text) == payload:", "if base == name:",
             "tests/shardmeter/test_quality.py"),
    # --- HeLoCo's whole messages in the planner, the async pull, the simulated int8 uplink ---
    Mutation("planner's push header entries dropped", "payload.py",
             "total += tensor_entry_bytes(name, shape, codec, block, k) + frames",
             "total += frames", PLANNED_PUSH_TESTS),
    Mutation("planner's dispatch of θ in bf16, not fp32", "payload.py",
             "+ 4 * math.prod(shape)", "+ 2 * math.prod(shape)", PLANNED_PUSH_TESTS),
    Mutation("async pull priced as the compressed push", "outer.py",
             "n_params * DISPATCH_BITS / 8.0", "nbytes",
             "tests/shardmeter/test_outer.py tests/shardmeter/test_wan_transfers.py"),
    Mutation("async pull's own bytes ignored on the server link", "outer.py",
             "np.maximum(inflow, outflow)", "inflow", "tests/shardmeter/test_outer.py"),
    Mutation("simulated int8 uplink not applied", "heloco/sim/build.py",
             "feedback = WireRoundTrip(self.cfg.codec)", "feedback = None", SIM_CODEC_TESTS),
    Mutation("quality: an int8 run counted as the dense method", "shardmeter/quality.py",
             'return self.method if self.codec == "fp32" else f"{self.method}@{self.codec}"',
             "return self.method", "tests/shardmeter/test_quality.py"),
    Mutation("optimizer in backward keeps every gradient", "memory.py",
             "gradients = where(plans.optimizer_in_backward, shared.fused_step_grads, gradients)",
             "gradients = where(plans.optimizer_in_backward, gradients, gradients)"),
    Mutation("fused-step gradient not sharded under ZeRO-3", "memory.py",
             '/ where(plans.sharding >= SHARDING_CODES["zero2"], d_dense, 1.0),',
             "/ 1.0,"),
    Mutation("largest parameter without the embedding table", "memory.py",
             "biggest = max(model.vocab * model.hidden, model.hidden * width,",
             "biggest = max(0 * model.vocab * model.hidden, model.hidden * width,"),
)  # fmt: skip


def failing_tests(src: Path, tests: str) -> tuple[list[str], str]:
    """Run pytest against the package in `src` (`tests`: paths split by spaces); return the
    failed test ids and the tail."""
    env = {**os.environ, "PYTHONPATH": str(src)}
    proc = subprocess.run(
        [sys.executable, "-m", "pytest", "-q", "-p", "no:cacheprovider", *tests.split(), "-W", "ignore"],
        cwd=ROOT, env=env, capture_output=True, text=True, check=False,
    )  # fmt: skip
    failed = re.findall(r"^FAILED (\S+)", proc.stdout, flags=re.M)
    return [f.split("::", 1)[-1] for f in failed], proc.stdout[-400:]


def apply(src: Path, mutation: Mutation) -> None:
    under = src if mutation.path.startswith(PACKAGES) else src / "shardmeter" / "estimate"
    path = under / mutation.path
    text = path.read_text()
    if text.count(mutation.old) != 1:
        raise SystemExit(f"mutation {mutation.name!r}: the text to replace is not unique in "
                         f"{mutation.path} (found {text.count(mutation.old)} times)")  # fmt: skip
    path.write_text(text.replace(mutation.old, mutation.new))


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument(
        "--tests",
        default="tests/shardmeter/test_closed_form.py tests/shardmeter/test_memory_kinds.py "
        "tests/shardmeter/test_wan_transfers.py",
        help="test paths, space-separated",
    )
    ap.add_argument("--only", default="", help="run only mutations whose name contains this")
    args = ap.parse_args()
    holes = 0
    chosen = [m for m in MUTATIONS if not args.only or args.only in m.name]
    targets = sorted({m.tests or args.tests for m in chosen})
    with tempfile.TemporaryDirectory() as tmp:
        clean = Path(tmp) / "clean"
        shutil.copytree(ROOT / "src", clean)
        for target in targets:
            base, tail = failing_tests(clean, target)
            if base:
                print(f"the unmutated tree already fails: {base}\n{tail}")
                return 2
        for mutation in chosen:
            src = Path(tmp) / "mutant"
            shutil.rmtree(src, ignore_errors=True)
            shutil.copytree(ROOT / "src", src)
            apply(src, mutation)
            failed, _ = failing_tests(src, mutation.tests or args.tests)
            holes += not failed
            caught = ", ".join(failed) if failed else "NOT CAUGHT"
            print(f"{mutation.name:<52} {caught}")
    print(f"\n{holes} mutation(s) not caught")
    return 1 if holes else 0


if __name__ == "__main__":
    raise SystemExit(main())
