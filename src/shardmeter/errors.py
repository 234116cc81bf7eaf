"""User-facing errors: one line that names the field, the value and what is allowed."""

from __future__ import annotations

import dataclasses
import difflib
import types
import typing
from collections.abc import Callable, Iterable, Mapping, Sequence
from typing import Any


class UserInputError(ValueError):
    """A mistake in what the user asked for. CLIs print it as one line, without a traceback."""

    def __init__(self, field: str, value: Any, allowed: str) -> None:
        self.field = field
        self.value = value
        self.allowed = allowed
        super().__init__(f"{field}: got {value!r}; {allowed}")


def from_pydantic(
    exc: Exception,
    prefix: str = "",
    render: Callable[[Sequence[Any]], str] | None = None,
    whole: str = "input",
) -> UserInputError:
    """Turn the first error of a pydantic ValidationError into a one-line UserInputError.

    A cross-field check that raised a UserInputError names its own field and wins over the
    other branches of a union; a whole table that failed is named, never printed. ``render``
    spells an error location (default: dotted), ``whole`` names the input when it has none.
    """
    errors = getattr(exc, "errors", None)
    if not callable(errors):
        return UserInputError(prefix or whole, None, str(exc))
    found = errors()
    deepest = max(found, key=lambda e: len(e.get("loc", ())))  # a union's table branch
    unknown = [e for e in found if e.get("type") == "extra_forbidden"]  # a typo: also "missing"
    likely = max(unknown, key=lambda e: len(e.get("loc", ()))) if unknown else deepest
    first = next((e for e in found if isinstance(_cause(e), UserInputError)), likely)
    parts = [part for part in first.get("loc", ()) if not _union_tag(part)]
    path = render(parts) if render is not None else ".".join(map(str, parts))
    cause = _cause(first)
    if isinstance(cause, UserInputError):
        own = "" if parts and str(parts[-1]) == cause.field else cause.field  # a field's own check
        field = ".".join(p for p in (prefix, path, own) if p)
        return UserInputError(field, cause.value, cause.allowed)
    field = ".".join(p for p in (prefix, path) if p) or whole
    msg = str(first.get("msg", "invalid value")).removeprefix("Value error, ")
    if first.get("type") == "extra_forbidden" and parts:
        table = _table_at(getattr(exc, "title", ""), first.get("loc", ())[:-1])
        if table is not None:
            key = str(parts[-1])
            parent = field[: len(field) - len(key)] if field.endswith(key) else ""
            msg = f"unknown key; {_key_hint(key, table, parent)}"
    value = first.get("input")
    if isinstance(value, dict):
        name = value.get("name")
        value = name if isinstance(name, str) else "{...}"
    return UserInputError(field, value, msg)


def _cause(error: Any) -> Any:
    return (error.get("ctx") or {}).get("error")


def _table_at(root: str, loc: Sequence[Any]) -> type[Any] | None:
    """The table type at an error location, walked from the model class named ``root`` (a
    ValidationError's title) through fields, list items and union branches; None if lost."""
    classes = _model_classes()
    table = classes.get(root)
    for part in loc:
        if _union_tag(part):  # a union branch: that class, if the tag names one
            table = classes.get(str(part), table)
            continue
        if table is None:
            return None
        if isinstance(part, int):
            continue  # a list item: the item type was chosen with the field
        annotation = (_fields(table) or {}).get(part)
        items = [a for k in _union_args(annotation) for a in _items_or_self(k)]
        tables = [t for a in items for t in _table_types(a)]
        table = tables[0] if tables else None
    return table


def _items_or_self(annotation: Any) -> list[Any]:
    """The item types of a list or tuple annotation, else the annotation itself."""
    if typing.get_origin(annotation) in (list, tuple):
        return [a for a in typing.get_args(annotation) if a is not Ellipsis]
    return [annotation]


def _union_tag(part: Any) -> bool:
    """pydantic's name for a union branch in an error location (a model's class name, or
    ``function-after[...]``), which is no field of the user's input."""
    text = str(part)
    return "[" in text or text in _model_class_names()


def _model_class_names() -> set[str]:
    return set(_model_classes())


def _model_classes() -> dict[str, type[Any] | None]:
    """Every pydantic model class by name; None for a name that two classes share."""
    from pydantic import BaseModel

    classes: dict[str, type[Any] | None] = {}
    todo = list(BaseModel.__subclasses__())
    while todo:
        cls = todo.pop()
        seen = classes.get(cls.__name__, cls)
        classes[cls.__name__] = cls if seen is cls else None
        todo += cls.__subclasses__()
    return classes


def did_you_mean(name: str, choices: Iterable[str], n: int = 3) -> str:
    """``"did you mean a, b?"`` for the close matches of ``name`` among ``choices``, else ""."""
    close = difflib.get_close_matches(name, list(choices), n=n, cutoff=0.6)
    return f"did you mean {', '.join(close)}?" if close else ""


