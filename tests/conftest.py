"""Test-wide settings: hypothesis without wall-clock deadlines, derandomized under CI."""

from __future__ import annotations

import os

from hypothesis import HealthCheck, settings

settings.register_profile(
    "project",
    deadline=None,  # tests check behaviour, never wall-clock time (the machine is shared)
    suppress_health_check=[HealthCheck.too_slow],
    derandomize=bool(os.environ.get("CI")),  # CI reproduces the same examples on every run
    print_blob=True,
)
settings.load_profile("project")
