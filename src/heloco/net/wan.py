"""An emulated WAN on one machine: every process in its own network namespace, every byte
held back by the kernel's token bucket and every packet delayed by a userspace relay.

Layout (docs/wan.md)::

    endpoint ns "e0" (server)  --veth--+
    endpoint ns "e1" (worker0) --veth--+-- router ns "r" (forwards; relay on a TUN device)
    endpoint ns "e2" (worker1) --veth--+

- **Rate**: a ``tbf`` qdisc on each veth end. The endpoint's own end shapes its uplink (the
  sender's TCP sees the back-pressure, as behind a real access link); the router's end shapes
  its downlink. The server's link is one veth, so its rate is an uplink *shared* by every
  worker, as a real hub's is.
- **Delay**: ``netem`` is not built into every kernel (not into this one), so the router sends
  every forwarded packet through a TUN device to :func:`relay`, which writes it back after
  ``d_src + d_dst`` seconds (each endpoint's link adds half its round trip each way). The
  delay is on packets, not on a TCP byte stream, so TCP's window, slow start and ACK clock see
  the real round trip: a proxy that terminated TCP would hide exactly what the emulation is for.
  Links without delay skip the relay (no userspace cost).
- **MTU**: the relay is Python, so packets are large: the MTU is the slowest shaped rate × 1 ms
  (a packet never occupies the slowest link for more than 1 ms), clamped to [1500, 65000]
  bytes; about 1000 packets per second cross the relay at any rate.

Needs root (``ip netns``, veth, ``tc``) and ``/dev/net/tun`` when any delay is set;
:func:`unavailable` says in one line why it cannot run and what to do. Namespaces are named
``hlw<owner pid>-*``, removed by :meth:`EmulatedWan.close` (also on Ctrl-C), and ones whose
owner died are removed at the next start.
"""

from __future__ import annotations

import contextlib
import ctypes
import fcntl
import heapq
import os
import re
import select
import shutil
import signal
import socket
import struct
import subprocess
import sys
import threading
import time
from collections.abc import Sequence
from dataclasses import dataclass, field
from typing import Any

from shardmeter.errors import UserInputError

CLONE_NEWNET = 0x40000000  # <sched.h>
TUNSETIFF = 0x400454CA  # <linux/if_tun.h>
IFF_TUN, IFF_NO_PI = 0x0001, 0x1000
PR_SET_PDEATHSIG = 1  # <sys/prctl.h>
MIN_MTU, MAX_MTU = 1500, 65000
MTU_SLOT_S = 1e-3  # one packet occupies the slowest link for at most this long
PREFIX = "hlw"
TABLE = "100"  # policy-routing table that sends forwarded packets to the relay
PORT = 29500  # the server's port inside its namespace (all ports are free there)

# Linux's own defaults (Documentation/networking/ip-sysctl.rst: tcp_rmem max 6 MiB, tcp_wmem
# max 4 MiB; slow start restarts after an idle RTO, RFC 5681 section 4.1). Congestion control
# reno: stock Linux's CUBIC has Reno's slow start and restart (it differs after a loss), and a
# namespace may only choose one the host allows (net.ipv4.tcp_allowed_congestion_control: reno
# always is); the host's own may be BBR, whose start-up paces from its last bandwidth sample.
LINUX_TCP = {
    "net.ipv4.tcp_rmem": "4096 131072 6291456",
    "net.ipv4.tcp_wmem": "4096 16384 4194304",
    "net.ipv4.tcp_slow_start_after_idle": "1",
    "net.ipv4.tcp_congestion_control": "reno",
}

_UNITS = {"bit": 1.0, "kbit": 1e3, "mbit": 1e6, "gbit": 1e9, "tbit": 1e12}
_TIME_UNITS = {"s": 1.0, "ms": 1e-3, "us": 1e-6}


class WanUnavailable(RuntimeError):
    """Shaping cannot run here; the message says why and what to do, in one line."""


