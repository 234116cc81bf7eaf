"""User-facing errors: one line that names the field, the value and what is allowed."""

from __future__ import annotations

from typing import Any


class UserInputError(ValueError):
    """A mistake in what the user asked for. CLIs print it as one line, without a traceback."""

    def __init__(self, field: str, value: Any, allowed: str) -> None:
        self.field = field
        self.value = value
        self.allowed = allowed
        super().__init__(f"{field}: got {value!r}; {allowed}")


def from_pydantic(exc: Exception, prefix: str = "") -> UserInputError:
    """Turn the first error of a pydantic ValidationError into a one-line UserInputError."""
    errors = getattr(exc, "errors", None)
    if not callable(errors):
        return UserInputError(prefix or "input", None, str(exc))
    first = errors()[0]
    loc = ".".join(str(part) for part in first.get("loc", ()))
    field = f"{prefix}.{loc}" if prefix and loc else (prefix or loc or "input")
    msg = str(first.get("msg", "invalid value"))
    msg = msg.removeprefix("Value error, ")
    return UserInputError(field, first.get("input"), msg)
