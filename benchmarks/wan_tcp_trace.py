"""What the kernel's TCP does to HeLoCo's exchange over emulated WAN links: per worker and
direction, the congestion window each leg starts and ends with, the smoothed RTT at its end,
the RTO and the longest idle between sends.

    python benchmarks/wan_tcp_trace.py --exchange streaming          # as root, about 1 minute

One ``heloco launch --wan`` (the streaming sweep's four links of benchmarks/wan_fidelity.py by
default, H = 10 steps of 0.1 s, P = 2), traced two ways while it runs:

* the kernel's ``tcp:tcp_probe`` tracepoint (tracefs), filtered on the server's port: every
  segment a socket receives, with its ``snd_cwnd`` (segments) and ``srtt`` (µs) at that moment.
  A leg is a run of ACKs that advance ``snd_una`` with no gap over ``--gap`` seconds; its
  start window is the cwnd at its first ACK (the restart window plus that ACK's growth);
* ``ss -tie`` every 40 ms inside the server's and each worker's namespace: ``rto`` and
  ``lastsnd`` (ms since the socket last sent data; its value just before a send resets it is
  the idle that send sees, what Linux's tcp_cwnd_restart compares with the RTO). Medians
  over the legs after ``--skip`` seconds of start-up; RTO the median and idle the 95th
  percentile of the whole run's ss samples.

The worker's socket sends the pushes, the server's the dispatches (docs/wan.md, "The TCP
window over an idle connection"). Needs root and tracefs (/sys/kernel/tracing).
"""

from __future__ import annotations

import argparse
import contextlib
import re
import statistics
import subprocess
import sys
import tempfile
import threading
import time
from dataclasses import dataclass
from pathlib import Path

TRACEFS = Path("/sys/kernel/tracing")
PROBE = TRACEFS / "events" / "tcp" / "tcp_probe"
DEFAULT_WAN = "bw=30Mbit,rtt=0ms;bw=12Mbit,rtt=20ms;bw=20Mbit,rtt=150ms;bw=4Mbit,rtt=40ms"
LINE = re.compile(
    r" (\d+\.\d+): tcp_probe: .*?src=([\d.]+):(\d+) dest=([\d.]+):(\d+) .*?snd_nxt=0x[0-9a-f]+ "
    r"snd_una=(0x[0-9a-f]+) snd_cwnd=(\d+) .*?srtt=(\d+) .*?sock_cookie=([0-9a-f]+)"
)
SS_COOKIE = re.compile(r"\ssk:([0-9a-f]+)")
SS_SOCK = re.compile(r"\s([\d.]+):(\d+)\s+([\d.]+):(\d+)\s")
SS_INFO = re.compile(r"rto:([\d.]+) .*?rtt:([\d.]+)/")
SS_LASTSND = re.compile(r"lastsnd:(\d+)")
BUSY_KB = 10.0  # a queue toward the server above this (kB, about 7 segments) counts as busy
BACKLOG = re.compile(r"backlog (\d+[KM]?b)")


@dataclass(frozen=True)
class Leg:
    """One leg as the sender's socket saw its ACKs: start time (s), bytes acknowledged, the
    cwnd (segments) at its first and last ACK, the smoothed RTT (ms) at its last ACK."""

    t0: float
    nbytes: int
    cwnd_first: int
    cwnd_last: int
    srtt_end_ms: float
    t1: float = 0.0  # time of its last ACK (s)
    srtt_first_ms: float = 0.0  # the smoothed RTT at its first ACK (ms)


def legs(samples: list[tuple[float, int, int, float]], gap: float, min_bytes: int) -> list[Leg]:
    """ACK-advancing samples (time, snd_una, cwnd, srtt µs) grouped into legs."""
    out: list[Leg] = []
    cur: dict[str, float] | None = None
    prev_una = samples[0][1] if samples else 0
    last_t = -1e9
    for t, una, cwnd, srtt in samples:
        adv = (una - prev_una) % 2**32
        prev_una = una
        if adv == 0:
            continue
        if cur is None or t - last_t > gap:
            if cur is not None and cur["bytes"] >= min_bytes:
                out.append(_leg(cur))
            cur = {"t0": t, "bytes": 0.0, "first": cwnd, "srtt0": srtt}
        cur["bytes"] += adv
        cur["last"], cur["srtt"], cur["t1"] = cwnd, srtt, t
        last_t = t
    if cur is not None and cur["bytes"] >= min_bytes:
        out.append(_leg(cur))
    return out


