"""Local launches: a server and N workers as subprocesses on loopback, for demos and tests.

Keys come first: :func:`heloco.net.keys.generate` writes ``<out>/keys/`` (CURVE key pairs and
the HMAC secret; kept when the folder exists, so a resumed launch reuses them). The server
binds ``tcp://127.0.0.1`` on a free port with ``--keys <out>/keys/server`` and writes the
address it got to ``<out>/address.txt``; worker ``i`` gets the address and
``--keys <out>/keys/worker<i>``. No secret is ever on a command line. :class:`LocalCluster`
keeps handles to every process so tests can kill and restart them; :func:`launch` runs one to
completion and reports how every process ended.

Processes are forked from a ``multiprocessing`` fork server that has imported ``preload``
(torch, the CLI modules) once, so N workers do not each pay seconds of imports; each child
runs ``entry(argv)``, the command line's ``main`` that the caller passes in (this module
never imports the command line). ``fresh_interpreters=True`` runs ``python -m heloco``
subprocesses instead.

``LaunchConfig.netns`` puts named processes (``server``, ``worker<i>``) into network
namespaces (an emulated WAN, :mod:`heloco.net.wan`): a forked child joins its namespace before
it runs, a fresh interpreter starts under ``ip netns exec``; the server then binds
``LaunchConfig.host`` instead of loopback.
"""

from __future__ import annotations

import math
import multiprocessing
import multiprocessing.context
import os
import signal
import socket
import subprocess
import sys
import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Protocol

from heloco.net import auth, keys
from heloco.net.session import ADDRESS_FILE
from shardmeter.errors import UserInputError

Entry = Callable[[Sequence[str]], int]  # a command line's main(argv) -> exit code
KEYS_DIR = "keys"

LOOPBACK = "tcp://127.0.0.1:0"


def free_loopback_address(ports: int = 1) -> str:
    """A ``tcp://127.0.0.1:PORT`` whose port, and the ``ports - 1`` after it (a sharded
    server's), were free a moment ago (the OS picked the first)."""
    for _ in range(100):
        with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as s:
            s.bind(("127.0.0.1", 0))
            port = s.getsockname()[1]
        if port + ports <= 65536 and all(_free(p) for p in range(port + 1, port + ports)):
            return f"tcp://127.0.0.1:{port}"
    raise RuntimeError(f"no {ports} consecutive free loopback ports found")


def _free(port: int) -> bool:
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as s:
        try:
            s.bind(("127.0.0.1", port))
        except OSError:
            return False
    return True


@dataclass(frozen=True)
class LaunchConfig:
    """What to start. ``paces`` are seconds per inner step, one per worker, as in the run
    config and ``heloco simulate``; each worker makes its steps last at least that long
    (None: full speed). Extra CLI flags go to ``serve_args``/``work_args``. ``shards`` is
    the server's ``--shards``.
    """

    config: Path
    out_dir: Path
    workers: int
    paces: list[float] | None = None
    serve_args: list[str] = field(default_factory=list)
    work_args: list[str] = field(default_factory=list)
    threads: int | None = None
    startup_timeout_s: float = 60.0
    fresh_interpreters: bool = False
    shards: int = 1
    netns: dict[str, str] = field(default_factory=dict)  # process name -> network namespace
    host: str = "127.0.0.1"  # the server's address (its namespace's, under an emulated WAN)

    def __post_init__(self) -> None:
        if self.workers < 1:
            raise UserInputError("workers", self.workers, "an integer >= 1")
        if self.paces is not None and len(self.paces) != self.workers:
            raise UserInputError("paces", self.paces, f"{self.workers} values, one per worker")
        if self.paces is not None and any(not 0 < p < math.inf for p in self.paces):
            raise UserInputError("paces", self.paces, "seconds per step > 0")
        if self.threads is not None and self.threads < 1:
            raise UserInputError("threads", self.threads, "an integer >= 1")
        if self.shards < 1:
            raise UserInputError("shards", self.shards, "an integer >= 1")


TORCH_PRELOAD = ("torch", "torch._dynamo")  # torch.optim imports _dynamo lazily: pay it once


class Proc(Protocol):
    """The part of ``subprocess.Popen`` the cluster uses."""

    pid: int

    def poll(self) -> int | None: ...
    def wait(self, timeout: float | None = None) -> int: ...
    def send_signal(self, sig: int) -> None: ...
    def terminate(self) -> None: ...
    def kill(self) -> None: ...