@dataclass(frozen=True)
class LinkSpec:
    """One endpoint's access link. ``up_bps``/``down_bps`` in bit/s (None: unshaped);
    ``rtt_s`` the round trip it adds (half each way) in seconds."""

    up_bps: float | None = None
    down_bps: float | None = None
    rtt_s: float = 0.0

    def __post_init__(self) -> None:
        for name, v in (("up", self.up_bps), ("down", self.down_bps)):
            if v is not None and not (1e3 <= v <= 1e11):
                raise UserInputError(f"{name} rate", v, "1kbit..100gbit")
        if not 0.0 <= self.rtt_s <= 10.0:
            raise UserInputError("rtt", self.rtt_s, "0..10 s")

    @property
    def one_way_s(self) -> float:
        """Seconds this link adds to a packet in one direction."""
        return self.rtt_s / 2.0

    def describe(self) -> str:
        def rate(v: float | None) -> str:
            return "unshaped" if v is None else f"{v / 1e6:g} Mbit/s"

        return f"up {rate(self.up_bps)}, down {rate(self.down_bps)}, rtt {self.rtt_s * 1e3:g} ms"


def parse_rate(text: str) -> float:
    """``100Mbit``, ``1gbit``, ``2.5e6bit`` -> bit/s (tc's units: bit, kbit, mbit, gbit)."""
    m = re.fullmatch(r"\s*([0-9.eE+]+)\s*([a-zA-Z]*)\s*", text)
    unit = (m.group(2) or "bit").lower() if m else ""
    if m is None or unit not in _UNITS:
        raise UserInputError("bw", text, "a rate like 100Mbit, 1Gbit or 500kbit")
    try:
        return float(m.group(1)) * _UNITS[unit]
    except ValueError:
        raise UserInputError("bw", text, "a rate like 100Mbit, 1Gbit or 500kbit") from None


def parse_time(text: str, name: str = "rtt") -> float:
    """``40ms``, ``0.1s``, ``0`` -> seconds."""
    m = re.fullmatch(r"\s*([0-9.eE+]+)\s*(s|ms|us)?\s*", text)
    try:
        if m is None:
            raise ValueError
        return float(m.group(1)) * _TIME_UNITS[m.group(2) or "s"]
    except ValueError:
        raise UserInputError(name, text, "a time like 40ms or 0.1s") from None


def parse_link(text: str) -> LinkSpec:
    """``bw=100Mbit,rtt=40ms`` (or ``up=..,down=..``) -> :class:`LinkSpec`; ``none``: a
    link that is neither shaped nor delayed."""
    if text.strip().lower() in ("none", ""):
        return LinkSpec()
    fields: dict[str, str] = {}
    for part in text.split(","):
        key, sep, value = part.partition("=")
        key = key.strip().lower()
        if not sep or key not in ("bw", "up", "down", "rtt"):
            raise UserInputError("--wan", text, "comma-separated bw=RATE, up=, down=, rtt=TIME")
        fields[key] = value
    bw = parse_rate(fields["bw"]) if "bw" in fields else None
    up = parse_rate(fields["up"]) if "up" in fields else bw
    down = parse_rate(fields["down"]) if "down" in fields else bw
    rtt = parse_time(fields["rtt"]) if "rtt" in fields else 0.0
    return LinkSpec(up, down, rtt)


def parse_links(text: str, workers: int) -> list[LinkSpec]:
    """One link spec for every worker, or ``;``-separated, one per worker."""
    parts = [p for p in text.split(";")]
    if len(parts) == 1:
        return [parse_link(parts[0])] * workers
    if len(parts) != workers:
        raise UserInputError("--wan", text, f"one spec, or {workers} separated by ';'")
    return [parse_link(p) for p in parts]


def topology_links(pace_map: object, topology: str, scale: float) -> list[LinkSpec]:
    """One link per island of a ShardMeter topology (its worker's path to the server island):
    the path's bandwidth (ShardMeter's ``wan_paths``, bytes/s × 8) × ``scale`` both ways and
    its round trip; the server island's own link is unshaped."""
    from shardmeter.estimate.wan import wan_paths
    from shardmeter.specs.topology import load_topology

    paths = wan_paths(load_topology(topology))
    links = []
    for i in range(paths.n):
        if i == paths.center:
            links.append(LinkSpec())
            continue
        bw = float(paths.bandwidth_Bps[i, paths.center]) * 8.0 * scale
        if not 1e3 <= bw <= 1e11:
            raise UserInputError(
                "--wan-scale", scale, f"a factor giving 1kbit..100gbit (got {bw:g} bit/s)"
            )
        links.append(LinkSpec(bw, bw, float(paths.rtt_s[i, paths.center])))
    return links


