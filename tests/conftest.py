"""Test-wide settings (hypothesis without wall-clock deadlines, derandomized under CI), the
benchmark-script loader and the one-line CLI error check."""

from __future__ import annotations

import importlib.util
import os
import sys
from collections.abc import Callable
from pathlib import Path
from types import ModuleType

import pytest
from hypothesis import HealthCheck, settings

settings.register_profile(
    "project",
    deadline=None,  # tests check behaviour, never wall-clock time (the machine is shared)
    suppress_health_check=[HealthCheck.too_slow],
    derandomize=bool(os.environ.get("CI")),  # CI reproduces the same examples on every run
    print_blob=True,
)
settings.load_profile("project")


BENCHMARKS = Path(__file__).resolve().parents[1] / "benchmarks"


@pytest.fixture(scope="module")
def load_benchmark() -> Callable[[str], ModuleType]:
    """Import ``benchmarks/<name>.py`` (not a package) as a module, for tests of its logic."""

    def load(name: str) -> ModuleType:
        spec = importlib.util.spec_from_file_location(f"{name}_bench", BENCHMARKS / f"{name}.py")
        assert spec is not None and spec.loader is not None
        module = importlib.util.module_from_spec(spec)
        sys.modules[spec.name] = module
        spec.loader.exec_module(module)
        return module

    return load


@pytest.fixture
def cli_error(
    capsys: pytest.CaptureFixture[str],
) -> Callable[[Callable[[list[str]], int], list[str]], str]:
    """Run a CLI's ``main(argv)`` and return its error: exit 2, one stderr line, no traceback."""

    def run(main: Callable[[list[str]], int], argv: list[str]) -> str:
        rc = main(argv)
        err = capsys.readouterr().err.strip()
        assert rc == 2, f"{argv} exited {rc}; stderr: {err}"
        assert "Traceback" not in err and len(err.splitlines()) == 1, err
        return err

    return run
