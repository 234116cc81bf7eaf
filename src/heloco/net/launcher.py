"""Local launches: a server and N workers as subprocesses on loopback, for demos and tests.

The server binds ``tcp://127.0.0.1`` on a free port and writes the address it got to
``<out>/address.txt``; workers get the address and the shared secret (through the environment,
never the command line). :class:`LocalCluster` keeps handles to every process so tests can kill
and restart them; :func:`launch` runs one to completion.

Processes are forked from a ``multiprocessing`` fork server that has imported torch (and the
lazy ``torch._dynamo`` that ``torch.optim`` pulls in) once, so N workers do not each pay
seconds of imports; each child runs the ordinary ``heloco serve`` / ``heloco work`` entry
point. ``fresh_interpreters=True`` uses ``python -m heloco`` subprocesses instead.
"""

from __future__ import annotations

import multiprocessing
import multiprocessing.context
import os
import signal
import socket
import subprocess
import sys
import time
from dataclasses import dataclass, field
from pathlib import Path
from typing import Protocol

from heloco.net import auth
from heloco.net.session import ADDRESS_FILE
from shardmeter.errors import UserInputError

LOOPBACK = "tcp://127.0.0.1:0"


def free_loopback_address() -> str:
    """A ``tcp://127.0.0.1:PORT`` whose port was free a moment ago (the OS picked it)."""
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as s:
        s.bind(("127.0.0.1", 0))
        return f"tcp://127.0.0.1:{s.getsockname()[1]}"


@dataclass(frozen=True)
class LaunchConfig:
    """What to start. ``paces`` are slowdown factors (≥ 1), ``seconds_per_step`` fixed speeds;
    give at most one (one value per worker). Extra CLI flags go to ``serve_args``/``work_args``.
    """

    config: Path
    out_dir: Path
    workers: int
    paces: list[float] | None = None
    seconds_per_step: list[float] | None = None
    serve_args: list[str] = field(default_factory=list)
    work_args: list[str] = field(default_factory=list)
    threads: int | None = None
    startup_timeout_s: float = 60.0
    fresh_interpreters: bool = False

    def __post_init__(self) -> None:
        if self.workers < 1:
            raise UserInputError("workers", self.workers, "an integer >= 1")
        if self.paces is not None and self.seconds_per_step is not None:
            raise UserInputError("paces", self.paces, "give paces or seconds_per_step, not both")
        for name in ("paces", "seconds_per_step"):
            values = getattr(self, name)
            if values is not None and len(values) != self.workers:
                raise UserInputError(name, values, f"{self.workers} values, one per worker")
        if self.paces is not None and any(not p >= 1 for p in self.paces):
            raise UserInputError("paces", self.paces, "slowdown factors >= 1")
        if self.seconds_per_step is not None and any(not s > 0 for s in self.seconds_per_step):
            raise UserInputError("seconds_per_step", self.seconds_per_step, "numbers > 0")
        if self.threads is not None and self.threads < 1:
            raise UserInputError("threads", self.threads, "an integer >= 1")


PRELOAD = ["torch", "torch._dynamo", "heloco.cli.serve", "heloco.cli.work"]


class Proc(Protocol):
    """The part of ``subprocess.Popen`` the cluster uses."""

    pid: int

    def poll(self) -> int | None: ...
    def wait(self, timeout: float | None = None) -> int: ...
    def send_signal(self, sig: int) -> None: ...
    def terminate(self) -> None: ...
    def kill(self) -> None: ...


def _child_main(argv: list[str], log: str, env: dict[str, str]) -> None:
    """Entry point of a forked child: log to a file, set the environment, run the CLI."""
    fd = os.open(log, os.O_WRONLY | os.O_CREAT | os.O_TRUNC, 0o644)
    os.dup2(fd, 1)
    os.dup2(fd, 2)
    os.close(fd)
    sys.stdout = open(1, "w", buffering=1, closefd=False)  # noqa: SIM115
    sys.stderr = open(2, "w", buffering=1, closefd=False)  # noqa: SIM115
    os.environ.update(env)
    signal.signal(signal.SIGINT, signal.SIG_DFL)
    from heloco.cli import main

    sys.exit(main(argv))


class ForkedProc:
    """A ``multiprocessing`` child with the Popen methods :class:`LocalCluster` needs."""

    def __init__(
        self,
        ctx: multiprocessing.context.ForkServerContext,
        argv: list[str],
        log: Path,
        env: dict[str, str],
    ) -> None:
        self.proc = ctx.Process(target=_child_main, args=(argv, str(log), env), daemon=False)
        self.proc.start()
        assert self.proc.pid is not None
        self.pid = self.proc.pid

    def poll(self) -> int | None:
        return self.proc.exitcode

    def wait(self, timeout: float | None = None) -> int:
        self.proc.join(timeout)
        if self.proc.exitcode is None:
            raise subprocess.TimeoutExpired(f"pid {self.pid}", timeout or 0.0)
        return self.proc.exitcode

    def send_signal(self, sig: int) -> None:
        if self.proc.exitcode is None:
            os.kill(self.pid, sig)

    def terminate(self) -> None:
        self.send_signal(signal.SIGTERM)

    def kill(self) -> None:
        self.send_signal(signal.SIGKILL)


def fork_server() -> multiprocessing.context.ForkServerContext:
    """The fork-server context, preloading torch and the CLI modules once per parent process."""
    ctx = multiprocessing.get_context("forkserver")
    ctx.set_forkserver_preload(PRELOAD)
    return ctx