def _leg(c: dict[str, float]) -> Leg:
    return Leg(c["t0"], int(c["bytes"]), int(c["first"]), int(c["last"]), c["srtt"] / 1e3,
               c["t1"], c["srtt0"] / 1e3)  # fmt: skip


def parse_probe(
    text: str, port: int, cookies: set[str] | None = None
) -> dict[tuple[str, str], list[tuple[float, int, int, float]]]:
    """tcp_probe lines per connection, keyed (local address, peer address); only the sockets
    whose cookies are given (those ss saw in this launch's namespaces: the tracepoint sees
    every namespace, and another launch may use the same addresses)."""
    out: dict[tuple[str, str], list[tuple[float, int, int, float]]] = {}
    for line in text.splitlines():
        m = LINE.search(line)
        if m is None:
            continue
        t, sa, sp, da, dp, una, cwnd, srtt, cookie = m.groups()
        if int(sp) != port and int(dp) != port:
            continue
        if cookies and cookie not in cookies:
            continue
        out.setdefault((f"{sa}:{sp}", f"{da}:{dp}"), []).append(
            (float(t), int(una, 16), int(cwnd), float(srtt))
        )
    return out


def parse_ss(text: str) -> dict[tuple[str, str], list[tuple[float, float]]]:
    """(rto ms, lastsnd ms) samples per connection from ``ss -tieH`` output."""
    out: dict[tuple[str, str], list[tuple[float, float]]] = {}
    key: tuple[str, str] | None = None
    for line in text.splitlines():
        sock = SS_SOCK.search(" " + line + " ")
        if sock is not None and not line.startswith("\t"):
            key = (f"{sock.group(1)}:{sock.group(2)}", f"{sock.group(3)}:{sock.group(4)}")
            continue
        info = SS_INFO.search(line)
        if key is not None and info is not None:
            snd = SS_LASTSND.search(line)
            out.setdefault(key, []).append(
                (float(info.group(1)), float(snd.group(1)) if snd else 0.0)
            )
    return out


def _poll_ss(ns: str, stop: threading.Event, sink: list[str]) -> None:
    while not stop.is_set():
        proc = subprocess.run(["ip", "netns", "exec", ns, "ss", "-tieH", "state", "established"],
                              capture_output=True, text=True, check=False)  # fmt: skip
        sink.append(proc.stdout)
        time.sleep(0.04)


def _poll_backlog(ns: str, stop: threading.Event, sink: list[tuple[float, int]]) -> None:
    """(monotonic time, bytes queued) of the router's qdisc toward the server (``v0``): the
    queue the pushes fill on a shared server link, which the dispatches' ACKs also cross."""
    while not stop.is_set():
        proc = subprocess.run(["tc", "-n", ns, "-s", "qdisc", "show", "dev", "v0"],
                              capture_output=True, text=True, check=False)  # fmt: skip
        m = BACKLOG.search(proc.stdout)
        if m is not None:
            sink.append((time.monotonic(), _bytes(m.group(1))))
        time.sleep(0.01)


def _bytes(text: str) -> int:
    """tc's backlog figure (``12345b``, ``301Kb``, ``1Mb``) in bytes."""
    num = float(re.match(r"[\d.]+", text).group(0))  # type: ignore[union-attr]
    return int(num * (1024 if "K" in text else 1024 * 1024 if "M" in text else 1))


ECHO_PORT = 29601  # the UDP echo's port in the server's namespace (--echo)
ECHO_EVERY_S = 0.005  # one echo probe per worker this often


