"""The TCP trace tool's parsing of what it records: tc's backlog figures, the legs of a
socket's ACKs, and each dispatch's share of time with a queue toward the server."""

from __future__ import annotations

from types import ModuleType
from typing import Any

import pytest


@pytest.fixture(scope="module")
def tool(load_benchmark: Any) -> ModuleType:
    return load_benchmark("wan_tcp_trace")


def test_backlog_units(tool: ModuleType) -> None:
    assert tool._bytes("12345b") == 12345
    assert tool._bytes("301Kb") == 301 * 1024
    assert tool._bytes("2Mb") == 2 * 1024 * 1024


def _probe(port: int, t: float, una: int, cwnd: int, srtt_us: int) -> str:
    return (
        f" {t:.6f}: tcp_probe: family=AF_INET src=10.77.0.2:{port} dest=10.77.1.2:40000 "
        f"mark=0x0 data_len=0 snd_nxt=0x{una:x} snd_una=0x{una:x} snd_cwnd={cwnd} "
        f"ssthresh=2147483647 snd_wnd=65535 srtt={srtt_us} rcv_wnd=65535 sock_cookie=ab"
    )


def test_legs_and_the_queue_each_dispatch_meets(tool: ModuleType, capsys: Any) -> None:
    port, seg = 29500, 1448
    lines, una = [], 0
    # two legs of 150 ACKs: the first at a 20 ms SRTT, the second's SRTT rising to 120 ms
    for start, srtt0, srtt1 in ((1.0, 20_000, 20_000), (3.0, 20_000, 120_000)):
        for k in range(150):
            una += seg
            srtt = srtt0 + (srtt1 - srtt0) * k // 149
            lines.append(_probe(port, start + 0.002 * k, una, 10 + k, srtt))
    samples = tool.parse_probe("\n".join(lines), port)[("10.77.0.2:29500", "10.77.1.2:40000")]
    got = tool.legs(samples, 0.2, 50_000)
    # the very first sample is the baseline of snd_una, so the first leg counts 149 ACKs
    assert [g.nbytes for g in got] == [149 * seg, 150 * seg]
    assert got[1].t0 == pytest.approx(3.0) and got[1].t1 == pytest.approx(3.298)
    assert got[1].srtt_first_ms == pytest.approx(20.0) and got[1].srtt_end_ms == pytest.approx(
        120.0
    )
    # queue toward the server: empty in the first leg, 100 kB in half the second's samples
    backlog = [(1.0 + 0.01 * i, 0) for i in range(30)]
    backlog += [(3.0 + 0.01 * i, 100_000 if i % 2 else 0) for i in range(30)]
    tool.dump_legs("\n".join(lines), "", port, 0.2, 0.0, backlog)
    rows = [ln.split() for ln in capsys.readouterr().out.splitlines()[1:]]
    assert [(r[-3], r[-2], r[-1]) for r in rows] == [("0", "0", "0"), ("50", "100", "50")]


def test_the_echo_reads_one_way_delays_against_the_queue_and_per_dispatch(
    tool: ModuleType, capsys: Any
) -> None:
    port, seg = 29500, 1448
    lines, una = [], 0
    for k in range(250):  # one dispatch to 10.77.1.2, 3.0-3.498 s
        una += seg
        lines.append(_probe(port, 3.0 + 0.002 * k, una, 10 + k, 30_000))
    # the queue toward the server: empty until 3.1 s, then 200 kB
    backlog = [(3.0 + 0.01 * i, 0 if i < 10 else 200_000) for i in range(40)]
    # echoes every 20 ms: 10 ms up while the queue is empty, 170 ms once it holds 200 kB
    echo = [
        f"{t:.6f} {t + (0.01 if t < 3.1 else 0.17):.6f} {t + 0.2:.6f}\n"
        for t in (3.0 + 0.02 * i for i in range(15))
    ]
    tool.dump_echo("\n".join(lines), "", port, 0.2, 0.0, backlog, {"10.77.1.2": echo})
    out = capsys.readouterr().out.splitlines()
    bins = {ln.split()[0]: ln.split() for ln in out[2:] if ln.split()[0][0].isdigit()}
    assert bins["0-50"][1:3] == ["5", "10.0"] and bins["200-250"][1:3] == ["10", "170.0"]
    row = out[-1].split()  # the dispatch: its mean one-way delay up, its max, its mean queue
    # the leg starts at its second ACK (3.002 s; the first is snd_una's baseline): probes sent
    # 3.02-3.28 s, 4 at 10 ms and 10 at 170 ms; the queue 200 kB in 30 of its 39 samples
    assert row[1] == "10.77.1.2" and float(row[5]) == pytest.approx(
        (4 * 10 + 10 * 170) / 14, abs=0.1
    )
    assert row[6] == "170.0" and row[7] == f"{30 * 200 / 39:.0f}"
