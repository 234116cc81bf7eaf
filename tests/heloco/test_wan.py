"""The emulated WAN: specs parse or fail in one line, a machine that cannot shape refuses, and
(where namespaces and tc work) the set rate and delay are what a TCP transfer really gets,
a launch trains across the links, and Ctrl-C leaves no namespace behind."""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import time
from collections.abc import Callable
from pathlib import Path

import pytest

from heloco.cli import main
from heloco.net import wan
from heloco.net.wan import EmulatedWan, LinkSpec, parse_link, parse_links, probe
from heloco.net.wanfile import read_settings

WHY = wan.unavailable(need_tun=True) if sys.platform == "linux" else "not Linux"
needs_wan = pytest.mark.skipif(WHY is not None, reason=f"emulated WAN unavailable: {WHY}")


def ours() -> set[str]:
    out = subprocess.run(["ip", "netns", "list"], capture_output=True, text=True).stdout
    return {line.split()[0] for line in out.splitlines() if line.startswith(wan.PREFIX)}


def test_link_specs_parse() -> None:
    assert parse_link("bw=100Mbit,rtt=40ms") == LinkSpec(100e6, 100e6, 0.04)
    assert parse_link("up=1gbit,down=500kbit") == LinkSpec(1e9, 500e3, 0.0)
    assert parse_link("none") == LinkSpec()
    assert parse_link("rtt=0.1s").rtt_s == pytest.approx(0.1)
    assert LinkSpec(rtt_s=0.04).one_way_s == pytest.approx(0.02)
    two = parse_links("bw=10Mbit;bw=20Mbit,rtt=10ms", 2)
    assert [x.up_bps for x in two] == [10e6, 20e6] and two[1].rtt_s == pytest.approx(0.01)
    assert parse_links("bw=10Mbit", 3) == [LinkSpec(10e6, 10e6, 0.0)] * 3


@pytest.mark.parametrize(
    ("spec", "field"),
    [
        ("bw=fast", "bw"),
        ("bw=10furlongs", "bw"),
        ("rtt=soon", "rtt"),
        ("speed=1Mbit", "--wan"),
        ("bw=1bit", "up rate"),
        ("rtt=20s", "rtt"),
    ],
)
def test_bad_link_specs_name_the_field(spec: str, field: str) -> None:
    with pytest.raises(ValueError, match=f"^{field}: got"):
        parse_link(spec)


def test_mtu_keeps_a_packet_under_a_millisecond_of_the_slowest_link() -> None:
    assert wan.choose_mtu([]) == wan.MAX_MTU
    assert wan.choose_mtu([10e6]) == 1500  # 1250 B clamped up
    assert wan.choose_mtu([100e6, 1e9]) == 12500
    assert wan.choose_mtu([10e9]) == wan.MAX_MTU


def test_tbf_bucket_holds_two_packets_and_queue_holds_its_seconds() -> None:
    args = wan.tbf_args(100e6, 12500, 0.25)
    kv = dict(zip(args[1::2], args[2::2], strict=True))
    assert kv["rate"] == "100000000bit"
    assert int(kv["burst"]) == 2 * (12500 + 14)
    assert int(kv["limit"]) == int(100e6 * 0.25 / 8)


def test_without_root_the_launch_refuses_in_one_line(
    tmp_path: Path,
    monkeypatch: pytest.MonkeyPatch,
    cli_error: Callable[[Callable[[list[str]], int], list[str]], str],
) -> None:
    monkeypatch.setattr(wan.sys, "platform", "linux")
    monkeypatch.setattr(wan.os, "geteuid", lambda: 1000)
    err = cli_error(
        main, ["launch", "--workers", "2", "--wan", "bw=10Mbit", "--out", str(tmp_path)]
    )
    assert "--wan" in err and "needs root" in err and "sudo" in err
    assert not (tmp_path / "logs").exists()  # refused before anything started


def test_wan_flags_are_checked(
    tmp_path: Path, cli_error: Callable[[Callable[[list[str]], int], list[str]], str]
) -> None:
    base = ["launch", "--workers", "2", "--out", str(tmp_path)]
    assert "--wan-scale" in cli_error(main, [*base, "--wan-scale", "0.5"])
    assert "bw" in cli_error(main, [*base, "--wan", "bw=quick"])
    assert "--wan" in cli_error(main, [*base, "--wan", "bw=1Mbit;bw=2Mbit;bw=3Mbit"])


SETTINGS = [  # (rate bit/s, round trip s, bytes sent): each transfer lasts about 2 s
    (10e6, 0.0, 2_500_000),
    (50e6, 0.02, 12_000_000),
    (100e6, 0.06, 25_000_000),
]


@needs_wan
@pytest.mark.slow
@pytest.mark.parametrize(("rate", "rtt", "nbytes"), SETTINGS)
def test_achieved_rate_and_delay_match_the_setting(rate: float, rtt: float, nbytes: int) -> None:
    with EmulatedWan(["a", "b"], [LinkSpec(rate, rate, rtt), LinkSpec()]) as w:
        got = probe(w, 0, 1, nbytes)
    assert got.rate_bps == pytest.approx(rate, rel=0.10)
    assert abs(got.rtt_s - rtt) <= max(0.10 * rtt, 0.005)