def unavailable(need_tun: bool = True) -> str | None:
    """Why the emulated WAN cannot run on this machine (one line, with what to do), or None."""
    if sys.platform != "linux":
        return "the emulated WAN needs Linux network namespaces; run it on Linux"
    if os.geteuid() != 0:
        return (
            "the emulated WAN needs root (network namespaces, veth, tc); run it with sudo, "
            "or in a container with CAP_NET_ADMIN, or leave out --wan/--topology"
        )
    for tool in ("ip", "tc"):
        if shutil.which(tool) is None:
            return f"the emulated WAN needs `{tool}`; install iproute2 (apt-get install iproute2)"
    if need_tun and not os.path.exists("/dev/net/tun"):
        return "delays need /dev/net/tun (modprobe tun); or set rtt=0 for rate shaping only"
    probe = f"{PREFIX}probe{os.getpid()}"
    try:
        _ip("netns", "add", probe)
        _ip("-n", probe, "link", "set", "lo", "up")
        _run(["tc", "-n", probe, "qdisc", "add", "dev", "lo", "root", "tbf", "rate", "1mbit",
              "burst", "10kb", "latency", "10ms"])  # fmt: skip
    except WanUnavailable as exc:
        return (
            f"network namespaces or the tbf qdisc are not usable here ({exc}); need CAP_NET_ADMIN"
        )
    finally:
        subprocess.run(["ip", "netns", "del", probe], capture_output=True, check=False)
    return None


def _run(cmd: Sequence[str]) -> str:
    r = subprocess.run(list(cmd), capture_output=True, text=True, check=False)
    if r.returncode != 0:
        raise WanUnavailable(f"`{' '.join(cmd)}` failed: {r.stderr.strip() or r.returncode}")
    return r.stdout


def _ip(*args: str) -> str:
    return _run(["ip", *args])


def choose_mtu(rates_bps: Sequence[float]) -> int:
    """The MTU of an emulated WAN: slowest rate × MTU_SLOT_S, in [MIN_MTU, MAX_MTU] bytes."""
    if not rates_bps:
        return MAX_MTU
    return int(min(MAX_MTU, max(MIN_MTU, min(rates_bps) * MTU_SLOT_S / 8.0)))


def tbf_args(rate_bps: float, mtu: int, queue_s: float) -> list[str]:
    """tbf parameters: bucket 2 packets (or 1 ms of rate), queue ``queue_s`` at the rate."""
    burst = max(2 * (mtu + 14), int(rate_bps * 1e-3 / 8))
    limit = max(4 * burst, int(rate_bps * queue_s / 8), 256 * 1024)
    return ["tbf", "rate", f"{int(rate_bps)}bit", "burst", str(burst), "limit", str(limit)]


def reap_stale() -> list[str]:
    """Remove ``hlw<pid>-*`` namespaces whose owner process is gone; returns their names."""
    r = subprocess.run(["ip", "netns", "list"], capture_output=True, text=True, check=False)
    gone = []
    for line in r.stdout.splitlines():
        name = line.split()[0] if line.split() else ""
        m = re.fullmatch(rf"{PREFIX}(\d+)-\w+", name)
        if m and not _alive(int(m.group(1))):
            subprocess.run(["ip", "netns", "del", name], capture_output=True, check=False)
            gone.append(name)
    return gone


def _alive(pid: int) -> bool:
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    except PermissionError:
        return True
    return True


def _raise_interrupt(signum: int, frame: object) -> None:
    raise KeyboardInterrupt(f"signal {signum}")


def join_netns(name: str) -> None:
    """Move the calling (single-threaded) process into network namespace ``name``."""
    libc = ctypes.CDLL(None, use_errno=True)
    fd = os.open(f"/var/run/netns/{name}", os.O_RDONLY)
    try:
        if libc.setns(fd, CLONE_NEWNET) != 0:
            err = ctypes.get_errno()
            raise OSError(err, f"setns({name}): {os.strerror(err)}")
    finally:
        os.close(fd)


