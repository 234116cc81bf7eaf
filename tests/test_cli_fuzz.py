"""CLI fuzz: about 3,000 malformed inputs to both commands, in process.

Flags, `--set` overrides, TOML run configs, topology files, calibration CSVs and run folders:
every single edit of a table of keys to a list of nasty values, combinations of them drawn by
hypothesis (fixed seeds, bounded counts), and a table of known nonsense. Every
run must end in one of three ways, never a crash, a traceback or a hang:
- exit 2 and exactly one stderr line ``PROG: error: ...`` (a user mistake);
- exit 0 (or 1 where the command means "no plan meets the constraints") with output whose
  numbers are all finite: a nonsense input that slips through shows up as NaN, inf or null
  where a number belongs;
- the table-driven cases are known nonsense and must exit 2.
A few cases go through the real console scripts in a subprocess.
"""

from __future__ import annotations

import contextlib
import csv
import io
import json
import math
import os
import re
import subprocess
import sys
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from heloco.cli import main as heloco_main
from heloco.config import load_config
from shardmeter.cli import main as shardmeter_main

if sys.version_info >= (3, 11):
    import tomllib
else:  # pragma: no cover
    import tomli as tomllib

REPO = Path(__file__).resolve().parents[1]
HOLDOUT = REPO / "benchmarks" / "holdout_runs.csv"
TOPOLOGY = REPO / "src" / "shardmeter" / "data" / "topologies" / "two-clouds.toml"
FUZZ = settings(
    max_examples=80,
    derandomize=True,  # the same inputs on every run: a failure reproduces
    deadline=None,
    suppress_health_check=[HealthCheck.too_slow, HealthCheck.function_scoped_fixture],
)
# no hang: every test ends well inside the timeout; subprocesses and many runs: slow
pytestmark = [pytest.mark.timeout(600), pytest.mark.slow]

Main = Callable[[Sequence[str]], int]

# Values a hurried or hostile user types: numbers out of range, non-numbers, specials.
NASTY = [
    "0", "-1", "-0", "1.5", "1e3", "1e308", "1e999", "-1e999", "nan", "NaN", "inf", "-inf",
    "99999999999999999999999", "2147483648", "", " ", "x", "true", "None", "null", "0x10",
    "1,2", "[1]", "{}", "'", '"', "\\", "%s", "\u0000", "\u202e8", "٣", "1_000", "+7",
]  # fmt: skip
NASTY_TOML = [
    "0", "-1", "1e308", "inf", "-inf", "nan", "99999999999999999999999", "true", "false",
    '""', '"x"', '"inf"', "[]", "[1, 2]", "{}", "{a = 1}", '"null"', "1.5", "-0.0",
    "[inf]", "[nan, 1]", '[[1]]', "2147483648",
]  # fmt: skip


@dataclass(frozen=True)
class Outcome:
    code: int
    out: str
    err: str


def run(main: Main, argv: Sequence[str]) -> Outcome:
    """Run a CLI in process; any exception that escapes it is a crash and fails the test."""
    out, err = io.StringIO(), io.StringIO()
    with contextlib.redirect_stdout(out), contextlib.redirect_stderr(err):
        try:
            code = main(list(argv))
        except SystemExit as exc:  # --help and argparse's own exits
            code = int(exc.code or 0) if not isinstance(exc.code, str) else 2
    return Outcome(code, out.getvalue(), err.getvalue())


def check(result: Outcome, argv: Sequence[str], ok: Sequence[int] = (0,)) -> None:
    """The three allowed endings (module docstring)."""
    where = f"argv={list(argv)!r}"
    assert "Traceback" not in result.err + result.out, f"{where}\n{result.err[-2000:]}"
    if result.code == 2:
        lines = result.err.strip().splitlines()
        assert len(lines) == 1, f"{where}: not one line:\n{result.err[-2000:]}"
        assert re.match(r"^(shardmeter|heloco): error: ", lines[0]), f"{where}: {lines[0]}"
        return
    assert result.code in ok, f"{where}: exit {result.code}\n{result.err[-2000:]}"