def _echo_server(port: int) -> None:
    """Answer every UDP datagram with itself plus this host's monotonic time of arrival."""
    import socket
    import struct

    sock = socket.socket(socket.AF_INET, socket.SOCK_DGRAM)
    sock.bind(("0.0.0.0", port))
    while True:
        data, addr = sock.recvfrom(64)
        sock.sendto(data + struct.pack("!d", time.monotonic()), addr)


def _echo_client(host: str, port: int, every_s: float) -> None:
    """Send a 16-byte datagram every ``every_s`` (a sequence number and the send time) and
    print, per answer: send time, the server's arrival time, the answer's arrival time
    (all monotonic: one clock for every namespace of the host), so one-way delays show."""
    import select
    import socket
    import struct

    sock = socket.socket(socket.AF_INET, socket.SOCK_DGRAM)
    sock.connect((host, port))
    seq, nxt = 0, time.monotonic()
    while True:
        now = time.monotonic()
        if now >= nxt:
            with contextlib.suppress(OSError):  # a route not up yet: the next one
                sock.send(struct.pack("!qd", seq, now))
            seq, nxt = seq + 1, nxt + every_s
        if select.select([sock], [], [], max(0.0, nxt - time.monotonic()))[0]:
            try:
                data = sock.recv(64)
            except OSError:
                continue
            _, sent, at_server = struct.unpack("!qdd", data[:24])
            print(f"{sent:.6f} {at_server:.6f} {time.monotonic():.6f}", flush=True)


def _start_echo(new: list[str], sinks: dict[str, list[str]]) -> list[subprocess.Popen[str]]:
    """The UDP echo: its server in the launch's server namespace (``...e0``), a client in each
    worker's, each client's lines into ``sinks[worker address]``."""
    server_ns = next(n for n in new if n.endswith("e0"))
    me = [sys.executable, str(Path(__file__).resolve())]
    procs = [subprocess.Popen(["ip", "netns", "exec", server_ns, *me, "echo-server",
                               str(ECHO_PORT)])]  # fmt: skip
    time.sleep(0.3)
    for ns in new:
        i = int(re.search(r"e(\d+)$", ns).group(1))  # type: ignore[union-attr]
        if i == 0:
            continue
        sink = sinks.setdefault(f"10.77.{i}.2", [])
        proc = subprocess.Popen(["ip", "netns", "exec", ns, *me, "echo-client", "10.77.0.2",
                                 str(ECHO_PORT), str(ECHO_EVERY_S)], stdout=subprocess.PIPE,
                                text=True)  # fmt: skip
        threading.Thread(target=_drain, args=(proc, sink), daemon=True).start()
        procs.append(proc)
    return procs


def _drain(proc: subprocess.Popen[str], sink: list[str]) -> None:
    assert proc.stdout is not None
    for line in proc.stdout:
        sink.append(line)