@dataclass
class EmulatedWan:
    """Endpoints (``names[i]`` with ``links[i]``) joined through a router namespace.

    Use as a context manager; :meth:`address` is endpoint ``i``'s IPv4 address, :meth:`netns`
    its namespace (for :func:`join_netns` or ``ip netns exec``), :meth:`popen` runs a command
    inside it. ``queue_s`` is the router's queue per downlink, in seconds at its rate.
    ``tcp_defaults``: the endpoints run stock Linux TCP buffers (:data:`LINUX_TCP`), whatever
    this machine's own are (a new namespace copies them), so windows are a stock host's.
    """

    names: list[str]
    links: list[LinkSpec]
    queue_s: float = 0.25
    tcp_defaults: bool = True
    mtu: int = 0
    tag: str = ""
    _relay: subprocess.Popen[bytes] | None = field(default=None, repr=False)
    _made: list[str] = field(default_factory=list, repr=False)
    _old_term: Any = field(default=None, repr=False)

    def __post_init__(self) -> None:
        if len(self.names) != len(self.links) or not self.names:
            raise UserInputError("links", len(self.links), f"{len(self.names)}, one per endpoint")
        if len(self.names) > 250:
            raise UserInputError("endpoints", len(self.names), "at most 250")
        rates = [r for ln in self.links for r in (ln.up_bps, ln.down_bps) if r is not None]
        self.mtu = self.mtu or choose_mtu(rates)
        self.tag = self.tag or f"{PREFIX}{os.getpid()}-{os.urandom(2).hex()}"

    @property
    def delayed(self) -> bool:
        return any(ln.rtt_s > 0 for ln in self.links)

    def netns(self, i: int) -> str:
        return f"{self.tag}e{i}"

    @property
    def router(self) -> str:
        return f"{self.tag}r"

    def address(self, i: int) -> str:
        return f"10.77.{i}.2"

    def index(self, name: str) -> int:
        return self.names.index(name)

    def __enter__(self) -> EmulatedWan:
        self.start()
        if threading.current_thread() is threading.main_thread():
            # SIGTERM unwinds like Ctrl-C so the namespaces go too (SIGKILL: reap_stale)
            self._old_term = signal.signal(signal.SIGTERM, _raise_interrupt)
        return self

    def __exit__(self, *exc: object) -> None:
        try:
            self.close()
        finally:
            if self._old_term is not None:
                signal.signal(signal.SIGTERM, self._old_term)
                self._old_term = None

    def start(self) -> None:
        """Create the namespaces, links, qdiscs and relay; refuses with WanUnavailable."""
        why = unavailable(need_tun=self.delayed)
        if why is not None:
            raise WanUnavailable(why)
        reap_stale()
        try:
            self._build()
        except BaseException:
            self.close()
            raise

    def _build(self) -> None:
        r = self.router
        _ip("netns", "add", r)
        self._made.append(r)
        _ip("-n", r, "link", "set", "lo", "up")
        for key in ("net.ipv4.ip_forward=1", "net.ipv4.conf.all.rp_filter=0",
                    "net.ipv4.conf.default.rp_filter=0"):  # fmt: skip
            _run(["ip", "netns", "exec", r, "sysctl", "-qw", key])
        for i, link in enumerate(self.links):
            ns = self.netns(i)
            _ip("netns", "add", ns)
            self._made.append(ns)
            _ip("-n", r, "link", "add", f"v{i}", "type", "veth", "peer", "name", "wan0",
                "netns", ns)  # fmt: skip
            _ip("-n", ns, "link", "set", "lo", "up")
            if self.tcp_defaults:
                for key, value in LINUX_TCP.items():
                    _run(["ip", "netns", "exec", ns, "sysctl", "-qw", f"{key}={value}"])
            for where, dev in ((ns, "wan0"), (r, f"v{i}")):
                _ip("-n", where, "link", "set", dev, "mtu", str(self.mtu), "up")
            _ip("-n", r, "addr", "add", f"10.77.{i}.1/24", "dev", f"v{i}")
            _ip("-n", ns, "addr", "add", f"{self.address(i)}/24", "dev", "wan0")
            _ip("-n", ns, "route", "add", "default", "via", f"10.77.{i}.1")
            if link.up_bps is not None:
                _run(["tc", "-n", ns, "qdisc", "add", "dev", "wan0", "root",
                      *tbf_args(link.up_bps, self.mtu, self.queue_s)])  # fmt: skip
            if link.down_bps is not None:
                _run(["tc", "-n", r, "qdisc", "add", "dev", f"v{i}", "root",
                      *tbf_args(link.down_bps, self.mtu, self.queue_s)])  # fmt: skip
        if self.delayed:
            self._start_relay()

    def _start_relay(self) -> None:
        r = self.router
        _ip("-n", r, "tuntap", "add", "dev", "wtun", "mode", "tun")
        _ip("-n", r, "link", "set", "wtun", "mtu", str(MAX_MTU), "up")
        _run(["ip", "netns", "exec", r, "sysctl", "-qw", "net.ipv4.conf.wtun.rp_filter=0"])
        _ip("-n", r, "route", "add", "default", "dev", "wtun", "table", TABLE)
        for i in range(len(self.links)):
            _ip("-n", r, "rule", "add", "iif", f"v{i}", "lookup", TABLE)
        delays = ",".join(f"{ln.one_way_s!r}" for ln in self.links)
        cmd = ["ip", "netns", "exec", r, sys.executable, "-m", "heloco.net.wan", "relay",
               "wtun", delays]  # fmt: skip
        self._relay = subprocess.Popen(cmd, stdout=subprocess.PIPE)
        assert self._relay.stdout is not None
        line = self._relay.stdout.readline()
        if line.strip() != b"ready":
            raise WanUnavailable(f"the delay relay did not start (exit {self._relay.poll()})")

    def popen(self, i: int, argv: Sequence[str], **kw: object) -> subprocess.Popen[bytes]:
        """``argv`` run inside endpoint ``i``'s namespace."""
        return subprocess.Popen(["ip", "netns", "exec", self.netns(i), *argv], **kw)  # type: ignore[call-overload]

    def close(self) -> None:
        """Stop the relay and delete every namespace this WAN made (idempotent)."""
        if self._relay is not None:
            if self._relay.poll() is None:
                self._relay.terminate()
                try:
                    self._relay.wait(timeout=5)
                except subprocess.TimeoutExpired:
                    self._relay.kill()
                    self._relay.wait()
            self._relay = None
        for ns in reversed(self._made):
            subprocess.run(["ip", "netns", "del", ns], capture_output=True, check=False)
        self._made.clear()