def finite_numbers(doc: Any, path: str = "$") -> list[str]:
    """Paths of the non-finite numbers in a parsed JSON document."""
    if isinstance(doc, float) and not math.isfinite(doc):
        return [path]
    if isinstance(doc, dict):
        return [p for k, v in doc.items() for p in finite_numbers(v, f"{path}.{k}")]
    if isinstance(doc, list):
        return [p for i, v in enumerate(doc) for p in finite_numbers(v, f"{path}[{i}]")]
    return []


def strict_json(text: str) -> Any:
    """Parse a --json document, refusing NaN and Infinity (they are not JSON)."""

    def refuse(token: str) -> None:
        raise ValueError(f"non-finite number {token} in JSON output")

    return json.loads(text, parse_constant=refuse)


# -- shardmeter predict flags -------------------------------------------------------------------
PREDICT_FLAGS = [
    "--gpus", "--tp", "--pp", "--cp", "--dp", "--ep", "--vpp", "--micro-batch",
    "--global-batch", "--seq-len", "--shard-degree",
]  # fmt: skip


# -- shardmeter predict flags -------------------------------------------------------------------
PREDICT_FLAGS = [
    "--gpus", "--tp", "--pp", "--cp", "--dp", "--ep", "--vpp", "--micro-batch",
    "--global-batch", "--seq-len", "--shard-degree",
]  # fmt: skip


@FUZZ
@given(st.dictionaries(st.sampled_from(PREDICT_FLAGS), st.sampled_from(NASTY), max_size=3))
def test_predict_flags(flags: dict[str, str]) -> None:
    argv = ["predict", "--json", *[x for kv in flags.items() for x in kv]]
    result = run(shardmeter_main, argv)
    check(result, argv)
    if result.code == 0:
        doc = strict_json(result.out)
        assert doc["step_time_s"] > 0 and doc["tokens_per_s"] > 0, argv
        assert all(int(v) >= 1 for k, v in flags.items() if k != "--shard-degree"), (
            f"{argv}: accepted a degree below 1"
        )


def test_predict_every_single_flag() -> None:
    """Each flag with each nasty value, one at a time."""
    for flag in PREDICT_FLAGS:
        for value in NASTY:
            argv = ["predict", "--json", flag, value]
            result = run(shardmeter_main, argv)
            check(result, argv)
            if result.code == 0:
                assert strict_json(result.out)["step_time_s"] > 0, argv


# -- topology files -----------------------------------------------------------------------------
TOPOLOGY_KEYS = [
    ("run", "tokens"), ("run", "global_batch"), ("run", "inner_steps"), ("run", "bits"),
    ("run", "mode"), ("run", "outer_overlap"), ("run", "model"), ("islands", "n_nodes"),
    ("islands", "price_per_gpu_hour"), ("islands", "cluster"), ("islands", "plan"),
    ("links", "bandwidth_gbit"), ("links", "latency_ms"), ("links", "egress_usd_per_gb"),
    ("links", "from"), ("run", "bogus_key"),
]  # fmt: skip


def mutate_topology(text: str, section: str, key: str, value: str) -> str:
    """Set ``key`` in the first table of ``section`` (the key is added if absent)."""
    header = {"run": "[run]", "islands": "[[islands]]", "links": "[[wan.links]]"}[section]
    head, _, rest = text.partition(header + "\n")
    body, sep, tail = rest.partition("\n[")
    lines = [ln for ln in body.splitlines() if ln.split("=")[0].strip() != key]
    lines.insert(0, f"{key} = {value}")
    return head + header + "\n" + "\n".join(lines) + sep + tail


