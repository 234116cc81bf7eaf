"""Load model, accelerator, cluster and plan specs from preset names, TOML/JSON files or dicts.

Presets are the TOML files shipped under ``shardmeter/data/{models,accelerators,clusters}``; a
user file has the same shape. An optional ``[preset]`` table carries metadata (summary, source,
published sizes) and is never part of the spec. Every failure becomes a one-line
``UserInputError`` that names the field path.
"""

from __future__ import annotations

import copy
import difflib
import json
import sys
from collections.abc import Mapping
from dataclasses import dataclass
from functools import cache, lru_cache
from pathlib import Path
from typing import Any

from shardmeter.errors import UserInputError
from shardmeter.specs.hardware import Accelerator, Cluster
from shardmeter.specs.hf import model_from_hf_config
from shardmeter.specs.model import TransformerSpec
from shardmeter.specs.plan import Plan
from shardmeter.specs.validation import validate_spec

if sys.version_info >= (3, 11):
    import tomllib
else:  # pragma: no cover - exercised on Python 3.10 only
    import tomli as tomllib

DATA_DIR = Path(__file__).resolve().parent.parent / "data"
KINDS: tuple[str, ...] = ("models", "accelerators", "clusters", "topologies")
META_KEY = "preset"  # table holding metadata, stripped before validation
FILE_SUFFIXES = (".toml", ".json")


@dataclass(frozen=True)
class PresetInfo:
    """One shipped preset as `shardmeter presets` lists it."""

    kind: str
    name: str
    summary: str
    source: str


# --- kinds and names ----------------------------------------------------------------------------
def normalize_kind(kind: str) -> str:
    """'model' / 'models' / 'Models' -> 'models'; anything else is a UserInputError."""
    key = kind.strip().lower()
    plural = key if key.endswith("s") else key + "s"
    if plural not in KINDS:
        raise UserInputError("kind", kind, f"expected one of {', '.join(KINDS)}")
    return plural


def _singular(kind: str) -> str:
    return kind[:-1]


@cache
def preset_names(kind: str) -> tuple[str, ...]:
    """Names of the shipped presets of one kind (file stems), sorted."""
    folder = DATA_DIR / normalize_kind(kind)
    if not folder.is_dir():
        return ()
    return tuple(sorted(path.stem for path in folder.glob("*.toml")))


def _unknown_preset(kind: str, name: str, field: str) -> UserInputError:
    names = preset_names(kind)
    close = difflib.get_close_matches(name, names, n=4, cutoff=0.5)
    hint = f"close matches: {', '.join(close)}; " if close else ""
    return UserInputError(
        field,
        name,
        f"unknown {_singular(kind)} preset; {hint}list all with `shardmeter presets {kind}`",
    )


# --- reading files ------------------------------------------------------------------------------
def read_spec_file(path: Path, field: str) -> dict[str, Any]:
    """Parse a .toml or .json file into a dict; any problem is a one-line UserInputError."""
    suffix = path.suffix.lower()
    if suffix not in FILE_SUFFIXES:
        raise UserInputError(field, str(path), "expected a .toml or .json file")
    try:
        text = path.read_text(encoding="utf-8")
    except FileNotFoundError:
        raise UserInputError(field, str(path), "file not found") from None
    except (OSError, UnicodeDecodeError) as exc:
        raise UserInputError(field, str(path), f"cannot read file ({exc})") from None
    try:
        data = tomllib.loads(text) if suffix == ".toml" else json.loads(text)
    except (tomllib.TOMLDecodeError, json.JSONDecodeError) as exc:
        kind = "TOML" if suffix == ".toml" else "JSON"
        raise UserInputError(field, str(path), f"invalid {kind}: {exc}") from None
    if not isinstance(data, dict):
        raise UserInputError(field, str(path), "the file must hold a table/object of fields")
    return data


@cache
def _preset_file(kind: str, name: str) -> dict[str, Any]:
    return read_spec_file(DATA_DIR / kind / f"{name}.toml", f"{_singular(kind)} preset {name}")


def preset_data(kind: str, name: str, field: str | None = None) -> dict[str, Any]:
    """The raw dict of a shipped preset (a fresh copy, metadata included)."""
    kind = normalize_kind(kind)
    if name not in preset_names(kind):
        raise _unknown_preset(kind, name, field or _singular(kind))
    return copy.deepcopy(_preset_file(kind, name))


def looks_like_path(ref: str | Path) -> bool:
    """A Path, or a string with a directory separator or a .toml/.json suffix."""
    if isinstance(ref, Path):
        return True
    return "/" in ref or "\\" in ref or ref.lower().endswith(FILE_SUFFIXES)


