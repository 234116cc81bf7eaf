"""Compressed payloads (top-k, sign) with error feedback: the codec math, its frames on the
wire and what a hostile peer can do with them, the residual in the worker's state, the bytes a
push costs against ShardMeter's payload model, and the simulator using the same code."""

from __future__ import annotations

import json
import math
import time
from pathlib import Path
from typing import Any

import pytest
import torch
from hypothesis import given, settings
from hypothesis import strategies as st

from heloco import codecs
from heloco.codecs import Coded, ErrorFeedback, parse_payload
from heloco.net import auth, compress, wire
from heloco.net.coordinator import Budget, Coordinator
from heloco.net.wire import WireError
from heloco.outer import OuterConfig, build_optimizer
from heloco.rounds import Rounds
from heloco.server import Dispatch, Server, ServerConfig
from heloco.worker_state import load_states, pick_state, save_states
from shardmeter.errors import UserInputError
from shardmeter.estimate.payload import resolve_payload
from shardmeter.specs.model import TransformerSpec

SECRET = b"codecs-test-secret-0123456789abcdef"
PAYLOADS = ["topk:fraction=0.01", "topk:fraction=0.2,value_bits=32", "sign", "sign:group=7"]


# -- the codec math --------------------------------------------------------------------------------
def test_topk_keeps_the_k_largest_magnitudes_sorted() -> None:
    torch.manual_seed(0)
    x = torch.randn(1000)
    c = codecs.encode_topk(x, 0.013, 32)
    k = math.ceil(0.013 * 1000)
    assert c.k == k == 13 and c.aux.dtype == torch.int32
    assert torch.equal(c.aux, torch.sort(torch.topk(x.abs(), k).indices).values.to(torch.int32))
    dense = codecs.decode(c)
    assert torch.equal(dense[c.aux.long()], x[c.aux.long()])
    assert int((dense != 0).sum()) == k


def test_sign_decodes_to_the_groups_mean_magnitude() -> None:
    """EF-signSGD's scaled sign per group: ±mean|x_g| (the last, short group its own mean)."""
    x = torch.tensor([1.0, -3.0, 2.0, 0.0, -4.0])
    c = codecs.encode_sign(x, group=3, scale_bits=32)
    assert torch.equal(c.aux, torch.tensor([2.0, 2.0]))
    assert torch.equal(codecs.decode(c), torch.tensor([2.0, -2.0, 2.0, 2.0, -2.0]))
    assert c.data.tolist() == [0b01101]  # bit i set where x_i >= 0


@settings(max_examples=40, deadline=None)
@given(
    payload=st.sampled_from(PAYLOADS),
    n=st.integers(1, 300),
    rounds=st.integers(1, 6),
    seed=st.integers(0, 2**31 - 1),
)
def test_error_feedback_loses_nothing(payload: str, n: int, rounds: int, seed: int) -> None:
    """Σ sent + residual = Σ Δ after any number of rounds (EF-SGD Alg. 2): nothing the worker
    computed is lost, only delayed; and the residual is what was not sent."""
    g = torch.Generator().manual_seed(seed)
    ef = ErrorFeedback(payload)
    total = torch.zeros(n, dtype=torch.float64)
    sent = torch.zeros(n, dtype=torch.float64)
    for _ in range(rounds):
        d = torch.randn(n, generator=g)
        total += d.double()
        before = ef.residual.get("x", torch.zeros(n))
        out = ef.compress({"x": d})
        sent += out["x"].double()
        assert torch.allclose(ef.residual["x"], d + before - out["x"], atol=1e-6)
    assert torch.allclose(sent + ef.residual["x"].double(), total, atol=1e-4)


def test_residual_is_replaced_not_written_in_place() -> None:
    ef = ErrorFeedback("topk:fraction=0.1")
    ef.compress({"x": torch.randn(50)})
    saved = ef.state_dict()["tensors"]["x"].clone()
    held = ef.state_dict()["tensors"]["x"]
    ef.compress({"x": torch.randn(50)})
    assert torch.equal(held, saved)