def _child_main(
    entry: Entry, argv: list[str], log: str, env: dict[str, str], netns: str | None = None
) -> None:
    """Entry point of a forked child: join ``netns``, log to a file, set the environment,
    run ``entry``."""
    if netns is not None:
        from heloco.net.wan import join_netns

        join_netns(netns)
    fd = os.open(log, os.O_WRONLY | os.O_CREAT | os.O_TRUNC, 0o644)
    os.dup2(fd, 1)
    os.dup2(fd, 2)
    os.close(fd)
    sys.stdout = open(1, "w", buffering=1, closefd=False)  # noqa: SIM115
    sys.stderr = open(2, "w", buffering=1, closefd=False)  # noqa: SIM115
    os.environ.update(env)
    signal.signal(signal.SIGINT, signal.SIG_DFL)
    sys.exit(entry(argv))


class ForkedProc:
    """A ``multiprocessing`` child with the Popen methods :class:`LocalCluster` needs."""

    def __init__(
        self,
        ctx: multiprocessing.context.ForkServerContext,
        entry: Entry,
        argv: list[str],
        log: Path,
        env: dict[str, str],
        netns: str | None = None,
    ) -> None:
        self.proc = ctx.Process(
            target=_child_main, args=(entry, argv, str(log), env, netns), daemon=False
        )
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


def fork_server(preload: Sequence[str]) -> multiprocessing.context.ForkServerContext:
    """The fork-server context, preloading ``preload`` modules once per parent process."""
    ctx = multiprocessing.get_context("forkserver")
    ctx.set_forkserver_preload(list(preload))
    return ctx