def check_input(values: Mapping[str, Any], model: type[Any], prefix: str = "") -> None:
    """Check user values against a table type before pydantic sees them, one line per mistake.

    - a key ``model`` (pydantic ``extra="forbid"``, or a dataclass) does not know, with its
      close matches among the dotted keys (pydantic only says "Extra inputs are not permitted");
    - strict booleans: true/false only where a field is a bool (pydantic also reads "no", "off",
      0 and 1), and no true/false where a field is a number (pydantic reads true as 1).
    Nested tables and list items are checked against their own types.
    """
    fields = _fields(model)
    if fields is None:
        return
    for key, value in values.items():
        dotted = f"{prefix}{key}"
        if key not in fields:
            raise UserInputError(dotted, value, f"unknown key; {_key_hint(key, model, prefix)}")
        _check_value(value, fields[key], dotted)


def _check_value(value: Any, annotation: Any, dotted: str) -> None:
    """The bool rules of :func:`check_input` for one value, recursing into tables and lists."""
    kinds = _union_args(annotation)
    if any(k is Any for k in kinds):
        return
    if isinstance(value, bool):
        if bool not in kinds and not _bool_literal(kinds):
            numeric = all(k in (int, float) for k in kinds)
            raise UserInputError(
                dotted, value, ("a number" if numeric else "a value") + ", not true/false"
            )
        return
    if kinds and all(k is bool for k in kinds) and value is not None:
        raise UserInputError(dotted, value, "true or false")
    tables = _table_types(annotation)
    if isinstance(value, Mapping) and tables:
        errors: list[UserInputError] = []
        for table in tables:
            try:
                check_input(value, table, dotted + ".")
                return
            except UserInputError as exc:
                errors.append(exc)
        raise errors[0]
    if isinstance(value, list | tuple):
        items = [
            a for k in kinds if typing.get_origin(k) in (list, tuple) for a in typing.get_args(k)
        ]
        items = [a for a in items if a is not Ellipsis]
        if items:
            item_type = typing.Union[tuple(items)] if len(items) > 1 else items[0]  # noqa: UP007
            for i, item in enumerate(value):
                _check_value(item, item_type, f"{dotted}[{i}]")


def _key_hint(key: str, model: type[Any], prefix: str) -> str:
    """Close matches of an unknown ``key``: keys of the same table (``n_layer`` ->
    ``n_layers``), then keys of nested tables with a close last part (``lr`` -> ``inner.lr``,
    ``outer.lr``); else the table's keys."""
    fields = sorted(_fields(model) or {})
    same = difflib.get_close_matches(key, fields, n=3, cutoff=0.6)
    deeper = [
        d
        for d in _dotted_keys(model)
        if "." in d and difflib.SequenceMatcher(None, key, d.rsplit(".", 1)[1]).ratio() >= 0.8
    ]
    close = list(dict.fromkeys(same + deeper))[:3]
    if close:
        return f"did you mean {', '.join(prefix + c for c in close)}?"
    return "allowed: " + ", ".join(fields)


def _union_args(annotation: Any) -> list[Any]:
    """The members of a union annotation without None (``int | None`` -> [int])."""
    if typing.get_origin(annotation) in (typing.Union, types.UnionType):
        return [a for arg in typing.get_args(annotation) for a in _union_args(arg)]
    return [] if annotation is type(None) else [annotation]


def _bool_literal(kinds: Sequence[Any]) -> bool:
    """Whether a ``Literal[...]`` member allows true or false."""
    return any(
        isinstance(v, bool)
        for k in kinds
        if typing.get_origin(k) is typing.Literal
        for v in typing.get_args(k)
    )


def _fields(cls: type[Any]) -> dict[str, Any] | None:
    """Field name -> annotation of a strict table type (pydantic extra="forbid", or a
    dataclass); None where extra keys are allowed."""
    if dataclasses.is_dataclass(cls):
        hints = typing.get_type_hints(cls)
        return {f.name: hints.get(f.name) for f in dataclasses.fields(cls)}
    config = getattr(cls, "model_config", None)
    if isinstance(config, dict) and config.get("extra") == "forbid":
        fields = {name: info.annotation for name, info in cls.model_fields.items()}
        aliases = {info.alias: info.annotation for info in cls.model_fields.values() if info.alias}
        return fields | aliases
    return None


def _table_types(annotation: Any) -> list[type[Any]]:
    """The table types in an annotation (``str | ModelConfig`` -> [ModelConfig])."""
    if isinstance(annotation, type) and _fields(annotation) is not None:
        return [annotation]
    if typing.get_origin(annotation) in (typing.Union, types.UnionType):
        return [t for arg in typing.get_args(annotation) for t in _table_types(arg)]
    return []


def _dotted_keys(model: type[Any], prefix: str = "") -> list[str]:
    """Every dotted key a table type accepts (nested tables spelled ``table.key``)."""
    out: list[str] = []
    for name, annotation in (_fields(model) or {}).items():
        out.append(prefix + name)
        for table in _table_types(annotation):
            out += _dotted_keys(table, f"{prefix}{name}.")
    return out