@pytest.mark.parametrize(
    ("text", "field"),
    [
        ("lowrank:rank=4", "payload"),
        ("dct_topk:fraction=0.1", "payload"),
        ("topk", "payload.fraction"),
        ("topk:fraction=1.5", "payload.fraction"),
        ("topk:fraction=0.1,value_bits=8", "payload.value_bits"),
        ("topk:fraction=0.1,index_bits=16", "payload.index_bits"),
        ("sign:scale_bits=8", "payload.scale_bits"),
        ("sign:error_feedback=false", "payload.error_feedback"),
        ("sign:grup=3", "payload.grup"),
    ],
)
def test_bad_payloads_are_one_line_errors(text: str, field: str) -> None:
    with pytest.raises(UserInputError) as err:
        parse_payload(text)
    assert err.value.field == field and "\n" not in str(err.value)


def test_names_read_back() -> None:
    for text in PAYLOADS:
        spec = parse_payload(text)
        assert parse_payload(codecs.payload_name(spec)) == spec


# -- bytes against the planner ---------------------------------------------------------------------
SPEC = TransformerSpec(
    name="bytes-check", n_layers=4, hidden=512, n_heads=8, ffn=1376, vocab=8192, seq_len=256
)


def _model_delta() -> dict[str, torch.Tensor]:
    """Δ with the shapes of SPEC's weight matrices (every count a separate tensor), plus a
    norm vector per layer: what a 11M-parameter model pushes."""
    from shardmeter.estimate.payload import matrix_shapes

    g = torch.Generator().manual_seed(3)
    out: dict[str, torch.Tensor] = {}
    for i, (m, n, count) in enumerate(matrix_shapes(SPEC)):
        for j in range(count):
            out[f"m{i}.{j}"] = torch.randn(m, n, generator=g)
    for layer in range(SPEC.n_layers):
        out[f"norm{layer}"] = torch.randn(SPEC.hidden, generator=g)
    return out


@pytest.mark.parametrize("payload", ["topk:fraction=0.01", "topk:fraction=0.03", "sign"])
def test_push_bytes_match_the_planners_payload_model(payload: str) -> None:
    """A whole push (header, frames, tag) of a compressed Δ is within 2% of the planner's
    bits per parameter × parameters / 8, for the same family and setting."""
    delta = _model_delta()
    n = sum(t.numel() for t in delta.values())
    coded = ErrorFeedback(payload).compress(delta)
    body = {"worker": 0, "round_id": 1, "base_revision": 0, "steps": 100, "tokens": 10**6}
    frames = wire.encode(wire.make("push", body, coded), SECRET)
    measured = wire.wire_bytes(frames)
    planned = resolve_payload(parse_payload(payload), 16, SPEC).bits_per_param * n / 8
    assert abs(measured / planned - 1) < 0.02, (measured, planned)
    # the frames alone are the model's bytes up to one rounding of k per tensor
    per_tensor = sum(
        codecs.expected_nbytes(parse_payload(payload), t.numel()) for t in delta.values()
    )
    assert coded.nbytes == per_tensor


def _push_body() -> dict[str, Any]:
    """A push's body as a worker's link sends it (heloco/net/link.py)."""
    return {
        "worker": 3,
        "incarnation": f"{time.time_ns():020d}-{'ab' * 4}",
        "round_id": 17,
        "base_revision": 123,
        "steps": 20,
        "tokens": 5120,
        "mean_loss": 3.2871234567891234,
        "compute_s": 1.2345678901234567,
    }


def _whole_push(params: Any, codec: str = "fp32") -> int:
    return wire.wire_bytes(wire.encode(wire.make("push", _push_body(), params, codec), SECRET))


