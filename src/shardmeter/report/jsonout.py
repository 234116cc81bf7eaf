"""JSON output of the CLIs: plain values only, non-finite floats as null, so every `--json`
document is strict JSON (json.dump would otherwise write NaN/Infinity, which parsers reject)."""

from __future__ import annotations

import dataclasses
import json
import math
import sys
from typing import Any, TextIO

from pydantic import BaseModel


def jsonable(obj: Any) -> Any:
    """Dataclasses, pydantic models, tuples and non-finite floats -> plain JSON values."""
    if dataclasses.is_dataclass(obj) and not isinstance(obj, type):
        return {f.name: jsonable(getattr(obj, f.name)) for f in dataclasses.fields(obj)}
    if isinstance(obj, BaseModel):
        return jsonable(obj.model_dump())
    if isinstance(obj, dict):
        return {str(k): jsonable(v) for k, v in obj.items()}
    if isinstance(obj, list | tuple):
        return [jsonable(v) for v in obj]
    if isinstance(obj, float) and not math.isfinite(obj):
        return None
    return obj


def print_json(doc: Any, stream: TextIO | None = None) -> None:
    """Write `doc` as indented strict JSON and a newline (default: standard output)."""
    out = stream if stream is not None else sys.stdout
    json.dump(jsonable(doc), out, indent=2, allow_nan=False)
    out.write("\n")