def trace(
    argv: list[str],
    seconds: float,
    backlog: list[tuple[float, int]] | None = None,
    echo: dict[str, list[str]] | None = None,
) -> tuple[str, str]:
    """Run the launch ``argv`` under the tracepoint and the ss pollers; (probe text, ss text).
    With ``backlog``, also polls the router's queue toward the server into it; the trace clock
    is then ``mono`` (the same as time.monotonic) for the run, so the two line up."""
    from heloco.net.wan import PORT

    if not PROBE.exists():
        subprocess.run(["mount", "-t", "tracefs", "nodev", str(TRACEFS)], capture_output=True,
                       check=False)  # fmt: skip
    if not PROBE.exists():
        raise SystemExit(f"wan_tcp_trace: no {PROBE}; needs root and tracefs")
    before = set(_namespaces())
    (TRACEFS / "tracing_on").write_text("0")
    clock = re.search(r"\[(\w+)\]", (TRACEFS / "trace_clock").read_text())
    if backlog is not None:
        (TRACEFS / "trace_clock").write_text("mono")
    (TRACEFS / "trace").write_text("")
    (PROBE / "filter").write_text(f"sport == {PORT} || dport == {PORT}")
    (PROBE / "enable").write_text("1")
    (TRACEFS / "tracing_on").write_text("1")
    with tempfile.TemporaryFile() as pipe_out:
        reader = subprocess.Popen(["cat", str(TRACEFS / "trace_pipe")], stdout=pipe_out)
        stop, sinks, threads = threading.Event(), [], []
        launch = subprocess.Popen(argv, stdout=subprocess.DEVNULL, stderr=subprocess.PIPE)
        try:
            deadline = time.monotonic() + 60
            while time.monotonic() < deadline and launch.poll() is None:
                new = [n for n in _namespaces() if n not in before and re.search(r"e\d+$", n)]
                if len(new) >= 2:
                    time.sleep(0.5)
                    new = [n for n in _namespaces() if n not in before and re.search(r"e\d+$", n)]
                    break
                time.sleep(0.2)
            for ns in new:
                sink: list[str] = []
                sinks.append(sink)
                th = threading.Thread(target=_poll_ss, args=(ns, stop, sink), daemon=True)
                th.start()
                threads.append(th)
            echoes = [] if echo is None else _start_echo(new, echo)
            routers = [n for n in _namespaces() if n not in before and n.endswith("r")]
            if backlog is not None and routers:
                th = threading.Thread(target=_poll_backlog, args=(routers[0], stop, backlog),
                                      daemon=True)  # fmt: skip
                th.start()
                threads.append(th)
            _, err = launch.communicate(timeout=seconds + 120)
            if launch.returncode != 0:
                raise SystemExit(f"wan_tcp_trace: the launch failed:\n{err.decode()[-1500:]}")
        finally:
            if launch.poll() is None:
                launch.terminate()
                launch.wait()
            for proc in echoes if "echoes" in locals() else []:
                proc.terminate()
                proc.wait()
            stop.set()
            for th in threads:
                th.join()
            (PROBE / "enable").write_text("0")
            (PROBE / "filter").write_text("0")
            if backlog is not None and clock is not None:
                (TRACEFS / "trace_clock").write_text(clock.group(1))
            reader.terminate()
            reader.wait()
        pipe_out.seek(0)
        probe = pipe_out.read().decode(errors="replace")
    return probe, "".join("".join(s) for s in sinks)


def _namespaces() -> list[str]:
    out = subprocess.run(["ip", "netns", "list"], capture_output=True, text=True, check=False)
    return [line.split()[0] for line in out.stdout.splitlines() if line.strip()]


def report(probe: str, ss: str, port: int, gap: float, skip_s: float) -> None:
    """One line per worker and direction: medians over the legs after ``skip_s``."""
    conns = parse_probe(probe, port, set(SS_COOKIE.findall(ss)))
    ss_by = parse_ss(ss)
    t_start = min((v[0][0] for v in conns.values() if v), default=0.0)
    print("worker address  sender  legs   kB  cwnd first  last  srtt ms   rto ms  idle ms (p95)")
    for (local, peer), samples in sorted(conns.items()):
        if len(samples) < 200:
            continue
        got = [g for g in legs(samples, gap, 50_000) if g.t0 - t_start >= skip_s]
        if len(got) < 2:
            continue
        sender = "server" if local.endswith(f":{port}") else "worker"
        worker = peer if sender == "server" else local
        rto = [r for r, _ in ss_by.get((local, peer), [])]
        idle = [s for _, s in ss_by.get((local, peer), [])]
        print(f"{worker.split(':')[0]:15s} {sender:7s} {len(got):4d} "
              f"{statistics.median(g.nbytes for g in got) / 1e3:5.0f} "
              f"{statistics.median(g.cwnd_first for g in got):10.0f} "
              f"{statistics.median(g.cwnd_last for g in got):5.0f} "
              f"{statistics.median(g.srtt_end_ms for g in got):8.1f} "
              f"{statistics.median(rto) if rto else float('nan'):8.0f} "
              f"{_p95(idle):8.0f}")  # fmt: skip