@pytest.mark.parametrize("payload", ["topk:fraction=0.01", "sign", "int8", "fp32"])
def test_the_planner_prices_a_tiny_models_whole_push_within_2_percent(payload: str) -> None:
    """The README's tiny model (137K parameters, 29 tensors), where the JSON header is a third
    of a top-1% push: ShardMeter's push bytes (frames, header entries, envelope, tag) for the
    same tensors are within 2% of the real message, and so is its dispatch of θ."""
    from heloco.modelspec import build_model
    from shardmeter.estimate.payload import dispatch_bytes, push_bytes
    from shardmeter.specs.topology import PayloadSpec

    model = build_model("tiny", 256, 64, 0, "cpu")
    named = {n: p.detach().clone() for n, p in model.named_parameters()}
    tensors = [(n, tuple(t.shape)) for n, t in named.items()]
    delta = {n: 1e-3 * torch.randn_like(t) for n, t in named.items()}
    if payload in compress.CODECS:
        measured = _whole_push(delta, payload)
        bits = {"fp32": 32, "int8": 8}[payload]
        planned = push_bytes(PayloadSpec(kind="dense"), tensors, bits)
    else:
        measured = _whole_push(ErrorFeedback(payload).compress(delta))
        planned = push_bytes(parse_payload(payload), tensors)
        frames_only = resolve_payload(parse_payload(payload), 16, SPEC).bits_per_param
        assert abs(measured / (frames_only * 136_960 / 8) - 1) > 0.02  # the old model's miss
    assert abs(measured / planned - 1) < 0.02, (measured, planned)
    body = {"revision": 123, "steps": 20, "round_id": 17}
    sent = wire.make("dispatch", body, named, re="f" * 32)
    down = wire.wire_bytes(wire.encode(sent, SECRET))
    assert abs(down / dispatch_bytes(tensors) - 1) < 0.02, (down, dispatch_bytes(tensors))


@pytest.mark.parametrize("payload", ["topk:fraction=0.01", "sign"])
def test_the_planners_plan_prices_an_18m_model_push_within_2_percent(payload: str) -> None:
    """A plan's bytes per push for an 18M-parameter model (``resolve_payload``: bits per
    parameter × N / 8 plus the message overhead) against the real codec and wire encoder on
    tensors of the planner's names and shapes."""
    from shardmeter.estimate.payload import model_tensors

    spec = parse_payload(payload)
    plan = resolve_payload(spec, 16, SPEC)
    g = torch.Generator().manual_seed(5)
    delta = {n: torch.randn(*shape, generator=g) for n, shape in model_tensors(SPEC)}
    measured = _whole_push(ErrorFeedback(spec).compress(delta))
    planned = plan.bits_per_param * SPEC.params_total / 8 + plan.push_overhead_bytes
    assert SPEC.params_total > 18e6
    assert abs(measured / planned - 1) < 0.02, (measured, planned)
    assert abs(measured / planned - 1) < 0.002  # the header is counted, not just tolerated


# -- the wire --------------------------------------------------------------------------------------
def _roundtrip(msg: wire.Message) -> wire.Message:
    return wire.decode(wire.encode(msg, SECRET), SECRET)


@pytest.mark.parametrize("payload", PAYLOADS)
def test_frames_decode_to_what_the_worker_sent(payload: str) -> None:
    torch.manual_seed(1)
    delta = {"w": torch.randn(37, 11), "b": torch.randn(3), "e": torch.zeros(0)}
    coded = ErrorFeedback(payload).compress(delta)
    back = _roundtrip(wire.make("push", {}, coded))
    params = back.params()
    view = compress.Decoded(back.tensors)
    for name in delta:
        assert torch.equal(params[name], coded[name]) and params[name].shape == delta[name].shape
        assert compress.is_finite(back.tensors[name])
        n = delta[name].numel()
        for lo, hi in ((0, n), (min(5, n), max(min(5, n), n - 3))):
            assert torch.equal(view.chunk(name, lo, hi), coded[name].reshape(-1)[lo:hi])