def topology_case(folder: Path, edits: Sequence[tuple[tuple[str, str], str]]) -> None:
    """`predict --topology` on two-clouds.toml with ``edits``: one line, or finite numbers."""
    text = TOPOLOGY.read_text(encoding="utf-8")
    for (section, key), value in edits:
        text = mutate_topology(text, section, key, value)
    path = folder / "topo.toml"
    path.write_text(text, encoding="utf-8")
    argv = ["predict", "--topology", str(path), "--json"]
    result = run(shardmeter_main, argv)
    check(result, [*argv, *map(str, edits)])
    if result.code == 0:
        doc = strict_json(result.out)
        for key in ("tokens_per_s", "wall_s", "cost_usd", "utilization"):
            value = doc[key]
            assert isinstance(value, int | float) and math.isfinite(value), (edits, key, value)
        assert doc["tokens_per_s"] > 0 and doc["cost_usd"] >= 0, edits


def test_topology_every_single_edit(tmp_path: Path) -> None:
    """Each key of the table set to each nasty value, one at a time (368 files)."""
    for section_key in TOPOLOGY_KEYS:
        for value in NASTY_TOML:
            topology_case(tmp_path, [(section_key, value)])


@FUZZ
@given(st.lists(st.tuples(st.sampled_from(TOPOLOGY_KEYS), st.sampled_from(NASTY_TOML)), max_size=3))
def test_topology_files(tmp_path_factory: pytest.TempPathFactory, edits: list[Any]) -> None:
    topology_case(tmp_path_factory.mktemp("topo"), edits)


# -- calibration CSVs ---------------------------------------------------------------------------
CSV_COLUMNS = [
    "n_layers", "hidden", "n_heads", "n_kv_heads", "head_dim", "ffn", "vocab", "seq_len",
    "n_gpus", "gpus_per_node", "tp", "pp", "dp", "cp", "vpp", "sp", "shard_degree",
    "micro_batch", "global_batch", "tokens_per_sec_per_gpu", "gpu", "mlp", "sharding",
    "recompute", "precision", "moe_experts",
]  # fmt: skip


def holdout_rows() -> tuple[list[str], list[dict[str, str]]]:
    with HOLDOUT.open(encoding="utf-8", newline="") as fh:
        reader = csv.DictReader(fh)
        return list(reader.fieldnames or []), list(reader)[:3]


def csv_case(folder: Path, edits: Sequence[tuple[str, str]]) -> None:
    """`validate` on three holdout rows with cells replaced: rows skipped with a reason or
    predicted with a finite error, never a crash and never a null summary."""
    fields, rows = holdout_rows()
    for i, (column, value) in enumerate(edits):
        rows[i % len(rows)][column] = value
    path = folder / "runs.csv"
    with path.open("w", encoding="utf-8", newline="") as fh:
        writer = csv.DictWriter(fh, fieldnames=fields)
        writer.writeheader()
        writer.writerows(rows)
    argv = ["validate", str(path), "--json"]
    result = run(shardmeter_main, argv)
    check(result, [*argv, *map(str, edits)])
    if result.code == 0:
        doc = strict_json(result.out)
        assert len(doc["rows"]) + len(doc["skipped"]) == len(rows), edits
        assert all(r["ape"] is not None and r["ape"] >= 0 for r in doc["rows"]), edits
        if doc["rows"]:
            assert doc["summary"]["median_ape"] is not None, edits


def test_calibration_csv_every_single_edit(tmp_path: Path) -> None:
    """Each column set to each nasty value, one at a time (858 files)."""
    for column in CSV_COLUMNS:
        for value in NASTY:
            csv_case(tmp_path, [(column, value)])


@FUZZ
@given(st.lists(st.tuples(st.sampled_from(CSV_COLUMNS), st.sampled_from(NASTY)), max_size=4))
def test_calibration_csv(tmp_path_factory: pytest.TempPathFactory, edits: list[Any]) -> None:
    csv_case(tmp_path_factory.mktemp("csv"), edits)


