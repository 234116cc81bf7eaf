"""Without the `train` extra, every `heloco` command is a one-line hint."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import pytest

HEALTHY = Path(sys.executable).with_name("heloco")


def run_without(module: str, argv: list[str], tmp_path: Path) -> subprocess.CompletedProcess[str]:
    """Run the real `heloco` entry point with ``module`` made unimportable (a stub module
    earlier on PYTHONPATH that raises as a missing package would)."""
    (tmp_path / f"{module}.py").write_text(
        f"raise ModuleNotFoundError(\"No module named '{module}'\", name={module!r})\n"
    )
    env = {**os.environ, "PYTHONPATH": str(tmp_path)}
    cmd = [sys.executable, "-c", "from heloco.cli import main; raise SystemExit(main())", *argv]
    return subprocess.run(cmd, env=env, capture_output=True, text=True, timeout=60)


@pytest.mark.slow  # a fresh interpreter per case
@pytest.mark.parametrize(
    ("module", "argv"),
    [
        ("torch", ["--help"]),
        ("torch", []),
        ("torch", ["simulate", "--quiet"]),
        ("torch", ["report", "runs"]),
        ("zmq", ["serve", "--help"]),
    ],
)
def test_missing_train_extra_is_a_one_line_hint(
    module: str, argv: list[str], tmp_path: Path
) -> None:
    done = run_without(module, argv, tmp_path)
    assert done.returncode == 2
    assert "Traceback" not in done.stderr
    assert done.stderr.count("\n") == 1, done.stderr
    assert f"missing: {module}" in done.stderr and "pip install -e '.[train]'" in done.stderr


def test_console_script_without_torch(tmp_path: Path) -> None:
    if not HEALTHY.is_file():
        pytest.skip(f"no heloco console script beside {sys.executable}")
    (tmp_path / "torch.py").write_text("raise ModuleNotFoundError('no torch', name='torch')\n")
    env = {**os.environ, "PYTHONPATH": str(tmp_path)}
    done = subprocess.run(
        [str(HEALTHY), "--help"], env=env, capture_output=True, text=True, timeout=60
    )
    assert done.returncode == 2 and done.stderr.startswith("heloco: error: heloco needs")
