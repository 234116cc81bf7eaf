"""A run's parts from its config, one component at a time.

Each component has a small config that ``of(cfg)`` takes from the run config and whose
``build()`` makes its part: :class:`ModelSetup` the initial model, :class:`DataSetup` the
workers' data, :class:`heloco.sim.clock.InnerSetup` each worker's schedule (steps per round,
inner config), :class:`ServerSetup` the server with its outer optimizer, :class:`BudgetSetup`
the run's budget and :class:`ClockSetup` the simulated clock. :func:`build_worker_parts`
composes what a worker needs (identical in the simulator, the network server and every
network worker); :func:`build_run` adds the server (the simulator and the network server only:
a network worker builds no server)."""

from __future__ import annotations

import random
from collections.abc import Iterator
from contextlib import contextmanager
from dataclasses import dataclass, fields
from typing import Literal

import numpy as np
import torch
from torch import nn

from heloco.codecs import Compressor, feedback_for
from heloco.config import ModelChoice, RunConfig, method_policy
from heloco.data import DataConfig, ValLoss, WorkerData, build_data, derive_seed
from heloco.model import ModelConfig
from heloco.modelspec import build_model, describe, tinygpt_config
from heloco.net.compress import WireRoundTrip
from heloco.outer import OuterConfig, build_optimizer
from heloco.run import Budget
from heloco.server import Server, ServerConfig
from heloco.sim.clock import (
    Clock,
    InnerSetup,
    LinkTimes,
    resolve_comm,
    resolve_links,
    resolve_paces,
    round_seconds,
    round_steps,
    worker_inner_configs,
)
from heloco.sim.config import MODEL_KEY, component_of
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


@dataclass(frozen=True)
class ModelSetup:
    """The model component of a run: what is trained (``model``: a TinyGPT preset or table,
    ``{hf = DIR}`` or a factory), the longest window it is fed (``seq_len``, training or
    validation), the run seed its initial weights derive from, and its device."""

    model: ModelChoice
    seq_len: int
    seed: int
    device: str = "cpu"

    @classmethod
    def of(cls, cfg: RunConfig) -> ModelSetup:
        """The model component of ``cfg``."""
        return component_of(cls, cfg, seq_len=max(cfg.inner.seq_len, cfg.data.seq_len))

    def tinygpt(self, vocab_size: int) -> ModelConfig:
        """The TinyGPT shape of a TinyGPT run: a preset sized to the data's vocabulary and
        window, or as given."""
        if not isinstance(self.model, str | ModelConfig):
            raise UserInputError("model", describe(self.model), "a TinyGPT preset or table")
        return tinygpt_config(self.model, vocab_size, self.seq_len)

    def build(self, vocab_size: int, device: torch.device | str | None = None) -> nn.Module:
        """The run's initial model (on ``device``, default :attr:`device`), seeded by the run
        seed: identical in every process."""
        target = self.device if device is None else device
        if isinstance(target, str):
            check_device(target)
        seed = derive_seed(self.seed, MODEL_KEY)
        return build_model(self.model, vocab_size, self.seq_len, seed, target)


@dataclass(frozen=True)
class DataSetup:
    """The data component of a run: the ``[data]`` table split over ``workers``, seeded by
    the run seed."""

    data: DataConfig
    workers: int
    seed: int

    @classmethod
    def of(cls, cfg: RunConfig) -> DataSetup:
        """The data component of ``cfg``."""
        return component_of(cls, cfg)

    def key(self) -> tuple[str, int, int]:
        """Equal for setups that build the same data (runs side by side share it)."""
        return (self.data.model_dump_json(), self.workers, self.seed)

    def build(self) -> WorkerData:
        """Every worker's token stream, the validation set and the languages' mixtures."""
        return build_data(self.data, self.workers, self.seed)


@dataclass(frozen=True)
class ServerSetup:
    """The outer/server component of a run: the method's outer optimizer (``outer``) behind
    a server with the method's policy (``server``: sync barrier, DyLU, grace window, quorum)."""

    method: str
    outer: OuterConfig
    server: ServerConfig

    @classmethod
    def of(cls, cfg: RunConfig) -> ServerSetup:
        """The outer/server component of ``cfg``."""
        server = ServerConfig(
            n_workers=cfg.workers,
            inner_steps=cfg.inner_steps,
            synchronous=method_policy(cfg.method).synchronous,
            dylu=cfg.use_dylu(),
            dylu_reference=cfg.dylu_reference,
            dylu_quantile=cfg.dylu_quantile,
            grace_window=cfg.grace_window,
            quorum=cfg.server_quorum(),
            overlapped=cfg.exchange == "overlapped",
            fragments=cfg.fragments if cfg.exchange == "streaming" else 0,
        )
        return component_of(cls, cfg, server=server)

    def build(
        self, init: Params, rates: list[float], mixtures: list[dict[str, float]] | None = None
    ) -> Server:
        """A server starting from ``init`` (``rates``: expected rounds per second of each
        worker; ``mixtures``: each worker's data mixture, for the methods that weigh by it)."""
        n = self.server.n_workers
        optimizer = build_optimizer(self.method, init, self.outer, n, rates, mixtures)
        return Server(init, optimizer, self.server)


