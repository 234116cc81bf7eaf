"""User-facing errors: one line that names the field, the value and what is allowed."""

from __future__ import annotations

from collections.abc import Callable, Sequence
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
    first = next((e for e in found if isinstance(_cause(e), UserInputError)), deepest)
    parts = [part for part in first.get("loc", ()) if not _union_tag(part)]
    path = render(parts) if render is not None else ".".join(map(str, parts))
    cause = _cause(first)
    if isinstance(cause, UserInputError):
        field = ".".join(p for p in (prefix, path, cause.field) if p)
        return UserInputError(field, cause.value, cause.allowed)
    field = ".".join(p for p in (prefix, path) if p) or whole
    msg = str(first.get("msg", "invalid value")).removeprefix("Value error, ")
    value = first.get("input")
    if isinstance(value, dict):
        name = value.get("name")
        value = name if isinstance(name, str) else "{...}"
    return UserInputError(field, value, msg)


def _cause(error: Any) -> Any:
    return (error.get("ctx") or {}).get("error")


def _union_tag(part: Any) -> bool:
    """pydantic's name for a union branch in an error location (a model's class name, or
    ``function-after[...]``), which is no field of the user's input."""
    text = str(part)
    return "[" in text or text in _model_class_names()


def _model_class_names() -> set[str]:
    from pydantic import BaseModel

    names: set[str] = set()
    todo = list(BaseModel.__subclasses__())
    while todo:
        cls = todo.pop()
        names.add(cls.__name__)
        todo += cls.__subclasses__()
    return names