# --- the delay relay (runs inside the router namespace) ------------------------------------


def _open_tun(name: str) -> int:
    fd = os.open("/dev/net/tun", os.O_RDWR)
    fcntl.ioctl(fd, TUNSETIFF, struct.pack("16sH", name.encode(), IFF_TUN | IFF_NO_PI))
    os.set_blocking(fd, False)
    return fd


def relay(tun: str, one_way_s: Sequence[float]) -> None:
    """Hold every IPv4 packet read from ``tun`` for ``d[src] + d[dst]`` seconds, then write it
    back (the router forwards it on). Endpoint ``i`` is the subnet ``10.77.i.0/24``; other
    packets pass at once. Runs until SIGTERM or its parent dies."""
    with contextlib.suppress(OSError):
        ctypes.CDLL(None).prctl(PR_SET_PDEATHSIG, signal.SIGTERM)
    signal.signal(signal.SIGTERM, lambda *_: sys.exit(0))
    fd = _open_tun(tun)
    d = list(one_way_s)
    n = len(d)
    print("ready", flush=True)
    heap: list[tuple[float, int, bytes]] = []
    seq = 0
    poll = select.poll()
    poll.register(fd, select.POLLIN)
    while True:
        now = time.monotonic()
        while heap and heap[0][0] <= now:
            with contextlib.suppress(OSError):  # a full device drops, as a real queue would
                os.write(fd, heapq.heappop(heap)[2])
        wait_ms = -1 if not heap else max(0.0, (heap[0][0] - now) * 1e3)
        if not poll.poll(wait_ms if wait_ms < 0 else max(wait_ms, 0.05)):
            continue
        now = time.monotonic()
        while True:
            try:
                pkt = os.read(fd, MAX_MTU + 64)
            except BlockingIOError:
                break
            delay = 0.0
            if len(pkt) >= 20 and pkt[0] >> 4 == 4 and pkt[12] == 10 and pkt[16] == 10:
                s, t = pkt[14], pkt[18]
                delay = (d[s] if s < n else 0.0) + (d[t] if t < n else 0.0)
            seq += 1
            heapq.heappush(heap, (now + delay, seq, pkt))


# --- probes: achieved rate and added delay between two endpoints ---------------------------


