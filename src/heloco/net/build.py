"""Build the server side and a worker of a networked run from the simulator's own config.

The networked runtime takes a :class:`heloco.sim.SimConfig` and builds exactly what
``heloco.sim.run_simulation`` builds (same seeds, same data split, same initial model, same
outer optimizer and server policy), so a networked run and a simulated run of one config start
from identical state. Only the clock and the transport differ.
"""

from __future__ import annotations

import math
from dataclasses import dataclass

import torch

from heloco.data import ValLoss, build_data, derive_seed
from heloco.data.build import WorkerData
from heloco.model import TinyGPT
from heloco.outer import build_optimizer, resolve_method
from heloco.server import Server, ServerConfig
from heloco.sim import MODEL_KEY, SimConfig, model_config_for, resolve_paces, seed_everything
from heloco.types import Params
from heloco.worker import Worker


@dataclass(eq=False)
class ServerSide:
    """The authoritative server plus what evaluation and metrics need."""

    cfg: SimConfig
    server: Server
    data: WorkerData
    model: TinyGPT
    paces: list[float]

    @torch.no_grad()
    def evaluate(self, params: Params) -> ValLoss:
        """Validation loss of ``params`` (same evaluator settings as the simulator)."""
        for name, p in self.model.named_parameters():
            p.copy_(params[name])
        return self.data.validation.evaluate(
            self.model, self.cfg.eval_batch_size, self.cfg.eval_windows
        )


def _dylu_steps_static(paces: list[float], w: int, h: int, dylu: bool) -> int:
    """DyLU steps from configured paces (mirrors the simulator's expected arrival rates)."""
    if not dylu:
        return h
    return max(1, math.floor(min(paces) / paces[w] * h + 1e-9))


def initial_model(cfg: SimConfig, data: WorkerData, device: torch.device | str = "cpu") -> TinyGPT:
    """The run's initial model, seeded as in the simulator."""
    model = TinyGPT(model_config_for(cfg, data.vocab_size), seed=derive_seed(cfg.seed, MODEL_KEY))
    return model.to(device)


def build_server(cfg: SimConfig) -> ServerSide:
    """Data (for validation), initial model, outer optimizer and server policy of ``cfg``."""
    seed_everything(cfg.seed)
    data = build_data(cfg.data, cfg.workers, cfg.seed)
    model = initial_model(cfg, data, cfg.device)
    init = {k: v.detach().to("cpu", torch.float32).clone() for k, v in model.named_parameters()}
    paces = resolve_paces(cfg)
    comm = [float(c) for c in cfg.comm_delays] if cfg.comm_delays else [0.0] * cfg.workers
    method = resolve_method(cfg.method)
    dylu = cfg.use_dylu()
    rates = [
        1.0 / (_dylu_steps_static(paces, w, cfg.inner_steps, dylu) * paces[w] + comm[w])
        for w in range(cfg.workers)
    ]
    optimizer = build_optimizer(cfg.method, init, cfg.outer_config(), cfg.workers, rates)
    server_cfg = ServerConfig(
        n_workers=cfg.workers,
        inner_steps=cfg.inner_steps,
        synchronous=method.spec.synchronous,
        dylu=dylu,
        grace_window=cfg.grace_window,
    )
    return ServerSide(cfg, Server(init, optimizer, server_cfg), data, model, paces)


def build_worker(
    cfg: SimConfig, worker: int, device: torch.device | str = "cpu", batch_seed: int | None = None
) -> Worker:
    """Worker ``worker`` of ``cfg``: its stream, its own model copy, the inner optimizer.

    ``batch_seed`` replaces the run seed for the order of batches only (island ranks > 0
    draw different batches from the same stream).
    """
    seed_everything(cfg.seed)
    data = build_data(cfg.data, cfg.workers, cfg.seed)
    model = initial_model(cfg, data, device)
    seed = cfg.seed if batch_seed is None else batch_seed
    return Worker(worker, model, data.streams[worker], cfg.inner, seed)
