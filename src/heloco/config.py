"""Simulation configs from TOML: shipped presets, user files, and ``key=value`` overrides.

A config file has the shape of :class:`heloco.sim.SimConfig` (top-level keys plus ``[data]``,
``[inner]``, ``[outer]`` and ``[outer.correction]`` tables). Two extra top-level keys are
stripped before validation: ``preset = "name"`` starts from a shipped preset, and
``description`` is free text. TOML has no null, so the string ``"null"`` stands for None.
Every failure is a one-line :class:`UserInputError`.
"""

from __future__ import annotations

import copy
import json
import math
import sys
from collections.abc import Mapping
from pathlib import Path
from typing import Any

from heloco.sim.config import OUTER_ALIASES, SimConfig, fold_outer_aliases, parse_sim_config
from shardmeter.errors import UserInputError, check_input
from shardmeter.io import write_atomic

if sys.version_info >= (3, 11):
    import tomllib
else:  # pragma: no cover - exercised on Python 3.10 only
    import tomli as tomllib

PRESETS_DIR = Path(__file__).resolve().parent / "configs"
DEFAULT_PRESET = "default"
META_KEYS = ("preset", "description")
NULL = "null"  # TOML spelling of None


def preset_names() -> list[str]:
    """Names of the shipped presets (``configs/<name>.toml``), sorted."""
    return sorted(p.stem for p in PRESETS_DIR.glob("*.toml"))


def read_toml(path: Path, field: str = "config") -> dict[str, Any]:
    """Parse one TOML file; a missing or malformed file is a one-line error."""
    if not path.is_file():
        raise UserInputError(field, str(path), "an existing TOML file")
    try:
        return tomllib.loads(path.read_text(encoding="utf-8"))
    except (tomllib.TOMLDecodeError, UnicodeDecodeError) as exc:
        raise UserInputError(field, str(path), f"valid TOML ({exc})") from None


def preset_data(name: str) -> dict[str, Any]:
    """The raw table of a shipped preset (metadata keys included)."""
    path = PRESETS_DIR / f"{name}.toml"
    if not path.is_file():
        raise UserInputError("preset", name, "one of " + ", ".join(preset_names()))
    return read_toml(path, "preset")


def resolve_inheritance(data: Mapping[str, Any], depth: int = 0) -> dict[str, Any]:
    """Merge ``data`` over the preset it names (recursively), metadata keys removed."""
    if depth > 8:
        raise UserInputError("preset", data.get("preset"), "a preset chain without cycles")
    out = fold_outer_aliases({k: copy.deepcopy(v) for k, v in data.items() if k not in META_KEYS})
    parent = data.get("preset")
    if parent is None:
        return out
    if not isinstance(parent, str):
        raise UserInputError("preset", parent, "a preset name: " + ", ".join(preset_names()))
    return deep_merge(resolve_inheritance(preset_data(parent), depth + 1), out)


def deep_merge(base: Mapping[str, Any], top: Mapping[str, Any]) -> dict[str, Any]:
    """``top`` over ``base``; nested tables merge key by key, anything else is replaced."""
    out = dict(base)
    for key, value in top.items():
        if isinstance(value, Mapping) and isinstance(out.get(key), Mapping):
            out[key] = deep_merge(out[key], value)
        else:
            out[key] = copy.deepcopy(value)
    return out


def set_dotted(data: dict[str, Any], key: str, value: Any) -> None:
    """Set ``data["a"]["b"] = value`` for ``key = "a.b"``, creating tables on the way."""
    parts = key.split(".")
    if not all(parts):
        raise UserInputError("--set", key, "a dotted key such as inner.lr or data.seq_len")
    node = data
    for part in parts[:-1]:
        child = node.get(part)
        if not isinstance(child, dict):
            child = {}
            node[part] = child
        node = child
    node[parts[-1]] = value


def parse_value(text: str) -> Any:
    """A ``--set`` value: any TOML value (``3``, ``2e-4``, ``true``, ``[1, 2]``), else a string."""
    try:
        return tomllib.loads(f"v = {text}")["v"]
    except tomllib.TOMLDecodeError:
        return text