class LocalCluster:
    """Handles to a local server process and its worker processes."""

    def __init__(self, cfg: LaunchConfig, secret: bytes | None = None) -> None:
        self.cfg = cfg
        self.secret = secret or auth.new_secret()
        self.server: Proc | None = None
        self.workers: dict[int, Proc] = {}
        self._ctx = None if cfg.fresh_interpreters else fork_server()
        self.address = ""
        self.logs = cfg.out_dir / "logs"
        self._generation: dict[str, int] = {}

    def env(self) -> dict[str, str]:
        """What a child's environment adds: the secret (never on a command line), threads."""
        env = {auth.SECRET_ENV: self.secret.decode(), auth.SECRET_FILE_ENV: ""}
        if self.cfg.threads is not None:
            env["OMP_NUM_THREADS"] = str(self.cfg.threads)
        return env

    def _log(self, name: str) -> Path:
        self.logs.mkdir(parents=True, exist_ok=True)
        n = self._generation.get(name, 0)
        self._generation[name] = n + 1
        return self.logs / (f"{name}.log" if n == 0 else f"{name}.{n}.log")

    def _spawn(self, name: str, args: list[str]) -> Proc:
        log_path = self._log(name)
        if self._ctx is not None:
            return ForkedProc(self._ctx, args, log_path, self.env())
        with log_path.open("wb") as log:
            return subprocess.Popen(
                [sys.executable, "-m", "heloco", *args],
                env=os.environ | self.env(),
                stdout=log,
                stderr=subprocess.STDOUT,
            )

    def spawn_server(self, bind: str | None = None) -> None:
        """Start (or restart, on the same address) the server without waiting for it."""
        out = self.cfg.out_dir
        (out / ADDRESS_FILE).unlink(missing_ok=True)
        bind = bind or self.address or LOOPBACK
        if not bind.endswith(":0"):
            self.address = bind
        args = [
            "serve",
            "--config",
            str(self.cfg.config),
            "--out",
            str(out),
            "--bind",
            bind,
            *self.cfg.serve_args,
        ]
        self.server = self._spawn("server", args)

    def start_server(self, bind: str | None = None) -> str:
        """Start (or restart, on the same address) the server; returns its address once bound."""
        self.spawn_server(bind)
        return self.wait_for_server()

    def wait_for_server(self) -> str:
        """Block until the server has written the address it is listening on."""
        assert self.server is not None
        address_file = self.cfg.out_dir / ADDRESS_FILE
        deadline = time.monotonic() + self.cfg.startup_timeout_s
        while not address_file.is_file() or not address_file.read_text().strip():
            code = self.server.poll()
            if code is not None:
                raise RuntimeError(f"server exited with {code}; see {self.logs}")
            if time.monotonic() > deadline:
                self.stop()
                raise TimeoutError(f"server did not start within {self.cfg.startup_timeout_s} s")
            time.sleep(0.05)
        self.address = address_file.read_text().strip()
        return self.address

    def worker_args(self, w: int) -> list[str]:
        """The `heloco work` command line of worker ``w`` (pace, threads, report path)."""
        args = [
            "work",
            "--connect",
            self.address,
            "--worker",
            str(w),
            "--report",
            str(self.cfg.out_dir / "workers" / f"worker{w}.json"),
        ]
        if self.cfg.paces is not None:
            args += ["--pace", repr(self.cfg.paces[w])]
        if self.cfg.seconds_per_step is not None:
            args += ["--seconds-per-step", repr(self.cfg.seconds_per_step[w])]
        if self.cfg.threads is not None:
            args += ["--threads", str(self.cfg.threads)]
        return args + self.cfg.work_args

    def start_worker(self, w: int) -> Proc:
        """Start (or replace) worker ``w``."""
        self.workers[w] = self._spawn(f"worker{w}", self.worker_args(w))
        return self.workers[w]

    def start(self) -> None:
        """Server and workers at once (workers retry until the server is up); waits for bind."""
        self.spawn_server(free_loopback_address())
        for w in range(self.cfg.workers):
            self.start_worker(w)
        self.wait_for_server()

    def kill_server(self, sig: int = signal.SIGKILL) -> int:
        """Send ``sig`` to the server and wait up to 30 s; returns its exit code."""
        assert self.server is not None
        self.server.send_signal(sig)
        return self.server.wait(timeout=30)

    def kill_worker(self, w: int, sig: int = signal.SIGKILL) -> int:
        """Send ``sig`` to worker ``w`` and wait up to 30 s; returns its exit code."""
        proc = self.workers[w]
        proc.send_signal(sig)
        return proc.wait(timeout=30)

    def wait(self, timeout_s: float) -> int:
        """Wait for the server to finish, then for the workers; returns the server's code."""
        assert self.server is not None
        deadline = time.monotonic() + timeout_s
        try:
            code = self.server.wait(timeout=max(0.1, deadline - time.monotonic()))
            for proc in self.workers.values():
                proc.wait(timeout=max(0.1, deadline - time.monotonic()))
        except subprocess.TimeoutExpired:
            self.stop()
            raise
        return code

    def stop(self) -> None:
        """SIGTERM everything still running (the server writes a final checkpoint), then SIGKILL."""
        procs = [p for p in [self.server, *self.workers.values()] if p is not None]
        for p in procs:
            if p.poll() is None:
                p.terminate()
        for p in procs:
            try:
                p.wait(timeout=10)
            except subprocess.TimeoutExpired:
                p.kill()
                p.wait(timeout=10)


def launch(cfg: LaunchConfig, timeout_s: float) -> int:
    """Start everything, wait for the run to finish; returns the server's exit code."""
    if not timeout_s > 0:
        raise UserInputError("timeout_s", timeout_s, "a number of seconds > 0")
    cluster = LocalCluster(cfg)
    try:
        cluster.start()
        return cluster.wait(timeout_s)
    finally:
        cluster.stop()
