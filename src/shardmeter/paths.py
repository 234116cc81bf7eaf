"""Where the project's shared reference material lives (read in place, never copied)."""

from __future__ import annotations

import os
from pathlib import Path

ENV_VAR = "SHARED_DIR"


def shared_dir() -> Path:
    """The shared folder: ``$SHARED_DIR`` if set, else ``../shared`` beside the repository root."""
    env = os.environ.get(ENV_VAR)
    if env:
        return Path(env).expanduser().resolve()
    repo_root = Path(__file__).resolve().parents[2]
    return (repo_root.parent / "shared").resolve()


def shared_path(*parts: str) -> Path | None:
    """A path inside the shared folder, or None when it does not exist."""
    path = shared_dir().joinpath(*parts)
    return path if path.exists() else None


def missing_shared_reason(*parts: str) -> str:
    """A plain sentence saying which shared path is absent and how to point elsewhere."""
    return (
        f"shared material {'/'.join(parts)!r} not found under {shared_dir()} "
        f"(set ${ENV_VAR} to the folder that holds design/, calibration/ and data/)"
    )
