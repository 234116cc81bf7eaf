"""One networked training run on the server side: endpoint + evaluation + metrics + summary.

Writes the same files as a simulated run (``config.json``, ``events.jsonl`` with ``round``,
``update`` and ``eval`` lines, ``summary.json``) with wall seconds as ``time``, plus ``worker``
lines (joined / evicted / rejoined / replaced / left) and a ``restart`` line when the server
resumes from a checkpoint. After a crash, events with a revision above the ``restart`` line's
revision that precede it describe updates that were lost with the crash.
"""

from __future__ import annotations

import threading
import time
from collections.abc import Callable
from dataclasses import asdict, dataclass
from functools import partial
from pathlib import Path
from typing import Any

from heloco.config import RunConfig, save_config
from heloco.metrics import (
    EvalPoint,
    MetricsWriter,
    RunStats,
    RunSummary,
    atomic_write_json,
)
from heloco.net.coordinator import Coordinator, UpdateEvent
from heloco.net.endpoint import Endpoint, EndpointConfig
from heloco.runfolder import CONFIG_FILE
from heloco.sim import (
    BudgetSetup,
    Recorder,
    RunParts,
    build_run,
    round_seconds,
    summarize,
)
from shardmeter.errors import UserInputError

ADDRESS_FILE = "address.txt"
STATUS_FILE = "status.json"


@dataclass(frozen=True)
class Liveness:
    """Heartbeat period the workers are told to use, silence before eviction, how long a
    fresh run waits for every worker's first pull before it starts anyway (seconds; 0: no
    wait), and whether the workers take turns on the server's link (``link_slots``: one push
    at a time, :class:`heloco.net.coordinator.Coordinator`)."""

    heartbeat_s: float = 2.0
    evict_after_s: float = 10.0
    wait_for_workers_s: float = 0.0
    link_slots: bool = False


MAX_ISLAND_RANKS = 65536  # ranks of one torchrun island: a push's tokens cover them all


def _evals_of(extra: dict[str, Any]) -> tuple[list[EvalPoint], int]:
    """The evaluations and the next eval point a checkpoint's ``extra`` holds (raises
    ``TypeError``/``ValueError`` if they are malformed, so the checkpoint is skipped)."""
    evals, next_eval = extra.get("evals", []), extra.get("next_eval", 0)
    if not isinstance(evals, list) or not isinstance(next_eval, int):
        raise ValueError("evals or next_eval malformed")
    return [EvalPoint(**e) for e in evals], next_eval