def _coded_frames(codec: str, meta: dict[str, Any], data: bytes, aux: bytes) -> list[wire.Frame]:
    head = {
        "v": 1,
        "type": "push",
        "id": wire.new_id(),
        "re": "",
        "ts": time.time(),
        "body": {},
        "tensors": [{"name": "w", "codec": codec, "shape": [10], "block": 0} | meta],
    }
    frames: list[wire.Frame] = [json.dumps(head).encode(), data, aux]
    return [*frames, auth.sign(SECRET, frames)]


def _i32(*xs: int) -> bytes:
    return torch.tensor(xs, dtype=torch.int32).numpy().tobytes()


def _f32(*xs: float) -> bytes:
    return torch.tensor(xs, dtype=torch.float32).numpy().tobytes()


@pytest.mark.parametrize(
    ("name", "codec", "meta", "data", "aux", "reason"),
    [
        ("index = n", "topk_fp32", {"k": 2}, _f32(1, 2), _i32(3, 10), "bad_tensor"),
        ("negative index", "topk_fp32", {"k": 2}, _f32(1, 2), _i32(-1, 3), "bad_tensor"),
        ("repeated index", "topk_fp32", {"k": 2}, _f32(1, 2), _i32(4, 4), "bad_tensor"),
        ("unsorted indices", "topk_fp32", {"k": 2}, _f32(1, 2), _i32(5, 4), "bad_tensor"),
        ("k > n", "topk_fp32", {"k": 11}, _f32(*[1] * 11), _i32(*range(11)), "bad_header"),
        ("k 2**60", "topk_fp32", {"k": 2**60}, b"", b"", "bad_header"),
        ("k too small", "topk_fp32", {"k": 1}, _f32(1, 2), _i32(3, 4), "bad_tensor"),
        ("values short", "topk_bf16", {"k": 2}, b"\0\0", _i32(3, 4), "bad_tensor"),
        ("topk with block", "topk_fp32", {"k": 1, "block": 4}, _f32(1), _i32(3), "bad_header"),
        ("k on sign", "sign_fp32", {"k": 1, "block": 4}, b"\0\0", _f32(1, 1, 1), "bad_header"),
        ("sign block 0", "sign_fp32", {}, b"\0\0", _f32(1), "bad_header"),
        ("sign scales short", "sign_fp32", {"block": 4}, b"\0\0", _f32(1, 1), "bad_tensor"),
        ("sign bits long", "sign_fp32", {"block": 4}, b"\0\0\0", _f32(1, 1, 1), "bad_tensor"),
        ("unknown codec", "topk_fp8", {"k": 1}, b"\0", _i32(1), "bad_header"),
    ],
)
def test_malformed_coded_frames_raise_wire_error(
    name: str, codec: str, meta: dict[str, Any], data: bytes, aux: bytes, reason: str
) -> None:
    with pytest.raises(WireError) as err:
        wire.decode(_coded_frames(codec, meta, data, aux), SECRET)
    assert err.value.reason == reason, name


@pytest.mark.parametrize(
    ("codec", "meta", "data", "aux"),
    [
        ("topk_fp32", {"k": 2}, _f32(1, math.nan), _i32(3, 4)),
        ("topk_fp32", {"k": 2}, _f32(math.inf, 1), _i32(3, 4)),
        ("sign_fp32", {"block": 4}, b"\0\0", _f32(1, math.inf, 1)),
        ("sign_bf16", {"block": 5}, b"\0\0", b"\x80\x7f\0\0"),  # bf16 +inf
    ],
)
def test_non_finite_values_are_caught_from_the_wire_form(
    codec: str, meta: dict[str, Any], data: bytes, aux: bytes
) -> None:
    msg = wire.decode(_coded_frames(codec, meta, data, aux), SECRET)
    assert not compress.is_finite(msg.tensors["w"])


