"""precision-advisor: per-layer BF16/FP8/NVFP4 plans for the fewest joules per token."""

from advisor.errors import AdvisorError, InputError, SetupError, UnsupportedError
from advisor.formats import GPU, Format
from advisor.plan import LayerGroup, Plan
from advisor.recipe.schema import Recipe, Workload, load_recipe

__version__ = "0.1.0"

__all__ = [
    "GPU", "AdvisorError", "Format", "InputError", "LayerGroup", "Plan", "Recipe",
    "SetupError", "UnsupportedError", "Workload", "__version__", "load_recipe",
]