def dump_legs(
    probe: str, ss: str, port: int, gap: float, skip_s: float, backlog: list[tuple[float, int]]
) -> None:
    """Every dispatch (the server's legs) after ``skip_s``: its time, duration, cwnd and SRTT
    at its first and last ACK, and the bytes queued toward the server while it crossed (the
    router's ``v0`` qdisc, where the pushes queue on a shared server link and its ACKs pass):
    its median and maximum, and the share of samples above BUSY_KB."""
    conns = parse_probe(probe, port, set(SS_COOKIE.findall(ss)))
    t_start = min((v[0][0] for v in conns.values() if v), default=0.0)
    rows = []
    for (local, peer), samples in conns.items():
        if local.endswith(f":{port}") and len(samples) >= 200:
            rows += [(g, peer.split(":")[0]) for g in legs(samples, gap, 50_000)
                     if g.t0 - t_start >= skip_s]  # fmt: skip
    print(
        "dispatch    t s  worker           dur s   kB  cwnd first  last  srtt first  last"
        "  queue toward server kB: median  max  busy %"
    )
    for g, worker in sorted(rows, key=lambda r: r[0].t0):
        q = [b / 1e3 for t, b in backlog if g.t0 <= t <= g.t1]
        med = statistics.median(q) if q else float("nan")
        busy = 100.0 * sum(b > BUSY_KB for b in q) / len(q) if q else float("nan")
        print(f"{'':8s} {g.t0 - t_start:6.2f}  {worker:15s} {g.t1 - g.t0:6.2f} "
              f"{g.nbytes / 1e3:4.0f} {g.cwnd_first:10d} {g.cwnd_last:5d} "
              f"{g.srtt_first_ms:10.1f} {g.srtt_end_ms:5.1f} {med:31.0f} {max(q, default=0):4.0f} {busy:6.0f}")  # fmt: skip