def test_calibration_csv_not_a_csv(tmp_path: Path) -> None:
    for name, data in (
        ("empty.csv", b""),
        ("binary.csv", bytes(range(256)) * 4),
        ("header.csv", b"run_id,model\n1,x\n"),
        ("quotes.csv", b'run_id,"n_layers\n1,"2\n'),
    ):
        path = tmp_path / name
        path.write_bytes(data)
        argv = ["validate", str(path), "--json"]
        check(run(shardmeter_main, argv), argv)
    argv = ["validate", str(tmp_path)]
    assert run(shardmeter_main, argv).code == 2


# -- heloco run configs -------------------------------------------------------------------------
SET_KEYS = [
    "workers", "paces", "pace_jitter", "comm_delays", "inner_steps", "outer.lr",
    "outer.momentum", "rho", "outer.rho", "outer.correction.kappa", "outer.dn_c", "dylu",
    "grace_window", "data.seq_len", "data.dirichlet_alpha", "data.train_fraction", "model",
    "inner.lr", "inner.betas", "inner.batch_size", "inner.grad_clip", "token_budget",
    "time_budget", "eval_every", "eval_windows", "seed", "method", "threads", "batch",
    "inner.lrr", "outer.momentun", "lr", "preset",
]  # fmt: skip


def config_values_finite(text: str) -> list[str]:
    """Non-finite floats in a printed config (TOML writes inf/nan as words)."""
    return finite_numbers(tomllib.loads(text))


def set_case(folder: Path, sets: Sequence[tuple[str, str]]) -> None:
    """`simulate --print-config --set K=V ...`: one line, or a finite config that loads back."""
    argv = ["simulate", "--print-config", *[x for k, v in sets for x in ("--set", f"{k}={v}")]]
    result = run(heloco_main, argv)
    check(result, argv)
    if result.code == 0:
        assert not config_values_finite(result.out), argv
        path = folder / "printed.toml"
        path.write_text(result.out, encoding="utf-8")
        load_config(path)  # what it printed loads back


def test_simulate_every_single_set(tmp_path: Path) -> None:
    """Each key set to each nasty value, one at a time (1,089 command lines)."""
    for key in SET_KEYS:
        for value in NASTY:
            set_case(tmp_path, [(key, value)])


@FUZZ
@given(st.lists(st.tuples(st.sampled_from(SET_KEYS), st.sampled_from(NASTY)), max_size=3))
def test_simulate_set_overrides(tmp_path_factory: pytest.TempPathFactory, sets: list[Any]) -> None:
    set_case(tmp_path_factory.mktemp("cfg"), sets)


@FUZZ
@given(
    st.lists(st.tuples(st.sampled_from(SET_KEYS), st.sampled_from(NASTY_TOML)), max_size=4),
    st.sampled_from(["", 'preset = "default"\n', 'preset = "nope"\n', "preset = 3\n"]),
)
def test_simulate_config_files(
    tmp_path_factory: pytest.TempPathFactory, items: list[Any], head: str
) -> None:
    tables: dict[str, list[str]] = {}
    for key, value in items:
        table, _, leaf = key.rpartition(".")
        tables.setdefault(table, []).append(f"{leaf} = {value}")
    text = head + "\n".join(tables.pop("", []))
    text += "".join(f"\n[{t}]\n" + "\n".join(lines) for t, lines in tables.items())
    path = tmp_path_factory.mktemp("cfg") / "run.toml"
    path.write_text(text + "\n", encoding="utf-8")
    argv = ["simulate", "--config", str(path), "--print-config"]
    result = run(heloco_main, argv)
    check(result, [*argv, text])
    if result.code == 0:
        assert not config_values_finite(result.out), text


# -- heloco report on damaged run folders -------------------------------------------------------
GOOD_EVAL = {"type": "eval", "tokens": 0, "time": 0.0, "loss": 5.0, "per_language": {"a": 5.0}}
EVAL_FIELDS = ["tokens", "time", "loss", "per_language", "steps", "revision", "type"]
JSON_VALUES = [None, -1, 1.5, "x", [], {}, True, 10**30, float("nan"), float("inf"), {"a": "b"}]


