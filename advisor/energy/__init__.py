"""Energy per token of a plan on a workload: predicted (roofline, profile) or measured (NVML)."""

from .base import EnergyEstimate, EnergyModel
from .roofline import RooflineEnergyModel

__all__ = ["EnergyEstimate", "EnergyModel", "RooflineEnergyModel"]
