"""The topology file, the CLI and the Python API accept exactly the same things
(fragment schedules, τ up to a whole round, given step times, payloads, failures) and refuse
the same mistakes with the same one-line error."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import pytest

from shardmeter.cli import main
from shardmeter.errors import UserInputError
from shardmeter.estimate.islands import predict_topology, with_step_times
from shardmeter.report.islands import topology_json
from shardmeter.specs.topology import Topology, find_topology, load_topology

BASE = find_topology("two-clouds").read_text()
H = 30  # the eager paper's H, which 8 fragments do not divide
EVEN = ",".join(f"{round(k * H / 8)}:4" for k in range(8))  # llama-3-8b: 32 layers


def toml_file(tmp_path: Path, run: str = "", island: str = "") -> Path:
    """two-clouds with [run] lines set (replacing the file's own), and extra lines for the
    second island."""
    keys = {line.split("=")[0].strip() for line in run.splitlines()}
    head, sep, tail = BASE.partition("[[islands]]")
    kept = [x for x in head.splitlines() if x.split("=")[0].strip() not in keys]
    text = "\n".join(kept).replace("[run]\n", f"[run]\n{run}\n", 1) + "\n" + sep + tail
    text = text.replace('name = "neocloud-eu-west"\n', f'name = "neocloud-eu-west"\n{island}\n')
    path = tmp_path / f"t{len(list(tmp_path.iterdir()))}.toml"
    path.write_text(text)
    return path


def cli_doc(capsys: pytest.CaptureFixture[str], *argv: str) -> dict[str, Any]:
    assert main(["predict", "--json", *argv]) == 0, capsys.readouterr().err
    doc: dict[str, Any] = json.loads(capsys.readouterr().out)
    return doc


def api_doc(topo: str | Path | Topology, **overrides: Any) -> dict[str, Any]:
    """The CLI's JSON of the Python API's estimate (a name or path is loaded first)."""
    topo = topo if isinstance(topo, Topology) else load_topology(topo)
    doc: dict[str, Any] = json.loads(json.dumps(topology_json(predict_topology(topo, **overrides))))
    return doc


def cli_error(capsys: pytest.CaptureFixture[str], *argv: str) -> str:
    assert main(["predict", *argv]) == 2
    err = capsys.readouterr().err
    assert err.count("\n") == 1, err  # one line, no traceback
    return err.strip()


SCHEDULES: list[tuple[str, str, str, dict[str, Any]]] = [
    # (file lines, CLI flags, label, Python overrides): the same schedule spelt four ways
    (
        f"mode = 'streaming'\ninner_steps = {H}\nfragments = 8\noverlap_steps = {H}",
        f"--mode streaming -H {H} --fragments 8 --overlap-steps {H}",
        "P = 8 at round(k·H/P), τ = H",
        {"mode": "streaming", "inner_steps": H, "fragments": 8, "overlap_steps": H},
    ),
    (
        f"mode = 'streaming'\ninner_steps = {H}\nfragments = '8'\noverlap_steps = 1",
        f"--mode streaming -H {H} --fragments 8 --overlap-steps 1",
        "P as text",
        {"mode": "streaming", "inner_steps": H, "fragments": "8", "overlap_steps": 1},
    ),
    (
        f"mode = 'streaming'\ninner_steps = {H}\nfragments = '{EVEN}'\noverlap_steps = {H}",
        f"--mode streaming -H {H} --fragments {EVEN} --overlap-steps {H}",
        "listed, as text",
        {
            "mode": "streaming",
            "inner_steps": H,
            "fragments": [
                {"offset": int(o), "layers": int(n)}
                for o, n in (x.split(":") for x in EVEN.split(","))
            ],
            "overlap_steps": H,
        },
    ),
    (
        f"mode = 'streaming'\ninner_steps = {H}\n"
        "fragments = [{ offset = 0, layers = 20 }, { offset = 17, layers = 12 }]",
        f"--mode streaming -H {H} --fragments 0:20,17:12",
        "listed, as a table",
        {"mode": "streaming", "inner_steps": H, "fragments": "0:20,17:12"},
    ),
    (
        "mode = 'diloco'\nouter_overlap = true\noverlap_steps = 100",
        "--mode diloco --outer-overlap --overlap-steps 100",
        "eager DiLoCo, τ a whole round",
        {"mode": "diloco", "outer_overlap": True, "overlap_steps": 100},
    ),
]


@pytest.mark.parametrize(
    ("lines", "flags", "label", "python"), SCHEDULES, ids=[s[2] for s in SCHEDULES]
)
def test_file_cli_and_python_give_the_same_estimate(
    lines: str,
    flags: str,
    label: str,
    python: dict[str, Any],
    tmp_path: Path,
    capsys: pytest.CaptureFixture[str],
) -> None:
    from_file = cli_doc(capsys, "--topology", str(toml_file(tmp_path, lines)))
    from_cli = cli_doc(capsys, "--topology", "two-clouds", *flags.split())
    from_api = api_doc("two-clouds", **python)
    assert from_file["name"] == "two-clouds"
    assert from_file == from_cli == from_api, label
    assert from_api == api_doc(toml_file(tmp_path, lines))


def test_given_step_times_from_the_file_the_flag_and_python(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    """`step_time_s` per island (file), `--step-time NAME=S` (CLI), `with_step_times` (Python):
    the same estimate, the island marked "given" and the other "predicted"."""
    path = toml_file(tmp_path, "mode = 'sync'", "step_time_s = 9.5")
    from_file = cli_doc(capsys, "--topology", str(path))
    flag = ["--topology", "two-clouds", "--mode", "sync", "--step-time", "neocloud-eu-west=9.5"]
    from_cli = cli_doc(capsys, *flag)
    measured = with_step_times(load_topology("two-clouds"), {"neocloud-eu-west": 9.5})
    from_api = api_doc(measured, mode="sync")
    assert from_file == from_cli == from_api
    sources = [(i["name"], i["step_source"]) for i in from_api["islands"]]
    assert sources == [("aws-us-east-1", "predicted"), ("neocloud-eu-west", "given")]
    assert from_api["islands"][1]["step"]["step_time_s"] == 9.5
    # the run-wide spelling: every island given
    run_wide = cli_doc(capsys, "--topology", str(toml_file(tmp_path, "step_time_s = 7.5")))
    assert run_wide == cli_doc(capsys, "--topology", "two-clouds", "--step-time", "7.5")
    assert {i["step_source"] for i in run_wide["islands"]} == {"given"}
    # the tables say "given", not "predicted"
    assert main(["predict", *flag, "--wide"]) == 0
    out = capsys.readouterr().out
    assert "given for neocloud-eu-west; the others predicted" in out
    assert "9.5 s*" in out


def test_payload_and_failures_spelt_as_tables_text_and_python(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    table = (
        "payload = { kind = 'topk', fraction = 0.01 }\n"
        "failures = { gpu_mtbf_hours = 5000, restart_s = 600, quorum = 1 }"
    )
    text = "payload = 'topk:fraction=0.01'\nfailures = 'gpu_mtbf_hours=5000,restart_s=600,quorum=1'"
    flags = ["--payload", "topk:fraction=0.01", "--failures", "gpu_mtbf_hours=5000,quorum=1"]
    docs = [
        cli_doc(capsys, "--topology", str(toml_file(tmp_path, table))),
        cli_doc(capsys, "--topology", str(toml_file(tmp_path, text))),
        cli_doc(capsys, "--topology", "two-clouds", *flags),
        api_doc(
            "two-clouds",
            payload={"kind": "topk", "fraction": 0.01},
            failures={"gpu_mtbf_hours": 5000, "quorum": 1},
        ),
    ]
    assert all(d == docs[0] for d in docs)
    assert docs[0]["payload_bits_per_param"] == pytest.approx(0.48)
    assert 0 < docs[0]["failures"]["goodput"] < 1


BAD: list[tuple[str, str, dict[str, Any], str]] = [
    # (file lines, CLI flags, Python overrides, the one line all three print)
    (
        "failures = { gpu_mtbf_hours = -5 }",
        "--failures gpu_mtbf_hours=-5",
        {"failures": {"gpu_mtbf_hours": -5}},
        "run.failures.gpu_mtbf_hours: got -5; Input should be greater than 0",
    ),
    (
        "failures = 'island_mtbf_hours=-1'",
        "--failures island_mtbf_hours=-1",
        {"failures": "island_mtbf_hours=-1"},
        "run.failures.island_mtbf_hours: got -1; Input should be greater than 0",
    ),
    (
        "mode = 'streaming'\nfragments = [{ offset = 0, layers = 8 }, { offset = 50, layers = 8 }]",
        "--mode streaming --fragments 0:8,50:8",
        {
            "mode": "streaming",
            "fragments": [{"offset": 0, "layers": 8}, {"offset": 50, "layers": 8}],
        },
        "run.fragments: got '2 fragments of 16 layers'; must cover the model's 32 layers exactly",
    ),
    (
        "mode = 'streaming'\nfragments = '0:40'",
        "--mode streaming --fragments 0:40",
        {"mode": "streaming", "fragments": "0:40"},
        "run.fragments: got '1 fragment of 40 layers'; must cover the model's 32 layers exactly",
    ),
    (
        "mode = 'streaming'\nfragments = 'x'",
        "--mode streaming --fragments x",
        {"mode": "streaming", "fragments": "x"},
        "run.fragments: got 'x'; P, or offset:layers pairs separated by commas",
    ),
    (
        "payload = { kind = 'topk', fraction = 1.5 }",
        "--payload topk:fraction=1.5",
        {"payload": {"kind": "topk", "fraction": 1.5}},
        "run.payload.fraction: got 1.5; Input should be less than or equal to 1",
    ),
    (
        "payload = 'topk:fraction=0'",
        "--payload topk:fraction=0",
        {"payload": "topk:fraction=0"},
        "run.payload.fraction: got 0; Input should be greater than 0",
    ),
    (
        "payload = { kind = 'dct_topk', fraction = -0.1 }",
        "--payload dct_topk:fraction=-0.1",
        {"payload": "dct_topk:fraction=-0.1"},
        "run.payload.fraction: got -0.1; Input should be greater than 0",
    ),
    (
        "overlap_steps = 101",
        "--overlap-steps 101",
        {"overlap_steps": 101},
        "run.overlap_steps: got 101; must be ≤ inner_steps = 100 (a whole round)",
    ),
]


@pytest.mark.parametrize(("lines", "flags", "python", "message"), BAD, ids=[b[1] for b in BAD])
def test_the_same_mistake_is_the_same_one_line_error_everywhere(
    lines: str,
    flags: str,
    python: dict[str, Any],
    message: str,
    tmp_path: Path,
    capsys: pytest.CaptureFixture[str],
) -> None:
    path = toml_file(tmp_path, lines)
    assert cli_error(capsys, "--topology", str(path)) == f"shardmeter: error: {message}"
    assert (
        cli_error(capsys, "--topology", "two-clouds", *flags.split())
        == f"shardmeter: error: {message}"
    )
    with pytest.raises(UserInputError) as exc:
        predict_topology(load_topology(path))
    assert str(exc.value) == message
    with pytest.raises(UserInputError) as exc:
        predict_topology(load_topology("two-clouds"), **python)
    assert str(exc.value) == message


def test_mtbf_per_gpu_per_island_and_on_one_island(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    """An island's own `mtbf_hours` wins over the run's; the run's per-GPU MTBF is divided by
    each island's GPUs, its per-island MTBF is taken as is."""
    path = toml_file(tmp_path, "failures = { gpu_mtbf_hours = 32000 }", "mtbf_hours = 500")
    doc = cli_doc(capsys, "--topology", str(path))
    assert [i["mtbf_hours"] for i in doc["islands"]] == [1000.0, 500.0]  # 32 GPUs each
    per_island = cli_doc(capsys, "--topology", "two-clouds", "--failures", "island_mtbf_hours=700")
    assert [i["mtbf_hours"] for i in per_island["islands"]] == [700.0, 700.0]
    bad = toml_file(tmp_path, "", "mtbf_hours = -3")
    assert cli_error(capsys, "--topology", str(bad)) == (
        "shardmeter: error: islands[1].mtbf_hours: got -3; Input should be greater than 0"
    )