@FUZZ
@given(
    st.lists(
        st.tuples(st.sampled_from(EVAL_FIELDS), st.sampled_from(JSON_VALUES), st.booleans()),
        max_size=3,
    ),
    st.sampled_from(["", "{", "[1, 2]", '{"updates": "x", "paces": [1, "a"], "cycle_loss": {}}']),
)
def test_report_damaged_run(
    tmp_path_factory: pytest.TempPathFactory, edits: list[Any], summary: str
) -> None:
    run_dir = tmp_path_factory.mktemp("run")
    second = {**GOOD_EVAL, "tokens": 100, "time": 1.0, "loss": 4.0, "per_language": {"a": 4.0}}
    for field, value, drop in edits:
        if drop:
            second.pop(field, None)
        else:
            second[field] = value
    lines = [json.dumps(GOOD_EVAL), json.dumps(second), '{"type": "eval", "tok']
    (run_dir / "events.jsonl").write_text("\n".join(lines), encoding="utf-8")
    (run_dir / "summary.json").write_text(summary, encoding="utf-8")
    argv = ["report", str(run_dir), "--out", str(run_dir / "report"), "--no-plots", "--json"]
    result = run(heloco_main, argv)
    check(result, [*argv, json.dumps(second, default=str)])
    if result.code == 0:
        strict_json(result.out)


# -- known nonsense, table-driven ---------------------------------------------------------------
NONSENSE: list[tuple[str, list[str]]] = [
    ("shardmeter", ["predict", "--tp", "0"]),
    ("shardmeter", ["predict", "--pp", "-2"]),
    ("shardmeter", ["predict", "--cp", "0"]),
    ("shardmeter", ["predict", "--micro-batch", "0"]),
    ("shardmeter", ["predict", "--gpus", "nan"]),
    ("shardmeter", ["predict", "--gpus", "1e999"]),
    ("shardmeter", ["predict", "--seq-len", "-1"]),
    ("shardmeter", ["predict", "--model", "llama-9000"]),
    ("shardmeter", ["predict", "--cluster", "no/such/file.toml"]),
    ("shardmeter", ["predict", "--plan", "nowhere.toml"]),
    ("shardmeter", ["predict", "--sharding", "zero4"]),
    ("shardmeter", ["predict", "--topology", "two-clouds", "--tokens", "inf"]),
    ("shardmeter", ["predict", "--topology", "two-clouds", "--tokens", "-5"]),
    ("shardmeter", ["predict", "--topology", "two-clouds", "--inner-steps", "0"]),
    ("shardmeter", ["predict", "--topology", "two-clouds", "--threshold", "2"]),
    ("shardmeter", ["predict", "--topology", "two-clouds", "--quality-factor", "nan"]),
    ("shardmeter", ["predict", "--topology", "nowhere"]),
    ("shardmeter", ["plan", "--model", "llama-3-8b", "--cluster", "dgx-h100", "--gpus", "0"]),
    ("shardmeter", ["plan", "--cluster", "dgx-h100", "--gpus", "8", "--budget", "-1"]),
    ("shardmeter", ["plan", "--cluster", "dgx-h100", "--gpus", "8", "--headroom", "1.5"]),
    ("shardmeter", ["plan", "--cluster", "dgx-h100", "--gpus", "8", "--deadline", "-3d"]),
    ("shardmeter", ["plan", "--cluster", "dgx-h100", "--gpus", "8", "--top", "-1"]),
    ("shardmeter", ["plan", "--cluster", "dgx-h100", "--gpus", "8", "--plot", "x.gif"]),
    ("shardmeter", ["plan", "--cluster", "dgx-h100", "--gpus", "8", "--max-tp", "0"]),
    ("shardmeter", ["sweep", "--topology", "two-clouds", "--over", "colour"]),
    ("shardmeter", ["sweep", "--topology", "two-clouds", "--over", "bandwidth", "--values", "nan"]),
    ("shardmeter", ["sweep", "--topology", "two-clouds", "--formats", "gif"]),
    ("shardmeter", ["validate", "nowhere.csv"]),
    ("shardmeter", ["presets", "show", "h100-sxm5"]),
    ("shardmeter", ["presets", "gpus"]),
    ("shardmeter", ["bogus"]),
    ("heloco", ["simulate", "--outer-lr", "inf"]),
    ("heloco", ["simulate", "--outer-lr", "0"]),
    ("heloco", ["simulate", "--workers", "0"]),
    ("heloco", ["simulate", "--workers", "2000"]),
    ("heloco", ["simulate", "--paces", "1,0,2,2,2"]),
    ("heloco", ["simulate", "--paces", "1,inf,2,2,2"]),
    ("heloco", ["simulate", "--paces", ""]),
    ("heloco", ["simulate", "--token-budget", "0"]),
    ("heloco", ["simulate", "--time-budget", "nan"]),
    ("heloco", ["simulate", "--seed", "-1"]),
    ("heloco", ["simulate", "--seed", "99999999999999999999999"]),
    ("heloco", ["simulate", "--method", "adam"]),
    ("heloco", ["simulate", "--threads", "0"]),
    ("heloco", ["simulate", "--set", "rho=inf"]),
    ("heloco", ["simulate", "--set", "rho=-1"]),
    ("heloco", ["simulate", "--set", "pace_jitter=inf"]),
    ("heloco", ["simulate", "--set", "pace_jitter=1e308"]),
    ("heloco", ["simulate", "--set", "outer.momentum=1"]),
    ("heloco", ["simulate", "--set", "inner.lr=nan"]),
    ("heloco", ["simulate", "--set", "inner.betas=[0.9]"]),
    ("heloco", ["simulate", "--set", "dylu=maybe"]),
    ("heloco", ["simulate", "--set", "workers=true"]),
    ("heloco", ["simulate", "--set", "inner.lrr=1"]),
    ("heloco", ["simulate", "--set", "=1"]),
    ("heloco", ["simulate", "--set", "novalue"]),
    ("heloco", ["simulate", "--set", "a..b=1"]),
    ("heloco", ["simulate", "--preset", "nope"]),
    ("heloco", ["simulate", "--config", "nowhere.toml"]),
    ("heloco", ["simulate", "--data-dir", "/nowhere/at/all", "--quiet"]),
    ("heloco", ["report", "/nowhere/at/all"]),
    ("heloco", ["bogus"]),
]


