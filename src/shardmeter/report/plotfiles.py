"""The plot file formats every command writes (`plan --plot`, `sweep --formats`, heloco)."""

from __future__ import annotations

from pathlib import Path

from shardmeter.errors import UserInputError

PLOT_FORMATS: tuple[str, ...] = ("png", "svg", "pdf")  # matplotlib backends, no extra deps


def check_plot_path(flag: str, path: Path) -> Path:
    """``path`` if it ends in a plot format, else a one-line error naming ``flag``."""
    if path.suffix.lower().lstrip(".") not in PLOT_FORMATS:
        allowed = " or ".join(f".{f}" for f in PLOT_FORMATS)
        raise UserInputError(flag, str(path), f"a file ending in {allowed}")
    return path


def parse_formats(flag: str, text: str) -> list[str]:
    """``"png,svg"`` -> ``["png", "svg"]``; each must be a plot format, at least one."""
    formats = [f.strip().lower().lstrip(".") for f in text.split(",") if f.strip()]
    for fmt in formats or [text]:
        if fmt not in PLOT_FORMATS:
            raise UserInputError(flag, fmt, f"choose from {', '.join(PLOT_FORMATS)}")
    return formats
