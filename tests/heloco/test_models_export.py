"""Bring-your-own model and export: Hugging Face configs, factories, weights, save_pretrained.

Everything is local (HF_HUB_OFFLINE=1): tiny Llama and GPT-2 configs are written to a temp
folder, trained a few rounds in the simulator (or through `heloco launch`, slow), exported, and
loaded back with ``AutoModelForCausalLM.from_pretrained``: same logits as the server's model.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
import textwrap
from collections.abc import Callable
from pathlib import Path
from typing import Any

import pytest
import torch

from heloco.data.seeding import derive_seed
from heloco.export import export_params, export_run, logits_of
from heloco.modelspec import FactoryModel, HFModel, build_model
from heloco.sim import parse_sim_config, run_simulation
from heloco.sim.build import ModelSetup
from heloco.sim.config import MODEL_KEY
from shardmeter.errors import UserInputError

pytestmark = pytest.mark.usefixtures("one_thread")
LOGITS_TOL = 1e-5


def write_llama(folder: Path, vocab: int = 256) -> Path:
    from transformers import LlamaConfig

    LlamaConfig(
        vocab_size=vocab,
        hidden_size=32,
        intermediate_size=64,
        num_hidden_layers=2,
        num_attention_heads=4,
        num_key_value_heads=2,
        max_position_embeddings=64,
    ).save_pretrained(folder)
    return folder


def write_gpt2(folder: Path) -> Path:
    from transformers import GPT2Config

    GPT2Config(
        vocab_size=256,
        n_embd=32,
        n_layer=2,
        n_head=4,
        n_positions=64,
        bos_token_id=0,
        eos_token_id=0,
    ).save_pretrained(folder)
    return folder


@pytest.fixture
def values(tiny_net_values: Callable[..., dict[str, Any]]) -> Callable[..., dict[str, Any]]:
    def make(**over: Any) -> dict[str, Any]:
        return tiny_net_values(
            method="heloco", workers=2, token_budget=6 * 128, eval_every=0, **over
        )

    return make


def server_model(cfg: Any, params: dict[str, torch.Tensor]) -> torch.nn.Module:
    model = build_model(
        cfg.model, 256, ModelSetup.of(cfg).seq_len, derive_seed(cfg.seed, MODEL_KEY)
    )
    with torch.no_grad():
        for name, p in model.named_parameters():
            p.copy_(params[name])
    return model.eval()


def assert_same_logits(model: torch.nn.Module, out: Path) -> None:
    from transformers import AutoModelForCausalLM, AutoTokenizer

    loaded = AutoModelForCausalLM.from_pretrained(out).eval()
    tokens = torch.randint(0, 256, (2, 32), generator=torch.Generator().manual_seed(0))
    with torch.no_grad():
        want, got = logits_of(model, tokens), logits_of(loaded, tokens)
    assert got.shape == want.shape
    assert float((got - want).abs().max()) <= LOGITS_TOL
    tok = AutoTokenizer.from_pretrained(out)
    assert tok("héllo\n")["input_ids"] == list("héllo\n".encode())  # the byte tokenizer


@pytest.mark.slow
@pytest.mark.parametrize("arch", ["tinygpt", "llama", "gpt2"])
def test_trained_model_exports_with_equal_logits(
    tmp_path: Path, values: Callable[..., dict[str, Any]], arch: str
) -> None:
    writers = {"llama": write_llama, "gpt2": write_gpt2}
    model = "tiny" if arch == "tinygpt" else {"hf": str(writers[arch](tmp_path / arch))}
    cfg = parse_sim_config(values(model=model))
    result = run_simulation(cfg)
    assert result.losses[-1] < result.losses[0]
    done = export_params(cfg, result.params, tmp_path / "out")
    assert done.tokenizer and (tmp_path / "out" / "model.safetensors").is_file()
    if arch == "tinygpt":
        assert done.architecture == "GPT2LMHeadModel"
    assert_same_logits(server_model(cfg, result.params), tmp_path / "out")
    with pytest.raises(UserInputError, match="new or empty folder"):
        export_params(cfg, result.params, tmp_path / "out")


def test_hf_weights_are_loaded_and_checked(tmp_path: Path) -> None:
    from safetensors.torch import save_file

    folder = write_llama(tmp_path / "llama")
    donor = build_model(HFModel(hf=folder), 256, 32, seed=1)
    weights = {k: v.contiguous() for k, v in donor.state_dict().items()}
    save_file(weights, str(tmp_path / "w.safetensors"))
    model = build_model(HFModel(hf=folder, weights=tmp_path / "w.safetensors"), 256, 32, seed=2)
    assert all(torch.equal(p, weights[n]) for n, p in model.named_parameters())
    bad = dict(weights, **{"lm_head.weight": torch.zeros(3, 3)})
    save_file(bad, str(tmp_path / "bad.safetensors"))
    with pytest.raises(
        UserInputError, match=r"model.weights 'lm_head.weight': got 'shape \(3, 3\)'"
    ):
        build_model(HFModel(hf=folder, weights=tmp_path / "bad.safetensors"), 256, 32, seed=2)
    missing = {k: v for k, v in weights.items() if k != "lm_head.weight"}
    save_file(missing, str(tmp_path / "missing.safetensors"))
    with pytest.raises(UserInputError, match=r"no tensor 'lm_head\.weight'"):
        build_model(HFModel(hf=folder, weights=tmp_path / "missing.safetensors"), 256, 32, 2)


def test_bad_model_choices_are_one_line(tmp_path: Path, values: Callable[..., Any]) -> None:
    (tmp_path / "empty").mkdir()
    (tmp_path / "broken").mkdir()
    (tmp_path / "broken" / "config.json").write_text("{not json")
    (tmp_path / "typeless").mkdir()
    (tmp_path / "typeless" / "config.json").write_text(json.dumps({"hidden_size": 3}))
    cases = [
        (HFModel(hf=tmp_path / "nowhere"), "an existing folder holding config.json"),
        (HFModel(hf=tmp_path / "empty"), "a folder holding config.json"),
        (HFModel(hf=tmp_path / "broken"), "valid JSON"),
        (HFModel(hf=tmp_path / "typeless"), "model_type"),
        (HFModel(hf=write_llama(tmp_path / "small", vocab=100)), "vocabulary"),
        (FactoryModel(factory="no_such_pkg.mod:make"), "an importable module"),
        (FactoryModel(factory="heloco.model:nothing_here"), "a name defined in heloco.model"),
        (FactoryModel(factory="heloco.model"), "package.module:callable"),
        (FactoryModel(factory="heloco.model:INIT_STD"), "a callable"),
        (FactoryModel(factory="heloco.model:preset_config", kwargs={"name": "tiny"}), "nn.Module"),
        (FactoryModel(factory="heloco.model:TinyGPT", kwargs={"nope": 1}), "arguments it takes"),
    ]
    for choice, message in cases:
        with pytest.raises(UserInputError, match=message) as exc:
            build_model(choice, 256, 32, seed=0)
        assert "\n" not in str(exc.value), choice
    with pytest.raises(UserInputError, match=r"^model\.hf: got 3"):
        parse_sim_config(values(model={"hf": 3, "weights": []}))


def test_factory_model_trains_in_the_simulator(
    tmp_path: Path, values: Callable[..., Any], monkeypatch: pytest.MonkeyPatch
) -> None:
    (tmp_path / "mymodels.py").write_text(
        textwrap.dedent(
            """
            from torch import nn

            def bigram(vocab_size, width=16):
                return nn.Sequential(nn.Embedding(vocab_size, width), nn.Linear(width, vocab_size))
            """
        )
    )
    monkeypatch.syspath_prepend(str(tmp_path))
    cfg = parse_sim_config(values(model={"factory": "mymodels:bigram", "kwargs": {"width": 8}}))
    result = run_simulation(cfg)
    assert set(result.params) == {"0.weight", "1.weight", "1.bias"}
    assert result.params["0.weight"].shape == (256, 8)
    assert result.losses[-1] < result.losses[0]
    with pytest.raises(UserInputError, match="PreTrainedModel to export"):
        export_params(cfg, result.params, tmp_path / "out")


@pytest.mark.slow
@pytest.mark.timeout(240)
@pytest.mark.parametrize("arch", ["llama", "gpt2"])
def test_launch_three_workers_then_export(tmp_path: Path, arch: str) -> None:
    """`heloco launch` with 3 worker processes on a tiny HF config: the loss falls, and the
    exported folder loads in transformers with the server's logits."""
    folder = (write_llama if arch == "llama" else write_gpt2)(tmp_path / arch)
    run = tmp_path / "run"
    sets = [
        f'model={{hf="{folder}"}}',
        "inner_steps=2",
        "token_budget=1536",
        "eval_every=768",
        "eval_windows=4",
        "eval_batch_size=8",
        "data.seq_len=32",
        "data.synthetic_chars_per_language=4000",
        "data.val_chars_per_language=1000",
        "inner.batch_size=2",
        "inner.seq_len=32",
        "inner.lr=3e-3",
    ]
    cmd = [sys.executable, "-m", "heloco", "launch", "--workers", "3", "--out", str(run)]
    for item in sets:
        cmd += ["--set", item]
    env = os.environ | {"OMP_NUM_THREADS": "1", "HF_HUB_OFFLINE": "1"}
    proc = subprocess.run(cmd, env=env, capture_output=True, text=True, timeout=200)
    assert proc.returncode == 0, proc.stderr[-3000:]
    summary = json.loads((run / "summary.json").read_text())
    evals = [json.loads(x) for x in (run / "events.jsonl").read_text().splitlines()]
    losses = [e["loss"] for e in evals if e["type"] == "eval"]
    assert summary["updates"] >= 3 and losses[-1] < losses[0]
    done, revision = export_run(run, tmp_path / "hf")
    assert revision == summary["updates"]
    cfg = parse_sim_config(json.loads((run / "config.json").read_text()))
    from heloco.export import checkpoint_params

    params, _ = checkpoint_params(run)
    assert_same_logits(server_model(cfg, params), done.out_dir)