@pytest.mark.parametrize(
    ("prog", "argv"), NONSENSE, ids=[" ".join([prog, *argv]) for prog, argv in NONSENSE]
)
def test_known_nonsense_is_refused(prog: str, argv: list[str]) -> None:
    """Refused before any work: simulate cases validate only (--print-config), except the
    one whose mistake shows when the data is read."""
    main = shardmeter_main if prog == "shardmeter" else heloco_main
    validate_only = argv[:1] == ["simulate"] and "--data-dir" not in argv
    result = run(main, [*argv, "--print-config"] if validate_only else argv)
    check(result, argv, ok=())


# -- the real entry points ----------------------------------------------------------------------
@pytest.mark.parametrize(
    "argv",
    [
        ["shardmeter", "predict", "--tp", "0"],
        ["shardmeter", "predict", "--topology", "two-clouds", "--tokens", "nan"],
        ["heloco", "simulate", "--set", "seed=99999999999999999999999", "--print-config"],
        ["heloco", "simulate", "--bogus-flag"],
    ],
)
def test_console_scripts(argv: list[str]) -> None:
    script = Path(sys.executable).with_name(argv[0])
    if not script.is_file():
        pytest.skip(f"no {argv[0]} console script beside {sys.executable}")
    done = subprocess.run(
        [str(script), *argv[1:]],
        capture_output=True,
        text=True,
        timeout=120,
        env={**os.environ, "COLUMNS": "80"},
    )
    assert done.returncode == 2 and "Traceback" not in done.stderr
    assert len(done.stderr.strip().splitlines()) == 1, done.stderr