class LocalCluster:
    """Handles to a local server process and its worker processes.

    ``entry`` is the command line's ``main`` each forked child runs, ``preload`` the modules
    the fork server imports once. ``secret`` seeds the HMAC secret of new key folders.
    """

    def __init__(
        self,
        cfg: LaunchConfig,
        entry: Entry,
        secret: bytes | None = None,
        preload: Sequence[str] = TORCH_PRELOAD,
    ) -> None:
        self.cfg = cfg
        self.entry = entry
        self.keys_dir = cfg.out_dir / KEYS_DIR
        keys.generate(self.keys_dir, cfg.workers, secret)
        self.secret = auth.load_secret(self.keys_dir / keys.SERVER / keys.HMAC_FILE)
        self.server: Proc | None = None
        self.workers: dict[int, Proc] = {}
        self._ctx = None if cfg.fresh_interpreters else fork_server(preload)
        self.address = ""
        self.logs = cfg.out_dir / "logs"
        self.latest_logs: dict[str, Path] = {}
        self._generation: dict[str, int] = {}

    def client_keys(self, name: str = keys.SERVER) -> keys.ClientKeys:
        """CURVE keys of one of the cluster's key folders (``server``: status queries)."""
        return keys.load_client(self.keys_dir / name)

    def env(self) -> dict[str, str]:
        """What a child's environment sets: no inherited secret (the key folders hold it),
        threads."""
        env = {auth.SECRET_ENV: "", auth.SECRET_FILE_ENV: ""}
        if self.cfg.threads is not None:
            env["OMP_NUM_THREADS"] = str(self.cfg.threads)
        return env

    def _log(self, name: str) -> Path:
        self.logs.mkdir(parents=True, exist_ok=True)
        n = self._generation.get(name, 0)
        self._generation[name] = n + 1
        path = self.logs / (f"{name}.log" if n == 0 else f"{name}.{n}.log")
        self.latest_logs[name] = path
        return path

    def _spawn(self, name: str, args: list[str]) -> Proc:
        log_path = self._log(name)
        netns = self.cfg.netns.get(name)
        if self._ctx is not None:
            return ForkedProc(self._ctx, self.entry, args, log_path, self.env(), netns)
        prefix = [] if netns is None else ["ip", "netns", "exec", netns]
        with log_path.open("wb") as log:
            return subprocess.Popen(
                [*prefix, sys.executable, "-m", "heloco", *args],
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
            "--keys",
            str(self.keys_dir / keys.SERVER),
            "--shards",
            str(self.cfg.shards),
            "--resume",  # a restarted server continues its run (a fresh folder has none)
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

    def worker_args(self, w: int, address: str | None = None) -> list[str]:
        """The `heloco work` command line of worker ``w`` (pace, threads, report path);
        ``address`` replaces the server's (a proxy in front of it)."""
        args = [
            "work",
            "--connect",
            address or self.address,
            "--worker",
            str(w),
            "--keys",
            str(self.keys_dir / f"worker{w}"),
            "--report",
            str(self.cfg.out_dir / "workers" / f"worker{w}.json"),
        ]
        if self.cfg.paces is not None:
            args += ["--pace", repr(self.cfg.paces[w])]
        if self.cfg.threads is not None:
            args += ["--threads", str(self.cfg.threads)]
        return args + self.cfg.work_args

    def start_worker(self, w: int, address: str | None = None) -> Proc:
        """Start (or replace) worker ``w``, connecting to ``address`` (default: the server)."""
        self.workers[w] = self._spawn(f"worker{w}", self.worker_args(w, address))
        return self.workers[w]

    def start(self) -> None:
        """Server and workers at once (workers retry until the server is up); waits for bind."""
        if "server" in self.cfg.netns:  # a namespace of its own: every port is free there
            from heloco.net.wan import PORT

            self.spawn_server(f"tcp://{self.cfg.host}:{PORT}")
        else:
            self.spawn_server(free_loopback_address(self.cfg.shards))
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


@dataclass(frozen=True)
class ProcessEnd:
    """How one launched process ended: its exit code (None: it had to be stopped)."""

    name: str
    code: int | None
    log: Path

    @property
    def ok(self) -> bool:
        """Exited by itself with code 0."""
        return self.code == 0


@dataclass(frozen=True)
class LaunchResult:
    """How the server and every worker of a launch ended."""

    server: ProcessEnd
    workers: list[ProcessEnd]

    @property
    def failures(self) -> list[ProcessEnd]:
        """The processes that did not exit by themselves with code 0."""
        return [p for p in [self.server, *self.workers] if not p.ok]


def launch(
    cfg: LaunchConfig,
    entry: Entry,
    timeout_s: float,
    watch: Callable[[], None] | None = None,
    grace_s: float = 30.0,
    preload: Sequence[str] = TORCH_PRELOAD,
) -> LaunchResult:
    """Start a server and ``cfg.workers`` workers and run them to the end (:func:`run_to_end`)."""
    if not timeout_s > 0:
        raise UserInputError("timeout_s", timeout_s, "a number of seconds > 0")
    cluster = LocalCluster(cfg, entry, preload=preload)
    try:
        cluster.start()
    except BaseException:
        cluster.stop()
        raise
    return run_to_end(cluster, timeout_s, watch, grace_s)


def run_to_end(
    cluster: LocalCluster,
    timeout_s: float,
    watch: Callable[[], None] | None = None,
    grace_s: float = 30.0,
) -> LaunchResult:
    """Wait until the server has finished the run (or ``timeout_s``); then stop everything.

    ``watch`` is called a few times a second (progress display). Workers learn from the
    server that the run is over and leave by themselves; the ones still running ``grace_s``
    after the server ended are stopped and count as failed. If every worker has exited while
    the server still waits for them, the server is stopped (it writes its final checkpoint).
    """
    assert cluster.server is not None
    server = cluster.server
    codes: dict[str, int | None] = {}
    try:
        deadline = time.monotonic() + timeout_s
        while server.poll() is None and time.monotonic() < deadline:
            if all(p.poll() is not None for p in cluster.workers.values()):
                server.terminate()
                server.wait(timeout=30)
                break
            if watch is not None:
                watch()
            time.sleep(0.2)
        codes["server"] = server.poll()
        leave_by = time.monotonic() + (grace_s if codes["server"] is not None else 0.0)
        for w, proc in cluster.workers.items():
            try:
                codes[f"worker{w}"] = proc.wait(timeout=max(0.0, leave_by - time.monotonic()))
            except subprocess.TimeoutExpired:
                codes[f"worker{w}"] = None
        if watch is not None:
            watch()
    finally:
        cluster.stop()
    logs = cluster.latest_logs
    return LaunchResult(
        ProcessEnd("server", codes.get("server"), logs["server"]),
        [
            ProcessEnd(f"worker{w}", codes.get(f"worker{w}"), logs[f"worker{w}"])
            for w in sorted(cluster.workers)
        ],
    )