def dump_echo(
    probe: str,
    ss: str,
    port: int,
    gap: float,
    skip_s: float,
    backlog: list[tuple[float, int]],
    echo: dict[str, list[str]],
) -> None:
    """The path a dispatch's ACKs take (worker -> server), measured by the UDP echo: its
    one-way delay against the queue toward the server at the same moment (binned), and per
    dispatch the mean one-way delay of the probes sent while it crossed."""
    got = {w: [tuple(float(x) for x in ln.split()) for ln in lines if len(ln.split()) == 3]
           for w, lines in echo.items()}  # fmt: skip
    conns = parse_probe(probe, port, set(SS_COOKIE.findall(ss)))
    t_start = min((v[0][0] for v in conns.values() if v), default=0.0)
    bl_t = [t for t, _ in backlog]
    import bisect

    def queue_at(t: float) -> float:
        i = bisect.bisect_left(bl_t, t)
        return backlog[min(i, len(backlog) - 1)][1] / 1e3 if backlog else float("nan")

    print("one-way delay worker -> server (ms) against the queue toward the server (kB):")
    print("queue kB   probes  median up ms  median down ms")
    rows: dict[int, list[tuple[float, float]]] = {}
    for samples in got.values():
        for sent, at, back in samples:
            if sent - t_start < skip_s:
                continue
            rows.setdefault(int(queue_at(sent) // 50), []).append((at - sent, back - at))
    for b in sorted(rows):
        ups = sorted(u for u, _ in rows[b])
        downs = sorted(d for _, d in rows[b])
        print(f"{b * 50:4d}-{b * 50 + 50:<4d} {len(ups):7d} {ups[len(ups) // 2] * 1e3:13.1f} "
              f"{downs[len(downs) // 2] * 1e3:15.1f}")  # fmt: skip
    print(
        "dispatch    t s  worker           dur s  cwnd first  last  echo up ms: mean  max"
        "  queue kB: mean"
    )
    for (local, peer), samples in sorted(conns.items(), key=lambda kv: kv[0][1]):
        if not local.endswith(f":{port}") or len(samples) < 200:
            continue
        w = peer.split(":")[0]
        for g in legs(samples, gap, 50_000):
            if g.t0 - t_start < skip_s:
                continue
            ups = [at - sent for sent, at, _ in got.get(w, []) if g.t0 <= sent <= g.t1]
            qs = [b / 1e3 for t, b in backlog if g.t0 <= t <= g.t1]
            print(f"{'':8s} {g.t0 - t_start:6.2f}  {w:15s} {g.t1 - g.t0:6.2f} "
                  f"{g.cwnd_first:10d} {g.cwnd_last:5d} "
                  f"{statistics.fmean(ups) * 1e3 if ups else float('nan'):17.1f} "
                  f"{max(ups, default=float('nan')) * 1e3:5.1f} "
                  f"{statistics.fmean(qs) if qs else float('nan'):15.0f}")  # fmt: skip


def _p95(values: list[float]) -> float:
    """The 95th percentile: of ``lastsnd``, about the idle the next send sees (the sawtooth's
    top, at the polling's resolution), less the odd long stop at the run's start and end."""
    if not values:
        return float("nan")
    return sorted(values)[int(0.95 * (len(values) - 1))]


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--wan", default=DEFAULT_WAN, help="per-worker link specs, ';'-separated")
    ap.add_argument("--exchange", default="streaming", choices=("blocking", "overlapped",
                                                               "streaming"))  # fmt: skip
    ap.add_argument("--seconds", type=float, default=30.0, help="the launch's time budget")
    ap.add_argument("--gap", type=float, default=0.2, help="seconds without ACKs that end a leg")
    ap.add_argument("--skip", type=float, default=8.0, help="seconds of start-up left out")
    ap.add_argument("--wan-server", default=None, help="the server's own (shared) link spec")
    ap.add_argument("--link-slots", action="store_true", help="pushes take turns on it")
    ap.add_argument("--paces", default=None,
                    help="each worker's seconds per step, ','-separated (default 0.1 each)")  # fmt: skip
    ap.add_argument("--echo", action="store_true",
                    help="also probe each worker's path to the server with a UDP echo")  # fmt: skip
    ap.add_argument("--legs", action="store_true",
                    help="also print every dispatch, with the queue toward the server")  # fmt: skip
    args = ap.parse_args()
    from heloco.net.wan import PORT, unavailable

    why = unavailable()
    if why is not None:
        raise SystemExit(f"wan_tcp_trace: {why}")
    n = args.wan.count(";") + 1
    with tempfile.TemporaryDirectory(prefix="wan_tcp_trace-") as out:
        argv = [sys.executable, "-m", "heloco", "launch", "--workers", str(n),
                "--paces", args.paces or ",".join(["0.1"] * n), "--set", "inner_steps=10",
                "--set", "dylu=false", "--set", "eval_every=0",
                "--set", "token_budget=1000000000", "--set", f"time_budget={args.seconds:g}",
                "--set", f"exchange={args.exchange}",
                *(["--set", "fragments=2"] if args.exchange == "streaming" else []),
                "--wan", args.wan, "--quiet", "--overwrite", "--out", str(Path(out) / "run")]  # fmt: skip
        if args.wan_server:
            argv += ["--wan-server", args.wan_server]
        if args.link_slots:
            argv += ["--link-slots"]
        up = subprocess.run(["uptime"], capture_output=True, text=True).stdout.strip()
        backlog: list[tuple[float, int]] = []
        echo: dict[str, list[str]] | None = {} if args.echo else None
        probe, ss = trace(argv, args.seconds, backlog if args.legs or args.echo else None, echo)
        print(
            f"# {args.exchange}, --wan {args.wan!r}, --wan-server {args.wan_server!r}, "
            f"link slots {args.link_slots}; {up}"
        )
        report(probe, ss, PORT, args.gap, args.skip)
        if args.legs:
            dump_legs(probe, ss, PORT, args.gap, args.skip, backlog)
        if echo is not None:
            dump_echo(probe, ss, PORT, args.gap, args.skip, backlog, echo)


if __name__ == "__main__":
    if sys.argv[1:2] == ["echo-server"]:
        _echo_server(int(sys.argv[2]))
    elif sys.argv[1:2] == ["echo-client"]:
        _echo_client(sys.argv[2], int(sys.argv[3]), float(sys.argv[4]))
    else:
        main()
