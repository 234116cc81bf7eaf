"""A run's parts from its config: data, initial model and per-worker schedules (identical in
the simulator, the network server and every network worker), and the server (the simulator
and the network server only: a network worker builds no server)."""

from __future__ import annotations

import random
from collections.abc import Iterator
from contextlib import contextmanager
from dataclasses import dataclass, fields

import numpy as np
import torch
from torch import nn

from heloco.codecs import Compressor, feedback_for
from heloco.data import ValLoss, WorkerData, build_data, derive_seed
from heloco.model import ModelConfig
from heloco.modelspec import build_model, describe, tinygpt_config
from heloco.net.compress import WireRoundTrip
from heloco.outer import build_optimizer, resolve_method
from heloco.server import Server, ServerConfig
from heloco.sim.clock import (
    resolve_comm,
    resolve_paces,
    round_seconds,
    round_steps,
    worker_inner_configs,
)
from heloco.sim.config import MODEL_KEY, SimConfig
from heloco.types import Params
from heloco.worker import InnerConfig, Worker, check_device
from shardmeter.errors import UserInputError


@contextmanager
def torch_threads(n: int) -> Iterator[None]:
    """Run the block with ``n`` torch intra-op threads, then restore the caller's count."""
    before = torch.get_num_threads()
    torch.set_num_threads(n)
    try:
        yield
    finally:
        torch.set_num_threads(before)


def seed_everything(seed: int) -> None:
    """Seed python, numpy and torch global RNGs (per-worker generators are seeded apart)."""
    random.seed(seed)
    np.random.seed(seed % (1 << 32))
    torch.manual_seed(seed)


def model_config_for(cfg: SimConfig, vocab_size: int) -> ModelConfig:
    """The TinyGPT shape of a TinyGPT run: a preset sized to the data's vocabulary and
    window, or as given."""
    if not isinstance(cfg.model, str | ModelConfig):
        raise UserInputError("model", describe(cfg.model), "a TinyGPT preset or table")
    return tinygpt_config(cfg.model, vocab_size, model_seq_len(cfg))


def model_seq_len(cfg: SimConfig) -> int:
    """The longest window the run feeds its model (training or validation)."""
    return max(cfg.inner.seq_len, cfg.data.seq_len)


def initial_model(
    cfg: SimConfig, data: WorkerData, device: torch.device | str | None = None
) -> nn.Module:
    """The run's initial model, seeded by the run seed (identical in every process)."""
    target = cfg.device if device is None else device
    if isinstance(target, str):
        check_device(target)
    seed = derive_seed(cfg.seed, MODEL_KEY)
    return build_model(cfg.model, data.vocab_size, model_seq_len(cfg), seed, target)


@dataclass(eq=False)
class WorkerParts:
    """What a worker of a run of ``cfg`` is built from, identical in the simulator, the
    network server and every network worker (same seeds, data split, initial model): no
    server, so a worker process holds none."""

    cfg: SimConfig
    data: WorkerData
    model: nn.Module  # initial model; the simulator's workers and evaluator share it
    paces: list[float]  # configured seconds per inner step
    comm: list[float]  # configured seconds added to each round
    steps: list[int]  # steps per round from the configured paces (H or DyLU's H_w)
    inner: list[InnerConfig]  # each worker's inner config (its cosine length)

    def worker(
        self, w: int, batch_seed: int | None = None, model: nn.Module | None = None
    ) -> Worker:
        """Worker ``w`` on :attr:`model` (or on ``model``: a batched slot); ``batch_seed``
        replaces the run seed for its batch order only (island ranks > 0 draw other batches
        from the same stream)."""
        seed = self.cfg.seed if batch_seed is None else batch_seed
        on = self.model if model is None else model
        feedback: Compressor | None = feedback_for(self.cfg.payload)
        if feedback is None and self.cfg.codec != "fp32":
            feedback = WireRoundTrip(self.cfg.codec)
        return Worker(w, on, self.data.streams[w], self.inner[w], seed, feedback=feedback)

    @torch.no_grad()
    def evaluate(self, params: Params) -> ValLoss:
        """Validation loss of ``params``, loaded into :attr:`model`."""
        for name, p in self.model.named_parameters():
            p.copy_(params[name])
        return self.data.validation.evaluate(
            self.model, self.cfg.eval_batch_size, self.cfg.eval_windows
        )


@dataclass(eq=False)
class RunParts(WorkerParts):
    """Everything a run of ``cfg`` is built from: the workers' parts and the server (the
    simulator and the network server; the same optimizer in both)."""

    server: Server


def build_server(
    cfg: SimConfig,
    init: Params,
    rates: list[float],
    mixtures: list[dict[str, float]] | None = None,
) -> Server:
    """The method's outer optimizer (``rates``: expected rounds per second of each worker;
    ``mixtures``: each worker's data mixture) behind a server with the method's policy (sync
    barrier, DyLU, grace window)."""
    optimizer = build_optimizer(cfg.method, init, cfg.outer_config(), cfg.workers, rates, mixtures)
    server_cfg = ServerConfig(
        n_workers=cfg.workers,
        inner_steps=cfg.inner_steps,
        synchronous=resolve_method(cfg.method).spec.synchronous,
        dylu=cfg.use_dylu(),
        dylu_reference=cfg.dylu_reference,
        dylu_quantile=cfg.dylu_quantile,
        grace_window=cfg.grace_window,
        quorum=cfg.server_quorum(),
    )
    return Server(init, optimizer, server_cfg)


def build_worker_parts(
    cfg: SimConfig, device: torch.device | str | None = None, data: WorkerData | None = None
) -> WorkerParts:
    """Seed, build data (or take ``data``, built for the same data config, worker count and
    seed), initial model (on ``device``, default ``cfg.device``) and per-worker schedules of
    ``cfg``: what a worker needs, and no server (``heloco work`` builds only this).

    Sets torch's thread count to ``cfg.threads`` first, in every process that builds a run
    (simulator, network server, network worker), so a config gives the same losses whichever
    path runs it; :func:`heloco.sim.run_simulation` restores the caller's count afterwards."""
    torch.set_num_threads(cfg.threads)
    seed_everything(cfg.seed)
    data = build_data(cfg.data, cfg.workers, cfg.seed) if data is None else data
    model = initial_model(cfg, data, device)
    paces, comm = resolve_paces(cfg), resolve_comm(cfg)
    steps = round_steps(cfg, paces)
    inner = worker_inner_configs(cfg, paces, comm)
    return WorkerParts(cfg, data, model, paces, comm, steps, inner)


def build_run(
    cfg: SimConfig, device: torch.device | str | None = None, data: WorkerData | None = None
) -> RunParts:
    """The workers' parts of ``cfg`` (:func:`build_worker_parts`) and its server, which starts
    from the initial model and expects each worker's rounds at the rate its pace gives."""
    parts = build_worker_parts(cfg, device, data)
    init = {
        k: v.detach().to("cpu", torch.float32).clone() for k, v in parts.model.named_parameters()
    }
    rates = [1.0 / s for s in round_seconds(parts.steps, parts.paces, parts.comm)]
    server = build_server(cfg, init, rates, parts.data.worker_languages)
    return RunParts(**{f.name: getattr(parts, f.name) for f in fields(WorkerParts)}, server=server)
