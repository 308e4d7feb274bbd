"""The allowed values of a recipe field, read from the schema, for help texts that cannot drift."""

from __future__ import annotations

import enum
import typing

from pydantic import BaseModel


def choices(model: type[BaseModel], field: str) -> tuple[str, ...]:
    """A Literal's or an Enum's values, or those a field lists as its JSON schema's ``enum`` (a field judged against
    a table, such as ``engine``)."""
    info = model.model_fields[field]
    if isinstance(info.json_schema_extra, dict) and isinstance(listed := info.json_schema_extra.get("enum"), list):
        return tuple(str(v) for v in listed)
    annotation = info.annotation
    if isinstance(annotation, type) and issubclass(annotation, enum.Enum):
        return tuple(str(m.value) for m in annotation)
    return tuple(str(a) for a in typing.get_args(annotation) if a is not type(None))


def default(model: type[BaseModel], field: str) -> str:
    value = model.model_fields[field].default
    return str(getattr(value, "value", value))


def choices_text(model: type[BaseModel], field: str) -> str:
    """``a, b or c (default: a)``"""
    values = choices(model, field)
    listed = ", ".join(values[:-1]) + f" or {values[-1]}" if len(values) > 1 else values[0]
    return f"{listed} (default: {default(model, field)})"
