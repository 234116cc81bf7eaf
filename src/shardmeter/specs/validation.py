"""Pydantic validation with one-line UserInputErrors that name the field path and what is allowed."""

from __future__ import annotations

import math
from collections.abc import Mapping
from typing import Any, TypeVar, get_args

from pydantic import BaseModel, ValidationError

from shardmeter.errors import UserInputError, check_input, from_pydantic

SpecT = TypeVar("SpecT", bound=BaseModel)


def _model_fields_at(cls: type[BaseModel], loc: tuple[Any, ...]) -> list[str] | None:
    """Field names of the (nested) pydantic model that owns the last element of `loc`."""
    model = cls
    for part in loc[:-1]:
        field = model.model_fields.get(str(part))
        if field is None:
            return None
        candidates = [field.annotation, *get_args(field.annotation)]
        nested = next(
            (c for c in candidates if isinstance(c, type) and issubclass(c, BaseModel)), None
        )
        if nested is None:
            return None
        model = nested
    return sorted(model.model_fields)


def user_error(exc: ValidationError, cls: type[BaseModel], prefix: str) -> UserInputError:
    """One-line error for a ValidationError; unknown fields list the allowed field names."""
    first = exc.errors()[0]
    loc = tuple(first.get("loc", ()))
    if first.get("type") == "extra_forbidden":
        allowed = _model_fields_at(cls, loc)
        field = ".".join([prefix, *map(str, loc)]) if prefix else ".".join(map(str, loc))
        known = f"; allowed fields: {', '.join(allowed)}" if allowed else ""
        return UserInputError(field, first.get("input"), f"unknown field{known}")
    if first.get("type") == "missing":
        field = ".".join([prefix, *map(str, loc)]) if prefix else ".".join(map(str, loc))
        return UserInputError(field, None, "required field is missing")
    return from_pydantic(exc, prefix)


MAX_EXACT_INT = 2**53  # the largest integer every float computation still holds exactly
MAX_MAGNITUDE = 1e18  # no spec quantity in its unit (GB, TFLOP/s, Gbit/s, ms, USD, tokens)
# comes near it, and products of a few such numbers stay far from float overflow (1.8e308)


def reject_non_finite(data: Any, path: str) -> None:
    """Raise for NaN or infinite numbers anywhere in a (nested) table: TOML and JSON can spell
    them (`nan`, `inf`, `Infinity`), and no spec quantity is meaningful at those values; nor
    beyond MAX_MAGNITUDE (1e308 would turn costs and times into inf), nor integers beyond 2**53,
    which the float arithmetic of the estimate cannot hold."""
    if isinstance(data, float) and not math.isfinite(data):
        raise UserInputError(path, data, "expected a finite number")
    if isinstance(data, float) and abs(data) > MAX_MAGNITUDE:
        raise UserInputError(path, data, f"a number of magnitude at most {MAX_MAGNITUDE:g}")
    if isinstance(data, int) and not isinstance(data, bool) and abs(data) > MAX_EXACT_INT:
        raise UserInputError(path, data, f"a number of magnitude at most 2**53 ({MAX_EXACT_INT})")
    if isinstance(data, dict):
        for key, value in data.items():
            name = str(key) if str(key).isprintable() else repr(str(key))  # one-line paths
            reject_non_finite(value, f"{path}.{name}" if path else name)
    elif isinstance(data, (list, tuple)):
        for index, value in enumerate(data):
            reject_non_finite(value, f"{path}[{index}]")


def validate_spec(cls: type[SpecT], data: Any, prefix: str) -> SpecT:
    """`cls.model_validate(data)`, with ValidationError turned into a one-line UserInputError."""
    reject_non_finite(data, prefix)
    if isinstance(data, Mapping):
        check_input(data, cls, f"{prefix}." if prefix else "")
    try:
        return cls.model_validate(data)
    except ValidationError as exc:
        raise user_error(exc, cls, prefix) from None
    except (TypeError, ValueError, ArithmeticError) as exc:
        # A validator that trips over an odd but type-valid value (e.g. a huge int).
        raise UserInputError(prefix, None, f"invalid {cls.__name__}: {exc}") from None