@settings(max_examples=200, deadline=None)
@given(
    codec=st.sampled_from(["topk_bf16", "topk_fp32", "sign_bf16", "sign_fp32"]),
    shape=st.lists(st.integers(0, 6), max_size=3),
    block=st.integers(-1, 9),
    k=st.integers(-1, 40) | st.none(),
    frames=st.lists(st.binary(max_size=48), min_size=0, max_size=3),
)
def test_authenticated_garbage_coded_frames_only_raise_wire_error(
    codec: str, shape: list[int], block: int, k: int | None, frames: list[bytes]
) -> None:
    """Any header and frames a secret holder sends: a WireError, or a message whose tensors
    decode to their declared shape with every top-k index in range and written once."""
    meta: dict[str, Any] = {"name": "w", "codec": codec, "shape": shape, "block": block}
    if k is not None:
        meta["k"] = k
    head = {"v": 1, "type": "push", "id": wire.new_id(), "re": "", "ts": 1.0, "body": {}}
    raw: list[wire.Frame] = [json.dumps(head | {"tensors": [meta]}).encode(), *frames]
    raw.append(auth.sign(SECRET, raw))
    try:
        msg = wire.decode(raw, SECRET)
    except WireError:
        return
    enc = msg.tensors["w"]
    if not compress.is_finite(enc):
        return
    dense = msg.params()["w"]
    assert tuple(dense.shape) == tuple(shape) and bool(torch.isfinite(dense).all())
    if codec.startswith("topk"):
        idx = compress.to_coded(enc).aux.long()
        assert len(set(idx.tolist())) == idx.numel() == enc.k


# -- the server receives the dense decoded Δ, once -------------------------------------------------
def _coordinator() -> Coordinator:
    init = {"w": torch.zeros(30, 4), "b": torch.zeros(5)}
    opt = build_optimizer("async-nesterov", init, OuterConfig(), 2)
    server = Server(init, opt, ServerConfig(n_workers=2, inner_steps=3))
    return Coordinator(server, Budget(revisions=100))


def _push(coord: Coordinator, d: wire.Message, delta: Any) -> wire.Message:
    body = {
        "worker": 0,
        "incarnation": "a",
        "round_id": d.body["round_id"],
        "steps": 3,
        "tokens": 30,
        "base_revision": d.body["revision"],
    }
    return coord.handle(_roundtrip(wire.make("push", body, delta)))


@pytest.mark.parametrize("payload", ["topk:fraction=0.1", "sign:group=16"])
def test_server_applies_the_decoded_delta_exactly_once(payload: str) -> None:
    torch.manual_seed(2)
    delta = {"w": torch.randn(30, 4), "b": torch.randn(5)}
    coded = ErrorFeedback(payload).compress(delta)
    dense = {k: coded[k].clone() for k in coded}
    a, b = _coordinator(), _coordinator()
    da = a.handle(_roundtrip(wire.make("pull", {"worker": 0, "incarnation": "a"})))
    db = b.handle(_roundtrip(wire.make("pull", {"worker": 0, "incarnation": "a"})))
    first = _push(a, da, coded)
    assert first.type == "ack" and first.body["applied"] and not first.body["duplicate"]
    again = _push(a, da, coded)  # a retried push: acknowledged, not applied twice
    assert again.type == "ack" and again.body["duplicate"]
    assert _push(b, db, dense).type == "ack"
    assert a.server.revision == b.server.revision == 1
    for name, t in a.server.params.items():
        assert torch.equal(t, b.server.params[name])


# -- the residual in the worker's state ------------------------------------------------------------
def _rounds(payload: str) -> Rounds:
    torch.manual_seed(5)
    model = torch.nn.Linear(6, 4)
    return Rounds(0, model, None, feedback=ErrorFeedback(payload))


