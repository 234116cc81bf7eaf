"""Peak resident memory of each process of a `heloco launch` run (the README's example).

    python benchmarks/worker_rss.py                       # this tree's src/
    python benchmarks/worker_rss.py --src /tmp/old/src    # another tree's, to compare

Runs ``python -m heloco launch --workers 3 --paces 1,2,4 --set token_budget=20000`` (flags
can be changed) into a temporary folder with ``PYTHONPATH`` set to ``--src``, and reads the
peak resident set size (``VmHWM`` in ``/proc/PID/status``, kB) of the server and of every
worker while they run. A process is told apart by the log its stdout goes to
(``logs/worker<i>.log``). Prints one table row per process, in MiB. Linux only.
"""

from __future__ import annotations

import argparse
import os
import subprocess
import sys
import tempfile
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]


def children(pid: int) -> list[int]:
    """Every descendant of ``pid`` (from /proc/*/stat's parent ids)."""
    parent: dict[int, int] = {}
    for entry in Path("/proc").iterdir():
        if not entry.name.isdigit():
            continue
        try:
            stat = (entry / "stat").read_text()
        except OSError:
            continue
        parent[int(entry.name)] = int(stat.rsplit(")", 1)[1].split()[1])
    out, todo = [], [pid]
    while todo:
        p = todo.pop()
        kids = [c for c, pp in parent.items() if pp == p]
        out += kids
        todo += kids
    return out


def role(pid: int) -> str | None:
    """``server`` or ``worker<i>`` from the log file the process writes to (None: neither)."""
    try:
        target = os.readlink(f"/proc/{pid}/fd/1")
    except OSError:
        return None
    name = Path(target).name
    if name.endswith(".log") and (name.startswith("worker") or name.startswith("server")):
        return name.removesuffix(".log").split("-")[0]
    return None


def peak_kb(pid: int) -> int | None:
    """The process's peak resident set size so far (kB), None once it is gone."""
    try:
        for line in Path(f"/proc/{pid}/status").read_text().splitlines():
            if line.startswith("VmHWM:"):
                return int(line.split()[1])
    except OSError:
        return None
    return None


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--src", type=Path, default=ROOT / "src", help="the tree to measure")
    ap.add_argument("--workers", default="3")
    ap.add_argument("--paces", default="1,2,4")
    ap.add_argument("--token-budget", default="20000")
    ap.add_argument("--set", action="append", default=[], metavar="KEY=VALUE",
                    help="more run config overrides (e.g. a larger [model] table)")  # fmt: skip
    args = ap.parse_args()
    peaks: dict[str, int] = {}
    with tempfile.TemporaryDirectory() as tmp:
        out = Path(tmp) / "net"
        cmd = [
            sys.executable, "-m", "heloco", "launch", "--workers", args.workers,
            "--paces", args.paces, "--set", f"token_budget={args.token_budget}",
            "--out", str(out), "--quiet", *[a for kv in args.set for a in ("--set", kv)],
        ]  # fmt: skip
        env = {**os.environ, "PYTHONPATH": str(args.src.resolve())}
        t0 = time.perf_counter()
        proc = subprocess.Popen(cmd, env=env, cwd=tmp, stderr=subprocess.PIPE, text=True)
        while proc.poll() is None:
            for pid in children(proc.pid):
                name, kb = role(pid), peak_kb(pid)
                if name is not None and kb is not None:
                    peaks[name] = max(peaks.get(name, 0), kb)
            time.sleep(0.05)
        wall = time.perf_counter() - t0
        err = proc.stderr.read() if proc.stderr is not None else ""
    if proc.returncode != 0:
        print(f"launch failed ({proc.returncode}):\n{err}", file=sys.stderr)
        return 1
    print(f"src: {args.src}   launch wall: {wall:.1f} s   sets: {' '.join(args.set) or '-'}")
    print(f"{'process':<10} {'peak RSS (MiB)':>15}")
    for name in sorted(peaks):
        print(f"{name:<10} {peaks[name] / 1024:>15.1f}")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