@dataclass(frozen=True)
class BudgetSetup:
    """The budget component of a run: training tokens and/or seconds (None: unlimited)."""

    token_budget: int | None
    time_budget: float | None

    @classmethod
    def of(cls, cfg: RunConfig) -> BudgetSetup:
        """The budget component of ``cfg``."""
        return component_of(cls, cfg)

    def build(self) -> Budget:
        """The budget a :class:`heloco.run.RunControl` stops the run by."""
        return Budget(tokens=self.token_budget, seconds=self.time_budget)


@dataclass(frozen=True)
class ClockSetup:
    """The simulated clock's component of a run (simulator only): per-round pace jitter,
    failures, evaluation points and the budget, on simulated seconds."""

    pace_jitter: float
    seed: int
    budget: BudgetSetup
    eval_every: int
    eval_unit: Literal["tokens", "steps"]
    failures: tuple[tuple[int, float, float], ...]  # (worker, killed at, seconds down)
    exchange: Literal["blocking", "overlapped", "streaming"]
    overlap_eager: float  # overlapped: λ of start = θ − λ·Δ (heloco.overlap)
    stream_alpha: float  # streaming: α of θ ← α·θ_local + (1 − α)·θ_global (heloco.streaming)

    @classmethod
    def of(cls, cfg: RunConfig) -> ClockSetup:
        """The simulated clock's component of ``cfg``."""
        failures = tuple((f.worker, f.at, f.down) for f in cfg.failures)
        return component_of(cls, cfg, budget=BudgetSetup.of(cfg), failures=failures)

    def build(self, paces: list[float], comm: list[float], links: LinkTimes | None = None) -> Clock:
        """The clock of workers with ``paces`` (seconds per step) and ``comm`` (seconds added
        to each round), and with ``links`` each leg's seconds and bytes (the link clock)."""
        return Clock(
            paces=paces,
            comm_delays=comm,
            jitter=self.pace_jitter,
            seed=self.seed,
            token_budget=self.budget.token_budget,
            time_budget=self.budget.time_budget,
            eval_every=self.eval_every,
            eval_unit=self.eval_unit,
            failures=self.failures,
            down_delays=[] if links is None else links.down,
            exchange=self.exchange,
            eager=self.overlap_eager,
            push_bytes=[] if links is None else links.push_bytes,
            pull_bytes=0 if links is None else links.pull_bytes,
            stream_alpha=self.stream_alpha,
            link_mbit=[] if links is None else links.mbit,
            link_latency=[] if links is None else links.latency,
        )


@dataclass(eq=False)
class WorkerParts:
    """What a worker of a run of ``cfg`` is built from, identical in the simulator, the
    network server and every network worker (same seeds, data split, initial model): no
    server, so a worker process holds none."""

    cfg: RunConfig
    data: WorkerData
    model: nn.Module  # initial model; the simulator's workers and evaluator share it
    paces: list[float]  # configured seconds per inner step
    comm: list[float]  # configured seconds added to each round
    steps: list[int]  # steps per round from the configured paces (H or DyLU's H_w)
    inner: list[InnerConfig]  # each worker's inner config (its cosine length)
    links: LinkTimes | None  # push/pull seconds per worker from link_mbit (None: unset)

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


def build_worker_parts(
    cfg: RunConfig, device: torch.device | str | None = None, data: WorkerData | None = None
) -> WorkerParts:
    """Seed, then build the data (or take ``data``, built by an equal :class:`DataSetup`),
    the initial model (on ``device``, default ``cfg.device``) and the per-worker schedules of
    ``cfg``: what a worker needs, and no server (``heloco work`` builds only this).

    Sets torch's thread count to ``cfg.threads`` first, in every process that builds a run
    (simulator, network server, network worker), so a config gives the same losses whichever
    path runs it; :func:`heloco.sim.run_simulation` restores the caller's count afterwards."""
    torch.set_num_threads(cfg.threads)
    seed_everything(cfg.seed)
    data = DataSetup.of(cfg).build() if data is None else data
    model = ModelSetup.of(cfg).build(data.vocab_size, device)
    inner_setup = InnerSetup.of(cfg)
    paces = resolve_paces(inner_setup)
    links = resolve_links(inner_setup, [p.numel() for _, p in model.named_parameters()])
    comm = resolve_comm(inner_setup) if links is None else links.comm
    steps = round_steps(inner_setup, paces)
    inner = worker_inner_configs(inner_setup, paces, comm)
    return WorkerParts(cfg, data, model, paces, comm, steps, inner, links)


def build_run(
    cfg: RunConfig, device: torch.device | str | None = None, data: WorkerData | None = None
) -> RunParts:
    """The workers' parts of ``cfg`` (:func:`build_worker_parts`) and its server
    (:class:`ServerSetup`), which starts from the initial model and expects each worker's
    rounds at the rate its pace gives."""
    parts = build_worker_parts(cfg, device, data)
    init = {
        k: v.detach().to("cpu", torch.float32).clone() for k, v in parts.model.named_parameters()
    }
    overlapped = cfg.exchange != "blocking"  # streaming overlaps its fragments too
    rates = [1.0 / s for s in round_seconds(parts.steps, parts.paces, parts.comm, overlapped)]
    server = ServerSetup.of(cfg).build(init, rates, parts.data.worker_languages)
    return RunParts(**{f.name: getattr(parts, f.name) for f in fields(WorkerParts)}, server=server)
