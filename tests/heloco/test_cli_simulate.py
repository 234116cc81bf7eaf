"""`heloco simulate`: end to end on the default preset, flag overrides, one-line errors."""

from __future__ import annotations

import json
from collections.abc import Callable
from pathlib import Path

import pytest
import torch

from heloco.cli import build_parser, main
from heloco.cli.simulate import build_config
from heloco.config import load_config
from heloco.sim import PACE_RULE

# A few seconds on 2 cores: tiny rounds, a small synthetic corpus, a handful of eval windows.
FAST = [
    "--inner-steps", "2",
    "--token-budget", "5120",
    "--threads", "1",
    "--set", "eval_windows=4",
    "--set", "data.synthetic_chars_per_language=30000",
    "--set", "data.val_chars_per_language=5000",
]  # fmt: skip


def parse(*argv: str) -> object:
    return build_parser().parse_args(["simulate", *argv])


@pytest.mark.slow
def test_default_preset_end_to_end(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    out = tmp_path / "run"
    rc = main(["simulate", *FAST, "--out", str(out), "--json"])
    assert rc == 0
    printed = json.loads(capsys.readouterr().out)
    summary = json.loads((out / "summary.json").read_text())
    assert summary["tokens"] >= 5120
    assert summary["method"] == "heloco" == printed["method"]
    assert printed["final_loss"] < printed["initial_loss"]
    assert (out / "events.jsonl").stat().st_size > 0
    # the written config reloads to the config that ran
    assert load_config(out / "config.toml").token_budget == 5120
    first = (out / "events.jsonl").read_text()
    # a second run into the same folder is refused in one line, and changes nothing
    assert main(["simulate", *FAST, "--out", str(out), "--json"]) == 2
    err = capsys.readouterr().err.strip()
    assert "--out" in err and "--overwrite" in err and len(err.splitlines()) == 1
    assert (out / "events.jsonl").read_text() == first


@pytest.mark.slow
def test_overwrite_replaces_the_run_and_report_refuses_two_runs(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    out = tmp_path / "run"
    out.mkdir()
    (out / "notes.txt").write_text("mine")
    assert main(["simulate", *FAST, "--out", str(out), "--quiet"]) == 2
    assert main(["simulate", *FAST, "--out", str(out), "--quiet", "--overwrite"]) == 0
    assert (out / "notes.txt").read_text() == "mine"  # only the run's own files are replaced
    first = (out / "events.jsonl").read_text().splitlines()
    assert main(["simulate", *FAST, "--out", str(out), "--quiet", "--overwrite"]) == 0
    second = (out / "events.jsonl").read_text().splitlines()
    assert len(second) == len(first)  # replaced, not appended
    runs = {json.loads(x)["run"] for x in first} | {json.loads(x)["run"] for x in second}
    assert len(runs) == 2
    capsys.readouterr()
    assert main(["report", str(out), "--out", str(tmp_path / "rep")]) == 0
    # events of two runs in one file (as an older version appended them): refused
    (out / "events.jsonl").write_text("\n".join([*first, *second]) + "\n")
    assert main(["report", str(out), "--out", str(tmp_path / "rep2")]) == 2
    err = capsys.readouterr().err
    assert "one run" in err and f"line {len(first) + 1}" in err


def test_out_dir_is_an_alias_of_out(tmp_path: Path) -> None:
    assert parse("--out-dir", str(tmp_path)).out == tmp_path  # type: ignore[attr-defined]


def test_progress_bar_run_prints_summary(capsys: pytest.CaptureFixture[str]) -> None:
    assert main(["simulate", *FAST, "--method", "mla", "--paces", "1,1.50599,4.10203,2,2"]) == 0
    out = capsys.readouterr().out
    assert "validation loss" in out and "mla" in out
    # paces read as three significant digits (a topology's paces have many more)
    assert "1, 1.51, 4.1, 2, 2" in out and "1.50599" not in out


def test_flags_override_preset_and_set() -> None:
    args = parse(
        "--method", "dn-dylu", "--workers", "3", "--paces", "1,2,4", "--inner-steps", "7",
        "--seed", "9", "--token-budget", "1000", "--time-budget", "50", "--model", "small",
        "--eval-every", "100", "--assignment", "dirichlet", "--dirichlet-alpha", "0.3",
        "--set", "inner.lr=0.01", "--set", "seed=3", "--set", "outer.correction.kappa=2.0",
    )  # fmt: skip
    cfg = build_config(args)  # type: ignore[arg-type]
    assert cfg.method == "dn-dylu"
    assert cfg.workers == 3 and cfg.paces == [1.0, 2.0, 4.0]
    assert cfg.inner_steps == 7 and cfg.token_budget == 1000 and cfg.time_budget == 50
    assert cfg.model == "small" and cfg.eval_every == 100
    assert cfg.data.assignment == "dirichlet" and cfg.data.dirichlet_alpha == 0.3
    assert cfg.inner.lr == 0.01
    assert cfg.seed == 9  # the dedicated flag wins over --set
    assert cfg.outer.correction.kappa == 2.0
    # untouched keys keep the preset's values
    assert cfg.inner.batch_size == load_config().inner.batch_size


def test_preset_flag_and_config_file(tmp_path: Path) -> None:
    cfg = build_config(parse("--preset", "converged"))  # type: ignore[arg-type]
    assert cfg.model == "tiny" and cfg.inner.lr == 1e-3
    path = tmp_path / "mine.toml"
    path.write_text('preset = "paper-regime"\nmethod = "mla"\n[inner]\nbatch_size = 3\n')
    cfg = build_config(parse("--config", str(path), "--seed", "5"))  # type: ignore[arg-type]
    assert (cfg.method, cfg.inner.batch_size, cfg.seed) == ("mla", 3, 5)
    assert cfg.data.tokenizer == "bpe"  # inherited from the preset


def test_unknown_method(cli_error: Callable[..., str]) -> None:
    err = cli_error(main, ["simulate", "--method", "adam-async"])
    assert "adam-async" in err and "heloco" in err


def test_paces_of_wrong_length(cli_error: Callable[..., str]) -> None:
    err = cli_error(main, ["simulate", "--workers", "5", "--paces", "1,2,3"])
    assert (
        err == "heloco: error: paces: got [1.0, 2.0, 3.0]; 5 values, one per worker (workers = 5)"
    )


def test_cross_field_model_error_names_the_field(cli_error: Callable[..., str]) -> None:
    shape = ["--set", "model.d_model=30", "--set", "model.n_head=4", "--set", "model.n_layer=1"]
    shape += ["--set", "model.vocab_size=256", "--set", "model.seq_len=64"]
    err = cli_error(main, ["simulate", *shape])
    assert err == "heloco: error: model.d_model: got 30; a multiple of n_head (4)"
    shape[1] = "model.d_model=-1"  # a field error inside the table branch of `str | ModelConfig`
    err = cli_error(main, ["simulate", *shape])
    assert err.startswith("heloco: error: model.d_model: got -1; ")


def test_paces_not_numbers(cli_error: Callable[..., str]) -> None:
    assert "paces" in cli_error(main, ["simulate", "--paces", "1,fast,2"])


def test_missing_data_folder(tmp_path: Path, cli_error: Callable[..., str]) -> None:
    missing = tmp_path / "nowhere"
    err = cli_error(main, ["simulate", *FAST, "--data-dir", str(missing)])
    assert "data_dir" in err and "nowhere" in err


def test_language_without_text(tmp_path: Path, cli_error: Callable[..., str]) -> None:
    corpus = tmp_path / "corpus"
    corpus.mkdir()
    for lang in ("de", "en", "fr", "it"):
        (corpus / f"{lang}.txt").write_text("lorem ipsum dolor sit amet " * 2000)
    (corpus / "es.txt").write_text("")
    err = cli_error(main, ["simulate", *FAST, "--data-dir", str(corpus)])
    assert "'es'" in err


def test_unknown_preset_and_bad_set(cli_error: Callable[..., str]) -> None:
    assert "preset" in cli_error(main, ["simulate", "--preset", "nope"])
    assert "--set" in cli_error(main, ["simulate", "--set", "novalue"])
    assert "bogus" in cli_error(main, ["simulate", "--set", "bogus=1"])


def test_missing_config_file(tmp_path: Path, cli_error: Callable[..., str]) -> None:
    err = cli_error(main, ["simulate", "--config", str(tmp_path / "absent.toml")])
    assert "config" in err and "absent.toml" in err


def test_unknown_or_absent_device(cli_error: Callable[..., str]) -> None:
    err = cli_error(main, ["simulate", "--set", "device=gpu", "--quiet"])
    assert err == "heloco: error: device: got 'gpu'; a torch device such as cpu or cuda:0"
    if not torch.cuda.is_available():
        err = cli_error(main, ["simulate", "--set", "device=cuda", "--quiet"])
        assert err == "heloco: error: device: got 'cuda'; cpu (no CUDA device is available here)"


def test_set_typo_gets_suggestions(cli_error: Callable[..., str]) -> None:
    err = cli_error(main, ["simulate", "--set", "inner.lrr=3"])
    assert err.startswith("heloco: error: inner.lrr: got 3; unknown key; did you mean inner.lr")
    err = cli_error(main, ["simulate", "--set", "pace_jiter=0.1"])
    assert "did you mean pace_jitter?" in err


def test_usage_errors_are_one_line(cli_error: Callable[..., str]) -> None:
    err = cli_error(main, ["simulate", "my.toml"])  # the config is --config now
    assert "my.toml" in err


@pytest.mark.parametrize(
    "argv",
    [
        ["simulate", "--paces", "1,fast,2,2,2"],
        ["simulate", "--paces", "1,0,2,2,2"],
        ["simulate", "--set", "paces=[1, 1, inf, 2, 2]"],
        ["launch", "--out", "OUT", "--workers", "3", "--paces", "1,-2,4"],
    ],
)
def test_one_pace_rule_everywhere(
    argv: list[str], tmp_path: Path, cli_error: Callable[..., str]
) -> None:
    """`--paces` means seconds per inner step in simulate and launch, with one error text."""
    err = cli_error(main, [str(tmp_path / "out") if a == "OUT" else a for a in argv])
    assert err.endswith(PACE_RULE), err
