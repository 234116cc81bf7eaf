"""Read a run config (the simulator's ``SimConfig``) from TOML or JSON, with ``key=value`` overrides."""

from __future__ import annotations

import json
import sys
from pathlib import Path
from typing import Any

from heloco.sim import SimConfig, parse_sim_config
from shardmeter.errors import UserInputError

if sys.version_info >= (3, 11):
    import tomllib
else:  # pragma: no cover
    import tomli as tomllib


def read_values(path: Path) -> dict[str, Any]:
    """The raw mapping in a ``.toml`` or ``.json`` file."""
    if not path.is_file():
        raise UserInputError("config", str(path), "an existing .toml or .json file")
    text = path.read_text()
    if path.suffix == ".json":
        values = json.loads(text)
    elif path.suffix == ".toml":
        values = tomllib.loads(text)
    else:
        raise UserInputError("config", str(path), "a .toml or .json file")
    if not isinstance(values, dict):
        raise UserInputError("config", str(path), "a table/object at the top level")
    return values


def apply_override(values: dict[str, Any], item: str) -> None:
    """Set ``a.b.c=value`` in place; the value is parsed as JSON, else kept as a string."""
    key, sep, raw = item.partition("=")
    if not sep or not key:
        raise UserInputError("--set", item, "KEY=VALUE, e.g. workers=3 or inner.lr=1e-3")
    try:
        value: Any = json.loads(raw)
    except json.JSONDecodeError:
        value = raw
    node = values
    parts = key.split(".")
    for part in parts[:-1]:
        child = node.setdefault(part, {})
        if not isinstance(child, dict):
            raise UserInputError("--set", item, f"{part!r} is not a table")
        node = child
    node[parts[-1]] = value


def load_run_config(path: Path | None, overrides: list[str] | None = None) -> SimConfig:
    """A validated run config from a file (or defaults) plus overrides."""
    values = read_values(path) if path is not None else {}
    for item in overrides or []:
        apply_override(values, item)
    return parse_sim_config(values)
