"""The shared terminal formatting: compact numbers and tables that fit 80 columns."""

from __future__ import annotations

import io
import math

import pytest
from hypothesis import given
from hypothesis import strategies as st
from rich.console import Console

from shardmeter.report.terminal import Col, duration, fit_table, nbytes, si, sig3, usd


@pytest.mark.parametrize(
    ("x", "text"),
    [
        (3_040_215, "3.04M"),
        (67_138, "67.1k"),
        (999_600, "1M"),
        (8_613, "8.61k"),
        (551_207, "551k"),
        (1e12, "1T"),
        (0.0961, "0.0961"),
        (42, "42"),
        (0, "0"),
    ],
)
def test_si(x: float, text: str) -> None:
    assert si(x) == text


def test_units() -> None:
    assert usd(67_138) == "$67.1k" and usd(0.115) == "$0.115" and usd(-3.2e6) == "-$3.2M"
    assert duration(7.53 * 86400) == "7.53 d" and duration(0.248) == "248 ms"
    assert duration(math.inf) == "∞"
    assert nbytes(16.1e9) == "16.1 GB" and nbytes(512) == "512 B"


@given(st.floats(min_value=1.0, max_value=1e17))
def test_si_is_short_and_close(x: float) -> None:
    """At most 3 significant digits and a prefix: 5 characters plus a sign of the thousands."""
    text = si(x)
    assert len(text) <= 6 and "e" not in text, text
    prefixes = {"k": 1e3, "M": 1e6, "B": 1e9, "T": 1e12, "P": 1e15}
    value = float(text[:-1]) * prefixes[text[-1]] if text[-1] in prefixes else float(text)
    assert value == pytest.approx(x, rel=5.1e-3)


@given(st.floats(allow_nan=True, allow_infinity=True))
def test_sig3_never_raises(x: float) -> None:
    assert sig3(x) and si(x) and usd(x) and duration(abs(x)) and nbytes(abs(x))


def render(table: object, width: int) -> list[str]:
    buf = io.StringIO()
    Console(file=buf, width=width).print(table)
    return buf.getvalue().splitlines()


COLS = [
    Col("name", "left"),
    Col("tokens/s"),
    Col("cost"),
    Col("detail", "left", drop=2),
    Col("extra", drop=1),
]
ROWS = [
    ["aws-us-east-1", si(3_040_215), usd(67_138), "a long secondary description", "x" * 12],
    ["neocloud-eu-west", si(551_207), usd(115_040), "another description here", "y" * 12],
]


def test_fit_table_drops_secondary_columns_and_says_so() -> None:
    lines = render(fit_table(Console(width=60), "t", COLS, ROWS), 60)
    assert all(len(line) <= 60 for line in lines)
    text = "\n".join(lines)
    assert "3.04M" in text and "$67.1k" in text and "…" not in text
    assert "detail" not in text.split("not shown")[0] and "--wide" in text
    assert len([ln for ln in lines if "aws-us-east-1" in ln]) == 1  # one line per row


def test_fit_table_keeps_everything_when_wide() -> None:
    lines = render(fit_table(Console(width=10_000), "t", COLS, ROWS), 10_000)
    text = "\n".join(lines)
    assert "a long secondary description" in text and "not shown" not in text


def test_wrap_column_wraps_at_spaces_instead_of_leaving_out() -> None:
    cols = [Col("name", "left"), Col("note", "left", wrap=True), Col("value")]
    rows = [["a", "several short words that do not fit on one line at all", "1.5k"]]
    lines = render(fit_table(Console(width=30), None, cols, rows), 30)
    assert all(len(line) <= 30 for line in lines) and "not shown" not in "\n".join(lines)
    assert sum("1.5k" in line for line in lines) == 1 and len(lines) > 5