def _one_round(r: Rounds, start: dict[str, torch.Tensor], shift: float) -> Any:
    r.begin(Dispatch(start, 0, 1, r.rounds, 0))
    with torch.no_grad():
        for p in r.model.parameters():
            p.add_(shift * torch.arange(p.numel(), dtype=torch.float32).view_as(p).sin())
    r.record_step(10)
    return r.end()


@pytest.mark.parametrize("payload", ["topk:fraction=0.25", "sign:group=5"])
def test_a_restarted_worker_resumes_its_residual(payload: str, tmp_path: Path) -> None:
    """The residual travels in the worker's state file: a worker restarted from it sends what
    the one that kept running sends."""
    live = _rounds(payload)
    start = {n: p.detach().clone() for n, p in live.model.named_parameters()}
    _one_round(live, start, 0.3)
    assert any(v.abs().sum() > 0 for v in live.feedback.residual.values())  # type: ignore[union-attr]
    save_states(tmp_path / "w.safetensors", {2: live.state_dict()})
    restarted = _rounds(payload)
    state = pick_state(load_states(tmp_path / "w.safetensors"), 2)
    assert state is not None
    restarted.load_state_dict(state)
    a, b = _one_round(live, start, -0.2), _one_round(restarted, start, -0.2)
    for name in a.delta:
        assert torch.equal(a.delta[name], b.delta[name])
    fresh = _rounds(payload)
    c = _one_round(fresh, start, -0.2)
    assert any(not torch.equal(a.delta[n], c.delta[n]) for n in a.delta)  # the residual matters


def test_coded_tensor_properties() -> None:
    c = Coded(
        "topk", (2, 3), torch.ones(2, dtype=torch.bfloat16), torch.tensor([1, 4], dtype=torch.int32)
    )
    assert c.numel == 6 and c.k == 2 and c.nbytes == 2 * 2 + 2 * 4


# Two workers at paces 1 and 2 training TinyGPT for 768 tokens on the synthetic corpus.
SMALL_RUN: dict[str, Any] = {
    "workers": 2,
    "paces": [1.0, 2.0],
    "inner_steps": 2,
    "token_budget": 768,
    "eval_windows": 2,
    "eval_batch_size": 4,
    "data": {"synthetic_chars_per_language": 4000, "val_chars_per_language": 1000},
    "inner": {"batch_size": 2, "seq_len": 32},
}


# -- the simulator uses the same code, deterministically -------------------------------------------
@pytest.mark.parametrize("payload", ["topk:fraction=0.05", "sign"])
def test_simulated_runs_with_a_payload_are_deterministic(payload: str, one_thread: None) -> None:
    from heloco.sim import parse_sim_config, run_simulation

    values = SMALL_RUN | {"data": {**SMALL_RUN["data"], "seq_len": 32}, "payload": payload}
    first = run_simulation(parse_sim_config(values)).losses
    again = run_simulation(parse_sim_config(values)).losses
    dense = run_simulation(parse_sim_config(values | {"payload": "dense"})).losses
    assert first == again
    assert first != dense


def test_the_simulators_int8_uplink_is_what_the_server_decodes(one_thread: None) -> None:
    """``codec = "int8"``: every tensor of Δ becomes the transport's int8 round trip (the
    values a server reads from a real push), no residual kept; a run records its codec, and a
    compressed payload with a dense codec is a one-line error."""
    from heloco.net.compress import WireRoundTrip
    from heloco.sim import parse_sim_config, run_simulation
    from heloco.types import RoundResult

    torch.manual_seed(4)
    delta = {"w": torch.randn(70, 90), "b": torch.randn(7)}
    out = WireRoundTrip("int8").compress_result(RoundResult(0, delta, 2, 64, 1.0, 0, 1))
    for name, t in delta.items():
        want = compress.decode(compress.encode(t, "int8"))
        assert torch.equal(out.delta[name], want) and not torch.equal(out.delta[name], t)
        assert (out.delta[name] - t).abs().max() <= compress.int8_error_bound(t).max()
    assert WireRoundTrip("bf16").state_dict() == {"meta": {"codec": "bf16"}, "tensors": {}}
    values = SMALL_RUN
    int8 = run_simulation(parse_sim_config(values | {"codec": "int8"}))
    fp32 = run_simulation(parse_sim_config(values))
    assert int8.summary.codec == "int8" and fp32.summary.codec == "fp32"
    assert int8.losses != fp32.losses
    assert max(abs(a - b) for a, b in zip(int8.losses, fp32.losses, strict=True)) < 0.05
    with pytest.raises(UserInputError, match="codec"):
        parse_sim_config(values | {"codec": "int8", "payload": "sign"})