@needs_wan
@pytest.mark.slow
def test_shared_server_link_splits_its_rate() -> None:
    """Two workers pushing at once through a server downlink of 20 Mbit/s get ~10 each."""
    links = [LinkSpec(None, 20e6), LinkSpec(), LinkSpec()]
    with EmulatedWan(["server", "w0", "w1"], links) as w:
        py = [sys.executable, "-m", "heloco.net.wan"]
        sinks = [
            w.popen(0, [*py, "sink", str(wan.PORT + k)], stdout=subprocess.PIPE) for k in (0, 1)
        ]
        for s in sinks:
            assert s.stdout is not None and s.stdout.readline().strip() == b"ready"
        sources = [
            w.popen(
                1 + k,
                [*py, "source", w.address(0), str(wan.PORT + k), "3000000", "1", "hold"],
                stdin=subprocess.PIPE,
                stdout=subprocess.PIPE,
            )
            for k in (0, 1)
        ]
        for p in sources:  # both connected before either sends: process start-up is not timed
            assert p.stdout is not None and p.stdout.readline().strip() == b"connected"
        for p in sources:
            assert p.stdin is not None
            p.stdin.write(b"go\n")
            p.stdin.close()
        for p in sources:
            p.wait(timeout=60)
        marks = [[float(x) for x in s.stdout.readline().split()] for s in sinks if s.stdout]
        for s in sinks:
            s.wait(timeout=10)
    # both ran at once (each began before the other ended), and together at the shared rate
    assert max(m[1] for m in marks) < min(m[2] for m in marks)
    together = 2 * 3_000_000 * 8 / (max(m[2] for m in marks) - min(m[1] for m in marks))
    assert together == pytest.approx(20e6, rel=0.12)


@needs_wan
@pytest.mark.slow
def test_launch_trains_across_shaped_links_and_cleans_up(tmp_path: Path) -> None:
    before = ours()
    argv = ["launch", "--workers", "2", "--paces", "0.05,0.05", "--set", "token_budget=4000",
            "--wan", "bw=50Mbit,rtt=20ms;bw=20Mbit,rtt=60ms", "--wan-server", "bw=100Mbit",
            "--quiet", "--out", str(tmp_path)]  # fmt: skip
    assert main(argv) == 0
    log = (tmp_path / "logs" / "worker1.log").read_text()
    assert "rounds" in log
    assert ours() == before
    links = read_settings(tmp_path)  # the links as set, for `heloco report`'s set-rate line
    assert links is not None and links.shared and links.server.up_bps == 100e6
    assert [(w.up_bps, w.rtt_s) for w in links.workers] == [(50e6, 0.02), (20e6, 0.06)]


@needs_wan
@pytest.mark.slow
def test_ctrl_c_removes_namespaces_and_relay(tmp_path: Path) -> None:
    code = (
        "import time\n"
        "from heloco.net.wan import EmulatedWan, LinkSpec\n"
        "w = EmulatedWan(['a', 'b'], [LinkSpec(1e6, 1e6, 0.01), LinkSpec()])\n"
        "with w:\n"
        "    print(w.tag, w._relay.pid, flush=True)\n"
        "    time.sleep(60)\n"
    )
    for sig in (signal.SIGINT, signal.SIGTERM):
        p = subprocess.Popen([sys.executable, "-c", code], stdout=subprocess.PIPE)
        assert p.stdout is not None
        tag, relay = p.stdout.readline().decode().split()
        assert any(n.startswith(tag) for n in ours())
        os.kill(p.pid, sig)
        p.wait(timeout=30)
        assert not any(n.startswith(tag) for n in ours()), sig
        deadline = time.monotonic() + 10
        while os.path.exists(f"/proc/{relay}") and time.monotonic() < deadline:
            time.sleep(0.05)
        assert not os.path.exists(f"/proc/{relay}"), f"relay {relay} outlived {sig}"


@needs_wan
def test_namespaces_of_a_dead_owner_are_reaped() -> None:
    dead = subprocess.Popen(["true"])
    dead.wait()
    name = f"{wan.PREFIX}{dead.pid}-dead"
    subprocess.run(["ip", "netns", "add", name], check=True)
    assert name in wan.reap_stale()
    assert name not in ours()


def test_topology_links_scale_each_island_path_to_the_server() -> None:
    from shardmeter.estimate.wan import wan_paths
    from shardmeter.specs.topology import load_topology

    paths = wan_paths(load_topology("two-clouds"))
    links = wan.topology_links(None, "two-clouds", 0.01)
    assert len(links) == paths.n == 2
    assert links[paths.center] == LinkSpec()  # the server's island
    other = 1 - paths.center
    bw = float(paths.bandwidth_Bps[other, paths.center]) * 8 * 0.01
    assert links[other] == LinkSpec(bw, bw, float(paths.rtt_s[other, paths.center]))
    with pytest.raises(ValueError, match=r"^--wan-scale: got 1e-12"):
        wan.topology_links(None, "two-clouds", 1e-12)


def test_topology_and_wan_specs_do_not_mix(
    tmp_path: Path, cli_error: Callable[[Callable[[list[str]], int], list[str]], str]
) -> None:
    argv = ["launch", "--topology", "two-clouds", "--wan", "bw=1Mbit", "--out", str(tmp_path)]
    assert "--wan: got 'bw=1Mbit'; not with --topology" in cli_error(main, argv)