def _source(ref: str | Path | Mapping[str, Any], kind: str, field: str) -> dict[str, Any]:
    """Raw dict for a preset name, a file path or an in-memory mapping."""
    if isinstance(ref, Mapping):
        return copy.deepcopy(dict(ref))
    if not isinstance(ref, (str, Path)):
        raise UserInputError(field, ref, "expected a preset name, a file path or a table")
    if isinstance(ref, Path) or looks_like_path(ref):
        return read_spec_file(Path(ref).expanduser(), field)
    return preset_data(kind, ref, field)


def split_meta(data: dict[str, Any]) -> tuple[dict[str, Any], dict[str, Any]]:
    """Separate the `[preset]` metadata table from the spec fields."""
    spec = dict(data)
    meta = spec.pop(META_KEY, None)
    return spec, (meta if isinstance(meta, dict) else {})


def _names_a_preset(value: object) -> bool:
    return isinstance(value, str) or (
        isinstance(value, Mapping) and isinstance(value.get(META_KEY), str)
    )


def inherit(kind: str, data: Mapping[str, Any], field: str) -> dict[str, Any]:
    """Spec fields of a table. With ``preset = "name"`` it starts from that shipped preset and
    its other keys override it (nested tables merge); a ``[preset]`` metadata table is dropped."""
    named = data.get(META_KEY)
    rest = {key: copy.deepcopy(value) for key, value in data.items() if key != META_KEY}
    if not isinstance(named, str):
        return rest
    base, _ = split_meta(preset_data(kind, named, f"{field}.preset"))
    if kind == "clusters" and "accelerator" in base:
        if _names_a_preset(rest.get("accelerator")):
            del base["accelerator"]  # a named accelerator replaces the preset's, never merges
        else:
            base["accelerator"] = accelerator_data(base["accelerator"], f"{field}.accelerator")
    return apply_overrides(base, rest)


# --- overrides and validation -------------------------------------------------------------------
def apply_overrides(data: dict[str, Any], overrides: Mapping[str, Any]) -> dict[str, Any]:
    """Return `data` with overrides applied; keys may be dotted ('inter.bandwidth_gbps') and
    mapping values merge into mapping fields instead of replacing them."""
    out = copy.deepcopy(data)
    for key, value in overrides.items():
        *parents, leaf = key.split(".")
        node = out
        for part in parents:
            child = node.get(part)
            if not isinstance(child, dict):
                child = {}
                node[part] = child
            node = child
        old = node.get(leaf)
        if isinstance(old, dict) and isinstance(value, Mapping):
            node[leaf] = apply_overrides(old, value)
        else:
            node[leaf] = copy.deepcopy(value)
    return out


def _prefix(ref: object, kind: str) -> str:
    if isinstance(ref, (str, Path)) and looks_like_path(ref):
        return f"{Path(ref).name}:{_singular(kind)}"
    return _singular(kind)


# --- public loaders -----------------------------------------------------------------------------
@lru_cache(maxsize=256)
def _model_preset(name: str) -> TransformerSpec:
    spec, _ = split_meta(preset_data("models", name, "model"))
    return validate_spec(TransformerSpec, spec, "model")


def load_model(
    ref: str | Path | Mapping[str, Any] | TransformerSpec, **overrides: Any
) -> TransformerSpec:
    """A TransformerSpec from a preset name, a .toml/.json file, a Hugging Face config.json
    (or a folder holding one), a mapping, or a spec; keyword overrides replace fields."""
    if isinstance(ref, TransformerSpec):
        base: TransformerSpec | dict[str, Any] = ref
    elif isinstance(ref, str) and not looks_like_path(ref) and not overrides:
        return _model_preset(ref)
    elif isinstance(ref, (str, Path)) and _is_hf_config(Path(ref).expanduser()):
        base = model_from_hf_config(Path(ref).expanduser())
    else:
        base = inherit("models", _source(ref, "models", "model"), "model")
    if not overrides:
        return base if isinstance(base, TransformerSpec) else _validate_model(base, ref)
    data = base.model_dump(exclude_unset=False) if isinstance(base, TransformerSpec) else base
    return _validate_model(apply_overrides(data, overrides), ref)


def _validate_model(data: dict[str, Any], ref: object) -> TransformerSpec:
    return validate_spec(TransformerSpec, data, _prefix(ref, "models"))


def _is_hf_config(path: Path) -> bool:
    """A folder with config.json, or a .json file whose keys look like a transformers config."""
    if path.is_dir():
        return (path / "config.json").is_file()
    if path.suffix.lower() != ".json" or not path.is_file():
        return False
    try:
        data = json.loads(path.read_text(encoding="utf-8"))
    except (OSError, UnicodeDecodeError, json.JSONDecodeError):
        return False
    return isinstance(data, dict) and ("architectures" in data or "model_type" in data)


@lru_cache(maxsize=256)
def _accelerator_preset(name: str) -> Accelerator:
    spec, _ = split_meta(preset_data("accelerators", name, "accelerator"))
    return validate_spec(Accelerator, spec, "accelerator")