@dataclass(frozen=True)
class ProbeResult:
    """What a probe measured: goodput in bit/s over the steady half of a bulk transfer, and
    the median TCP round trip of small messages, in seconds."""

    rate_bps: float
    rtt_s: float


def _sink(port: int) -> None:
    """Accept one connection; answer 64-byte pings, then time a bulk transfer; print JSON."""
    srv = socket.create_server(("0.0.0.0", port))
    print("ready", flush=True)
    conn, _ = srv.accept()
    conn.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)
    (pings,) = struct.unpack("!I", _recv_exact(conn, 4))
    for _ in range(pings):
        conn.sendall(_recv_exact(conn, 64))
    (total,) = struct.unpack("!Q", _recv_exact(conn, 8))
    got, marks = 0, []
    buf = bytearray(1 << 20)
    while got < total:
        k = conn.recv_into(buf)
        if not k:
            raise ConnectionError(f"probe source left after {got} of {total} bytes")
        got += k
        marks.append((time.monotonic(), got))
    half = next(m for m in marks if m[1] >= total / 2)
    rate = (marks[-1][1] - half[1]) * 8 / max(1e-9, marks[-1][0] - half[0])
    print(f"{rate!r} {marks[0][0]!r} {marks[-1][0]!r}", flush=True)  # + first/last byte time
    conn.sendall(b"k")


def _recv_exact(conn: socket.socket, n: int) -> bytes:
    got = b""
    while len(got) < n:
        chunk = conn.recv(n - len(got))
        if not chunk:
            raise ConnectionError(f"peer left after {len(got)} of {n} bytes")
        got += chunk
    return got


def _source(host: str, port: int, nbytes: int, pings: int, hold: bool = False) -> None:
    """Ping the sink, then send ``nbytes``; with ``hold``, print "connected" after the pings and
    wait for a line on stdin first (so that several sources start their bulk at once)."""
    conn = socket.create_connection((host, port))
    conn.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)
    conn.sendall(struct.pack("!I", pings))
    rtts = []
    for _ in range(pings):
        t = time.monotonic()
        conn.sendall(b"x" * 64)
        _recv_exact(conn, 64)
        rtts.append(time.monotonic() - t)
    if hold:
        print("connected", flush=True)
        sys.stdin.readline()
    conn.sendall(struct.pack("!Q", nbytes))
    block = b"\0" * (1 << 20)
    left = nbytes
    while left > 0:
        conn.sendall(block[: min(left, len(block))])
        left -= len(block)
    conn.recv(1)
    rtts.sort()
    print(f"{rtts[len(rtts) // 2]!r}", flush=True)


def probe(wan: EmulatedWan, src: int, dst: int, nbytes: int, pings: int = 9) -> ProbeResult:
    """Send ``nbytes`` from endpoint ``src`` to ``dst`` through ``wan``: goodput and RTT."""
    py = [sys.executable, "-m", "heloco.net.wan"]
    sink = wan.popen(dst, [*py, "sink", str(PORT)], stdout=subprocess.PIPE)
    try:
        assert sink.stdout is not None
        if sink.stdout.readline().strip() != b"ready":
            raise RuntimeError("probe sink did not start")
        source = wan.popen(
            src, [*py, "source", wan.address(dst), str(PORT), str(nbytes), str(pings)],
            stdout=subprocess.PIPE,
        )  # fmt: skip
        out, _ = source.communicate(timeout=600)
        rate = float(sink.stdout.readline().split()[0])
        sink.wait(timeout=30)
        return ProbeResult(rate, float(out))
    finally:
        for p in (sink,):
            if p.poll() is None:
                p.kill()
                p.wait()


def main(argv: Sequence[str]) -> None:
    """``relay TUN D0,D1,..`` | ``sink PORT`` | ``source HOST PORT BYTES PINGS [hold]``."""
    cmd, *rest = argv
    if cmd == "relay":
        relay(rest[0], [float(x) for x in rest[1].split(",")])
    elif cmd == "sink":
        _sink(int(rest[0]))
    elif cmd == "source":
        _source(rest[0], int(rest[1]), int(rest[2]), int(rest[3]), rest[4:] == ["hold"])
    else:
        raise SystemExit(f"unknown command {cmd!r}")


if __name__ == "__main__":
    main(sys.argv[1:])
