"""Every recipe field, its type, default, bounds and meaning, as Markdown, from :class:`Recipe` itself.

    python -m advisor.recipe.reference > docs/recipe.md

``tests/test_recipe.py`` checks that docs/recipe.md is this output, so the reference cannot drift from
the schema.
"""

from __future__ import annotations

import enum
import types
import typing
from typing import Any

from pydantic import BaseModel
from pydantic_core import PydanticUndefined

from advisor.recipe.choices import choices
from advisor.recipe.schema import Recipe

HEADER = """# Recipe reference

Every field of a recipe (`advisor search -r RECIPE.yaml`), generated from `advisor/recipe/schema.py` by
`python -m advisor.recipe.reference > docs/recipe.md`. Every field is optional: flags override the recipe,
which overrides these defaults; numbers must be finite (`inf` and `nan` are refused).
`recipes/quickstart.yaml` is a commented example; `workloads` is a list of entries with the `workloads[]` fields.

| field | type | default | allowed | what |
|---|---|---|---|---|
"""

BOUNDS = {"ge": ">=", "gt": ">", "le": "<=", "lt": "<", "min_length": "at least {} entries"}


def _type_name(annotation: Any) -> str:
    origin = typing.get_origin(annotation)
    args = typing.get_args(annotation)
    if origin is typing.Literal:
        return " \\| ".join(str(a) for a in args)
    if origin in (typing.Union, types.UnionType):
        return " or ".join(_type_name(a) for a in args if a is not type(None)) + (
            " or null" if type(None) in args else "")
    if origin is list:
        return f"list of {_type_name(args[0])}"
    if isinstance(annotation, type) and issubclass(annotation, enum.Enum):
        return " \\| ".join(str(m.value) for m in annotation)
    return getattr(annotation, "__name__", str(annotation))


def _listed(field: Any) -> bool:
    """A field that lists its values for the JSON schema (judged against a table when validated)."""
    return isinstance(field.json_schema_extra, dict) and "enum" in field.json_schema_extra


def _default(field: Any) -> str:
    if field.default_factory is not None:
        value = field.default_factory()
    elif field.default is PydanticUndefined:
        return "–"  # a default the validators derive (formats: from the target)
    else:
        value = field.default
    if isinstance(value, BaseModel):
        return ""
    if isinstance(value, list):
        value = [v.value if isinstance(v, enum.Enum)
                 else v.model_dump(exclude_none=True) if isinstance(v, BaseModel) else v for v in value]
    elif isinstance(value, enum.Enum):
        value = value.value
    return "null" if value is None else f"`{value}`"


def _allowed(field: Any) -> str:
    out = []
    for meta in field.metadata:
        for attr, text in BOUNDS.items():
            value = getattr(meta, attr, None)
            if value is not None:
                out.append(text.format(value) if "{}" in text else f"{text} {value}")
        if getattr(meta, "pattern", None):
            out.append(f"matches `{meta.pattern}`")
    return ", ".join(out)


def _rows(model: type[BaseModel], prefix: str) -> list[str]:
    rows = []
    for name, field in model.model_fields.items():
        dotted = f"{prefix}{name}"
        annotation = field.annotation
        inner = typing.get_args(annotation)[0] if typing.get_origin(annotation) is list else annotation
        if isinstance(inner, type) and issubclass(inner, BaseModel):
            doc = next(iter((inner.__doc__ or "").strip().splitlines()), "")
            kind = "list of entries" if inner is not annotation else "section"
            rows.append(f"| `{dotted}` | {kind} | {_default(field)} | {_allowed(field)} | {doc} |")
            rows += _rows(inner, f"{dotted}[]." if inner is not annotation else f"{dotted}.")
            continue
        kind = " \\| ".join(choices(model, name)) if _listed(field) else _type_name(annotation)
        rows.append(f"| `{dotted}` | {kind} | {_default(field)} | {_allowed(field)} | "
                    f"{(field.description or '').replace('|', chr(92) + '|')} |")
    return rows


def reference_markdown() -> str:
    return HEADER + "\n".join(_rows(Recipe, "")) + "\n"


if __name__ == "__main__":
    print(reference_markdown(), end="")
