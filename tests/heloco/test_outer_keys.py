"""The outer lr, momentum and rho reach the optimizer, whichever spelling
(``[outer]`` table, top-level alias, ``--set``, ``--outer-lr``) and whichever layer set them."""

from __future__ import annotations

from pathlib import Path

import pytest
import torch

from heloco.cli import build_parser
from heloco.cli.simulate import build_config
from heloco.config import load_config
from heloco.sim import ServerSetup, SimConfig
from shardmeter.errors import UserInputError


def built(cfg: SimConfig) -> tuple[float, float, object]:
    """(lr, momentum, rho) of the optimizer the server would run."""
    opt = ServerSetup.of(cfg).build({"w": torch.zeros(2)}, [1.0] * cfg.workers).optimizer
    return opt.lr, opt.momentum, opt.rho  # type: ignore[attr-defined]


def cli_config(*argv: str) -> SimConfig:
    return build_config(build_parser().parse_args(["simulate", *argv]))


@pytest.mark.parametrize(
    "argv",
    [
        ("--set", "outer.lr=0.3", "--set", "outer.momentum=0.5", "--set", "outer.rho=delay"),
        ("--set", "outer_lr=0.3", "--set", "outer_momentum=0.5", "--set", "rho=delay"),
        ("--outer-lr", "0.3", "--set", "outer.momentum=0.5", "--set", "rho=delay"),
    ],
)
def test_outer_overrides_reach_the_optimizer(argv: tuple[str, ...]) -> None:
    assert built(cli_config(*argv)) == (0.3, 0.5, "delay")


def test_outer_table_in_a_file_reaches_the_optimizer(tmp_path: Path) -> None:
    path = tmp_path / "c.toml"
    path.write_text('preset = "default"\n[outer]\nlr = 0.3\nmomentum = 0.5\nrho = 0.25\n')
    assert built(load_config(path)) == (0.3, 0.5, 0.25)


def test_later_layer_wins_across_spellings(tmp_path: Path) -> None:
    path = tmp_path / "c.toml"
    path.write_text('preset = "default"\nrho = "delay"\n[outer]\nmomentum = 0.5\n')
    cfg = cli_config(
        "--config", str(path), "--set", "outer.rho=none", "--set", "outer_momentum=0.2"
    )
    assert built(cfg)[1:] == (0.2, "none")


def test_defaults_are_the_methods() -> None:
    assert built(load_config()) == (0.7, 0.9, "sqrt_k")


def test_two_spellings_in_one_layer_must_agree(tmp_path: Path) -> None:
    path = tmp_path / "c.toml"
    path.write_text('preset = "default"\nrho = "delay"\n[outer]\nrho = "none"\n')
    with pytest.raises(UserInputError, match="not both"):
        load_config(path)