# -- `heloco launch --payload`: real processes ------------------------------------------------------
@pytest.mark.slow
@pytest.mark.timeout(200)
@pytest.mark.parametrize(("payload", "shards"), [("topk:fraction=0.01", 1), ("sign", 2)])
def test_launch_with_a_payload_sends_the_planned_frames(
    tmp_path: Path, tiny_net_values: Any, payload: str, shards: int
) -> None:
    """Two worker processes push compressed Δ (to one server, or staged on two shards): every
    push is the codec's frames plus headers and tags, and to one server within 2% of what
    ShardMeter's ``push_bytes`` plans for the model's tensors; every accepted push is one
    update (none lost, none doubled)."""
    from heloco.cli import main
    from heloco.config import save_config
    from heloco.sim import build_run, parse_sim_config
    from shardmeter.estimate.payload import push_bytes

    values = tiny_net_values(method="async-nesterov", workers=2, token_budget=12 * 128)
    save_config(parse_sim_config(values), tmp_path / "run.toml")
    out = tmp_path / "run"
    argv = ["launch", "--config", str(tmp_path / "run.toml"), "--out", str(out)]
    flags = ["--paces", "0.01,0.02", "--payload", payload, "--shards", str(shards)]
    assert main([*argv, *flags]) == 0
    cfg = parse_sim_config(json.loads((out / "config.json").read_text()))
    assert cfg.payload == payload
    named = list(build_run(cfg).model.named_parameters())
    shapes = [p.numel() for _, p in named]
    frames = sum(codecs.expected_nbytes(parse_payload(cfg.payload), n) for n in shapes)
    planned = push_bytes(parse_payload(cfg.payload), [(n, tuple(p.shape)) for n, p in named])
    header_cap = 200 * len(shapes) + 1000  # names, shapes, k and the push body, as JSON
    summary = json.loads((out / "summary.json").read_text())
    accepted = 0
    for w in range(2):
        report = json.loads((out / "workers" / f"worker{w}.json").read_text())
        assert report["push_bytes"] and report["retries"] == 0
        for sent in report["push_bytes"]:
            assert frames + auth.TAG_BYTES < sent < frames + auth.TAG_BYTES + header_cap
            if shards == 1:
                assert abs(sent / planned - 1) < 0.02, (sent, planned)
        accepted += len(report["acked"])
    assert summary["updates"] == accepted


def test_payload_cost_benchmark_measures_a_push(monkeypatch: pytest.MonkeyPatch) -> None:
    """benchmarks/payload_cost.py on a small model: bytes within 2% of the plan, costs > 0."""
    monkeypatch.syspath_prepend(str(Path(__file__).resolve().parents[2] / "benchmarks"))
    import importlib

    bench = importlib.import_module("payload_cost")
    from heloco.model import ModelConfig

    cfg = ModelConfig(vocab_size=512, seq_len=16, n_layer=2, n_head=4, d_model=256)
    g = torch.Generator().manual_seed(0)
    delta = {f"t{i}": torch.randn(256, 1024, generator=g) for i in range(4)}
    row = bench.measure("topk:fraction=0.05", delta, cfg, 1)
    assert row.encode_s > 0 and row.decode_s > 0
    assert abs(row.push_bytes / row.planned_bytes - 1) < 0.02
