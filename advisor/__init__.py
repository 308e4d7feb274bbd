"""precision-advisor: per-layer BF16/FP8/NVFP4 plans for the fewest joules per token."""

from .errors import AdvisorError, InputError, SetupError, UnsupportedError
from .formats import GPU, Format
from .plan import LayerGroup, Plan
from .recipe import Recipe, Workload, load_recipe

__version__ = "0.1.0"

__all__ = [
    "GPU", "AdvisorError", "Format", "InputError", "LayerGroup", "Plan", "Recipe",
    "SetupError", "UnsupportedError", "Workload", "__version__", "load_recipe",
]