class Session:
    """Serves ``cfg`` until its token/time budget; resumes from ``endpoint.checkpoint_dir``."""

    def __init__(
        self,
        cfg: RunConfig,
        secret: bytes,
        endpoint: EndpointConfig,
        liveness: Liveness = Liveness(),
        out_dir: Path | None = None,
    ) -> None:
        if cfg.exchange == "streaming" and endpoint.shards > 1:
            raise UserInputError(
                "--shards", endpoint.shards, "1 with exchange = 'streaming' (fragments go whole)"
            )
        self.cfg = cfg
        self.out_dir = out_dir if out_dir is not None else cfg.out_dir
        self.side: RunParts = build_run(cfg)
        # A restarted server continues its run's events (the run id comes from its checkpoint)
        self.writer = MetricsWriter(self.out_dir, append=True)
        self.stats = RunStats(cfg.workers, self.side.data.worker_languages)
        # Cycle of the slowest worker, max_w(H_w·pace_w + comm_w), as in the simulator.
        overlapped = cfg.exchange != "blocking"  # streaming overlaps its fragments too
        cycle = max(round_seconds(self.side.steps, self.side.paces, self.side.comm, overlapped))
        self.rec = Recorder(
            self.side.server,
            self.side.evaluate,
            self.writer,
            self.stats,
            cycle,
            cfg.eval_every,
            cfg.eval_unit,
        )
        self.traj = self.rec.traj
        run = cfg.model_dump(mode="json") | {"out_dir": None}
        build = partial(
            Coordinator,
            self.side.server,
            BudgetSetup.of(cfg).build(),
            run=run,
            heartbeat_s=liveness.heartbeat_s,
            evict_after_s=liveness.evict_after_s,
            on_update=self._on_update,
            on_round=self.rec.record_round,
            on_event=self.writer.event,
            max_tokens_per_step=cfg.inner.tokens_per_step * MAX_ISLAND_RANKS,
            wait_for_workers_s=liveness.wait_for_workers_s,
            link_slots=liveness.link_slots,
        )
        self.endpoint = Endpoint(build, secret, endpoint, self._extra, _evals_of)
        self.coord = self.endpoint.coord
        self.wall0 = time.perf_counter()
        self.resumed = False

    # -- persistence of the session's own state (evals) ------------------------------------
    def _resume(self) -> None:
        restored = self.endpoint.restore()
        skipped = [{"checkpoint": s.path.name, "reason": s.reason} for s in self.endpoint.skipped]
        if not restored:
            return
        self.resumed = True
        for record in self.side.server.log:
            self.stats.add(record)
        self.traj.tokens = self.coord.tokens
        self.traj.steps = sum(a.steps for r in self.side.server.log for a in r.arrivals)
        self.traj.evals, self.rec.next_eval = _evals_of(self.endpoint.restored_extra)
        run_id = self.endpoint.restored_extra.get("run_id")
        if isinstance(run_id, str):
            self.writer.run_id = run_id
        assert self.endpoint.restored_from is not None
        self.writer.event(
            {
                "type": "restart",
                "revision": self.side.server.revision,
                "tokens": self.coord.tokens,
                "time": self.coord.elapsed(),
                "checkpoint": self.endpoint.restored_from.name,
                "skipped": skipped,
            }
        )

    def _extra(self) -> dict[str, Any]:
        return {
            "evals": [asdict(e) for e in self.traj.evals],
            "next_eval": self.rec.next_eval,
            "run_id": self.writer.run_id,
        }

    # -- hooks ------------------------------------------------------------------------------
    def _on_update(self, event: UpdateEvent) -> None:
        self.endpoint.after_update(event)
        self.traj.time = event.time
        self.rec.record_update(event.record, event.time, event.tokens)
        self.rec.maybe_eval(event.time)

    def eval_now(self) -> EvalPoint:
        """Evaluate the server's current parameters now (wall seconds since the start)."""
        return self.rec.eval_now(self.coord.elapsed())

    # -- run --------------------------------------------------------------------------------
    def open(self) -> str:
        """Restore the last checkpoint (if any) and bind; returns the server address."""
        self._resume()
        address = self.endpoint.open()
        if self.out_dir is not None:
            self.out_dir.mkdir(parents=True, exist_ok=True)
            atomic_write_json(self.out_dir / CONFIG_FILE, self.cfg.model_dump(mode="json"))
            save_config(self.cfg, self.out_dir / "config.toml")
            (self.out_dir / ADDRESS_FILE).write_text(address + "\n")
        return address

    def serve(self, on_ready: Callable[[str], None] | None = None) -> RunSummary:
        """Open, serve until the budget (or SIGTERM), evaluate, write the summary."""
        address = self.open()
        if on_ready is not None:
            on_ready(address)
        if not self.traj.evals:
            self.rec.eval_now(0.0)  # the start point, at time 0 as in the simulator
        try:
            self.endpoint.serve()
        finally:
            self.writer.event(
                {
                    "type": "net",
                    "counters": asdict(self.coord.counters),
                    "time": self.coord.elapsed(),
                }
            )
        if self.rec.finish(self.coord.elapsed()):
            self.endpoint.save_checkpoint()
        self.traj.time = self.coord.elapsed()
        # Paces as measured: wall seconds per inner step of each worker's latest round.
        speeds = self.side.server.speeds
        paces = [1.0 / v if v else p for v, p in zip(speeds, self.side.paces, strict=True)]
        summary = summarize(
            self.cfg, self.traj, self.stats, paces, time.perf_counter() - self.wall0
        )
        self.writer.write_summary(summary)
        if self.out_dir is not None:
            atomic_write_json(self.out_dir / STATUS_FILE, self.coord.status())
        self.writer.close()
        return summary

    def serve_in_thread(self, timeout_s: float = 30.0) -> tuple[threading.Thread, str]:
        """Serve in a daemon thread (in-process runs: tests, benchmarks); returns the thread
        and the bound address once the server listens."""
        ready = threading.Event()
        address: list[str] = []

        def on_ready(a: str) -> None:
            address.append(a)
            ready.set()

        thread = threading.Thread(target=self.serve, args=(on_ready,), daemon=True)
        thread.start()
        if not ready.wait(timeout_s):
            raise TimeoutError(f"the server did not listen within {timeout_s} s")
        return thread, address[0]
