"""The recipe: YAML or flags validated into typed settings; the one place that judges input."""

from advisor.recipe.schema import (
    DEMO_MODEL,
    AccuracySpec,
    BenchmarkSpec,
    CalibrationSpec,
    ModelSpec,
    Recipe,
    SearchSpec,
    SiteSpec,
    Workload,
    load_recipe,
    validate_recipe,
)

__all__ = [
    "DEMO_MODEL", "AccuracySpec", "BenchmarkSpec", "CalibrationSpec", "ModelSpec", "Recipe", "SearchSpec", "SiteSpec",
    "Workload", "load_recipe", "validate_recipe",
]