def load_accelerator(
    ref: str | Path | Mapping[str, Any] | Accelerator, **overrides: Any
) -> Accelerator:
    """An Accelerator from a preset name, a file, a mapping or an Accelerator; overrides
    replace fields (dotted keys such as 'efficiency.matmul_max' reach nested tables)."""
    if isinstance(ref, Accelerator) and not overrides:
        return ref
    if isinstance(ref, str) and not looks_like_path(ref) and not overrides:
        return _accelerator_preset(ref)
    data = accelerator_data(ref, "accelerator")
    return validate_spec(
        Accelerator, apply_overrides(data, overrides), _prefix(ref, "accelerators")
    )


def accelerator_data(ref: object, field: str) -> dict[str, Any]:
    """Raw accelerator fields for a reference: a preset name, a file, an Accelerator, or a
    table (inline fields, or ``preset = "name"`` plus fields that override that preset)."""
    if isinstance(ref, Accelerator):
        return ref.model_dump()
    if isinstance(ref, Mapping):
        return inherit("accelerators", ref, field)
    if isinstance(ref, (str, Path)):
        return inherit("accelerators", _source(ref, "accelerators", field), field)
    raise UserInputError(field, ref, "expected an accelerator preset name, a file or a table")


@lru_cache(maxsize=256)
def _cluster_preset(name: str) -> Cluster:
    return _cluster_from(preset_data("clusters", name, "cluster"), {}, "cluster")


def load_cluster(ref: str | Path | Mapping[str, Any] | Cluster, **overrides: Any) -> Cluster:
    """A Cluster from a preset name, a file, a mapping or a Cluster. Its `accelerator` may be a
    preset name or an inline table. Overrides replace fields: `n_nodes=4`,
    `accelerator="h200"`, `inter={"bandwidth_gbps": 25}` or dotted `**{"inter.latency_us": 9}`."""
    if isinstance(ref, Cluster):
        if not overrides:
            return ref
        return _cluster_from(ref.model_dump(), overrides, "cluster")
    if isinstance(ref, str) and not looks_like_path(ref) and not overrides:
        return _cluster_preset(ref)
    return _cluster_from(_source(ref, "clusters", "cluster"), overrides, _prefix(ref, "clusters"))


def _cluster_from(raw: dict[str, Any], overrides: Mapping[str, Any], prefix: str) -> Cluster:
    data = inherit("clusters", raw, prefix)
    field = f"{prefix}.accelerator"
    if "accelerator" in data:
        data["accelerator"] = accelerator_data(data["accelerator"], field)
    data = apply_overrides(data, overrides)
    if "accelerator" in data and not isinstance(data["accelerator"], dict):
        data["accelerator"] = accelerator_data(data["accelerator"], field)
    return validate_spec(Cluster, data, prefix)


def load_plan(ref: str | Path | Mapping[str, Any] | Plan, **overrides: Any) -> Plan:
    """A Plan from a file, a mapping or a Plan. A file may hold the plan fields at top level or
    in a `[plan]` table (so one run file can also name the model and cluster)."""
    if isinstance(ref, Plan):
        data: dict[str, Any] = ref.model_dump(exclude_unset=True)
    elif isinstance(ref, Mapping):
        data = copy.deepcopy(dict(ref))
    elif isinstance(ref, (str, Path)):
        data = read_spec_file(Path(ref).expanduser(), "plan")
    else:
        raise UserInputError("plan", ref, "expected a .toml/.json file path, a table or a Plan")
    if isinstance(data.get("plan"), dict):
        data = data["plan"]
    return validate_spec(Plan, apply_overrides(data, overrides), _prefix(ref, "plans"))


# --- listing ------------------------------------------------------------------------------------
def preset_info(kind: str, name: str) -> PresetInfo:
    """Name, one-line summary and source of one shipped preset."""
    kind = normalize_kind(kind)
    data = preset_data(kind, name)
    _, meta = split_meta(data)
    summary = str(meta.get("summary") or data.get("summary") or data.get("description") or "")
    source = str(meta.get("source") or data.get("source") or "")
    return PresetInfo(kind=kind, name=name, summary=summary, source=source)


def list_presets(kind: str) -> list[PresetInfo]:
    """Every shipped preset of one kind ('models', 'accelerators', 'clusters', 'topologies')."""
    kind = normalize_kind(kind)
    return [preset_info(kind, name) for name in preset_names(kind)]


def clusters_for_accelerator(accelerator: str) -> list[str]:
    """Names of the cluster presets built from a given accelerator preset (e.g. 'h100-sxm')."""
    return [
        name
        for name in preset_names("clusters")
        if _cluster_preset(name).accelerator.name == accelerator
    ]
