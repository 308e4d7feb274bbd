"""The user's model: loading, fused layer groups and the shape the energy side prices.

Import what you need from the submodules; this package's face is torch-free
(``ModelShape``, ``llama_shape``), the loaders import torch when called.
"""

from advisor.models.shape import ModelShape, llama_shape

__all__ = ["ModelShape", "llama_shape"]