def test_export_picks_the_checkpoint_asked_for(
    tmp_path: Path, values: Callable[..., dict[str, Any]]
) -> None:
    from heloco.export import checkpoint_params
    from heloco.net import checkpoint

    cfg = parse_sim_config(values())
    (tmp_path / "config.json").write_text(cfg.model_dump_json())
    with pytest.raises(UserInputError, match="with checkpoints"):
        checkpoint_params(tmp_path)
    params = run_simulation(cfg).params
    for rev in (3, 5):
        tensors = {f"params/{k}": v + rev for k, v in params.items()}
        checkpoint.save(tmp_path / "checkpoints", rev, tensors, {"server": {"revision": rev}})
    got, rev = checkpoint_params(tmp_path)
    assert rev == 5 and torch.equal(got["head.weight"], params["head.weight"] + 5)
    got, rev = checkpoint_params(tmp_path, 3)
    assert rev == 3 and torch.equal(got["head.weight"], params["head.weight"] + 3)
    with pytest.raises(UserInputError, match=r"revisions \[3, 5\]"):
        checkpoint_params(tmp_path, 4)
    done, rev = export_run(tmp_path, tmp_path / "hf", revision=3)
    assert rev == 3 and done.architecture == "GPT2LMHeadModel"


@pytest.mark.slow
@pytest.mark.timeout(120)
def test_tensors_over_a_mebibyte_cross_curve(
    tmp_path: Path, values: Callable[..., Any], monkeypatch: pytest.MonkeyPatch
) -> None:
    """A real model's tensors exceed the header limit: pushes over CURVE must still arrive
    (the server's frame limit leaves room for the encrypted box; it once did not)."""
    import threading

    from heloco.net import keys
    from heloco.net.client import ClientConfig
    from heloco.net.endpoint import EndpointConfig
    from heloco.net.session import Session
    from heloco.net.worker_loop import NetWorker, WorkerOptions

    (tmp_path / "wide.py").write_text(
        "from torch import nn\n"
        "def build(vocab_size):\n"
        "    return nn.Sequential(nn.Embedding(vocab_size, 1152), nn.Linear(1152, vocab_size))\n"
    )
    monkeypatch.syspath_prepend(str(tmp_path))
    raw = values(model={"factory": "wide:build"})
    cfg = parse_sim_config(raw | {"workers": 1, "token_budget": 2 * 128})
    secret = b"large-frames-secret-0123456789abcdef"
    keys.generate(tmp_path / "keys", 1, secret)
    server_keys = keys.load_server(tmp_path / "keys" / "server")
    endpoint = EndpointConfig(drain_s=1.0, keys=server_keys)
    session = Session(cfg, secret, endpoint, out_dir=tmp_path / "run")
    assert max(4 * p.numel() for p in session.side.server.params.values()) > 1 << 20
    thread, address = session.serve_in_thread()
    client = ClientConfig(
        address, timeout_s=10, deadline_s=30, keys=keys.load_client(tmp_path / "keys" / "worker0")
    )
    reports = []
    worker = threading.Thread(
        target=lambda: reports.append(NetWorker(client, secret, WorkerOptions(worker=0)).run())
    )
    worker.start()
    worker.join(60)
    thread.join(30)
    assert reports and len(reports[0].acked) == 2
    assert session.side.server.revision == 2