def parse_assignment(item: str) -> tuple[str, Any]:
    """``"inner.lr=1e-3"`` -> ``("inner.lr", 0.001)``."""
    key, sep, value = item.partition("=")
    if not sep or not key.strip():
        raise UserInputError("--set", item, "KEY=VALUE, e.g. inner.lr=1e-3")
    return key.strip(), parse_value(value.strip())


def _nulls_to_none(x: Any) -> Any:
    if isinstance(x, str) and x == NULL:
        return None
    if isinstance(x, dict):
        return {k: _nulls_to_none(v) for k, v in x.items()}
    if isinstance(x, list):
        return [_nulls_to_none(v) for v in x]
    return x


def canonical_key(key: str) -> str:
    """The stored spelling of a dotted key (``rho`` -> ``outer.rho``), so each layer's value
    of one knob replaces the one below whichever spelling either used."""
    return f"outer.{OUTER_ALIASES[key]}" if key in OUTER_ALIASES else key


def config_values(
    path: Path | None = None,
    preset: str | None = None,
    overrides: Mapping[str, Any] | None = None,
) -> dict[str, Any]:
    """The merged raw values: preset (or file, which may name its own preset), then overrides.

    Precedence, lowest first: preset < file < overrides (``--set`` and flags).

    With neither a file nor a preset, the ``default`` preset is the base.
    """
    if path is not None and preset is not None:
        raise UserInputError("preset", preset, "either a config file or --preset, not both")
    raw = read_toml(path) if path is not None else {"preset": preset or DEFAULT_PRESET}
    data = resolve_inheritance(raw)
    for key, value in (overrides or {}).items():
        set_dotted(data, canonical_key(key), copy.deepcopy(value))  # never the caller's dict
    return _nulls_to_none(data)


def load_config(
    path: Path | None = None,
    preset: str | None = None,
    overrides: Mapping[str, Any] | None = None,
) -> SimConfig:
    """A validated :class:`SimConfig` from a preset or file plus dotted-key overrides.

    A misspelt key is a one-line error with the close matches (``inner.lrr`` -> ``inner.lr``).
    """
    values = config_values(path, preset, overrides)
    check_input(values, SimConfig)
    return parse_sim_config(values)


# -- writing ------------------------------------------------------------------------------------
def _toml_scalar(value: Any, key: str) -> str:
    if value is None:
        return json.dumps(NULL)
    if isinstance(value, bool):
        return "true" if value else "false"
    if isinstance(value, int):
        return str(value)
    if isinstance(value, float):
        if not math.isfinite(value):
            raise UserInputError(key, value, "a finite number")
        return repr(value)
    if isinstance(value, str):
        return json.dumps(value)
    if isinstance(value, list | tuple):
        return "[" + ", ".join(_toml_scalar(v, key) for v in value) + "]"
    raise UserInputError(key, value, "a TOML scalar, array or table")


def _toml_table(data: Mapping[str, Any], prefix: str, lines: list[str]) -> None:
    tables = {k: v for k, v in data.items() if isinstance(v, Mapping)}
    for key, value in data.items():
        if key not in tables:
            lines.append(f"{key} = {_toml_scalar(value, prefix + key)}")
    for key, value in tables.items():
        lines.extend(["", f"[{prefix}{key}]"])
        _toml_table(value, f"{prefix}{key}.", lines)


def dumps_toml(data: Mapping[str, Any]) -> str:
    """TOML text of nested tables of scalars and arrays (None written as ``"null"``)."""
    lines: list[str] = []
    _toml_table(data, "", lines)
    return "\n".join(lines).lstrip("\n") + "\n"


def config_to_toml(cfg: SimConfig) -> str:
    """The full config as TOML; :func:`load_config` reads it back to an equal config."""
    return dumps_toml(cfg.model_dump(mode="json"))


def save_config(cfg: SimConfig, path: Path) -> None:
    """Write :func:`config_to_toml` atomically."""
    atomic_write_text(path, config_to_toml(cfg))


def atomic_write_text(path: Path, text: str) -> None:
    """Write ``text`` atomically (``shardmeter.io.write_atomic``: temp file + os.replace)."""
    write_atomic(path, text)
