"""The base of every recipe section (advisor.recipe.schema)."""

from __future__ import annotations

from typing import Any, get_args

from pydantic import BaseModel, ConfigDict, ValidationInfo, field_validator


class StrictSection(BaseModel):
    """A recipe section: no unknown fields, frozen, finite numbers, no true/false for a number."""

    # inf and nan pass `gt=0` but mean no budget at all, and JSON cannot hold them
    model_config = ConfigDict(extra="forbid", frozen=True, allow_inf_nan=False)

    @field_validator("*", mode="before")
    @classmethod
    def _no_yes_no_for_a_number(cls, v: Any, info: ValidationInfo) -> Any:
        """YAML's true/false where a number is asked: pydantic would take them as 1 and 0."""
        if isinstance(v, bool) and info.field_name is not None:
            annotation = cls.model_fields[info.field_name].annotation
            kinds = {annotation, *get_args(annotation)}
            if bool not in kinds and kinds & {int, float}:
                raise ValueError("give a number, not true or false")
        return v
